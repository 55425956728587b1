"""The job record: a chain of commits at `refs/subtask/<id>/record`, plus the base/head pins.

Each state change is one commit whose tree holds `spec.json` (immutable), `state.json`,
`evidence.json` (once there is some), `summary.md` and `events.jsonl` (a redacted tail), and whose
subject line is the one-line status, so `git log refs/subtask/<id>/record` is the job's history.
The message body carries one compact JSON line (`LIST_TAG`) that `list` reads without opening
trees, so listing 10,000 jobs costs one object read each.

Invariants:
- Every update goes through `chains.update` (the store group records share): a compare-and-swap
  on the old tip, re-read and re-applied on a race, so no writer's change is lost; a stale ref
  lock whose job has no live worker but us is removed, a younger one waited for.
- Ids are validated (`model.JOB_ID_RE`) before any ref name is built from them.
- Pins (`base`, `head`) keep evidence commits alive after the branch is deleted or squashed.
- Never hand out a `Job` read from a record that is not one (the ref points at a blob, at a commit
  of some other history, at a missing object, or at a tree whose spec.json/state.json does not
  parse into a job), because every command would then fail in its own way (a TypeError, a `wait`
  whose watcher died and that never returned). `read` raises `DamagedRecord` (a `SubtaskError`,
  exit 128) that names the ref and how to inspect it; listing skips such a record with a warning
  that says the same. Nothing here deletes a damaged ref: it is what there is to inspect.
- Never key a cache by job id, only by an immutable object id (the list cache maps record tips to
  entries), because then it can be incomplete but never stale, and needs no invalidation.
- Never make a new job's branch in a ref transaction of its own, because whoever looks between two
  (a teammate's fetch, `gc`, a crash) sees a branch with no record: `create_started` makes the
  branch, the base pin, the first record and its ownership ref in one
  (`tests/test_start.py::test_a_starting_jobs_branch_never_exists_without_its_record`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable

from subtask.git import chains
from subtask.git.chains import LOCK_WAIT as LOCK_WAIT  # the names callers use
from subtask.git.chains import cas_ref as cas_ref
from subtask.git.chains import ref_lock_age as ref_lock_age
from subtask.git.gitobjects import Ref, RefUpdate, commit_message, commit_signed
from subtask.git.gitrepo import Repo
from subtask.git.ownership import owned_ref
from subtask.model import money
from subtask.model.dataclass import dataclass
from subtask.model.errors import SubtaskError
from subtask.model.job import (
    ACTIVE,
    TERMINAL,
    Evidence,
    JobSpec,
    JobState,
    check_id_prefix,
    is_job_id,
    placement,
)
from subtask.state.statefiles import read_bytes, write_atomic

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    from typing import Any

PREFIX = chains.JOB.prefix
LIST_TAG = "Subtask-List: "
EVENTS_TAIL_LINES = 200
ATTEMPT_STATES = (*ACTIVE, *TERMINAL)


def record_ref(job_id: str) -> str:
    return chains.JOB.record_ref(job_id)


def pin_ref(job_id: str, which: str) -> str:
    return f"{PREFIX}{job_id}/{which}"


def branch_name(job_id: str) -> str:
    return f"subtask/{job_id}"


@dataclass
class Job:
    """A job as read from its record chain at one tip (`read`)."""

    spec: JobSpec
    state: JobState
    evidence: Evidence | None
    summary: str
    events_tail: str
    tip: str | None  # the record commit this was read from
    signed: bool = False  # the tip commit carries a signature (`signing.check` says whose, and if it holds)

    @property
    def id(self) -> str:
        return self.spec.id


def _dumps(obj: object) -> bytes:
    # ensure_ascii keeps lone surrogates and odd bytes from breaking the encoder.
    return (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode()


class DamagedRecord(SubtaskError):
    """A record ref that does not hold a readable job record."""

    def __init__(self, job_id: str, why: str):
        ref = record_ref(job_id)
        super().__init__("damaged", f"the record of {job_id} is damaged: {why}", hint=inspect_hint(job_id))
        self.job_id = job_id
        self.why = why
        self.ref = ref


def inspect_hint(job_id: str) -> str:
    ref = record_ref(job_id)
    return (f"inspect it: git cat-file -t {ref}; git log {ref} (point it back at a good record commit: "
            f"git update-ref {ref} <commit>)")


def _loads(blob: bytes, what: str) -> dict[str, Any]:
    """A JSON object from a record file; raises ValueError (with `what` in it) when it is not one."""
    try:
        data = json.loads(blob.decode("utf-8", errors="replace"))
    except ValueError:
        raise ValueError(f"{what} is not valid JSON") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} is not a JSON object")
    return data


def status_line(job: Job) -> str:
    """The one-line status: the record's commit subject and the first line of `list`."""
    from subtask.words import one_line

    return one_line(job)


