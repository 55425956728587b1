"""`git subtask push` / `pull`: share job records and review notes with teammates through a remote.

What travels: `refs/subtask/*` (records and pins), `refs/notes/subtask` (review blocks), and with
`push --branches` the job branches `refs/heads/subtask/*`.

How: `pull` asks the remote for its tips (`ls-remote`), fetches the objects it lacks without
writing any ref (`fetch --refmap= <names>`: no FETCH_HEAD, no tracking ref), then compares each
ref here with the remote's copy and moves ours only forward, by compare-and-swap. `push` pushes
without force; for each ref the remote refuses it fetches the remote's copy and compares the same
way. The comparison (`compare`) has four answers: the same, the remote's is newer (a descendant of
ours: an older copy here, which `pull` fast-forwards and `push` leaves alone), ours is newer (a
descendant of the remote's: `push` shares it, `pull` keeps it), or diverged (neither descends from
the other: the only real conflict, reported, nothing overwritten on either side).

Invariants:
- Never a forced refspec, in either direction, and never a local ref moved except forward (CAS on
  the value compared), because a forced ref drops unpushed records and notes, and
  `receive.denyNonFastForwards` would not stop it (it guards refs/heads/ only).
- Never call an older copy of a ref a divergence, because a teammate's record that moved on since
  the last pull is no conflict: `sync.compare` answers same / theirs newer / ours newer / diverged
  (neither descends from the other), and only "diverged" is reported as kept (tests:
  `sync::test_an_older_copy_of_a_record_is_not_a_divergence`).
- Never move a local ref in `pull` except forward and by compare-and-swap on the value compared,
  and never share a fixed scratch ref between syncs, because two syncs (or a sync and a running
  job's record update) in one clone run at once (the old `refs/notes/remotes/<remote>/subtask` was
  deleted and re-created by two syncs under each other, and a push read it back as gone and
  crashed): the remote's notes are merged from the object id `ls-remote` named, fetched without
  writing any ref (tests: `sync::test_syncs_at_once_in_one_clone_all_succeed`,
  `sync::test_a_pull_racing_a_running_jobs_record_updates_succeeds_and_loses_no_update`).
- Any pair of syncs may run at once in one clone (and with a running job writing its record):
  every local write is a CAS that re-compares on a race, and a push the remote refused for a
  passing reason (the ref moved, its lock was busy) is retried with growing, jittered back-off
  for up to `PUSH_PATIENCE_S`; a refusal for any other reason (a hook declined it) is reported
  at once, never retried.
- Never retry a push the remote refused for a reason that does not pass (a hook declined it),
  because retrying cannot change the answer; retry the ones that pass (the ref moved, its lock was
  busy) with growing, jittered back-off for up to 60 s, because on a loaded machine a round is
  slower than a teammate's push cycle and ten quick rounds all lost.
- Never treat a fetched tip as complete because its object is present, because a concurrent fetch
  writes loose objects one by one; only a finished `git fetch` (which checks connectivity) says the
  history is here, so every tip that differs from our ref is fetched.
"""

from __future__ import annotations

import random
import re
import time

import pygit2

from subtask.git import chains, notes, notes_store, ownership, records
from subtask.git.gitrepo import Repo, git
from subtask.model import executors, lazyre
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError

RECORDS_SPEC = "refs/subtask/*:refs/subtask/*"
BRANCHES_SPEC = "refs/heads/subtask/*:refs/heads/subtask/*"
NOTES_SPEC = f"{notes_store.NOTES_REF}:{notes_store.NOTES_REF}"
PUSH_PATIENCE_S = 60.0  # retries of what the remote refused for a passing reason, for at most this
# A refusal worth retrying: another push moved the ref, or held its lock, in between (git's words).
TRANSIENT_REFUSAL = lazyre.compile(r"fetch first|non-fast-forward|failed to update ref|failed to lock|"
                               r"cannot lock ref|incorrect old value|stale info")
FETCH_ROUNDS = 3  # ls-remote + fetch again when the remote moved in between
CAS_RETRIES = 50
FETCH_CHUNK = 200  # ref names per fetch command line

