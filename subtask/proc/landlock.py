"""Landlock, the kernel's part of a job's confinement: what this kernel offers (`support`, and
`support_seen` for `start`), a ruleset of write rights built in the parent (`ruleset`), and the
call a forked child makes to restrict itself (`restrict_self_call`). `proc/isolation.py` decides
what a run may write; this module only speaks to the kernel.

`ctypes` (~1.3 ms) is imported by the functions that make a kernel call, never at this
module's import: `start` imports the module only to choose a job's isolation (`support_seen`).

Invariants:
- Never build a ruleset from a record of the kernel's answer, because anyone who can write the
  state folder could then claim an older Landlock and weaken a job's confinement: `ruleset` asks
  the kernel (`support`); `support_seen` only lets `start` choose, and keeps only "Landlock is
  here" for the boot that said it, so a wrong record can fail a job's start, never loosen it.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from collections.abc import Sequence

from subtask.model.dataclass import dataclass
from subtask.proc import syscalls
from subtask.state import paths, statefiles

TYPE_CHECKING = False  # not `typing`'s: `start` imports this module
if TYPE_CHECKING:
    import ctypes

    from subtask.state.statefiles import StrPath

MIN_ABI = 3  # ABI 2 adds REFER (git renames objects across folders), ABI 3 TRUNCATE (truncate(2))
ABI_ENV = "SUBTASK_LANDLOCK_ABI"  # tests: pretend the kernel offers at most this ABI (0 = none)
_LANDLOCK_CALLS = ("landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self")
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3

# What we handle: every write-type right, so whatever no rule grants is denied. Reads are not handled.
HANDLED = (WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK
           | MAKE_FIFO | MAKE_BLOCK | MAKE_SYM | REFER | TRUNCATE)
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE  # the only rights a rule on a file may carry
ALL = HANDLED & ~(MAKE_CHAR | MAKE_BLOCK)
OBJECTS = MAKE_REG | MAKE_DIR | WRITE_FILE | REMOVE_FILE | REFER  # add objects (temp file, link, unlink)
REF_FILES = MAKE_REG | WRITE_FILE | REMOVE_FILE | TRUNCATE  # <ref>.lock, then rename onto <ref>
DEVICE = WRITE_FILE | TRUNCATE

# ABI 6: no connection to an abstract unix socket (a name, no file: no view can hide one) made
# outside the sandbox, and no signal to a process outside it (the worker, your editor).
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1
SCOPED_ABI = 6


_STRUCTS: tuple | None = None
_LIBC: ctypes.CDLL | None = None


def _structs() -> tuple:
    """Landlock's ruleset attribute and path-beneath rule, as ctypes structures (made once)."""
    global _STRUCTS
    if _STRUCTS is None:
        import ctypes

        class RulesetAttr(ctypes.Structure):
            # Below ABI 6 only the first field is passed (the kernel accepts a shorter, older struct).
            _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                        ("scoped", ctypes.c_uint64)]

        class PathBeneath(ctypes.Structure):
            _pack_ = 1
            _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

        _STRUCTS = (RulesetAttr, PathBeneath)
    return _STRUCTS


def linux_libc() -> ctypes.CDLL:
    """The C library, on Linux: the only system these calls are made on (`support` and
    `namespaces.support` say no elsewhere, before any of them)."""
    global _LIBC
    if sys.platform != "linux":
        raise IsolationError(f"confinement needs Linux, not {sys.platform}")
    if _LIBC is None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.prctl.restype = ctypes.c_int
        _LIBC = libc
    return _LIBC


class IsolationError(Exception):
    """The policy could not be built: the engine must not run."""


@dataclass(frozen=True)
class Support:
    """Whether Landlock can confine here: its ABI, or why not (`support`)."""

    abi: int  # 0 = no Landlock here
    reason: str  # why not, when abi < MIN_ABI

    @property
    def available(self) -> bool:
        return self.abi >= MIN_ABI

    def describe(self) -> str:
        if self.available:
            return f"Landlock ABI {self.abi}"
        return self.reason


def _kernel_abi() -> tuple[int, str]:
    if sys.platform != "linux":
        return 0, f"Landlock is Linux-only (this is {sys.platform})"
    number = syscalls.number(_LANDLOCK_CALLS[0])
    if number is None:
        return 0, f"Landlock syscall numbers unknown for {os.uname().machine}"
    import ctypes

    abi = linux_libc().syscall(ctypes.c_long(number), None, ctypes.c_long(0), ctypes.c_long(_CREATE_RULESET_VERSION))
    if abi < 0:
        err = ctypes.get_errno()
        why = {errno.ENOSYS: "the kernel has no Landlock (Linux 5.13+ built with CONFIG_SECURITY_LANDLOCK)",
               errno.EOPNOTSUPP: "Landlock is disabled at boot (add landlock to the lsm= kernel parameter)"}
        return 0, why.get(err, f"landlock_create_ruleset failed: {os.strerror(err)}")
    return int(abi), ""


_support_cache: Support | None = None


def support() -> Support:
    """What this machine can enforce: the kernel's answer (asked once per process; one syscall)."""
    global _support_cache
    if _support_cache is None:
        _support_cache = _capped(*_kernel_abi())
    return _support_cache


