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
"""

from __future__ import annotations

from subtask.git import pool
from subtask.git.gitrepo import Repo
from subtask.git.records import Job
from subtask.ops.running import lifecycle
from subtask.proc import spawn
from subtask.state import liveness

GRACE = 0.5  # seconds a refill still running when the job's work is done gets to finish


def start(repo: Repo, job: Job) -> None:
    """Make the next job's worktree while this one runs: a forked child fills the pool at this
    job's base (`pool.fill`), unless the pool has what it should or is being filled. The child
    holds `pool-fill.lock` (taken here, before the fork) and none of our run-locks."""
    if not pool.wanted(repo):
        return
    lock = pool.filler(repo)
    if lock is None:
        return
    base = job.spec.base

    def fill() -> None:
        liveness.close_others(-1)
        pool.fill(repo, commit=base, lock=lock)

    try:
        pid = spawn.in_background(fill)
    finally:
        lock.forget()  # the child's now: closed here, never unlocked
    if pid is not None:
        lifecycle.record_pid(repo.state_dir, job.id, refill=pid)  # a `stop` signals its group too


def end(grace: float = GRACE) -> None:
    """End the refill this worker started, if any: `grace` seconds to finish, then killed with
    every process it started; returns once nothing of it runs."""
    spawn.end_background(grace)
