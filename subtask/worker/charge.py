"""What an attempt is charged, in exact dollars, from what its engine observed (`settle_cost`):
capped at its reservation; the whole reservation when unknown; nothing when no engine process
ever ran, or when the engine saw no model answer and knows no cost. An attempt that resumes a
session is charged its own share of the session's running figures (`resume_point`: the
baseline, and the credit for what earlier attempts were charged without figures of their own).

Invariants:
- Never charge an engine that never started, because no process of it ever ran (`launched`
  False): the worker counts it as started once `on_pid`/`on_launch` reports a process (a dead
  worker is still charged on `engine_started_at`, since its engine may have run).
- Never charge a resumed attempt what its engine reported for the session, because Claude Code
  (`total_cost_usd`) and Codex (`turn.completed` usage) report a resumed session's running
  totals: each attempt records the totals (`Attempt.totals`) and is charged its report minus the
  last recorded one (from zero when no attempt of the session recorded one), less what its
  attempts in between were charged without a report, the first one killed included (tests:
  `engines_e2e::test_a_killed_first_attempt_is_credited_when_the_session_is_resumed`,
  `engines_e2e::test_a_resumed_claude_session_is_charged_each_runs_own_share_exactly` (a fake CLI:
  always runs), `engines_e2e::test_real_claude_code_cli_replies_are_each_charged_their_own_turns`,
  `engines_e2e::test_real_codex_replies_are_each_charged_their_own_tokens`,
  `engine_codex::test_recorded_real_run_and_resume_give_each_attempt_its_own_tokens`).
- `charge_of` settles a copy exactly as `finish` will settle the record: the verify loop's cap
  check sees the charge the record gets.
- Never take a figure below its baseline as a negative share, because it is no running total
  (a new session, or per-run reporting): it is the attempt's own, whole.
- Never charge an attempt whose engine saw no model answer and knows no cost, however it ended (a
  timeout, an exit, a stall), because an API it could not reach billed nothing: `Outcome.billed
  is False` settles at $0 (`not_billed`); an engine that cannot tell (`None`) is charged by the
  usual rule (tests: `engines_e2e::test_a_codex_run_its_api_never_answered_is_charged_nothing_however_it_ended`,
  `engines_e2e::test_a_claude_run_the_model_never_answered_is_charged_nothing_however_it_ended`).
"""

from __future__ import annotations

import copy
from decimal import Decimal

from subtask.engines.base import Baseline, Outcome
from subtask.git.records import Job
from subtask.model import money


def resume_point(job: Job) -> tuple[str | None, Baseline | None, Decimal]:
    """What a reply resumes: the session of the latest earlier attempt that has one; the figures
    that session last reported (the baseline of this attempt's own share; `Baseline.start` when
    no attempt of it recorded any); and what its attempts since then were charged without figures
    of their own (killed, timed out), which the engine's next running total includes again: that
    much is credited, so nothing is charged twice.

    The session's attempts are those from the first that names it on: an earlier one belongs to
    another session (a reply resumes only a session that an attempt named), and one in between
    that names none (its worker died before it could) resumed this one, the latest there was."""
    earlier = job.state.attempts[:-1]
    session = next((a.session_id for a in reversed(earlier) if a.session_id), None)
    if session is None:
        return None, None, money.ZERO
    first = next(i for i, a in enumerate(earlier) if a.session_id == session)
    unreported: list[Decimal] = []
    for attempt in reversed(earlier[first:]):
        baseline = Baseline.from_totals(attempt.totals)
        if baseline is not None and baseline.session_id == session:
            return session, baseline, money.total(unreported)
        if baseline is not None or attempt.session_id not in (None, session):
            break  # figures of another session: nothing before it is in this one's total
        unreported.append(charged_so_far(attempt))
    return session, Baseline.start(session), money.total(unreported)


def charged_so_far(attempt) -> Decimal:
    """What an ended attempt was charged, as its record (and the ledger's close) says: its whole
    reservation when the record knows no charge."""
    if attempt.cost.charged is not None:
        return attempt.cost.charged
    return attempt.cost.reserved if attempt.rid else money.ZERO


def charge_of(job: Job, outcome: Outcome) -> Decimal | None:
    """What the current attempt is about to be charged (`finish` settles it the same way)."""
    attempt = copy.deepcopy(job.state.current)
    settle_outcome(job, attempt, outcome)
    return attempt.cost.charged


def settle_outcome(job: Job, attempt, outcome: Outcome) -> None:
    """`settle_cost` with what the engine said: the credit applies to a share of the resumed
    session's running figures; an engine that saw no answer is never billed."""
    settle_cost(attempt, outcome.cost_usd, launched=outcome.launched,
                credit=resume_point(job)[2] if outcome.since_baseline else money.ZERO,
                never_billed=outcome.billed is False)


def settle_cost(attempt, observed: object, *, launched: bool = True, credit: object = money.ZERO,
                never_billed: bool = False) -> None:
    """The attempt's charge from what its engine observed, in exact dollars: capped at the
    reservation; the whole reservation when unknown; nothing when no engine process ever ran, or
    when the engine saw no model answer and knows no cost (`never_billed`: an API it could not
    reach, however the attempt ended); `credit` (charged already, see `resume_point`) is taken
    off an observed share of a resumed session."""
    cost = attempt.cost
    observed, credit = money.usd(observed), money.usd(credit) or money.ZERO
    cost.observed = observed
    if attempt.rid and not launched:
        # Not installed, or failed to launch: no process of the engine ever ran, nothing was spent.
        cost.charged, cost.billing = money.ZERO, "not_started"
        attempt.engine_started_at = None
        return
    if not attempt.rid:
        cost.billing = "free"
        cost.charged = money.ZERO if observed is None else None
        return
    if observed is None or observed < 0:  # unknown
        if never_billed:
            cost.charged, cost.billing = money.ZERO, "not_billed"
        else:
            cost.charged, cost.billing = cost.reserved, "charged"
        return
    if credit > 0:
        cost.credit = min(credit, observed)
        observed = observed - cost.credit
    cost.charged, cost.billing = min(observed, cost.reserved), "observed"