def _capped(abi: int, reason: str) -> Support:
    cap = os.environ.get(ABI_ENV)
    if cap is not None and cap.strip().isdigit() and int(cap) < abi:
        abi, reason = int(cap), f"Landlock ABI capped at {cap} by {ABI_ENV}"
    if 0 < abi < MIN_ABI:
        reason = f"Landlock ABI {abi} is too old: git-subtask needs ABI {MIN_ABI} (Linux 6.2+)"
    return Support(abi, reason)


def support_seen(state_dir: StrPath) -> Support:
    """`support()` as this boot's first probe recorded it in `state_dir`, for `start`'s choice of
    a job's isolation without `ctypes` (~1.3 ms of a start); else probed, and recorded when
    Landlock is there. Only that answer is kept, and only for the boot and kernel that gave it,
    so a wrong record can make no job run with less than it was promised: the worker builds its
    ruleset from `support()`, the kernel's own answer, and fails the attempt where it cannot."""
    global _support_cache
    if _support_cache is not None:
        return _support_cache
    boot = _this_boot()
    record = os.path.join(state_dir, paths.LANDLOCK_SEEN)
    seen = _seen_abi(record, boot) if boot else None
    if seen is not None:
        return _capped(seen, "")
    abi, reason = _kernel_abi()
    _support_cache = _capped(abi, reason)
    if boot and abi >= MIN_ABI and os.path.isdir(state_dir):
        try:  # not `contextlib` (~0.4 ms of a start)
            statefiles.write_json(record, {"v": 1, "boot": boot, "abi": abi}, durable=False)
        except OSError:
            pass  # a cache: the next start probes again
    return _support_cache


def _this_boot() -> str | None:
    """This boot and kernel, as one word: Landlock's ABI cannot change within it."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return f"{fh.read().strip()} {os.uname().release}"
    except OSError:
        return None


def _seen_abi(record: str, boot: str) -> int | None:
    """The ABI recorded for this boot, or None (none recorded, another boot's, damaged)."""
    try:
        with open(record, encoding="utf-8") as fh:
            seen = json.load(fh)
    except (OSError, ValueError):
        return None
    abi = seen.get("abi") if isinstance(seen, dict) and seen.get("boot") == boot else None
    return abi if type(abi) is int and abi >= MIN_ABI else None


# -- a ruleset, built in the parent and applied in the child --------------------------------------


def _syscall(index: int, *args) -> int:
    import ctypes

    number = syscalls.number(_LANDLOCK_CALLS[index])
    if number is None:  # `support()` said no here first: never reached
        raise OSError(errno.ENOSYS, f"{_LANDLOCK_CALLS[index]}: unknown on {os.uname().machine}")
    result = linux_libc().syscall(ctypes.c_long(number), *args)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(result)


def _handled(abi: int) -> int:
    handled = HANDLED
    if abi < 2:
        handled &= ~REFER
    if abi < 3:
        handled &= ~TRUNCATE
    return handled


def ruleset(mode: str, grants: Sequence) -> int:
    """A Landlock ruleset fd (close-on-exec) holding `grants` (each a `path` and its `rights`), for
    a run of isolation `mode`, from the kernel's own answer (`support`), never a record of it."""
    import ctypes

    state = support()
    if not state.available:
        raise IsolationError(f"isolation {mode} cannot be enforced: {state.reason}")
    handled = _handled(state.abi)
    scoped = state.abi >= SCOPED_ABI
    ruleset_attr, _ = _structs()
    attr = ruleset_attr(handled, 0, SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET if scoped else 0)
    size = ctypes.sizeof(attr) if scoped else ctypes.sizeof(ctypes.c_uint64)
    try:
        fd = _syscall(0, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    except OSError as exc:
        raise IsolationError(f"landlock_create_ruleset: {exc.strerror}") from exc
    try:
        for grant in grants:
            _add_rule(fd, grant, handled)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _add_rule(ruleset: int, grant, handled: int) -> None:
    import ctypes

    try:
        path_fd = os.open(grant.path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise IsolationError(f"cannot grant {grant.path}: {exc.strerror}") from exc
    try:
        rights = grant.rights & handled
        if not stat.S_ISDIR(os.fstat(path_fd).st_mode):
            rights &= FILE_RIGHTS
        _, path_beneath = _structs()
        beneath = path_beneath(rights, path_fd)
        _syscall(1, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(beneath), ctypes.c_uint32(0))
    except OSError as exc:
        raise IsolationError(f"landlock_add_rule {grant.path}: {exc.strerror}") from exc
    finally:
        os.close(path_fd)


def restrict_self_call(fd: int):
    """`landlock_restrict_self(fd)` after PR_SET_NO_NEW_PRIVS, made ready to call in a forked child."""
    import ctypes

    prctl, syscall = linux_libc().prctl, linux_libc().syscall
    no_new_privs = (ctypes.c_int(_PR_SET_NO_NEW_PRIVS), ctypes.c_ulong(1), ctypes.c_ulong(0),
                    ctypes.c_ulong(0), ctypes.c_ulong(0))
    restrict = (ctypes.c_long(syscalls.number(_LANDLOCK_CALLS[2]) or -1), ctypes.c_long(fd), ctypes.c_long(0))
    return lambda: prctl(*no_new_privs) == 0 and syscall(*restrict) == 0
