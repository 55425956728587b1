"""The last step of an attempt (`finish_attempt`): the verify loop's plan (`retries`), the head
pin, the final record (state, cost, evidence, summary, events tail), the reservation closed with
the real charge, the note and the terminal event.

Invariants:
- Exactly one terminal state per attempt: the final write goes through `Attempt.finish`
  (`finish`), which never overwrites one, by compare-and-swap.
- Never write a terminal record before the head pin, because a worker killed between the two would
  leave a finished job whose commits `git gc` may drop after a squash merge; a note missing after
  a terminal record is completed by whoever reaps the dead worker's slot (`lifecycle.complete_ended`).
- The attempt's end and the verify loop's next attempt are one record write (`retries.Plan.apply`
  inside `finish`); when that write fails, the plan is undone (its slot entry and money go back).
- The private copies of the task and the verify command go once the final record is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from subtask.engines.base import Outcome
from subtask.git import checks, notes, records
from subtask.git.gitrepo import Repo, git
from subtask.git.records import Job
from subtask.model import faults, phases
from subtask.model.job import Evidence, VerifyResult
from subtask.model.redact import redact
from subtask.ops.landing import overlay
from subtask.ops.running import lifecycle, notify
from subtask.state import ledger, privatetext
from subtask.worker import retries
from subtask.worker.charge import charge_of, settle_outcome
from subtask.worker.engine import EngineRun
from subtask.worker.events import EventSink
from subtask.worker.evidence import Work, evidence_at_best
from subtask.worker.progress import owner_lock_wait
from subtask.worker.verify import Verdict


def finish_attempt(repo: Repo, worktree: Path, sink: EventSink, ran: EngineRun, work: Work,
                   verdict: Verdict, evidence: Evidence) -> None:
    """Plan the verify loop's next attempt, pin the head, write the final record, close the
    reservation; unless the loop goes on, write the note and say the attempt ended."""
    state_dir, job = repo.state_dir, ran.job
    job_id, attempt_n = job.id, job.state.current.n
    stall, started_from, admin, head = ran.stall, ran.started_from, work.admin, work.head
    outcome, state, verify, found = verdict.outcome, verdict.state, verdict.verify, verdict.found
    plan = retries.after_attempt(repo, job, retries.Facts(state, verify, head, started_from, charge_of(job, outcome),
                                                          found, outcome.session_id), admin, worktree)
    if plan.head != head:  # every attempt of the loop failed: the branch is left at the best one
        evidence = evidence_at_best(repo, job, plan, outcome, state, evidence)
    phases.mark("evidence")
    faults.point("before_final_record")
    retries.pin_attempt(repo, job, head)
    if plan.head != job.spec.base:
        # Before the terminal record, never after: a worker killed in between must not leave a
        # finished job whose commits nothing keeps alive once its branch is squashed away.
        records.set_pin(repo, job_id, "head", plan.head)
    phases.mark("pins")

    def then(ended: Job) -> None:
        _record_checks(ended, found)
        plan.apply(ended)

    try:
        job = finish(repo, job_id, attempt_n, state, outcome, evidence, verify, head, sink,
                     stop_reason=(stall.reason if stall.stopped
                                  and not lifecycle.stop_asked(state_dir, job_id) else None),
                     then=then)
    except BaseException:
        plan.undo()  # no record of the next attempt: its slot entry and money go back
        raise
    retrying = plan.confirm(job)
    privatetext.discard(state_dir, job_id, attempt_n)
    phases.mark("record")
    faults.point("after_final_record")
    attempt = job.state.attempts[attempt_n - 1]
    if attempt.rid:
        ledger.close(state_dir, attempt.rid, attempt.cost.charged, reason=state)
    phases.mark("ledger")
    if retrying:  # the job goes on: its note is written when its loop ends
        sink({"type": "state", "state": "retrying", "attempt": attempt_n + 1,
              "why": checks.failure_text(found) or "verify failed"})
        return
    notes.ensure_notes_config(repo)  # first use sets notes.subtask.mergeStrategy (never rewriteRef)
    notes.write_for_job(repo, job)
    phases.mark("note")
    if job.spec.readonly:
        git(repo.root, "worktree", "remove", "--force", str(worktree), check=False)
        overlay.forget(repo, job_id)
    sink({"type": "state", "state": attempt.state})
    phases.mark("terminal_event")
    notify.attempt_ended(repo, job, attempt_n)  # `finish` wrote the end: told once, here
    pack_refs_when_many(repo)


def finish(repo: Repo, job_id: str, attempt_n: int, state: str, outcome: Outcome, evidence: Evidence | None,
           verify: VerifyResult | None, head: str | None, sink: EventSink, stop_reason: str | None = None,
           then: Callable[[Job], None] | None = None) -> Job:
    """Write the final record once: state, cost, evidence, summary, events tail; `then(job)`
    adds to that same write (the verify loop's next attempt: `retries.Plan.apply`)."""
    def change(job: Job) -> bool:
        attempt = job.state.current
        if attempt.n != attempt_n or attempt.terminal:
            return False
        reason = redact(outcome.error) if outcome.error else None
        if state == "stopped":
            # `stop` may kill the engine's group before the worker's SIGTERM lands: the engine
            # then says "exited with code -15", which is the stop, not a reason of its own.
            reason = stop_reason or "stopped by request"
        attempt.finish(state, reason=reason, error_kind=outcome.error_kind if state == "failed" else None,
                       hint=(outcome.hint or None) if state == "failed" else None, outcome=outcome.outcome,
                       session_id=outcome.session_id or attempt.session_id, model=outcome.model,
                       turns=outcome.turns, tokens=outcome.tokens, head=head, verify=verify,
                       totals=outcome.totals or None)
        settle_outcome(job, attempt, outcome)
        if evidence is not None:
            evidence.state = state
            evidence.cost = attempt.cost.to_dict()
            job.evidence = evidence
        job.summary = redact(outcome.summary or "")
        job.events_tail = "\n".join(sink.tail) + ("\n" if sink.tail else "")
        if then is not None:
            then(job)
        return True

    return records.update(repo, job_id, change, lock_wait=owner_lock_wait(repo))


def _record_checks(job: Job, found: list[dict] | None) -> None:
    if found is not None:
        job.state.current.checks = found


PACK_REFS_OVER = 1000


def pack_refs_when_many(repo: Repo) -> None:
    """Pack refs once many job refs are loose: listing 10,000 loose refs costs ~0.2 s more."""
    try:
        loose = sum(1 for _ in os.scandir(repo.common_dir / "refs" / "subtask"))
    except OSError:
        return
    if loose > PACK_REFS_OVER:
        git(repo.root, "pack-refs", "--all", check=False)
        # Packing prunes the emptied refs/heads/subtask/; a confined job still running could not
        # create it again (only the folder itself is granted), so its next commit would fail.
        (repo.common_dir / "refs" / "heads" / "subtask").mkdir(parents=True, exist_ok=True)
