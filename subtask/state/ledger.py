"""The spend ledger: every dollar a job may spend is reserved here before it runs and settled after.

Owns `<state_dir>/ledger.jsonl` (append-only JSON lines, one row per reservation or close) and
`<state_dir>/ledger.lock` (a `filelock.FileLock` that serialises every read-decide-append).

Invariants:
- A row is written with exactly one `os.write` on an `O_APPEND` descriptor, so rows never
  interleave. If the file does not end in a newline (a crash tore the last row), the newline is
  prepended to that same write, so a torn row never swallows the next one.
- Every row carries `"v": 1`. Readers skip unparsable rows and rows of an unknown version with one
  warning per read; they never crash and never rewrite the file.
- A reservation id (`paths.reservation_id`: `<job>.<attempt>`) is reserved at most once and closed at most once;
  the first close row wins and later ones are ignored, so settlement is exactly-once.
- Spend belongs to the month of its reservation: the close row repeats the reservation's month,
  so a November reservation settled in December stays in November.
- For the current month, committed + open never exceeds the cap after a reservation is granted.
- Amounts are exact (`subtask.model.money`: decimals to the micro-dollar): sums and the cap check
  are exact, and a row holds the exact amount as its JSON number. A row an earlier version wrote
  with float noise (0.13499999999999998) is read as the micro-dollar amount it meant.
- Files are 0600, the state directory 0700 when this module creates it.
- Never treat the ledger as the only copy of the month's spend, because a lost state directory
  would reset it to $0: it is a cache of the records plus open reservations. A `mark` row
  (`{"op": "mark", "of": <git dir>}`) says this repository's records are in it; without it,
  `subtask.ops.running.spending.sync_ledger` restores their rows (`restore`) from this clone's
  records (never a teammate's pulled ones), never with a lock held while the records are read.

Lock order: the admission critical section takes the slots lock, then `lock(state_dir)`; this
module takes only the ledger lock and never another lock while holding it. Nothing slow (no
subprocess, no network) happens under it: read the file, decide, append one row.
"""

from __future__ import annotations

import _thread
import json
import os
import warnings
from collections.abc import Callable, Iterable
from decimal import Decimal

from subtask.model import lazyre, money
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.state import paths
from subtask.state.statefiles import naming, read_bytes

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from datetime import datetime
    from typing import Any

    import filelock

    from subtask.state.statefiles import StrPath

LEDGER_NAME = paths.LEDGER_FILE
LOCK_NAME = paths.LEDGER_LOCK
ROW_VERSION = 1
FILE_MODE = 0o600
DIR_MODE = 0o700
# The lock is held for a read and one append; a minute means a stuck holder, not contention.
LOCK_TIMEOUT_S = 60.0
_MONTH_RE = lazyre.compile(r"^\d{4}-(0[1-9]|1[0-2])$")
_SPEND_HINT = "git subtask spend"


class LedgerWarning(RuntimeWarning):
    """The ledger holds rows this version cannot use; they are skipped, not removed."""


@dataclass(frozen=True)
class Reservation:
    """One reserve row: money held for one attempt of a job, in the month it belongs to."""

    rid: str
    job: str
    attempt: int
    engine: str
    usd: Decimal
    month: str

    def to_dict(self) -> dict[str, Any]:
        return {"rid": self.rid, "job": self.job, "attempt": self.attempt, "engine": self.engine,
                "usd": money.to_json(self.usd), "month": self.month}


@dataclass(frozen=True)
class Spend:
    """One month's spend: settled charges, open reservations, and what is left under the cap."""

    month: str
    committed_usd: Decimal
    open_usd: Decimal
    open_reservations: list[Reservation]
    per_engine: dict[str, dict[str, Decimal]]
    cap_usd: Decimal
    # Negative when the cap was lowered below what is already committed or reserved.
    left_usd: Decimal

    def to_dict(self) -> dict[str, Any]:
        return {
            "month": self.month,
            "committed_usd": money.to_json(self.committed_usd),
            "open_usd": money.to_json(self.open_usd),
            "open_reservations": [r.to_dict() for r in self.open_reservations],
            "per_engine": {e: {k: money.to_json(a) for k, a in v.items()} for e, v in self.per_engine.items()},
            "cap_usd": money.to_json(self.cap_usd),
            "left_usd": money.to_json(self.left_usd),
        }


@dataclass(frozen=True)
class _Close:
    """One close row: what a reservation was charged, in the reservation's month."""

    rid: str
    usd_charged: Decimal
    month: str


