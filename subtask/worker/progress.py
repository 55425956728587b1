"""The attempt's record before its end: `running` once the worker takes it, the engine's start
(from which a dead worker's engine may have spent money), or its end in setting up (`setup_failed`,
kind `setup`: nothing of the job ran, nothing is charged).

Invariants:
- Never a write to an attempt that ended (stopped in the spawn gap): each write is a
  compare-and-swap on the attempt's number and its not being terminal; None says it ended.
- Never end an attempt `failed · setup` once a stop was asked for, because `stop` signals the
  worker's process group after writing its marker, and a git of the setup can die of the signal
  before the worker sees it (`test_jobs::test_a_stop_that_breaks_the_setup_still_ends_stopped`).
- The worker waits out a held record lock until it is stale (`owner_lock_wait`): its own writes
  must not fail (a done job recorded failed) because some writer died holding that lock.
"""

from __future__ import annotations

import time

from subtask.engines.base import ERROR_HINTS
from subtask.git import records
from subtask.git.gitrepo import Repo
from subtask.git.records import Job
from subtask.ops.running import lifecycle


def owner_lock_wait(repo: Repo) -> float:
    """The worker waits out a held record lock until it is stale and removed: its own writes must
    not fail (a done job recorded failed) because some writer died holding that lock."""
    return repo.config.number("refLockStale") + 2 * records.LOCK_WAIT


def _update_attempt(repo: Repo, job_id: str, attempt_n: int, apply) -> Job | None:
    """Apply `apply(attempt)` to attempt `attempt_n` unless it has ended; None if it has."""
    def change(job: Job) -> bool:
        attempt = job.state.current
        if attempt.n != attempt_n or attempt.terminal:
            return False
        apply(attempt)
        return True

    job = records.update(repo, job_id, change, lock_wait=owner_lock_wait(repo))
    current = job.state.current
    return job if current.n == attempt_n and not current.terminal else None


def mark_running(repo: Repo, job: Job) -> Job | None:
    """Record `running` as soon as the worker takes a handed-on attempt (while git writes its
    checkout), so the hand-off shows at once; None if the attempt already ended (stopped in the
    spawn gap). An attempt its starter admitted reads `running` already: the time it was taken is
    kept in `job` and recorded with the engine's start, one record write fewer before the engine."""
    taken = time.time()
    attempt = job.state.current
    if attempt.state == "running":
        attempt.started_at = taken
        return job

    def apply(attempt) -> None:
        attempt.state = "running"
        attempt.started_at = taken

    return _update_attempt(repo, job.id, attempt.n, apply)


def mark_engine_started(repo: Repo, job_id: str, attempt_n: int, taken_at: float | None) -> Job | None:
    """Record that the engine starts: from here on a dead worker's engine may have spent money."""
    def apply(attempt) -> None:
        attempt.started_at = attempt.started_at or taken_at
        attempt.engine_started_at = time.time()

    return _update_attempt(repo, job_id, attempt_n, apply)


def setup_failed(repo: Repo, job_id: str, attempt_n: int, reason: str, hint: str | None = None) -> None:
    """End the attempt failed in its setup, or stopped when a stop was asked for meanwhile: `stop`
    writes its marker before it signals the worker's process group, so a git of the setup can die
    of the stop before the worker sees it."""
    if lifecycle.stop_asked(repo.state_dir, job_id):
        lifecycle.end_attempt(repo, job_id, attempt_n, "stopped", reason="stopped by request",
                              engine_may_have_spent=False)
        return
    lifecycle.end_attempt(repo, job_id, attempt_n, "failed", reason=reason, error_kind="setup",
                          hint=hint or ERROR_HINTS["setup"], engine_may_have_spent=False)
