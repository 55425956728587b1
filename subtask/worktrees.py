"""Which worktrees this clone made for which job: the authority for removing one.

A record's `spec.worktree` is data: a record pulled from a teammate (or forged by one) can name any
path, including another checkout of ours. So the right to remove a worktree comes from local
facts only: when the worker checks a job's worktree out, it writes a marker holding the job id
into that worktree's own admin folder, `<git-common-dir>/worktrees/<name>/subtask-job`, which only
`git worktree add` in this clone creates and which `git worktree remove`/`prune` delete with it.

Invariants:
- Never remove a worktree unless `created_here(repo, job_id, path)`: the path lies under the
  configured worktree folder (`subtask.worktreeDir`), git lists it as a worktree of this
  repository, and its admin folder's marker names exactly this job.
- Worktrees made before the marker existed carry none: they are kept (removed by hand with
  `git worktree remove`), never guessed at.
- Never run a job's engine in a path outside the worktree folder, or in a worktree marked for
  another job (`check_runnable`, before a reply), because the path comes from the record.
"""

from __future__ import annotations

import os
from pathlib import Path

from subtask.errors import SubtaskError
from subtask.gitrepo import Repo

MARKER = "subtask-job"


def admin_dir(repo: Repo, path: Path) -> Path | None:
    """The admin folder git keeps for the worktree checked out at `path`, or None if git has none."""
    try:
        wanted = path.resolve()
        entries = list(os.scandir(repo.common_dir / "worktrees"))
    except OSError:
        return None
    for entry in entries:
        try:
            gitdir = Path((Path(entry.path) / "gitdir").read_text().strip())
        except OSError:
            continue
        if not gitdir.is_absolute():  # worktree.useRelativePaths
            gitdir = Path(entry.path) / gitdir
        if gitdir.name == ".git" and gitdir.parent.resolve() == wanted:
            return Path(entry.path)
    return None


def mark(repo: Repo, job_id: str, path: Path) -> None:
    """Record, in the worktree's own admin folder, that this clone checked it out for `job_id`."""
    admin = admin_dir(repo, path)
    if admin is None:
        return
    tmp = admin / f".{MARKER}.tmp"
    tmp.write_text(job_id + "\n")
    os.replace(tmp, admin / MARKER)


def under_worktree_folder(repo: Repo, path: Path) -> bool:
    try:
        return path.resolve().is_relative_to(repo.worktree_dir().resolve())
    except OSError:
        return False


def created_here(repo: Repo, job_id: str, path: Path) -> bool:
    """True only when this clone's worker checked `path` out for `job_id` (see the module docstring)."""
    if not under_worktree_folder(repo, path):
        return False
    admin = admin_dir(repo, path)
    if admin is None:
        return False
    try:
        return (admin / MARKER).read_text().strip() == job_id
    except OSError:
        return False


def why_not_ours(repo: Repo, job_id: str, path: Path) -> str:
    """Words for a refusal: which of the ownership facts is missing."""
    if not under_worktree_folder(repo, path):
        return f"{path} is not under the worktree folder {repo.worktree_dir()}: a record's path is never trusted"
    if admin_dir(repo, path) is None:
        return f"{path} is not a worktree of this repository"
    return (f"{path} was not checked out by this clone for {job_id} (no ownership marker; "
            f"remove it by hand if it is yours: git worktree remove '{path}')")


def check_runnable(repo: Repo, job_id: str, path: Path) -> None:
    """Refuse to start an attempt whose recorded worktree is not this clone's to run in."""
    if not under_worktree_folder(repo, path) or path.name != job_id:
        raise SubtaskError("negative", f"{job_id}: its record names the worktree {path}, not {job_id} in this "
                           f"clone's worktree folder {repo.worktree_dir()}: not running anything there",
                           hint="a record pulled from a teammate is theirs to reply to")
    if not path.exists():
        return
    admin = admin_dir(repo, path)
    try:
        marked = (admin / MARKER).read_text().strip() if admin is not None else None
    except OSError:
        marked = None  # made before markers existed
    if admin is None or (marked is not None and marked != job_id):
        raise SubtaskError("negative", f"{job_id}: {path} is not this job's worktree: not running anything there",
                           hint="git worktree list")


def stale_admin(repo: Repo, job_id: str, path: Path) -> Path | None:
    """The admin folder git still keeps for `job_id`'s worktree whose folder was removed by hand
    (what `git worktree prune` would drop), when it is this clone's, for this job; else None."""
    if path.exists() or not under_worktree_folder(repo, path):
        return None
    admin = admin_dir(repo, path)
    try:
        return admin if admin is not None and (admin / MARKER).read_text().strip() == job_id else None
    except OSError:
        return None


def drop_stale(repo: Repo, job_id: str, path: Path) -> bool:
    """Forget the registration of `job_id`'s worktree whose folder was removed by hand (only that
    one: `git worktree prune` would drop every missing one), so git can check it out again and
    `git worktree list` shows nothing stale. True when there was one."""
    import shutil

    admin = stale_admin(repo, job_id, path)
    if admin is None:
        return False
    shutil.rmtree(admin, ignore_errors=True)
    return not admin.exists()
