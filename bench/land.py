"""`git subtask land` of 10 finished trivial jobs against the same merges and verify runs by bare git.

Each round starts 10 shell jobs (each adds its own file, verify `sleep 0.1`) and waits for them;
then, in one run, a shell script merges their branches one by one into a branch of its own and
runs the verify after each merge (the bare floor: no scratch checkout, no confinement, no
records, no cleanup), and `git subtask land` lands the same 10 on main. Printed: both times per
round, their ratio (target <= 1.5), and the medians.

Run: PYTHONPATH=. python bench/land.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import make_repo, save, sh, subtask_cmd

JOBS = 10
VERIFY = "sleep 0.1"
BARE = f"""set -e
git switch -q -c bare main
for branch in "$@"; do
  git merge -q --no-edit "$branch"
  sh -c '{VERIFY}'
done
git switch -q main
"""


def round_(path: Path, n: int) -> tuple[float, float]:
    cmd = subtask_cmd()
    jobs = []
    for k in range(JOBS):
        name = f"r{n}-j{k}.txt"
        task = f"echo {k} > {name} && git add {name} && git commit -qm 'add {name}'"
        jobs.append(sh(*cmd, "start", task, "--verify", VERIFY, cwd=path).stdout.split()[0])
    sh(*cmd, "wait", *jobs, cwd=path)
    branches = [f"subtask/{j}" for j in jobs]
    t0 = time.perf_counter()
    sh("sh", "-c", BARE, "bare", *branches, cwd=path)
    bare = time.perf_counter() - t0
    sh("git", "branch", "-q", "-D", "bare", cwd=path)
    t0 = time.perf_counter()
    proc = sh(*cmd, "land", *jobs, cwd=path, check=False)
    land = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"land failed:\n{proc.stdout}{proc.stderr}")
    return bare, land


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = make_repo(Path(tmp) / "repo", files=200, folders=10)
        sh(*subtask_cmd(), "list", cwd=path)  # the command server warms up outside the timings
        rows = []
        for n in range(args.rounds):
            bare, land = round_(path, n)
            rows.append({"bare_s": round(bare, 3), "land_s": round(land, 3), "ratio": round(land / bare, 2)})
            print(f"round {n + 1}: bare git {bare:.2f} s, git subtask land {land:.2f} s, ratio {land / bare:.2f}")
    bare_med = statistics.median(r["bare_s"] for r in rows)
    land_med = statistics.median(r["land_s"] for r in rows)
    ratio = statistics.median(r["ratio"] for r in rows)
    print(f"median: bare git {bare_med:.2f} s, land {land_med:.2f} s, ratio {ratio:.2f} (target <= 1.5)")
    save("land", {"jobs": JOBS, "verify": VERIFY, "rounds": rows, "median_ratio": ratio,
                  "median_bare_s": bare_med, "median_land_s": land_med})


if __name__ == "__main__":
    main()
