"""How long ten processes queue on one of our file locks (subtask.statefiles.file_lock).

    PYTHONPATH=. python bench/lock_wait.py [--holders 10] [--hold-ms 7] [--rounds 3]

Each holder takes the lock at the same moment, holds it `--hold-ms` (what `git worktree add
--no-checkout` takes under the worker's worktree lock) and lets go. Prints when the last holder
was done against the ideal (holders x hold), for our lock and for filelock's default 50 ms poll,
in alternating rounds. Ten jobs that start together queue like this on the worktree and slots
locks.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from subtask.statefiles import file_lock  # noqa: E402


def hold(path: str, hold_s: float, default_poll: bool, start_at: float, out) -> None:
    from filelock import FileLock

    lock = FileLock(path) if default_poll else file_lock(Path(path))
    while time.time() < start_at:
        pass
    began = time.perf_counter()
    with lock:
        time.sleep(hold_s)
    out.put(time.perf_counter() - began)


def last_done(path: str, holders: int, hold_s: float, default_poll: bool) -> float:
    out = multiprocessing.Queue()
    start_at = time.time() + 0.3
    procs = [multiprocessing.Process(target=hold, args=(path, hold_s, default_poll, start_at, out)) for _ in range(holders)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    return max(out.get() for _ in procs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holders", type=int, default=10)
    parser.add_argument("--hold-ms", type=float, default=7.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    path = str(Path(tempfile.mkdtemp(prefix="subtask-lock-wait-")) / "x.lock")
    ours, default = [], []
    for _ in range(args.rounds):
        ours.append(last_done(path, args.holders, args.hold_ms / 1000, False))
        default.append(last_done(path, args.holders, args.hold_ms / 1000, True))
    ideal = args.holders * args.hold_ms
    print(f"{args.holders} holders of {args.hold_ms:g} ms at once, the last done after (median of {args.rounds}):")
    print(f"  ours (file_lock)          {1000 * statistics.median(ours):6.0f} ms   ideal {ideal:.0f}")
    print(f"  filelock's default poll   {1000 * statistics.median(default):6.0f} ms")


if __name__ == "__main__":
    main()
