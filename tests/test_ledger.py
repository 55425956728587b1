"""Tests for subtask.state.ledger: caps, exactly-once settlement, months, torn rows, modes, concurrency."""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from subtask.model.errors import SubtaskError
from subtask.state import ledger

REPO = Path(__file__).resolve().parent.parent
NOV = datetime(2025, 11, 30, 23, 59, tzinfo=UTC)
DEC = datetime(2025, 12, 1, 0, 1, tzinfo=UTC)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


def rows(state_dir: Path) -> list[dict]:
    text = (state_dir / "ledger.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def res(state_dir: Path, job: str = "j", attempt: int = 1, usd: float = 5.0, cap: float = 100.0,
        engine: str = "claude", now: datetime | None = NOV) -> ledger.Reservation:
    return ledger.reserve(state_dir, job=job, attempt=attempt, engine=engine, usd=usd,
                          cap_usd=cap, now=now)


# ---------------------------------------------------------------- reserving


def test_reserve_writes_one_row_and_counts_as_open(state: Path) -> None:
    r = res(state, job="fix-bug", attempt=2, usd=3.5)
    assert r == ledger.Reservation("fix-bug.2", "fix-bug", 2, "claude", 3.5, "2025-11")
    (row,) = rows(state)
    assert row == {"v": 1, "op": "reserve", "rid": "fix-bug.2", "job": "fix-bug", "attempt": 2,
                   "engine": "claude", "usd": 3.5, "month": "2025-11", "at": NOV.isoformat()}
    s = ledger.summary(state, 10.0, now=NOV)
    assert (s.committed_usd, s.open_usd, s.left_usd) == (0.0, 3.5, 6.5)
    assert s.open_reservations == [r]


def test_refusal_over_cap_names_the_numbers_and_writes_nothing(state: Path) -> None:
    res(state, job="a", usd=30.0, cap=50.0)
    ledger.close(state, "a.1", 20.0)
    res(state, job="b", usd=25.0, cap=50.0)
    with pytest.raises(SubtaskError) as exc:
        res(state, job="c", usd=10.0, cap=50.0)
    err = exc.value
    assert err.kind == "budget" and err.exit_code == 1
    assert err.hint == "git subtask spend"
    assert "would exceed the monthly cap" in err.message
    assert "$20.00 committed + $25.00 open + $10.00 requested > $50.00" in err.message
    assert len(rows(state)) == 3


def test_exact_fit_is_granted_despite_float_noise(state: Path) -> None:
    res(state, job="a", usd=0.1, cap=0.3)
    res(state, job="b", usd=0.2, cap=0.3)  # 0.1 + 0.2 == 0.30000000000000004 in floats
    with pytest.raises(SubtaskError):
        res(state, job="c", usd=0.01, cap=0.3)


@pytest.mark.parametrize("usd", [float("nan"), float("inf"), -1.0, "3", None, True])
def test_reserve_rejects_bad_amounts_as_usage(state: Path, usd: object) -> None:
    with pytest.raises(SubtaskError) as exc:
        res(state, usd=usd)  # type: ignore[arg-type]
    assert exc.value.kind == "usage"
    assert not (state / "ledger.jsonl").exists()


@pytest.mark.parametrize("cap", [float("nan"), None, "100", -1])
def test_a_group_check_against_a_bad_cap_is_a_usage_error(state: Path, cap: object) -> None:
    """A group's check of all its reservations at once refuses a cap that is not an amount as
    `reserve` does, in words, not a TypeError (mypy saw `money.usd` give None here)."""
    with ledger.lock(state), pytest.raises(SubtaskError) as exc:
        ledger.check_fits_locked(state, [1.0, 1.0], cap, what="2 jobs", now=NOV)
    assert exc.value.kind == "usage"
    assert "monthly cap" in exc.value.message
    assert not (state / "ledger.jsonl").exists()


def test_zero_reservation_is_allowed(state: Path) -> None:
    assert res(state, usd=0, cap=0).usd == 0.0


