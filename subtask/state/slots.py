"""Admission: at most `subtask.maxRunning` workers, a FIFO queue, hand-off, crash recovery.

`slots.json` (guarded by `slots.lock`) lists the running attempts and the queue. It is a cache:
the truth is the records plus the run-locks, and a damaged file is rebuilt from them.

Invariants:
- Never take the ledger lock before the slots lock (`ledger.lock`), and never run anything slow
  under either (git checkout, spawn, network), because every start and every worker end passes
  through them.
- Never free a slot by job id alone, because a stale release by an old attempt's worker would free
  the slot of the new attempt; slots are keyed by (job, attempt).
- Whoever frees a slot hands it to the head of the queue in the same critical section and takes
  that job's run-lock there, so the next job never looks dead. A head whose run-lock is busy is
  still being written by its starter, which fills free slots itself when it lets go.
- Never read a missing or damaged `slots.json` as "nothing runs" inside a transaction, because
  saving that would forget running jobs and break the limit; `slots.transaction` requires a
  `rebuild` from the records and run-locks.
- Never let a job's child wait behind the slot its parent holds, because the parent waiting on it
  is a deadlock: a running job lends its slot (`slot_of`, see `admit`) to one child at a time; a
  lent slot does not count against maxRunning, and the child takes the lender's place when it
  ends first, so `taken` never grows.
- A running entry whose run-lock nobody holds belongs to a dead worker; exactly one process (the
  one that takes that run-lock under the slots lock) ends it, and removes the entry only after.
- Never let a map's queued jobs hold up the queue, because `--concurrency` would then throttle
  every job started after the map: a map member (`pool`, `pool_max`) takes a slot only while
  fewer than `pool_max` entries of its pool run, and `fill` and `admit` pass over a queued entry
  whose pool is full (FIFO among those that may run).
- `waiting` lists the jobs recorded `waiting` (subtask/plans.py) with the jobs they wait for
  (`until`): no slot, nothing counted. It lets every command see, from this file alone, whether a
  waiting job may be ready (none of those jobs is listed here any more), without reading records.
- Never take the slots lock or rewrite `slots.json` on a reading command when a look without the
  lock finds nothing to reconcile (no queue, every running entry's run-lock held, the file whole),
  because that cost every `list`/`status` a lock and an fsync; skipping is the same as a pass that
  ran just before the look (`lifecycle.nothing_to_reconcile`, issue 14).
- Never block on a queued job's run-lock while holding the slots lock, because its starter may
  need the slots lock to undo (a deadlock); `fill` stops at a busy queue head (keeping FIFO) and
  the starter fills free slots itself once it lets go.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable

from subtask.model.dataclass import dataclass, field
from subtask.state import liveness, paths
from subtask.state.statefiles import StateLock, file_lock, read_bytes, write_json

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    from typing import Any

    from subtask.state.statefiles import StrPath

SLOTS_FILE = paths.SLOTS_FILE


@dataclass
class Slots:
    """What `slots.json` holds: a cache of the records and run-locks (see the module docstring)."""

    running: list[dict[str, Any]] = field(default_factory=list)
    queue: list[dict[str, Any]] = field(default_factory=list)
    waiting: list[dict[str, Any]] = field(default_factory=list)  # {job, attempt, git_dir, until: [job ids], since}
    damaged: bool = False  # unreadable, or missing while other bookkeeping exists: rebuild it

    def to_dict(self) -> dict[str, Any]:
        return {"v": 1, "running": self.running, "queue": self.queue,
                **({"waiting": self.waiting} if self.waiting else {})}

    def position(self, job: str) -> int | None:
        """1-based position in the queue, or None."""
        for index, entry in enumerate(self.queue):
            if entry["job"] == job:
                return index + 1
        return None


@dataclass
class HandOff:
    """A queued attempt that just got a slot; `fd` holds its run-lock for the worker to inherit."""

    entry: dict[str, Any]
    fd: int


def lock(state_dir: StrPath) -> StateLock:
    return file_lock(os.path.join(state_dir, paths.SLOTS_LOCK))


def read(state_dir: StrPath) -> Slots:
    """The slots file as it is (no lock); a damaged one reads as empty with `damaged` set."""
    path = os.path.join(state_dir, SLOTS_FILE)
    try:
        data = json.loads(read_bytes(path))
        if not isinstance(data, dict) or not isinstance(data.get("running"), list) \
                or not isinstance(data.get("queue"), list):
            raise ValueError("unexpected shape")
        running = [e for e in data["running"] if _valid(e)]
        queue = [e for e in data["queue"] if _valid(e)]
        waiting = data.get("waiting")
        waiting = waiting if isinstance(waiting, list) else []  # v1 files before it
        return Slots(running, queue, [e for e in waiting if _valid(e) and _ids(e.get("until"))])
    except FileNotFoundError:
        # Missing while the lock file exists means it was deleted, not never made: a running job
        # may be listed nowhere else, so have it rebuilt rather than read as "nothing runs".
        return Slots(damaged=os.path.exists(os.path.join(state_dir, paths.SLOTS_LOCK)))
    except (ValueError, OSError) as exc:
        warnings.warn(f"{path} is damaged ({exc}); rebuilding it from the records and run-locks", stacklevel=2)
        return Slots(damaged=True)


def _valid(entry: object) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("job"), str) and isinstance(entry.get("attempt"), int)


def _ids(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


class transaction:  # noqa: N801  (read as a phrase: `with slots.transaction(...) as current:`)
    """Hold the slots lock; give the slots; save them on a clean exit.

    `rebuild` (records + run-locks) replaces a damaged or deleted file; it is required, because
    reading a damaged file as empty and saving that would forget every running job. A class, not
    `contextlib.contextmanager`: a reading command imports this module and never loads
    `contextlib` (~0.3 ms).
    """

    def __init__(self, state_dir: StrPath, rebuild: Callable[[], Slots]):
        self.state_dir, self.rebuild, self.held = state_dir, rebuild, lock(state_dir)

    def __enter__(self) -> Slots:
        self.held.acquire()
        try:
            slots = read(self.state_dir)
            self.slots = self.rebuild() if slots.damaged else slots
        except BaseException:
            self.held.release()
            raise
        return self.slots

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        try:
            if kind is None:
                save(self.state_dir, self.slots)
        finally:
            self.held.release()


def save(state_dir: StrPath, slots: Slots) -> None:
    """Write the slots file now. Caller holds the lock (the transaction saves again at its end).

    Not fsynced: it is a cache, and the records it caches are not fsynced either (libgit2 does not
    by default). A crash that loses the write loses every worker too, and the file is then either
    the old one (its running entries' run-locks are free: ended as dead) or damaged (rebuilt).
    An fsync here ran under the slots lock, on each start and each end: 0.35 ms at the median but
    up to 16 ms beside ten checkouts, with every other start and hand-off queued behind it.
    """
    write_json(os.path.join(state_dir, SLOTS_FILE), slots.to_dict(), durable=False)


def make_entry(job: str, attempt: int, git_dir: StrPath, parent: str | None = None, pool: str | None = None,
               pool_max: int | None = None) -> dict[str, Any]:
    entry = {"job": job, "attempt": attempt, "git_dir": str(git_dir), "since": time.time()}
    if parent:
        entry["parent"] = parent  # started from inside this running job: it may lend its slot
    if pool and pool_max:
        entry["pool"], entry["pool_max"] = pool, pool_max  # a map member: its group's bound
    return entry


def _pool_full(slots: Slots, entry: dict[str, Any]) -> bool:
    """Does `entry`'s pool (a map group) already run as many entries as it may?"""
    pool, most = entry.get("pool"), entry.get("pool_max")
    if not pool or not isinstance(most, int):
        return False
    return sum(1 for e in slots.running if e.get("pool") == pool) >= most


def _next_eligible(slots: Slots) -> dict[str, Any] | None:
    """The first queued entry whose pool lets it run (FIFO among those that may run)."""
    return next((e for e in slots.queue if not _pool_full(slots, e)), None)


# Waiting jobs (subtask/plans.py): recorded, holding nothing, until the jobs in `until` end.

def add_waiting(slots: Slots, job: str, git_dir: StrPath, until: list[str]) -> None:
    slots.waiting = [e for e in slots.waiting if e["job"] != job]
    slots.waiting.append({"job": job, "attempt": 1, "git_dir": str(git_dir), "until": list(until),
                          "since": time.time()})


def remove_waiting(slots: Slots, job: str) -> bool:
    before = len(slots.waiting)
    slots.waiting = [e for e in slots.waiting if e["job"] != job]
    return len(slots.waiting) != before


def listed(slots: Slots) -> set[str]:
    """Every job this file holds: running, queued or waiting."""
    return {e["job"] for e in slots.running + slots.queue + slots.waiting}


def never_made(state_dir: StrPath) -> bool:
    """No slots file and no lock for one: no job ever ran from this state folder."""
    return not os.path.exists(os.path.join(state_dir, SLOTS_FILE)) \
        and not os.path.exists(os.path.join(state_dir, paths.SLOTS_LOCK))


def nothing_to_sweep(state_dir: StrPath) -> bool:
    """True when a look without the slots lock finds nothing for a sweep to do: the file is
    whole, nothing is queued, every running entry's run-lock is held (its worker lives, or someone
    is settling it), and no waiting job's jobs have all ended. A reading command then takes no
    lock, rewrites nothing and imports nothing more (`ops.lifecycle.reconcile`, `ops.plans.advance`
    do the rest). Skipping is the same as a sweep that ran just before this look."""
    if never_made(state_dir):
        return True
    with warnings.catch_warnings():  # a damaged file is said once, by the locked pass that rebuilds it
        warnings.simplefilter("ignore")
        current = read(state_dir)
    if current.damaged or current.queue or ready_waiting(current):
        return False
    return all(liveness.is_held(state_dir, entry["job"]) for entry in current.running)


def ready_waiting(slots: Slots) -> list[dict[str, Any]]:
    """Waiting entries none of whose jobs is listed any more: they may be ready (their records say)."""
    active = listed(slots)
    return [e for e in slots.waiting if not active.intersection(e["until"])]


# Lent slots (issue 11 item 9). A job that starts a child and waits for it would deadlock under
# maxRunning=1: the child queues behind the slot its parent holds. So a running job lends its slot
# to one of its own children at a time: the child runs "in" the parent's slot (`slot_of`) and does
# not count against maxRunning. Its other children queue for that lent slot or a free one. When
# the lender ends first, the child keeps the slot (it takes the lender's own place), so the count
# of taken slots never grows past maxRunning, and at most maxDepth + 1 engines share one slot.


def taken(slots: Slots) -> int:
    """Slots counted against maxRunning: running entries not in a slot lent by their parent."""
    return sum(1 for e in slots.running if not e.get("slot_of"))


def _lender(slots: Slots, entry: dict[str, Any]) -> str | None:
    """The parent that can lend `entry` its slot now: running, and not lending it already."""
    parent = entry.get("parent")
    if not parent or not any(e["job"] == parent for e in slots.running):
        return None
    return None if any(e.get("slot_of") == parent for e in slots.running) else parent


def admit(slots: Slots, entry: dict[str, Any], max_running: int) -> int:
    """Take a slot (returns 0) or join the queue (returns the 1-based position). Caller holds the lock."""
    if _pool_full(slots, entry):
        slots.queue.append(entry)
        return len(slots.queue)
    lender = _lender(slots, entry)
    if lender is not None:
        slots.running.append(dict(entry, slot_of=lender))
        return 0
    if taken(slots) < max_running and _next_eligible(slots) is None:
        slots.running.append(entry)
        return 0
    slots.queue.append(entry)
    return len(slots.queue)


def remove(slots: Slots, job: str, attempt: int) -> bool:
    """Drop this attempt from running or queue; a child in its lent slot takes its place. Caller holds the lock."""
    before = len(slots.running) + len(slots.queue)
    gone = [e for e in slots.running if e["job"] == job and e["attempt"] == attempt]
    slots.running = [e for e in slots.running if not (e["job"] == job and e["attempt"] == attempt)]
    slots.queue = [e for e in slots.queue if not (e["job"] == job and e["attempt"] == attempt)]
    for lender in gone:
        for borrower in slots.running:
            if borrower.get("slot_of") == job:
                # The lender's own place passes on: a normal slot, or the one its own parent lent it.
                if lender.get("slot_of"):
                    borrower["slot_of"] = lender["slot_of"]
                else:
                    borrower.pop("slot_of")
    return len(slots.running) + len(slots.queue) != before


def fill(slots: Slots, state_dir: StrPath, max_running: int) -> list[HandOff]:
    """Move queued attempts into free slots, taking each one's run-lock. Caller holds the lock.

    Stops at a queue head whose run-lock is busy: its starter is still writing its branch and
    record, and fills the slot itself when it lets go. Never blocks on that lock here: the starter
    may need the slots lock to undo a failed start (a deadlock), and skipping the head would break
    the FIFO order.
    """
    handed = []
    while taken(slots) < max_running:
        entry = _next_eligible(slots)
        if entry is None:
            break
        fd = _try_lock(state_dir, entry["job"])
        if fd is None:
            break
        slots.queue.remove(entry)
        entry["since"] = time.time()
        slots.running.append(entry)
        handed.append(HandOff(entry, fd))
    # Children waiting for the slot their running parent lends (out of FIFO order: that slot is
    # their parent's, not the queue's). A busy one is skipped: its starter fills when it lets go.
    for entry in list(slots.queue):
        lender = _lender(slots, entry)
        if lender is None or _pool_full(slots, entry):
            continue
        fd = _try_lock(state_dir, entry["job"])
        if fd is None:
            continue
        slots.queue.remove(entry)
        entry.update(since=time.time(), slot_of=lender)
        slots.running.append(entry)
        handed.append(HandOff(entry, fd))
    return handed


def _try_lock(state_dir: StrPath, job: str, tries: int = 5) -> int | None:
    # A liveness probe holds a shared lock for microseconds; a starter holds it for many
    # milliseconds. A few quick tries tell the two apart.
    for _ in range(tries):
        fd = liveness.acquire(state_dir, job, block=False)
        if fd is not None:
            return fd
        time.sleep(0.002)
    return None


def reap_dead(slots: Slots, state_dir: StrPath) -> list[HandOff]:
    """Take the run-lock of each running entry nobody holds (its worker is dead). Caller holds the lock.

    The entries stay in the file until they are ended (`lifecycle.end_reaped`): the taken
    run-lock tells every other process that someone is ending them, and if that process itself
    crashes the lock goes with it and the next command reaps them again, so a dead worker's money
    is never forgotten between "removed from the slots" and "ended".
    """
    reaped = []
    for entry in slots.running:
        fd = liveness.acquire(state_dir, entry["job"], block=False)
        if fd is not None:
            reaped.append(HandOff(entry, fd))
    return reaped
