"""Money is exact (`subtask/model/money.py`): amounts are decimals to the micro-dollar from where
they enter (an engine's report, a record, a ledger row) to where they are shown, so the rows a
person reads add up to the total they read; amounts that earlier versions wrote with float noise
read as what they meant."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from subtask.git.records import Job
from subtask.model import money
from subtask.model.job import Attempt, Cost, JobSpec, JobState
from subtask.state import ledger
from subtask.words import job_cost, note_block, result_text

NOISY = 0.13499999999999998  # what 0.27 - 0.135 and its kind left in records and ledger rows


def _job_written_by_an_earlier_version(charges: list[float]) -> Job:
    """A job read from record JSON whose attempts' amounts carry float noise."""
    spec = JobSpec(id="st-00000001", task="t", engine="claude", base_ref="HEAD", base="0" * 40, branch=None,
                   worktree="/w", repo="/r", created_at=0.0, retries=len(charges) - 1)
    attempts = [Attempt.from_dict({"n": n, "state": "failed" if n < len(charges) else "done", "message": "m",
                                   "queued_at": 0.0, "started_at": 1.0, "ended_at": 2.0, "rid": f"st-00000001.{n}",
                                   "cost": {"v": 1, "reserved": 1.0, "observed": c, "charged": c,
                                            "billing": "observed"}})
                for n, c in enumerate(charges, 1)]
    return Job(spec, JobState(attempts=attempts), None, "", "", None)


def _amounts(line: str) -> list[Decimal]:
    return [Decimal(a) for a in re.findall(r"\$(\d+\.\d+)", line)]


def test_the_attempt_rows_add_up_to_the_job_total_as_shown():
    """Issue 38, money 4: two attempts charged 0.13499999999999998 each showed as $0.13 and $0.13
    against a job total of $0.27."""
    job = _job_written_by_an_earlier_version([NOISY, NOISY])
    assert job_cost(job) == Decimal("0.27")
    text = result_text(job)
    rows = next(line for line in text.splitlines() if line.startswith("attempts: ")).split(" | ")
    total = _amounts(text.splitlines()[0])
    assert total == [Decimal("0.27")]
    assert sum(_amounts(row)[0] for row in rows) == total[0], text
    note = note_block(job)
    assert "$0.135 observed · job $0.27 over 2 attempts" in note, note


def test_amounts_are_shown_exactly_cents_when_they_are_whole_cents():
    assert [money.text(v) for v in (0.27, NOISY, 0.00176, 2, Decimal("1.5"), -3.0, None)] == \
        ["$0.27", "$0.135", "$0.00176", "$2.00", "$1.50", "$-3.00", "-"]
    assert [money.plain(v) for v in (1e9, 2.5, NOISY, 0)] == ["1000000000", "2.5", "0.135", "0"]


def test_a_record_reads_amounts_to_the_micro_dollar_and_writes_them_exactly():
    cost = Cost.from_dict({"v": 1, "reserved": 2.0, "observed": NOISY, "charged": NOISY, "credit": "lots"})
    assert (cost.charged, cost.observed, cost.credit) == (Decimal("0.135"), Decimal("0.135"), None)
    assert json.dumps(cost.to_dict())  # no Decimal leaks into JSON
    assert '"charged": 0.135' in json.dumps(cost.to_dict())
    damaged = Cost.from_dict({"reserved": "2", "charged": float("nan"), "observed": True})
    assert (damaged.reserved, damaged.charged, damaged.observed) == (0, None, None)


def test_amounts_never_mix_with_floats_unnoticed():
    """A float that skipped `money.usd` fails loudly instead of adding noise."""
    with pytest.raises(TypeError):
        money.usd(0.1) + 0.2  # noqa: B018


def test_ledger_rows_written_with_float_noise_add_up_exactly(tmp_path: Path):
    state = tmp_path / "state"
    state.mkdir()
    rows = [{"v": 1, "op": "reserve", "rid": f"j.{n}", "job": "j", "attempt": n, "engine": "claude", "usd": 1.0,
             "month": "2025-11", "at": "2025-11-01T00:00:00+00:00"} for n in (1, 2)]
    rows += [{"v": 1, "op": "close", "rid": f"j.{n}", "usd_charged": NOISY, "observed": NOISY, "month": "2025-11",
              "at": "2025-11-01T00:00:00+00:00", "reason": "done"} for n in (1, 2)]
    (state / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spend = ledger.summary(state, 0.3, "2025-11")
    assert (spend.committed_usd, spend.left_usd) == (Decimal("0.27"), Decimal("0.03"))
    assert spend.to_dict()["committed_usd"] == 0.27 and spend.per_engine["claude"]["committed"] == Decimal("0.27")
    # a new close row holds the exact amount as its JSON number
    ledger.reserve(state, job="k", attempt=1, engine="codex", usd=0.03, cap_usd=0.3)
    ledger.close(state, "k.1", Decimal("0.27") - Decimal("0.135") - Decimal("0.125"))
    assert '"usd_charged":0.01,' in (state / "ledger.jsonl").read_text().splitlines()[-1]
