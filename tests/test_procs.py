"""subtask.proc.procs against real child processes: groups, pipes, timeouts, kills, spawn failures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from subtask.model.errors import SubtaskError
from subtask.proc import procs

PY = sys.executable


def py(code: str) -> list[str]:
    return [PY, "-c", code]


def wait_group_gone(pgid: int, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def cleanup_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def test_exit_code_lines_and_tails(tmp_path):
    out, err = [], []
    result = procs.run(
        ["sh", "-c", "echo one; echo two; echo oops >&2; printf 'no-newline'; exit 3"],
        cwd=tmp_path, on_stdout_line=out.append, on_stderr_line=err.append,
    )
    assert result.exit_code == 3
    assert not result.timed_out
    assert out == ["one", "two", "no-newline"]
    assert err == ["oops"]
    assert result.stdout_tail == "one\ntwo\nno-newline"
    assert result.stderr_tail == "oops\n"
    assert result.seconds >= 0


def test_own_process_group_and_devnull_stdin(tmp_path):
    result = procs.run(
        py("import os, sys; print(os.getpid(), os.getpgid(0), os.getsid(0), repr(sys.stdin.read()))"),
        cwd=tmp_path,
    )
    pid, pgid, sid, stdin = result.stdout_tail.split()
    assert int(pid) == int(pgid) == int(sid) == result.pid
    assert int(pgid) != os.getpgrp()
    assert stdin == "''"  # /dev/null: immediate EOF, never our terminal


def test_stdin_data_is_fed(tmp_path):
    result = procs.run(py("import sys; print(sys.stdin.read().upper())"), cwd=tmp_path,
                       stdin_data=b"hello")
    assert result.stdout_tail.strip() == "HELLO"


def test_unread_large_stdin_data_does_not_hang(tmp_path):
    result = procs.run(["true"], cwd=tmp_path, stdin_data=b"x" * (1 << 20), timeout=10)
    assert result.exit_code == 0 and not result.timed_out


def test_no_shell_unless_asked(tmp_path):
    result = procs.run(["echo", "$HOME;", "*"], cwd=tmp_path)
    assert result.stdout_tail == "$HOME; *\n"


def test_cwd_and_env_are_applied(tmp_path):
    result = procs.run(py("import os; print(os.getcwd()); print(os.environ.get('SUBTASK_T'))"),
                       cwd=tmp_path, env={"SUBTASK_T": "yes", "PATH": os.environ["PATH"]})
    cwd, value = result.stdout_tail.splitlines()
    assert os.path.realpath(cwd) == os.path.realpath(tmp_path)
    assert value == "yes"


def test_non_utf8_output_is_replaced_not_raised(tmp_path):
    out, err = [], []
    code = ("import sys; sys.stdout.buffer.write(b'ok \\xff\\xfe bytes\\r\\n');"
            "sys.stderr.buffer.write(b'\\xc3(\\n')")
    result = procs.run(py(code), cwd=tmp_path, on_stdout_line=out.append,
                       on_stderr_line=err.append)
    assert result.exit_code == 0
    assert out == ["ok \ufffd\ufffd bytes"]  # CRLF arrives without its \r
    assert err == ["\ufffd("]
    assert "\ufffd" in result.stdout_tail


def test_one_mib_on_stderr_does_not_deadlock(tmp_path):
    lines = []
    code = ("import sys\n"
            "for i in range(16384): sys.stderr.write('e' * 63 + '\\n')\n"
            "sys.stdout.write('x' * (1 << 20))\n")
    result = procs.run(py(code), cwd=tmp_path, timeout=30, on_stderr_line=lines.append,
                       tail_bytes=100)
    assert not result.timed_out and result.exit_code == 0
    assert len(lines) == 16384 and lines[0] == "e" * 63
    assert result.stdout_tail == "x" * 100
    assert result.stderr_tail.endswith("e" * 63 + "\n") and len(result.stderr_tail) == 100


def test_tail_keeps_the_last_bytes(tmp_path):
    result = procs.run(py("print('a' * 10000 + 'END')"), cwd=tmp_path, tail_bytes=64)
    assert result.stdout_tail.endswith("END\n")
    assert len(result.stdout_tail.encode()) <= 64


def test_tail_cut_inside_utf8_char_drops_the_orphan_bytes(tmp_path):
    # 'é' is two bytes; a 5-byte tail of "éééé" would start inside one.
    result = procs.run(py("import sys; sys.stdout.write('éééé')"), cwd=tmp_path, tail_bytes=5)
    assert result.stdout_tail == "éé"


def test_grandchild_holding_stderr_does_not_block(tmp_path):
    # The background sleep inherits stderr (the pipe) but not stdout.
    result = procs.run(["sh", "-c", "sleep 30 >/dev/null & echo done"], cwd=tmp_path, timeout=20)
    try:
        assert result.exit_code == 0
        assert not result.timed_out
        assert result.stdout_tail == "done\n"
        assert result.seconds < 5
    finally:
        cleanup_group(result.pid)


def test_leftover_group_members_are_left_alone_after_normal_exit(tmp_path):
    result = procs.run(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], cwd=tmp_path,
                       timeout=20)
    try:
        assert result.exit_code == 0
        grandchild = int(result.stdout_tail)
        os.kill(grandchild, 0)  # still running: run() does not kill after a normal exit
        assert os.getpgid(grandchild) == result.pid
    finally:
        cleanup_group(result.pid)


def test_timeout_kills_the_whole_group(tmp_path):
    started = []
    result = procs.run(["sh", "-c", "sleep 30 & sleep 30"], cwd=tmp_path, timeout=0.5,
                       kill_grace=1.0, on_start=started.append)
    assert result.timed_out
    assert result.exit_code is None
    assert started == [result.pid]
    assert result.seconds < 5
    assert wait_group_gone(result.pid)


def test_timeout_sigkills_a_child_that_ignores_sigterm(tmp_path):
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            "print('ready', flush=True); time.sleep(30)")
    ready = threading.Event()
    # The timeout leaves room for a slow interpreter start, so SIG_IGN is in place when it fires.
    result = procs.run(py(code), cwd=tmp_path, timeout=3.0, kill_grace=0.5,
                       on_stdout_line=lambda line: ready.set())
    assert ready.is_set()
    assert result.timed_out and result.exit_code is None
    assert 3.4 <= result.seconds < 10  # it sat out the grace: SIGTERM was ignored, SIGKILL was not
    assert wait_group_gone(result.pid)


def test_on_start_gets_the_pid_while_running(tmp_path):
    seen = []

    def on_start(pid: int) -> None:
        os.killpg(pid, 0)  # the group exists right now
        seen.append(pid)

    result = procs.run(["true"], cwd=tmp_path, on_start=on_start)
    assert seen == [result.pid]


def test_killed_by_signal_reports_negative_code(tmp_path):
    result = procs.run(["sh", "-c", "kill -9 $$"], cwd=tmp_path, timeout=10)
    assert result.exit_code == -signal.SIGKILL
    assert not result.timed_out


def test_missing_binary_is_127(tmp_path):
    err = []
    result = procs.run(["no-such-program-subtask-xyz", "arg"], cwd=tmp_path,
                       on_stderr_line=err.append)
    assert result.exit_code == 127
    assert "no-such-program-subtask-xyz" in result.stderr_tail
    assert err and "no-such-program-subtask-xyz" in err[0]
    assert result.pid == -1 and not result.timed_out


def test_permission_denied_is_126(tmp_path):
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    result = procs.run([str(script)], cwd=tmp_path)
    assert result.exit_code == 126
    assert str(script) in result.stderr_tail


def test_missing_cwd_is_a_subtask_error(tmp_path):
    with pytest.raises(SubtaskError) as info:
        procs.run(["true"], cwd=tmp_path / "gone")
    assert "gone" in info.value.message


def test_keyboard_interrupt_kills_the_group_before_reraising(tmp_path):
    # SIGINT may be inherited ignored (pytest run as a background job by a shell without job
    # control, as some CI runners do): this test needs Ctrl-C to raise KeyboardInterrupt.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    started = []
    main = threading.get_ident()
    marker = tmp_path / "both-sleeping"

    def interrupt() -> None:  # once run() has the group and its background member exists: events, not a delay
        while not (started and marker.exists()):
            time.sleep(0.01)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            procs.run(["sh", "-c", f"sleep 30 & touch '{marker}'; sleep 30"], cwd=tmp_path, on_start=started.append,
                      kill_grace=1.0)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert wait_group_gone(started[0])


def test_exception_from_on_start_kills_the_group(tmp_path):
    started = []

    def on_start(pid: int) -> None:
        started.append(pid)
        raise RuntimeError("could not record pid")

    with pytest.raises(RuntimeError):
        procs.run(["sleep", "30"], cwd=tmp_path, on_start=on_start, kill_grace=1.0)
    assert wait_group_gone(started[0])


def test_broken_callback_keeps_draining_then_raises(tmp_path):
    calls = []

    def on_line(line: str) -> None:
        calls.append(line)
        raise ValueError("bad callback")

    code = "import sys\nfor i in range(20000): print('x' * 60)\n"
    with pytest.raises(ValueError, match="bad callback"):
        procs.run(py(code), cwd=tmp_path, timeout=30, on_stdout_line=on_line)
    assert calls == ["x" * 60]  # called once, then disabled; the child still finished


def test_kill_group_terms_then_kills(tmp_path):
    proc = subprocess.Popen(
        py("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
           "print('ready', flush=True); time.sleep(30)"),
        start_new_session=True, stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout.readline() == b"ready\n"
        started = time.monotonic()
        procs.kill_group(proc.pid, grace=0.3, is_alive=lambda: proc.poll() is None)
        assert proc.wait(timeout=5) == -signal.SIGKILL
        assert time.monotonic() - started >= 0.25
    finally:
        proc.stdout.close()
        cleanup_group(proc.pid)


def test_kill_group_default_probe_and_sigterm(tmp_path):
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    reaper = threading.Thread(target=proc.wait, daemon=True)  # like a worker reaping its child
    reaper.start()
    procs.kill_group(proc.pid, grace=2.0)
    reaper.join(5)
    assert proc.returncode == -signal.SIGTERM


def test_kill_group_ends_a_group_and_then_tolerates_it_gone():
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & exec sleep 30"], start_new_session=True)
    procs.kill_group(proc.pid, grace=5.0, is_alive=lambda: proc.poll() is None)
    assert proc.wait(timeout=30) is not None and wait_group_gone(proc.pid)
    procs.kill_group(proc.pid, grace=0.1)  # gone: no ProcessLookupError, nothing else signalled


@pytest.mark.parametrize("pgid", [0, 1, -5])
def test_kill_group_refuses_dangerous_ids(pgid):
    with pytest.raises(ValueError):
        procs.kill_group(pgid)


def test_kill_group_refuses_our_own_group():
    with pytest.raises(ValueError):
        procs.kill_group(os.getpgrp())
