"""A fork server for threaded callers: the MCP server's workers start without a fresh interpreter.

A process with threads may not fork a worker (a fork copies only the calling thread; a lock
another thread held stays locked in the child), so it used to exec `python -m subtask.worker.attempt`,
~0.1-0.15 s of CPU per job. `start` forks a zygote while the caller is still single-threaded;
the zygote imports what a worker needs when asked (the MCP server asks once the SDK is loaded,
so the two imports do not compete for CPU at start-up; the first spawn asks at the latest), and
serves spawn requests on an inherited socketpair
(SOCK_SEQPACKET: one message per request, no framing). A request is JSON (job id, repository,
the caller's environment) with three fds (SCM_RIGHTS): the run-lock, the job's log and the read
end of a "go" pipe. The zygote forks a child per request and replies with its pid; the child
detaches like `spawn._fork_worker`'s and waits for one byte on the go pipe before it runs the
worker. The caller writes that byte only once it has the pid, so the caller alone decides whether
the zygote's worker runs: a caller that gave up (timeout, error) closes the pipe, the child reads
EOF and exits without touching the job, and the caller's fallback exec is then the only worker.

Invariants:
- Started only from a single-threaded process's main thread (PR_SET_PDEATHSIG is tied to the
  thread that forked); the zygote itself never starts a thread.
- Never let the zygote hold the server's pipes or outlive the server, because a client waits for
  its pipes to close: it holds nothing of its parent's but this socket and stderr (fd 0 reads
  /dev/null, fd 1 is stderr, every other fd is closed), and exits on the socket's EOF (or
  PR_SET_PDEATHSIG). Each worker closes the zygote's socket at once, so only the zygote keeps it
  open. It closes the run-lock and log fds it receives without unlocking.
- It dies with its parent: end of input on the socket (or the parent-death signal) ends it.
  It reaps its children (SIGCHLD); they are reset to the default SIGCHLD and SIGINT handlers.
- Never run a zygote's worker with the zygote's own environment, because `SUBTASK_FAULT` and
  `SUBTASK_DEPTH` must behave alike on every path: it runs with the spawner's environment at
  request time (sent with the request, applied in the child), as an exec'd worker would, then
  adopts the job's own kept environment (`jobenv`), as every worker does.
- Never let the zygote decide alone that a worker runs, because the spawner may have given up
  (timeout) and started a fresh interpreter instead: the zygote's child waits for a byte the
  spawner writes only once it has the pid, and exits untouched on EOF. Any failure makes the
  caller start a fresh interpreter instead (`spawn.start_worker`), never a failed start; a failure
  that may leave the socket out of step (timeout, send or receive error) retires the zygote for good.
- Never leave a module a worker imports out of the zygote's preload (`_preload`), because every
  forked worker would import it again, ten at once on two cores (filelock alone: ~30 ms of CPU
  each, 20 % of a worker's Python)
  (`tests/test_zygote.py::test_a_worker_forked_by_the_zygote_imports_nothing`).

Layer: just above `worker` (the MCP server starts it through `api.start_fork_server`, which
imports it only then: no CLI command loads it). It preloads the
worker and what the worker imports, not `api`: a worker uses only the layers below it, so `api`
in a worker's memory would be import time spent for nothing. It registers itself with
`subtask.proc.spawn` (`use_fork_server`), which sits below the worker and so may not import it.

Standard library only at module level (and `subtask.proc.spawn`, which is too): the MCP front end
imports this before the SDK.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading

from subtask.proc import spawn

READY_TIMEOUT = 5.0  # seconds for the zygote's imports (a loaded machine may be slow)
TIMEOUT = 2.0  # seconds for its reply to a spawn request
MAX_REQUEST = 1 << 20
ENV = "SUBTASK_ZYGOTE"  # "0": never start one
PR_SET_PDEATHSIG = 1

class ZygoteError(Exception):
    pass


class Zygote:
    """The parent's handle: one request at a time, from any thread."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid
        self.owner = os.getpid()
        self.lock = threading.Lock()
        self.preloading = False  # b"preload" sent: b"ready" will follow once the imports are done
        self.ready = False
        self.retired = False

    def spawn(self, job_id: str, root: object, lock_fd: int, log_fd: int, repo: object = None) -> int:
        """Have the zygote fork the worker; its pid. Raises on any failure (the worker then never runs).
        `repo`, the caller's open `Repo`, goes with the request as its `handover()`."""
        with self.lock:
            if self.retired:
                raise ZygoteError("retired")
            handover = repo.handover() if repo is not None else None  # type: ignore[attr-defined]
            payload = json.dumps({"job": job_id, "root": str(root), "env": dict(os.environ),
                                  "repo": handover}).encode()
            go_r, go_w = os.pipe()  # both close-on-exec; the zygote receives a copy of go_r
            try:
                try:
                    if not self.ready:
                        self.sock.settimeout(READY_TIMEOUT)
                        self._preload()
                        if self.sock.recv(16) != b"ready":
                            raise ZygoteError("no ready message")
                        self.ready = True
                    self.sock.settimeout(TIMEOUT)
                    socket.send_fds(self.sock, [payload], [lock_fd, log_fd, go_r])
                    os.close(go_r)
                    go_r = -1
                    reply = self.sock.recv(64)
                except BaseException as exc:  # out of step with the zygote, or it is gone
                    self.retire()
                    raise ZygoteError(f"{type(exc).__name__}: {exc}") from exc
                if not reply.isdigit():
                    raise ZygoteError(reply.decode(errors="replace") or "the zygote closed its socket")
                pid = int(reply)
                os.write(go_w, b"g")  # from here on the worker runs
                return pid
            finally:
                if go_r >= 0:
                    os.close(go_r)
                os.close(go_w)  # a child that never got its byte reads EOF and exits

    def preload(self) -> None:
        """Have the zygote import the worker's modules now (it does at the latest on the first spawn)."""
        with self.lock:
            if not self.retired:
                try:
                    self.sock.settimeout(TIMEOUT)
                    self._preload()
                except OSError:
                    self.retire()

    def _preload(self) -> None:
        if not self.preloading:
            self.preloading = True
            self.sock.send(b"preload")

    def retire(self) -> None:
        self.retired = True
        try:
            self.sock.close()  # the zygote reads end of input and exits
        except OSError:
            pass
        try:
            os.waitpid(self.pid, os.WNOHANG)
        except OSError:
            pass


