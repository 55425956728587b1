"""The job's data: spec, attempts, evidence, and the state machine they obey.

Everything here is a plain dataclass that round-trips through JSON with a `"v"` version field.
Readers tolerate unknown fields (kept in `extra`, never dropped) and missing ones (defaults).

State machine per attempt: queued -> running -> done | failed | stopped. A terminal state is
final for its attempt: `Attempt.finish` refuses to overwrite one, so a late writer (a stop racing
the worker's last write, two processes noticing one dead worker) can never change the outcome.
A job started `--after` others begins `waiting` (no slot, no money, no branch yet): whoever
first sees every job it waits for ended moves it on once (`subtask/plans.py`), to queued or
running, or ends it: `skipped` (one of them did not pass), `failed` (their heads conflict, or the
start failed) or `stopped`.

Invariants:
- Never count a reconciled job's work from `spec.base`, because its branch then holds the target's
  commits too: it is counted from `state.rebased_onto` (its evidence, note, checks, squash
  message, landed detection, "made no commits", `verify`'s recomputed evidence and re-run checks),
  and one function, `work_base`, says where, which every one of those asks
  (`landqueue::test_a_reconciled_job_is_checked_and_rechecked_from_where_it_was_moved`).
- Never overwrite a terminal state, because a stop races the worker's last write and several
  processes may notice one dead worker; `Attempt.finish` refuses and records update by CAS.
"""

from __future__ import annotations

import os
import time
from decimal import Decimal

from subtask.model import lazyre, money
from subtask.model.dataclass import dataclass, field, fields
from subtask.model.errors import SubtaskError

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    import dataclasses
    from typing import Any, ClassVar, Protocol, Self
else:
    Protocol = object  # `JobLike` is documentation and a type, never a base at run time

SCHEMA_VERSION = 1
JOB_ID_RE = lazyre.compile(r"st-[0-9a-f]{8}")
TERMINAL = ("done", "failed", "stopped", "skipped")
WAITING = "waiting"  # recorded, waiting for other jobs to end (`JobSpec.after`); holds nothing
ACTIVE = (WAITING, "queued", "running")
ON_FAIL = ("skip", "run")  # what a waiting job does when one it waits for did not pass (start_options.ON_FAIL)
MAX_TASK_BYTES = 1024 * 1024
DEPTH_ENV = "SUBTASK_DEPTH"  # a worker's engine runs with its job's delegation depth + 1


def new_job_id() -> str:
    return "st-" + os.urandom(4).hex()  # what secrets.token_hex does, without its imports (~3 ms)


def hex_named(text: str, prefix: str, digits: int, at_least: int | None = None) -> bool:
    """`text` is `prefix` and lower-case hex digits: `digits` of them, or with `at_least` from
    that many to `digits` (what `JOB_ID_RE` matches, without compiling it on every command)."""
    hexes = text[len(prefix):]
    return text.startswith(prefix) and (at_least if at_least is not None else digits) <= len(hexes) <= digits \
        and not hexes.strip("0123456789abcdef")


def is_job_id(text: str) -> bool:
    """`st-` and 8 lower-case hex digits."""
    return isinstance(text, str) and hex_named(text, "st-", 8)


def is_group_ref(text: str) -> bool:
    """Does `text` name a best-of-N group (an id or a prefix of one), rather than a job?"""
    return isinstance(text, str) and text[:3].lower() == "sg-"


def check_id_prefix(text: str) -> str:
    """A job id or a prefix of one, validated before any path or ref is built from it. Ids are
    lowercase hex; one typed (or copied) in capitals names the same job."""
    if not isinstance(text, str) or not (hex_named(text.lower(), "st-", 8, at_least=0)
                                         or hex_named(text.lower(), "", 8, at_least=1)):
        raise SubtaskError("usage", f"not a job id: {text!r} (ids look like st-1a2b3c4d; a unique prefix is enough)")
    text = text.lower()
    return text if text.startswith("st-") else "st-" + text


def now() -> float:
    return time.time()


