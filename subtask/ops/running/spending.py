"""The spend that the records in git hold; the ledger is a cache of it plus the open reservations.

Every paid attempt's record carries its reservation id, what was reserved and, once it ended,
what it was charged (`Attempt.cost`); the reservation's month is the month the attempt was
queued (`start` reserves with that time). So the month's spend can always be told from git:

- `sync_ledger`: when the ledger holds no mark for this repository (the state directory was lost,
  or the ledger predates the mark), the ledger is rebuilt from this clone's records: a reserve row
  for each paid attempt it does not know (so a running job's money stays reserved and its worker's
  close still lands), a close row for each ended one, then the mark. Checking for the mark is a
  byte scan of the ledger, so a start pays nothing for it once the mark is there.
- `team_spend`: one month's spend of every clone whose records are here (pushed and pulled with
  `git subtask push/pull`), from the records only: the team's figure, not this clone's cap.

Invariants:
- Never read records while holding the slots or ledger lock, because reading thousands of records
  is slow and every start passes through those locks: the charges are read first, and the ledger
  lock is held only to append what is still missing (idempotent: a second rebuild adds nothing).
- Never charge a pulled record to this clone's cap, nor end it as a dead worker's job, because
  it is a teammate's spend, against their cap, and their worker: both follow ownership
  (`ownership`: the jobs whose record this clone created), never `spec.repo`, which a pulled
  record can set to our path.
- The charges of a record are cached by its tip (`<state>/spend-cache-<repo>.json`): a commit id
  never changes meaning, so the cache can be incomplete but never stale.
"""

from __future__ import annotations

import json
import time
import warnings
from decimal import Decimal

from subtask.git import ownership, records
from subtask.git.gitrepo import Repo
from subtask.model import money
from subtask.model.dataclass import asdict, dataclass, field
from subtask.state import ledger
from subtask.state.statefiles import read_bytes, write_atomic

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from datetime import datetime


@dataclass(frozen=True)
class Charge:
    """One paid attempt as its record tells it."""

    rid: str
    job: str
    attempt: int
    engine: str
    month: str
    reserved: Decimal
    charged: Decimal | None  # None while the attempt has not ended
    clone: str  # spec.repo: the main worktree of the clone that ran it

    @classmethod
    def from_row(cls, row: dict) -> Charge:
        """A cached row (amounts as JSON numbers) as a charge in exact dollars."""
        return cls(**(row | {"reserved": money.money_or_none(row["reserved"]) or money.ZERO,
                             "charged": money.money_or_none(row["charged"])}))

    def to_row(self) -> dict:
        amounts = {"reserved": money.to_json(self.reserved), "charged": money.to_json(self.charged)}
        return asdict(self) | amounts


@dataclass
class TeamSpend:
    """One month's spend of every clone whose records are here (`team_spend`)."""

    month: str
    committed_usd: Decimal
    open_usd: Decimal
    clones: dict[str, dict] = field(default_factory=dict)  # clone -> {committed, open, jobs}

    def to_dict(self) -> dict:
        return {"month": self.month, "committed_usd": money.to_json(self.committed_usd),
                "open_usd": money.to_json(self.open_usd),
                "clones": {clone: row | {key: money.to_json(row[key]) for key in ("committed", "open")}
                           for clone, row in self.clones.items()},
                "source": "records"}


def month_of(timestamp: float) -> str:
    """The ledger month of an attempt queued at `timestamp` (UTC)."""
    return time.strftime("%Y-%m", time.gmtime(timestamp))  # UTC, as the ledger's months are; no `datetime`


def reserved_at(timestamp: float) -> datetime:
    """The time `start` reserves with, so the ledger's month is the record's month."""
    from datetime import UTC, datetime  # a paid job's: a free job's start never loads it

    return datetime.fromtimestamp(timestamp, UTC)


def setting_usd(repo: Repo, key: str) -> Decimal:
    """A dollar setting, exact: `config.number` has refused whatever is not a finite number."""
    amount = money.usd(repo.config.number(key))
    assert amount is not None  # a finite number is always an amount
    return amount


# ---------------------------------------------------------------- reading the records