def list_entry(job: Job) -> dict[str, Any]:
    """The compact facts `list` needs, stored in the record commit message."""
    from subtask.words import job_cost

    attempt = job.state.current
    verify = attempt.verify
    return {
        "v": 1,
        "id": job.id,
        "state": attempt.state,
        "attempt": attempt.n,
        "engine": job.spec.engine,
        "created": job.spec.created_at,
        "ended": attempt.ended_at,
        "verify": None if verify is None else ("passed" if verify.passed else "failed"),
        **({"verified": verify.head} if verify is not None and verify.passed else {}),  # `list` tells a moved branch
        "cost": money.to_json(job_cost(job)),  # every attempt's, as `spend` counts them
        "billing": attempt.cost.billing,
        **({"stalled": attempt.stalled} if attempt.stalled and not attempt.terminal else {}),
        "task": job.spec.task.strip().splitlines()[0][:100] if job.spec.task.strip() else "",
        "readonly": job.spec.readonly,
        "landed": job.state.landed_in,
        "error_kind": attempt.error_kind,
        "base": job.spec.base,
        **({"onto": job.state.rebased_onto} if job.state.rebased_onto else {}),  # land --reconcile moved it
        **({"group": job.spec.group, "placed": job.state.group_place is not None} if job.spec.group else {}),
        **({"on": where["kind"]} if (where := placement(job.spec)) else {}),  # runs elsewhere (a cluster)
        **({"clone": job.spec.clone} if job.spec.clone else {}),  # where it was started (ownership.owns)
        **({"after": job.spec.after} if job.spec.after else {}),  # what it waits (or waited) for
        **({"concurrency": job.spec.concurrency} if job.spec.concurrency else {}),  # a map member's bound
    }


def _write_commit(repo: Repo, job: Job, parent: str | None, must_sign: bool = False) -> str:
    files = [("spec.json", _dumps(job.spec.to_dict())), ("state.json", _dumps(job.state.to_dict()))]
    if job.evidence is not None:
        files.append(("evidence.json", _dumps(job.evidence.to_dict())))
    files.append(("summary.md", job.summary.encode("utf-8", "replace")))
    if job.events_tail:
        files.append(("events.jsonl", job.events_tail.encode("utf-8", "replace")))
    message = f"{status_line(job)}\n\n{LIST_TAG}{json.dumps(list_entry(job), ensure_ascii=True)}\n"
    return repo.objects.write_commit(files, message, [parent] if parent else [], must_sign=must_sign)


def write_commit(repo: Repo, job: Job, parent: str | None) -> str:
    """A record commit for `job` on `parent`, moving no ref (the Ray executor pushes it first)."""
    return _write_commit(repo, job, parent)


def create(repo: Repo, job: Job, *, owned: bool = True) -> None:
    """Write the first record commit; fails if a record with this id already exists.

    `owned`: with the ref that makes the job this clone's (`ownership.owned_ref`), in the same
    ref transaction, so no record of ours is ever without it, nor the ref without a record.
    """
    tip = _first_commit(repo, job)
    updates: list[RefUpdate] = [(record_ref(job.id), None, tip)]
    if owned:
        updates.append((owned_ref(job.id), None, tip))
    if repo.objects.update_refs(updates, "git-subtask: create") != "ok":
        raise SubtaskError("fatal", f"a record for {job.id} already exists")
    job.tip, job.signed = tip, repo.config.signing_key() is not None


def create_started(repo: Repo, job: Job, branch: str | None) -> None:
    """A new job's branch (None: a read-only job has none) and base pin at its base, its first record
    and its ownership ref, in one ref transaction: all or none, so nobody ever sees a job's branch
    without its record (a fatal error when any exists or is being written)."""
    tip = _first_commit(repo, job)
    base = job.spec.base
    updates: list[RefUpdate] = [(pin_ref(job.id, "base"), None, base), (record_ref(job.id), None, tip),
                                (owned_ref(job.id), None, tip)]
    if branch is not None:
        updates.insert(0, (f"refs/heads/{branch}", None, base))
    outcome = repo.objects.update_refs(updates, f"branch: Created from {base}")
    if outcome == "moved" and (branch is None or repo.objects.ref(f"refs/heads/{branch}") is None):
        raise SubtaskError("fatal", f"a record for {job.id} already exists")
    if outcome != "ok":
        raise _branch_refused(branch or pin_ref(job.id, "base"), outcome, hint=branch is not None)
    job.tip, job.signed = tip, repo.config.signing_key() is not None


