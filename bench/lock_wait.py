"""How long ten processes queue on one of our state locks (subtask.state.statefiles.file_lock), and
what their waiting costs in CPU.

    PYTHONPATH=. python bench/lock_wait.py [--holders 10] [--hold-ms 7] [--rounds 3]

Each holder takes the lock at the same moment, holds it `--hold-ms` (what `git worktree add
--no-checkout` takes under the worker's worktree lock) and lets go. Prints when the last holder
was done against the ideal (holders x hold), and the CPU all of them spent acquiring, for our
lock (a blocking flock in the main thread), filelock retrying every 2 ms (our lock before) and
filelock's default 50 ms, in alternating rounds. Ten jobs that start together queue like this
on the worktree and slots locks, on cores their checkouts fill: a waiter's CPU is the holder's
loss.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from subtask.state.statefiles import file_lock  # noqa: E402

KINDS = {"ours (file_lock)": None, "filelock, 2 ms retry": 0.002, "filelock, default 50 ms": 0.05}


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def hold(path: str, hold_s: float, poll: float | None, start_at: float, out) -> None:
    from filelock import FileLock

    lock = file_lock(Path(path)) if poll is None else FileLock(path, poll_interval=poll)
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = cpu_s()
    lock.acquire()
    waited_cpu = cpu_s() - cpu0
    time.sleep(hold_s)
    lock.release()
    out.put((time.time() - start_at, waited_cpu))


def one_round(path: str, holders: int, hold_s: float, poll: float | None) -> tuple[float, float]:
    """(when the last holder was done, the CPU all spent acquiring), seconds."""
    out = multiprocessing.Queue()
    start_at = time.time() + 0.5
    procs = [multiprocessing.Process(target=hold, args=(path, hold_s, poll, start_at, out)) for _ in range(holders)]
    for proc in procs:
        proc.start()
    results = [out.get() for _ in procs]
    for proc in procs:
        proc.join()
    return max(r[0] for r in results), sum(r[1] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holders", type=int, default=10)
    parser.add_argument("--hold-ms", type=float, default=7.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    path = str(Path(tempfile.mkdtemp(prefix="subtask-lock-wait-")) / "x.lock")
    figures: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
    for _ in range(args.rounds):
        for kind, poll in KINDS.items():
            figures[kind].append(one_round(path, args.holders, args.hold_ms / 1000, poll))
    ideal = args.holders * args.hold_ms
    print(f"{args.holders} holders of {args.hold_ms:g} ms at once (medians of {args.rounds}; ideal {ideal:.0f} ms):")
    print(f"  {'':<26}{'last done':>10}{'acquiring CPU':>15}")
    for kind, rows in figures.items():
        done = 1000 * statistics.median(r[0] for r in rows)
        cpu = 1000 * statistics.median(r[1] for r in rows)
        print(f"  {kind:<26}{done:>7.0f} ms{cpu:>12.1f} ms")


if __name__ == "__main__":
    main()
