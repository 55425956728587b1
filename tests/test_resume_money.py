"""A resumed session's money (`worker.charge.resume_point`, `settle_cost`): each attempt is charged
its own share of the session's running figures, what attempts in between were charged without a
figure is credited, and nothing is ever charged twice or below zero."""

from __future__ import annotations

from decimal import Decimal

import pytest

from subtask.engines.base import Baseline
from subtask.git.records import Job
from subtask.model.job import Attempt, Cost, JobSpec, JobState
from subtask.worker.charge import resume_point, settle_cost


def attempt(n: int, *, session=None, totals=None, charged=None, state="done", reserved=2.0) -> Attempt:
    return Attempt(n=n, state=state, message="m", queued_at=0.0, session_id=session, totals=totals,
                   rid=f"st-00000001.{n}", cost=Cost(reserved=reserved, charged=charged))


def job_of(*attempts: Attempt) -> Job:
    spec = JobSpec(id="st-00000001", task="t", engine="claude", base_ref="HEAD", base="0" * 40, branch=None,
                   worktree="/w", repo="/r", created_at=0.0)
    return Job(spec, JobState(attempts=list(attempts)), None, "", "", None)


def test_a_reply_resumes_the_latest_session_from_its_last_report():
    job = job_of(attempt(1, session="A", totals={"session_id": "A", "cost_usd": 1.0}, charged=1.0),
                 attempt(2, session="A", totals={"session_id": "A", "cost_usd": 1.5}, charged=0.5),
                 attempt(3, state="running"))
    assert resume_point(job) == ("A", Baseline("A", 1.5), 0.0)


def test_attempts_that_reported_nothing_since_are_credited():
    """Attempt 2 was killed before it reported: charged its whole reservation, yet its spend is
    in attempt 3's running total (Claude Code restores it from the transcript)."""
    job = job_of(attempt(1, session="A", totals={"session_id": "A", "cost_usd": 1.0}, charged=1.0),
                 attempt(2, session="A", charged=2.0, state="stopped"),
                 attempt(3, state="running"))
    assert resume_point(job) == ("A", Baseline("A", 1.0), 2.0)


def test_a_session_found_only_before_a_worker_died_is_still_resumed():
    job = job_of(attempt(1, session="A", totals={"session_id": "A", "cost_usd": 1.0}, charged=1.0),
                 attempt(2, charged=2.0, state="failed"),  # its worker died: no session recorded
                 attempt(3, state="running"))
    assert resume_point(job) == ("A", Baseline("A", 1.0), 2.0)


def test_no_session_gives_no_baseline_and_another_sessions_figures_count_from_zero():
    assert resume_point(job_of(attempt(1, state="running"))) == (None, None, 0)
    job = job_of(attempt(1, session="A", totals={"session_id": "B", "cost_usd": 1.0}, charged=1.0),
                 attempt(2, state="running"))
    assert resume_point(job) == ("A", Baseline.start("A"), 0)


def test_a_session_no_attempt_reported_for_counts_from_zero_and_credits_what_its_attempts_were_charged():
    """Issue 38, money 1: attempt 1 was killed before it reported (charged its reservation, or
    what its record says); Claude Code's report on resume counts that run's calls again. The
    credit holds also when no attempt of the session ever recorded totals."""
    job = job_of(attempt(1, session="A", charged=0.09, state="failed"), attempt(2, state="running"))
    assert resume_point(job) == ("A", Baseline.start("A"), Decimal("0.09"))
    job = job_of(attempt(1, session="A", totals="damaged", charged=1.0), attempt(2, state="running"))
    assert resume_point(job) == ("A", Baseline.start("A"), 1)
    # an attempt before the session's first one belongs to another session: never credited
    job = job_of(attempt(1, charged=2.0, state="failed"), attempt(2, session="A", charged=0.5, state="stopped"),
                 attempt(3, state="running"))
    assert resume_point(job) == ("A", Baseline.start("A"), Decimal("0.5"))


@pytest.mark.parametrize("observed, credit, charged, kept", [
    (0.5, 0.0, 0.5, None),     # its own share, as observed
    (2.5, 2.0, 0.5, 2.0),      # 2.0 of it was charged to the attempt in between
    (1.5, 2.0, 0.0, 1.5),      # all of it was: never below zero
    (9.0, 0.0, 2.0, None),     # capped at the reservation
])
def test_a_credit_comes_off_an_observed_share(observed, credit, charged, kept):
    current = attempt(3, state="done")
    settle_cost(current, observed, credit=credit)
    assert current.cost.charged == pytest.approx(charged) and current.cost.billing == "observed"
    assert current.cost.credit == kept


def test_an_unknown_cost_is_the_reservation_unless_a_stalled_engine_was_never_answered():
    current = attempt(1, state="stopped")
    settle_cost(current, None, credit=1.0)
    assert (current.cost.charged, current.cost.billing) == (2.0, "charged")
    current = attempt(1, state="stopped")
    settle_cost(current, None, never_billed=True)
    assert (current.cost.charged, current.cost.billing) == (0.0, "not_billed")


def test_a_figure_below_its_baseline_is_taken_whole():
    base = Baseline("A", cost_usd=1.0, tokens={"input": 100, "output": 10})
    assert base.cost_since(1.25) == (0.25, True)
    assert base.cost_since(0.5) == (0.5, False)
    assert base.cost_since(None) == (None, False)
    assert base.tokens_since({"input": 150, "output": 12}) == ({"input": 50, "output": 2}, True)
    assert base.tokens_since({"input": 50, "output": 12}) == ({"input": 50, "output": 12}, False)


def test_damaged_totals_and_stall_marks_read_as_absent_and_render():
    """A record is input: a teammate's or a damaged one may hold anything in these fields."""
    from subtask.words import one_line, show_text

    read = Attempt.from_dict({"n": 1, "state": "running", "message": "m", "queued_at": 0.0,
                              "totals": 5, "stalled": "yes"})
    assert read.totals is None and read.stalled is None
    odd = Attempt.from_dict({"n": 1, "state": "running", "message": "m", "queued_at": 0.0,
                             "stalled": {"since": "then", "after": "long"}})
    job = job_of(odd)
    assert "running (stalled: no event from the engine for -)" in one_line(job)
    assert "stalled" in show_text(job)
