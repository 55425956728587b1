"""The verify loop (`start --retries N`, docs/verify.md): the worker retries while verify fails.

When an attempt of a job with retries ends and its verify failed (or a check on its diff did),
its worker decides, before it writes the attempt's final record (`after_attempt`):

- retry: the next attempt of the same job, in the same worktree, by the same worker. An engine
  with sessions (claude, codex) resumes its session with a message that holds the verify command,
  its exit and the tail of its output; the others run the task again with
  `SUBTASK_VERIFY_OUTPUT` naming a private file that holds the same. A retry reserves money as a
  reply does and is refused, not started, when the job's budget or the monthly cap cannot hold it;
- or stop, saying why (`Attempt.not_retried`): no retries left, the attempt changed nothing, a
  refusal. When every attempt of the loop failed, the branch is left at the attempt whose verify
  did best (most tests passed where the output says so, else the last) and `JobState.best` says
  which; every attempt's head keeps a pin (`refs/subtask/<id>/attempts/<n>`), so no commit is lost.

Invariants:
- Never let a job look ended between two attempts of its verify loop, because `wait`, a group's
  settling and `merge` act on the first terminal state they read: the attempt's final record and
  the next attempt are one compare-and-swap (`Plan.apply` inside `finish.finish`) (tests:
  `verify_loop::test_a_shell_job_that_passes_on_its_second_run_ends_done_after_two_attempts`).
- Never reserve a retry's money before its slot entry says so, nor leave either when the record
  did not take the retry, because a crash would leak a slot or money: the worker renames its own
  slot entry (job, n) to (job, n+1) under the slots lock, saves it, then reserves under the ledger
  lock (as `start`); a failed record write gives both back; a worker killed in between leaves an
  entry whose attempt the record lacks, which `lifecycle.end_dead` ends (the retry's reservation
  released, its words dropped, the recorded attempt ended) (test:
  `verify_loop::test_a_worker_killed_after_reserving_a_retry_leaks_no_slot_and_no_money`).
- Never check a retry against the cap with the ending attempt's whole reservation, because a
  reply after it would not: the cap is raised by what that attempt's reservation holds beyond its
  charge, so a retry fits exactly where a reply would (test:
  `verify_loop::test_a_paid_retry_the_monthly_cap_cannot_hold_is_refused_with_nothing_reserved`).
- Never move a job's branch back to a better attempt but by compare-and-swap on the head the
  worker recorded, because a commit made meanwhile must survive; and only after every attempt's
  head is pinned (`refs/subtask/<id>/attempts/<n>`), with its worktree's index and files (git
  through the checked admin folder): a worktree left at the later attempt's files would be
  committed back by the next reply's autocommit. The metadata is checked again for that move,
  because the attempt's verify ran since the last check (a smudge filter it wrote ran
  unconfined) (`verify_loop::test_the_branch_is_not_moved_back_*`).
- Never decide on what the engine said (its summary, its STATUS line): only verify and the checks.
"""

from __future__ import annotations

import copy
import os
import time
from decimal import Decimal

from subtask.engines import get_engine
from subtask.engines.base import resumes
from subtask.git import checks, records, worktrees
from subtask.git.gitrepo import Repo
from subtask.git.records import Job
from subtask.model import claims, faults, money
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.model.job import Attempt, Cost, VerifyResult, runs_remotely
from subtask.model.transaction import Transaction
from subtask.ops.running import lifecycle, spending
from subtask.state import ledger, paths, privatetext, slots
from subtask.words import judge_line

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any

VERIFY_OUTPUT_ENV = "SUBTASK_VERIFY_OUTPUT"
RETRY_ENV = "SUBTASK_RETRY"
MESSAGE_TAIL = 3000  # characters of verify's output in a retry's message (the record keeps 4 KiB)


def loop_of(job: Job) -> list[Attempt]:
    """The attempts of the current loop: from the last one a person started (start, reply) on."""
    attempts = job.state.attempts
    first = max((i for i, a in enumerate(attempts) if not a.retry), default=0)
    return attempts[first:]


@dataclass
class Facts:
    """What the worker knows of the attempt that just ended, before its record is written."""

    state: str  # done | failed | stopped, as it is about to be recorded
    verify: VerifyResult | None
    head: str  # the job's branch tip now
    started_from: str  # the branch tip when the attempt's engine started
    charged: Decimal | None  # what the attempt is about to be charged (paid engines)
    checks: list[dict] | None = None  # each check's result on the attempt's diff
    session_id: str | None = None  # the engine's session, as the attempt's engine reported it


