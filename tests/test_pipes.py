"""subtask/git/pipes.py: a short command run and read to its end without `subprocess`, answering
what `subprocess.run` answers, never blocking on a full pipe, and never handing a descriptor of
ours to the child. Each case runs in a fresh interpreter, which has no descriptor a child would
inherit (pytest's own process may: then every call takes the `subprocess` path)."""

from __future__ import annotations

import subprocess
import sys

PRELUDE = """
import os, signal, subprocess, sys
from subtask.git import pipes
def run(argv, input=None):
    started = pipes.start(argv, input=input)
    assert type(started) is pipes.Running, "the subprocess path"
    return started.communicate()
"""


def in_fresh_process(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_it_answers_what_subprocess_answers():
    assert in_fresh_process("""
script = "import sys; data = sys.stdin.buffer.read(); sys.stdout.buffer.write(data[::-1]); " \\
         "sys.stderr.write('err'); sys.exit(3)"
argv = [sys.executable, "-c", script]
done = subprocess.run(argv, input=b"abc\\x00def", capture_output=True)
assert run(argv, input=b"abc\\x00def") == (done.returncode, done.stdout, done.stderr) == (3, b"fed\\x00cba", b"err")
killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"]
assert run(killed)[0] == subprocess.run(killed).returncode == -15
try:
    pipes.run(["no-such-program-subtask"])
except FileNotFoundError:
    print("ok")
""") == "ok"


def test_a_child_that_fills_both_pipes_while_it_reads_a_big_input_is_never_stuck():
    """Eight MiB in, out and on stderr at once: each pipe holds 64 KiB, so a reader that waited on
    one stream while the child wrote the other, or wrote all of stdin first, would hang."""
    assert in_fresh_process("""
big = os.urandom(8 << 20)
script = ("import sys\\n"
          "while chunk := sys.stdin.buffer.read(65536):\\n"
          "    sys.stdout.buffer.write(chunk); sys.stderr.buffer.write(chunk[:1000])\\n")
code, out, err = run([sys.executable, "-c", script], input=big)
assert code == 0 and out == big and len(err) == len(big) // 65536 * 1000
print("ok")
""") == "ok"


def test_a_descriptor_made_inheritable_never_reaches_the_child(tmp_path):
    """A worker's run-lock is inheritable on purpose (its engine's fork keeps it): a git process
    started beside it must not hold it, or `wait` would wake only when that git ends."""
    assert in_fresh_process(f"""
import threading
held = os.open({str(tmp_path / "lock")!r}, os.O_CREAT | os.O_RDWR)
os.set_inheritable(held, True)
probe = ["sh", "-c", f"test -e /proc/self/fd/{{held}} && echo open || echo closed"]
alone = pipes.start(probe)
assert type(alone) is pipes.Running  # one thread: the spawn closes it in the child
said = [alone.communicate()]
gate = threading.Event()
beside = threading.Thread(target=gate.wait)
beside.start()
try:
    besides = pipes.start(probe)  # another thread could make one meanwhile: subprocess's close_fds
    assert type(besides) is pipes._Popen
    said.append(besides.communicate())
finally:
    gate.set()
    beside.join()
os.close(held)
print(*[(code, out.decode().strip()) for code, out, _ in said])
""") == "(0, 'closed') (0, 'closed')"


def test_a_process_without_its_own_stdin_still_runs_it():
    """Its stdin closed: the child's ends could land on descriptor 0."""
    assert in_fresh_process("""
os.close(0)
code, out, err = pipes.run(['sh', '-c', 'read x || true; echo ran; echo e >&2'])
print(code, out, err)
""") == "0 b'ran\\n' b'e\\n'"


def test_no_descriptor_of_ours_is_left_open_and_no_child_is_left_unreaped():
    assert in_fresh_process("""
before = set(os.listdir("/proc/self/fd"))
for _ in range(20):
    run(["true"], input=b"x")
    run(["sh", "-c", "echo out; echo err >&2"])
try:
    pipes.run(["no-such-program-subtask"], input=b"x")
except FileNotFoundError:
    pass
assert set(os.listdir("/proc/self/fd")) == before
try:
    os.waitpid(-1, os.WNOHANG)
except ChildProcessError:
    print("ok")
""") == "ok"
