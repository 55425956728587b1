"""Small helpers for the bookkeeping files beside the repository: atomic, private writes, locks.

Every file is written to a temp file in the same folder, fsynced, then `os.replace`d, so a
reader sees the old file or the new one, never half of one. Files are 0600, folders 0700.

Locks (`FileLock`) are an exclusive `flock` on the whole lock file, as `filelock.FileLock`
takes it on Unix, so a process of an older version holding one excludes us and the other way
round. They are our own because importing `filelock` cost ~20 ms on every command and worker.
Invariants: reentrant within a thread, never between threads (each has its own fd, so threads
exclude each other as processes do); released by `LOCK_UN` before the fd is closed, so a child
forked while it was held cannot keep it; the lock file stays in place (waiters share its inode).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import tempfile
import threading
import time
from pathlib import Path


def ensure_dir(path: Path) -> Path:
    """Make `path` (and any missing parents) private folders; existing folders are left alone."""
    if not path.is_dir():
        if not path.parent.is_dir():
            ensure_dir(path.parent)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass
    return path


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_APPEND | os.O_CREAT) -> int:
    """An fd on a 0600 file (created if missing), in a private folder."""
    ensure_dir(path.parent)
    return os.open(path, flags, 0o600)


def write_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace `path` with `data` atomically; `durable=False` skips the fsync (for caches)."""
    ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_json(path: Path, obj) -> None:
    write_atomic(path, (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode())


class LockTimeout(TimeoutError):
    """A `FileLock` stayed held by someone else for its whole timeout."""


class FileLock:
    """An exclusive flock on `path` (created 0600), waited for up to `timeout` s (< 0: forever)."""

    POLL_S = 0.05

    def __init__(self, path: str | os.PathLike, timeout: float = 60.0, mode: int = 0o600):
        self.path = os.fspath(path)
        self.timeout = timeout
        self.mode = mode
        self._mine = threading.local()

    @property
    def is_locked(self) -> bool:
        return getattr(self._mine, "count", 0) > 0

    def acquire(self, timeout: float | None = None) -> FileLock:
        mine = self._mine
        if getattr(mine, "count", 0):
            mine.count += 1
            return self
        wait = self.timeout if timeout is None else timeout
        deadline = None if wait < 0 else time.monotonic() + wait
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, self.mode)
        try:
            while not _try_flock(fd):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise LockTimeout(f"the lock {self.path} stayed held for {wait:g} s")
                time.sleep(self.POLL_S if left is None else min(self.POLL_S, left))
        except BaseException:
            os.close(fd)
            raise
        mine.fd, mine.count = fd, 1
        return self

    def release(self) -> None:
        mine = self._mine
        if not getattr(mine, "count", 0):
            return
        mine.count -= 1
        if mine.count:
            return
        fd, mine.fd = mine.fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> FileLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):  # some filesystems say EACCES when held
            return False
        raise
    return True


def file_lock(path: Path, timeout: float = 60.0) -> FileLock:
    """A FileLock whose lock file is private (in a private folder)."""
    ensure_dir(path.parent)
    return FileLock(path, timeout=timeout, mode=0o600)
