"""Run one child process safely: its own process group, both pipes drained, a hard timeout.

This module owns every fork/exec git-subtask does for engines and scripts, and the signalling of
the process groups it creates.

Invariants:
- The child is the leader of a new session (`start_new_session=True`), so its pgid equals its pid
  and `kill_group(pid)` reaches it and everything it spawned (unless they left the group).
- The child never outlives the process that spawned it: `child_setup` (run in the child between
  fork and exec) sets PR_SET_PDEATHSIG to SIGKILL, and exits at once if that parent is already
  gone. Linux sends it when the *thread* that forked dies, so children are spawned only from a
  thread that lives as long as the worker (its main thread). It reaches the leader only; the
  rest of the group is ended by whoever ends the dead worker (`lifecycle`, from `run/<id>.engine`).
- `child_setup` is the one place for code that must run in the child before exec.
- SIGTERM and SIGINT handlers are held back while Popen runs, so an interrupt can never land
  after the fork but before we know the child's pid; it is raised right after, and ends the child.
- Nothing goes through a shell unless argv itself names one (`["sh", "-c", ...]`).
- stdin is /dev/null unless `stdin_data` is given; a child never waits on our terminal.
- stdout and stderr are drained concurrently by two reader threads, so a chatty child can never
  block on a full pipe. Undecodable bytes become U+FFFD; reading never raises on content.
- `run` is finished when the leader has exited AND stdout reached EOF. stderr only gets a short
  grace afterwards: a background grandchild that inherited stderr cannot keep `run` waiting.
- On timeout, or if the calling thread is interrupted, the whole group is sent SIGTERM, then
  SIGKILL after `kill_grace`. After a normal leader exit, leftover group members are left alone.
- `kill_group` never signals pgid <= 1 or our own group: `killpg(0)` would signal ourselves.
- With `redact=True` both streams pass a `redact.StreamRedactor` before anything else sees them:
  the line callbacks and the tails get redacted text only (a key block printed over many lines
  and reads is redacted whole), so no caller can store what a child printed raw.
- While a job runs, every child gets its starter's context before exec (`proc/context`).
- While a job's isolation is active (`isolation.confined`), every child is confined before exec
  (its namespaces, then Landlock) and, given a pid namespace, run as pid 1 of it by `unshare --fork`.
- A missing program is exit code 127 and a permission problem 126, as a shell would report;
  a missing working directory is a `SubtaskError`.
- Never let an engine outlive its worker, because a dead worker's engine would run beside the job
  that got its slot (two engines under `maxRunning=1`), keep spending after its reservation
  closed, and commit after its job was recorded failed: `procs.child_setup_for` sets
  PR_SET_PDEATHSIG in every child (Linux signals it when the spawning *thread* dies, so children
  are spawned from the worker's main thread), and `lifecycle.end_dead` kills the recorded
  engine group before it ends the attempt and frees the slot.
- Never signal a recorded process group without proof that it is still the one recorded, because
  pids are reused: the pid file keeps the engine leader's start time; a process with that pid and
  another start time is left alone, and a group with no process of its pid can only be the old
  group (the kernel gives no new process a pid still in use as a group id).
- Never let our git read what a job wrote while a process of the job still runs, because a check
  of its metadata followed by a rewrite before git reads it would defeat the check: a confined
  job's engine runs in a pid namespace whose pid 1 ends with it (the kernel ends the rest), an
  unconfined job's leftovers are ended by the worker as their subreaper (`procs.end_adopted`),
  both before the autocommit; a dead worker's are ended by whoever ends it
  (`procs.end_marked`, by the `SUBTASK_RUN` mark in their environment).
"""

from __future__ import annotations

import codecs
import ctypes
import errno
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from subtask.model.dataclass import dataclass
from subtask.model.errors import SubtaskError
from subtask.model.redact import StreamRedactor
from subtask.proc import context, isolation, spawn

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import IO, Any


LineCallback = Callable[[str], None]

_READ_CHUNK = 65536
_POLL_MS = 50  # how often an idle reader checks whether it was told to stop
_MAX_LINE = 256 * 1024  # a "line" longer than this is delivered in pieces, so memory stays bounded
_STDERR_GRACE = 0.2  # after leader exit + stdout EOF, how long stderr may still deliver
_AFTER_KILL_GRACE = 0.2  # after killing the group, how long the pipes may still deliver
_KILL_POLL = 0.02


