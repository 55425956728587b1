"""The warm command server: one per user and code version, so a CLI call skips its imports.

`subtask.cmdclient` (the console script's first step) starts this in the background when it
finds no server, and hands later calls to it. The server imports what the CLI and a worker use
(click, pygit2, our modules), then listens on a SOCK_SEQPACKET socket in the user's 0700
folder. Each connection gets a *session*, a fork of the server that receives the request (argv,
environment, cwd, umask), answers "ready", takes the caller's "go" with its stdin/stdout/stderr
(SCM_RIGHTS), forks the *command child*, replies with its pid, and then waits for either end: when the child exits it
sends the exit status (or the signal that killed it); when the caller goes away (killed, so the
socket closes) it SIGKILLs the child, as the caller's own death would have ended an in-process
command. The session is forked before its call comes (a fork of the server costs ~3 ms): one
*spare* waits in `accept`, tells the server through a pipe when it has taken a call, and the
server forks the next spare meanwhile.

The command child becomes the caller as far as the command can tell: fds 0-2 are the caller's,
`os.environ` is the caller's (time zone, locale and libgit2's config search path re-read from it),
so are cwd, umask, argv and the encodings of the standard streams. It then runs `subtask.cli.main`
exactly as the console script would, and forks its workers as the CLI does.

Invariants:
- The server itself never runs a command, opens a repository or starts a thread: every command
  runs in a fresh fork of its pristine, import-only state, so no call sees another's state.
- Never serve a request whose fingerprint (interpreter, import path, package files) differs from
  the server's; the server exits as soon as the files it loaded change, when it idles
  (SUBTASK_SERVER_IDLE, default 15 minutes), or when its socket is removed or replaced.
- Never serve another user (SO_PEERCRED), nor a process with no_new_privs when the server has
  none: confined jobs run with it (`subtask.isolation`), and a server's child would run their
  commands outside their sandbox.
- No fd of the server's reaches a command child but the caller's three: a worker that outlives
  the call must not hold the listening socket or the server's lock.
- One server per socket: it holds an exclusive flock on `<socket>.lock` (its pid inside) for its
  whole life, and binds only once it has the lock.
- A spare never outlives its server (PR_SET_PDEATHSIG until it has taken a call): it holds the
  listening socket, and would serve calls for a server that is gone. A session that has taken
  its call lives on without the server, as its caller expects.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import socket
import struct
import sys
import time

from subtask import cmdclient, procs, zygote

IDLE_SECONDS = 900.0
TICK_SECONDS = 10.0  # how often an idle server checks its code, its socket and its idle time
SPARE_RETRY_SECONDS = 1.0  # the least time between forks of spares that die without a call
MAX_REQUEST = 1 << 22  # an environment can be large


def main() -> int:
    try:
        launch = json.loads(os.environ.pop(cmdclient.LAUNCH_ENV))
        path, sys.path[:] = launch["path"], launch["sys_path"]
    except (KeyError, ValueError, TypeError):
        return 2
    print_ = launch.get("fingerprint")
    if print_ != cmdclient.fingerprint() or _no_new_privs("self"):
        return 0
    lock_fd = _take_lock(path + ".lock")
    if lock_fd is None:
        return 0  # another server has this socket, or is starting
    _preload()
    listener = _bind(path)
    inode = os.stat(path).st_ino
    try:
        _serve(listener, lock_fd, path, inode, print_, _idle_seconds())
    finally:
        if _inode(path) == inode:  # not a newer server's socket
            os.unlink(path)
        listener.close()
    return 0


def _idle_seconds() -> float:
    try:
        return float(os.environ.get(cmdclient.IDLE_ENV, IDLE_SECONDS))
    except ValueError:
        return IDLE_SECONDS


def _take_lock(lock_path: str) -> int | None:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _preload() -> None:
    """Everything a command or its forked worker imports, and nothing of the MCP face or the SDKs."""
    import click  # noqa: F401
    import filelock  # noqa: F401
    import pygit2  # noqa: F401

    from subtask import api, cli, doctor, landing, render, sync, worker  # noqa: F401
    from subtask.engines import command, shell  # noqa: F401


def _bind(path: str) -> socket.socket:
    """Listen on `path`, replacing a dead server's socket file atomically."""
    temp = f"{path}.{os.getpid()}.tmp"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        os.unlink(temp)
    except FileNotFoundError:
        pass
    listener.bind(temp)
    os.chmod(temp, 0o600)
    listener.listen(64)
    os.replace(temp, path)
    return listener


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _serve(listener: socket.socket, lock_fd: int, path: str, inode: int, print_: str, idle: float) -> None:
    """Keep one spare session waiting for a call; exit when idle or no longer current (the spare
    then dies with us)."""
    taken_r, taken_w = os.pipe()
    last_call = time.monotonic()
    spare = None  # the pidfd of the session waiting in accept
    not_before = 0.0  # no spare before this (monotonic) time
    while True:
        zygote.reap_children()
        now = time.monotonic()
        if spare is None and now >= not_before:
            spare = _fork_spare(listener, (lock_fd, taken_r), taken_w, print_)  # None if fork failed: calls wait in the backlog
            not_before = now + SPARE_RETRY_SECONDS
        left = last_call + idle - now
        if left <= 0:
            return
        wait = min(TICK_SECONDS, left, SPARE_RETRY_SECONDS if spare is None else TICK_SECONDS)
        ready, _, _ = select.select([taken_r] + ([spare] if spare is not None else []), [], [], wait)
        if not ready:
            if not _still_current(path, inode, print_):
                return
            continue
        if taken_r in ready:
            os.read(taken_r, 64)
            last_call = time.monotonic()
            not_before = 0.0
        # It took a call, or died without one (then the next waits out SPARE_RETRY_SECONDS since its
        # fork, so a spare that cannot live does not make us fork in a loop).
        os.close(spare)
        spare = None


