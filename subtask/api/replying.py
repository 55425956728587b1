"""A job that exists: a new attempt of a finished job (`reply`), or its end (`stop`).

Invariants:
- A reply appends exactly one attempt, by compare-and-swap on an ended one, under the job's
  run-lock (`_launch_all` in `api/starting.py`); a failure undoes it as a start's is undone.
- A reply or a stop runs only for a job this clone started: another clone's spec is a claim,
  never ours to run.
"""

from __future__ import annotations

from pathlib import Path

from subtask import executors
from subtask.api.read import _groups, _positive, get
from subtask.api.starting import (
    StartResult,
    _admit_and_launch,
    _check_depth,
    _check_engine_can_run,
    _check_task,
    _default_timeout,
    _max_usd,
    _reserved_cost,
)
from subtask.git import ownership, records, worktrees
from subtask.git.gitrepo import Repo
from subtask.git.records import Job
from subtask.model.errors import SubtaskError
from subtask.model.job import WAITING, Attempt, now
from subtask.model.redact import redact
from subtask.ops.running import lifecycle, spending
from subtask.state import liveness, paths

REPLY_LOCK_WAIT = 3.0


def reply(repo: Repo, id_or_prefix: str, message: str, *, max_usd: float | None = None,
          timeout: float | None = None) -> StartResult:
    """A new attempt of a finished job in the same worktree, resuming the engine's session."""
    from subtask.engines import get_engine

    message = _check_task(message)
    job = get(repo, id_or_prefix)
    job_id = job.id
    previous = job.state.current
    if not previous.terminal:
        raise SubtaskError("not_finished", f"{job_id} is {previous.state}; only a finished job can be replied to",
                           hint=f"git subtask wait {job_id}")
    if not ownership.owns(repo, job):  # its spec (branch, worktree, task) is a teammate's claim, never ours to run
        raise SubtaskError("negative", f"{job_id} is another clone's job: a reply runs here only for a job this "
                           "clone started", hint=f"start a new job from its branch: git subtask start --base "
                           f"{job.spec.base} '...'")
    if job.spec.after and repo.objects.ref(records.pin_ref(job_id, "base")) is None:
        raise SubtaskError("negative", f"{job_id} never started ({previous.state} while it waited): there is no "
                           "work to reply to",
                           hint=f"start it again: git subtask start --after ... (git subtask show {job_id})")
    executor = executors.of(job)
    executor.require("reply")
    repo.config.require_valid(job.spec.engine)
    engine = get_engine(job.spec.engine, repo.config)
    if executor.runs_here:  # elsewhere, the node that runs it needs the engine, not this machine
        _check_engine_can_run(engine)
    usd = _max_usd(repo, engine, max_usd if max_usd is not None else job.spec.max_usd)
    timeout = (_positive(timeout, "--timeout") if timeout is not None else
               job.spec.timeout or _default_timeout(repo, engine))
    _check_depth(repo)
    if executor.runs_here:
        worktrees.check_runnable(repo, job_id, Path(job.spec.worktree))  # a record's path is data, never authority
        worktrees.drop_stale(repo, job_id, Path(job.spec.worktree))  # removed by hand: the worker checks it out again
    lock_fd = _acquire_for_reply(repo, job_id)
    n = previous.n + 1
    stored = redact(message)
    attempt = Attempt(n=n, state="queued", message=stored, queued_at=now(), cost=_reserved_cost(usd, engine),
                      rid=paths.reservation_id(job_id, n) if engine.paid else None, timeout=timeout,
                      max_usd=usd if engine.paid else None, session_id=None)
    job.state.attempts.append(attempt)
    try:
        fresh = records.read(repo, job_id)
        if fresh.state.current.n != previous.n:
            raise SubtaskError("not_finished",
                               f"another reply already started attempt {fresh.state.current.n} of {job_id}",
                               hint=f"git subtask wait {job_id}")
    except BaseException:
        liveness.release(lock_fd)
        raise
    # The stop of an earlier attempt must not end this one before it starts.
    lifecycle.clear_stop(repo.state_dir_str, job_id)
    if not executor.runs_here:
        try:
            return StartResult(executor.backend().reply(repo, job, attempt, engine.paid), 0, on=executor.name)
        finally:
            liveness.release(lock_fd)
    if engine.paid:
        spending.sync_ledger(repo)
    # A branch that cleanup or gc deleted (no commits beyond its base, or landed) comes back where
    # the job's work ends, so the reply continues from it.
    branch_at = None
    if job.spec.branch and repo.git.references.get(f"refs/heads/{job.spec.branch}") is None:
        from subtask.ops.landing import landed

        branch_at = landed.job_head(repo, job)
    return _admit_and_launch(repo, job, engine.paid, branch_at=branch_at, lock_fd=lock_fd,
                             as_written={"message": message, "stored_message": stored})


def _acquire_for_reply(repo: Repo, job_id: str) -> int:
    """The job's run-lock, once its previous worker has let go; busy means another reply has it."""
    return liveness.acquire_within(repo.state_dir, job_id, REPLY_LOCK_WAIT)


def stop(repo: Repo, id_or_prefix: str) -> Job:
    """End a job: drop it from the queue, or end its worker's process groups (TERM, then KILL)."""
    job = get(repo, id_or_prefix)
    job_id = job.id
    attempt = job.state.current
    if attempt.terminal:
        raise SubtaskError("negative", f"{job_id} already ended ({attempt.state}); nothing to stop")
    if not ownership.owns(repo, job):  # its worker runs in the clone that started it, and ends it there
        raise SubtaskError("negative", f"{job_id} is another clone's job: only its own worker ends it",
                           hint=f"ask whoever started it (its record names clone {job.spec.clone or 'unknown'})")
    executor = executors.of(job)
    if not executor.runs_here:
        return executor.backend().stop(repo, job_id)
    from subtask.ops.plans import waiting

    # A waiting job ends here, under its run-lock; one that started meanwhile is stopped as any job.
    if attempt.state != WAITING or not waiting.stop_waiting(repo, job_id):
        lifecycle.stop_job(repo, job_id)
    job = records.read(repo, job_id)
    if job.spec.group:  # a member stopped by hand may be the last one its group waited for
        _groups().after_member_ended(repo, job)
    waiting.advance(repo)  # the jobs waiting for it are skipped now, not at the next command
    return job
