"""Kernel namespaces for a job's processes: no descendant outlives its attempt, it sees only the
view built for it (`view`), and no network when asked.

A sandboxed child is set up between fork and exec (`Plan.prepare`'s function, called by the
pre-exec hook `isolation` builds, or by its launcher for the claude SDK):
- **user namespace** (`CLONE_NEWUSER`), when we are not root: it lends the capabilities the others
  need, mapping our uid and gid to themselves (files keep their owners; `setgroups` is denied).
- **mount namespace** (`CLONE_NEWNS`): the job's view (`view.Build`): a tmpfs root holding only
  what the job needs, bound from the host, then `pivot_root` into it and the host's root detached.
  Propagation is private, so nothing of it reaches the host.
- **network namespace** (`CLONE_NEWNET`, only for `subtask.isolation.network none`): a loopback of
  its own, brought up, and no other interface.
- **pid namespace** (`CLONE_NEWPID`): the child forks once more; the grandchild is pid 1 of a
  namespace of its own, mounts a fresh `/proc` for it, gives up every capability, and execs
  `/bin/sh -c INIT` with PROGRAM as its child. When pid 1 exits the kernel kills every other
  process in the namespace, `setsid` and double forks included. The child itself stays outside,
  as pid 1's parent (what `unshare --fork --kill-child` was): it ignores TERM (pid 1 passes it on),
  answers the view's decoys (`view.Build.account`), and exits as pid 1 did; pid 1 dies with it
  (PR_SET_PDEATHSIG), and it dies with the worker (procs' parent-death signal).

Invariants:
- Never enter a namespace after Landlock is applied, because a Landlock-confined process may
  not mount: the pre-exec hook enters the namespaces, builds the view, re-enters the working
  directory by its path, forks pid 1, which mounts its `/proc`, gives up its capabilities, then
  restricts itself (`Plan.prepare`'s function runs first, `landlock_restrict_self` last, in pid 1).
- Between fork and exec only prepared calls run (ctypes functions and arguments built in the
  parent); a failure writes one line to stderr and exits 126, never an exec outside the sandbox.
- `available()` answers from files and sysctls, never by starting a process: `start` asks it.
- Never let pid 1's parent keep an fd it inherited, because Python's subprocess waits for its
  error pipe to close (at exec, which that process never does): a job that filled its stdout pipe
  before the spawner returned hung forever (`containment::test_a_job_printing_50_mb_*`).
- Never make the engine pid 1 of its namespace, because the kernel drops a signal to a pid 1
  that has no handler for it (and pid 1's parent ignores SIGTERM while it waits): `stop`,
  timeouts and stalls would reach nothing but SIGKILL. Pid 1 is a small shell that passes TERM on
  and gives the engine our stdin through fd 3 (`namespaces.INIT`).
"""

from __future__ import annotations

import os
import sys

from subtask.model.dataclass import dataclass
from subtask.proc import syscalls

TYPE_CHECKING = False  # not `typing`'s: `start` imports this module to ask `support()`
if TYPE_CHECKING:
    from subtask.proc import view as views

ENV = "SUBTASK_NAMESPACES"  # tests: "0" pretends this machine offers none

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
_SIOCSIFFLAGS, _IFF_UP = 0x8914, 0x1
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 1, 24, 47, 4
_SIGKILL, _SIG_DFL, _SIG_IGN = 9, 0, 1
_PASSED_ON = (1, 2, 15, 17)  # HUP, INT, TERM: pid 1 passes them on; CHLD: ours to leave at default
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
# Pid 1 of a job's namespace. Not the engine itself: the kernel drops every signal sent to a pid 1
# that has no handler for it, so `stop`, a timeout or a stall's SIGTERM would reach nothing and
# only SIGKILL would end it. This shell handles TERM,
# INT and HUP by passing them on; the engine, its child, gets the group's signals as any process
# does, and our stdin through fd 3 (sh gives an asynchronous command /dev/null as its stdin, before
# any `<&0` of its own). When the engine ends, so does pid 1, and the kernel ends everything else
# in the namespace.
INIT = ('trap \'kill -TERM "$c" 2>/dev/null\' TERM INT HUP; exec 3<&0; "$@" <&3 3<&- & c=$!; exec 3<&-; '
        'while :; do wait "$c"; s=$?; kill -0 "$c" 2>/dev/null || exit "$s"; done')


