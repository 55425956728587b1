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
- Never run git on a job's worktree trusting its `.git` (nor through discovery), because the job
  may write that file and its admin folder's `commondir`, `gitdir` and `HEAD`: git found through
  them reads a repository the job made, whose config names programs (fsmonitor, hooks, filters)
  git runs outside the sandbox, and a `HEAD` naming `refs/heads/main` makes the autocommit commit
  there. The worker, `cleanup` and `gc` first compare those files with what git wrote
  (`check_metadata`: admin folder `<common>/worktrees/<id>`), then run git with `GIT_DIR`,
  `GIT_WORK_TREE` and `GIT_COMMON_DIR` set, fsmonitor and hooks off and no submodule recursion
  (`job_git`); a job that changed them ends `failed` (kind `isolation`), its worktree kept
  (tests: `containment::test_a_job_that_points_*`).
- Never trust a check of a job's metadata past the next run of the job's code (a verify, a
  landing's verify in a scratch), because that code may rewrite it: git that writes after a
  verify checks again (the loop's move back, `land --reconcile`, a reused scratch:
  `integrate.Scratch.tampered`), and `job_git` runs nothing (exit 128) while the admin folder holds
  a config.worktree git would read that is not the copy git made of the main worktree's
  (`config_worktree_ours`), not even after a check, because no `-c` turns off the filters it names.
- Never forget more of git's worktree registrations than the job's own (`worktrees.drop_stale`,
  never `git worktree prune` for one job), because another missing worktree may be on a disk
  that is not mounted now.
- Never take the admin folder to grant from the worktree's `.git`, because the job writes that
  file (`gitdir: <repo>/.git` had a reply's sandbox grant the whole git dir): `isolation.build_policy`
  and `isolation.outside_sandbox` are given it, `expected_admin` for a job, the one git made for a
  scratch (`verify_rerun.scratch_admin`, asked before anything ran there).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from subtask.git.gitrepo import Repo
from subtask.model.errors import SubtaskError

MARKER = "subtask-job"
# In a worktree's admin folder while its files are not yet those of its HEAD (a pooled worktree
# just taken: `pool.take`); removed once git has written them (`needs_files`).
PENDING_CHECKOUT = "subtask-checkout"


def admin_dir(repo: Repo, path: Path) -> Path | None:
    """The admin folder git keeps for the worktree checked out at `path`, or None if git has none.
    git names it after the worktree's folder (a number added on a clash): that one is read first,
    every other only when it is not the one. Registrations are compared as git wrote them, and
    resolved only if none matched (a path given through a symlink): resolving is an `lstat` per
    component of every worktree."""
    try:
        wanted = path.resolve()
        named = repo.common_dir / "worktrees" / path.name
        if path.name not in ("", ".", "..") and _registered_as(named, wanted):
            return named
        admins = [Path(entry.path) for entry in os.scandir(repo.common_dir / "worktrees")]
    except OSError:
        return None
    registered = [(admin, folder) for admin in admins if (folder := _registered_at(admin)) is not None]
    return next((admin for admin, folder in registered if folder == wanted), None) \
        or next((admin for admin, folder in registered if folder.resolve() == wanted), None)


def _registered_as(admin: Path, wanted: Path) -> bool:
    """Does `admin` register the worktree folder `wanted` (resolved)?"""
    folder = _registered_at(admin)
    return folder is not None and (folder == wanted or folder.resolve() == wanted)


def _registered_at(admin: Path) -> Path | None:
    """The worktree folder an admin folder's `gitdir` names, as git wrote it (None: none)."""
    try:
        gitdir = Path((admin / "gitdir").read_text().strip())
    except OSError:
        return None
    if not gitdir.is_absolute():  # worktree.useRelativePaths
        gitdir = admin / gitdir
    return gitdir.parent if gitdir.name == ".git" else None


def mark(repo: Repo, job_id: str, path: Path) -> None:
    """Record, in the worktree's own admin folder, that this clone checked it out for `job_id`."""
    admin = admin_dir(repo, path)
    if admin != expected_admin(repo, job_id):
        raise SubtaskError("fatal",
                           f"git registered the worktree {path} as {admin}, not {expected_admin(repo, job_id)}",
                           hint="git worktree prune, then try again")
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


class MetadataChanged(Exception):
    """A file git follows from a job's worktree to the repository is not what git wrote: the job's
    own doing, since nothing else writes them. Its git is not run, its worktree never removed."""


# Our git on a job's worktree: nothing the job may write names a program that runs.
JOB_GIT = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "submodule.recurse=false")
# Variables that would point git elsewhere than where `job_git` says.
_LOCATION_VARS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
                  "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE", "GIT_CEILING_DIRECTORIES", "GIT_PREFIX")


