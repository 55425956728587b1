"""`git subtask land`'s window against today's sequential land and bare git, in one run.

Each round starts two sets of N shell jobs (each adds its own file to a 200-file repository; their
own verify `true`) and waits for them. Then, timed one after another: a shell script merges the
first set's branches one by one into a branch of its own and runs the verify after each merge
(bare git: no scratch checkout, no confinement, no records, no cleanup); `git subtask land
--window 1` lands the first set on main (today's sequential land: one verify at a time, each on
the commit that lands); `git subtask land --window K` lands the second set (K integrated states
verified at once). Every land runs `--verify CMD` on each integrated commit (the sets' trees all
differ: nothing is reused). Printed: the three wall times, window/sequential (issue 43's target
<= 0.35 with 20 jobs and a 1 s verify) and sequential/bare (issue 32's, <= 1.5).

Run: PYTHONPATH=. python bench/land.py [--jobs 20] [--verify 'sleep 1'] [--window 8] [--rounds 1]
(issue 32's figures: --jobs 10 --verify 'sleep 0.1' --rounds 5)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import loadavg, make_repo, save, sh, subtask_cmd

BARE = """set -e
verify="$1"; shift
git switch -q -c bare main
for branch in "$@"; do
  git merge -q --no-edit "$branch"
  sh -c "$verify"
done
git switch -q main
"""


def finished_jobs(path: Path, prefix: str, count: int) -> list[str]:
    cmd = subtask_cmd()
    jobs = []
    for k in range(count):
        name = f"{prefix}-{k:02d}.txt"
        task = f"echo {k} > {name} && git add {name} && git commit -qm 'add {name}'"
        jobs.append(sh(*cmd, "start", task, "--verify", "true", cwd=path).stdout.split()[0])
    sh(*cmd, "wait", *jobs, cwd=path)
    return jobs


def timed_land(path: Path, jobs: list[str], verify: str, window: int) -> float:
    t0 = time.perf_counter()
    proc = sh(*subtask_cmd(), "land", "--window", str(window), "--verify", verify, *jobs, cwd=path, check=False)
    took = time.perf_counter() - t0
    if proc.returncode != 0 or f"({len(jobs)} of {len(jobs)} landed)" not in proc.stdout:
        raise SystemExit(f"land --window {window} failed:\n{proc.stdout}{proc.stderr}")
    return took


def round_(path: Path, n: int, count: int, verify: str, window: int) -> dict:
    sequential_jobs = finished_jobs(path, f"r{n}-s", count)
    window_jobs = finished_jobs(path, f"r{n}-w", count)
    t0 = time.perf_counter()
    sh("sh", "-c", BARE, "bare", verify, *(f"subtask/{j}" for j in sequential_jobs), cwd=path)
    bare = time.perf_counter() - t0
    sh("git", "branch", "-q", "-D", "bare", cwd=path)
    sequential = timed_land(path, sequential_jobs, verify, 1)
    windowed = timed_land(path, window_jobs, verify, window)
    return {"bare_s": round(bare, 2), "sequential_s": round(sequential, 2), "window_s": round(windowed, 2),
            "window_vs_sequential": round(windowed / sequential, 3), "sequential_vs_bare": round(sequential / bare, 2),
            "load": loadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--verify", default="sleep 1")
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = make_repo(Path(tmp) / "repo", files=200, folders=10)
        sh(*subtask_cmd(), "list", cwd=path)  # the command server warms up outside the timings
        rows = []
        for n in range(args.rounds):
            row = round_(path, n, args.jobs, args.verify, args.window)
            rows.append(row)
            print(f"round {n + 1}: bare git {row['bare_s']:.2f} s, land --window 1 {row['sequential_s']:.2f} s, "
                  f"land --window {args.window} {row['window_s']:.2f} s; window/sequential "
                  f"{row['window_vs_sequential']:.2f} (target <= 0.35), sequential/bare {row['sequential_vs_bare']:.2f}"
                  f" (load {row['load'][0]:.1f})")
    median = {key: statistics.median(r[key] for r in rows)
              for key in ("bare_s", "sequential_s", "window_s", "window_vs_sequential", "sequential_vs_bare")}
    if args.rounds > 1:
        print("median: " + ", ".join(f"{key} {value:.2f}" for key, value in median.items()))
    save("land", {"jobs": args.jobs, "verify": args.verify, "window": args.window, "rounds": rows, "median": median})


if __name__ == "__main__":
    main()