def record_charges(repo: Repo) -> list[Charge]:
    """Every paid attempt of every record here (this clone's and pulled ones)."""
    cached = _read_cache(repo)
    fresh: dict[str, list[dict]] = {}
    for _, ref in records.record_refs(repo):
        try:
            tip = ref.target
            rows = cached.get(tip)
            if rows is None:
                rows = _charges_of(records.read_commit(repo, tip))
        except Exception as exc:  # a damaged record must not hide the others' spend
            warnings.warn(f"skipping damaged record {ref.name} in the spend: {exc}", stacklevel=2)
            continue
        fresh[tip] = rows
    if fresh.keys() != cached.keys():
        _write_cache(repo, fresh)
    return [Charge.from_row(row) for rows in fresh.values() for row in rows]


def _charges_of(job: records.Job) -> list[dict]:
    out = []
    for attempt in job.state.attempts:
        if not attempt.rid:
            continue
        reserved = attempt.cost.reserved
        charged = None
        if attempt.terminal:
            # An ended attempt with no known charge was charged its whole reservation.
            charged = attempt.cost.charged if attempt.cost.charged is not None else reserved
        out.append(Charge(rid=attempt.rid, job=job.id, attempt=attempt.n, engine=job.spec.engine,
                          month=month_of(attempt.queued_at), reserved=reserved, charged=charged,
                          clone=job.spec.repo).to_row())
    return out


def _cache_path(repo: Repo) -> str:
    return repo.state_file("spend-cache")


def _read_cache(repo: Repo) -> dict[str, list[dict]]:
    try:
        data = json.loads(read_bytes(_cache_path(repo)))
    except (OSError, ValueError):
        return {}
    entries = data.get("entries") if isinstance(data, dict) and data.get("v") == 1 else None
    if not isinstance(entries, dict):
        return {}
    fields = set(Charge.__dataclass_fields__)
    return {tip: rows for tip, rows in entries.items()
            if isinstance(rows, list) and all(isinstance(r, dict) and set(r) == fields for r in rows)}


def _write_cache(repo: Repo, entries: dict[str, list[dict]]) -> None:
    """Best effort: a cache that cannot be written only costs the next reader some reads."""
    try:
        write_atomic(_cache_path(repo), json.dumps({"v": 1, "entries": entries}, separators=(",", ":"),
                                                   ensure_ascii=True).encode(), durable=False)
    except OSError:
        pass


# ---------------------------------------------------------------- the ledger as a cache

def sync_ledger(repo: Repo) -> int:
    """Rebuild the ledger's rows from this clone's records unless it holds this repository's mark.

    Returns the rows added. Call outside the slots and ledger locks.
    """
    mark = str(repo.common_dir)
    if ledger.has_mark(repo.state_dir, mark):
        return 0
    owned = ownership.owned_keys(repo)
    own = [c for c in record_charges(repo) if c.job in owned]
    if not own and not repo.state_dir.is_dir():
        return 0  # nothing to restore, and no state folder to make for it
    added = ledger.restore(repo.state_dir, mark, [asdict(c) for c in own])  # amounts as Decimals
    _close_ended_meanwhile(repo, [c for c in own if c.charged is None])
    return added


def _close_ended_meanwhile(repo: Repo, running: list[Charge]) -> None:
    """A job that ended after its record was read found no reservation to close (the ledger was
    lost) and closed nothing; its final record came first, so read it again and close it now."""
    for charge in running:
        try:
            job = records.read(repo, charge.job)
        except Exception:
            continue
        for attempt in job.state.attempts:
            if attempt.rid == charge.rid and attempt.terminal:
                ledger.close(repo.state_dir, charge.rid, attempt.cost.charged, reason="restored from the record")


def team_spend(repo: Repo, month: str | None = None) -> TeamSpend:
    """One month's spend of every clone whose records are here, from the records alone."""
    month = ledger.check_month(month) if month is not None else month_of(time.time())
    clones: dict[str, dict] = {}
    committed: list[Decimal] = []
    opened: list[Decimal] = []
    jobs: dict[str, set[str]] = {}
    for charge in record_charges(repo):
        if charge.month != month:
            continue
        row = clones.setdefault(charge.clone, {"committed": [], "open": []})
        jobs.setdefault(charge.clone, set()).add(charge.job)
        if charge.charged is None:
            row["open"].append(charge.reserved)
            opened.append(charge.reserved)
        else:
            row["committed"].append(charge.charged)
            committed.append(charge.charged)
    summed = {clone: {"committed": money.total(row["committed"]), "open": money.total(row["open"]),
                      "jobs": len(jobs[clone])} for clone, row in sorted(clones.items())}
    return TeamSpend(month, money.total(committed), money.total(opened), summed)