@dataclass
class Plan:
    """The worker's decision for one ended attempt: the next attempt (reserved, its slot entry
    renamed), or why none; and where the job's branch is left."""

    head: str  # the job's head once the attempt's record is written
    next: Attempt | None = None
    not_retried: str | None = None
    best: dict[str, Any] | None = None
    best_verify: VerifyResult | None = None  # the verify of the attempt `best` names
    reserved: Transaction = field(default_factory=Transaction)  # the next attempt's, until its record takes it

    def apply(self, job: Job) -> None:
        """Inside the final record's compare-and-swap (pure: it may run more than once)."""
        attempt = job.state.current
        if self.not_retried:
            attempt.not_retried = self.not_retried
        # set, or cleared: a loop that passed (a reply's, after a failed one) is left at its own end
        job.state.best = dict(self.best) if self.best is not None else None
        if self.next is not None:
            job.state.attempts.append(copy.deepcopy(self.next))

    def confirm(self, job: Job | None) -> bool:
        """After the final write: True when the record took the next attempt; else its slot
        entry and reservation are given back (also when the write failed: `job` None)."""
        if self.next is not None and job is not None and job.state.current.n == self.next.n:
            return True
        self.undo()
        return False

    def undo(self) -> None:
        """Give back the next attempt's slot entry, money and words: it will not run."""
        self.reserved.undo()
        self.next = None


def after_attempt(repo: Repo, job: Job, facts: Facts, admin, worktree) -> Plan:
    """Decide what follows the attempt that just ended (see the module docstring)."""
    plan = Plan(facts.head)
    if not job.spec.retries or facts.state == "stopped":
        return plan
    verify = facts.verify
    if verify is not None and verify.passed and facts.state == "done":
        return plan
    loop = loop_of(job)
    if verify is not None:  # verify failed: retry, unless there is a reason not to
        reason = _why_not(repo, job, facts, len(loop) - 1)
        if reason is None:
            reason = _reserve_next_or_why_not(repo, job, facts, verify, plan)
        if reason is None:
            return plan
        plan.not_retried = reason
    if len(loop) > 1:
        _leave_at_best(repo, job, facts, plan, loop, admin, worktree)
    return plan


def _reserve_next_or_why_not(repo: Repo, job: Job, facts: Facts, verify: VerifyResult, plan: Plan) -> str | None:
    """`_reserve_next`, whose failure half-way gives back what it reserved: the job then ends with
    this attempt's verdict and says why it was not retried (an interrupt goes on up, undone)."""
    try:
        return _reserve_next(repo, job, facts, verify, plan)
    except Exception as exc:
        plan.undo()
        return f"could not reserve the next attempt: {getattr(exc, 'message', exc)}"
    except BaseException:
        plan.undo()
        raise


def _why_not(repo: Repo, job: Job, facts: Facts, used: int) -> str | None:
    if facts.head == facts.started_from:
        return "it changed nothing"
    if used >= job.spec.retries:
        return f"no retries left ({job.spec.retries} used)"
    if lifecycle.stop_asked(repo.state_dir, job.id):
        return "a stop was asked"
    return None


# ---------------------------------------------------------------- the next attempt

def retry_message(job: Job, verify: VerifyResult, checks_results: list[dict] | None, retry: int) -> str:
    """What a resumed session is told: what verify said, and what to do about it."""
    failed = checks.failure_text(checks_results)
    lines = [f"git-subtask ran the verify command on your work and it failed, so it resumed this session "
             f"(retry {retry} of {job.spec.retries}).", verify_report(verify, failed, MESSAGE_TAIL),
             "Fix the cause. Do not delete, skip or weaken tests, and do not silence warnings to get there"
             + (" (verify runs the tests as they are in your base, whatever you change in them)"
                if isinstance(verify.harness, dict) and verify.harness.get("source") != "job" else "")
             + ". Commit your work, then end as before: a short summary and the STATUS line."]
    return "\n\n".join(lines)


def verify_report(verify: VerifyResult, failed_checks: str, tail: int) -> str:
    """`verify: CMD -> exit 1 on 1a2b3c4`, the failed checks, and the end of its output."""
    ending = "timed out" if verify.timed_out else f"exit {verify.exit_code}"
    lines = [f"verify: {verify.command} -> {ending} on {verify.head[:7]}"]
    judged = judge_line(verify)
    if judged:  # the output below is the trusted tests': changes to them were not what judged it
        lines.append(f"judge: {judged}")
    if failed_checks:
        lines.append(f"checks: {failed_checks}")
    output = (verify.output_tail or "").strip()
    if output:
        lines += ["its output ended with:", output[-tail:]]
    return "\n".join(lines)


