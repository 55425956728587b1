"""A job's processes run with its starter's context: nice value, limits, umask, namespaces.

An unqueued job's worker is forked by its starter and inherits all of it. A queued job is run by
whoever frees a slot (another job's worker, in-process), which has its own: `jobenv` keeps the
starter's `Context` beside its environment, and every child `procs` starts for the job (setup,
engine, verify, teardown), and the claude launcher, applies it between fork and exec
(`Prepared.child_call`). The worker's own process is left as it is: it serves the next job too,
and a nice value or a hard limit cannot be taken back once given up.

Invariants:
- Never run a queued job with the nice value, limits, umask or namespaces of whoever hands it its
  slot, because that is another job's context: they are kept beside its environment and applied
  to each of its children; what cannot be applied (a hard limit or a nice value only privilege
  could restore, a namespace no process holds any more, another mount or pid namespace) is
  refused before anything of the attempt runs (`ContextError`), never skipped.
- Never take a namespace from a process found by its number alone, because the kernel gives a
  torn-down namespace's number to the next one made (another job's sandbox): only the starter's
  lineage, each process known by pid and start time, lends it; none left, the job fails.
- Between fork and exec only prepared calls run: namespace fds are opened, and every value is
  computed, in the parent (`prepare`); a failure in the child exits 126 with one line on stderr.
- Namespaces are entered user first (the others then need the capabilities it gives), before
  the job's own sandbox makes its namespaces inside them.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from collections.abc import Callable

from subtask.model.dataclass import dataclass, field
from subtask.state.jobenv import Context, own_namespaces, process_identity

# setns(2) flags; the user namespace first (entering it lends the rights the others need).
_ENTERABLE = {"user": 0x10000000, "net": 0x40000000, "uts": 0x04000000, "ipc": 0x08000000,
              "cgroup": 0x02000000}
# A process cannot sensibly be moved into these between fork and exec: the paths the worker
# prepared (mount), its pid and its children's (pid), its clocks (time).
_NOT_ENTERABLE = {"mnt": "mount", "pid": "pid", "time": "time"}


class ContextError(Exception):
    """The starter's context cannot be applied here: the attempt must not run with another."""


@dataclass
class Prepared:
    """What differs from this process, made ready to apply in a child."""

    rlimits: list[tuple[int, int, int]] = field(default_factory=list)  # (resource, soft, hard)
    nice: int | None = None
    umask: int | None = None
    namespace_fds: list[tuple[int, int]] = field(default_factory=list)  # (fd, CLONE_NEW*)
    context: Context | None = None

    @property
    def empty(self) -> bool:
        return not (self.rlimits or self.nice is not None or self.umask is not None or self.namespace_fds)

    def child_call(self) -> Callable[[], None] | None:
        """The function a child runs between fork and exec, or None when nothing differs."""
        if self.empty:
            return None
        setrlimit, setpriority, umask, write, exit_ = (resource.setrlimit, os.setpriority, os.umask,
                                                       os.write, os._exit)
        libc = ctypes.CDLL(None, use_errno=True)
        setns, errno_ = libc.setns, ctypes.get_errno
        limits, nice, mask, spaces = self.rlimits, self.nice, self.umask, self.namespace_fds
        prio = os.PRIO_PROCESS

        def fail(what: bytes) -> None:
            write(2, b"git-subtask: could not give the job its starter's " + what + b"; it was not started\n")
            exit_(126)

        def apply() -> None:
            for fd, kind in spaces:
                if setns(fd, kind) != 0:
                    fail(b"namespaces (errno %d)" % errno_())
            for which, soft, hard in limits:
                try:
                    setrlimit(which, (soft, hard))
                except (OSError, ValueError):
                    fail(b"limits")
            if nice is not None:
                try:
                    setpriority(prio, 0, nice)
                except OSError:
                    fail(b"nice value")
            if mask is not None:
                umask(mask)

        return apply

    def close(self) -> None:
        for fd, _ in self.namespace_fds:
            os.close(fd)
        self.namespace_fds = []


def _privileged() -> bool:
    return os.geteuid() == 0


def prepare(context: Context | None) -> Prepared:
    """What of `context` differs from this process, ready for its children; raises
    `ContextError` when a child of ours could not be given it."""
    if context is None:
        return Prepared()
    prepared = Prepared(context=context, umask=context.umask)
    try:
        _prepare_limits(context, prepared)
        _prepare_nice(context, prepared)
        _prepare_namespaces(context, prepared)
    except BaseException:
        prepared.close()
        raise
    return prepared