@dataclass
class ProcResult:
    """What a finished `run` reports. `pid` is -1 when nothing could be started."""

    exit_code: int | None  # None if killed by timeout/interrupt before exit; -N for signal N
    timed_out: bool
    seconds: float
    stdout_tail: str  # last tail_bytes of stdout, utf-8 with errors="replace"
    stderr_tail: str
    pid: int


# -- the child, between fork and exec --------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
# Held back while Popen runs: an interrupt (stop's SIGTERM is one in the worker) raised inside
# Popen, after the fork, would lose the child's pid and leave the child running unseen.
_DEFERRED = (signal.SIGTERM, signal.SIGINT)


class _Deferred:
    """Python-level handlers of `_DEFERRED` replaced by a recorder (main thread only: only there
    do signals raise), until `deliver()` restores them and re-sends what arrived meanwhile."""

    def __init__(self) -> None:
        self.saved: dict[int, Callable[[int, FrameType | None], Any]] = {}
        self.pending: list[int] = []
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in _DEFERRED:
            handler = signal.getsignal(sig)
            if callable(handler):
                self.saved[sig] = handler
                signal.signal(sig, lambda signum, frame: self.pending.append(signum))

    def deliver(self) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        self.saved = {}
        for sig in dict.fromkeys(self.pending):
            os.kill(os.getpid(), sig)  # its handler runs now, where the caller can clean up
        self.pending = []


def _load_prctl():
    """libc's prctl, resolved now: the child, between fork and exec, must not load libraries."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_prctl = _load_prctl()


def child_setup_for(parent_pid: int) -> Callable[[], None]:
    """The `preexec_fn` for a child of `parent_pid` (the calling process), also called by a forked
    child that must not outlive its parent. Keep it small and
    async-signal-safe in spirit: it runs in the forked child of a possibly threaded parent."""

    def child_setup() -> None:
        if _prctl is not None:
            set_parent_death_signal(signal.SIGKILL)
            if os.getppid() != parent_pid:
                os._exit(128 + signal.SIGKILL)  # the parent died before the signal was armed

    return child_setup


def set_parent_death_signal(signum: int) -> None:
    """PR_SET_PDEATHSIG for the calling process: `signum` when the thread that forked it exits
    (0: none any more). Nothing where prctl is not available."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)


# -- killing --------------------------------------------------------------------------------------


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the group; False if the group no longer exists (or is not ours to signal)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _group_exists(pgid: int) -> bool:
    return _signal_group(pgid, 0)


def kill_group(pgid: int, grace: float = 2.0, is_alive: Callable[[], bool] | None = None) -> None:
    """SIGTERM the process group `pgid`, wait up to `grace` seconds, then SIGKILL what is left.

    `is_alive` tells when the group may be considered gone; by default the group is probed with
    signal 0. A caller that is the leader's parent should pass one that reaps (e.g.
    `lambda: proc.poll() is None`): an unreaped zombie leader still counts as a group member.
    """
    if pgid <= 1 or pgid == os.getpgrp():
        # killpg(0) / killpg(1) / our own group would hit ourselves or everything.
        raise ValueError(f"refusing to signal process group {pgid}")
    if not _signal_group(pgid, signal.SIGTERM):
        return
    alive = is_alive if is_alive is not None else (lambda: _group_exists(pgid))
    deadline = time.monotonic() + max(grace, 0.0)
    while alive() and time.monotonic() < deadline:
        time.sleep(_KILL_POLL)
    # Even when the leader is gone, members that ignored SIGTERM may remain: SIGKILL the group
    # unless it is confirmed empty.
    if _group_exists(pgid):
        _signal_group(pgid, signal.SIGKILL)


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, from /proc), or None if unknown or gone.

    Together with the pid it names one process for good: a reused pid has a later start time.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _live_members(pgid: int) -> bool:
    """Does group `pgid` still have a member that is not a zombie? (A zombie stays in its group
    until someone reaps it, and signal 0 still reaches it.)"""
    if not _group_exists(pgid):
        return False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True  # no /proc: the group exists, so count it as alive
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] != b"Z":
            return True
    return False