def test_same_rid_cannot_be_reserved_twice(state: Path) -> None:
    res(state, job="j", attempt=1)
    ledger.close(state, "j.1", 1.0)
    with pytest.raises(SubtaskError) as exc:
        res(state, job="j", attempt=1)
    assert exc.value.kind == "conflict"
    assert res(state, job="j", attempt=2).rid == "j.2"


# ---------------------------------------------------------------- closing


def test_close_charges_the_observed_cost(state: Path) -> None:
    res(state, usd=5.0)
    assert ledger.close(state, "j.1", 1.25, reason="done") == 1.25
    close_row = rows(state)[-1]
    assert close_row["op"] == "close" and close_row["v"] == 1
    assert (close_row["usd_charged"], close_row["observed"], close_row["reason"]) == (1.25, 1.25, "done")
    s = ledger.summary(state, 10.0, now=NOV)
    assert (s.committed_usd, s.open_usd, s.open_reservations) == (1.25, 0.0, [])


def test_settle_above_the_reservation_is_capped_at_it(state: Path) -> None:
    res(state, usd=5.0)
    assert ledger.close(state, "j.1", 8.0) == 5.0
    assert rows(state)[-1]["observed"] == 8.0
    assert ledger.summary(state, 10.0, now=NOV).committed_usd == 5.0


@pytest.mark.parametrize("cost", [None, float("nan"), float("inf"), float("-inf"), -1, -0.01, "x"])
def test_unknown_cost_charges_the_whole_reservation(state: Path, cost: object) -> None:
    res(state, usd=5.0)
    assert ledger.close(state, "j.1", cost) == 5.0  # type: ignore[arg-type]
    row = rows(state)[-1]
    assert row["usd_charged"] == 5.0
    # NaN/inf are not JSON; the row must stay parsable by any reader.
    assert row["observed"] is None or math.isfinite(row["observed"])


def test_charge_all_ignores_the_cost(state: Path) -> None:
    res(state, usd=5.0)
    assert ledger.close(state, "j.1", 1.0, charge_all=True, reason="killed") == 5.0


def test_release_is_close_at_zero(state: Path) -> None:
    res(state, usd=5.0, cap=5.0)
    assert ledger.close(state, "j.1", 0.0, reason="released") == 0.0
    s = ledger.summary(state, 5.0, now=NOV)
    assert (s.committed_usd, s.open_usd, s.left_usd) == (0.0, 0.0, 5.0)
    res(state, job="k", usd=5.0, cap=5.0)  # the released money is available again


def test_close_is_exactly_once(state: Path) -> None:
    res(state, usd=5.0)
    assert ledger.close(state, "j.1", 2.0) == 2.0
    assert ledger.close(state, "j.1", 4.0) is None
    assert ledger.close(state, "j.1", None) is None
    assert len(rows(state)) == 2
    assert ledger.summary(state, 10.0, now=NOV).committed_usd == 2.0


def test_close_of_unknown_rid_is_a_noop(state: Path) -> None:
    assert ledger.close(state, "nope.1", 1.0) is None
    res(state)
    assert ledger.close(state, "nope.1", 1.0) is None
    assert len(rows(state)) == 1


def test_duplicate_close_rows_in_the_file_count_once(state: Path) -> None:
    # Hand-edited or replayed files: the first close row wins.
    res(state, usd=5.0)
    ledger.close(state, "j.1", 2.0)
    path = state / "ledger.jsonl"
    last = path.read_text().splitlines()[-1]
    with path.open("a") as f:
        f.write(last.replace('"usd_charged":2.0', '"usd_charged":4.0') + "\n")
    assert ledger.summary(state, 10.0, now=NOV).committed_usd == 2.0


# ---------------------------------------------------------------- months