def _first_commit(repo: Repo, job: Job) -> str:
    # Under subtask.sign=always a record that cannot be signed is not started (start undoes it all).
    return _write_commit(repo, job, None, must_sign=repo.config.sign_mode() == "always")


def read(repo: Repo, job_id: str) -> Job:
    """The job at the tip of its record; `DamagedRecord` when the ref holds something else."""
    ref = repo.objects.ref(record_ref(job_id))
    if ref is None:
        if repo.has_ref_file(record_ref(job_id)):
            raise DamagedRecord(job_id, f"its ref file {record_ref(job_id)} holds no object id")
        raise SubtaskError("not_found", f"no job {job_id} in {repo.root_str}", hint="git subtask list --all")
    if ref.symbolic:
        raise DamagedRecord(job_id, f"{ref.name} is a symbolic ref to {ref.target}")
    return read_commit(repo, ref.target, job_id)


def read_commit(repo: Repo, tip: str, job_id: str | None = None) -> Job:
    """The job a record commit holds. Every way it can fail is a `DamagedRecord` naming the job.

    `job_id` is the id the ref names (None: whichever job the commit says it is); a record whose
    spec belongs to another job is damaged too.
    """
    try:
        job = _parse_commit(repo, tip)
    except _NotARecord as exc:
        raise DamagedRecord(job_id or "?", f"{record_ref(job_id or '?')} -> {tip[:12]}: {exc}") from None
    if job_id is not None and job.spec.id != job_id:
        raise DamagedRecord(job_id, f"{record_ref(job_id)} -> {tip[:12]} holds the record of {job.spec.id}")
    return job


class _NotARecord(Exception):
    pass


_TypeSpec = dict[str, type | tuple[type, ...]]  # a key, and the types its value may have
_SPEC_TYPES: _TypeSpec = {"id": str, "task": str, "engine": str, "base": str, "created_at": (int, float)}
_ATTEMPT_TYPES: _TypeSpec = {"n": int, "state": str, "queued_at": (int, float)}


RECORD_FILES = ("spec.json", "state.json", "evidence.json", "summary.md", "events.jsonl")


def _parse_commit(repo: Repo, tip: str) -> Job:
    head, *found = repo.objects.read([tip, *(f"{tip}:{name}" for name in RECORD_FILES)])
    files = dict(zip(RECORD_FILES, found, strict=True))
    if head is None:
        raise _NotARecord("the object is missing from the repository (or cannot be read)")
    kind, raw = head
    if kind != "commit":
        raise _NotARecord(f"a {kind}, not a commit")
    missing = [name for name in ("spec.json", "state.json") if files[name] is None]
    if missing:
        subject = commit_message(raw).decode("utf-8", "replace").strip().split("\n")[0][:60]
        raise _NotARecord(f"a commit without {' or '.join(missing)}"
                          + (f" (not a job record: {subject!r})" if subject else ""))

    def blob(name: str) -> bytes | None:
        entry = files[name]
        if entry is None:
            return None
        if entry[0] != "blob":
            raise _NotARecord(f"{name} is not a file")
        return entry[1]

    def required(name: str) -> bytes:
        data = blob(name)
        if data is None:  # not reached: `missing` above said so first
            raise _NotARecord(f"a commit without {name}")
        return data

    try:
        spec_data, state_data = _loads(required("spec.json"), "spec.json"), _loads(required("state.json"), "state.json")
        _check_types(spec_data, _SPEC_TYPES, "spec.json")
        attempts = state_data.get("attempts")
        if not isinstance(attempts, list) or not attempts:
            raise ValueError("state.json has no attempts")
        for attempt in attempts:
            _check_types(attempt, _ATTEMPT_TYPES, "an attempt in state.json")
            if attempt["state"] not in ATTEMPT_STATES:
                raise ValueError(f"state.json has an attempt in an unknown state {attempt['state']!r}")
        spec = JobSpec.from_dict(spec_data)
        state = JobState.from_dict(state_data)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise _NotARecord(str(exc)) from None
    summary = (blob("summary.md") or b"").decode("utf-8", "replace")
    events = (blob("events.jsonl") or b"").decode("utf-8", "replace")
    return Job(spec, state, _evidence(blob("evidence.json"), spec.id), summary, events, tip, commit_signed(raw))


