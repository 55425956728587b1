"""Issue 15 figure: what a best-of-4 group costs over 4 separate jobs.

Run: python bench/groups.py [--runs 7] [--files 200]
In one generated repository (maxRunning 4), times, interleaved:
- group: `start --best-of 4 true --verify true`, then `wait GID` (the members, the pick, the notes);
- separate: 4 x `start true --verify true`, then one `wait` with the 4 ids.
Prints the medians and the ratio group / separate (target: within 10 %, i.e. <= 1.10), and how
long after its last member ended each group was decided (from the group record).
Writes bench/results/groups.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import make_repo, save, sh, subtask_cmd  # noqa: E402

ST = subtask_cmd()


DECIDE_S: list[float] = []  # last member's end -> the group's decision, from the group record


def group_run(repo: Path) -> float:
    t0 = time.perf_counter()
    gid = sh(*ST, "start", "--best-of", "4", "true", "--verify", "true", cwd=repo).stdout.split()[0]
    sh(*ST, "wait", gid, cwd=repo)
    took = time.perf_counter() - t0
    group = json.loads(sh(*ST, "show", gid, "--json", cwd=repo).stdout)
    DECIDE_S.append(group["decided_at"] - max(row["ended_at"] for row in group["table"]))
    return took


def separate_run(repo: Path) -> float:
    t0 = time.perf_counter()
    ids = [sh(*ST, "start", "true", "--verify", "true", cwd=repo).stdout.split()[0] for _ in range(4)]
    sh(*ST, "wait", *ids, cwd=repo)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--files", type=int, default=200)
    args = parser.parse_args()
    group: list[float] = []
    separate: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = make_repo(Path(tmp) / "repo", files=args.files, folders=10)
        sh("git", "config", "subtask.maxRunning", "4", cwd=repo)
        group_run(repo), separate_run(repo)  # warm both paths once (page cache, pyc)
        DECIDE_S.clear()
        for _ in range(args.runs):
            group.append(group_run(repo))
            separate.append(separate_run(repo))
    g, s = statistics.median(group), statistics.median(separate)
    figures = {"runs": args.runs, "files": args.files,
               "group_ms": round(g * 1000, 1), "separate_ms": round(s * 1000, 1), "ratio": round(g / s, 3),
               "decide_ms": round(statistics.median(DECIDE_S) * 1000, 1),
               "group_samples_ms": [round(x * 1000, 1) for x in group],
               "separate_samples_ms": [round(x * 1000, 1) for x in separate]}
    print(f"best-of-4 group, start -> wait returns: median {figures['group_ms']} ms")
    print(f"4 separate starts + one wait:            median {figures['separate_ms']} ms")
    print(f"ratio group / separate: {figures['ratio']} (target <= 1.10)")
    print(f"last member's end -> group decided: median {figures['decide_ms']} ms")
    print(f"saved {save('groups', figures)}")


if __name__ == "__main__":
    main()
