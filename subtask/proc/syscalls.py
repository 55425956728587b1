"""The numbers of the Linux system calls confinement makes that Python's `os` does not wrap, per
machine (`number`).

A table and nothing else, so that `start`, which only asks whether confinement can work here,
loads neither `ctypes` nor the view's builder (~2 ms): `namespaces` and `isolation` make the calls
in the worker, through `ctypes`, with these numbers.
"""

from __future__ import annotations

import os

# One number on every architecture: syscalls added after the tables were unified (Linux 5.1+).
_NEW = {"pidfd_open": 434, "close_range": 436, "mount_setattr": 442,
        "landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446}
_BY_MACHINE = {"x86_64": {"pivot_root": 155, **_NEW}, "aarch64": {"pivot_root": 41, **_NEW},
               "arm64": {"pivot_root": 41, **_NEW}}


def number(name: str) -> int | None:
    """The syscall `name`'s number on this machine, or None where we do not know it."""
    return _BY_MACHINE.get(os.uname().machine, {}).get(name)
