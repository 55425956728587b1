"""Issue 42 in one run: every figure of "fast with nothing left running", ours side by side with
the peer (subtask-mcp 0.5) or bare git, each section's samples interleaved, ours from a wheel.

    PYTHONPATH=. python bench/fast.py [--runs 7] [--peer-venv DIR] [--big 50000] [--ram] [--skip SECTION]

1. e2e (2,000 files): `e2e_cli` and `e2e_recorded` of ours, the peer and the limit (bench/peer.py's
   jobs: a fake kimi runs `true`). Ours with its pool (the default, subtask.pool 2); after each of
   our samples the bench waits until our worker (and the pool refill it runs beside its job) has
   exited, so that the refill never runs into the next tool's sample.
2. mcp_initialize: spawn of each MCP server to its `initialize` reply, ours and the peer's.
3. start (2,000 files; `--ram`: again on /dev/shm): `git worktree add -b` against `git subtask start`
   (the prompt back) and against a job's start until its engine runs (from the CLI's start to the
   worker's mark `record_engine_started`, `SUBTASK_PHASES`), with a filled pool (the pool refilled
   before each sample) and with none (subtask.pool 0: every job's first start).
4. The CLI (20 files, 6 finished jobs): `list`, `status`, `show`, `result`, `wait` of a finished job
   against `python -c pass` of the same interpreter; start + wait + cleanup of `true` against the
   same job by bare git (bench/limit.sh, `git worktree remove`, `git branch -D`).
5. `--big N` (default 50,000 files, built once here, never committed): `git worktree add -b`
   against a job's start until its engine runs, with a filled pool; each job's worktree checked
   afterwards: its branch at its base, `git status` clean.

Prints each section's load average before and after, the cost of creating a file and a loop of
additions (bench/common), medians and ratios; saves bench/results/fast.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer  # noqa: E402  (its tools, its fake kimi, its e2e and initialize measures)
from common import cpu_loop_s, create_cost, file_system, loadavg, make_repo, make_wheel_venv, save  # noqa: E402

BENCH = Path(__file__).resolve().parent
READS = ("list", "status", "show", "result", "wait")


def ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


def run(argv: list[str], cwd: Path, env: dict | None = None, check: bool = True) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{argv} -> {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done.stdout


def timed(argv: list[str], cwd: Path, env: dict | None = None) -> float:
    t0 = time.perf_counter()
    run(argv, cwd, env)
    return time.perf_counter() - t0


class Tool:
    """Ours, from a wheel, on one repository, with the worker's phase marks written."""

    def __init__(self, venv: Path, repo: Path, env: dict):
        self.cli, self.python, self.repo = [str(venv / "bin" / "git-subtask")], str(venv / "bin" / "python"), repo
        self.phases = repo.parent / f"phases-{repo.name}.jsonl"
        self.env = dict(env, SUBTASK_PHASES=str(self.phases))

    def __call__(self, *args: str, check: bool = True) -> str:
        return run([*self.cli, *args], self.repo, self.env, check)

    def start(self, task: str = "true") -> tuple[str, float, float]:
        """(job id, the wall time it was started at, seconds until the prompt came back)."""
        wall, t0 = time.time(), time.perf_counter()
        job = self("start", "--engine", "shell", task).split()[0]
        return job, wall, time.perf_counter() - t0

    def entry(self, job: str) -> dict:
        """The worker's phase entry of the job: written after its run-lock is released (and after
        what the worker does then), so a moment after `wait` returns."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for line in reversed(self.phases.read_text().splitlines() if self.phases.exists() else []):
                entry = _entry(line)
                if entry is not None and entry["job"] == job:
                    return entry
            time.sleep(0.01)
        raise RuntimeError(f"{job}: no phase marks")

    def marks(self, job: str) -> dict[str, float]:
        return dict(self.entry(job)["marks"])

    def until_engine(self, job: str, wall: float) -> float:
        return self.marks(job)["record_engine_started"] - wall

    def took_pool(self, job: str) -> bool:
        return "pool" in self.marks(job)

    def settled(self, job: str) -> None:
        """Return once the job's worker (and the refill beside it) has exited."""
        pid = self.entry(job)["pid"]
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                    return
            except OSError:
                return
            time.sleep(0.01)
        raise RuntimeError(f"{job}: worker {pid} still running")

    def fill(self) -> None:
        self("pool", "fill")


def _entry(line: str) -> dict | None:
    """A worker's phase entry; None for a line a worker is still writing (read half-way)."""
    try:
        return json.loads(line)
    except ValueError:
        return None