def _fork_spare(listener: socket.socket, server_fds: tuple[int, ...], taken_w: int, print_: str) -> int | None:
    """Fork the next session: it waits for a call, writes a byte to `taken_w` when it has one,
    and closes the listener, `server_fds` and the pipe before it serves it. Its pidfd, or None."""
    server = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid:
        return os.pidfd_open(pid)
    code = 0
    try:
        procs.child_setup_for(server)()  # killed when the server exits; gone at once if it already has
        conn = _accept(listener)
        os.write(taken_w, b"t")
        procs.set_parent_death_signal(0)  # from here on, a call depends on us
        listener.close()
        for fd in (*server_fds, taken_w):
            os.close(fd)
        _session(conn, print_)  # never returns
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _accept(listener: socket.socket) -> socket.socket:
    while True:
        try:
            return listener.accept()[0]
        except ConnectionAbortedError:  # a caller that gave up before we took it
            continue


def _still_current(path: str, inode: int, print_: str) -> bool:
    return _inode(path) == inode and cmdclient.fingerprint() == print_


# -- a session: one call ---------------------------------------------------------------------------

def _session(conn: socket.socket, print_: str) -> None:
    code = 0
    try:
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        request = _receive(conn, print_)
        if request is None:
            return
        _send(conn, b"ready")
        fds = _go(conn)
        if fds is None:
            return  # the caller gave up waiting and runs the command itself
        pid = os.fork()
        if pid == 0:
            _command(conn, request, fds)  # never returns
        for fd in fds:
            os.close(fd)
        _watch(conn, pid)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _receive(conn: socket.socket, print_: str) -> dict | None:
    """The request, or None after telling the caller no."""
    request, reason = _check(conn, conn.recv(MAX_REQUEST), print_)
    if reason is not None:
        _send(conn, b"refused " + reason.encode())
    return request


def _go(conn: socket.socket) -> list[int] | None:
    """The caller's "go" with its stdin, stdout and stderr; None when it gave up or sent otherwise."""
    msg, fds, flags, _ = socket.recv_fds(conn, 16, 3)
    if msg == b"go" and len(fds) == 3 and not flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        return fds
    for fd in fds:
        os.close(fd)
    return None


def _check(conn: socket.socket, msg: bytes, print_: str) -> tuple[dict | None, str | None]:
    """(the request, None), or (None, why it is refused). `print_` is the fingerprint of the code
    this server loaded (not of the files now: they may have changed since)."""
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    if uid != os.getuid():
        return None, "another user"
    if _no_new_privs(str(pid)):
        return None, "a confined process"
    try:
        request = json.loads(msg)
    except ValueError:
        return None, "a malformed request"
    if not isinstance(request, dict) or request.get("v") != cmdclient.PROTOCOL:
        return None, "another protocol"
    if request.get("fingerprint") != print_:
        return None, "other code"
    return request, None


def _no_new_privs(pid: str) -> bool:
    """Does `pid` run with no_new_privs (as every confined engine's process tree does)? True when unsure."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("NoNewPrivs:"):
                    return line.split()[1] != "0"
    except OSError:
        pass
    return True


def _send(conn: socket.socket, message: bytes) -> None:
    """One reply, in the words `subtask.cmdclient.reply` reads."""
    try:
        conn.send(message)
    except OSError:
        pass


def _watch(conn: socket.socket, pid: int) -> None:
    """Relay the child's end to the caller; kill the child if the caller goes first."""
    pidfd = os.pidfd_open(pid)
    _send(conn, b"pid %d" % pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(conn.fileno(), select.POLLIN | select.POLLHUP)
    while True:
        events = dict(poller.poll())
        if pidfd in events:
            _, status = os.waitpid(pid, 0)
            if os.WIFSIGNALED(status):
                _send(conn, b"signal %d" % os.WTERMSIG(status))
            else:
                _send(conn, b"exit %d" % os.waitstatus_to_exitcode(status))
            return
        if conn.fileno() in events:  # the caller never writes after its request: it is gone
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return


# -- the command child: the caller's process, as far as the command can tell ------------------------

def _command(conn: socket.socket, request: dict, fds: list[int]) -> None:
    code = 1
    try:
        conn.close()
        _become_caller(request, fds)
        from subtask.cli import main as cli_main

        cli_main(request["argv"])
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _become_caller(request: dict, fds: list[int]) -> None:
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    os.umask(int(request["umask"]))
    time.tzset()
    _reread_locale()
    _reread_git_search_path()
    sys.argv = ["git-subtask", *request["argv"]]
    _reopen_stdio(request["stdio"])
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _reread_locale() -> None:
    import locale

    try:
        locale.setlocale(locale.LC_CTYPE, "")
    except locale.Error:
        pass


def _reread_git_search_path() -> None:
    """libgit2 read HOME and XDG_CONFIG_HOME when the server loaded it; None makes it look again."""
    import pygit2

    for level in (pygit2.enums.ConfigLevel.SYSTEM, pygit2.enums.ConfigLevel.XDG, pygit2.enums.ConfigLevel.GLOBAL):
        pygit2.settings.search_path[level] = None


def _reopen_stdio(stdio: list) -> None:
    """Standard streams on fds 0-2 as Python would have made them for the caller."""
    import io

    streams = []
    for fd, (encoding, errors) in enumerate(stdio):
        tty = os.isatty(fd)
        raw = io.FileIO(fd, "r" if fd == 0 else "w", closefd=False)
        buffered = io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw)
        streams.append(io.TextIOWrapper(buffered, encoding=encoding, errors=errors,
                                        line_buffering=tty or fd == 2, write_through=fd == 2))
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
