"""The bookkeeping locks (`statefiles.file_lock`): one holder at a time, a bounded wait, and a
waiter that sleeps in the kernel instead of spending the CPU its holder needs (issue 14: ten
jobs that start together queue on the worktree and slots locks, on two cores)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import wait_until

from subtask.state import statefiles
from subtask.state.statefiles import LockTimeout, file_lock

WAITER = textwrap.dedent("""
    import resource, signal, sys
    from pathlib import Path
    from subtask.state.statefiles import file_lock
    lock = file_lock(Path(sys.argv[1]), timeout=float(sys.argv[2]))
    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    before = cpu()
    print("waiting", flush=True)
    try:
        with lock:
            print("held", round((cpu() - before) * 1000, 1), flush=True)
    except TimeoutError as exc:
        print("timeout", type(exc).__name__, flush=True)
    print("alarm left", signal.getsignal(signal.SIGALRM) is not signal.SIG_DFL
          or signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0))
""")


def start_waiter(path, timeout: float = 60.0) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WAITER, str(path), str(timeout)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "waiting"
    return proc


def blocked_in_the_kernel(pid: int) -> bool:
    """`pid` waits in flock(2) for a lock someone holds: /proc/locks lists it with `->`."""
    return any(line.split()[1] == "->" and line.split()[5] == str(pid)
               for line in Path("/proc/locks").read_text().splitlines() if len(line.split()) > 5)


def test_a_process_waiting_for_a_held_lock_sleeps_in_the_kernel_and_spends_no_cpu(tmp_path):
    path = tmp_path / "held.lock"
    with file_lock(path):
        waiter = start_waiter(path)
        try:
            assert wait_until(lambda: blocked_in_the_kernel(waiter.pid), timeout=10), \
                "the waiter never waited in flock: it polls"
            time.sleep(0.3)  # how long the lock is held once it waits: its CPU over that is the figure
        except BaseException:
            waiter.kill()
            raise
    out, _ = waiter.communicate(timeout=60)
    word, ms = out.splitlines()[0].split()
    # polling every 2 ms through filelock cost ~50 ms of CPU a half second
    assert word == "held" and float(ms) < 15, out
    assert out.splitlines()[1] == "alarm left False"


def test_a_waiter_gives_up_after_its_timeout_and_leaves_the_lock_and_the_alarm_free(tmp_path):
    path = tmp_path / "held.lock"
    with file_lock(path):
        waiter = start_waiter(path, timeout=0.3)
        out, _ = waiter.communicate(timeout=60)
    assert out.splitlines() == ["timeout LockTimeout", "alarm left False"]
    with file_lock(path, timeout=0):
        pass


def test_only_one_holder_at_a_time_across_processes_and_threads(tmp_path):
    path = tmp_path / "counter.lock"
    counter = tmp_path / "counter"
    counter.write_text("0")
    bump = textwrap.dedent(f"""
        from pathlib import Path
        from subtask.state.statefiles import file_lock
        for _ in range(50):
            with file_lock(Path({str(path)!r})):
                p = Path({str(counter)!r}); p.write_text(str(int(p.read_text()) + 1))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", bump]) for _ in range(3)]

    def in_thread() -> None:
        for _ in range(50):
            with file_lock(path):
                counter.write_text(str(int(counter.read_text()) + 1))

    threads = [threading.Thread(target=in_thread) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for p in procs:
        assert p.wait(timeout=60) == 0
    assert counter.read_text() == str(5 * 50)


def test_a_thread_that_waits_times_out_too(tmp_path):
    path = tmp_path / "held.lock"
    errors = []

    def wait() -> None:
        try:
            with file_lock(path, timeout=0.2):
                errors.append("acquired")
        except LockTimeout:
            errors.append("timeout")

    with file_lock(path):
        t = threading.Thread(target=wait)
        t.start()
        t.join(timeout=60)
    assert errors == ["timeout"]


def test_a_second_holder_in_one_thread_gives_up_and_leaves_no_alarm(tmp_path):
    path = tmp_path / "free.lock"
    before = signal.getsignal(signal.SIGALRM)
    with file_lock(path):
        with pytest.raises(LockTimeout):
            statefiles.file_lock(path, timeout=0.05).acquire()  # a second holder in this thread: waits, gives up
    assert signal.getsignal(signal.SIGALRM) == before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


# -- a state folder removed under a write (`rm -rf .git/subtask` while a job runs) --


def test_a_write_whose_folder_is_removed_before_its_temp_file_is_made_still_lands(tmp_path, monkeypatch):
    import shutil

    folder = tmp_path / "state" / "jobs"
    real_new_file = statefiles.new_file_beside
    removed = []

    def removed_first(path):
        if not removed:
            removed.append(shutil.rmtree(tmp_path / "state"))
        return real_new_file(path)

    monkeypatch.setattr(statefiles, "new_file_beside", removed_first)
    statefiles.write_json(folder / "st-1.engine", {"v": 1, "engine": 42}, durable=False)
    assert removed and (folder / "st-1.engine").read_text().startswith("{")
    assert [p.name for p in folder.iterdir()] == ["st-1.engine"]  # no temp file left


def test_a_write_whose_folder_is_removed_before_its_replace_still_lands(tmp_path, monkeypatch):
    import shutil

    folder = tmp_path / "state" / "jobs"
    real_replace = statefiles.os.replace
    removed = []

    def removed_first(src, dst):
        if not removed:
            removed.append(shutil.rmtree(tmp_path / "state"))
        return real_replace(src, dst)

    monkeypatch.setattr(statefiles.os, "replace", removed_first)
    statefiles.write_json(folder / "st-1.engine", {"v": 1, "engine": 42}, durable=False)
    assert removed and (folder / "st-1.engine").read_text().startswith("{")
    assert [p.name for p in folder.iterdir()] == ["st-1.engine"]


def test_a_repositorys_own_state_file_keeps_its_name(tmp_path):
    """`repo_file` names a file by SHA-1 of the common git dir, without loading OpenSSL for it:
    the name is what hashlib gives, so a verify-result index or a hotfix hand-off folder written
    before is found again."""
    import hashlib

    from subtask.state import paths

    common = tmp_path / "repo" / ".git"
    key = hashlib.sha1(str(common).encode()).hexdigest()[:8]
    assert paths.repo_file(tmp_path, common, "verified-index", ".json") == str(tmp_path / f"verified-index-{key}.json")


def test_a_write_never_opens_a_temporary_name_someone_holds(tmp_path, monkeypatch):
    """The temp file is created exclusively (O_EXCL, O_NOFOLLOW): a file or a link another
    process put at the name it drew is never written through, another name is drawn."""
    folder = tmp_path / "state"
    folder.mkdir()
    target, outside = folder / "slots.json", tmp_path / "outside"
    drawn = iter([b"\0" * 6, b"\0" * 6, b"\1" * 6])
    monkeypatch.setattr(statefiles.os, "urandom", lambda n: next(drawn))
    (folder / f".slots.json.{'00' * 6}.tmp").symlink_to(outside)
    statefiles.write_atomic(target, b"{}", durable=False)
    assert target.read_bytes() == b"{}" and not outside.exists()
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in folder.iterdir()) == [f".slots.json.{'00' * 6}.tmp", "slots.json"]