def _check_types(data: object, types: _TypeSpec, what: str) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{what} is not a JSON object")
    for key, kind in types.items():
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            raise ValueError(f"{what} has no valid {key!r}")


def _evidence(data: bytes | None, job_id: str) -> Evidence | None:
    """Evidence is a report, not the job: a damaged one reads as none, with a warning."""
    if data is None:
        return None
    try:
        return Evidence.from_dict(_loads(data, "evidence.json"))
    except (ValueError, TypeError) as exc:
        warnings.warn(f"{job_id}: damaged evidence.json in its record ({exc}); reading it as none", stacklevel=4)
        return None


def update(repo: Repo, job_id: str, change: Callable[[Job], bool | None], *, attempts: int = chains.ATTEMPTS,
           lock_wait: float = LOCK_WAIT) -> Job:
    """Apply `change` to the latest record and write it by compare-and-swap (`chains.update`).

    `change` mutates the job in place and returns False to write nothing (e.g. the attempt it
    wanted to end has already ended); it may run more than once.
    """
    def load() -> tuple[Job, str]:
        job = read(repo, job_id)
        assert job.tip is not None  # `read` sets it to the commit it read
        return job, job.tip

    job, tip = chains.update(repo, record_ref(job_id), owner=job_id, what=job_id, load=load, change=change,
                             write=lambda job, parent: _write_commit(repo, job, parent),
                             attempts=attempts, lock_wait=lock_wait)
    if tip != job.tip:
        job.tip, job.signed = tip, repo.config.signing_key() is not None  # (git says if it held)
    return job


def delete(repo: Repo, job_id: str) -> None:
    """Remove the record, pins and ownership ref (used only to undo a start that failed before its spawn)."""
    for name in (record_ref(job_id), pin_ref(job_id, "base"), pin_ref(job_id, "head"), owned_ref(job_id)):
        ref = repo.objects.ref(name)
        if ref is not None:
            cas_ref(repo, name, ref.target, None)


def create_branch(repo: Repo, branch: str, commit: str) -> None:
    """Create `refs/heads/<branch>` at `commit`; a fatal error if it exists or is being written."""
    outcome = chains.cas(repo, f"refs/heads/{branch}", None, commit, f"branch: Created from {commit}")
    if outcome != "ok":
        raise _branch_refused(branch, outcome)


def _branch_refused(name: str, outcome: str, hint: bool = True) -> SubtaskError:
    """The error of a branch (or pin) that could not be created: taken ("moved"), or locked."""
    why = "already exists" if outcome == "moved" else "is locked by another git process"
    return SubtaskError("fatal", f"cannot create the branch {name}: it {why}",
                        hint=f"git branch --list {name}" if hint else None)


def set_pin(repo: Repo, job_id: str, which: str, commit: str) -> None:
    name = pin_ref(job_id, which)
    ref = repo.objects.ref(name)
    old = ref.target if ref is not None else None
    if old != commit:
        cas_ref(repo, name, old, commit)


def pin_attempt(repo: Repo, job_id: str, n: int, head: str) -> None:
    """Keep attempt `n`'s head alive whatever happens to the branch: `refs/subtask/<id>/attempts/<n>`
    (a verify loop's attempts; the head a reconciliation moves the branch away from)."""
    set_pin(repo, job_id, f"attempts/{n}", head)


def all_ids(repo: Repo) -> list[str]:
    """Every job id with a record (reads ref names only)."""
    return [job_id for job_id, _ in record_refs(repo)]


def record_refs(repo: Repo, listed: list[Ref] | None = None) -> list[tuple[str, Ref]]:
    """(job id, ref) of every job record (a group's record is not a job's); of `listed` when given."""
    found = []
    for ref in repo.objects.refs(PREFIX) if listed is None else listed:
        if ref.name.startswith(PREFIX) and ref.name.endswith("/record"):
            job_id = ref.name[len(PREFIX):-len("/record")]
            if is_job_id(job_id):
                found.append((job_id, ref))
    return found


def resolve(repo: Repo, text: str) -> str:
    """The job id a full id or a unique prefix names."""
    prefix = check_id_prefix(text)
    if is_job_id(prefix) and (repo.objects.ref(record_ref(prefix)) is not None
                              or repo.has_ref_file(record_ref(prefix))):  # damaged: `read` says so
        return prefix
    matches = sorted(i for i in all_ids(repo) if i.startswith(prefix))
    if not matches:
        raise SubtaskError("not_found", f"no job matches '{text}'", hint="git subtask list --all")
    if len(matches) > 1:
        shown = ", ".join(matches[:10]) + (" …" if len(matches) > 10 else "")
        raise SubtaskError("usage", f"'{text}' is ambiguous: it matches {shown}", hint="give more characters of the id")
    return matches[0]


