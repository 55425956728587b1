"""The job record: a chain of commits at `refs/subtask/<id>/record`, plus the base/head pins.

Each state change is one commit whose tree holds `spec.json` (immutable), `state.json`,
`evidence.json` (once there is some), `summary.md` and `events.jsonl` (a redacted tail), and whose
subject line is the one-line status, so `git log refs/subtask/<id>/record` is the job's history.
The message body carries one compact JSON line (`LIST_TAG`) that `list` reads without opening
trees, so listing 10,000 jobs costs one object read each.

Invariants:
- Every update is a compare-and-swap on the old tip (ref lock + re-check), retried on a race;
  `update` re-reads and re-applies the change, so no writer's change is lost.
- A ref lock older than `subtask.refLockStale` seconds whose job has no live worker but us was
  left by a dead writer, and `update` removes it; a younger one is waited for (`lock_wait`), never
  treated as a lost race.
- Ids are validated (`model.JOB_ID_RE`) before any ref name is built from them.
- Pins (`base`, `head`) keep evidence commits alive after the branch is deleted or squashed.
"""

from __future__ import annotations

import json
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pygit2

from subtask.errors import SubtaskError
from subtask.gitrepo import Repo, tool_signature
from subtask.model import Evidence, JobSpec, JobState, check_id_prefix, is_job_id

PREFIX = "refs/subtask/"
LIST_TAG = "Subtask-List: "
EVENTS_TAIL_LINES = 200


def record_ref(job_id: str) -> str:
    return f"{PREFIX}{job_id}/record"


def pin_ref(job_id: str, which: str) -> str:
    return f"{PREFIX}{job_id}/{which}"


def branch_name(job_id: str) -> str:
    return f"subtask/{job_id}"


@dataclass
class Job:
    spec: JobSpec
    state: JobState
    evidence: Evidence | None
    summary: str
    events_tail: str
    tip: str | None  # the record commit this was read from

    @property
    def id(self) -> str:
        return self.spec.id


def _dumps(obj) -> bytes:
    # ensure_ascii keeps lone surrogates and odd bytes from breaking the encoder.
    return (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode()


def _loads(blob: bytes, what: str) -> dict:
    try:
        data = json.loads(blob.decode("utf-8", errors="replace"))
        return data if isinstance(data, dict) else {}
    except ValueError:
        warnings.warn(f"damaged {what} in a job record; reading it as empty", stacklevel=3)
        return {}


def status_line(job: Job) -> str:
    """The one-line status: the record's commit subject and the first line of `list`."""
    from subtask.render import one_line

    return one_line(job)


def list_entry(job: Job) -> dict:
    """The compact facts `list` needs, stored in the record commit message."""
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
        "cost": attempt.cost.charged if attempt.cost.charged is not None else attempt.cost.observed,
        "billing": attempt.cost.billing,
        "task": job.spec.task.strip().splitlines()[0][:100] if job.spec.task.strip() else "",
        "readonly": job.spec.readonly,
        "landed": job.state.landed_in,
        "error_kind": attempt.error_kind,
        "base": job.spec.base,
    }


def _write_commit(repo: Repo, job: Job, parent: str | None) -> str:
    git = repo.git
    builder = git.TreeBuilder()
    builder.insert("spec.json", git.create_blob(_dumps(job.spec.to_dict())), pygit2.GIT_FILEMODE_BLOB)
    builder.insert("state.json", git.create_blob(_dumps(job.state.to_dict())), pygit2.GIT_FILEMODE_BLOB)
    if job.evidence is not None:
        builder.insert("evidence.json", git.create_blob(_dumps(job.evidence.to_dict())), pygit2.GIT_FILEMODE_BLOB)
    builder.insert("summary.md", git.create_blob(job.summary.encode("utf-8", "replace")), pygit2.GIT_FILEMODE_BLOB)
    if job.events_tail:
        builder.insert("events.jsonl", git.create_blob(job.events_tail.encode("utf-8", "replace")), pygit2.GIT_FILEMODE_BLOB)
    tree = builder.write()
    message = f"{status_line(job)}\n\n{LIST_TAG}{json.dumps(list_entry(job), ensure_ascii=True)}\n"
    sig = tool_signature()
    parents = [pygit2.Oid(hex=parent)] if parent else []
    return str(git.create_commit(None, sig, sig, message, tree, parents))


def cas_ref(repo: Repo, name: str, old: str | None, new: str | None, message: str = "git-subtask") -> bool:
    """Point `name` at `new` (None deletes it) only if it still points at `old` (None: absent)."""
    return _cas(repo, name, old, new, message) == "ok"


