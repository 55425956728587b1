"""Worker run-locks: `<state>/run/<id>.lock`, held (flock) for as long as a job's worker lives.

Liveness is "is the lock held", never "is that pid alive", so a reused pid cannot pass for a worker.
The lock is taken by `start` before the job is admitted and handed to the worker through an
inherited file descriptor (flock belongs to the open file description, which the child shares), so
there is no gap in which a live job looks dead. A queued job has no lock holder until the worker
that frees a slot takes its lock and starts it.

Probes take a shared lock without blocking (`LOCK_SH | LOCK_NB`), so probes never disturb one
another; waiters block on a shared lock and wake the moment the worker's exclusive lock goes.

A lock file is never removed while its job lives, and a job's lock file, once made, stays; so a
missing lock file of a job that ran means its folder was removed under it (`rm -rf .git/subtask`).
Its worker may still hold the lock through the removed file: a missing file is "held" while any
process has it open with its flock on it (`lost_holders`, from /proc), and only a command that
found no such process makes the file again. Never call a job dead on a missing lock file alone,
because its engine runs on and the sweeps would remove its worktree and branch under it.

Invariants:
- Never call a job dead on a missing run-lock file alone, because `rm -rf .git/subtask` removes
  the file its worker still holds: `lost_holders` finds the holder of the removed file in /proc
  (its open file and the flock on that inode), and only a command that found none makes the file
  again; a start (`acquire(new=True)`) skips the look
  (`test_week_one::test_a_running_job_survives_its_state_folder_being_removed`).
- Never decide liveness from a pid, because pids are reused; a worker is alive while its run-lock
  is held.
- Never unlock a run-lock fd that was handed to a worker (only close it), because flock belongs to
  the shared open file description: unlocking in the spawner would unlock the worker too.
"""

from __future__ import annotations

import fcntl
import os
import select
import time

from subtask.model.errors import SubtaskError
from subtask.state import paths
from subtask.state.statefiles import remove_file

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    from typing import Any

    from subtask.state.statefiles import StrPath


def lock_path(state_dir: StrPath, job_id: str) -> str:
    return paths.run_file(state_dir, job_id, "lock")


_owned: dict[int, str] = {}  # fd -> job id: the run-locks this process holds (or inherited)


def adopt(job_id: str, fd: int) -> None:
    """Note that this process holds `job_id`'s run-lock on `fd` (inherited from its spawner)."""
    _owned[fd] = job_id


def owns(job_id: str) -> bool:
    """Does this process hold `job_id`'s run-lock? (A probe cannot tell: it sees the lock held.)"""
    return job_id in _owned.values()


def close_others(keep: int) -> None:
    """In a worker forked from a process that held other jobs' run-locks (a worker starting the
    jobs that waited for its own, a start of several jobs): close those copies, never unlocking
    them (that would unlock them for their holder too), so this worker never keeps another job's
    lock held once its holder lets go or dies."""
    for fd in [fd for fd in _owned if fd != keep]:
        _owned.pop(fd, None)
        try:
            os.close(fd)
        except OSError:
            pass


def disown(fd: int | None) -> None:
    """Forget `fd` without unlocking it (it was handed to a worker, which keeps the lock)."""
    if fd is not None:
        _owned.pop(fd, None)


def acquire(state_dir: StrPath, job_id: str, *, block: bool = True, new: bool = False) -> int | None:
    """Open and exclusively lock the job's run-lock; returns the fd (inheritable), or None if held.

    `new`: the job is being started now, so no process can hold its lock through a removed file
    (the check costs a look at every process: a start must not pay it)."""
    path = lock_path(state_dir, job_id)
    if not new and not os.path.exists(path):
        while holders := lost_holders(state_dir, job_id):
            if not block:
                return None
            wait_for_exit(holders)
            _scanned[0] = 0.0  # look again, now
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    os.set_inheritable(fd, True)
    _owned[fd] = job_id
    return fd