SAME, THEIRS_NEWER, OURS_NEWER, DIVERGED = "same", "theirs newer", "ours newer", "diverged"


@dataclass
class SyncResult:
    """What a `push` or `pull` did, ref by ref."""

    remote: str
    new_jobs: list[str] = field(default_factory=list)  # pull: jobs that arrived
    new_groups: list[str] = field(default_factory=list)  # pull: groups that arrived
    updated: list[str] = field(default_factory=list)  # refs that moved
    kept_local: list[str] = field(default_factory=list)  # refs that diverged (or could not be synced)
    older_here: list[str] = field(default_factory=list)  # push: the remote has a newer copy (not a conflict)
    ahead_here: list[str] = field(default_factory=list)  # pull: ours is newer (push shares it)
    # pull: our job's ref -> where a teammate's commits on it were kept
    aside: dict[str, str] = field(default_factory=dict)
    notes: str = ""
    lines: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.kept_local


def _check_remote(repo: Repo, remote: str) -> None:
    if not remote or remote.startswith("-") or not re.fullmatch(r"[A-Za-z0-9._/-]+", remote) or ".." in remote:
        raise SubtaskError("usage", f"not a remote name: {remote!r}")
    if git(repo.root, "remote", "get-url", remote, check=False).returncode != 0:
        raise SubtaskError("usage", f"no remote named '{remote}'", hint=f"git remote add {remote} <url>")


# ---------------------------------------------------------------- comparing with the remote

def compare(repo: Repo, ours: str | None, theirs: str) -> str:
    """How our copy of a ref relates to the remote's (whose objects are here).

    A side that is no commit (a damaged ref: a blob, a missing object) has no history to compare,
    so it counts as diverged: kept as it is, reported, never overwritten.
    """
    if ours == theirs:
        return SAME
    try:
        if ours is None or repo.git.descendant_of(theirs, ours):
            return THEIRS_NEWER
        if repo.git.descendant_of(ours, theirs):
            return OURS_NEWER
    except (KeyError, ValueError, pygit2.GitError):
        pass
    return DIVERGED


def _local_tip(repo: Repo, name: str) -> str | None:
    ref = repo.git.references.get(name)
    return str(ref.target) if ref is not None else None


def _has_object(repo: Repo, oid: str) -> bool:
    try:
        return oid in repo.git
    except (ValueError, pygit2.GitError):
        return False


def remote_tips(repo: Repo, remote: str, patterns: list[str]) -> dict[str, str]:
    """{ref: oid} on the remote for these patterns (ls-remote matches tails: keep exact prefixes)."""
    proc = git(repo.root, "ls-remote", remote, *patterns, check=False, timeout=300)
    if proc.returncode != 0:
        raise SubtaskError("fatal", f"git ls-remote {remote} failed: {proc.stderr.strip()}")
    wanted = tuple(p[:-1] if p.endswith("*") else p for p in patterns)
    tips = {}
    for line in proc.stdout.splitlines():
        oid, _, name = line.partition("\t")
        exact_or_under = any(name == w or (w.endswith("/") and name.startswith(w)) for w in wanted)
        if exact_or_under and pygit2.reference_is_valid_name(name) and re.fullmatch(r"[0-9a-f]{40,64}", oid):
            tips[name] = oid
    return tips


def _fetch_objects(repo: Repo, remote: str, tips: dict[str, str]) -> None:
    """Fetch what these remote refs point at, writing no ref at all (no FETCH_HEAD, no tracking ref).

    Every tip that differs from our ref of that name is fetched, even when its object is already
    here: another fetch may be writing those objects one by one right now, and only a finished
    fetch (git checks connectivity before it skips work) says the whole history is here.
    """
    missing = [name for name, oid in sorted(tips.items()) if _local_tip(repo, name) != oid]
    for i in range(0, len(missing), FETCH_CHUNK):
        proc = git(repo.root, "fetch", "--no-tags", "--no-write-fetch-head", "--refmap=", remote,
                   *missing[i:i + FETCH_CHUNK], check=False, timeout=300)
        if proc.returncode != 0:
            raise SubtaskError("fatal", f"git fetch from {remote} failed: {proc.stderr.strip()}")