def kill_orphaned_group(pgid: int, leader_started: int | None, wait: float = 2.0) -> bool:
    """SIGKILL a process group whose owner (a dead worker) recorded it as (`pgid`, leader start
    time), and wait up to `wait` seconds until no member is left. True if it was signalled.

    Proof that the group is still the recorded one, never a reused id: while any member of group
    P lives, the kernel allocates pid P to no new process, so a group P without a process P is
    the old group; a process P that exists must have the recorded start time.
    """
    if pgid <= 1 or pgid == os.getpgrp() or not _group_exists(pgid):
        return False
    if not os.path.isdir("/proc/self"):
        return False  # no way to prove which process a pid names now: never guess
    leader = start_time(pgid)
    leader_present = leader is not None or os.path.exists(f"/proc/{pgid}")
    if leader_present and (leader_started is None or leader != leader_started):
        return False  # a process named pgid exists and is not provably the recorded leader
    _signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + wait
    while _live_members(pgid) and time.monotonic() < deadline:
        time.sleep(_KILL_POLL)
    return True


_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Orphans of our descendants become our children (not init's), so `end_adopted` finds them."""
    if _prctl is not None:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as fh:
                found += [int(p) for p in fh.read().split()]
        except (OSError, ValueError):
            pass
    return found


RUN_MARKER_ENV = spawn.RUN_MARKER_ENV  # `<job>.<attempt>.<worker pid>` in every process of an attempt, no worker


def _marked(pid: int, marker: bytes, exact: bool) -> bool:
    """Does `pid`'s environment hold the variable `marker` (`NAME=value`), or (not `exact`) one
    that starts with it?"""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            items = fh.read().split(b"\0")
    except OSError:
        return False
    return marker in items if exact else any(item.startswith(marker) for item in items)


def _kill_marked(candidates: Callable[[], list[int]], marker: bytes, exact: bool, rounds: int, after_round) -> int:
    """SIGKILL the candidates carrying `marker`, round after round (a killed one's children may
    still be forking), until none is left; how many were killed."""
    killed = 0
    for _ in range(rounds):
        victims = [pid for pid in candidates() if _marked(pid, marker, exact)]
        if not victims:
            break
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        after_round(victims)
    return killed


def end_adopted(value: str) -> int:
    """SIGKILL our children whose environment holds `RUN_MARKER_ENV=value` exactly: what an attempt
    left running (as their subreaper we adopted its orphans). Each one killed hands its own
    children to us once reaped, so the next round finds them. How many were killed."""
    def reap(victims: list[int]) -> None:
        for pid in victims:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass

    return _kill_marked(lambda: _children(os.getpid()), f"{RUN_MARKER_ENV}={value}".encode(), exact=True,
                        rounds=100, after_round=reap)


def end_marked(job_id: str) -> int:
    """SIGKILL every process of ours whose environment marks it as one of `job_id`'s attempts:
    what a dead worker's job left running outside its process group (where no pid namespace
    ended it). The caller holds the job's run-lock, so none of them belongs to a live attempt."""
    me = os.getpid()
    return _kill_marked(lambda: [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me],
                        f"{RUN_MARKER_ENV}={job_id}.".encode(), exact=False, rounds=10,
                        after_round=lambda victims: time.sleep(_KILL_POLL))


# -- reading --------------------------------------------------------------------------------------


def _decode_tail(buf: bytes | bytearray, tail_bytes: int) -> str:
    data = bytes(buf[-tail_bytes:]) if tail_bytes > 0 else b""
    if len(buf) > len(data):
        # The cut may fall inside a UTF-8 sequence; drop its orphaned continuation bytes.
        skip = 0
        while skip < min(3, len(data)) and 0x80 <= data[skip] <= 0xBF:
            skip += 1
        data = data[skip:]
    return data.decode("utf-8", errors="replace")


class _Reader(threading.Thread):
    """Drains one pipe: keeps a byte tail and hands complete decoded lines to a callback.

    It polls instead of blocking in read() so that `stop()` takes effect even while another
    process still holds the write end open.
    """

    def __init__(self, pipe: IO[bytes], on_line: LineCallback | None, tail_bytes: int, name: str,
                 redact: bool = False):
        super().__init__(name=name, daemon=True)
        self._redactor = None
        if redact:
            self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            self._redactor = StreamRedactor()
        self._pipe = pipe
        self._on_line = on_line
        self._tail_bytes = max(tail_bytes, 0)
        self._tail = bytearray()
        self._partial = bytearray()
        self._stop_event = threading.Event()
        self.error: BaseException | None = None  # first exception raised by the callback

    def stop(self) -> None:
        self._stop_event.set()

    def tail(self) -> str:
        return _decode_tail(self._tail, self._tail_bytes)

    def run(self) -> None:
        fd = self._pipe.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        try:
            while not self._stop_event.is_set():
                if poller.poll(_POLL_MS) and not self._read_once(fd):
                    return  # EOF
            # Told to stop: take what is already buffered, without waiting for more.
            for _ in range(16):
                if not poller.poll(0) or not self._read_once(fd):
                    break
        finally:
            if self._redactor is not None:
                self._feed_redacted(self._decoder.decode(b"", final=True), end=True)
            self._flush_partial()
            self._pipe.close()

    def _read_once(self, fd: int) -> bool:
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except OSError:
            return False
        if not chunk:
            return False
        if self._redactor is not None:
            self._feed_redacted(self._decoder.decode(chunk))
        else:
            self._feed(chunk)
        return True

    def _feed_redacted(self, text: str, end: bool = False) -> None:
        """Only what the redactor releases reaches the tail and the line callback."""
        assert self._redactor is not None  # (its callers feed through it only when it is there)
        out = self._redactor.feed(text) + (self._redactor.close() if end else "")
        if out:
            self._feed(out.encode("utf-8", "surrogatepass"))

    def _feed(self, chunk: bytes) -> None:
        if self._tail_bytes:
            self._tail += chunk
            if len(self._tail) > 2 * self._tail_bytes:  # trim rarely: amortised O(1) per byte
                del self._tail[: -self._tail_bytes]
        if self._on_line is None:
            return
        # Split only the new chunk, so a long unfinished line is not rescanned on every read.
        first, *rest = chunk.split(b"\n")
        self._partial += first
        if rest:
            self._emit(bytes(self._partial))
            self._partial = bytearray(rest.pop())
            for line in rest:
                self._emit(line)
        while len(self._partial) > _MAX_LINE:
            self._emit(bytes(self._partial[:_MAX_LINE]))
            del self._partial[:_MAX_LINE]

    def _flush_partial(self) -> None:
        if self._partial:
            self._emit(bytes(self._partial))
            self._partial.clear()

    def _emit(self, line: bytes) -> None:
        if self._on_line is None:
            return
        if line.endswith(b"\r"):
            line = line[:-1]
        try:
            self._on_line(line.decode("utf-8", errors="replace"))
        except BaseException as exc:
            # A broken callback must not stop the draining (the child would block on a full
            # pipe); remember the error, stop calling it, and let run() raise it at the end.
            self.error = exc
            self._on_line = None
            self._partial.clear()


def _feed_stdin(pipe: IO[bytes], data: bytes) -> None:
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError):
        pass  # the child did not want (all of) its input; that is its business
    finally:
        try:
            pipe.close()
        except OSError:
            pass


