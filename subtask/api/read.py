"""The reading operations: a job, the listing, what runs now, a group.

`list`, `status`, `show` and `result` come here, and only here: this module and what it imports
are what a reading command pays for (tests/test_imports.py holds each command to its budget).
What only some calls need (the landed sweep, a remote executor, the overlap of changed files,
signatures) is imported where it is needed.

Invariants:
- Never make the state folder in a read command (`list`, `status`, `spend`, the lazy sweep's
  stamp, the ledger's lock), because a look must leave the repository as it found it (issue 38:
  `list` in a fresh `git init` made `.git/subtask/`); without the folder no job ever ran here, so
  there is nothing to sweep or count (`git_habits::test_read_commands_create_nothing`).
- Never import on a reading command's path (`list`, `status`, `show`, `result`, `wait`) what
  only some calls need, nor click, because the interpreter's own start is ~10 ms and every module
  read and executed after it is the rest of the call (click alone was ~40 % of `--version`): what
  only some calls need (the landed sweep, the reconcile of dead workers, groups, signatures,
  another command's module) is looked for first (`slots.nothing_to_sweep`, `stamps.due`, a record
  that says it is unsigned), and imported when there is work. `tests/test_imports.py` holds each
  command to a budget of modules (`python -X importtime`).
"""

from __future__ import annotations

import json
import math
import os
import warnings

from subtask.git import ownership, records, where_landed
from subtask.git.gitobjects import Ref
from subtask.git.gitrepo import Repo, open_repo
from subtask.git.records import Job
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.model.job import ACTIVE, TERMINAL, is_job_id, job_passed  # noqa: F401  (api.job_passed)
from subtask.state import paths, slots, stamps

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    from subtask.state.statefiles import StrPath


def repo_at(path: str | os.PathLike | None = None) -> Repo:
    return open_repo(path)


def _positive(value, what: str, *, allow_none: bool = True, integer: bool = False,
              zero: bool = False):
    """`value` as a number > 0 (`zero`: >= 0), or a usage error naming `what`."""
    if value is None:
        if allow_none:
            return None
        raise SubtaskError("usage", f"{what} is required")
    noun = "whole number" if integer else "number"
    wanted = f"{what} must be a " + (f"finite {noun} >= 0" if zero else f"positive finite {noun}")
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError, OverflowError):
        raise SubtaskError("usage", f"{wanted}, not {value!r}") from None
    too_small = number < 0 if zero else number <= 0
    not_whole = integer and number != float(value)
    if isinstance(value, bool) or not math.isfinite(number) or too_small or not_whole:
        raise SubtaskError("usage", f"{wanted}, not {value!r}")
    return number


def sweep(repo: Repo) -> None:
    """Notice dead workers (and hand their slots on), and move on the waiting jobs whose jobs
    ended (`waiting.advance`). Cheap: one read of the slots file, and nothing more is imported,
    unless there is work (`slots.nothing_to_sweep`)."""
    if slots.nothing_to_sweep(repo.state_dir_str):
        return
    from subtask.ops.plans import waiting
    from subtask.ops.running import lifecycle

    lifecycle.reconcile(repo)
    waiting.advance(repo)


def get(repo: Repo, id_or_prefix: str) -> Job:
    if isinstance(id_or_prefix, str) and is_job_id(id_or_prefix):  # a whole id: one ref lookup, not two
        try:
            return records.read(repo, id_or_prefix)
        except SubtaskError as exc:
            if exc.kind != "not_found":
                raise
    return records.read(repo, records.resolve(repo, id_or_prefix))


def queue_position(repo: Repo, job_id: str) -> int | None:
    return slots.read(repo.state_dir_str).position(job_id)


DEFAULT_LIST_LIMIT = 50


LIST_STATES = (*ACTIVE, *TERMINAL)


@dataclass
class Listing:
    """The entries `list` shows (`list_jobs`), and what its limit and filters left out."""

    jobs: list[dict]
    more: int  # jobs left out by the limit
    swept: list[str] = field(default_factory=list)  # lines: what this call's lazy sweep did
    hidden: int = 0  # landed jobs left out (shown with include_all)