def test_reservation_closed_next_month_counts_in_its_own_month(state: Path) -> None:
    res(state, usd=6.0, cap=10.0, now=NOV)
    assert ledger.close(state, "j.1", 4.0, now=DEC) == 4.0
    assert rows(state)[-1]["month"] == "2025-11"
    nov = ledger.summary(state, 10.0, "2025-11")
    dec = ledger.summary(state, 10.0, "2025-12")
    assert (nov.committed_usd, nov.open_usd, nov.left_usd) == (4.0, 0.0, 6.0)
    assert (dec.committed_usd, dec.open_usd, dec.left_usd) == (0.0, 0.0, 10.0)


def test_open_reservation_from_last_month_does_not_eat_this_months_cap(state: Path) -> None:
    res(state, job="old", usd=10.0, cap=10.0, now=NOV)
    res(state, job="new", usd=10.0, cap=10.0, now=DEC)  # November's open $10 is November's
    assert [r.rid for r in ledger.open_reservations(state)] == ["old.1", "new.1"]
    assert ledger.summary(state, 10.0, now=DEC).open_reservations[0].rid == "new.1"


def test_now_is_read_in_utc(state: Path) -> None:
    paris = timezone(timedelta(hours=1))
    r = res(state, job="a", now=datetime(2025, 12, 1, 0, 30, tzinfo=paris))
    assert r.month == "2025-11"
    assert res(state, job="b", now=datetime(2025, 12, 1, 0, 30)).month == "2025-12"  # naive = UTC
    assert ledger.summary(state, 100.0, now=datetime(2025, 12, 1, 0, 30, tzinfo=paris)).open_usd == 5.0


def test_summary_rejects_a_malformed_month(state: Path) -> None:
    with pytest.raises(SubtaskError) as exc:
        ledger.summary(state, 10.0, "2025-13")
    assert exc.value.kind == "usage"


def test_summary_per_engine(state: Path) -> None:
    res(state, job="a", engine="claude", usd=4.0)
    res(state, job="b", engine="claude", usd=3.0)
    res(state, job="c", engine="codex", usd=2.0)
    ledger.close(state, "a.1", 1.5)
    s = ledger.summary(state, 20.0, now=NOV)
    assert s.per_engine == {"claude": {"committed": 1.5, "open": 3.0},
                            "codex": {"committed": 0.0, "open": 2.0}}
    assert (s.committed_usd, s.open_usd, s.left_usd) == (1.5, 5.0, 13.5)
    assert json.loads(json.dumps(s.to_dict()))["per_engine"] == s.per_engine


def test_left_goes_negative_when_the_cap_is_lowered(state: Path) -> None:
    res(state, usd=8.0, cap=10.0)
    assert ledger.summary(state, 5.0, now=NOV).left_usd == -3.0


# ---------------------------------------------------------------- robustness of the file


def test_torn_last_line_does_not_swallow_the_next_row(state: Path) -> None:
    res(state, job="a", usd=1.0)
    path = state / "ledger.jsonl"
    with path.open("a") as f:
        f.write('{"v":1,"op":"res')  # a crash mid-write: no newline
    with pytest.warns(ledger.LedgerWarning, match="1 unparsable"):
        res(state, job="b", usd=2.0)
    lines = path.read_text().split("\n")
    assert lines[1] == '{"v":1,"op":"res'  # kept as is, on its own line
    assert json.loads(lines[2])["rid"] == "b.1"
    with pytest.warns(ledger.LedgerWarning):
        assert [r.rid for r in ledger.open_reservations(state)] == ["a.1", "b.1"]