@dataclass
class _State:
    """The ledger as read: first reserve row and first close row per rid, in file order."""

    reservations: dict[str, Reservation] = field(default_factory=dict)
    closes: dict[str, _Close] = field(default_factory=dict)

    def open(self) -> list[Reservation]:
        return [r for rid, r in self.reservations.items() if rid not in self.closes]

    def committed(self, month: str) -> Decimal:
        return money.total(c.usd_charged for c in self.closes.values() if c.month == month)

    def open_usd(self, month: str) -> Decimal:
        return money.total(r.usd for r in self.open() if r.month == month)


# ---------------------------------------------------------------- paths and the lock

def ledger_path(state_dir: StrPath) -> str:
    return os.path.join(state_dir, LEDGER_NAME)


def lock_path(state_dir: StrPath) -> str:
    return os.path.join(state_dir, LOCK_NAME)


# One FileLock per lock path per process: the same instance is reentrant in one thread, so a
# caller holding lock() may call summary()/reserve_locked() without deadlocking on its own flock.
# filelock is imported on first use: free jobs never touch the ledger, and the import costs ~20 ms
# on every CLI call and worker start.
_locks: dict[str, filelock.FileLock] = {}
_locks_guard = _thread.allocate_lock()  # threading.Lock, without importing `threading` (~0.5 ms of a start)


def lock(state_dir: StrPath) -> filelock.FileLock:
    """The ledger lock (a `filelock.FileLock`). Use this instance so nesting stays reentrant."""
    import filelock

    _ensure_state_dir(state_dir)
    # Keyed by pid too: filelock refuses an instance inherited across a fork (the worker is
    # forked from the CLI), so a forked child builds its own.
    key = f"{os.getpid()}:{os.path.abspath(lock_path(state_dir))}"
    with _locks_guard:
        lk = _locks.get(key)
        if lk is None:
            lk = filelock.FileLock(os.path.abspath(lock_path(state_dir)), timeout=LOCK_TIMEOUT_S, mode=FILE_MODE)
            _locks[key] = lk
        return lk


class _held:  # noqa: N801  (read as a phrase: `with _held(state_dir):`)
    """The ledger's lock, held for a `with`; one stuck past `LOCK_TIMEOUT_S` is a fatal error. A
    class, not `contextlib.contextmanager`: `start` loads this module and never `contextlib`."""

    def __init__(self, state_dir: StrPath):
        self.state_dir = state_dir

    def __enter__(self) -> None:
        import filelock

        self.held = lock(self.state_dir)
        try:
            self.held.acquire()
        except filelock.Timeout:
            raise SubtaskError(
                "fatal",
                f"the spend ledger in {self.state_dir} stayed locked for {LOCK_TIMEOUT_S:.0f}s",
                hint="look for a stuck git-subtask process",
            ) from None

    def __exit__(self, *exc: object) -> None:
        self.held.release()


def _ensure_state_dir(state_dir: StrPath) -> None:
    if os.path.isdir(state_dir):
        return
    try:
        os.makedirs(state_dir, mode=DIR_MODE)
    except FileExistsError:
        return  # another process won the race; it set the mode
    # mkdir's mode is filtered by umask; state may hold job names and costs, so make it exact.
    os.chmod(state_dir, DIR_MODE)


# ---------------------------------------------------------------- time and validation

def _utc(now: datetime | None) -> datetime:
    from datetime import UTC, datetime  # a charge's or a reservation's: a free job's start never loads it

    if now is None:
        return datetime.now(UTC)
    if now.tzinfo is None:
        return now.replace(tzinfo=UTC)  # naive datetimes are taken to be UTC
    return now.astimezone(UTC)


def _month_of(now: datetime) -> str:
    return now.strftime("%Y-%m")


def check_month(month: str) -> str:
    if not isinstance(month, str) or not _MONTH_RE.match(month):
        raise SubtaskError("usage", f"month must look like YYYY-MM, not {month!r}")
    return month


def _check_reserve_args(job: str, attempt: int, engine: str, usd: object,
                        cap_usd: object) -> tuple[Decimal, Decimal]:
    """The amount and the cap of a reservation, once every argument is checked."""
    if not isinstance(job, str) or not job:
        raise SubtaskError("usage", f"job must be a non-empty string, not {job!r}")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        raise SubtaskError("usage", f"attempt must be a non-negative integer, not {attempt!r}")
    if not isinstance(engine, str) or not engine:
        raise SubtaskError("usage", f"engine must be a non-empty string, not {engine!r}")
    return _money_arg(usd, "a reservation"), _money_arg(cap_usd, "the monthly cap")