class _Record:
    """JSON round trip that keeps unknown fields instead of dropping them."""

    extra: dict[str, Any]
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]  # every subclass is a dataclass

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"v": SCHEMA_VERSION}
        for f in fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if isinstance(value, _Record):
                value = value.to_dict()
            elif isinstance(value, Decimal):  # money: the exact amount as a JSON number
                value = money.to_json(value)
            elif isinstance(value, list):
                value = [v.to_dict() if isinstance(v, _Record) else v for v in value]
            out[f.name] = value
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Self:
        data = dict(data or {})
        data.pop("v", None)
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            if key in known and key != "extra":
                kwargs[key] = cls._decode(key, value)
            else:
                extra[key] = value
        obj = cls(**kwargs)
        obj.extra = extra
        return obj

    @classmethod
    def _decode(cls, key: str, value: Any) -> Any:
        return value


@dataclass
class JobSpec(_Record):
    """What was asked. Written once at start, never changed."""

    id: str
    task: str
    engine: str
    base_ref: str
    base: str  # the commit the job started from
    branch: str | None  # None for read-only jobs
    worktree: str
    repo: str  # the main worktree
    created_at: float
    verify: str | None = None
    verify_timeout: float = 600.0
    timeout: float | None = None
    max_usd: Decimal | None = None
    max_turns: int | None = None
    model: str | None = None
    readonly: bool = False
    depth: int = 0  # delegation depth: 0 for a person's job, parent's depth + 1 for a job's job
    parent: str | None = None  # the job this one was started from inside (it lends its slot)
    isolation: str = "none"  # none | worktree | readonly: what the engine may write (subtask/isolation.py)
    isolation_source: str = ""  # flag | config | default (a default that fell back says why)
    network: str = "allow"  # allow | none: `subtask.isolation.network` when the job started
    # Host sockets a confined job may connect to, granted by name (`subtask.isolation.socket`) when
    # it started (None: none; an unconfined job reaches every socket its user can).
    sockets: list[str] | None = None
    group: str | None = None  # the best-of-N group this job is a member of (subtask/groups.py)
    member: int | None = None  # its place in that group, 1..N (exported as SUBTASK_GROUP_MEMBER)
    clone: str | None = None  # the clone that started it (`subtask.cloneId`; subtask/ownership.py)
    # The verify loop (docs/verify.md): how many more attempts the worker starts when verify fails
    # (0-5), and the checks run on the diff before verify (None: a job recorded before checks).
    retries: int = 0
    checks: list[str] | None = None
    # What judges its verify (subtask/git/harness_rule.py): `default` and globs, taken from a trusted
    # tree when verify runs; [] when it is judged by its own tests (`--harness job`); None: a
    # record from before the harness, judged as `default` is.
    harness: list[str] | None = None
    # Orchestration (subtask/plans.py). `after`: the jobs and groups it waits for (whole ids); its
    # `base` is then written once, when it leaves `waiting` (the only change a spec ever sees).
    after: list[str] | None = None
    on_fail: str | None = None  # skip (default) | run: see ON_FAIL
    concurrency: int | None = None  # a map member: at most this many of its group run at once
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def _decode(cls, key: str, value: Any) -> Any:
        if key == "max_usd":
            return money.money_or_none(value)
        if key == "retries":
            return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 5 else 0
        if key in ("checks", "harness", "sockets"):
            return [v for v in value if isinstance(v, str)] if isinstance(value, list) else None
        if key == "after" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            return None  # damaged or foreign: waits for nothing
        if key == "concurrency" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            return None
        return value