def _fetched_tips(repo: Repo, remote: str, patterns: list[str]) -> dict[str, str]:
    """The remote's tips, with their objects here. Asks again if the remote moved in between."""
    for _ in range(FETCH_ROUNDS):
        tips = remote_tips(repo, remote, patterns)
        try:
            _fetch_objects(repo, remote, tips)
        except SubtaskError:
            continue  # e.g. a ref deleted on the remote after ls-remote named it
        if all(_has_object(repo, oid) for oid in tips.values()):
            return tips
    tips = remote_tips(repo, remote, patterns)
    _fetch_objects(repo, remote, tips)  # the last try reports its own error
    return {name: oid for name, oid in tips.items() if _has_object(repo, oid)}


def _merge_notes(repo: Repo, theirs: str) -> str:
    ids = set(records.all_ids(repo))
    return notes_store.merge_ref(repo.objects, theirs, notes.lock_path(repo), prefer_local=lambda j: j in ids)


# ---------------------------------------------------------------- push

def push(repo: Repo, remote: str = "origin", branches: bool = False) -> SyncResult:
    """Push records, pins and notes (and job branches) without force; merge notes on a race."""
    _check_remote(repo, remote)
    notes_store.ensure_ref(repo.objects)
    result = SyncResult(remote)
    specs = [RECORDS_SPEC, NOTES_SPEC] + ([BRANCHES_SPEC] if branches else [])
    return _push_until_taken(repo, remote, specs, result)


def _push_until_taken(repo: Repo, remote: str, specs: list[str], result: SyncResult) -> SyncResult:
    """Push `specs` (never forced); resolve what the remote refused and push that again."""
    deadline = time.monotonic() + PUSH_PATIENCE_S
    round_ = 0
    while True:
        refused = _push(repo, remote, specs, result)
        passing = {ref: why for ref, why in refused.items() if TRANSIENT_REFUSAL.search(why)}
        retry = _resolve_refused(repo, remote, passing, result) if passing else set()
        refused = {ref: why for ref, why in refused.items() if ref in retry or ref not in passing}
        if not retry or time.monotonic() >= deadline:
            break
        specs = [f"{ref}:{ref}" for ref in sorted(retry)]
        # Others pushing the same refs (a teammate's notes, another push from this clone): back
        # off with jitter, longer each round, so a loaded machine's slow round still gets a turn.
        round_ += 1
        time.sleep(min(1.0, 0.05 * 2 ** round_) * random.random())
    result.kept_local += sorted(set(refused) - set(result.kept_local))
    for ref in sorted(refused):
        result.lines.append(f"not pushed: {ref}: {remote} refused it {refused[ref]} "
                            f"(never forced; compare: git log {ref} and git ls-remote {remote} {ref})")
    return result


def _push(repo: Repo, remote: str, specs: list[str], result: SyncResult) -> dict[str, str]:
    """Run one push; returns the destination refs the remote refused, with git's reason."""
    proc = git(repo.root, "push", "--porcelain", remote, *specs, check=False, timeout=300)
    refused: dict[str, str] = {}
    seen_status = False
    for line in proc.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or ":" not in parts[1]:
            continue
        seen_status = True
        flag, dest = parts[0], parts[1].split(":", 1)[1]
        if flag == "!":
            refused[dest] = parts[2].strip()
        elif flag in (" ", "*"):
            result.updated.append(dest)
            result.lines.append(f"pushed {dest}")
    if proc.returncode != 0 and not seen_status:
        raise SubtaskError("fatal", f"git push to {remote} failed: {proc.stderr.strip()}")
    return refused


