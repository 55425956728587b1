"""A short git command run and read to its end without the `subprocess` module, for the calls
every command makes first (`open_repo`'s `rev-parse` and `config`), the reading commands'
`for-each-ref` and `cat-file`, and `start`'s look at the checkout (`leftout.Look`).
`subprocess` loads `threading`, `selectors`, `signal` and `locale` with it: ~4 ms of a reading
command's ~30 (docs/benchmarks.md). Anything else (a timeout, a new session, a working
directory) is `subprocess`'s, imported where it is used.

Invariants:
- Never leave a child unreaped, nor a pipe of ours open: `start` closes its ends on every path,
  and `communicate` waits for the child whatever happens while it reads (an interrupt kills it
  first), as `subprocess.run` does.
- Never block on one pipe while the child blocks on another: stdin is written and stdout and
  stderr are read together (`poll`), so a child that fills one while we wait on the other goes on.
- Never hand a git child a descriptor of ours beyond its stdin, stdout and stderr, because a
  worker's run-lock is inheritable on purpose and `wait` wakes when it is released: the spawn
  closes each one this process has (`start`, in the child: `POSIX_SPAWN_CLOSE`), which only a
  process with one thread can list for sure; with another thread, or without one of its own
  three, the command runs through `subprocess` (`close_fds`) (`tests/test_pipes.py`).
"""

from __future__ import annotations

import os
import select
import sys

_CHUNK = 65536


class Running:
    """A started child: `communicate()` feeds it `input`, reads it to its end and reaps it."""

    def __init__(self, pid: int, stdin: int | None, stdout: int, stderr: int | None, input: bytes):
        self.pid, self._stdin, self._stdout, self._stderr, self._input = pid, stdin, stdout, stderr, input

    def communicate(self) -> tuple[int, bytes, bytes]:
        """(exit code, negative for a signal as `subprocess` says it; stdout; stderr)."""
        try:
            out, err = self._drain()
        except BaseException:
            self.kill()
            self._close()
            os.waitpid(self.pid, 0)
            raise
        self._close()
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status), out, err

    def kill(self) -> None:
        """SIGKILL the child (`communicate` then reaps it)."""
        import signal

        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _drain(self) -> tuple[bytes, bytes]:
        chunks: dict[int, list[bytes]] = {self._stdout: []}
        if self._stderr is not None:
            chunks[self._stderr] = []
        poller = select.poll()
        for fd in chunks:
            poller.register(fd, select.POLLIN)
        if self._stdin is not None:
            poller.register(self._stdin, select.POLLOUT)
        open_fds, sent = len(chunks) + (self._stdin is not None), 0
        while open_fds:
            for fd, _event in poller.poll():
                if fd == self._stdin:
                    try:  # non-blocking: a write bigger than the room poll saw must not wait
                        sent += os.write(fd, self._input[sent:sent + _CHUNK])
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        sent = len(self._input)  # it stopped reading: what it answered is all there is
                    if sent >= len(self._input):
                        poller.unregister(fd)
                        os.close(fd)
                        self._stdin, open_fds = None, open_fds - 1
                    continue
                data = os.read(fd, _CHUNK)
                if data:
                    chunks[fd].append(data)
                else:
                    poller.unregister(fd)
                    open_fds -= 1
        err = b"".join(chunks[self._stderr]) if self._stderr is not None else b""
        return b"".join(chunks[self._stdout]), err

    def _close(self) -> None:
        for fd in (self._stdin, self._stdout, self._stderr):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._stdin = self._stderr = None
        self._stdout = -1


def start(argv: list[str], *, input: bytes | None = None, stderr: bool = True,
          env: dict[str, str] | None = None) -> Running | _Popen:
    """Start `argv` (found on PATH) with our environment (or `env`): stdin `input` (else
    /dev/null), stdout and stderr (else /dev/null) piped to us. OSError when it cannot be run."""
    inherited = _inheritable_fds()
    if inherited and not _one_thread():  # another thread could make one between the listing and the spawn
        return _Popen(argv, input, stderr, env)
    ours: list[int] = []  # our ends
    theirs: list[int] = []  # the child's ends, closed here once it has them
    try:
        if input is None:
            child_in, stdin = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), None
        else:
            child_in, stdin = os.pipe()
            ours.append(stdin)
        theirs.append(child_in)
        stdout, child_out = os.pipe()
        ours.append(stdout)
        theirs.append(child_out)
        if stderr:
            err_read, child_err = os.pipe()
            ours.append(err_read)
        else:
            err_read, child_err = None, os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        theirs.append(child_err)
        if min(ours + theirs) <= 2:  # one of our own three is closed: dup2 onto it would keep CLOEXEC
            raise _Fallback
        actions = [(os.POSIX_SPAWN_DUP2, child_in, 0), (os.POSIX_SPAWN_DUP2, child_out, 1),
                   (os.POSIX_SPAWN_DUP2, child_err, 2), *((os.POSIX_SPAWN_CLOSE, fd) for fd in inherited)]
        pid = os.posix_spawnp(argv[0], argv, os.environ if env is None else env, file_actions=actions)
    except BaseException as exc:
        for fd in ours + theirs:
            os.close(fd)
        if isinstance(exc, _Fallback):
            return _Popen(argv, input, stderr, env)
        raise
    for fd in theirs:
        os.close(fd)
    if stdin is not None:
        os.set_blocking(stdin, False)
    return Running(pid, stdin, stdout, err_read, input or b"")


def run(argv: list[str], *, input: bytes | None = None, env: dict[str, str] | None = None) -> tuple[int, bytes, bytes]:
    """`start(argv, input=input, env=env).communicate()`: (exit code, stdout, stderr)."""
    return start(argv, input=input, env=env).communicate()


class _Fallback(Exception):
    pass


class _Popen:
    """The same child through `subprocess`, for a process that has a descriptor to keep from it."""

    def __init__(self, argv: list[str], input: bytes | None, stderr: bool, env: dict[str, str] | None):
        import subprocess

        self._input = input
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE if stderr else subprocess.DEVNULL, env=env)

    def communicate(self) -> tuple[int, bytes, bytes]:
        out, err = self._proc.communicate(self._input)
        return self._proc.returncode, out, err or b""

    def kill(self) -> None:
        self._proc.kill()


def _one_thread() -> bool:
    """No thread but this one (`proc/spawn` asks the same before it forks: neither imports the
    other's folder)."""
    threading = sys.modules.get("threading")
    return threading is None or threading.active_count() == 1


def _inheritable_fds() -> list[int]:
    """Our descriptors above stderr that a child would inherit (most are not: PEP 446)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []  # no /proc: Python's own descriptors are non-inheritable all the same
    found = []
    for name in names:
        fd = int(name)
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    found.append(fd)
            except OSError:
                pass  # the listing's own descriptor, closed by now
    return found