def _reserve_next(repo: Repo, job: Job, facts: Facts, verify: VerifyResult,
                  plan: Plan) -> str | None:
    """Reserve the next attempt (slot, then money) and keep its words, after `verify` failed; None
    when it is ready, else the refusal."""
    state_dir = repo.state_dir
    attempt = job.state.current
    engine = get_engine(job.spec.engine, repo.config)
    n, retry = attempt.n + 1, len(loop_of(job))
    # On a cluster node the job holds no slot here, and its loop's money was reserved at home
    # with the job (executors/ray.py `reserve`): the retry runs in the same Ray job.
    elsewhere = runs_remotely(job)
    usd = money.ZERO
    if engine.paid:
        usd = attempt.max_usd if attempt.max_usd is not None else (job.spec.max_usd or money.ZERO)
        cap = spending.setting_usd(repo, "maxJobUsd")
        if usd > cap and not elsewhere:
            return f"refused: its budget {money.text(usd)} is above subtask.maxJobUsd={money.text(cap)}"
        if not elsewhere:
            spending.sync_ledger(repo)  # restored from the records if the state folder lost it (slow: no lock held)
    checks_results = facts.checks
    resumed = resumes(engine) and bool(facts.session_id or any(a.session_id for a in job.state.attempts))
    stored = retry_message(job, verify, checks_results, retry) if resumed else attempt.message
    as_written = stored if resumed else privatetext.message(state_dir, job.id, attempt)
    refusal = None if elsewhere else _take_slot_and_money(repo, job, n, usd if engine.paid else None, facts, plan)
    if refusal:
        return refusal
    nxt = Attempt(n=n, state="running", message=stored, queued_at=time.time(),
                  cost=Cost(reserved=usd, billing="reserved") if engine.paid else Cost(),
                  rid=paths.reservation_id(job.id, n) if engine.paid else None, timeout=attempt.timeout,
                  max_usd=usd if engine.paid else None, retry=retry)
    if elsewhere:  # the same Ray job on the same node runs it: home follows it by that job
        nxt.extra.update({key: attempt.extra[key] for key in ("ray_job", "node") if key in attempt.extra})
    plan.next = nxt
    verify_as_written = privatetext.verify(state_dir, job.id, attempt.n, job.spec.verify)
    plan.reserved.done("retry_reserved", lambda: privatetext.discard(state_dir, job.id, n))  # before: a half write too
    privatetext.keep(state_dir, job.id, n, message=as_written, stored_message=stored,
                     verify=verify_as_written, stored_verify=job.spec.verify)
    privatetext.keep_verify_output(state_dir, job.id, n, verify_report(verify, checks.failure_text(checks_results),
                                                                        len(verify.output_tail or "")) + "\n")
    faults.point("after_retry_reserved")
    return None


def _take_slot_and_money(repo: Repo, job: Job, n: int, usd: Decimal | None, facts: Facts, plan: Plan) -> str | None:
    """Rename the worker's slot entry to attempt `n` and reserve `usd` (None: a free engine), in
    the one critical section (slots, then ledger); the refusal, or None (and `plan` can undo it)."""
    state_dir, old = repo.state_dir, n - 1
    rebuild = lambda: lifecycle.rebuild_slots(repo)  # noqa: E731
    refusal = None
    with slots.transaction(state_dir, rebuild=rebuild) as current:
        entry = next((e for e in current.running if e["job"] == job.id and e["attempt"] == old), None)
        if entry is None:
            return "refused: this attempt holds no slot any more"
        entry["attempt"] = n
        if usd is not None:
            slots.save(state_dir, current)  # the entry is on disk before the money is reserved
            try:
                _reserve(repo, job, n, usd, facts)
            except SubtaskError as exc:
                entry["attempt"] = old
                refusal = f"refused: {exc.message}"
            except BaseException:
                entry["attempt"] = old
                slots.save(state_dir, current)
                raise
    if refusal:
        return refusal

    def give_back() -> None:
        with slots.transaction(state_dir, rebuild=rebuild) as current:
            for e in current.running:
                if e["job"] == job.id and e["attempt"] == n:
                    e["attempt"] = old
        if usd is not None:
            ledger.close(state_dir, paths.reservation_id(job.id, n), money.ZERO, reason="retry not started")

    plan.reserved.done("retry_slot_and_money", give_back)
    return None