def list_jobs(repo: Repo, state: str | None = None, include_all: bool = False, limit: int | None = None) -> Listing:
    """Compact entries, newest first.

    By default: every active job, then the most recent finished ones up to `DEFAULT_LIST_LIMIT`,
    landed jobs hidden. `include_all` shows everything; `limit` caps the rows.
    """
    if state is not None and state not in (*LIST_STATES, "active", "ended"):
        raise SubtaskError("usage", f"unknown state '{state}' ({', '.join(LIST_STATES)}, active, ended)")
    sweep(repo)
    # The records and the landed marks, in one listing (None: listed again, each by itself).
    refs: list[Ref] | None = repo.objects.refs(records.PREFIX, where_landed.PREFIX, wanted=_listed_by_list)
    listed = records.list_entries(repo, refs)
    if _collect_ended_elsewhere(repo, listed):
        refs = None
        listed = records.list_entries(repo)
    swept: list[str] = []
    if _landed_sweep(repo, listed):
        before = {e["id"] for e in listed if e.get("landed")}
        refs = None
        listed = records.list_entries(repo)  # the sweep marked some jobs landed
        swept = _sweep_lines(repo, [e["id"] for e in listed if e.get("landed") and e["id"] not in before])
    where_landed.add_to_entries(repo, listed, refs)  # a teammate's job landed here: its record cannot say so
    current = slots.read(repo.state_dir_str)
    if limit is None and not include_all:
        limit = DEFAULT_LIST_LIMIT
    entries: list[dict] = []
    more = 0
    hidden = 0
    for entry in listed:
        if not include_all and entry.get("landed") and state is None:
            hidden += 1
            continue
        job_state = entry.get("state")
        if state == "active" and job_state not in ACTIVE:
            continue
        if state == "ended" and job_state not in TERMINAL:
            continue
        if state not in (None, "active", "ended") and job_state != state:
            continue
        entry["position"] = current.position(entry["id"]) if job_state == "queued" else None
        if limit and len(entries) >= limit and job_state in TERMINAL:
            more += 1
            continue
        entries.append(entry)
    _mark_moved(repo, entries)
    _mark_overlap(repo, entries, listed)
    return Listing(entries, more, swept, hidden)


def _listed_by_list(name: str) -> bool:
    """The refs `list` reads: each record (a job's or a group's) and the landed marks, none of
    the pins (`base`, `head`, `attempts/<n>`: three of each job's four ref files)."""
    return not name.startswith(records.PREFIX) or name.endswith("/record")


def _landed_sweep(repo: Repo, listed: list[dict]) -> bool:
    """The lazy landed sweep (`cleanup.maybe_sweep`) when it is due: True when a job landed."""
    if not os.path.isdir(repo.state_dir_str):
        return False  # no job ever started here: nothing to sweep, and nothing to import for it
    try:
        if not stamps.due(repo.state_dir_str, paths.SWEEP_STAMP, repo.config.number("sweepInterval")):
            return False
    except SubtaskError:
        pass  # a bad sweepInterval: the sweep's own reading of it says so
    from subtask.ops.landing import cleanup

    return cleanup.maybe_sweep(repo, listed)


def _mark_overlap(repo: Repo, shown: list[dict], listed: list[dict]) -> None:
    """`marks`: a finished job's base behind the land target, jobs that change the same files
    (`overlap.mark`). Advisory: a failure to say is never a failure of the command."""
    from subtask.ops.landing import overlap

    try:
        overlap.mark(repo, shown, listed)
    except (SubtaskError, OSError) as exc:
        warnings.warn(f"could not tell which jobs overlap: {exc}", stacklevel=2)


def _mark_moved(repo: Repo, entries: list[dict]) -> None:
    """`moved`: the branch of a job whose verify passed has moved since (a commit verify never
    tested): `list` must not say "passed" of a tip merge refuses. One ref listing, only when needed."""
    verified = [e for e in entries if e.get("verified") and not e.get("landed")]
    if not verified:
        return
    tips = {ref.name: ref.target for ref in repo.objects.refs("refs/heads/" + records.branch_name(""))}
    for entry in verified:
        tip = tips.get("refs/heads/" + records.branch_name(entry["id"]))
        if tip is not None and tip != entry["verified"]:
            entry["moved"] = tip


def branch_moved(repo: Repo, job: Job) -> str | None:
    """The tip of a job's branch when it moved after its verify passed (untested), else None."""
    verify = job.state.current.verify
    if verify is None or not verify.passed or not job.spec.branch or job.state.landed_in:
        return None
    ref = repo.objects.ref(f"refs/heads/{job.spec.branch}")
    return ref.target if ref is not None and ref.target != verify.head else None


def _collect_ended_elsewhere(repo: Repo, listed: list[dict]) -> list[str]:
    """Bring home the active jobs run elsewhere that their executor says ended (one status request
    each; none active: no import of the executors' registry, nor of an executor)."""
    if not any(e.get("on") not in (None, "local") and e.get("state") in ("queued", "running") for e in listed):
        return []
    from subtask import executors

    ended = []
    for executor in executors.elsewhere():
        active = [e for e in listed if executors.of_entry(e) is executor and e.get("state") in ("queued", "running")]
        if active:
            ended += executor.backend().collect_active(repo, active)
    return ended


