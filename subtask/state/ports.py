"""Ports per running attempt: `ports.json` + `ports.lock` in the state folder.

Each running attempt gets `subtask.portsPerJob` consecutive ports (default 10) from
`subtask.portBase` upwards (default 20000), exported to its engine, setup, verify and teardown as
`SUBTASK_PORT` (the first of them) and `SUBTASK_PORTS` (how many), so ten jobs whose tests start a
server each start it on a port of their own.

Invariants:
- Never hand out a range that overlaps one held here, because two running jobs would then start
  their servers on the same port: ranges are chosen and recorded under `ports.lock`, in one step.
- Never hand out a port something on this machine has bound, because a range free here may be in
  use by a program we know nothing of: every port of a range is bound once (TCP, IPv4 and IPv6
  wildcards) before it is recorded; a range with a busy port is passed over.
- Release exactly what was allocated, keyed by (job, attempt), so a stale release by an old
  attempt never frees a newer one's range; releasing twice is a no-op. The worker releases its
  range when its attempt ends; whoever ends a dead worker releases it for it
  (`lifecycle.end_dead`).
- A damaged file reads as holding nothing (with a warning): the binding check still keeps a range
  away from any port a job has actually bound.
- Never hand two running attempts overlapping ports, nor a port something has bound, because their
  servers would collide: ranges are chosen and recorded in one step under `ports.lock`, every port
  bound once first; a range is released by (job, attempt), once, by the worker or by whoever settles
  its dead worker (`ports::test_a_dead_workers_ports_are_released_by_whoever_settles_it`).

Standard library only; nothing slow runs under the lock (a bind is a system call).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable

from subtask.model.errors import SubtaskError
from subtask.state import paths
from subtask.state.statefiles import StateLock, file_lock, read_bytes, write_json

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any

    from subtask.state.statefiles import StrPath

PORTS_FILE = paths.PORTS_FILE
LAST_PORT = 65535


def lock(state_dir: StrPath) -> StateLock:
    return file_lock(os.path.join(state_dir, paths.PORTS_LOCK))


def held(state_dir: StrPath) -> list[dict[str, Any]]:
    """The ranges held now: {job, attempt, first, count, since} (no lock; a damaged file reads as none)."""
    path = os.path.join(state_dir, PORTS_FILE)
    try:
        data = json.loads(read_bytes(path))
        entries = data.get("held") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            raise ValueError("no list of held ranges")
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        warnings.warn(f"{path} is damaged ({exc}); reading it as holding no ports", stacklevel=2)
        return []
    return [e for e in entries if _valid(e)]


def _valid(entry: object) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("job"), str) and isinstance(entry.get("attempt"), int)
            and all(isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool) for k in ("first", "count")))


def _save(state_dir: StrPath, entries: list[dict[str, Any]]) -> None:
    write_json(os.path.join(state_dir, PORTS_FILE), {"v": 1, "held": entries}, durable=False)


def port_free(port: int) -> bool:
    """Can a server bind `port` now (TCP, every address, IPv4 and, where the machine has it, IPv6)?"""
    # Only a worker binds: reading commands that load `lifecycle` never need it. `_socket`, the C
    # module `socket` wraps: its import is 0.3 ms, `socket`'s 2.6 (it makes enums of every
    # constant), on the way to every job's engine.
    import _socket

    families = [(_socket.AF_INET, "0.0.0.0")] + ([(_socket.AF_INET6, "::")] if _socket.has_ipv6 else [])
    for family, address in families:
        try:
            sock = _socket.socket(family, _socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here: nothing can bind it either
        try:
            if family == _socket.AF_INET6:
                sock.setsockopt(_socket.IPPROTO_IPV6, _socket.IPV6_V6ONLY, 1)
            sock.bind((address, port))
        except OSError:
            return False
        finally:
            sock.close()
    return True


def allocate(state_dir: StrPath, job: str, attempt: int, base: int, count: int,
             is_free: Callable[[int], bool] = port_free) -> int:
    """The first port of `count` consecutive ones from `base` up, none held here nor bound on this
    machine, recorded for (job, attempt). The same attempt asking again gets its range back."""
    if base < 1 or count < 1 or base + count - 1 > LAST_PORT:
        raise SubtaskError("fatal", f"no ports to give: subtask.portBase {base} with subtask.portsPerJob {count} "
                           f"goes past {LAST_PORT}", hint="git config subtask.portBase 20000")
    with lock(state_dir):
        entries = held(state_dir)
        mine = next((e for e in entries if e["job"] == job and e["attempt"] == attempt), None)
        if mine is not None:
            return int(mine["first"])  # (`_valid`: an int)
        first = base
        while first + count - 1 <= LAST_PORT:
            clash = next((e for e in entries if first < e["first"] + e["count"] and e["first"] < first + count), None)
            if clash is not None:
                first = clash["first"] + clash["count"]
                continue
            busy = next((p for p in range(first, first + count) if not is_free(p)), None)
            if busy is None:
                entries.append({"job": job, "attempt": attempt, "first": first, "count": count, "since": time.time()})
                _save(state_dir, entries)
                return first
            first = busy + 1
    raise SubtaskError("fatal", f"no {count} consecutive free ports between {base} and {LAST_PORT}",
                       hint="lower subtask.portsPerJob, or move subtask.portBase")


def release(state_dir: StrPath, job: str, attempt: int) -> bool:
    """Give back the range of (job, attempt); False when it held none (released already)."""
    if not os.path.exists(os.path.join(state_dir, PORTS_FILE)):
        return False
    with lock(state_dir):
        entries = held(state_dir)
        kept = [e for e in entries if not (e["job"] == job and e["attempt"] == attempt)]
        if len(kept) == len(entries):
            return False
        _save(state_dir, kept)
        return True