# -- running --------------------------------------------------------------------------------------


def _spawn_failure(argv: list[str], exc: OSError, started: float) -> ProcResult:
    """What a shell would report for a program it could not execute."""
    code = 127 if isinstance(exc, FileNotFoundError) else 126
    reason = "command not found" if code == 127 else (exc.strerror or str(exc))
    message = f"{argv[0]}: {reason}\n"
    return ProcResult(code, False, time.monotonic() - started, "", message, -1)


# -- confinement: subtask/isolation.py owns the policy; procs only asks for the child's hook -------


def _child_setup(sandbox=None):
    """What every child runs before exec: die with its spawner, then (in a job) its starter's
    context (`proc/context`: nice value, limits, umask, namespaces) and its confinement, which
    makes its namespaces inside the starter's."""
    setup = child_setup_for(os.getpid())
    steps = [step for step in (context.child_call(), _confinement_hook(sandbox)) if step is not None]
    if not steps:
        return setup

    def setup_and_confine() -> None:
        setup()
        for step in steps:
            step()

    return setup_and_confine


def _confinement_hook(sandbox=None) -> Callable[[], None] | None:
    """The pre-exec hook confining this child (namespaces, Landlock): in `sandbox` when given,
    else in the job isolation active in this process; None when there is none."""
    return isolation.child_hook(sandbox)