def _money_arg(value: object, what: str) -> Decimal:
    amount = money.money_or_none(value)
    if amount is None:
        raise SubtaskError("usage", f"{what} must be a finite amount >= $0, not {value!r}")
    return amount


# ---------------------------------------------------------------- reading

def _parse_reserve(row: dict[str, Any]) -> Reservation | None:
    rid, job, attempt, engine = row.get("rid"), row.get("job"), row.get("attempt"), row.get("engine")
    usd, month = money.money_or_none(row.get("usd")), row.get("month")
    if not (isinstance(rid, str) and isinstance(job, str) and isinstance(engine, str)):
        return None
    if not isinstance(attempt, int) or isinstance(attempt, bool) or usd is None:
        return None
    if not isinstance(month, str) or not _MONTH_RE.match(month):
        return None
    return Reservation(rid=rid, job=job, attempt=attempt, engine=engine, usd=usd, month=month)


def _parse_close(row: dict[str, Any]) -> _Close | None:
    rid, charged, month = row.get("rid"), money.money_or_none(row.get("usd_charged")), row.get("month")
    if not isinstance(rid, str) or charged is None:
        return None
    if not isinstance(month, str) or not _MONTH_RE.match(month):
        return None
    return _Close(rid=rid, usd_charged=charged, month=month)


def _parse_mark(row: dict[str, Any]) -> str | None:
    return "mark" if isinstance(row.get("of"), str) else None


_PARSERS: dict[str, Callable[[dict[str, Any]], Reservation | _Close | str | None]] = {
    "reserve": _parse_reserve, "close": _parse_close, "mark": _parse_mark}


def _parse_line(raw: bytes) -> Reservation | _Close | str:
    """A parsed row, or "bad" / "future" naming why it is skipped ("mark" for a mark row)."""
    try:
        row = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "bad"
    if not isinstance(row, dict):
        return "bad"
    if row.get("v") != ROW_VERSION:
        return "future"
    parse = _PARSERS.get(op) if isinstance(op := row.get("op"), str) else None  # a row is anyone's
    parsed = parse(row) if parse is not None else None
    return "bad" if parsed is None else parsed


def _read_state(path: str) -> _State:
    try:
        data = read_bytes(path)
    except FileNotFoundError:
        return _State()
    state = _State()
    skipped = {"bad": 0, "future": 0}
    first_skipped: int | None = None
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        parsed = _parse_line(raw)
        if parsed == "mark":
            continue
        if isinstance(parsed, str):
            skipped[parsed] += 1
            first_skipped = first_skipped or lineno
        elif isinstance(parsed, Reservation):
            state.reservations.setdefault(parsed.rid, parsed)
        else:
            # First close wins; a close for an rid never reserved is kept for the money it records.
            state.closes.setdefault(parsed.rid, parsed)
    if first_skipped is not None:
        _warn_skipped(path, skipped, first_skipped)
    return state


def _warn_skipped(path: str, skipped: dict[str, int], first: int) -> None:
    # One warning per read, not per line; identical messages are shown once by `warnings`.
    parts = []
    if skipped["bad"]:
        parts.append(f"{skipped['bad']} unparsable")
    if skipped["future"]:
        parts.append(f"{skipped['future']} of an unknown version")
    warnings.warn(
        f"{path}: skipped {' and '.join(parts)} row(s), first at line {first}; the file is left as is",
        LedgerWarning,
        stacklevel=4,
    )


# ---------------------------------------------------------------- writing