def _prepare_limits(context: Context, prepared: Prepared) -> None:
    for name, (soft, hard) in context.rlimits.items():
        which = getattr(resource, name, None)
        if which is None:
            continue
        ours = resource.getrlimit(which)
        if ours == (soft, hard):
            continue
        if _rank(hard) > _rank(ours[1]) and not _privileged():
            raise ContextError(f"its starter's hard limit {name}={_limit(hard)} is above this worker's "
                               f"({_limit(ours[1])}), and only privilege raises one")
        prepared.rlimits.append((which, soft, hard))


def _rank(value: int) -> float:
    return float("inf") if value == resource.RLIM_INFINITY else value


def _limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


def _prepare_nice(context: Context, prepared: Prepared) -> None:
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    if context.nice == ours:
        return
    if context.nice < ours and not _privileged():
        ceiling = 20 - resource.getrlimit(resource.RLIMIT_NICE)[0]  # RLIMIT_NICE lets some go lower
        if context.nice < ceiling:
            raise ContextError(f"its starter ran at nice {context.nice}, this worker at {ours}, and only "
                               "privilege lowers a nice value")
    prepared.nice = context.nice


def _prepare_namespaces(context: Context, prepared: Prepared) -> None:
    ours = own_namespaces()
    for kind, inode in context.namespaces.items():
        if kind not in ours or ours[kind] == inode:
            continue
        if kind in _NOT_ENTERABLE:
            raise ContextError(f"its starter ran in another {_NOT_ENTERABLE[kind]} namespace than this "
                               "worker; start it from there when a slot is free")
    for kind, flag in _ENTERABLE.items():  # user first: it lends the rights the others need
        theirs = context.namespaces.get(kind)
        if theirs is None or kind not in ours or ours[kind] == theirs:
            continue
        fd = _open_namespace(kind, theirs, context.lineage)
        if fd is None:
            raise ContextError(f"its starter's {kind} namespace is gone (neither its starter nor an "
                               "ancestor of it is left in it)")
        prepared.namespace_fds.append((fd, flag))


def _open_namespace(kind: str, inode: int, lineage: list[tuple[int, int]]) -> int | None:
    """An fd of the namespace `kind` numbered `inode`, opened through a live process of the
    starter's lineage still in it; None when none is. Only asked when it differs from ours, which
    a job whose worker its starter forked never does."""
    for pid, started in lineage:
        if not _same_process(pid, started):
            continue
        try:
            fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # gone meanwhile, or not ours to see
        # Still that process once the fd is open (a pid is reused; with its start time, never):
        # the fd is of the namespace it was in, which a number only matches if it is the starter's.
        if _same_process(pid, started) and os.fstat(fd).st_ino == inode:
            return fd
        os.close(fd)
    return None


def _same_process(pid: int, started: int) -> bool:
    identity = process_identity(pid)
    return identity is not None and identity[1] == started


# The prepared context of the attempt this worker runs now: every child `procs` starts gets it.
_active: Prepared | None = None


def use(prepared: Prepared | None) -> None:
    """Make `prepared` the context of every child started from now on (None: their parent's)."""
    global _active
    if _active is not None and _active is not prepared:
        _active.close()
    _active = prepared


def active() -> Prepared | None:
    return _active


def child_call() -> Callable[[], None] | None:
    """The pre-exec call for a child started now, or None."""
    return _active.child_call() if _active is not None else None


def spec() -> dict | None:
    """The active context as the claude launcher rebuilds it in its own process (which the SDK
    starts with none of our fds, so namespaces are opened again there)."""
    if _active is None or _active.context is None or _active.empty:
        return None
    return _active.context.to_json()


def apply_spec(data: dict) -> None:
    """In the launcher: apply a `spec()` to this very process, before it enters any sandbox;
    exits 126 when it cannot."""
    context = Context.from_json(data)
    try:
        prepared = prepare(context)
    except ContextError as exc:
        sys.stderr.write(f"git-subtask: could not give the job its starter's context ({exc}); it was not started\n")
        os._exit(126)
    call = prepared.child_call()
    if call is not None:
        call()
    prepared.close()
