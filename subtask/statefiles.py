"""Small helpers for the bookkeeping files beside the repository: atomic, private writes.

Every file is written to a temp file in the same folder, fsynced (but caches and pid files),
then `os.replace`d, so a reader sees the old file or the new one, never half of one. Files are
0600, folders 0700.
"""

from __future__ import annotations

import json
import os
import tempfile
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


def write_json(path: Path, obj, *, durable: bool = True) -> None:
    write_atomic(path, (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode(), durable=durable)


LOCK_POLL_SECONDS = 0.002


def file_lock(path: Path, timeout: float = 60.0):
    """A FileLock whose lock file is private. A waiter retries every 2 ms, not filelock's 50:
    every lock here is held for milliseconds (nothing slow runs under one), and ten jobs that
    start together queue on the slots and worktree locks, each waking up to 50 ms late."""
    from filelock import FileLock

    ensure_dir(path.parent)
    return FileLock(str(path), timeout=timeout, mode=0o600, poll_interval=LOCK_POLL_SECONDS)