def _cas(repo: Repo, name: str, old: str | None, new: str | None, message: str) -> str:
    """`cas_ref`, saying why it did not write: "ok", "moved" (not at `old`) or "locked"."""
    git = repo.git

    class _Moved(Exception):
        pass

    try:
        with git.transaction() as txn:
            txn.lock_ref(name)
            ref = git.references.get(name)
            current = str(ref.target) if ref is not None else None
            if current != old:
                raise _Moved
            if new is None:
                txn.remove(name)
            else:
                txn.set_target(name, new, message=message)
    except _Moved:
        return "moved"
    except pygit2.GitError:
        return "locked"  # another writer holds the ref lock (or a dead one left it)
    return "ok"


# A ref lock is held for the instant of one update; one older than `subtask.refLockStale` seconds
# was left by a writer that died inside its update (kill -9).
LOCK_WAIT = 2.0  # how long an update waits by default for a young ref lock before it gives up


def ref_lock_path(repo: Repo, name: str):
    return repo.common_dir / f"{name}.lock"


def ref_lock_age(repo: Repo, name: str) -> float | None:
    """Seconds since the ref's lock file was made, or None when there is none."""
    try:
        return max(time.time() - ref_lock_path(repo, name).stat().st_mtime, 0.0)
    except OSError:
        return None


def _break_stale_lock(repo: Repo, job_id: str, name: str) -> bool:
    """Remove the ref lock a dead writer left: older than `subtask.refLockStale`, and no live
    worker of this job other than ourselves (its run-lock free, or held by this process)."""
    from subtask import liveness

    age = ref_lock_age(repo, name)
    if age is None or age < repo.config.number("refLockStale"):
        return False
    if not liveness.owns(job_id) and liveness.is_held(repo.state_dir, job_id):
        return False  # its worker is alive: it breaks the lock itself when it needs to
    try:
        ref_lock_path(repo, name).unlink()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    import sys

    print(f"git-subtask: removed a stale ref lock ({age:.0f}s old, its writer is gone): "
          f"{ref_lock_path(repo, name)}", file=sys.stderr)
    return True


def create(repo: Repo, job: Job) -> None:
    """Write the first record commit; fails if a record with this id already exists."""
    tip = _write_commit(repo, job, None)
    if not cas_ref(repo, record_ref(job.id), None, tip, "git-subtask: create"):
        raise SubtaskError("fatal", f"a record for {job.id} already exists")
    job.tip = tip


def read(repo: Repo, job_id: str) -> Job:
    ref = repo.git.references.get(record_ref(job_id))
    if ref is None:
        raise SubtaskError("not_found", f"no job {job_id} in {repo.root}", hint="git subtask list --all")
    return read_commit(repo, str(ref.target))


def read_commit(repo: Repo, tip: str) -> Job:
    commit = repo.git[tip]
    tree = commit.peel(pygit2.Tree)

    def blob(name: str) -> bytes | None:
        return repo.git[tree[name].id].data if name in tree else None

    spec = JobSpec.from_dict(_loads(blob("spec.json") or b"{}", "spec.json"))
    state = JobState.from_dict(_loads(blob("state.json") or b"{}", "state.json"))
    evidence_blob = blob("evidence.json")
    evidence = Evidence.from_dict(_loads(evidence_blob, "evidence.json")) if evidence_blob else None
    summary = (blob("summary.md") or b"").decode("utf-8", "replace")
    events = (blob("events.jsonl") or b"").decode("utf-8", "replace")
    return Job(spec, state, evidence, summary, events, tip)


def _wait_for_ref_lock(repo: Repo, job_id: str, name: str, until: float) -> None:
    """Return once the ref's lock is gone (or removed as stale); raise at `until`."""
    while ref_lock_age(repo, name) is not None and not _break_stale_lock(repo, job_id, name):
        if time.monotonic() >= until:
            raise SubtaskError(
                "fatal", f"could not update the record of {job_id}: {ref_lock_path(repo, name)} is locked",
                hint="it is removed once older than subtask.refLockStale seconds; if no git process "
                     "is running, remove it yourself")
        time.sleep(0.02)


def update(repo: Repo, job_id: str, change: Callable[[Job], bool | None], *, attempts: int = 200,
           lock_wait: float = LOCK_WAIT) -> Job:
    """Apply `change` to the latest record and write it by compare-and-swap, retrying on a race.

    `change` mutates the job in place and returns False to write nothing (e.g. the attempt it
    wanted to end has already ended). It may run more than once, so it must be a pure function of
    the job it is given. A held ref lock is waited for up to `lock_wait` seconds, and removed once
    it is stale (`_break_stale_lock`); past that, a `SubtaskError` names the lock file.
    """
    name = record_ref(job_id)
    raced = 0
    locked_until = None
    while True:
        job = read(repo, job_id)
        if change(job) is False:
            return job
        new_tip = _write_commit(repo, job, job.tip)
        outcome = _cas(repo, name, job.tip, new_tip, "git-subtask")
        if outcome == "ok":
            job.tip = new_tip
            return job
        if outcome == "locked" and ref_lock_age(repo, name) is not None:
            locked_until = locked_until or time.monotonic() + lock_wait
            _wait_for_ref_lock(repo, job_id, name, locked_until)
            continue
        raced += 1
        if raced >= attempts:
            raise SubtaskError("fatal", f"could not update the record of {job_id}: too much contention")
        time.sleep(min(0.05, 0.001 * raced) * random.random())


