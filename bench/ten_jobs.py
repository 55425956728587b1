"""Issue 14: where the CPU of ten jobs started together goes (the `start_many10+wait` figure).

    PYTHONPATH=. python bench/ten_jobs.py [--runs 3] [--files 2000]

One MCP server of ours (the SDK client, stdio, as bench/peer.py drives it) on a generated
repository. Per round: `start_many` of ten `true` jobs, then one `wait` for all ten, timed, with
the machine's busy CPU over that time (`/proc/stat`: everything that ran, ours or not), the MCP
server's own CPU and its reaped children's (`/proc/PID/stat`), and the ten workers' own CPU and
their children's (git, the engine), from each worker's phase line (`SUBTASK_PHASES`,
subtask/phases.py). Then, in the same round, the same ten checkouts by bare git, two at a time
(`git worktree add`), the floor. Also the main worktree's status as each job takes it, before
and after its engine (subtask.worker.confinement.MainWorktreeStatus), against `git status
--no-optional-locks`. Prints the figures and the file system's state (bench/common.create_cost);
saves bench/results/ten_jobs.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.append(str(BENCH))
import peer as P  # noqa: E402  (the tools, the fake engine and the MCP client)
from common import cpu_loop_s, create_cost, file_system, loadavg, make_repo, median_ms, save  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def busy_cpu() -> float:
    fields = list(map(int, Path("/proc/stat").read_text().splitlines()[0].split()[1:]))
    return (sum(fields) - fields[3] - fields[4]) / HZ


def process_cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ, (int(fields[13]) + int(fields[14])) / HZ


def servers() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and b"subtask-mcp" in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


def worker_cpu(phases: Path, ids: list[str]) -> tuple[float, float, set[str]]:
    """The workers' own CPU, their children's, and the modules they imported (a fork of the
    zygote should import none: each one costs every worker its import)."""
    own = children = 0.0
    imported: set[str] = set()
    for line in phases.read_text().splitlines():
        entry = json.loads(line)
        if entry["job"] in ids and "cpu" in entry:
            own += entry["cpu"][0] + entry["cpu"][1]
            children += entry["cpu"][2] + entry["cpu"][3]
            imported.update(entry.get("imported", []))
    return own, children, imported


async def rounds(ours: P.Ours, runs: int, scratch: Path) -> tuple[dict[str, list[float]], set[str]]:
    """The figures of each round, and the modules any of the rounds' workers imported."""
    imported: set[str] = set()
    out: dict[str, list[float]] = {k: [] for k in ("sum", "busy_cpu", "server_cpu", "server_children_cpu",
                                                   "workers_cpu", "workers_children_cpu", "bare_wall", "bare_cpu")}
    async with P.Client(ours.params(), mode="legacy") as client:
        ids = P.ids_in(await P.call(client, "start", ours.start_args("true")))
        await P.call(client, "wait", ours.wait_args(ids))  # warm: the zygote and its preload
        server = min(servers())  # the first: the zygote is its child
        for n in range(runs):
            cpu0, own0 = busy_cpu(), process_cpu(server)
            t0 = time.perf_counter()
            ids = P.ids_in(await P.call(client, "start_many", {"tasks": [ours.start_args("true")] * 10}))
            await P.call(client, "wait", ours.wait_args(ids))
            out["sum"].append(time.perf_counter() - t0)
            out["busy_cpu"].append(busy_cpu() - cpu0)
            own1 = process_cpu(server)
            out["server_cpu"].append(own1[0] - own0[0])
            out["server_children_cpu"].append(own1[1] - own0[1])
            workers, children, round_imported = worker_cpu(ours.phases, ids)
            imported |= round_imported
            out["workers_cpu"].append(workers)
            out["workers_children_cpu"].append(children)
            cpu0, t0 = busy_cpu(), time.perf_counter()
            subprocess.run(f"seq 1 10 | xargs -P 2 -I@ git worktree add -q -b bare{n}-@ {scratch}/bare{n}-@ HEAD",
                           shell=True, cwd=ours.repo, check=True)
            out["bare_wall"].append(time.perf_counter() - t0)
            out["bare_cpu"].append(busy_cpu() - cpu0)
    return out, imported


def status_cpu(repo: Path, runs: int) -> dict[str, float]:
    from subtask import api
    from subtask.worker.confinement import MainWorktreeStatus

    def per_call(fn) -> float:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for _ in range(runs):
            fn()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return round((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000 / runs, 1)

    opened = api.repo_at(str(repo))
    plain = ["git", "-C", str(repo), "--no-optional-locks", "status", "--porcelain"]
    return {"no_optional_locks_ms": per_call(lambda: subprocess.run(plain, stdout=subprocess.DEVNULL, check=True)),
            "private_copy_ms": per_call(lambda: MainWorktreeStatus(opened).lines())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--packed", action="store_true",
                        help="the repository's objects in one pack, as a clone has them")
    args = parser.parse_args()
    import anyio

    tmp = Path(tempfile.mkdtemp(prefix="subtask-ten-jobs-"))
    load0, create0 = loadavg(), create_cost(tmp)
    print(f"file system {file_system(tmp)}; creating a file {create0} us; load {load0}; "
          f"a loop of 10^7 additions {cpu_loop_s()} s", flush=True)
    fakebin = tmp / "bin"
    fakebin.mkdir()
    (fakebin / "kimi").write_text(P.FAKE_KIMI)
    (fakebin / "kimi").chmod(0o755)
    status_repo = make_repo(tmp / "status-repo", files=args.files)  # freshly committed: racily clean
    time.sleep(1.1)  # as a user starts jobs after a commit: a refresh made in that same second is racy itself
    statuses = status_cpu(status_repo, 9)
    ours = P.Ours(make_repo(tmp / "repo", files=args.files, packed=args.packed), fakebin,
                  P.make_wheel_venv(tmp / "venv"))
    figures, imported = anyio.run(rounds, ours, args.runs, tmp)
    imported = sorted(imported)
    medians = {k: median_ms(v) for k, v in figures.items()}
    print(f"\nten jobs (start_many + wait), medians of {args.runs} (ms):")
    for key, value in medians.items():
        print(f"  {key:<22}{value:>8}")
    print(f"main worktree status, CPU per call (ms): --no-optional-locks {statuses['no_optional_locks_ms']}, "
          f"through the private copy {statuses['private_copy_ms']}")
    print(f"modules the workers imported: {' '.join(imported) or 'none'}")
    print(f"load {load0} -> {loadavg()}; creating a file {create0} -> {create_cost(tmp)} us; kept {tmp}")
    print("saved", save("ten_jobs", {"medians_ms": medians, "raw_s": figures, "main_status_cpu_ms": statuses,
                                     "workers_imported": imported,
                                     "load_before": load0, "load_after": loadavg()}))


if __name__ == "__main__":
    main()