@dataclass
class VerifyResult(_Record):
    """What a job's verify found on one commit."""

    command: str
    exit_code: int | None
    seconds: float
    head: str  # the commit verify ran on
    tree: str
    passed: bool
    timed_out: bool = False
    output_tail: str = ""
    # The checks on the diff that failed (subtask/checks.py): they fail verify whatever it exited.
    checks_failed: list[str] | None = None
    # Passed and failed tests as the runner's summary in the output says (`claims.test_counts`).
    tests: dict[str, int] | None = None
    # What judged it (subtask/ops/landing/overlay.py): {"source": base | target | job, "commit", "ref",
    # "tree" (what it ran on: the head's with the trusted harness in place), "unused" (the
    # job's harness changes not used), "own" (its own tests, run apart: passed, exit_code, ...)}.
    harness: dict[str, Any] | None = None
    # What it answers (subtask/ops/landing/verified.py): a digest of (tree, command, harness source,
    # environment fingerprint); a result with the same key is reused instead of run again.
    key: str | None = None
    # Set when it was not run here but reused (`verified.reuse`): {"job", "commit" (where it
    # ran), "at", "by" (this clone, or the allowed signer of the record it came from)}.
    reused: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def _decode(cls, key: str, value: Any) -> Any:
        if key in ("harness", "reused") and not isinstance(value, dict):
            return None  # damaged or foreign: read as absent
        if key == "key" and not isinstance(value, str):
            return None
        return value


@dataclass
class Cost(_Record):
    """An attempt's money, in exact dollars (`subtask.model.money`; JSON numbers on disk)."""

    reserved: Decimal = money.ZERO
    observed: Decimal | None = None  # what the engine reported
    charged: Decimal | None = None  # what the ledger closed at
    # reserved (a paid attempt not ended yet) | free | observed | charged (unknown cost: whole
    # reservation) | not_started | not_billed (the engine saw no model answer and knows no cost)
    billing: str = "free"
    # Taken off what the engine's session figures showed for this attempt: what earlier attempts of
    # the same session were charged without a figure of their own (docs/engines.md "Resumed sessions").
    credit: Decimal | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def _decode(cls, key: str, value: Any) -> Any:
        # A record is input: an amount is read to the micro-dollar (float noise written by
        # earlier versions included); anything that is not an amount reads as absent.
        if key == "reserved":
            return money.money_or_none(value) or money.ZERO
        if key in ("observed", "charged", "credit"):
            return money.money_or_none(value)
        return value


@dataclass
class Attempt(_Record):
    """One run of the job's engine: at its task (attempt 1) or at a reply, and how it ended."""

    n: int
    state: str  # waiting | queued | running | done | failed | stopped | skipped
    message: str  # the task (attempt 1) or the reply message
    queued_at: float
    started_at: float | None = None  # a worker took the attempt (its slot, then its checkout)
    engine_started_at: float | None = None  # the engine was started: from here it may have spent
    ended_at: float | None = None
    reason: str | None = None
    error_kind: str | None = None
    hint: str | None = None
    outcome: str | None = None  # done | partial | blocked, as the engine claimed
    session_id: str | None = None
    model: str | None = None
    turns: int | None = None
    tokens: dict[str, int] | None = None
    cost: Cost = field(default_factory=Cost)
    rid: str | None = None  # ledger reservation id (paid engines)
    head: str | None = None
    verify: VerifyResult | None = None
    timeout: float | None = None
    max_usd: Decimal | None = None
    # What the engine reported for its whole session at the end of this attempt (a resumed session
    # reports running totals): {"session_id", "cost_usd", "tokens"}; the next attempt's own share is
    # the difference (engines/base.py `Baseline`).
    totals: dict[str, Any] | None = None
    # Set while the engine is silent past `subtask.stallAfter` (a condition of a running attempt,
    # not a state): {"since": last event's time, "after": seconds, "action": mark|stop}; cleared
    # when the engine speaks again; kept when the attempt ended stalled.
    stalled: dict[str, Any] | None = None
    # The verify loop: which retry this attempt is (1..spec.retries; None: a person started it),
    # each check's result on its diff ({"check", "passed", "found"}), and, for a failed attempt
    # the worker did not retry, why not ("no retries left", "it changed nothing", a refusal).
    retry: int | None = None
    checks: list[dict[str, Any]] | None = None
    not_retried: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def _decode(cls, key: str, value: Any) -> Any:
        if key in ("totals", "stalled") and not isinstance(value, dict):
            return None  # damaged or foreign: read as absent
        if key == "checks":
            return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else None
        if key == "retry":
            return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
        if key == "cost":
            return Cost.from_dict(value if isinstance(value, dict) else None)
        if key == "max_usd":
            return money.money_or_none(value)
        if key == "verify" and value is not None:
            return VerifyResult.from_dict(value)
        return value

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def finish(self, state: str, **facts: Any) -> bool:
        """End this attempt once. Returns False (and changes nothing) if it already ended."""
        if self.terminal:
            return False
        self.state = state
        self.ended_at = facts.pop("ended_at", None) or now()
        for key, value in facts.items():
            setattr(self, key, value)
        return True


