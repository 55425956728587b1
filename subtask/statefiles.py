"""Small helpers for the bookkeeping files beside the repository: atomic, private writes.

Every file is written to a temp file in the same folder, fsynced, then `os.replace`d, so a
reader sees the old file or the new one, never half of one. Files are 0600, folders 0700.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def write_atomic(path: Path, data: bytes) -> None:
    ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
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


def file_lock(path: Path, timeout: float = 60.0):
    """A FileLock whose lock file is private."""
    from filelock import FileLock

    ensure_dir(path.parent)
    return FileLock(str(path), timeout=timeout, mode=0o600)
