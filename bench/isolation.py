"""Issue 12 figure: the cost of isolation on a trivial shell job, start -> wait, with and without.

Run: python bench/isolation.py [--runs N] [--no-save]. Prints the two medians and their difference,
measured in this one run on this machine (runs alternate none / worktree, so load drifts hit both
alike), and writes bench/results/isolation.json.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from common import make_repo, median_ms, save, sh, subtask_cmd  # noqa: E402

# noqa: E402
from subtask.proc import isolation

ST = subtask_cmd()
MODES = ("none", "worktree")


def start_to_wait(repo: Path, mode: str) -> float:
    t0 = time.perf_counter()
    job = sh(*ST, "start", "--engine", "shell", "--isolation", mode, "echo hi", cwd=repo).stdout.split()[0]
    sh(*ST, "wait", job, cwd=repo)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--no-save", action="store_true", help="print only; write no results file")
    args = parser.parse_args()
    if not isolation.support().available:
        print(f"isolation worktree: not available here ({isolation.support().reason})")
        return 0
    root = Path(tempfile.mkdtemp(prefix="subtask-bench-isolation-"))
    try:
        repo = make_repo(root / "repo", files=200, folders=10)
        start_to_wait(repo, "none")  # warm caches once, outside the figures
        samples: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(args.runs):
            for mode in MODES:
                samples[mode].append(start_to_wait(repo, mode))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {mode: median_ms(samples[mode]) for mode in MODES}
    for mode in MODES:
        print(f"isolation {mode:<8}  start -> wait  median {medians[mode]:7.1f} ms  ({args.runs} runs)")
    print(f"cost of isolation: {medians['worktree'] - medians['none']:+.1f} ms per job "
          f"({isolation.support().describe()})")
    if not args.no_save:
        path = save("isolation", {"runs": args.runs, "median_ms": medians,
                                  "samples_ms": {m: [round(s * 1000, 1) for s in v] for m, v in samples.items()}})
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