def current() -> Zygote | None:
    """This process's zygote, if it started one and has not retired it."""
    return spawn.fork_server()


def start() -> Zygote | None:
    """Fork the zygote and register it for this process. Call only while single-threaded."""
    if (os.name != "posix" or not hasattr(socket, "send_fds") or os.environ.get(ENV) == "0"
            or os.environ.get("SUBTASK_SPAWN") == "exec"
            or threading.active_count() != 1 or threading.current_thread() is not threading.main_thread()):
        return None
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    except OSError:
        return None
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _serve(theirs, parent)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    theirs.close()
    z = Zygote(ours, pid)
    spawn.use_fork_server(z)  # handed down: `spawn` sits below the worker and never imports this
    return z


# ---------------------------------------------------------------- the zygote

def _serve(sock: socket.socket, parent: int) -> int:
    _detach(sock.fileno())
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the server; EOF ends us
    signal.signal(signal.SIGCHLD, _reap)
    sock.settimeout(None)
    preloaded = False
    while True:
        try:
            msg, fds, flags, _ = socket.recv_fds(sock, MAX_REQUEST, 3)
        except InterruptedError:
            continue
        except OSError:
            return 0
        if not msg and not fds:
            return 0  # the parent is gone
        if not preloaded:  # the first message, whatever it is: the parent is waiting for "ready"
            _preload()
            preloaded = True
            try:
                sock.send(b"ready")
            except OSError:
                return 0  # the parent left while we loaded: nobody to serve
        if msg == b"preload" and not fds:
            continue
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != 3:
                raise ValueError("malformed request")
            request = json.loads(msg)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(sock, request, fds)  # never returns
            reply = str(pid).encode()
        except Exception as exc:
            reply = f"error: {type(exc).__name__}: {exc}".encode()[:60]
        finally:
            for fd in fds:
                os.close(fd)  # closing is not unlocking: the worker's run-lock stays held
        try:
            sock.send(reply)
        except OSError:
            return 0


def _detach(keep: int) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        os.closerange(3, keep)
        os.closerange(keep + 1, 65536)
        return
    for fd in fds:
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _die_with(parent: int) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass  # not Linux: end of input on the socket is enough
    if os.getppid() != parent:
        os._exit(0)  # the parent died before the signal was armed


def _reap(signum: int, frame: object) -> None:
    reap_children()


def reap_children() -> None:
    """Collect every child that has exited, without waiting for any other."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _preload() -> None:
    """What a worker imports, so that its fork has nothing left to load."""
    import subprocess  # noqa: F401

    import filelock  # noqa: F401  (the ledger's lock: a paid job's worker closes its reservation, ~30 ms each)
    import pygit2  # noqa: F401  (no worker imports it; its forks find it loaded and read refs in-process)

    from subtask.engines import command, shell  # noqa: F401
    from subtask.git import signing  # noqa: F401  (a signed job's note says whose)
    from subtask.proc import procs  # noqa: F401
    from subtask.worker import attempt  # noqa: F401


def _child(sock: socket.socket, request: dict, fds: list[int]) -> None:
    """The worker: wait for the go byte, detach as `spawn._fork_worker` does, run the job."""
    code = 1
    try:
        lock_fd, log_fd, go_fd = fds
        sock.close()  # only the zygote may hold its end: the parent must see it gone when it is
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if os.read(go_fd, 1) != b"g":
            code = 0  # the caller gave up on us (and may have started a worker itself)
            return
        os.close(go_fd)
        os.setsid()
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ.pop("SUBTASK_LOCK_FD", None)
        os.set_inheritable(lock_fd, True)  # as the exec'd and CLI-forked workers have it
        os.chdir(request["root"])
        from subtask.model import phases

        phases.before_worker_import()
        from subtask.worker import attempt as worker

        code = worker.run_detached(request["job"], request.get("repo") or request["root"], lock_fd)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)