def worktree_add(repo: Path, n: int) -> float:
    name = f"bench-add-{n}"
    t0 = time.perf_counter()
    run(["git", "worktree", "add", "-q", "-b", name, str(repo.parent / name), "HEAD"], repo)
    seconds = time.perf_counter() - t0
    run(["git", "worktree", "remove", "--force", str(repo.parent / name)], repo)
    run(["git", "branch", "-q", "-D", name], repo)
    return seconds


def section(name: str, results: dict, fn) -> None:
    load0 = loadavg()
    print(f"\n== {name} (load {load0})", flush=True)
    out = fn()
    out["load"] = [load0, loadavg()]
    print(f"   load after {out['load'][1]}", flush=True)
    results[name] = out


# ------------------------------------------------------------------ 1. e2e


class SettledOurs(peer.Ours):
    """bench/peer.py's Ours, waiting after each sample until its worker has exited."""

    def wait_cli(self, job: str) -> str:
        out = super().wait_cli(job)
        self._settle(job)
        return out

    def _settle(self, job: str) -> None:
        phases = Path(self.env["SUBTASK_PHASES"])
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            lines = [e for line in phases.read_text().splitlines() if (e := _entry(line))] if phases.exists() else []
            pid = next((e["pid"] for e in lines if e["job"] == job), None)
            if pid is not None:
                try:
                    if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                        return
                except OSError:
                    return
            time.sleep(0.01)


def e2e(tmp: Path, wheel: Path, peer_venv: Path, runs: int) -> dict:
    fakebin = tmp / "bin"
    repo = make_repo(tmp / "e2e-ours", files=2000)
    subprocess.run(["cp", "-a", str(repo), str(tmp / "e2e-peer")], check=True)
    subprocess.run(["cp", "-a", str(repo), str(tmp / "e2e-limit")], check=True)
    ours = SettledOurs(repo, fakebin, wheel)
    (tmp / "peer-home").mkdir(exist_ok=True)
    other = peer.Peer(tmp / "e2e-peer", peer_venv, tmp / "peer-home", fakebin)
    limit = peer.Limit(tmp / "e2e-limit", fakebin)
    tools = [ours, other, limit]
    for tool in tools:  # warm: pyc, page cache, our pool's first entries
        limit.job("true") if tool is limit else tool.until_done(tool.start("true"))
    started: dict[str, float] = {}
    cli, recorded = peer.end_to_end(tools, runs, started)
    phases = peer.phase_breakdown(ours.phases, started)
    out = {}
    for key, by_tool in (("e2e_cli", cli), ("e2e_recorded", recorded)):
        row = {t.name: ms(by_tool[t.name]) for t in tools}
        row["ours/peer"] = round(row["ours"] / row["peer"], 2)
        row["ours/limit"] = round(row["ours"] / row["limit"], 2)
        out[key] = row
        print(f"   {key:<14} ours {row['ours']:>8} peer {row['peer']:>8} limit {row['limit']:>8}   "
              f"ours/peer {row['ours/peer']} (<= 0.6)   ours/limit {row['ours/limit']}", flush=True)
    out["phases"] = phases
    print("   phases: " + ", ".join(f"{k} {v}" for k, v in phases.items()), flush=True)
    return out


# ------------------------------------------------------------------ 2. mcp_initialize


def initialize(tmp: Path, wheel: Path, peer_venv: Path, runs: int) -> dict:
    import anyio

    fakebin = tmp / "bin"
    repo = make_repo(tmp / "init-ours", files=50)
    subprocess.run(["cp", "-a", str(repo), str(tmp / "init-peer")], check=True)
    ours = peer.Ours(repo, fakebin, wheel)
    (tmp / "peer-home").mkdir(exist_ok=True)
    other = peer.Peer(tmp / "init-peer", peer_venv, tmp / "peer-home", fakebin)
    found = anyio.run(peer.initialize, {"ours": ours.params(), "peer": other.params()}, runs)
    row = {name: ms(values) for name, values in found.items()}
    row["ours/peer"] = round(row["ours"] / row["peer"], 2)
    print(f"   mcp_initialize ours {row['ours']} peer {row['peer']}   ours/peer {row['ours/peer']} (<= 0.9)",
          flush=True)
    return row


# ------------------------------------------------------------------ 3. start against worktree add