@dataclass
class Landing(_Record):
    """One landing of the job by `land` (subtask/ops/landing/land.py): the target's tip it was built on,
    the integrated commit, and the verify that ran on that commit. A fact tied to one commit;
    the latest few are kept."""

    at: float = 0.0
    target: str = ""  # the branch it was landing on
    onto: str = ""  # the target's tip it was integrated onto
    mode: str = ""  # merge | no-ff | squash | rebase
    outcome: str = ""  # passed | failed (verify) | conflict | unverified (--force, nothing to run) | already
    commit: str | None = None  # the integrated commit (None: it did not integrate)
    verify: VerifyResult | None = None  # run on `commit`
    conflicts: list[str] = field(default_factory=list)
    landed: bool = False  # the target moved to `commit` (or to a commit built on it, --atomic)
    # `land --batch`: not verified on its own, but as part of a batch whose last state, this
    # tree (on `batch_commit`), passed (`verify` is then that state's result).
    batch: str | None = None
    batch_commit: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def _decode(cls, key: str, value: Any) -> Any:
        if key == "verify":
            try:
                return VerifyResult.from_dict(value) if isinstance(value, dict) else None
            except TypeError:  # damaged or foreign: read as absent
                return None
        if key == "conflicts":
            return [str(v) for v in value] if isinstance(value, list) else []
        return value


@dataclass
class JobState(_Record):
    """Everything that changes in a job's record: its attempts and the facts added after them."""

    attempts: list[Attempt] = field(default_factory=list)
    worktree_removed: bool = False
    landed_in: str | None = None
    branch_deleted: bool = False
    group_place: dict[str, Any] | None = None  # a group member's rank, the pick, superseded (groups.py)
    # When a verify loop ended with every attempt failed: the attempt whose head the branch was
    # left at, and why ({"attempt", "head", "why", "moved_from"}; subtask/retries.py).
    best: dict[str, Any] | None = None
    landings: list[Landing] = field(default_factory=list)  # `land`'s verifies on integrated commits, latest last
    # The commit `land --reconcile` moved its branch onto (its work is counted from there, not
    # from `spec.base`: the branch then holds the target's commits too).
    rebased_onto: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def _decode(cls, key: str, value: Any) -> Any:
        if key == "attempts":
            return [Attempt.from_dict(a) for a in value or []]
        if key == "landings":  # a teammate's claim: anything but a list of objects reads as none
            return [Landing.from_dict(x) for x in value if isinstance(x, dict)] if isinstance(value, list) else []
        if key == "best" and not isinstance(value, dict):
            return None
        return value

    @property
    def current(self) -> Attempt:
        return self.attempts[-1]

    @property
    def state(self) -> str:
        return self.current.state if self.attempts else "queued"

    @property
    def kept(self) -> Attempt:
        """The attempt whose work the job's branch holds: the one a failed verify loop moved it
        back to (`best`), else the current one."""
        best = self.best.get("attempt") if isinstance(self.best, dict) and self.best.get("moved_from") else None
        return next((a for a in self.attempts if a.n == best), self.current)


