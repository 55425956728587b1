"""The detached worker: one process runs a job's attempt from checkout to final record.

`python -m subtask.worker.attempt <id> <repo>` is spawned by `start` (or by whoever hands it a slot) with
its run-lock already held on the inherited fd `SUBTASK_LOCK_FD`. An attempt's flow
(`_run_attempt`), one module a step: check the worktree out and record `running` (`checkout`),
confine it (`confinement`), run the engine with events streaming to
`<state>/run/<id>.events.jsonl` (`engine`), commit what the engine left uncommitted and compute
the evidence from git (`evidence`), run verify on that exact commit (`verify`), close the
reservation with the real cost, write the head pin, the final record and the note (`finish`).
Then the worker frees the slot and hands it on. When the next queued job is in the same
repository, the worker runs it itself (no new process: hand-off costs no start-up).

Invariants:
- Every attempt ends, whatever happens (`_run_one`): a stop is recorded `stopped`, a worker
  error `failed`; its one terminal state is written by compare-and-swap (`finish.finish`).
- Never release the run-lock before the final record is written, because waiters read the record
  the moment they wake.
- Every text from the engine or verify passes `redact` before it reaches the record, the note or
  the events file (`events`).
- Each job runs with its starter's kept environment (`jobenv.adopt`), never with that of the
  worker that was handed its slot.
- Never hand a forked worker a `Repo` its starter opened anywhere but at the main worktree,
  because a linked worktree's settings may be its own. A worker forked from the starting process
  takes the starter's open `Repo` (paths and settings, a pygit2 handle of its own), and a zygote's
  child its `Repo.handover()` sent with the request, so neither asks git what the starter knew. A
  fresh interpreter finds the repository anew.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from subtask import words as render
from subtask.engines.base import ERROR_HINTS
from subtask.git import records
from subtask.git.gitrepo import Repo, open_repo
from subtask.git.records import Job
from subtask.model import faults, phases
from subtask.model.errors import SubtaskError
from subtask.model.job import WAITING
from subtask.ops.plans import waiting
from subtask.ops.running import lifecycle
from subtask.proc import procs, spawn
from subtask.state import jobenv, liveness, slots
from subtask.worker import refill, retries
from subtask.worker.checkout import set_up_fresh, set_up_worktree, worktree_path
from subtask.worker.confinement import confine, remove_discarded
from subtask.worker.engine import run_engine_confined
from subtask.worker.events import EventSink
from subtask.worker.evidence import commit_work, gather_evidence
from subtask.worker.finish import finish_attempt
from subtask.worker.stop import StopRequested, on_sigterm
from subtask.worker.verify import verify_work


def run_attempt(repo: Repo, job: Job) -> None:
    """Run the current attempt of `job` (as just read) to its end. The caller holds the run-lock."""
    job_id, attempt_n = job.id, job.state.current.n
    if job.state.current.terminal or job.state.current.state == WAITING:
        return  # ended; or still waiting (`plans` starts it), never a worker's to run
    state_dir = repo.state_dir
    if lifecycle.stop_asked(state_dir, job_id):
        lifecycle.end_attempt(repo, job_id, attempt_n, "stopped", reason="stopped before it started",
                              engine_may_have_spent=False)
        return
    sink = EventSink(lifecycle.events_file(state_dir, job_id), attempt_n)
    try:
        _run_attempt(repo, job, sink)
    finally:
        sink.close()


def _run_attempt(repo: Repo, job: Job, sink: EventSink) -> None:
    """The flow of one attempt: checkout, confinement, engine, evidence, verify, finish. Each
    step that can end the attempt says so with None, having recorded why. The evidence comes in
    two halves: the work committed before verify runs on it, the evidence gathered after (it
    holds verify's result)."""
    fresh = not worktree_path(repo, job).exists()
    set_up = set_up_worktree(repo, job, sink)
    if set_up is None:
        return
    job, worktree, admin, main_before = set_up
    confinement = confine(repo, job, worktree, admin, sink, main_before)
    if confinement is None:
        return
    try:
        if fresh and not set_up_fresh(repo, job, worktree, confinement):
            return
        ran = run_engine_confined(repo, job, worktree, sink, confinement)
        if ran is None:
            return
        work = commit_work(repo, ran.job, worktree, ran.outcome)
        verdict = verify_work(repo, ran.job, worktree, sink, confinement, work.outcome, ran.stopped,
                              work.head)
        evidence = gather_evidence(repo, ran.job, work, verdict, confinement, ran.watch)
        finish_attempt(repo, worktree, sink, ran, work, verdict, evidence)
    finally:
        confinement.close()


def release_and_next(repo: Repo, job_id: str, attempt_n: int) -> list[slots.HandOff]:
    with slots.transaction(repo.state_dir, rebuild=lambda: lifecycle.rebuild_slots(repo)) as current:
        slots.remove(current, job_id, attempt_n)
        return slots.fill(current, repo.state_dir, repo.config.integer("maxRunning"))


def serve(repo: Repo, job_id: str, lock_fd: int, started_at: float | None = None) -> None:
    """Run this job, then every queued job handed to us in this repository."""
    while True:
        phases.begin(started_at)
        started_at = None
        liveness.adopt(job_id, lock_fd)
        lifecycle.reset_pids(repo.state_dir, job_id, worker=os.getpid())
        signal.signal(signal.SIGTERM, on_sigterm)
        attempt_n, ended = _run_current(repo, job_id)
        jobenv.drop(repo.state_dir, job_id)  # the attempt ended; a reply keeps its own
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        member = ended if ended is not None and ended.spec.group else None
        if member is not None:  # first pass: the rest stop before our slot is handed to one of them
            from subtask.ops.plans import groups  # a group member's only: ~11 ms of every worker's start

            groups.after_member_ended(repo, member, first_pass_only=True)
        phases.mark("wrap_up")
        handed = release_and_next(repo, job_id, attempt_n)
        phases.mark("slot_hand_off")
        start_waiters(repo, conclude=False)  # before our run-lock goes: `wait` for us returns with them started
        refill.end()  # the pool refill beside the job ends with it: when no job runs, nothing runs
        phases.mark("refill_ended")
        liveness.release(lock_fd)
        phases.mark("run_lock_released")
        remove_discarded()  # the attempt's private folder, moved aside: `wait` has returned meanwhile
        phases.flush(job_id, attempt_n)
        same_repo = [h for h in handed if lifecycle.in_repo(repo, h.entry)]
        lifecycle.start_handoffs(repo, [h for h in handed if h not in same_repo[:1]])
        if member is not None:  # our note is written and our run-lock released: conclude the group
            from subtask.ops.plans import groups

            groups.after_member_ended(repo, member)
            start_waiters(repo)  # ... and start the jobs waiting for the group
        if not same_repo:
            return
        job_id, lock_fd = same_repo[0].entry["job"], same_repo[0].fd
        jobenv.adopt(repo.state_dir, job_id)  # its starter's environment, not the previous job's


def start_waiters(repo: Repo, conclude: bool = True) -> None:
    """Move on the jobs waiting for the one this worker just ended (`waiting.advance`); cheap when
    none waits. Whatever fails here, the next command's sweep does it. `conclude` False: a group they
    wait for is not decided here (its judges would hold our run-lock; we conclude it after)."""
    faults.point("before_advance")
    waiting.advance_quietly(repo, conclude)
    faults.point("after_advance")


def _run_current(repo: Repo, job_id: str) -> tuple[int, Job | None]:
    """Run the job's current attempt, ending it whatever happens; the attempt number, and the
    job as its record then says (None when it cannot be read)."""
    try:
        job = records.read(repo, job_id)
    except SubtaskError:
        # Its `start` crashed after queueing it, before writing its record: nothing of it ran.
        # Release its reservation and drop its branch; the caller frees the slot.
        lifecycle.end_dead(repo, slots.make_entry(job_id, 1, repo.common_dir))
        return 1, None
    while True:
        attempt_n = _run_one(repo, job)
        try:  # read once for the log and for the caller (a group member's settling)
            ended = records.read(repo, job_id)
        except SubtaskError:
            return attempt_n, None
        log_end(ended, attempt_n)
        if not retries.retry_to_run(ended, attempt_n):
            return attempt_n, ended
        # The verify loop appended a retry: this worker runs it, in the slot it renamed to it.
        job = ended
        lifecycle.reset_pids(repo.state_dir, job_id, worker=os.getpid())
        signal.signal(signal.SIGTERM, on_sigterm)


def _run_one(repo: Repo, job: Job) -> int:
    """Run the job's current attempt, ending it whatever happens; its number."""
    job_id, attempt_n = job.id, job.state.current.n
    try:
        run_attempt(repo, job)
    except StopRequested:
        lifecycle.end_attempt(repo, job_id, attempt_n, "stopped", reason="stopped by request")
    except Exception as exc:
        import traceback  # a crash's: ~3 ms of every worker's start otherwise

        traceback.print_exc()
        if lifecycle.stop_asked(repo.state_dir, job_id):
            # Stopped mid-wrap-up (a killed git leaves a broken index.lock behind): the end is
            # the one the user asked for, and the error stays in this log.
            lifecycle.end_attempt(repo, job_id, attempt_n, "stopped", reason="stopped by request")
        else:
            lifecycle.end_attempt(repo, job_id, attempt_n, "failed", reason=f"worker error: {exc}",
                                  error_kind="engine", hint=ERROR_HINTS["engine"])
    return attempt_n


LOG_TAIL_LINES = 10


def log_end(job: Job, attempt_n: int) -> None:
    """Say in the worker log (our stderr) how the attempt ended, and why when it did not pass:
    the hints send people to that log. Only recorded (redacted) text is written."""
    job_id = job.id
    attempt = next((a for a in job.state.attempts if a.n == attempt_n), None)  # a retry may follow it
    if attempt is None:
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    lines = [f"{stamp} {job_id} attempt {attempt_n} {attempt.state}"
             + (f" ({attempt.error_kind})" if attempt.error_kind else "")
             + (f": {attempt.reason}" if attempt.reason else "")]
    if attempt.hint:
        lines.append(f"  hint: {attempt.hint.replace('<id>', job_id)}")
    if attempt.state != "done" and job.summary:
        lines.append("  last output:")
        lines += ["    " + line for line in job.summary.splitlines()[-LOG_TAIL_LINES:]]
    verify = attempt.verify
    if verify is not None and not verify.passed:
        lines.append(f"  verify failed: {verify.command} (exit {verify.exit_code})")
        lines += render.verify_tail(verify, prefix="    ")
    print("\n".join(lines), file=sys.stderr, flush=True)


def run_detached(job_id: str, repo_path, lock_fd: int) -> int:
    """The worker's life, in a forked child or a fresh interpreter (`main`)."""
    started_at = time.time()
    spawn.use_worker_main(run_detached)  # hand-offs to other repositories fork this worker again

    procs.become_subreaper()  # a job's orphans are ours to end where no pid namespace does it
    liveness.close_others(lock_fd)  # forked from a holder of other run-locks: they are not ours
    repo = own_repo(repo_path)
    jobenv.adopt(repo.state_dir, job_id)  # whoever spawned us: the job runs as its starter ran
    faults.point("worker_start")
    try:
        serve(repo, job_id, lock_fd, started_at)
    finally:
        refill.end()  # a pool refill of an attempt that ended in an error: never left behind
    return 0


def own_repo(handed) -> Repo:
    """The worker's repository handle, never one shared with a parent: rebuilt from what the
    starter found (its `Repo` in a forked child, its `handover()` through the zygote) when it was
    opened at the main worktree, else found anew from the root (a linked worktree's settings
    may be its own)."""
    if isinstance(handed, dict):
        return Repo.from_handover(handed)
    if isinstance(handed, Repo):
        if handed.handover() is not None:
            return handed.for_thread()
        handed = handed.root
    return open_repo(handed)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_detached(argv[0], argv[1], int(os.environ.pop("SUBTASK_LOCK_FD")))


if __name__ == "__main__":
    sys.exit(main())