def _sweep_lines(repo: Repo, landed_ids: list[str]) -> list[str]:
    """One line saying what the lazy sweep did for the jobs it found landed (their branches and
    clean worktrees removed), so `list` does not remove a person's branches silently."""
    if not landed_ids:
        return []
    removed = []
    for job_id in landed_ids:
        try:
            state = records.read(repo, job_id).state
        except SubtaskError:
            continue
        what = [word for word, gone in (("branch", state.branch_deleted), ("worktree", state.worktree_removed)) if gone]
        removed.append(f"{job_id}" + (f" ({' and '.join(what)} removed)" if what else ""))
    jobs = "job" if len(landed_ids) == 1 else "jobs"
    return [f"found {len(landed_ids)} landed {jobs}: " + ", ".join(removed)]


def record_facts(repo: Repo, job: Job) -> dict:
    """Who wrote a job's record, for `show`: its signature as git checks it here, and whether this
    clone started the job (`ownership`)."""
    if job.signed:
        from subtask.git import signing

        signature = signing.check_one(repo, job.tip, job.signed)
    else:
        from subtask.model.provenance import UNSIGNED as signature
    return {"signature": signature, "mine": ownership.owns(repo, job)}


def add_record_facts(repo: Repo, entries: list[dict]) -> list[dict]:
    """`list --json`: each entry's `signature` (as `record_facts`, one git run for every signed
    tip) and `mine`, from the clone id and one listing of ownership refs."""
    from subtask.git import signing
    from subtask.model.provenance import UNSIGNED

    checked = signing.check(repo, [e["tip"] for e in entries if e.get("signed") and e.get("tip")])
    clone = ownership.clone_id(repo)
    owned = ownership.owned_keys(repo) if clone else set()
    for entry in entries:
        tip = entry.get("tip")
        found = checked.get(tip) if entry.get("signed") and isinstance(tip, str) else None
        entry["signature"] = (found or UNSIGNED).to_dict()
        entry["mine"] = entry.get("clone") == clone and entry["id"] in owned
    return entries


def worktree_present(job: Job) -> bool:
    """Whether the job's worktree is on disk (a read-only job's goes when it ends; cleanup removes others)."""
    return os.path.isdir(job.spec.worktree)


def status(repo: Repo, id_or_prefix: str | None = None) -> list[tuple[Job, int | None, str | None, dict]]:
    """(job, queue position, latest activity, marks) for one job, or for every active job; the
    marks as `list` has them (a stale base, jobs changing the same files)."""
    marks: dict[str, dict] = {}
    if id_or_prefix is not None:
        jobs = [get(repo, id_or_prefix)]
        entry = dict(records.list_entry(jobs[0]), tip=jobs[0].tip)
        _mark_overlap(repo, [entry], [e for e in records.list_entries(repo) if e["id"] != entry["id"]] + [entry])
        marks[entry["id"]] = entry.get("marks") or {}
    else:
        jobs = []
        for entry in list_jobs(repo, state="active").jobs:
            marks[entry["id"]] = entry.get("marks") or {}
            try:
                jobs.append(records.read(repo, entry["id"]))
            except records.DamagedRecord as exc:  # the others still show
                warnings.warn(f"{exc.message}; {exc.hint}", stacklevel=2)
    current = slots.read(repo.state_dir_str)
    return [(job, current.position(job.id), None if job.state.current.terminal else latest_activity(repo, job.id),
             marks.get(job.id) or {}) for job in jobs]


def worker_log(repo: Repo, job_id: str) -> str | None:
    """The text of the job's worker log (`show --log`), None when there is none."""
    try:
        with open(paths.log_file(repo.state_dir_str, job_id), errors="replace") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def latest_activity(repo: Repo, job_id: str) -> str | None:
    """The last thing the job did, from its events file (e.g. "running: pytest -q")."""
    lines = _tail_lines(paths.run_file(repo.state_dir_str, job_id, "events.jsonl", make=False))

    from subtask import words as render

    for line in reversed(lines):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        text = render.activity_text(event)
        if text:
            return text[:120]
    return None


def _tail_lines(path: str, size: int = 4096) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []


def _groups():
    from subtask.ops.plans import groups

    return groups


def get_group(repo: Repo, gid_or_prefix: str):
    """The group, concluded if every member has ended (whoever looks first decides it)."""
    sweep(repo)
    return _groups().conclude(repo, _groups().resolve(repo, gid_or_prefix))


