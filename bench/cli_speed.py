"""Issue 14 item 5: what every CLI command pays before it works, on a small repository.

    PYTHONPATH=. python bench/cli_speed.py [--runs 11] [--wheel] [--files 20] [--jobs 6]

A generated repository of 20 files with 6 finished shell jobs. Interleaved rounds (one sample of
every command per round, so a slow moment of the machine hits all alike); p50 of each:
`python -c pass`, `git subtask --version`, `list`, `status`, `show ID`, `result ID`, `spend`;
and a trivial job end to end, start + wait + cleanup (`--engine shell true`, with `start` alone
until its prompt comes back), against the same
job by bare git commands (bench/limit.sh with `true` as the engine, then `git worktree remove`
and `git branch -D`). Then the import profile of `git subtask list` (`python -X importtime`):
the slowest modules by cumulative time, and which of them the command needs.

`--before DIR` measures another tree (e.g. `git archive main | tar -x -C DIR`) in the same
rounds, for before/after figures under the same load. `--wheel` runs each from a wheel
(bench/common.make_wheel_venv), as users
install it: no editable import hook. Prints the load average before and after. Saves
bench/results/cli_speed.json. Targets: read commands p50 <= 150 ms; start+wait+cleanup <= 5x bare git.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import loadavg, make_repo, make_wheel_venv, save  # noqa: E402

BENCH = Path(__file__).resolve().parent
READS = ("list", "status", "show", "result")


CPU: dict[str, list[float]] = {}  # command -> CPU seconds (user + sys, with the git it waited for)


def timed(argv: list[str], cwd: Path, env: dict, name: str | None = None) -> float:
    """Wall seconds of one run; its CPU time goes to CPU[name]: on a loaded machine the wall time
    mostly says how long the process waited for a core, the CPU time what it cost."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
        raise RuntimeError(f"{argv} -> {proc.returncode}\n{done.stdout}\n{done.stderr}")
    if name is not None:
        CPU.setdefault(name, []).append(usage.ru_utime + usage.ru_stime)
    return seconds


def p50_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


def import_profile(python: str, cwd: Path, env: dict, top: int = 15) -> list[tuple[str, float, float]]:
    """(module, self ms, cumulative ms) of `git subtask list`, slowest cumulative first (top level
    and first-level children only, so the numbers do not count the same import twice)."""
    err = subprocess.run([python, "-X", "importtime", "-m", "subtask", "list"], cwd=cwd, env=env,
                         capture_output=True, text=True).stderr
    rows = []
    for line in err.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cumulative, name = line[len("import time:"):].split("|")
        depth = (len(name) - len(name.lstrip())) // 2
        if depth <= 2:
            rows.append((name.strip(), int(own) / 1000, int(cumulative) / 1000, depth))
    rows.sort(key=lambda r: -r[2])
    return [(("  " * (r[3] - 1)) + r[0], round(r[1], 1), round(r[2], 1)) for r in rows[:top]]