def _append(path: str, row: dict[str, Any]) -> None:
    data = (json.dumps(row, separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        st = os.fstat(fd)
        _tighten_mode(fd, st.st_mode)
        # A crash mid-row leaves no trailing newline; end that torn row in the same write.
        if st.st_size and os.pread(fd, 1, st.st_size - 1) != b"\n":
            data = b"\n" + data
        with naming(path):
            written = os.write(fd, data)
    finally:
        os.close(fd)
    if written != len(data):
        # The next append will end this torn row; say so now rather than lose money silently.
        raise SubtaskError("fatal", f"short write to {path} ({written} of {len(data)} bytes)",
                           hint="check free disk space")


def _tighten_mode(fd: int, st_mode: int) -> None:
    if st_mode & 0o777 == FILE_MODE:
        return
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:
        pass  # the mode is hygiene; refusing to record spend over it would be worse


# ---------------------------------------------------------------- public API

def reserve(
    state_dir: StrPath,
    *,
    job: str,
    attempt: int,
    engine: str,
    usd: object,
    cap_usd: object,
    now: datetime | None = None,
) -> Reservation:
    """Reserve `usd` for one attempt of a job this month, or refuse if it would break the cap."""
    with _held(state_dir):
        return reserve_locked(state_dir, job=job, attempt=attempt, engine=engine,
                              usd=usd, cap_usd=cap_usd, now=now)


def reserve_locked(
    state_dir: StrPath,
    *,
    job: str,
    attempt: int,
    engine: str,
    usd: object,
    cap_usd: object,
    now: datetime | None = None,
) -> Reservation:
    """`reserve` for a caller already holding `lock(state_dir)` (the admission critical section)."""
    if not lock(state_dir).is_locked:
        raise RuntimeError("reserve_locked called without holding ledger.lock(state_dir)")
    amount, cap = _check_reserve_args(job, attempt, engine, usd, cap_usd)
    at = _utc(now)
    month = _month_of(at)
    rid = paths.reservation_id(job, attempt)
    state = _read_state(ledger_path(state_dir))
    if rid in state.reservations:
        raise SubtaskError("conflict", f"reservation {rid} already exists in the spend ledger",
                           hint=_SPEND_HINT)
    _refuse_over_cap(rid, month, state, amount, cap)
    res = Reservation(rid=rid, job=job, attempt=attempt, engine=engine, usd=amount, month=month)
    _append(ledger_path(state_dir), {
        "v": ROW_VERSION, "op": "reserve", "rid": rid, "job": job, "attempt": attempt,
        "engine": engine, "usd": money.to_json(res.usd), "month": month, "at": at.isoformat(),
    })
    return res


def check_fits_locked(state_dir: StrPath, amounts: Iterable[object], cap_usd: object, *, what: str,
                      now: datetime | None = None) -> None:
    """Refuse, before any row is written, reservations that together would break the cap.

    A best-of-N group reserves all its members' money or none: reserving them one by one would
    leave the first ones' rows behind when a later one is refused. The caller holds
    `lock(state_dir)` and then reserves each with `reserve_locked`, which re-checks.
    """
    if not lock(state_dir).is_locked:
        raise RuntimeError("check_fits_locked called without holding ledger.lock(state_dir)")
    cap = _money_arg(cap_usd, "the monthly cap")
    month = _month_of(_utc(now))
    state = _read_state(ledger_path(state_dir))
    asked = [money.usd(a) or money.ZERO for a in amounts]
    total = money.total(asked)
    committed, open_usd = state.committed(month), state.open_usd(month)
    if committed + open_usd + total <= cap:
        return
    left = max(money.ZERO, cap - committed - open_usd)
    each = max(asked) if asked else money.ZERO
    fits = int(left // each) if each > 0 else len(asked)
    raise SubtaskError(
        "budget",
        f"reserving {money.text(total)} for {what} would exceed the monthly cap for {month}: "
        f"{money.text(committed)} committed + {money.text(open_usd)} open + {money.text(total)} requested "
        f"> {money.text(cap)}; {money.text(left)} is left under the cap (room for {fits} of {len(asked)})",
        hint=_SPEND_HINT,
    )


def _refuse_over_cap(rid: str, month: str, state: _State, usd: Decimal, cap: Decimal) -> None:
    committed, open_usd = state.committed(month), state.open_usd(month)
    if committed + open_usd + usd <= cap:
        return
    raise SubtaskError(
        "budget",
        f"reserving {money.text(usd)} for {rid} would exceed the monthly cap for {month}: "
        f"{money.text(committed)} committed + {money.text(open_usd)} open + {money.text(usd)} requested "
        f"> {money.text(cap)}",
        hint=_SPEND_HINT,
    )


def _charge(reserved: Decimal, cost: object, charge_all: bool) -> Decimal:
    # An unknown or nonsensical cost may have spent anything up to the reservation: charge it all.
    amount = money.money_or_none(cost)
    if charge_all or amount is None:
        return reserved
    return min(amount, reserved)


def close(
    state_dir: StrPath,
    rid: str,
    cost: object,
    *,
    reason: str = "",
    charge_all: bool = False,
    now: datetime | None = None,
) -> Decimal | None:
    """Settle a reservation once; return the amount charged, or None if unknown or already closed.

    `close(rid, 0.0)` releases it. An unknown cost (None, NaN, inf, negative) or `charge_all`
    charges the whole reservation; a known cost is capped at the reservation.
    """
    with _held(state_dir):
        state = _read_state(ledger_path(state_dir))
        res = state.reservations.get(rid)
        if res is None or rid in state.closes:
            return None
        charged = _charge(res.usd, cost, charge_all)
        _append(ledger_path(state_dir), {
            "v": ROW_VERSION, "op": "close", "rid": rid, "usd_charged": money.to_json(charged),
            # What the engine reported, when JSON can hold it; NaN/inf become null.
            "observed": money.to_json(cost), "month": res.month,
            "at": _utc(now).isoformat(), "reason": str(reason),
        })
        return charged


def summary(
    state_dir: StrPath,
    cap_usd: object,
    month: str | None = None,
    *,
    now: datetime | None = None,
) -> Spend:
    """Spend for `month` (default: the current UTC month) against `cap_usd`."""
    cap = _money_arg(cap_usd, "the monthly cap")
    month = check_month(month) if month is not None else _month_of(_utc(now))
    if os.path.isdir(state_dir):
        with _held(state_dir):
            state = _read_state(ledger_path(state_dir))
    else:
        state = _State()  # no state folder, no ledger: nothing spent, and a look makes no folder
    committed, open_usd = state.committed(month), state.open_usd(month)
    return Spend(
        month=month,
        committed_usd=committed,
        open_usd=open_usd,
        open_reservations=[r for r in state.open() if r.month == month],
        per_engine=_per_engine(state, month),
        cap_usd=cap,
        left_usd=cap - committed - open_usd,
    )


def _per_engine(state: _State, month: str) -> dict[str, dict[str, Decimal]]:
    committed: dict[str, list[Decimal]] = {}
    opened: dict[str, list[Decimal]] = {}
    for c in state.closes.values():
        if c.month == month:
            res = state.reservations.get(c.rid)
            committed.setdefault(res.engine if res else "unknown", []).append(c.usd_charged)
    for r in state.open():
        if r.month == month:
            opened.setdefault(r.engine, []).append(r.usd)
    engines = sorted(set(committed) | set(opened))
    return {e: {"committed": money.total(committed.get(e, [])), "open": money.total(opened.get(e, []))}
            for e in engines}


def open_reservations(state_dir: StrPath) -> list[Reservation]:
    """Every reservation not yet closed, in any month, oldest first."""
    with _held(state_dir):
        return _read_state(ledger_path(state_dir)).open()


# ---------------------------------------------------------------- restoring from the records

def _mark_needle(of: str) -> bytes:
    return b'"op":"mark","of":' + json.dumps(of).encode()


def has_mark(state_dir: StrPath, of: str) -> bool:
    """Does the ledger say the records of `of` are in it? A byte scan, no lock: rows are appended
    whole, and a missed mark only costs an idempotent `restore`."""
    try:
        return _mark_needle(of) in read_bytes(ledger_path(state_dir))
    except FileNotFoundError:
        return False


def restore(state_dir: StrPath, of: str, charges: list[dict[str, Any]], *, now: datetime | None = None) -> int:
    """Append the rows the ledger lacks for these paid attempts (from the records), then the mark.

    Each charge: rid, job, attempt, engine, month, reserved, charged (None: not ended). A missing
    reservation is reserved again (a running job's money stays counted; its close still lands);
    an ended attempt's missing close is closed at what its record says it was charged. Rows the
    ledger already has are kept as they are. Returns the rows added.
    """
    at = _utc(now).isoformat()
    added = 0
    with _held(state_dir):
        path = ledger_path(state_dir)
        if _mark_needle(of) in (read_bytes(path) if os.path.exists(path) else b""):
            return 0  # another process restored it meanwhile
        state = _read_state(path)
        for c in charges:
            rid, month = c["rid"], c["month"]
            reserved, charged = money.money_or_none(c["reserved"]), money.money_or_none(c["charged"])
            if not (reserved is not None and isinstance(month, str) and _MONTH_RE.match(month)):
                continue
            if rid not in state.reservations:
                _append(path, {"v": ROW_VERSION, "op": "reserve", "rid": rid, "job": c["job"],
                               "attempt": c["attempt"], "engine": c["engine"], "usd": money.to_json(reserved),
                               "month": month, "at": at, "from": "record"})
                added += 1
            if charged is not None and rid not in state.closes:
                _append(path, {"v": ROW_VERSION, "op": "close", "rid": rid,
                               "usd_charged": money.to_json(min(charged, reserved)),
                               "observed": None, "month": month, "at": at, "reason": "restored from the record"})
                added += 1
        if added or os.path.exists(path):
            # No ledger and nothing to restore: leave no file (a refused start changes nothing);
            # the next look at the records is cheap, and finds the same nothing or real rows.
            _append(path, {"v": ROW_VERSION, "op": "mark", "of": of, "at": at})
    return added
