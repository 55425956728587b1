"""Small helpers for the bookkeeping files beside the repository: atomic, private writes.

Every file is written to a temp file in the same folder, fsynced (but caches and pid files),
then `os.replace`d, so a reader sees the old file or the new one, never half of one. Files are
0600, folders 0700. The locks that guard them (`file_lock`) are flocks on private lock files.

Invariants:
- Never fsync a pid file (`<id>.pid`, `<id>.engine`) nor `slots.json`, because they only name live
  processes and cache the records: a crash that loses the write ends those processes too. A lost
  or empty pid file reads as no pids; `slots.json` caches the records and run-locks, which are not
  fsynced either (libgit2's default), so the old file's running entries are ended as dead or a
  damaged one is rebuilt; its fsync ran under the slots lock on every start and end, up to 16 ms
  beside ten checkouts. The ledger, job environments and kept texts are fsynced.
- Never reuse a lock instance (`filelock.FileLock`, the ledger's reentrant lock) across a fork,
  because the child would count itself a holder of its parent's lock; the ledger's lock cache is
  keyed by pid.
- Never poll for one of our state locks where the waiter can sleep in the kernel, because jobs
  that start together queue on the worktree, slots and notes locks on two cores, and every poll
  takes CPU from the holder: filelock's retry every 2 ms cost a waiter ~60 ms of CPU a second
  (~10 % of a core), filelock's default 50 ms left the lock idle up to 50 ms per hand-over (ten
  holders of a 7 ms lock done after ~460 ms). `file_lock` waits in a blocking `flock` in a
  single-threaded process (the worker, the CLI), bounded by an interval timer (the alarm must
  interrupt that very `flock`, so never where another thread could take it), and retries every
  2 ms elsewhere (the MCP server's threads) or where SIGALRM is already in use
  (`tests/test_statefiles.py`, `bench/lock_wait.py`).
- Never write a state file readable by others (0600 files, 0700 folders), because events and logs
  may hold what redaction missed.
- Never fail a write because its folder went meanwhile, because `rm -rf .git/subtask` under a running
  job then crashed its engine's start (the pid file's temp file had no folder): a folder removed
  under a write is made again and the write done again (`_in_its_folder`;
  `tests/test_statefiles.py`, `test_week_one::test_a_running_job_survives_its_state_folder_being_removed`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from collections.abc import Callable

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    from pathlib import Path
    from types import FrameType
    from typing import NoReturn, TypeAlias, TypeVar

    T = TypeVar("T")
    P = TypeVar("P", str, Path)
    # A path as text or a `Path`: the state folder's names are joined as text (`paths`), so a
    # reading command never imports pathlib (~3 ms of its ~24).
    StrPath: TypeAlias = "str | os.PathLike[str]"


def ensure_dir(path: P) -> P:
    """Make `path` (and any missing parents) private folders; existing folders are left alone."""
    if not os.path.isdir(path):
        parent = os.path.dirname(os.fspath(path).rstrip(os.sep)) or "."
        if not os.path.isdir(parent):
            ensure_dir(parent)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    return path


# `rm -rf .git/subtask` while a job runs may take the folder between a write's steps: again, this often.
FOLDER_REMOVED_RETRIES = 3


def _in_its_folder(path: StrPath, make: Callable[[], T]) -> T:
    """`make()` once `path`'s folder exists; a folder removed under it is made again and `make`
    run again, so a worker outlives its state folder being removed (`rm -rf`) mid-write."""
    folder = os.path.dirname(os.fspath(path)) or "."
    for _ in range(FOLDER_REMOVED_RETRIES):
        ensure_dir(folder)
        try:
            return make()
        except FileNotFoundError:
            if os.path.isdir(folder):
                raise
    ensure_dir(folder)
    return make()


def open_private(path: StrPath, flags: int = os.O_WRONLY | os.O_APPEND | os.O_CREAT) -> int:
    """An fd on a 0600 file (created if missing), in a private folder."""
    return _in_its_folder(path, lambda: os.open(path, flags, 0o600))


class naming:  # noqa: N801  (a context manager read as a phrase: `with naming(path):`)
    """An OSError raised inside names `path`: a write through an fd names no file, and "no space
    left" must say where (`errors.from_os_error`). A class, not `contextlib.contextmanager`: a
    reading command that imports this module never loads `contextlib` (~0.3 ms)."""

    def __init__(self, path: StrPath):
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            raise type(exc)(exc.errno, exc.strerror, os.fspath(self.path)) from exc


def write_atomic(path: StrPath, data: bytes, *, durable: bool = True) -> None:
    """Replace `path` with `data` atomically; `durable=False` skips the fsync (for caches). A folder
    removed before its temp file is made, or before the replace, is made again and the write done again."""
    _in_its_folder(path, lambda: _write_atomic_once(path, data, durable))


def _write_atomic_once(path: StrPath, data: bytes, durable: bool) -> None:
    fd, tmp = new_file_beside(path)
    try:
        with naming(path):
            _write_fd(fd, data, durable)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def new_file_beside(path: StrPath) -> tuple[int, str]:
    """A new 0600 file in `path`'s folder, open for writing, by a name no one held: what
    `tempfile.mkstemp` makes, without its imports (`shutil`, `bz2`, `lzma`, `random`: ~3 ms of the
    `list` that writes the listing's cache)."""
    folder, name = os.path.split(os.fspath(path))
    for _ in range(_NAMES_TRIED):
        tmp = os.path.join(folder, f".{name}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary file name", folder)


_NAMES_TRIED = 100  # tempfile's TMP_MAX is 10,000; 48 random bits collide far less often than its 8 letters


def _write_fd(fd: int, data: bytes, durable: bool) -> None:
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        if durable:
            os.fsync(fh.fileno())


def read_bytes(path: StrPath) -> bytes:
    """The whole file (`Path.read_bytes` without pathlib)."""
    with open(path, "rb") as fh:
        return fh.read()


def remove_file(path: StrPath) -> None:
    """`path` removed; already gone is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_json(path: StrPath, obj: object, *, durable: bool = True) -> None:
    write_atomic(path, (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode(), durable=durable)


LOCK_POLL_SECONDS = 0.002


class LockTimeout(TimeoutError):
    """A state lock was not free within its timeout."""


class StateLock:
    """An exclusive flock on a private lock file (`file_lock`); the file stays, so every waiter
    locks the same inode. A waiter in the main thread sleeps in the kernel (`flock` without
    LOCK_NB) until the holder lets go, its timeout an interval timer: polling costs CPU that the
    holder needs, ~10 % of a core per waiter through filelock's every-2-ms retry, and ten jobs
    that start together on two cores queue on the worktree and slots locks. Elsewhere (a process
    with other threads, a SIGALRM handler or timer already in use) it retries every 2 ms. Not reentrant:
    one instance, one holder."""

    def __init__(self, path: StrPath, timeout: float):
        self.path, self.timeout = path, timeout
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = open_private(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        try:
            if not _try_flock(fd):
                _wait(fd, self.timeout)
        except BaseException as exc:
            os.close(fd)  # whether or not an alarm came after the lock was won: closing drops it
            if isinstance(exc, _Expired):
                raise LockTimeout(f"{self.path} still held after {self.timeout:g} s") from None
            raise
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)  # a forked child may share the fd: unlock for it too
            os.close(fd)

    def forget(self) -> None:
        """Close this process's copy without unlocking: a forked child holds the lock now (if
        no child took it, closing the last copy releases it)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> StateLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Expired(Exception):
    pass


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _wait(fd: int, timeout: float) -> None:
    """Wait for the flock on `fd`: in the kernel where this thread may own SIGALRM (the only
    thread of the process, so the alarm interrupts this very `flock`; no handler or timer of
    anyone else's), else by retrying."""
    if timeout <= 0:
        raise _Expired()
    import signal  # a lock that waits: not every command's import

    if not _single_threaded() or signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, signal.SIG_IGN, None) \
            or signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0):
        return _poll(fd, timeout)

    def expire(signum: int, frame: FrameType | None) -> NoReturn:
        raise _Expired()

    previous = signal.signal(signal.SIGALRM, expire)
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        fcntl.flock(fd, fcntl.LOCK_EX)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:  # no /proc: take the safe way
        return False


def _poll(fd: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _try_flock(fd):
        if time.monotonic() >= deadline:
            raise _Expired()
        time.sleep(LOCK_POLL_SECONDS)


def file_lock(path: StrPath, timeout: float = 60.0) -> StateLock:
    """The state lock at `path` (a private file, created when missing): `with file_lock(p):`, or
    `acquire()` / `release()`; raises LockTimeout after `timeout` seconds. Every lock here is
    held for milliseconds: nothing slow runs under one."""
    return StateLock(path, timeout)
