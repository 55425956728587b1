"""`git subtask push` / `pull`: share job records and review notes with teammates through a remote.

What travels: `refs/subtask/*` (records and pins), `refs/notes/subtask` (review blocks), and with
`push --branches` the job branches `refs/heads/subtask/*`.

Invariants:
- Never a forced refspec, in either direction. A record that differs on both sides is not a
  fast-forward, so git refuses it and it stays as it is here (reported, not overwritten); the
  remote's copy stays on the remote.
- The remote's notes are fetched into `refs/notes/remotes/<remote>/subtask` (deleted first, so the
  fetch creates it and needs no force), merged block by block into ours (`notes_store.merge_ref`,
  no block lost), and pushed again as a fast-forward. A forced `+refs/notes/*` would silently drop
  unpushed notes, and `receive.denyNonFastForwards` would not stop it (it guards refs/heads/ only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from subtask import notes, notes_store, records
from subtask.errors import SubtaskError
from subtask.gitrepo import Repo, git

RECORDS_SPEC = "refs/subtask/*:refs/subtask/*"
BRANCHES_SPEC = "refs/heads/subtask/*:refs/heads/subtask/*"
NOTES_SPEC = f"{notes_store.NOTES_REF}:{notes_store.NOTES_REF}"
NOTES_RACE_RETRIES = 5
_REJECTED_FETCH_RE = re.compile(r"^\s*!\s+\[[^\]]*\]\s+(\S+)\s+->\s+(\S+)")


@dataclass
class SyncResult:
    remote: str
    new_jobs: list[str] = field(default_factory=list)  # pull: jobs that arrived
    updated: list[str] = field(default_factory=list)  # refs that moved
    kept_local: list[str] = field(default_factory=list)  # refs that differ on both sides: not overwritten
    notes: str = ""
    lines: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.kept_local


def tracking_ref(remote: str) -> str:
    return f"refs/notes/remotes/{remote}/subtask"


def _check_remote(repo: Repo, remote: str) -> None:
    if not remote or remote.startswith("-") or not re.fullmatch(r"[A-Za-z0-9._/-]+", remote) or ".." in remote:
        raise SubtaskError("usage", f"not a remote name: {remote!r}")
    if git(repo.root, "remote", "get-url", remote, check=False).returncode != 0:
        raise SubtaskError("usage", f"no remote named '{remote}'", hint=f"git remote add {remote} <url>")


# ---------------------------------------------------------------- push

def push(repo: Repo, remote: str = "origin", branches: bool = False) -> SyncResult:
    """Push records, pins and notes (and job branches) without force; merge notes on a race."""
    _check_remote(repo, remote)
    notes_store.ensure_ref(repo.git)
    result = SyncResult(remote)
    specs = [RECORDS_SPEC, NOTES_SPEC] + ([BRANCHES_SPEC] if branches else [])
    rejected = _push(repo, remote, specs, result)
    for _ in range(NOTES_RACE_RETRIES):
        if notes_store.NOTES_REF not in rejected:
            break
        # Someone pushed notes meanwhile: take theirs in beside ours, then push the merge (a fast-forward).
        rejected.discard(notes_store.NOTES_REF)
        result.notes = _fetch_and_merge_notes(repo, remote)
        result.lines.append(f"notes: the remote had notes we lacked: {result.notes}")
        rejected |= _push(repo, remote, [NOTES_SPEC], result)
    result.kept_local = sorted(rejected)
    for ref in result.kept_local:
        result.lines.append(f"not pushed: {ref} differs on {remote} (never forced; "
                            f"compare: git log {ref} and git ls-remote {remote} {ref})")
    return result


def _push(repo: Repo, remote: str, specs: list[str], result: SyncResult) -> set[str]:
    """Run one push; returns the destination refs the remote rejected."""
    proc = git(repo.root, "push", "--porcelain", remote, *specs, check=False, timeout=300)
    rejected: set[str] = set()
    seen_status = False
    for line in proc.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or ":" not in parts[1]:
            continue
        seen_status = True
        flag, dest = parts[0], parts[1].split(":", 1)[1]
        if flag == "!":
            rejected.add(dest)
        elif flag in (" ", "*"):
            result.updated.append(dest)
            result.lines.append(f"pushed {dest}")
    if proc.returncode != 0 and not seen_status:
        raise SubtaskError("fatal", f"git push to {remote} failed: {proc.stderr.strip()}")
    return rejected


# ---------------------------------------------------------------- pull

def pull(repo: Repo, remote: str = "origin") -> SyncResult:
    """Fetch records of teammates' jobs (never overwriting ours) and merge their notes into ours."""
    _check_remote(repo, remote)
    result = SyncResult(remote)
    before = {name: str(repo.git.references[name].target) for name in repo.git.references if name.startswith(records.PREFIX)}
    remote_has_notes = bool(git(repo.root, "ls-remote", remote, notes_store.NOTES_REF, check=False, timeout=300).stdout.strip())
    specs = [RECORDS_SPEC]
    tracking = tracking_ref(remote)
    if remote_has_notes:
        _delete_ref(repo, tracking)
        specs.append(f"{notes_store.NOTES_REF}:{tracking}")
    proc = git(repo.root, "fetch", "--no-tags", "--no-write-fetch-head", remote, *specs, check=False, timeout=300)
    for line in proc.stderr.splitlines():
        match = _REJECTED_FETCH_RE.match(line)
        if match:
            result.kept_local.append(match.group(2))
    if proc.returncode != 0 and not result.kept_local:
        raise SubtaskError("fatal", f"git fetch from {remote} failed: {proc.stderr.strip()}")
    after = {name: str(repo.git.references[name].target) for name in repo.git.references if name.startswith(records.PREFIX)}
    result.updated = sorted(n for n, t in after.items() if before.get(n) not in (None, t))
    result.new_jobs = sorted({n[len(records.PREFIX):-len("/record")] for n in after
                              if n.endswith("/record") and n not in before})
    result.lines += [f"new job {j}" for j in result.new_jobs]
    result.lines += [f"updated {ref} (fast-forward)" for ref in result.updated]
    result.lines += [f"kept local: {ref} differs on {remote}; ours was not overwritten" for ref in result.kept_local]
    if remote_has_notes and repo.git.references.get(tracking) is not None:
        result.notes = _merge_tracking(repo, tracking)
        result.lines.append(f"notes: {result.notes}")
    changed = notes.rebuild(repo)
    if changed:
        result.lines.append(f"notes: rebuilt {changed} block(s) from records")
    return result


def _fetch_and_merge_notes(repo: Repo, remote: str) -> str:
    tracking = tracking_ref(remote)
    _delete_ref(repo, tracking)
    git(repo.root, "fetch", "--no-tags", "--no-write-fetch-head", remote, f"{notes_store.NOTES_REF}:{tracking}", timeout=300)
    return _merge_tracking(repo, tracking)


def _merge_tracking(repo: Repo, tracking: str) -> str:
    ref = repo.git.references.get(tracking)
    ids = set(records.all_ids(repo))
    return notes_store.merge_ref(repo.git, str(ref.target), notes.lock_path(repo), prefer_local=lambda j: j in ids)


def _delete_ref(repo: Repo, name: str) -> None:
    ref = repo.git.references.get(name)
    if ref is not None:
        records.cas_ref(repo, name, str(ref.target), None)
