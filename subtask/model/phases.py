"""Where a worker's time goes: wall-clock marks of one attempt's phases, for bench/peer.py (issue 14).

The worker calls `mark(name)` as each phase ends. Nothing is written, and marking costs one
list append, unless `SUBTASK_PHASES` names a file: then `flush` appends one JSON line per
attempt, `{"v": 1, "job": ID, "attempt": N, "pid": P, "marks": [[name, unix time], ...], "cpu": [user, system,
children's user, children's system], "imported": [modules the attempt imported]}` (seconds,
`os.times()`; a worker forked by the zygote should import nothing), after
the run-lock is released (the last mark). Only the benchmarks set it; nothing reads it back.

Invariant: never fails the worker: a file that cannot be written is skipped silently.
"""

from __future__ import annotations

import json
import os
import sys
import time

PHASES_ENV = "SUBTASK_PHASES"

_marks: list[list[object]] = []  # [name, time]
_modules_at_begin: set[str] = set()
_modules_before_worker: set[str] | None = None  # a forked worker's modules before it imported the worker


def before_worker_import() -> None:
    """Count what a forked worker imports from here on (the zygote calls it before it imports the
    worker, so a module its preload left out shows in "imported")."""
    global _modules_before_worker
    _modules_before_worker = set(sys.modules)


def begin(at: float | None = None) -> None:
    """Start a new attempt's marks (the first mark is the worker taking the job)."""
    global _modules_at_begin
    _marks.clear()
    if os.environ.get(PHASES_ENV):
        _modules_at_begin = _modules_before_worker if _modules_before_worker is not None else set(sys.modules)
    mark("worker_start", at)


def mark(name: str, at: float | None = None) -> None:
    _marks.append([name, round(time.time() if at is None else at, 6)])


def flush(job_id: str, attempt: int) -> None:
    path = os.environ.get(PHASES_ENV)
    if not path or not _marks:
        return
    times = os.times()  # this worker's CPU and its reaped children's (git, the engine), in seconds
    line = json.dumps({"v": 1, "job": job_id, "attempt": attempt, "pid": os.getpid(), "marks": list(_marks),
                       "cpu": [round(t, 3) for t in times[:4]],
                       "imported": sorted(set(sys.modules) - _modules_at_begin)})
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass
    _marks.clear()
