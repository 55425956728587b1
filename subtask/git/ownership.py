"""Which jobs this clone started: the authority for changing or deleting anything of a job.

A record arrives by `pull` from anyone who can push to the remote, and says whatever its writer
wrote: its spec can name any clone, path or branch. So ownership is made of local facts only:

- the clone identity, `subtask.cloneId` (`c-` + 16 hex), written once to this repository's own
  config (`git config --local`, never copied by a clone) under `<state>/clone-id.lock`, and
  recorded in every job's spec at start (`spec.clone`): it says where a job was started;
- a local ref, `refs/subtask-owned/<id>`, created in the same ref transaction as the job's record
  (`records.create`), pointing at the record's first commit. `push` and `pull` move
  `refs/subtask/*` only, so no teammate can give this clone one.

A job is this clone's (`owns`) when both hold: the ref is here and the spec names this clone.
A teammate who copies our clone id into a record gains nothing: the ref is not theirs to make.
Jobs started before clone identities existed have neither, and count as a teammate's (their
verify is re-run by `merge`, their branches are left for `git branch -d`).

Invariants:
- Never decide that a job is this clone's from a path (`spec.repo`, `spec.worktree`) or from its
  spec alone, because a pulled record names whatever its writer likes, our clone id included
  (it travels in every record we push): a job is ours when its spec names our `subtask.cloneId`
  *and* the local ref `refs/subtask-owned/<id>` is here, made in the same ref transaction as its
  record and never pushed or pulled (tests: `provenance::*`).
- Never let `pull` move a record or pin of a job (or group) this clone started, because a
  teammate's commit on it would become the job's state, verify, cost and note: `merge` landed a
  forged "verify passed", `wait` returned a forged "failed" of a running job. The remote's copy
  goes to `refs/subtask-theirs/<remote>/<id>/<which>`, reported by `pull`, `push` and `doctor`.
  The one exception is a job placed on Ray, whose node writes its record.
- Never write a teammate's record or group here (`merge` of their job records no landing, a
  group of theirs is never concluded, stopped or marked merged), because the records would diverge
  and the next pull could no longer take theirs.
"""

from __future__ import annotations

import os

from subtask.git.gitrepo import Repo, git, pygit2_ready
from subtask.model.errors import SubtaskError
from subtask.model.job import hex_named
from subtask.state import paths
from subtask.state.statefiles import file_lock

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    import pygit2

    from subtask.model.job import JobLike

OWNED_PREFIX = "refs/subtask-owned/"
THEIRS_PREFIX = "refs/subtask-theirs/"


def owned_ref(key: str) -> str:
    """The ownership ref of a job id (`st-…`) or a group id (`sg-…`): a key never holds a `/`."""
    return f"{OWNED_PREFIX}{key}"


def aside_ref(remote: str, key: str, which: str) -> str:
    """Where a teammate's commits on one of our refs are kept: `which` is record, base, head or
    attempts/<n> (an attempt's pin: a verify loop's, or the head `land --reconcile` moved away from)."""
    return f"{THEIRS_PREFIX}{remote}/{key}/{which}"


def clone_id(repo: Repo) -> str | None:
    """This clone's identity, or None before its first job."""
    value = (repo.config.get("cloneId") or "").strip()
    return value if hex_named(value, "c-", 16) else None


def ensure_clone_id(repo: Repo) -> str:
    """This clone's identity, made (once, under a lock, in the repository's own config) if missing."""
    found = clone_id(repo)
    if found is not None:
        return found

    os.makedirs(repo.state_dir_str, mode=0o700, exist_ok=True)
    with file_lock(os.path.join(repo.state_dir_str, paths.CLONE_ID_LOCK)):
        # Another process may have written it since our settings were read: read the file again.
        local = _local_config(repo)
        current = (local.get("subtask.cloneid") or "").strip()
        if not hex_named(current, "c-", 16):
            if current:
                raise SubtaskError("fatal", f"git config subtask.cloneId is not a clone id: {current!r}",
                                   hint="git config --local --unset subtask.cloneId  "
                                        "(a new one is made at the next start)")
            current = "c-" + os.urandom(8).hex()
            local.set("subtask.cloneId", current)
    repo.config.remember("cloneId", current)
    return current


class _LocalConfig:
    """The repository's own config file (`<common dir>/config`): through libgit2 once it is loaded
    (the MCP server starts jobs without a git process), else through `git config --local`."""

    def __init__(self, repo: Repo, pygit2_config: pygit2.Config | None = None):
        self.repo, self.cfg = repo, pygit2_config

    def get(self, key: str) -> str | None:
        if self.cfg is not None:
            try:
                return self.cfg[key]
            except KeyError:
                return None
        return git(self.repo.root_str, "config", "--local", "--get", key, check=False).stdout.strip() or None

    def set(self, key: str, value: str) -> None:
        if self.cfg is not None:
            self.cfg[key] = value
        else:
            git(self.repo.root_str, "config", "--local", key, value)


def _local_config(repo: Repo) -> _LocalConfig:
    if not pygit2_ready():
        return _LocalConfig(repo)
    import pygit2

    return _LocalConfig(repo, pygit2.Config(str(repo.common_dir / "config")))


def started_here(repo: Repo, key: str) -> bool:
    """This clone created the record of this job id (or group id): its ownership ref is here.

    A loose ref file answers without a git process (what `show` would otherwise pay); a packed
    or otherwise stored ref is asked of git."""
    if repo.has_ref_file(owned_ref(key)):
        return True
    return repo.objects.ref(owned_ref(key)) is not None


def owned_keys(repo: Repo) -> set[str]:
    """Every job id (and group id) whose record this clone created, from one listing of refs."""
    return {ref.name[len(OWNED_PREFIX):] for ref in repo.objects.refs(OWNED_PREFIX)}


def owns(repo: Repo, job: JobLike, owned: set[str] | None = None) -> bool:
    """Is `job` (a `records.Job`) one this clone started? `owned`: `owned_keys`, when the caller
    asks for many jobs."""
    mine = clone_id(repo)
    if mine is None or job.spec.clone != mine:
        return False
    return job.id in owned if owned is not None else started_here(repo, job.id)


def set_aside(repo: Repo) -> list[str]:
    """The refs holding a teammate's copy kept aside (`refs/subtask-theirs/...`), for `doctor`."""
    return [ref.name for ref in repo.objects.refs(THEIRS_PREFIX)]
