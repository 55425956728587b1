"""statefiles.FileLock, which replaced the `filelock` package (issue 14: its import cost ~20 ms
on every command): the same flock, so old and new processes exclude each other; reentrant in a
thread, exclusive between threads; a child forked while it was held does not keep it."""

from __future__ import annotations

import os
import threading

import pytest

from subtask.statefiles import FileLock, LockTimeout


def test_the_lock_excludes_threads_forks_and_filelock_and_is_reentrant(tmp_path):
    path = tmp_path / "x.lock"
    mine = FileLock(path, timeout=5)
    with mine, mine:  # reentrant in one thread
        assert mine.is_locked
        failed = []

        def other_thread():
            try:
                mine.acquire(timeout=0.1)
            except LockTimeout:
                failed.append(True)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert failed == [True], "another thread took the lock a thread holds"
        filelock = pytest.importorskip("filelock")
        with pytest.raises(filelock.Timeout):  # the package's lock on the same file waits for ours
            filelock.FileLock(str(path), timeout=0.1).acquire()
        hold_r, hold_w = os.pipe()
        child = os.fork()
        if child == 0:  # holds a copy of the fd; must not keep the lock once the parent lets go
            os.close(hold_w)
            os.read(hold_r, 1)
            os._exit(0)
        os.close(hold_r)
    assert not mine.is_locked
    try:
        with FileLock(path, timeout=2):  # free although the forked child still has the fd open
            pass
    finally:
        os.close(hold_w)  # the child ends
        os.waitpid(child, 0)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