def acquire_new(state_dir: StrPath, job_id: str) -> int:
    """The run-lock of a job being started now (`acquire(new=True)`: it blocks until it has it)."""
    fd = acquire(state_dir, job_id, new=True)
    assert fd is not None  # a blocking acquire returns only with the lock
    return fd


def acquire_within(state_dir: StrPath, job_id: str, seconds: float) -> int:
    """The job's run-lock for a short operation on a finished job (a reply, a merge, a landing): a
    gc or cleanup holds it only briefly, so wait up to `seconds`; past that the job is busy."""
    deadline = time.monotonic() + seconds
    while (fd := acquire(state_dir, job_id, block=False)) is None:
        if time.monotonic() >= deadline:
            raise SubtaskError("not_finished", f"{job_id} is busy: its worker or a reply holds it",
                               hint=f"git subtask wait {job_id}")
        time.sleep(0.02)
    return fd


def release(fd: int | None) -> None:
    if fd is None:
        return
    _owned.pop(fd, None)
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def drop(state_dir: StrPath, job_id: str, fd: int | None) -> None:
    """A start undone: its run-lock let go and its file removed (no job of that id exists)."""
    release(fd)
    remove_file(lock_path(state_dir, job_id))


def is_held(state_dir: StrPath, job_id: str) -> bool:
    """True while some process holds the job's run-lock exclusively (its worker, or its starter)."""
    path = paths.run_file(state_dir, job_id, "lock", make=False)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return bool(lost_holders(state_dir, job_id))
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops our shared lock
    return False


def wait_released(state_dir: StrPath, job_id: str) -> None:
    """Block until no process holds the job's run-lock exclusively."""
    path = paths.run_file(state_dir, job_id, "lock", make=False)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        wait_for_exit(lost_holders(state_dir, job_id))
        _scanned[0] = 0.0
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def lost_holders(state_dir: StrPath, job_id: str) -> list[int]:
    """The processes that hold `job_id`'s run-lock through a file no longer at its path (its
    folder was removed under a running job): each has the removed file open, and /proc/locks
    shows a flock on that very inode. Reads every process's open files (~30 ms for 150
    processes), at most once per `LOST_SCAN_TTL`: only for a missing lock file, which a job that
    ran here never has otherwise."""
    probe = paths.run_file(state_dir, job_id, "lock", make=False)
    folder, name = os.path.split(probe)
    gone = f"{os.path.realpath(folder)}/{name} (deleted)"
    return _lost_locks().get(gone, [])


LOST_SCAN_TTL = 0.5  # seconds a scan answers for (a rebuild asks it about every job)
_scanned: list[Any] = [0.0, {}]  # (when, {removed lock file: [pids]})


def _lost_locks() -> dict[str, list[int]]:
    found: dict[str, list[int]]
    when, found = _scanned
    if time.monotonic() - when < LOST_SCAN_TTL:
        return found
    found = {}
    locked = _flocked_inodes()
    for pid in (p for p in _listdir("/proc") if p.isdigit()) if locked else ():
        for fd in _listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if not (link.endswith(".lock (deleted)") and "/run/st-" in link):
                    continue
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) in locked:
                found.setdefault(link, []).append(int(pid))
    _scanned[:] = [time.monotonic(), found]
    return found


def _flocked_inodes() -> set[tuple[int, int, int]]:
    """(major, minor, inode) of every file someone holds a flock on (/proc/locks)."""
    found: set[tuple[int, int, int]] = set()
    try:
        with open("/proc/locks") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue  # "->": a waiter, not a holder
        try:
            major, minor, inode = fields[5].split(":")
            found.add((int(major, 16), int(minor, 16), int(inode)))
        except ValueError:
            continue
    return found


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def wait_for_exit(pids: list[int]) -> None:
    """Block until every process in `pids` has exited (a pidfd each: no polling, no pid reuse)."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already (or no pidfd here: then look again shortly)
            continue
        try:
            select.select([fd], [], [])
        finally:
            os.close(fd)