def test_garbage_rows_are_skipped_with_one_warning(state: Path) -> None:
    res(state, job="a", usd=1.0)
    path = state / "ledger.jsonl"
    with path.open("ab") as f:
        f.write(b"not json\n")
        f.write(b"[1, 2]\n")
        f.write(b'{"v":1,"op":"reserve","rid":"x.1"}\n')  # missing fields
        f.write(b'{"v":1,"op":"reserve","rid":"y.1","job":"y","attempt":1,"engine":"e",'
                b'"usd":"lots","month":"2025-11"}\n')  # wrong type
        f.write(b'{"v":1,"op":"frobnicate"}\n')
        f.write(b'{"v":1,"op":["reserve"]}\n')  # not a name at all (it raised TypeError)
        f.write(b"\xff\xfe\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = ledger.summary(state, 10.0, now=NOV)
    assert [str(w.message) for w in caught if w.category is ledger.LedgerWarning] == [
        f"{path}: skipped 7 unparsable row(s), first at line 2; the file is left as is"
    ]
    assert s.open_usd == 1.0


def test_rows_of_an_unknown_version_are_skipped_and_kept(state: Path) -> None:
    state.mkdir()
    path = state / "ledger.jsonl"
    future = b'{"v":2,"op":"reserve","rid":"z.1","job":"z","attempt":1,"engine":"e","usd":40.0,"month":"2025-11"}\n'
    path.write_bytes(future)
    with pytest.warns(ledger.LedgerWarning, match="unknown version"):
        res(state, job="a", usd=10.0, cap=10.0)  # the v2 row's $40 is not seen
    assert path.read_bytes().startswith(future)
    assert rows(state)[1]["rid"] == "a.1"


def test_each_row_is_one_write_even_after_a_torn_line(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res(state, job="a")
    with (state / "ledger.jsonl").open("a") as f:
        f.write('{"v":1,"op":"clo')
    writes: list[bytes] = []
    real_write = os.write

    def spy(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("ledger.jsonl"):
            writes.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(ledger.os, "write", spy)
    with pytest.warns(ledger.LedgerWarning):
        ledger.close(state, "a.1", 1.0)
    monkeypatch.undo()
    assert len(writes) == 1 and writes[0].startswith(b'\n{"v":1,"op":"close"') and writes[0].endswith(b"\n")


def test_files_are_0600_and_a_new_state_dir_0700(tmp_path: Path) -> None:
    state_dir = tmp_path / "deep" / "state"
    old = os.umask(0o022)
    try:
        res(state_dir)
    finally:
        os.umask(old)
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((state_dir / "ledger.jsonl").stat().st_mode) == 0o600
    assert stat.S_IMODE((state_dir / "ledger.lock").stat().st_mode) == 0o600


def test_a_loose_ledger_file_is_tightened_to_0600(state: Path) -> None:
    state.mkdir()
    path = state / "ledger.jsonl"
    path.write_text("")
    path.chmod(0o644)
    res(state)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_empty_state_reads_as_nothing_spent(state: Path) -> None:
    s = ledger.summary(state, 50.0, now=NOV)
    assert (s.month, s.committed_usd, s.open_usd, s.left_usd, s.per_engine) == ("2025-11", 0.0, 0.0, 50.0, {})
    assert ledger.open_reservations(state) == []


# ---------------------------------------------------------------- the lock


def test_reserve_locked_needs_the_lock_and_nests_with_summary(state: Path) -> None:
    with pytest.raises(RuntimeError):
        ledger.reserve_locked(state, job="a", attempt=1, engine="e", usd=1.0, cap_usd=5.0, now=NOV)
    with ledger.lock(state):
        r = ledger.reserve_locked(state, job="a", attempt=1, engine="e", usd=1.0, cap_usd=5.0, now=NOV)
        # Reentrant: reads and closes inside the critical section do not deadlock on our own lock.
        assert ledger.summary(state, 5.0, now=NOV).open_usd == 1.0
        assert ledger.close(state, r.rid, 0.5) == 0.5
    assert ledger.lock(state) is ledger.lock(state)


def test_the_lock_excludes_another_thread(state: Path) -> None:
    """Another thread cannot take the lock while this one holds it, and can once it is let go."""
    import filelock

    def try_lock(timeout: float) -> bool:
        try:
            ledger.lock(state).acquire(timeout=timeout)
        except filelock.Timeout:
            return False
        ledger.lock(state).release()
        return True

    got: list[bool] = []
    with ledger.lock(state):
        t = threading.Thread(target=lambda: got.append(try_lock(0.05)))  # the bound only ends a refusal
        t.start()
        t.join(30)
    t = threading.Thread(target=lambda: got.append(try_lock(30)))
    t.start()
    t.join(60)
    assert got == [False, True]


# ---------------------------------------------------------------- many processes at once

_RESERVE_CHILD = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from subtask.state import ledger
    from subtask.model.errors import SubtaskError
    state, me = Path(sys.argv[1]), sys.argv[2]
    (state.parent / f"ready.{me}").touch()
    while not (state.parent / "go").exists():
        time.sleep(0.001)
    granted = []
    for n in range(3):
        try:
            granted.append(ledger.reserve(state, job=f"p{me}-{n}", attempt=1, engine="e",
                                          usd=7.0, cap_usd=50.0).rid)
        except SubtaskError as e:
            assert e.kind == "budget", e
    print(json.dumps(granted))
""")

_CLOSE_CHILD = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from subtask.state import ledger
    state, me, rids = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    (state.parent / f"ready2.{me}").touch()
    while not (state.parent / "go2").exists():
        time.sleep(0.001)
    print(json.dumps({rid: ledger.close(state, rid, 7.0, reason="done") for rid in rids}, default=float))
""")


def _run_all_at_once(tmp_path: Path, script: str, argvs: list[list[str]], ready: str, go: str) -> list:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", script, *argv], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for argv in argvs]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob(f"{ready}.*"))) < len(argvs):  # start only when all are waiting
        assert time.monotonic() < deadline, "children never got ready"
        time.sleep(0.01)
    (tmp_path / go).touch()
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=60)
        assert p.returncode == 0, stderr
        out.append(json.loads(stdout))
    return out


@pytest.mark.stress
def test_eight_processes_racing_for_the_cap_get_exactly_seven(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    granted = _run_all_at_once(tmp_path, _RESERVE_CHILD,
                               [[str(state_dir), str(i)] for i in range(8)], "ready", "go")
    all_rids = [rid for g in granted for rid in g]
    assert len(all_rids) == 7 and len(set(all_rids)) == 7
    s = ledger.summary(state_dir, 50.0)
    assert (s.open_usd, len(s.open_reservations), s.committed_usd) == (49.0, 7, 0.0)

    # Every process tries to close every granted rid at once: each is charged exactly once.
    closed = _run_all_at_once(tmp_path, _CLOSE_CHILD,
                              [[str(state_dir), str(i), json.dumps(all_rids)] for i in range(8)],
                              "ready2", "go2")
    for rid in all_rids:
        assert sorted(c[rid] for c in closed if c[rid] is not None) == [7.0]
    s = ledger.summary(state_dir, 50.0)
    assert s.committed_usd == 49.0
    assert (s.open_usd, s.open_reservations, s.left_usd) == (0.0, [], 1.0)
    assert s.per_engine == {"e": {"committed": 49.0, "open": 0.0}}
    assert [r["op"] for r in rows(state_dir)].count("close") == 7
    assert len(rows(state_dir)) == 14  # refusals and repeated closes write nothing


def test_an_attempts_ledger_month_is_its_utc_month_whatever_the_local_zone(monkeypatch):
    """`spending.month_of` reads the month of a timestamp in UTC (without `datetime`): the last
    second of a month and the first of the next, a leap day, in a zone far from UTC."""
    import time
    from datetime import UTC, datetime

    from subtask.ops.running import spending

    monkeypatch.setenv("TZ", "Pacific/Kiritimati")  # UTC+14: local dates run a day ahead
    time.tzset()
    try:
        for stamp in ("2026-01-31T23:59:59", "2026-02-01T00:00:00", "2028-02-29T12:00:00", "2026-12-31T23:59:59"):
            moment = datetime.fromisoformat(stamp).replace(tzinfo=UTC).timestamp()
            assert spending.month_of(moment) == datetime.fromtimestamp(moment, UTC).strftime("%Y-%m") == stamp[:7]
    finally:
        monkeypatch.undo()
        time.tzset()