def _sandboxed(argv: list[str], cwd, env: dict | None, sandbox=None) -> list[str]:
    """argv as a job's sandbox runs it (through `unshare --fork` for a pid namespace of its own).
    A program that cannot be executed is refused here as execve would refuse it, because behind
    the wrapper its failure would look like a program that ran and exited 126 or 127."""
    wrapped = isolation.wrap_argv(argv, sandbox)
    if wrapped is not argv:
        check_executable(argv[0], cwd, env)
    return wrapped


def check_executable(program: str, cwd, env: dict | None) -> None:
    """Raise the OSError execve would for `program` (found on PATH unless it names a path): not
    there, not executable, or a script whose interpreter is not there."""
    if "/" in program:
        path: str | None = os.path.join(os.fspath(cwd or "."), program)
    else:
        path = shutil.which(program, path=(env if env is not None else os.environ).get("PATH", os.defpath))
    if path is None or not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)
    except OSError as exc:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program) from exc
    if head.startswith(b"#!"):
        words = head[2:].split(b"\n", 1)[0].split()
        if not words or not os.access(os.fsdecode(words[0]), os.X_OK):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def _start(argv: list[str], cwd, env: dict | None, with_stdin: bool, sandbox=None) -> subprocess.Popen:
    try:
        return subprocess.Popen(
            _sandboxed(argv, cwd, env, sandbox),
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_child_setup(sandbox),
        )
    except OSError as exc:
        # subprocess reports a failed chdir with the cwd as filename; that is not the
        # program's fault and no exit code describes it.
        # (It passes our cwd object through, so compare as paths: str vs Path must not matter.)
        failed = os.fspath(exc.filename) if exc.filename is not None else None
        if cwd is not None and failed == os.fspath(cwd) and failed != os.fspath(argv[0]):
            raise SubtaskError(
                "fatal",
                f"cannot run {argv[0]}: working directory {os.fspath(cwd)}: {exc.strerror}",
                hint="check that the worktree still exists (git worktree list)",
            ) from exc
        raise


def run(argv: list[str], **options) -> ProcResult:
    """Run argv to completion (or timeout) in its own process group: `start(argv, **options).wait()`
    (the options are `start`'s)."""
    return start(argv, **options).wait()


class Running:
    """A child `start` started: `wait()` drains it to its end (or timeout) and returns its result,
    exactly as `run` would have; `abort()` ends it. The caller may do other work in between,
    but must end it one way or the other (a `Running` never waited for leaves its group)."""

    def __init__(self, proc: subprocess.Popen | None, result: ProcResult | None, started: float,
                 timeout: float | None, kill_grace: float, stdout_grace: float | None,
                 readers: tuple[_Reader, _Reader] | None):
        self.proc, self._result, self.started = proc, result, started
        self.timeout, self.kill_grace, self.stdout_grace = timeout, kill_grace, stdout_grace
        self.readers = readers

    def _alive(self) -> bool:
        # poll() reaps the leader; after that only other members keep the group alive.
        assert self.proc is not None
        return self.proc.poll() is None or _group_exists(self.proc.pid)

    def wait(self) -> ProcResult:
        if self._result is not None:
            return self._result
        proc, readers = self.proc, self.readers
        assert proc is not None and readers is not None
        out, err = readers
        try:
            exit_code, timed_out = _wait(proc, out, self.started, self.timeout, self.stdout_grace)
            if timed_out:
                kill_group(proc.pid, self.kill_grace, self._alive)
                proc.wait()
                _finish_readers((out, err), _AFTER_KILL_GRACE)
            else:
                _finish_readers((out, err), _STDERR_GRACE)
        except BaseException:
            self.abort()
            raise
        for reader in (out, err):
            if reader.error is not None:
                raise reader.error
        self._result = ProcResult(exit_code, timed_out, time.monotonic() - self.started, out.tail(), err.tail(),
                                  proc.pid)
        return self._result

    def abort(self) -> None:
        if self._result is None and self.proc is not None and self.readers is not None:
            _abort(self.proc, self.kill_grace, self._alive, self.readers)


