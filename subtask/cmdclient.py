"""The console script's fast path: hand the command to this user's warm command server.

Every `git subtask` call used to pay for a fresh interpreter that imports click, pygit2 and our
modules (~0.1-0.15 s of CPU) before it did any work. A per-user server (`subtask.cmdserver`)
keeps those imported; the console script connects to it, sends its argv, environment, cwd and
umask with its stdin, stdout and stderr (SCM_RIGHTS), and the server forks a fresh child of its
pristine state that runs the command as this process would have, on this process's own fds. This
process forwards the signals it gets to that child and exits with the child's exit status.

When there is no server (the first call, after an upgrade, after it idled out), this module
starts one in the background and the command runs in this process as before: a call never waits
for a server, and never depends on one.

Invariants:
- Never run a command twice: the server forks it only on our "go" (which carries our stdio), and
  we send that only while we still wait for it (10 s, SUBTASK_SERVER_TIMEOUT); any failure before
  the "go" runs the command here instead, and after it this process only relays.
- Never hand a command to a server built from other code: the socket's name is a digest of this
  interpreter, its import path and every file of the package (size and mtime), and the server
  refuses a request whose full fingerprint is not its own (an edit in an editable install, an
  upgrade, another venv each get their own server).
- Never from inside a job: a confined engine (SUBTASK_ISOLATION) runs its commands here, in its
  sandbox; the server also refuses peers that run with no_new_privs (see `subtask.cmdserver`).
- Only a folder this user owns, mode 0700, holds the socket: another user cannot plant one.
- Standard library only, and little of it: this runs before anything else in every call, so it
  uses the C modules `_socket`, `_signal` and `_json` directly; `socket`, `signal` and `json`
  would import `enum` and `re` (~10 ms, as long as Python's own start). Requests are JSON (written
  here by `to_json`); the server's replies are one word and a number or a reason (`ready`,
  `refused WHY`, `pid N`, `exit N`, `signal N`).
"""

from __future__ import annotations

import _signal
import _socket
import os
import sys

try:
    from _json import encode_basestring_ascii as _quote
except ImportError:  # not CPython: the module's own, with its imports
    from json.encoder import encode_basestring_ascii as _quote

PROTOCOL = 2
ENV = "SUBTASK_SERVER"  # "0" (or off/false/no): never use or start a command server
DIR_ENV = "SUBTASK_SERVER_DIR"  # where the sockets live (tests); default $XDG_RUNTIME_DIR or /tmp
IDLE_ENV = "SUBTASK_SERVER_IDLE"  # seconds a server waits for a call before it exits
LAUNCH_ENV = "SUBTASK_SERVER_LAUNCH"  # to a new server: its socket, the client's sys.path and fingerprint
FORWARDED = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT, _signal.SIGUSR1, _signal.SIGUSR2,
             _signal.SIGWINCH)
MAX_REPLY = 4096
MAX_SOCKET_PATH = 84
HANDOVER_TIMEOUT = 10.0  # seconds for the server to take a call before it runs here instead
TIMEOUT_ENV = "SUBTASK_SERVER_TIMEOUT"


