"""This process's ancestry, as /proc numbers it: what `start` asks to know whether it runs inside
a job's engine (`api.starting.delegation`), while other jobs run.

Standard library only, and little of it: a `start` beside running jobs asked `proc.procs`, which
loads `logging`, ctypes and the confinement (~10 ms) for a walk up /proc.
"""

from __future__ import annotations


def ancestors() -> list[int]:
    """This process's ancestors as /proc numbers them (the machine's pids, also from inside a pid
    namespace of a job's, whose own numbers stop at its pid 1)."""
    found: list[int] = []
    pid = "self"
    while len(found) < 64:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rpartition(b")")[2].split()
            parent = int(fields[1])
        except (OSError, ValueError, IndexError):
            break
        if parent <= 1:
            break
        found.append(parent)
        pid = str(parent)
    return found