def delete(repo: Repo, job_id: str) -> None:
    """Remove the record and pins (used only to undo a start that failed before its spawn)."""
    for name in (record_ref(job_id), pin_ref(job_id, "base"), pin_ref(job_id, "head")):
        ref = repo.git.references.get(name)
        if ref is not None:
            cas_ref(repo, name, str(ref.target), None)


def set_pin(repo: Repo, job_id: str, which: str, commit: str) -> None:
    name = pin_ref(job_id, which)
    ref = repo.git.references.get(name)
    old = str(ref.target) if ref is not None else None
    if old != commit:
        cas_ref(repo, name, old, commit)


def all_ids(repo: Repo) -> list[str]:
    """Every job id with a record (reads ref names only)."""
    ids = []
    for name in repo.git.references:
        if name.startswith(PREFIX) and name.endswith("/record"):
            job_id = name[len(PREFIX):-len("/record")]
            if is_job_id(job_id):
                ids.append(job_id)
    return ids


def resolve(repo: Repo, text: str) -> str:
    """The job id a full id or a unique prefix names."""
    prefix = check_id_prefix(text)
    if is_job_id(prefix) and repo.git.references.get(record_ref(prefix)) is not None:
        return prefix
    matches = sorted(i for i in all_ids(repo) if i.startswith(prefix))
    if not matches:
        raise SubtaskError("not_found", f"no job matches '{text}'", hint="git subtask list --all")
    if len(matches) > 1:
        shown = ", ".join(matches[:10]) + (" …" if len(matches) > 10 else "")
        raise SubtaskError("usage", f"'{text}' is ambiguous: it matches {shown}", hint="give more characters of the id")
    return matches[0]


def _list_cache_path(repo: Repo):
    # Named by repository: several repositories may share one state dir (subtask.stateDir).
    import hashlib

    return repo.state_dir / f"list-cache-{hashlib.sha1(str(repo.common_dir).encode()).hexdigest()[:8]}.json"


def list_entries(repo: Repo) -> list[dict]:
    """The compact list facts of every job, newest first; damaged records are skipped with a warning.

    Each entry comes from the record tip's message (one object read, no trees), or from
    `<state>/list-cache-<repo>.json`, which maps record tips to their entries: a tip never changes
    meaning, so the cache cannot be stale, only incomplete. 10,000 jobs list in ~0.05 s warm.
    """
    cached = _read_list_cache(repo)
    fresh: dict[str, dict] = {}
    git = repo.git
    tag = LIST_TAG.encode()
    for ref in git.references.iterator():
        name = ref.name
        if not (name.startswith(PREFIX) and name.endswith("/record")):
            continue
        tip = str(ref.target)
        entry = cached.get(tip)
        if entry is None:
            try:
                message = git.get(ref.target).raw_message
                start = message.index(tag) + len(tag)
                end = message.find(b"\n", start)
                entry = json.loads(message[start:end if end >= 0 else None])
            except (AttributeError, ValueError) as exc:
                warnings.warn(f"skipping damaged record {name}: {exc}", stacklevel=2)
                continue
        fresh[tip] = entry
    if fresh.keys() != cached.keys():
        _write_list_cache(repo, fresh)
    entries = [dict(entry, tip=tip) for tip, entry in fresh.items()]
    entries.sort(key=lambda e: e.get("created") or 0, reverse=True)
    return entries


def _read_list_cache(repo: Repo) -> dict[str, dict]:
    try:
        data = json.loads(_list_cache_path(repo).read_bytes())
        entries = data.get("entries") if isinstance(data, dict) and data.get("v") == 1 else None
        return entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_list_cache(repo: Repo, entries: dict[str, dict]) -> None:
    """Best effort: a cache that cannot be written only costs the next `list` some reads."""
    from subtask.statefiles import write_atomic

    try:
        write_atomic(_list_cache_path(repo),
                     json.dumps({"v": 1, "entries": entries}, separators=(",", ":"), ensure_ascii=True).encode(),
                     durable=False)
    except OSError:
        pass