def starts(where: Path, wheel: Path, env: dict, runs: int, files: int, label: str) -> dict:
    repo = make_repo(where / f"start-{label}", files=files)
    pooled = Tool(wheel, repo, env)
    nopool_repo = where / f"start-{label}-nopool"
    subprocess.run(["cp", "-a", str(repo), str(nopool_repo)], check=True)
    nopool = Tool(wheel, nopool_repo, env)
    run(["git", "config", "subtask.pool", "0"], nopool_repo)
    for tool in (pooled, nopool):  # warm: the first job packs the generated objects, pyc, page cache
        job, _, _ = tool.start()
        tool("wait", job)
        tool.settled(job)
    worktree_add(repo, 0)
    samples: dict[str, list[float]] = {k: [] for k in ("worktree_add", "start_prompt", "start_engine",
                                                     "first_start_prompt", "first_start_engine")}
    took = []
    walls: dict[str, float] = {}
    for n in range(runs):
        samples["worktree_add"].append(worktree_add(repo, n + 1))
        pooled.fill()
        job, wall, prompt = pooled.start()
        pooled("wait", job)
        pooled.settled(job)
        samples["start_prompt"].append(prompt)
        samples["start_engine"].append(pooled.until_engine(job, wall))
        took.append(pooled.took_pool(job))
        walls[job] = wall
        pooled("cleanup", job)
        job, wall, prompt = nopool.start()
        nopool("wait", job)
        nopool.settled(job)
        samples["first_start_prompt"].append(prompt)
        samples["first_start_engine"].append(nopool.until_engine(job, wall))
        nopool("cleanup", job)
    row = {k: ms(v) for k, v in samples.items()}
    add = row["worktree_add"]
    for k in ("start_prompt", "start_engine", "first_start_prompt", "first_start_engine"):
        row[f"{k}/worktree_add"] = round(row[k] / add, 2)
    row["pooled_starts"] = f"{sum(took)} of {len(took)}"
    row["phases"] = peer.phase_breakdown(pooled.phases, walls)
    print(f"   {label}: worktree add -b {add} ms; with a filled pool: start {row['start_prompt']} "
          f"({row['start_prompt/worktree_add']}), until the engine runs {row['start_engine']} "
          f"({row['start_engine/worktree_add']}); no pool: start {row['first_start_prompt']}, until the engine "
          f"{row['first_start_engine']} ({row['first_start_engine/worktree_add']}); pool taken {row['pooled_starts']}",
          flush=True)
    print("   phases with the pool: " + ", ".join(f"{k} {v}" for k, v in row["phases"].items()), flush=True)
    return row


# ------------------------------------------------------------------ 4. the CLI


def cli(tmp: Path, wheel: Path, env: dict, runs: int) -> dict:
    repo = make_repo(tmp / "cli", files=20, folders=4)
    bare = tmp / "cli-bare"
    subprocess.run(["cp", "-a", str(repo), str(bare)], check=True)
    tool = Tool(wheel, repo, env)
    jobs = [tool("start", "--engine", "shell", f"echo {n} > f{n}.txt").split()[0] for n in range(6)]
    tool("wait", *jobs)
    for job in jobs:
        tool.settled(job)
    run(["git", "config", "subtask.sweepInterval", "3600"], repo)  # a sweep every hour, as between two sweeps
    tool("list")
    job = jobs[0]
    commands = {"python -c pass": [tool.python, "-c", "pass"], **{
        name: [*tool.cli, name, *([] if name in ("list", "status") else [job])] for name in READS}}
    samples: dict[str, list[float]] = {k: [] for k in [*commands, "start+wait+cleanup", "bare git job"]}
    for argv in commands.values():
        timed(argv, repo, tool.env)
    for n in range(runs):
        for name, argv in commands.items():
            samples[name].append(timed(argv, repo, tool.env))
        t0 = time.perf_counter()
        started = tool("start", "--engine", "shell", "true").split()[0]
        tool("wait", started)
        tool("cleanup", started)
        samples["start+wait+cleanup"].append(time.perf_counter() - t0)
        tool.settled(started)
        t0 = time.perf_counter()
        name = f"b{n:03d}"
        run(["bash", str(BENCH / "limit.sh"), str(bare), name, "true", "true"], bare, env)
        run(["git", "worktree", "remove", f".limit-worktrees/{name}"], bare)
        run(["git", "branch", "-q", "-D", f"limit/{name}"], bare)
        samples["bare git job"].append(time.perf_counter() - t0)
    row = {k: ms(v) for k, v in samples.items()}
    floor = row["python -c pass"]
    for name in READS:
        row[f"{name}/python"] = round(row[name] / floor, 2)
        print(f"   {name:<8} {row[name]:>7} ms = {row[f'{name}/python']}x python -c pass ({floor} ms; <= 3)",
              flush=True)
    row["job/bare"] = round(row["start+wait+cleanup"] / row["bare git job"], 2)
    print(f"   start+wait+cleanup {row['start+wait+cleanup']} ms, bare git {row['bare git job']} ms: "
          f"{row['job/bare']}x (<= 4)", flush=True)
    return row


# ------------------------------------------------------------------ 5. a big repository