def fingerprint() -> str:
    """What the server's code must match: this interpreter, its import path and the package files."""
    package = os.path.dirname(os.path.abspath(__file__))
    parts = [str(PROTOCOL), sys.executable, sys.version, repr(sys.flags), os.pathsep.join(sys.path), package]
    for folder, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".json")):
                st = os.stat(os.path.join(folder, name))
                parts.append(f"{folder[len(package):]}/{name}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(parts)


def server_dir() -> str | None:
    """This user's socket folder, made 0700 if missing; None when it is not safely ours."""
    base = os.environ.get(DIR_ENV) or os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    path = os.path.join(base, f"git-subtask-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return path


def socket_path(folder: str, print_: str) -> str:
    import zlib

    return os.path.join(folder, f"{zlib.crc32(print_.encode()):08x}.sock")


def enabled() -> bool:
    if os.environ.get(ENV, "1").strip().lower() in ("0", "off", "false", "no"):
        return False
    if os.environ.get("SUBTASK_ISOLATION", "none") != "none":
        return False  # a confined job: its command must run inside its sandbox
    return sys.platform.startswith("linux") and hasattr(_socket.socket, "sendmsg") and hasattr(os, "pidfd_open")


def to_json(value: object) -> str:
    """JSON of the request's strings, ints, lists and dicts (as `json.dumps` writes them, ASCII)."""
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(to_json, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_quote(str(k))}: {to_json(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"not a request value: {value!r}")


def reply(data: bytes) -> tuple[str, str]:
    """A server's reply as (word, rest): ("pid", "123"); ("", "") for nothing or garbage."""
    word, _, rest = data.decode("ascii", "replace").partition(" ")
    return word, rest


def run(argv: list[str]) -> int | None:
    """Run `argv` through the warm server: its exit code, or None to run it in this process."""
    if not enabled():
        return None
    folder = server_dir()
    if folder is None:
        return None
    print_ = fingerprint()
    path = socket_path(folder, print_)
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        return None  # a socket address holds 107 bytes, and the server binds a longer temp name first
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        start_server(path, print_)
        return None
    except OSError:
        sock.close()
        return None
    try:
        pid = _hand_over(sock, argv, print_)
        if pid is None:
            return None
        if pid < 0:  # it may have run: never run it a second time here
            print("git-subtask: error: the command server went away as the command started", file=sys.stderr)
            return 128
        return _relay(sock, pid)
    finally:
        sock.close()


def exit_now(code: int) -> None:
    """Exit with a served command's status, skipping the interpreter's teardown (~2 ms): this
    process holds nothing to clean up, only its own messages to flush."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)


def _hand_over(sock: _socket.socket, argv: list[str], print_: str) -> int | None:
    """Send the request; the child's pid once the server has forked it, or None (nothing ran).

    The server forks the command only after our "go" (with our stdin, stdout and stderr), and we send
    it only while we still wait:
    a server too slow to answer (stopped, swapped out) is given up on, and the call runs here once.
    """
    try:
        cwd = os.getcwd()
        mask = os.umask(0o022)
        os.umask(mask)
        for fd in (0, 1, 2):
            os.fstat(fd)
        request = {"v": PROTOCOL, "fingerprint": print_, "argv": argv, "cwd": cwd, "umask": mask,
                   "env": dict(os.environ), "stdio": [_stream_info(s) for s in (sys.stdin, sys.stdout, sys.stderr)]}
        sock.settimeout(_timeout())
        sock.send(to_json(request).encode())
        if reply(sock.recv(MAX_REPLY))[0] != "ready":
            return None
        sock.settimeout(None)
        # Our fds travel only now: sent to a server that never reads them, they would stay open in
        # its socket's queue, and whoever reads our stdout would wait for its end.
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))  # an int array, as socket.send_fds
        sock.sendmsg([b"go"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
    except (OSError, ValueError, TypeError):
        return None
    try:
        word, pid = reply(sock.recv(MAX_REPLY))
    except OSError:
        word, pid = "", ""
    return int(pid) if word == "pid" and pid.isdigit() and int(pid) > 0 else -1  # -1: "go" went, the server went away


def _timeout() -> float:
    try:
        return float(os.environ.get(TIMEOUT_ENV, HANDOVER_TIMEOUT))
    except ValueError:
        return HANDOVER_TIMEOUT


def _stream_info(stream) -> list:
    return [getattr(stream, "encoding", None) or "utf-8", getattr(stream, "errors", None) or "strict"]


def _relay(sock: _socket.socket, pid: int) -> int:
    """Forward signals to the command's child until the server reports how it ended."""
    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except OSError:
            pass

    for signum in FORWARDED:
        _signal.signal(signum, forward)
    while True:
        try:
            data = sock.recv(MAX_REPLY)
            break
        except InterruptedError:
            continue
        except OSError:
            data = b""
            break
    word, number = reply(data)
    if word == "exit" and number.lstrip("-").isdigit():
        return int(number)
    if word == "signal" and number.isdigit():  # die of it as the command did, so a shell or a test sees the same
        signum = int(number)
        _signal.signal(signum, _signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return 128 + signum
    print("git-subtask: error: the command server went away before the command ended", file=sys.stderr)
    return 128


def start_server(path: str, print_: str) -> None:
    """Start a server for this code in the background; the current call does not wait for it."""
    import subprocess

    env = dict(os.environ, **{LAUNCH_ENV: to_json({"path": path, "sys_path": sys.path, "fingerprint": print_})})
    try:
        subprocess.Popen([sys.executable, "-m", "subtask.cmdserver"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         close_fds=True, cwd="/", env=env)
    except OSError:
        pass