@dataclass
class Evidence(_Record):
    """What the worker observed in git for one attempt, apart from what the engine claimed."""

    id: str
    attempt: int
    engine: str
    state: str
    base: str
    head: str
    branch: str | None
    commits: list[dict[str, Any]] = field(default_factory=list)  # {sha, subject}
    files: list[dict[str, Any]] = field(default_factory=list)  # {path, status, added, deleted}, the first MAX_FILES
    files_omitted: int = 0  # changed files beyond those listed (`totals` counts every one)
    totals: dict[str, int] = field(default_factory=dict)  # files, added, deleted, commits
    autocommit: dict[str, Any] | None = None  # {sha, files} when the worker committed leftovers
    verification: dict[str, Any] | None = None
    commands: dict[str, Any] = field(default_factory=dict)  # {seen: [...], tests: [...]}
    summary: str = ""
    outcome: str | None = None
    cost: dict[str, Any] = field(default_factory=dict)
    tokens: dict[str, int] | None = None
    model: str | None = None
    error: dict[str, Any] | None = None
    isolation: dict[str, Any] | None = None  # {mode, enforced_by, writable, missing, refused}
    main_worktree: dict[str, Any] | None = None  # {changed, paths}: `git status` before vs after the run
    # What the engine's summary claimed and the evidence contradicts ({"claim", "against"}; claims.py)
    claims: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    # A pulled record is a teammate's claim: its lists are read into the shape the code relies on
    # (an entry that is not an object is dropped, a missing or mistyped field gets its empty value).
    # Not annotated: a `ClassVar` annotation needs `typing` at run time to keep it out of the fields.
    _SHAPES = {"files": {"path": str, "status": str, "added": int, "deleted": int, "old_path": str},
               "commits": {"sha": str, "subject": str}}

    @classmethod
    def _decode(cls, key: str, value: Any) -> Any:
        shape: dict[str, type] | None = cls._SHAPES.get(key)  # type: ignore[assignment]  # (no ClassVar: typing is not loaded here)
        if shape is not None:
            return [_shaped(entry, shape) for entry in (value if isinstance(value, list) else [])
                    if isinstance(entry, dict)]
        if key == "totals":
            return {k: v for k, v in value.items() if isinstance(v, int)} if isinstance(value, dict) else {}
        if key in ("commands", "cost") and not isinstance(value, dict):
            return {}
        if key == "claims":
            return [c for c in value if isinstance(c, dict)] if isinstance(value, list) else None
        return value


def _shaped(entry: dict[str, Any], shape: dict[str, type]) -> dict[str, Any]:
    out = dict(entry)
    for name, kind in shape.items():
        if name in out and not isinstance(out[name], kind) or (kind is int and isinstance(out.get(name), bool)):
            out[name] = str(out[name]) if kind is str else 0
        elif name not in out and name != "old_path":
            out[name] = "" if kind is str else 0
    return out


class JobLike(Protocol):
    """What the helpers below read of a job (`git.records.Job`, a layer above this one)."""

    @property
    def spec(self) -> JobSpec: ...

    @property
    def state(self) -> JobState: ...

    @property
    def evidence(self) -> Evidence | None: ...

    @property
    def summary(self) -> str: ...

    @property
    def id(self) -> str: ...


def placement(spec: JobSpec) -> dict[str, Any] | None:
    """The executor facts a job's spec carries when it runs elsewhere (None: runs locally)."""
    value = getattr(spec, "extra", {}).get("executor")
    return (value if isinstance(value, dict) and isinstance(value.get("kind"), str) and value["kind"] != "local"
            else None)


def job_passed(job: JobLike) -> bool:
    """Ended done with verify passed, or done with no verify: what `wait`, `--after` and a map count as passing."""
    attempt = job.state.current
    return attempt.state == "done" and (attempt.verify is None or attempt.verify.passed)


def work_base(job: JobLike) -> str:
    """Where the job's own work starts: the commit `land --reconcile` moved it onto
    (`state.rebased_onto`), else its base. Its branch then holds the target's commits too, so its
    evidence, checks, re-runs and "made no commits" all count from here, never from `spec.base`."""
    return job.state.rebased_onto or job.spec.base


def runs_remotely(job: JobLike) -> bool:
    return placement(job.spec) is not None


def ray_job_id(attempt: Attempt) -> str | None:
    value = getattr(attempt, "extra", {}).get("ray_job")
    return value if isinstance(value, str) else None