def big(tmp: Path, wheel: Path, env: dict, runs: int, files: int) -> dict:
    t0 = time.perf_counter()
    repo = make_repo(tmp / "big", files=files, folders=max(50, files // 100))
    made = round(time.perf_counter() - t0, 1)
    tool = Tool(wheel, repo, env)
    job, _, _ = tool.start()  # the first job packs the generated objects and fills the pool
    tool("wait", job)
    tool.settled(job)
    samples: dict[str, list[float]] = {"worktree_add": [], "start_engine": [], "start_prompt": []}
    clean = []
    took = []
    walls: dict[str, float] = {}
    for n in range(runs):
        samples["worktree_add"].append(worktree_add(repo, n))
        tool.fill()
        job, wall, prompt = tool.start()
        tool("wait", job)
        tool.settled(job)
        samples["start_prompt"].append(prompt)
        samples["start_engine"].append(tool.until_engine(job, wall))
        took.append(tool.took_pool(job))
        walls[job] = wall
        worktree = repo / ".subtask" / "worktrees" / job
        status = run(["git", "-C", str(worktree), "status", "--porcelain", "--untracked-files=all"], repo)
        branch = run(["git", "-C", str(worktree), "symbolic-ref", "HEAD"], repo).strip()
        at = run(["git", "-C", str(worktree), "rev-parse", "HEAD"], repo).strip()
        clean.append(status == "" and branch == f"refs/heads/subtask/{job}"
                     and at == run(["git", "rev-parse", "HEAD"], repo).strip())
        tool("cleanup", job)
    row = {k: ms(v) for k, v in samples.items()}
    row["start_engine/worktree_add"] = round(row["start_engine"] / row["worktree_add"], 2)
    row["worktrees at their base, clean"] = f"{sum(clean)} of {len(clean)}"
    row["pooled_starts"] = f"{sum(took)} of {len(took)}"
    row["repository_made_s"] = made
    row["phases"] = peer.phase_breakdown(tool.phases, walls)
    print("   phases: " + ", ".join(f"{k} {v}" for k, v in row["phases"].items()), flush=True)
    print(f"   {files} files: worktree add -b {row['worktree_add']} ms; start until the engine runs "
          f"{row['start_engine']} ms (<= 300), {row['start_engine/worktree_add']} of worktree add (<= 0.33); "
          f"start (prompt) {row['start_prompt']} ms; pool taken {row['pooled_starts']}; "
          f"worktrees at their base and clean {row['worktrees at their base, clean']}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--peer-venv", type=Path, help="a venv with subtask-mcp==0.5.0 (else a temp one)")
    parser.add_argument("--big", type=int, default=50000, help="files of the big repository (0: skip it)")
    parser.add_argument("--ram", action="store_true", help="section 3 again on /dev/shm")
    parser.add_argument("--skip", action="append", default=[], help="e2e, init, start, cli or big")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="subtask-fast-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBTASK_")}
    results: dict = {"file_system": file_system(tmp), "create_file_us": create_cost(tmp), "cpu_loop_s": cpu_loop_s()}
    print(f"file system {results['file_system']}; creating a file {results['create_file_us']} us; a loop of 10^7 "
          f"additions {results['cpu_loop_s']} s; {os.cpu_count()} CPUs", flush=True)
    try:
        wheel = make_wheel_venv(tmp / "ours-venv")
        peer_venv = args.peer_venv or peer.make_peer_venv(tmp / "peer-venv")[0]
        fakebin = tmp / "bin"
        fakebin.mkdir()
        (fakebin / "kimi").write_text(peer.FAKE_KIMI)
        (fakebin / "kimi").chmod(0o755)
        if "e2e" not in args.skip:
            section("1. e2e, 2,000 files", results, lambda: e2e(tmp, wheel, peer_venv, args.runs))
        if "init" not in args.skip:
            section("2. mcp_initialize", results, lambda: initialize(tmp, wheel, peer_venv, max(args.runs, 11)))
        if "start" not in args.skip:
            section("3. start, 2,000 files, disk", results, lambda: starts(tmp, wheel, env, args.runs, 2000, "disk"))
            if args.ram:
                ram = Path(tempfile.mkdtemp(prefix="subtask-fast-bench-", dir="/dev/shm"))
                try:
                    section("3. start, 2,000 files, RAM disk", results,
                            lambda: starts(ram, wheel, env, args.runs, 2000, "ram"))
                finally:
                    shutil.rmtree(ram, ignore_errors=True)
        if "cli" not in args.skip:
            section("4. the CLI, 20 files", results, lambda: cli(tmp, wheel, env, max(args.runs, 11)))
        if args.big and "big" not in args.skip:
            section(f"5. {args.big} files", results, lambda: big(tmp, wheel, env, args.runs, args.big))
    finally:
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("saved", save("fast", results))


if __name__ == "__main__":
    main()