def _resolve_refused(repo: Repo, remote: str, refused: dict[str, str], result: SyncResult) -> set[str]:
    """Look at what the remote refused; returns the refs worth pushing again.

    The notes: theirs merged into ours, then pushed again (a fast-forward). A record, pin or branch
    where the remote's copy is newer: nothing of ours is missing there (an older copy here is not a
    divergence). Ours newer: the remote moved or its ref lock was busy; push again. Diverged: kept.
    """
    tips = _fetched_tips(repo, remote, sorted(refused))
    owned = ownership.owned_keys(repo)
    retry = set()
    for ref in sorted(refused):
        theirs = tips.get(ref)
        if theirs is None:
            retry.add(ref)  # the remote has no such ref: a creation that lost a lock race
            continue
        if ref == notes_store.NOTES_REF:
            result.notes = _merge_notes(repo, theirs)
            result.lines.append(f"notes: the remote had notes we lacked: {result.notes}")
            retry.add(ref)
            continue
        relation = compare(repo, _local_tip(repo, ref), theirs)
        if relation == SAME:
            continue  # another push put the same commit there meanwhile
        key, which = _owner_key(ref)
        if key in owned and relation in (THEIRS_NEWER, DIVERGED) and not _runs_on_our_cluster(repo, key):
            result.kept_local.append(ref)
            result.lines.append(f"not pushed: {ref}: {remote} has commits on this clone's job that this clone did "
                                f"not write (git subtask pull keeps them aside at "
                                f"{ownership.aside_ref(remote, key, which)}; never forced)")
            continue
        if relation == THEIRS_NEWER:
            result.older_here.append(ref)
            how = "git subtask pull takes it" if ref.startswith(records.PREFIX) else f"git fetch {remote} to see it"
            result.lines.append(f"{remote} has a newer copy of {ref}: ours is older, nothing to push ({how})")
        elif relation == OURS_NEWER:
            retry.add(ref)
        else:
            result.kept_local.append(ref)
            result.lines.append(f"not pushed: {ref} diverged from {remote}'s copy (never forced; "
                                f"compare: git log {ref} and git ls-remote {remote} {ref})")
    return retry


# ---------------------------------------------------------------- one job (the Ray executor)

def job_refs(job_id: str) -> list[str]:
    """The refs that make one job: its branch, record, pins; with the notes, what a node fetches
    and pushes for it (`subtask/executors`)."""
    return [f"refs/heads/{records.branch_name(job_id)}", records.record_ref(job_id),
            records.pin_ref(job_id, "base"), records.pin_ref(job_id, "head")]


def push_job(repo: Repo, remote: str, job_id: str, notes: bool = True) -> SyncResult:
    """Push one job's refs that exist here, and the notes (merged on a race), never forced.
    `remote` may be a URL: a cluster node has no remote names of ours."""
    specs = [f"{ref}:{ref}" for ref in job_refs(job_id) if _local_tip(repo, ref) is not None]
    specs += [f"{ref.name}:{ref.name}" for ref in repo.objects.refs(records.pin_ref(job_id, "attempts/"))
              if not ref.symbolic]  # a verify loop's attempts, each kept whatever the loop did with the branch
    if notes:
        notes_store.ensure_ref(repo.objects)
        specs.append(NOTES_SPEC)
    return _push_until_taken(repo, remote, specs, SyncResult(remote))


def fetch_job(repo: Repo, remote: str, job_id: str) -> SyncResult:
    """Take one job's refs from the remote where the remote's copy is newer (fast-forward by CAS,
    never overwriting ours), and merge the remote's notes into ours."""
    result = SyncResult(remote)
    tips = _fetched_tips(repo, remote, [*job_refs(job_id), records.pin_ref(job_id, "attempts/*"),
                                        notes_store.NOTES_REF])
    for ref, theirs in sorted(tips.items()):
        if ref != notes_store.NOTES_REF:
            _take(repo, ref, theirs, result)
    if notes_store.NOTES_REF in tips:
        result.notes = _merge_notes(repo, tips[notes_store.NOTES_REF])
    return result


# ---------------------------------------------------------------- pull