@dataclass(frozen=True)
class Support:
    """Whether this machine lets a job run in namespaces of its own, or why not (`support`)."""

    available: bool
    reason: str  # why not, when unavailable


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        numbers = os.uname().release.split("-")[0].split(".")
        return (int(numbers[0]), int(numbers[1])) >= (major, minor)
    except (ValueError, IndexError):
        return False


def _probe() -> Support:
    if sys.platform != "linux":
        return Support(False, f"namespaces are Linux-only (this is {sys.platform})")
    if os.environ.get(ENV, "").strip() == "0":
        return Support(False, f"turned off by {ENV}=0")
    if syscalls.number("pivot_root") is None:
        return Support(False, f"pivot_root's number is unknown for {os.uname().machine}")
    if not _kernel_at_least(5, 12):
        return Support(False, f"Linux {os.uname().release} lacks mount_setattr (5.12+)")
    if not os.access("/bin/sh", os.X_OK):
        return Support(False, "/bin/sh is missing (pid 1 of a job's namespace is a small sh)")
    if os.geteuid() != 0:
        if _read("/proc/sys/user/max_user_namespaces") == "0":
            return Support(False, "user namespaces are turned off (sysctl user.max_user_namespaces=0)")
        if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
            return Support(False, "unprivileged user namespaces are turned off "
                                  "(sysctl kernel.unprivileged_userns_clone=0)")
        if _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
            return Support(False, "AppArmor restricts unprivileged user namespaces "
                                  "(sysctl kernel.apparmor_restrict_unprivileged_userns=1)")
    return Support(True, "")


_support: Support | None = None


def support() -> Support:
    """What this machine offers (asked once per process; reads a few files, starts nothing)."""
    global _support
    if _support is None:
        _support = _probe()
    return _support


def root() -> bool:
    return os.geteuid() == 0