class Side:
    """One build of git-subtask under test, with its own copy of the repository and its jobs."""

    def __init__(self, label: str, python: str, env: dict, repo: Path, jobs: int) -> None:
        self.label, self.python, self.env, self.repo = label, python, env, repo
        exe = Path(python).parent / "git-subtask"
        self.cli = [str(exe)] if exe.exists() else [python, "-m", "subtask"]
        started = [self.run("start", "--engine", "shell", f"echo {n} > f{n}.txt").split()[0] for n in range(jobs)]
        self.run("wait", *started)
        job = started[0]
        self.commands = {
            "python -c pass": [python, "-c", "pass"],
            "--version": [*self.cli, "--version"],
            "list": [*self.cli, "list"],
            "status": [*self.cli, "status"],
            "show": [*self.cli, "show", job],
            "result": [*self.cli, "result", job],
            "spend": [*self.cli, "spend"],
        }

    def run(self, *args: str) -> str:
        return subprocess.run([*self.cli, *args], cwd=self.repo, env=self.env, capture_output=True, text=True,
                              check=True).stdout

    def job(self) -> tuple[float, float]:
        """Seconds of start + wait + cleanup of `true`, and of its start alone (the prompt back;
        its CPU, with the git it waited for but not the worker it forked, to CPU["<label> start"])."""
        t0 = time.perf_counter()
        proc = subprocess.Popen([*self.cli, "start", "--engine", "shell", "true"], cwd=self.repo, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        started = proc.stdout.read().split()[0]
        _, _, usage = os.wait4(proc.pid, 0)
        start_seconds = time.perf_counter() - t0
        CPU.setdefault(f"{self.label} start", []).append(usage.ru_utime + usage.ru_stime)
        self.run("wait", started)
        self.run("cleanup", started)
        return time.perf_counter() - t0, start_seconds


def side(label: str, tree: Path, tmp: Path, base_env: dict, wheel: bool, repo: Path, jobs: int) -> Side:
    env = dict(base_env)
    if wheel:
        python = str(make_wheel_venv(tmp / f"venv-{label}", tree) / "bin" / "python")
    else:
        python = sys.executable
        env["PYTHONPATH"] = str(tree)
        subprocess.run([python, "-m", "compileall", "-q", str(tree / "subtask")], check=True,
                       env={k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"})
    copy = tmp / f"repo-{label}"
    subprocess.run(["cp", "-a", str(repo), str(copy)], check=True)
    return Side(label, python, env, copy, jobs)


def bare_job(bare: Path, n: int, env: dict) -> float:
    t0 = time.perf_counter()
    name = f"b{n:03d}"
    subprocess.run(["bash", str(BENCH / "limit.sh"), str(bare), name, "true", "true"], cwd=bare, env=env,
                   capture_output=True, check=True)
    subprocess.run(["git", "worktree", "remove", f".limit-worktrees/{name}"], cwd=bare, check=True)
    subprocess.run(["git", "branch", "-q", "-D", f"limit/{name}"], cwd=bare, check=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--wheel", action="store_true", help="run ours from a wheel of this checkout")
    parser.add_argument("--before", type=Path, help="another tree of git-subtask (e.g. `git archive` of main), "
                                                    "measured in the same interleaved rounds")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="subtask-cli-bench-"))
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SUBTASK_")}
        repo = make_repo(tmp / "repo", files=args.files, folders=4)
        sides = [side("ours", BENCH.parent, tmp, env, args.wheel, repo, args.jobs)]
        if args.before:
            sides.append(side("before", args.before.resolve(), tmp, env, args.wheel, repo, args.jobs))
        bare = tmp / "bare"
        subprocess.run(["cp", "-a", str(repo), str(bare)], check=True)
        for s in sides:  # warm: pyc, page cache
            for argv in s.commands.values():
                timed(argv, s.repo, s.env)
        names = [*sides[0].commands, "start", "start+wait+cleanup"]
        samples = {s.label: {name: [] for name in names} for s in sides}
        samples["bare git"] = {"start+wait+cleanup": []}
        load0 = loadavg()
        for n in range(args.runs):
            for name in sides[0].commands:
                for s in sides:
                    samples[s.label][name].append(timed(s.commands[name], s.repo, s.env, f"{s.label} {name}"))
            for s in sides:
                whole, start = s.job()
                samples[s.label]["start+wait+cleanup"].append(whole)
                samples[s.label]["start"].append(start)
            samples["bare git"]["start+wait+cleanup"].append(bare_job(bare, n, env))
        load1 = loadavg()
        profiles = {s.label: import_profile(s.python, s.repo, s.env) for s in sides}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    figures = {label: {name: p50_ms(v) for name, v in by_name.items()} for label, by_name in samples.items()}
    bare_ms = figures["bare git"]["start+wait+cleanup"]
    print(f"{'from a wheel' if args.wheel else 'from the source trees'}; {args.files} files, {args.jobs} jobs, "
          f"{args.runs} interleaved rounds; load {load0} -> {load1}")
    labels = [s.label for s in sides]
    cpu = {key: p50_ms(values) for key, values in CPU.items()}
    print(f"  {'p50 ms (wall, cpu)':<22}" + "".join(f"{label:>18}" for label in labels))
    for name in names:
        verdict = ("  ok" if figures["ours"][name] <= 150 else "  MISSED (<= 150)") if name in READS else ""
        cells = "".join(f"{figures[label][name]:>10}{cpu.get(f'{label} {name}', ''):>8}" for label in labels)
        print(f"  {name:<22}" + cells + verdict)
    print(f"  {'bare git job':<22}{bare_ms:>10}")
    ratios = {label: round(figures[label]["start+wait+cleanup"] / bare_ms, 2) for label in labels}
    print("  start+wait+cleanup / bare git: " + ", ".join(f"{k} {v}" for k, v in ratios.items()) + " (target <= 5)")
    for label, profile in profiles.items():
        print(f"\nimport profile of `git subtask list`, {label} (ms: self, cumulative):")
        for name, own, cumulative in profile:
            print(f"  {name:<40}{own:>8}{cumulative:>8}")
    path = save("cli_speed", {"wheel": args.wheel, "files": args.files, "jobs": args.jobs, "runs": args.runs,
                              "load_before": load0, "load_after": load1, "p50_ms": figures, "cpu_p50_ms": cpu,
                              "start_wait_cleanup_per_bare_git": ratios, "import_profile_list": profiles})
    print("saved", path)


if __name__ == "__main__":
    main()
