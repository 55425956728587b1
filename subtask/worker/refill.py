"""The pool refill beside a job: its worker's forked child makes the next job's worktree while
this one runs (`git.pool.fill`), never a process of its own.

Invariants:
- Never let the refill outlive the job's run-lock, because when `wait` returns nothing of the
  job may run: once the job's work is done the worker gives the refill `GRACE` seconds, then
  kills its process group (the filler and every git it runs) and reaps it (`end`), and only then
  lets go of the lock. `wait` is held by the refill for at most `GRACE`.
- An ended refill leaves debris, never an entry: the filler builds under `.pool/.building/` and
  renames an entry into the pool only once complete (`git/pool.py`); the next filler removes it.
- A `stop` ends the refill too: the worker's wrap-up ends it, its group is in the job's pids
  (`lifecycle.signal_job` signals it), and it dies with the worker (PR_SET_PDEATHSIG).
- Never begin a refill at once while the pool still has a worktree ready, because the next start
  is served by that one and a short job would pay for the refill: its `wait` held up to `GRACE`,
  its disk written and then its half-made entry removed. Such a refill begins after the job ran
  `AFTER` seconds (most jobs of an agent run minutes, so it is done long before their end); a job
  over sooner ends it unbegun, at once. Only a take that left the pool empty refills at once, and
  only while no refill was ended half-made (its debris says refills do not fit this repository's
  short jobs: a slow disk, a big checkout; the next refill that runs removes it).
"""

from __future__ import annotations

import os
import time

from subtask.git import pool
from subtask.git.gitrepo import Repo
from subtask.git.records import Job
from subtask.model.errors import SubtaskError
from subtask.ops.running import lifecycle
from subtask.proc import spawn
from subtask.state import liveness

GRACE = 0.5  # seconds a refill still running when the job's work is done gets to finish
AFTER = 1.0  # seconds a job runs before its refill begins while the pool has a worktree ready
AFTER_ENV = "SUBTASK_REFILL_AFTER"  # seconds, instead of AFTER (the tests' and benches' handle)

_unbegun_until: float | None = None  # until then (monotonic) this worker's refill has not begun


def start(repo: Repo, job: Job) -> None:
    """Make the next job's worktree while this one runs: a forked child fills the pool at this
    job's base (`pool.fill`), unless the pool has what it should or is being filled; at once when
    the pool is empty and the last refill was not ended half-made, else after the job ran `AFTER`
    seconds. The child holds `pool-fill.lock` (taken before it fills: here, before the fork, when
    at once) and none of our run-locks."""
    global _unbegun_until
    try:
        now = pool.status(repo)
    except SubtaskError:  # a bad setting: `doctor` and the next command say so
        return
    if len(now.entries) >= now.target:
        return
    # At once only when the take emptied the pool and no refill was ended half-made (debris):
    # otherwise refills do not fit this repository's short jobs.
    after = _after() if now.entries or now.debris else 0.0
    lock = None if after else pool.filler(repo)
    if lock is None and not after:
        return
    base = job.spec.base

    def fill() -> None:
        liveness.close_others(-1)
        if after:
            time.sleep(after)
        held = lock if lock is not None else pool.filler(repo)
        if held is not None:
            pool.fill(repo, commit=base, lock=held)

    try:
        pid = spawn.in_background(fill)
    finally:
        if lock is not None:
            lock.forget()  # the child's now: closed here, never unlocked
    if pid is not None:
        _unbegun_until = time.monotonic() + after if after else None
        lifecycle.record_pid(repo.state_dir, job.id, refill=pid)  # a `stop` signals its group too


def end(grace: float = GRACE) -> None:
    """End the refill this worker started, if any: `grace` seconds to finish (none when it has
    not begun), then killed with every process it started; returns once nothing of it runs."""
    global _unbegun_until
    if _unbegun_until is not None and time.monotonic() < _unbegun_until:
        grace = 0.0
    _unbegun_until = None
    spawn.end_background(grace)


def _after() -> float:
    try:
        return max(float(os.environ.get(AFTER_ENV, AFTER)), 0.001)
    except ValueError:
        return AFTER
