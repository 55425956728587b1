"""Kernel namespaces for a job's processes: no descendant outlives its attempt, nothing outside its
grants changes (not even a mode, owner, time or xattr), and no network when asked.

A sandboxed child is set up between fork and exec (`Plan.enter`, called by the pre-exec hook
`isolation` builds, or by its launcher for the claude SDK), then execs
`unshare --fork --kill-child -- PROGRAM...` (util-linux), whose child is PROGRAM:
- **pid namespace** (`CLONE_NEWPID`): PROGRAM is pid 1 of a namespace of its own. When it exits,
  the kernel kills every other process in the namespace, `setsid` and double forks included;
  when its parent (`unshare`, which dies with the worker by PR_SET_PDEATHSIG) dies, `--kill-child`
  kills it. So a job's processes end with its engine, with `stop`, and with a killed worker.
- **mount namespace** (`CLONE_NEWNS`): every mount is made read-only (`mount_setattr`, recursive)
  except fresh bind mounts of the granted paths. A read-only mount refuses chmod, chown, utime,
  setxattr and every write (EROFS), where Landlock governs only writes of file contents and names.
  Device nodes stay writable on a read-only mount (`/dev/null`, ttys); propagation is private, so
  nothing of it reaches the host.
- **network namespace** (`CLONE_NEWNET`, only for `subtask.isolation.network none`): a loopback of
  its own, brought up, and no other interface.
- **user namespace** (`CLONE_NEWUSER`), when we are not root: it lends the capabilities the others
  need, mapping our uid and gid to themselves (files keep their owners; `setgroups` is denied).

Invariants:
- Never set a namespace up after Landlock is applied: a Landlock-confined process may not mount.
  `Plan.enter` runs first, `landlock_restrict_self` last.
- Between fork and exec only prepared calls run (ctypes functions and arguments built in the
  parent); a failure writes one line to stderr and exits 126, never an exec outside the sandbox.
- `available()` answers from files and sysctls, never by starting a process: `start` asks it.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

ENV = "SUBTASK_NAMESPACES"  # tests: "0" pretends this machine offers none

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 1 << 18
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_MOUNT_ATTR_RDONLY = 1
_MOUNT_SETATTR = {"x86_64": 442, "aarch64": 442, "arm64": 442}
_SIOCSIFFLAGS, _IFF_UP = 0x8914, 0x1
UNSHARE_CANDIDATES = ("/usr/bin/unshare", "/bin/unshare")
# Pid 1 of a job's namespace. Not the engine itself: the kernel drops every signal sent to a pid 1
# that has no handler for it (and unshare blocks SIGTERM while it waits), so `stop`, a timeout or
# a stall's SIGTERM would reach nothing and only SIGKILL would end it. This shell handles TERM,
# INT and HUP by passing them on; the engine, its child, gets the group's signals as any process
# does, and our stdin through fd 3 (sh gives an asynchronous command /dev/null as its stdin, before
# any `<&0` of its own). When the engine ends, so does pid 1, and the kernel ends everything else
# in the namespace.
INIT = ('trap \'kill -TERM "$c" 2>/dev/null\' TERM INT HUP; exec 3<&0; "$@" <&3 3<&- & c=$!; exec 3<&-; '
        'while :; do wait "$c"; s=$?; kill -0 "$c" 2>/dev/null || exit "$s"; done')


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


@dataclass(frozen=True)
class Support:
    available: bool
    reason: str  # why not, when unavailable
    unshare: str = ""  # util-linux unshare, which forks the namespace's pid 1 and waits for it


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        numbers = platform.release().split("-")[0].split(".")
        return (int(numbers[0]), int(numbers[1])) >= (major, minor)
    except (ValueError, IndexError):
        return False


def _probe() -> Support:
    if sys.platform != "linux":
        return Support(False, f"namespaces are Linux-only (this is {sys.platform})")
    if os.environ.get(ENV, "").strip() == "0":
        return Support(False, f"turned off by {ENV}=0")
    if platform.machine() not in _MOUNT_SETATTR:
        return Support(False, f"mount_setattr's number is unknown for {platform.machine()}")
    if not _kernel_at_least(5, 12):
        return Support(False, f"Linux {platform.release()} lacks mount_setattr (5.12+)")
    unshare = next((p for p in UNSHARE_CANDIDATES if os.access(p, os.X_OK)), None) or shutil.which("unshare")
    if not unshare:
        return Support(False, "util-linux's unshare is not installed")
    if os.geteuid() != 0:
        if _read("/proc/sys/user/max_user_namespaces") == "0":
            return Support(False, "user namespaces are turned off (sysctl user.max_user_namespaces=0)")
        if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
            return Support(False, "unprivileged user namespaces are turned off (sysctl kernel.unprivileged_userns_clone=0)")
        if _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
            return Support(False, "AppArmor restricts unprivileged user namespaces "
                                  "(sysctl kernel.apparmor_restrict_unprivileged_userns=1)")
    return Support(True, "", unshare)


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
    mounts: list[str] | None = None  # writable paths; None: no mount namespace
    network: bool = True

    @property
    def active(self) -> bool:
        return self.pid or self.mounts is not None or not self.network

    def flags(self) -> int:
        flags = (CLONE_NEWPID if self.pid else 0) | (CLONE_NEWNS if self.mounts is not None else 0)
        flags |= 0 if self.network else CLONE_NEWNET
        if flags and not root():
            flags |= CLONE_NEWUSER
        return flags

    def wrap(self, argv: list[str]) -> list[str]:
        """The argv to exec once `enter` ran: unshare forks pid 1 of the new namespace, a shell
        that runs argv as its child (`INIT`)."""
        if not self.pid:
            return argv
        return [support().unshare, "--fork", "--kill-child", "--", "/bin/sh", "-c", INIT, "subtask-init", *argv]

    def to_json(self) -> dict:
        return {"pid": self.pid, "mounts": self.mounts, "network": self.network}

    @classmethod
    def from_json(cls, data: dict) -> Plan:
        return cls(pid=bool(data.get("pid")), mounts=data.get("mounts"), network=bool(data.get("network", True)))

    def prepare(self):
        """The function that enters the namespaces, every argument made here, in the parent."""
        libc = ctypes.CDLL(None, use_errno=True)
        write, open_, close, exit_, errno_ = os.write, os.open, os.close, os._exit, ctypes.get_errno
        unshare, mount, syscall = libc.unshare, libc.mount, libc.syscall
        flags = self.flags()
        maps = []
        if flags & CLONE_NEWUSER:
            uid, gid = os.getuid(), os.getgid()
            maps = [(b"/proc/self/setgroups", b"deny"), (b"/proc/self/uid_map", b"%d %d 1" % (uid, uid)),
                    (b"/proc/self/gid_map", b"%d %d 1" % (gid, gid))]
        binds = [os.fsencode(p) for p in (self.mounts or [])]
        setattr_nr = ctypes.c_long(_MOUNT_SETATTR.get(platform.machine(), -1))
        read_only, writable = _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0), _MountAttr(0, _MOUNT_ATTR_RDONLY, 0, 0)
        attr_size = ctypes.c_size_t(ctypes.sizeof(_MountAttr))
        lo = ctypes.create_string_buffer(b"lo", 40)
        ctypes.memmove(ctypes.addressof(lo) + 16, ctypes.byref(ctypes.c_short(_IFF_UP)), 2)
        socket_, ioctl, getcwd, chdir = libc.socket, libc.ioctl, libc.getcwd, libc.chdir
        getcwd.restype = ctypes.c_void_p
        cwd = ctypes.create_string_buffer(4096)
        mounting, lo_up = self.mounts is not None, not self.network

        def fail(what: bytes) -> None:
            write(2, b"git-subtask: could not set up the job's sandbox (" + what + b": errno %d); "
                  b"it was not started\n" % errno_())
            exit_(126)

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
            if mounting:
                if mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
                    fail(b"private mounts")
                for path in binds:
                    if mount(path, path, None, _MS_BIND | _MS_REC, None) != 0:
                        fail(b"bind " + path)
                if syscall(setattr_nr, _AT_FDCWD, b"/", _AT_RECURSIVE, ctypes.byref(read_only), attr_size) != 0:
                    fail(b"read-only mounts")
                for path in binds:
                    if syscall(setattr_nr, _AT_FDCWD, path, 0, ctypes.byref(writable), attr_size) != 0:
                        fail(b"writable " + path)
                # The working directory was entered before the binds: enter it again by its path,
                # or it stays on the mount below them, which is read-only now.
                if not getcwd(cwd, len(cwd)) or chdir(cwd) != 0:
                    fail(b"working directory")
            if lo_up:
                sock = socket_(2, 2, 0)  # AF_INET, SOCK_DGRAM
                if sock < 0 or ioctl(sock, _SIOCSIFFLAGS, lo) != 0:
                    fail(b"loopback up")
                close(sock)

        return enter


def existing(paths: list[str]) -> list[str]:
    """The paths that exist (a bind needs its target), folders and files alike, in order, once."""
    seen: dict[str, None] = {}
    for path in paths:
        if Path(path).exists():
            seen.setdefault(os.path.normpath(path))
    return list(seen)