def start(
    argv: list[str],
    *,
    cwd,
    env: dict | None = None,
    timeout: float | None = None,
    on_stdout_line: LineCallback | None = None,
    on_stderr_line: LineCallback | None = None,
    tail_bytes: int = 4096,
    stdin_data: bytes | None = None,
    on_start: Callable[[int], None] | None = None,
    kill_grace: float = 2.0,
    stdout_grace: float | None = None,
    redact: bool = False,
    sandbox=None,
) -> Running:
    """Start argv in its own process group; returns once the child is started and its pipes are
    being drained (`Running`; `run` waits for it). See the module docstring.

    `env=None` inherits our environment; a dict replaces it entirely. The two line callbacks run
    on two different reader threads, possibly at the same time. If a callback raises, its
    stream is still drained, and the exception is re-raised once the child has finished.

    `stdout_grace`: once the leader has exited, wait at most this long for stdout to close
    (a background process the child left behind may hold it forever); None waits until the
    timeout.

    `redact`: both streams are redacted (statefully, see the module docstring) before the
    callbacks and the tails see them.

    `sandbox`: an `isolation.Sandbox` the child runs in, whatever is active in this process (a
    threaded caller must not make one active: every thread's children would get it).
    """
    if not argv:
        raise ValueError("run() needs a program to run")
    started = time.monotonic()
    deferred = _Deferred()
    try:
        proc = _start(argv, cwd, env, stdin_data is not None, sandbox)
    except OSError as exc:
        deferred.deliver()
        result = _spawn_failure(argv, exc, started)
        if on_stderr_line is not None:
            on_stderr_line(result.stderr_tail.rstrip("\n"))
        return Running(None, result, started, timeout, kill_grace, stdout_grace, None)
    except BaseException:
        deferred.deliver()
        raise

    pid = proc.pid
    assert proc.stdout is not None and proc.stderr is not None
    out = _Reader(proc.stdout, on_stdout_line, tail_bytes, f"subtask-stdout-{pid}", redact)
    err = _Reader(proc.stderr, on_stderr_line, tail_bytes, f"subtask-stderr-{pid}", redact)
    running = Running(proc, None, started, timeout, kill_grace, stdout_grace, (out, err))
    try:
        deferred.deliver()  # an interrupt that came during the spawn is raised here: abort ends the child
        out.start()
        err.start()
        if stdin_data is not None and proc.stdin is not None:
            # A thread, so a child that never reads its stdin cannot block us on a full pipe.
            threading.Thread(target=_feed_stdin, args=(proc.stdin, stdin_data),
                             name=f"subtask-stdin-{pid}", daemon=True).start()
        if on_start is not None:
            on_start(pid)
    except BaseException:
        running.abort()
        raise
    return running


def _wait(proc: subprocess.Popen, out: _Reader, started: float,
          timeout: float | None, stdout_grace: float | None = None) -> tuple[int | None, bool]:
    """Wait for leader exit, then stdout EOF. Returns (leader exit code or None, timed_out)."""
    deadline = None if timeout is None else started + timeout

    def remaining() -> float | None:
        return None if deadline is None else max(deadline - time.monotonic(), 0.0)

    try:
        code = proc.wait(timeout=remaining())
    except subprocess.TimeoutExpired:
        return None, True
    left = remaining()
    if stdout_grace is not None:
        out.join(stdout_grace if left is None else min(left, stdout_grace))
        if out.is_alive() and (left is None or left > stdout_grace):
            return code, False  # a leftover holds stdout: the run is over all the same
    else:
        out.join(left)
    # The leader has exited: its exit code stands even if a group member holds stdout past
    # the deadline.
    return code, out.is_alive()


def _finish_readers(readers: tuple[_Reader, ...], grace: float) -> None:
    """Give readers `grace` seconds to reach EOF, then make them stop and wait for them."""
    deadline = time.monotonic() + grace
    for reader in readers:
        reader.join(max(deadline - time.monotonic(), 0.0))
    for reader in readers:
        reader.stop()
    for reader in readers:
        reader.join()


def _abort(proc: subprocess.Popen, grace: float, alive: Callable[[], bool],
           readers: tuple[_Reader, ...]) -> None:
    """The calling thread is leaving run() by an exception: leave no group behind."""
    try:
        kill_group(proc.pid, grace, alive)
    except BaseException:
        # Interrupted again while waiting out the grace: skip straight to SIGKILL.
        _signal_group(proc.pid, signal.SIGKILL)
        raise
    finally:
        for reader in readers:
            reader.stop()
    try:
        proc.wait(timeout=grace + 1.0)
    except subprocess.TimeoutExpired:
        # Said as our other warnings are, not through `logging` (~4 ms of every worker's start).
        print(f"git-subtask: process {proc.pid} did not exit after SIGKILL", file=sys.stderr)
