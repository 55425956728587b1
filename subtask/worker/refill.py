"""The pool refill beside a job: its worker's forked child makes the next job's worktree while
this one runs (`git.pool.fill`), never a process of its own.

Invariants:
- Never let the refill outlive the job's run-lock, because when `wait` returns nothing of the
  job may run: the worker ends it (`end`) before it lets go of the lock.
"""

from __future__ import annotations

from subtask.git import pool
from subtask.git.gitrepo import Repo
from subtask.git.records import Job
from subtask.proc import spawn
from subtask.state import liveness


def start(repo: Repo, job: Job) -> None:
    """Make the next job's worktree while this one runs: a forked child fills the pool at this
    job's base (`pool.fill`), unless the pool has what it should or is being filled. The child
    holds `pool-fill.lock` (taken here, before the fork) and none of our run-locks; the worker
    waits for it before it lets go of its run-lock (`end`), so the refill is part of the job:
    when `wait` returns, nothing of the job runs any more."""
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
        spawn.in_background(fill)
    finally:
        lock.forget()  # the child's now: closed here, never unlocked


def end() -> None:
    """Wait for the refill this worker started, if any."""
    spawn.reap_background()