def pull(repo: Repo, remote: str = "origin") -> SyncResult:
    """Take teammates' records and newer copies (never overwriting ours) and merge their notes into ours.

    A record or pin of a job (or group) this clone started is never changed by a pull: what the
    remote holds beyond ours is kept aside (`ownership.aside_ref`) and reported, because a
    teammate's commit on our record would otherwise become our job's state, verify and cost.
    """
    _check_remote(repo, remote)
    result = SyncResult(remote)
    tips = _fetched_tips(repo, remote, [f"{records.PREFIX}*", notes_store.NOTES_REF])
    owned = ownership.owned_keys(repo)
    for ref, theirs in sorted(tips.items()):
        if not ref.startswith(records.PREFIX):
            continue
        key, which = _owner_key(ref)
        if key in owned:
            _keep_ours(repo, remote, ref, key, which, theirs, result)
        else:
            _take(repo, ref, theirs, result)
    result.lines += [f"new job {j}" for j in result.new_jobs] + [f"new group {g}" for g in result.new_groups]
    result.lines += [f"updated {ref} (fast-forward)" for ref in result.updated]
    result.lines += [f"kept local: {ref} diverged from {remote}'s copy; ours was not overwritten "
                     f"(compare: git log {ref} and git ls-remote {remote} {ref})" for ref in result.kept_local]
    result.lines += [f"kept aside: {remote} has commits on {ref} that this clone did not write; that job is "
                     f"this clone's, its record was not changed (theirs: git log {aside})"
                     for ref, aside in result.aside.items()]
    if notes_store.NOTES_REF in tips:
        result.notes = _merge_notes(repo, tips[notes_store.NOTES_REF])
        result.lines.append(f"notes: {result.notes}")
    changed = notes.rebuild(repo)
    if changed:
        result.lines.append(f"notes: rebuilt {changed} block(s) from records")
    return result


def _owner_key(ref: str) -> tuple[str | None, str]:
    """(job or group id, record|base|head|attempts/<n>) of a ref under refs/subtask/ (`chains.owner_of`);
    (None, "") for another shape."""
    owner = chains.owner_of(ref)
    return (owner.id, owner.part) if owner is not None else (None, "")


def _runs_on_our_cluster(repo: Repo, key: str) -> bool:
    """A job of ours placed on Ray and not ended here: its node writes its record and pushes it,
    and a pull brings that record home (the one case where another writer's commits are this
    clone's job's). Once our record says it ended, nobody else writes it."""
    try:
        job = records.read(repo, key)
    except SubtaskError:
        return False
    return not executors.of(job).runs_here and not job.state.current.terminal


def _keep_ours(repo: Repo, remote: str, ref: str, key: str, which: str, theirs: str, result: SyncResult) -> None:
    """A ref of a job this clone started: the remote's copy, when it holds commits we did not
    write, is kept aside, never taken (but for a job on our Ray cluster)."""
    relation = compare(repo, _local_tip(repo, ref), theirs)
    if relation in (SAME, OURS_NEWER):
        if relation == OURS_NEWER:
            result.ahead_here.append(ref)
        return
    if _runs_on_our_cluster(repo, key):  # read only now: most pulls find nothing new on our jobs
        _take(repo, ref, theirs, result)
        return
    aside = ownership.aside_ref(remote, key, which)
    for _ in range(CAS_RETRIES):
        old = _local_tip(repo, aside)
        if old == theirs or records.cas_ref(repo, aside, old, theirs, "git-subtask: pull (kept aside)"):
            break
    result.aside[ref] = aside


def _take(repo: Repo, ref: str, theirs: str, result: SyncResult) -> None:
    """Move our copy of `ref` forward to the remote's when it is newer, by CAS (re-compared on a race)."""
    for attempt in range(CAS_RETRIES):
        ours = _local_tip(repo, ref)
        relation = compare(repo, ours, theirs)
        if relation == SAME:
            return
        if relation == OURS_NEWER:
            result.ahead_here.append(ref)
            return
        if relation == DIVERGED:
            result.kept_local.append(ref)
            return
        if records.cas_ref(repo, ref, ours, theirs, "git-subtask: pull (fast-forward)"):
            if ours is not None:
                result.updated.append(ref)
            elif (owner := chains.owner_of(ref)) is not None and owner.part == "record":
                (result.new_groups if owner.kind is chains.GROUP else result.new_jobs).append(owner.id)
            return
        time.sleep(0.002 * (attempt + 1) * random.random())  # a worker or another pull moved it: look again
    result.kept_local.append(ref)
