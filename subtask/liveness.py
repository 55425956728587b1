"""Worker run-locks: `<state>/run/<id>.lock`, held (flock) for as long as a job's worker lives.

Liveness is "is the lock held", never "is that pid alive", so a reused pid cannot pass for a worker.
The lock is taken by `start` before the job is admitted and handed to the worker through an
inherited file descriptor (flock belongs to the open file description, which the child shares), so
there is no gap in which a live job looks dead. A queued job has no lock holder until the worker
that frees a slot takes its lock and starts it.

Probes take a shared lock without blocking (`LOCK_SH | LOCK_NB`), so probes never disturb one
another; waiters block on a shared lock and wake the moment the worker's exclusive lock goes.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from subtask.statefiles import ensure_dir


def run_dir(state_dir: Path) -> Path:
    return ensure_dir(state_dir / "run")


def lock_path(state_dir: Path, job_id: str) -> Path:
    return run_dir(state_dir) / f"{job_id}.lock"


_owned: dict[int, str] = {}  # fd -> job id: the run-locks this process holds (or inherited)


def adopt(job_id: str, fd: int) -> None:
    """Note that this process holds `job_id`'s run-lock on `fd` (inherited from its spawner)."""
    _owned[fd] = job_id


def owns(job_id: str) -> bool:
    """Does this process hold `job_id`'s run-lock? (A probe cannot tell: it sees the lock held.)"""
    return job_id in _owned.values()


def disown(fd: int | None) -> None:
    """Forget `fd` without unlocking it (it was handed to a worker, which keeps the lock)."""
    _owned.pop(fd, None)


def acquire(state_dir: Path, job_id: str, *, block: bool = True) -> int | None:
    """Open and exclusively lock the job's run-lock; returns the fd (inheritable), or None if held."""
    fd = os.open(lock_path(state_dir, job_id), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    os.set_inheritable(fd, True)
    _owned[fd] = job_id
    return fd


def release(fd: int | None) -> None:
    if fd is None:
        return
    _owned.pop(fd, None)
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def is_held(state_dir: Path, job_id: str) -> bool:
    """True while some process holds the job's run-lock exclusively (its worker, or its starter)."""
    path = state_dir / "run" / f"{job_id}.lock"
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops our shared lock
    return False


def wait_released(state_dir: Path, job_id: str) -> None:
    """Block until no process holds the job's run-lock exclusively."""
    path = state_dir / "run" / f"{job_id}.lock"
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)