LIST_CACHE_VERSION = 2  # 2: entries say whether their tip is signed
# A cache file written (a new inode: ~0.8 ms on a busy ext4) pays for itself once it spares this
# many object reads (~0.05-0.1 ms each): fewer new records are read again by the next look instead.
CACHE_WORTH = 8


def _list_cache_path(repo: Repo) -> str:
    return repo.state_file("list-cache")


def list_entries(repo: Repo, listed: list[Ref] | None = None) -> list[dict[str, Any]]:
    """The compact list facts of every job, newest first; damaged records are skipped with a warning.
    `listed`: the refs already listed under `PREFIX` (and maybe others, left alone), else listed here.

    Each entry comes from the record tip's message (one object read, no trees), or from
    `<state>/list-cache-<repo>.json`, which maps record tips to their entries: a tip never changes
    meaning, so the cache cannot be stale, only incomplete. It is written when there is none, and
    when `CACHE_WORTH` tips were new to it; fewer are read again. 10,000 jobs list in ~0.05 s warm.
    """
    cached, cache_there = _read_list_cache(repo)
    refs = record_refs(repo, listed)
    unread = [ref.target for _, ref in refs if not ref.symbolic and ref.target not in cached]
    messages = dict(zip(unread, repo.objects.read(unread), strict=True))
    fresh: dict[str, dict[str, Any]] = {}
    for job_id, ref in refs:
        entry = cached.get(ref.target)
        if entry is None:
            try:
                entry = _list_line(ref, messages.get(ref.target), job_id)
            except ValueError as exc:
                warnings.warn(f"{job_id}: skipping its damaged record ({exc}); {inspect_hint(job_id)}", stacklevel=2)
                continue
        fresh[ref.target] = entry
    if len(unread) >= CACHE_WORTH or (not cache_there and fresh):
        _write_list_cache(repo, fresh)
    entries = [dict(entry, tip=tip) for tip, entry in fresh.items()]
    entries.sort(key=lambda e: e.get("created") or 0, reverse=True)
    return entries


def _list_line(ref: Ref, found: tuple[str, bytes] | None, job_id: str) -> dict[str, Any]:
    """The `Subtask-List` entry of a record tip; ValueError saying what is wrong when there is none."""
    if ref.symbolic:
        raise ValueError(f"a symbolic ref to {ref.target}")
    if found is None:
        raise ValueError(f"{ref.target[:12]} is missing from the repository (or cannot be read)")
    kind, raw = found
    if kind != "commit":
        raise ValueError(f"{ref.target[:12]} is a {kind}, not a commit")
    message = commit_message(raw)
    start = message.find(LIST_TAG.encode())
    if start < 0:
        raise ValueError(f"{ref.target[:12]} is not a record commit (no {LIST_TAG.strip()} line)")
    start += len(LIST_TAG)
    end = message.find(b"\n", start)
    entry = json.loads(message[start:end if end >= 0 else None])  # a ValueError names the damage
    if not isinstance(entry, dict) or entry.get("id") != job_id:
        raise ValueError(f"{ref.target[:12]} has a list line for another job or none")
    entry["signed"] = commit_signed(raw)  # from the commit, never from the line its writer wrote
    return entry


def _read_list_cache(repo: Repo) -> tuple[dict[str, dict[str, Any]], bool]:
    """(the cached entries by record tip, whether a cache of this version was there to read)."""
    try:
        data = json.loads(read_bytes(_list_cache_path(repo)))
        entries = data.get("entries") if isinstance(data, dict) and data.get("v") == LIST_CACHE_VERSION else None
        return (entries, True) if isinstance(entries, dict) else ({}, False)
    except (OSError, ValueError):
        return {}, False


def _write_list_cache(repo: Repo, entries: dict[str, dict[str, Any]]) -> None:
    """Best effort: a cache that cannot be written only costs the next `list` some reads."""
    try:
        write_atomic(_list_cache_path(repo),
                     json.dumps({"v": LIST_CACHE_VERSION, "entries": entries}, separators=(",", ":"),
                                ensure_ascii=True).encode(),
                     durable=False)
    except OSError:
        pass