@dataclass
class GroupPage:
    """A group as `show` and `result` give it: its table's rows, its pick's record (if any) and
    whether it passed (a pick, or a map done)."""
    group: object  # ops.plans.groups.Group
    rows: list[dict]
    pick: Job | None
    passed: bool


def group_page(repo: Repo, group) -> GroupPage:
    groups = _groups()
    try:
        pick = records.read(repo, group.pick) if group.pick else None
    except SubtaskError:
        pick = None  # its record is gone: the table still says what it was
    return GroupPage(group, groups.table_rows(repo, group), pick, groups.passed_group(group))


def list_groups(repo: Repo, entries: list[dict]) -> dict[str, object]:
    """The groups of the listed jobs (settling those whose members have all ended), by id."""
    if not any(e.get("group") for e in entries):
        return {}
    groups = _groups()
    groups.conclude_listed(repo, entries)
    found = {}
    for gid in dict.fromkeys(e["group"] for e in entries if e.get("group")):
        try:
            found[gid] = groups.read(repo, gid)[0]
        except SubtaskError:
            continue  # a member whose group record is missing lists as an ordinary job
    return found


def evidence_envelope(job: Job) -> dict:
    """The JSON envelope: what the runner observed, apart from what the engine reported."""
    attempt = job.state.current
    evidence = job.evidence.to_dict() if job.evidence else None
    return {
        "v": 1,
        "id": job.id,
        "engine": job.spec.engine,
        "model": attempt.model or job.spec.model,
        "kind": "readonly" if job.spec.readonly else "worktree",
        "state": attempt.state,
        "outcome": attempt.outcome,
        "attempts": len(job.state.attempts),
        "task": job.spec.task,
        "git": {
            "base": job.spec.base,
            "head": evidence["head"] if evidence else None,
            "branch": job.spec.branch,
            "commits": evidence["commits"] if evidence else [],
            "changed_files": evidence["files"] if evidence else [],
            "totals": evidence["totals"] if evidence else {},
            "autocommit": evidence["autocommit"] if evidence else None,
        },
        "verification": attempt.verify.to_dict() if attempt.verify else None,
        "isolation": {"mode": job.spec.isolation, "source": job.spec.isolation_source}
        | ((evidence or {}).get("isolation") or {}),
        "main_worktree": (evidence or {}).get("main_worktree"),
        "commands": evidence["commands"] if evidence else {"seen": [], "tests": []},
        "summary": job.summary,
        "cost": attempt.cost.to_dict() | ({"billing": "reserved"} if attempt.rid and not attempt.terminal else {}),
        "tokens": attempt.tokens,
        "session_id": attempt.session_id,
        "error": ({"kind": attempt.error_kind, "message": attempt.reason, "hint": attempt.hint}
                  if attempt.state == "failed" else None),
        "landed_in": job.state.landed_in,
        # the verify loop (docs/verify.md): each check's verdict, each attempt's, where it was left
        "checks": attempt.checks,
        "loop": [{"n": a.n, "retry": a.retry, "state": a.state, "head": a.head,
                  "verify": None if a.verify is None else ("passed" if a.verify.passed else "failed"),
                  "tests": a.verify.tests if a.verify else None,
                  "checks_failed": a.verify.checks_failed if a.verify else None,
                  "not_retried": a.not_retried} for a in job.state.attempts] if len(job.state.attempts) > 1 else None,
        "best": job.state.best,
        # what the engine's summary claimed and the evidence contradicts (never decided on)
        "claims": (evidence or {}).get("claims"),
    }



def all_ids(repo: Repo) -> list[str]:
    """Every job id, then every group id, here (what shell completion offers for an ID)."""
    return sorted(records.all_ids(repo)) + sorted(_groups().all_ids(repo))


def engine_names(repo: Repo) -> list[str]:
    """The built-in engines' names and those `subtask.engine.<name>.command` configures."""
    from subtask.engines import configured_command_engines
    from subtask.engines import engine_names as names

    return names(configured_command_engines([e.name for e in repo.git.config]))


def notify_feed_end(state_dir: StrPath) -> tuple[int, int]:
    """Where the job events an MCP client is told of (`ops/running/notify`) end now."""
    from subtask.ops.running import notify

    return notify.feed_end(state_dir)


def notify_feed_since(state_dir: StrPath, position: tuple[int, int]) -> tuple[list[dict], tuple[int, int]]:
    """The job events told since `position`, and the position after them."""
    from subtask.ops.running import notify

    return notify.feed_since(state_dir, position)