def expected_admin(repo: Repo, job_id: str) -> Path:
    """The admin folder git makes for `<worktreeDir>/<id>`: named after the worktree's folder."""
    return repo.common_dir / "worktrees" / job_id


def read_plain(path: Path) -> str:
    """A regular file's text, never through a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise MetadataChanged(f"{path} cannot be read ({exc.strerror})") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise MetadataChanged(f"{path} is not a regular file")
        return os.read(fd, 65536).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _points_at(value: str, relative_to: Path) -> str:
    """Where a path git wrote into a file points, lexically (a symlink the job made is not followed)."""
    return os.path.normpath(os.path.join(relative_to, value.strip()))


def check_metadata(repo: Repo, job_id: str, worktree: Path, branch: str | None, base: str, *,
                   head: bool = True) -> Path:
    """The worktree's admin folder, once the files git follows from the worktree to the repository
    say what git wrote: the worktree's `.git` names the admin folder, its `commondir` names this
    repository, its `gitdir` names the worktree, its `HEAD` the job's branch (a read-only job: its
    base; not asked with `head=False`, for a reader that does not commit), and it holds no
    `config.worktree` git would read but the one git wrote (`config_worktree_ours`). Else
    `MetadataChanged`, naming what."""
    wanted = (f"ref: refs/heads/{branch}" if branch else base) if head else None
    return check_admin(repo, expected_admin(repo, job_id), worktree, wanted)


def check_admin(repo: Repo, admin: Path, worktree: Path, head: str | None) -> Path:
    """`check_metadata` for a worktree whose admin folder the caller knows (a scratch worktree of
    `land`, made by git where it chose); `head`: what its HEAD must say, None not to ask."""
    if not os.path.isdir(admin) or os.path.islink(admin):
        raise MetadataChanged(f"its worktree's admin folder {admin} is missing or not a folder")
    dotgit = read_plain(worktree / ".git")
    if not dotgit.startswith("gitdir:") or _points_at(dotgit[len("gitdir:"):], worktree) != str(admin):
        raise MetadataChanged(f"its worktree's .git file no longer names {admin}: {dotgit.strip()[:200]!r}")
    common = read_plain(admin / "commondir")
    if _points_at(common, admin) != os.path.normpath(repo.common_dir):
        raise MetadataChanged(f"its admin folder's commondir names {common.strip()[:200]!r}, not this repository")
    gitdir = read_plain(admin / "gitdir")
    if _points_at(gitdir, admin) != os.path.normpath(worktree / ".git"):
        raise MetadataChanged(f"its admin folder's gitdir names {gitdir.strip()[:200]!r}, not {worktree / '.git'}")
    said = read_plain(admin / "HEAD").strip()
    if head is not None and said != head:
        raise MetadataChanged(f"its worktree's HEAD says {said[:200]!r}, not {head!r}")
    if config_worktree_read(repo, admin):
        raise MetadataChanged(f"its admin folder holds a config.worktree that git would read and that is not "
                              f"the one git wrote ({admin})")
    return admin


def needs_files(admin: Path) -> bool:
    """Has git yet to write the files of the worktree registered at `admin`? No index (git writes
    it last), or a pooled worktree taken whose files are still those of its last commit."""
    return not (admin / "index").exists() or os.path.lexists(admin / PENDING_CHECKOUT)


def pending_checkout(admin: Path) -> str | None:
    """The commit whose files a taken pooled worktree still holds (`PENDING_CHECKOUT`), when its
    marker names one and git has written its index; else None."""
    try:
        said = read_plain(admin / PENDING_CHECKOUT).strip()
    except MetadataChanged:
        return None
    ok = len(said) in (40, 64) and all(c in "0123456789abcdef" for c in said)
    return said if ok and (admin / "index").exists() else None


def config_worktree_ours(repo: Repo, admin: Path) -> bool:
    """Is `admin`'s config.worktree absent, or what git wrote there: the main worktree's settings,
    which `git worktree add` copies (less `core.bare = true` and `core.worktree`) when
    `extensions.worktreeConfig` is on? Any other is a job's, and may name programs (a filter,
    `gpg.program`) that our git would run outside its sandbox."""
    path = admin / "config.worktree"
    if not os.path.lexists(path):
        return True
    said = _config_entries(path)
    if said is None or any(key.startswith(("include.", "includeif.")) for key, _ in said):
        return False  # an include there names a file relative to the admin folder, the job's to write
    copied = [(key, value) for key, value in _config_entries(repo.common_dir / "config.worktree") or []
              if key != "core.worktree" and (key, value) != ("core.bare", "true")]
    return sorted(said) == sorted(copied)


def config_worktree_read(repo: Repo, admin: Path) -> bool:
    """Does `admin` hold a config.worktree that is not git's (`config_worktree_ours`) and that git
    would read (`extensions.worktreeConfig`)?"""
    return not config_worktree_ours(repo, admin) and _worktree_config_on(repo)


def _config_entries(path: Path) -> list[tuple[str, str]] | None:
    """The settings a config file holds (its includes not followed): [] when there is none, None
    when it is not a regular file or git cannot read it."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
    except FileNotFoundError:
        return []
    except OSError:
        return None
    proc = subprocess.run(["git", "config", "--no-includes", "-z", "--list", "--file", str(path)], cwd="/",
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0:
        return None
    return [(key, value) for key, _, value in (entry.partition("\n") for entry in proc.stdout.split("\0") if entry)]


def _worktree_config_on(repo: Repo) -> bool:
    proc = subprocess.run(["git", "-C", str(repo.common_dir), "config", "--bool", "extensions.worktreeConfig"],
                          capture_output=True, text=True, check=False)
    return proc.stdout.strip() == "true"


def job_git_env(repo: Repo, admin: Path, worktree: Path,
                env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of `job_git` (for a git started in the background: run it as
    `git *JOB_GIT ...` in `worktree`)."""
    base = {k: v for k, v in (env if env is not None else os.environ).items() if k not in _LOCATION_VARS}
    return dict(base, GIT_DIR=str(admin), GIT_WORK_TREE=str(worktree), GIT_COMMON_DIR=str(repo.common_dir))


def job_git(repo: Repo, admin: Path, worktree: Path, *args: str, input: str | None = None,
            env: dict[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    """git on a job's worktree through the paths git-subtask made, never discovery (see the module
    docstring); call `check_metadata` first, with nothing of the job running. Whatever was checked
    before, no git runs while the admin folder holds a config.worktree git would read (exit 128):
    a job's command may have run since (a verify before its branch moves back, a landing's verify
    before its scratch is reused), and no `-c` of ours can turn off the filters it names."""
    if config_worktree_read(repo, admin):
        proc = subprocess.CompletedProcess(["git", *args], 128, "",
                                           f"git-subtask ran no git here: {admin / 'config.worktree'} would be read, "
                                           "and git-subtask wrote none (a job's command did)")
    else:
        proc = subprocess.run(["git", *JOB_GIT, *args], cwd=worktree, env=job_git_env(repo, admin, worktree, env),
                              capture_output=True, text=True, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL, check=False)
    if check and proc.returncode != 0:
        raise SubtaskError("fatal", f"git {' '.join(args[:2])} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def stale_admin(repo: Repo, job_id: str, path: Path) -> Path | None:
    """The admin folder git still keeps for `job_id`'s worktree whose folder was removed by hand
    (what `git worktree prune` would drop), when it is this clone's, for this job; else None."""
    if path.exists() or not under_worktree_folder(repo, path):
        return None
    admin = expected_admin(repo, job_id)  # where a job's worktree is registered (`mark` refuses any other)
    try:
        if (admin / MARKER).read_text().strip() != job_id:
            return None
    except OSError:
        return None
    return admin if _registered_as(admin, path.resolve()) else None


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