def _reserve(repo: Repo, job: Job, n: int, usd: Decimal, facts: Facts) -> None:
    """Reserve under the cap, counting the ending attempt at its charge: the cap is checked as
    if its reservation were already closed, as it will be once its record is written."""
    attempt = job.state.current
    slack = money.ZERO
    if attempt.rid and facts.charged is not None:
        slack = max(money.ZERO, attempt.cost.reserved - facts.charged)
    cap = spending.setting_usd(repo, "monthlyCapUsd")
    with ledger.lock(repo.state_dir):
        ledger.reserve_locked(repo.state_dir, job=job.id, attempt=n, engine=job.spec.engine, usd=usd,
                              cap_usd=cap + slack, now=spending.reserved_at(time.time()))


def env_for(state_dir, job: Job) -> dict[str, str]:
    """What a retry's engine (and its verify) gets in its environment: which retry, and the file
    that says what verify said about the attempt before it."""
    attempt = job.state.current
    if not attempt.retry:
        return {}
    env = {RETRY_ENV: str(attempt.retry)}
    path = privatetext.verify_output_path(state_dir, job.id, attempt.n)
    if os.path.exists(path):
        env[VERIFY_OUTPUT_ENV] = path
    return env


def retry_to_run(job: Job, ended: int) -> bool:
    """Does the record (read after attempt `ended`) hold a retry of it for its worker to run?"""
    current = job.state.current
    return current.n == ended + 1 and bool(current.retry) and current.state == "running"


# ---------------------------------------------------------------- the best attempt

def pin_attempt(repo: Repo, job: Job, head: str) -> None:
    """Keep this attempt's head alive whatever happens to the branch (a job with retries)."""
    if job.spec.retries and head != job.spec.base:
        records.pin_attempt(repo, job.id, job.state.current.n, head)


def _leave_at_best(repo: Repo, job: Job, facts: Facts, plan: Plan, loop: list[Attempt], admin, worktree) -> None:
    """Every attempt of the loop failed: leave the branch at the one whose verify did best."""
    tried = [(a.n, a.verify, a.head) for a in loop[:-1]] + [(job.state.current.n, facts.verify, facts.head)]
    usable = [(n, v, h) for n, v, h in tried if v is not None and h and not v.checks_failed]
    if not usable:
        return
    counted = [(counts, n, v, h) for n, v, h in usable
               if (counts := claims.test_counts(v.output_tail)) is not None]
    if counted:
        counts, n, verify, head = max(counted, key=lambda c: (c[0].passed, -c[0].failed, c[1]))
        why = f"most tests passed ({counts.words()})"
    else:
        n, verify, head = usable[-1]
        why = "the last whose verify ran (its output gives no test counts)"
    plan.best = {"attempt": n, "head": head, "why": why, "moved_from": None}
    plan.best_verify = verify
    if head == facts.head:
        return
    try:
        moved = admin is not None and _move_branch(repo, job, worktree, facts.head, head)
    except worktrees.MetadataChanged as exc:
        plan.best["why"] += ("; the branch was left where it was: "
                             f"its verify changed its worktree's git metadata ({exc})")
        return
    if moved:
        plan.best["moved_from"] = facts.head
        plan.head = head
    else:
        plan.best["why"] += "; the branch was left where it was (it moved, or its worktree could not follow)"


def _move_branch(repo: Repo, job: Job, worktree, old: str, new: str) -> bool:
    """Point the job's branch from `old` to `new` by compare-and-swap, then its worktree's index
    and files (git through the admin folder, never by discovery). The metadata is checked again
    here (`MetadataChanged`), because the attempt's verify ran since the worker last checked it."""
    admin = worktrees.check_metadata(repo, job.id, worktree, job.spec.branch, job.spec.base)
    for attempt in loop_of(job)[:-1]:
        if attempt.head and attempt.head != job.spec.base:
            records.pin_attempt(repo, job.id, attempt.n, attempt.head)
    pin_attempt(repo, job, old)
    if not records.cas_ref(repo, f"refs/heads/{job.spec.branch}", old, new,
                           f"subtask: left at attempt with the best verify ({new[:7]})"):
        return False
    if worktrees.job_git(repo, admin, worktree, "read-tree", "--reset", "-u", new, check=False).returncode == 0:
        return True
    records.cas_ref(repo, f"refs/heads/{job.spec.branch}", new, old)  # the worktree still holds `old`
    return False