@dataclass
class Plan:
    """The namespaces of one sandboxed run, prepared in the parent."""

    pid: bool = False
    view: views.View | None = None  # the job's view; None: no mount namespace
    network: bool = True

    @property
    def active(self) -> bool:
        return self.pid or self.view is not None or not self.network

    def flags(self) -> int:
        flags = (CLONE_NEWPID if self.pid else 0) | (CLONE_NEWNS if self.view is not None else 0)
        flags |= 0 if self.network else CLONE_NEWNET
        if flags and not root():
            flags |= CLONE_NEWUSER
        return flags

    def wrap(self, argv: list[str]) -> list[str]:
        """The argv pid 1 execs once `prepare`'s function ran: a shell that runs argv as its child
        (`INIT`)."""
        if not self.pid:
            return argv
        return ["/bin/sh", "-c", INIT, "subtask-init", *argv]

    def to_json(self) -> dict:
        return {"pid": self.pid, "view": self.view.to_json() if self.view is not None else None,
                "network": self.network}

    @classmethod
    def from_json(cls, data: dict) -> Plan:
        from subtask.proc import view as views  # the worker's and a launcher's: `start` only chooses

        view = data.get("view")
        return cls(pid=bool(data.get("pid")), view=views.View.from_json(view) if isinstance(view, dict) else None,
                   network=bool(data.get("network", True)))

    def prepare(self):
        """The function that enters the namespaces, every argument made here, in the parent. With
        a pid namespace it returns only in pid 1; its parent waits for pid 1 and exits as it did."""
        import ctypes  # the worker's and a launcher's: `start` only chooses (~1.3 ms)

        from subtask.proc import view as views

        class CapHeader(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class CapData(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        write, open_, close, exit_, errno_ = os.write, os.open, os.close, os._exit, ctypes.get_errno
        unshare, fork, prctl, waitpid, kill, getpid = (libc.unshare, libc.fork, libc.prctl, libc.waitpid,
                                                       libc.kill, libc.getpid)
        flags = self.flags()
        maps = []
        if flags & CLONE_NEWUSER:
            uid, gid = os.getuid(), os.getgid()
            maps = [(b"/proc/self/setgroups", b"deny"), (b"/proc/self/uid_map", b"%d %d 1" % (uid, uid)),
                    (b"/proc/self/gid_map", b"%d %d 1" % (gid, gid))]
        build = views.Build(self.view) if self.view is not None else None
        lo = ctypes.create_string_buffer(b"lo", 40)
        ctypes.memmove(ctypes.addressof(lo) + 16, ctypes.byref(ctypes.c_short(_IFF_UP)), 2)
        socket_, ioctl = libc.socket, libc.ioctl
        lo_up, pid_ns = not self.network, self.pid
        pidfd_nr = ctypes.c_long(syscalls.number("pidfd_open") or -1)
        close_range_nr = ctypes.c_long(syscalls.number("close_range") or -1)
        status = ctypes.c_int(0)
        parent_gone = (ctypes.c_int * 2)()  # a pollfd: fd, events | revents << 16
        cap_header = CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        cap_data = (CapData * 2)()

        def fail(what: bytes) -> None:
            write(2, b"git-subtask: could not set up the job's sandbox (" + what + b": errno %d); "
                  b"it was not started\n" % errno_())
            exit_(126)

        def give_up_capabilities() -> None:
            for cap in range(64):
                prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last one: nothing to drop
            prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
            if libc.capset(ctypes.byref(cap_header), cap_data) != 0:
                fail(b"capabilities")

        def keep_only(fds: list[int]) -> None:
            """Close every fd from 3 up but `fds`: a spawner waits for the end of its error
            pipe (Python's subprocess until exec), and readers for the ends of pipes; this
            process never execs, so it must let go of them."""
            low = 3
            for fd in sorted(fd for fd in fds if fd >= 3):
                if fd > low:
                    libc.syscall(close_range_nr, ctypes.c_uint(low), ctypes.c_uint(fd - 1), ctypes.c_uint(0))
                low = fd + 1
            libc.syscall(close_range_nr, ctypes.c_uint(low), ctypes.c_uint(0xFFFFFFFF), ctypes.c_uint(0))

        def be_parent_of(child: int) -> None:
            for sig in _PASSED_ON:
                libc.signal(sig, _SIG_IGN if sig != 17 else _SIG_DFL)
            keep_only(build.fds() if build is not None else [])
            if build is not None:
                build.account(child)
            while waitpid(child, ctypes.byref(status), 0) < 0:
                pass
            code = status.value
            if code & 0x7F == 0:
                exit_((code >> 8) & 0xFF)
            libc.signal(code & 0x7F, _SIG_DFL)
            kill(getpid(), code & 0x7F)  # end as pid 1 ended, as a shell would see it
            exit_(128 + (code & 0x7F))

        def enter() -> None:
            if flags and unshare(flags) != 0:
                fail(b"unshare")
            for path, data in maps:
                try:
                    fd = open_(path, os.O_WRONLY)
                    write(fd, data)
                    close(fd)
                except OSError:
                    fail(path)
            if build is not None:
                build.build()
            if lo_up:
                sock = socket_(2, 2, 0)  # AF_INET, SOCK_DGRAM
                if sock < 0 or ioctl(sock, _SIOCSIFFLAGS, lo) != 0:
                    fail(b"loopback up")
                close(sock)
            if not pid_ns:
                return
            parent_gone[0] = libc.syscall(pidfd_nr, ctypes.c_long(getpid()), ctypes.c_long(0))
            parent_gone[1] = 1  # POLLIN: the pidfd reads once the process has exited
            child = fork()
            if child < 0:
                fail(b"fork")
            if child > 0:
                be_parent_of(child)  # never returns
            prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
            if parent_gone[0] >= 0:  # it died before the signal was armed: nothing is ours to run
                if libc.poll(parent_gone, 1, 0) != 0:
                    exit_(128 + _SIGKILL)
                close(parent_gone[0])
            if build is not None:
                build.in_pid1()
                give_up_capabilities()

        return enter


