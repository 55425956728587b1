"""The pool of ready worktrees: a job's start costs the files that differ, not the repository.

A pooled worktree is a linked worktree of this repository at `<worktreeDir>/.pool/<name>`, its
HEAD detached at a commit, every tracked file written and its index fresh, nothing else in it.
Its admin folder (`<git-common-dir>/worktrees/<name>`) holds git's files and `subtask-pool`,
which says what we made: the commit, its bytes on disk, when. `subtask.pool` sets how many are
kept ready, `subtask.poolMaxBytes` how much disk they may take together.

- `take` (the worker, under `worktree.lock`): an entry is checked (`sound`), then becomes the
  job's worktree by renames: its admin folder to `worktrees/<id>` (the claim), the pointers
  between the two rewritten, its folder to `<worktreeDir>/<id>`; HEAD says the job's branch and
  `subtask-checkout` says the files are not there yet. The worker's files checkout (`git
  read-tree --reset -u HEAD`) then rewrites only the files that differ from the job's base.
- `fill` (in the background of a job, by its worker's forked child; `git subtask pool fill`):
  one filler at a time (`pool-fill.lock`), each new entry built in `.pool/.building/<name>` and
  moved into `.pool/` by one rename once complete, so a filler killed half-way leaves only a
  folder under `.building/`, never handed out, removed by the next filler.
- `give_back` (cleanup, landing, gc: instead of `git worktree remove`): a finished job's clean
  worktree, its metadata checked as issue 28 requires (`worktrees.check_metadata`, and nothing
  in its admin folder but what git writes), its index rebuilt from HEAD and every tracked file
  hashed against it (a job may have forged its index), every untracked and ignored file removed
  (`git clean -ffdx`), HEAD detached: then it is an entry like a new one. Anything unexpected and
  it is not pooled: the caller removes it. Never repaired.

Invariants:
- Never hand out a pooled worktree that is not `pool.sound` (an admin folder holding git's files
  and our marker only, its pointers, HEAD and commondir as we wrote them, an index), because the
  job that takes it must hold exactly its base: a damaged entry is removed, never repaired
  (`tests/test_pool.py::test_a_pooled_worktree_whose_admin_files_changed_is_discarded`).
- Never put a job's worktree back in the pool without its metadata checked as issue 28 requires,
  nothing in its admin folder but what git writes for commits, its index rebuilt from HEAD with
  every tracked file hashed, every untracked and ignored file removed and no file with another
  link, because the job wrote its admin folder and its index: a `MERGE_HEAD` it left would make
  the next job's commit a merge of its work, and a changed file it hid from git
  (`--skip-worktree`, a forged stat) would show the next job what it left
  (`tests/test_pool.py::test_a_tracked_file_a_job_hid_from_git_is_never_pooled`,
  `test_a_jobs_untracked_and_ignored_files_never_reach_the_next_job_from_the_pool`).
- Never make a pool entry visible before it is complete, nor move one in an order a kill between
  two steps turns into a worktree handed out half-made, because a job must get a whole one: built
  under `.pool/.building/`, renamed into `.pool/` last; taken by renaming its admin folder first
  (the claim) and its folder last; debris a kill leaves is refused by `sound`
  (`tests/test_pool.py::test_killing_a_worker_during_refill_leaves_no_half_made_entry_that_is_handed_out`).
- Nothing runs when no job runs: the pool is filled by a job's worker (or on request), never
  by a process of its own.
- Never let a pool entry pass `subtask.poolMaxBytes`, nor refill at a priority below the job's,
  because at nice 19 on a loaded machine (load 17) no refill ever finished between two jobs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from subtask import words as render
from subtask.git import worktrees
from subtask.git.gitrepo import NO_HOOKS, Repo, ensure_excluded
from subtask.model import faults
from subtask.model.dataclass import dataclass
from subtask.model.errors import SubtaskError
from subtask.state import paths
from subtask.state.statefiles import LockTimeout, StateLock, file_lock

MARKER = "subtask-pool"  # in an entry's admin folder: what we made (JSON)
POOL = ".pool"
BUILDING = ".building"
# What git writes in a worktree's admin folder for work a job may do (commits, resets): reset
# when the worktree comes back. Anything else there (MERGE_HEAD, rebase state, info/, refs/,
# a config.worktree) makes it damaged: it is removed, not pooled.
GIT_TRANSIENT = {"ORIG_HEAD", "COMMIT_EDITMSG", "AUTO_MERGE", "FETCH_HEAD", "logs"}
GIT_OWN = {"HEAD", "commondir", "gitdir", "index"}
JOB_MARKERS = {worktrees.MARKER, worktrees.PENDING_CHECKOUT}


@dataclass(frozen=True)
class Entry:
    """One entry of the worktree pool: its folder, admin folder and the commit it holds."""

    name: str
    path: Path
    admin: Path
    commit: str
    bytes: int
    made: float

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "path": str(self.path), "commit": self.commit, "bytes": self.bytes,
                "made": self.made}


@dataclass(frozen=True)
class Status:
    """The pool as `pool` shows it: its entries against the wanted count and the disk bound."""

    target: int  # subtask.pool
    max_bytes: int  # subtask.poolMaxBytes
    entries: list[Entry]
    debris: int  # half-made or damaged folders a filler (or gc) removes

    @property
    def bytes(self) -> int:
        return sum(e.bytes for e in self.entries)

    def to_dict(self) -> dict[str, object]:
        return {"v": 1, "target": self.target, "max_bytes": self.max_bytes, "count": len(self.entries),
                "bytes": self.bytes, "entries": [e.to_dict() for e in self.entries], "debris": self.debris}


def pool_dir(repo: Repo) -> Path:
    return repo.worktree_dir() / POOL


def target(repo: Repo) -> int:
    return repo.config.integer("pool")


def max_bytes(repo: Repo) -> int:
    return repo.config.size("poolMaxBytes")


def status(repo: Repo) -> Status:
    """What the pool holds now (nothing is changed)."""
    ready, debris = _scan(repo)
    return Status(target(repo), max_bytes(repo), ready, len(debris))


# ---------------------------------------------------------------- reading entries

def _marker(admin: Path) -> tuple[str, int, float] | None:
    """(commit, bytes, made) of an entry's marker; None for a missing or damaged one."""
    try:
        data = json.loads(worktrees.read_plain(admin / MARKER))
    except (worktrees.MetadataChanged, ValueError):
        return None
    if not isinstance(data, dict) or data.get("v") != 1:
        return None
    commit, size, made = data.get("commit"), data.get("bytes"), data.get("made")
    if not isinstance(commit, str) or not isinstance(size, int):
        return None
    return commit, size, float(made) if isinstance(made, (int, float)) else 0.0


def _entry(repo: Repo, folder: Path) -> Entry | None:
    admin = repo.common_dir / "worktrees" / folder.name
    data = _marker(admin) if admin.is_dir() and not admin.is_symlink() else None
    if data is None:
        return None
    return Entry(folder.name, folder, admin, *data)


def _scan(repo: Repo) -> tuple[list[Entry], list[Path]]:
    """(entries that look complete, newest first; folders that are not one)."""
    ready, debris = [], []
    try:
        folders = [Path(e.path) for e in os.scandir(pool_dir(repo)) if e.name != BUILDING]
    except OSError:
        folders = []
    for folder in folders:
        entry = _entry(repo, folder) if folder.is_dir() and not folder.is_symlink() else None
        (ready.append(entry) if entry is not None else debris.append(folder))
    building = pool_dir(repo) / BUILDING
    try:
        debris += [Path(e.path) for e in os.scandir(building)]
    except OSError:
        pass
    return sorted(ready, key=lambda e: -e.made), debris


def sound(repo: Repo, entry: Entry) -> str | None:
    """Why `entry` must not be handed out, or None: its admin folder holds git's files and our
    marker only, its pointers and HEAD say what we wrote, and git has written its index."""
    try:
        names = set(os.listdir(entry.admin))
    except OSError as exc:
        return f"its admin folder cannot be read ({exc.strerror})"
    if names - GIT_OWN - {MARKER}:
        return f"its admin folder holds {', '.join(sorted(names - GIT_OWN - {MARKER}))}"
    if "index" not in names:
        return "git has not written its index"
    try:
        worktrees.check_admin(repo, entry.admin, entry.path, entry.commit)
    except worktrees.MetadataChanged as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------- handing one out

def take(repo: Repo, job_id: str, path: Path, head: str, base: str) -> bool:
    """Make a pooled worktree the job's at `path` (HEAD saying `head`, which names `base`: the
    job's base, or its branch's tip for a later attempt); call
    it holding `worktree.lock`. False when none is sound (each unsound one is removed). An entry
    at `base` is the job's as it is; another one's files are not moved yet: `subtask-checkout` in
    the admin folder says so, and the worker's files checkout rewrites what differs from HEAD
    (`worktrees.needs_files`)."""
    ready, _ = _scan(repo)  # whatever `subtask.pool` says now: what is there is ready
    ready.sort(key=lambda e: e.commit != base)  # the job's own base first: nothing to rewrite
    for entry in ready:
        why = sound(repo, entry)
        if why is not None:
            _remove(repo, entry.path, entry.admin)
            continue
        _claim(repo, entry, job_id, path, head, moved=entry.commit != base)
        return True
    return False


def _claim(repo: Repo, entry: Entry, job_id: str, path: Path, head: str, *, moved: bool) -> None:
    """Ordered so that a kill between two steps leaves what `worktrees.drop_stale` (the job's
    admin folder naming a missing `path`) or the next filler (a pool folder whose admin folder is
    gone) removes: never a worktree at `path` whose `.git` names another admin folder."""
    admin = worktrees.expected_admin(repo, job_id)
    os.rename(entry.admin, admin)  # the claim: it fails if the job's admin folder exists
    faults.point("pool_claiming")
    _write(admin / "gitdir", f"{path / '.git'}\n")
    _write(admin / "HEAD", f"{head}\n")
    _write(admin / worktrees.MARKER, f"{job_id}\n")
    if moved:  # at the job's base already, its index and files are the job's: nothing to write
        _write(admin / worktrees.PENDING_CHECKOUT, f"{entry.commit}\n")
    (admin / MARKER).unlink()
    _write(entry.path / ".git", f"gitdir: {admin}\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    os.rename(entry.path, path)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------- filling

def fill(repo: Repo, count: int | None = None, commit: str | None = None, *, wait: float = 0.0,
         lock: StateLock | None = None) -> list[Entry]:
    """Make entries at `commit` (default: HEAD of the main worktree) until `count` (default
    `subtask.pool`) are ready or the next would pass `subtask.poolMaxBytes`. One filler at a time:
    [] when another holds `pool-fill.lock` longer than `wait` seconds (`lock`: the caller took it,
    `filler`). Debris of a killed filler is removed first."""
    count = target(repo) if count is None else count
    if lock is None:
        lock = filler(repo, wait)
        if lock is None:
            return []
    try:
        if count <= 0:
            return []
        clear_debris(repo)
        commit = commit or _head_commit(repo)
        made: list[Entry] = []
        limit = max_bytes(repo)
        while True:
            ready, _ = _scan(repo)
            if len(ready) >= count:
                break
            used = sum(e.bytes for e in ready)
            estimate = max((e.bytes for e in ready), default=0)
            if used + estimate > limit:
                break
            entry = _build(repo, commit)
            if used + entry.bytes > limit:  # the first of its size: measured only once made
                _remove(repo, entry.path, entry.admin)
                break
            made.append(entry)
        return made
    finally:
        lock.release()


def filler(repo: Repo, wait: float = 0.0) -> StateLock | None:
    """`pool-fill.lock`, which the one process filling the pool holds; None when another holds it
    longer than `wait` seconds. A worker takes it before it forks its filler (which inherits it),
    so from then until the pool is filled, anyone can see that it is being filled."""
    lock = file_lock(repo.state_dir / paths.POOL_FILL_LOCK, timeout=wait)
    try:
        lock.acquire()
    except LockTimeout:
        return None
    return lock


def _head_commit(repo: Repo) -> str:
    proc = subprocess.run(["git", "-C", str(repo.root), "rev-parse", "--verify", "HEAD^{commit}"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0:
        raise SubtaskError("fatal", "the main worktree's HEAD names no commit: nothing to fill the pool with",
                           hint="git commit first")
    return proc.stdout.strip()


def _build(repo: Repo, commit: str) -> Entry:
    """One entry at `commit`: registered (under `worktree.lock`), its files written, its index
    refreshed once no file is racily clean, measured, marked, then moved into `.pool/`."""
    name = f"pool-{os.urandom(4).hex()}"
    building = pool_dir(repo) / BUILDING / name
    final = pool_dir(repo) / name
    ensure_excluded(repo.common_dir)
    building.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(repo.state_dir / paths.WORKTREE_LOCK):
        proc = subprocess.run(["git", *NO_HOOKS, "-C", str(repo.root), "worktree", "add", "--quiet", "--detach",
                               "--no-checkout", str(building), commit], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, check=False)
    admin = repo.common_dir / "worktrees" / name
    if proc.returncode != 0 or worktrees.admin_dir(repo, building) != admin:
        _remove(repo, building, admin if admin.is_dir() else None)
        raise SubtaskError("fatal",
                           f"could not make a pooled worktree: {proc.stderr.strip() or 'registered elsewhere'}")
    try:
        faults.point("pool_building")
        worktrees.job_git(repo, admin, building, "read-tree", "--reset", "-u", "HEAD")
        _refresh_index(repo, admin, building)
        _drop_transient(admin)  # the reflog `worktree add` wrote: an entry holds git's own files only
        size, linked = measure(building)
        if linked:
            raise SubtaskError("fatal", f"{building}: a file with other links")
        made = time.time()
        _write(admin / MARKER, json.dumps({"v": 1, "commit": commit, "bytes": size, "made": made}) + "\n")
        _write(admin / "gitdir", f"{final / '.git'}\n")
        os.rename(building, final)  # complete: now it may be handed out
    except BaseException:
        _remove(repo, building, admin)
        raise
    return Entry(name, final, admin, commit, size, made)


def _refresh_index(repo: Repo, admin: Path, path: Path) -> None:
    """Leave no file "racily clean": git takes a file written in its index's second for one, and
    the first status of the job that takes the entry (its autocommit's) would read every such file
    again (~10 ms at 2,000 files, all written in one second). Those files' times are set back
    `SETTLE_BACK` seconds, then the index is refreshed: each of them read once, here, in the
    background of a job, and recorded as written before the index. Never waited for: a refill gets
    only a short grace after its job's work."""
    try:
        second = int((admin / "index").stat().st_mtime)
    except OSError:
        return
    back = time.time_ns() - SETTLE_BACK * 1_000_000_000
    folders = [str(path)]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.path)
                elif int(entry.stat(follow_symlinks=False).st_mtime) >= second:
                    os.utime(entry.path, ns=(back, back), follow_symlinks=False)
    worktrees.job_git(repo, admin, path, "update-index", "-q", "--refresh", check=False)


SETTLE_BACK = 2  # seconds: before the index's second, whenever within it a file was written


def _drop_transient(admin: Path) -> None:
    """Remove what git writes for a worktree's own history (`GIT_TRANSIENT`: its HEAD's reflog,
    ORIG_HEAD, the last commit message): the next job starts with none of it."""
    for name in GIT_TRANSIENT:
        path = admin / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            path.unlink()


def measure(path: Path) -> tuple[int, bool]:
    """(bytes on disk under `path`, whether a file there has another link), symlinks not followed."""
    total, linked = 0, False
    stack = [str(path)]
    while stack:
        folder = stack.pop()
        try:
            items = list(os.scandir(folder))
        except OSError:
            continue
        for item in items:
            try:
                info = item.stat(follow_symlinks=False)
            except OSError:
                continue
            total += info.st_blocks * 512
            if item.is_dir(follow_symlinks=False):
                stack.append(item.path)
            elif item.is_file(follow_symlinks=False) and info.st_nlink > 1:
                linked = True
    return total, linked


def clear_debris(repo: Repo) -> int:
    """Remove what is not a complete entry: folders under `.building/` (a killed filler's; call it
    holding `pool-fill.lock`), pool folders without their marked admin folder, and marked admin
    folders whose folder is gone. Under `worktree.lock`: an entry being taken or given back is
    such a pair for a moment (its admin folder renamed, its folder not yet)."""
    with file_lock(repo.state_dir / paths.WORKTREE_LOCK):
        return _clear_debris(repo)


def _clear_debris(repo: Repo) -> int:
    _, debris = _scan(repo)
    for folder in debris:
        admin = repo.common_dir / "worktrees" / folder.name
        _remove(repo, folder, admin if _marker(admin) is not None or _names_folder(admin, folder) else None)
    orphans = 0
    try:
        admins = list(os.scandir(repo.common_dir / "worktrees"))
    except OSError:
        admins = []
    for item in admins:
        admin = Path(item.path)
        if _marker(admin) is not None and not (pool_dir(repo) / admin.name).exists():
            shutil.rmtree(admin, ignore_errors=True)
            orphans += 1
    return len(debris) + orphans


def _names_folder(admin: Path, folder: Path) -> bool:
    try:
        said = worktrees.read_plain(admin / "gitdir").strip()
    except worktrees.MetadataChanged:
        return False
    return os.path.normpath(said) == os.path.normpath(folder / ".git")


def _remove(repo: Repo, folder: Path, admin: Path | None) -> None:
    """Remove a pool folder (never through a symlink; only below the pool folder) and its admin
    folder."""
    if folder.is_relative_to(pool_dir(repo)) and not folder.is_symlink():
        shutil.rmtree(folder, ignore_errors=True)
    if admin is not None and admin.parent == repo.common_dir / "worktrees" and not admin.is_symlink():
        shutil.rmtree(admin, ignore_errors=True)


def empty(repo: Repo, dry_run: bool = False) -> list[str]:
    """Remove every pooled worktree and the debris (gc); one line per entry."""
    ready, debris = _scan(repo)
    lines = [f"removed the pooled worktree {e.name} ({render.size(e.bytes)})" for e in ready]
    if debris:
        lines.append(f"removed {len(debris)} half-made pooled worktree{'s' if len(debris) != 1 else ''}")
    if dry_run:
        return [line.replace("removed", "would remove", 1) for line in lines]
    lock = filler(repo, 30.0)
    if lock is None:
        return ["the pool is being filled: left for a later gc"]
    try:
        with file_lock(repo.state_dir / paths.WORKTREE_LOCK):
            for entry in _scan(repo)[0]:
                _remove(repo, entry.path, entry.admin)
            _clear_debris(repo)
    finally:
        lock.release()
    return lines


# ---------------------------------------------------------------- a job's worktree coming back

def give_back(repo: Repo, job_id: str, path: Path, branch: str | None, base: str, commit: str) -> tuple[bool, bool]:
    """Put a finished job's worktree (checked clean by the caller at `commit`, its HEAD, its
    run-lock held) into the pool: (pooled, touched). Not pooled and not touched: the caller
    removes it as before. Touched but not pooled (it failed a check after its index was
    rebuilt): the caller must force the removal, nothing in it being work (the caller saw it
    clean)."""
    try:
        count = target(repo)
        limit = max_bytes(repo)
    except SubtaskError:
        return False, False
    if count <= 0:
        return False, False
    ready, _ = _scan(repo)
    if len(ready) >= count:
        return False, False
    try:
        admin = worktrees.check_metadata(repo, job_id, path, branch, base)
    except worktrees.MetadataChanged:
        return False, False  # the caller's own check decides what becomes of it
    names = set(os.listdir(admin))
    if names - GIT_OWN - GIT_TRANSIENT - JOB_MARKERS or worktrees.PENDING_CHECKOUT in names:
        return False, False
    if not commit:
        return False, False
    _drop_transient(admin)
    # The job wrote its index: rebuilt from the commit, every file is hashed against it.
    (admin / "index").unlink(missing_ok=True)
    ok = worktrees.job_git(repo, admin, path, "read-tree", commit, check=False).returncode == 0 \
        and worktrees.job_git(repo, admin, path, "update-index", "--refresh", check=False).returncode == 0 \
        and worktrees.job_git(repo, admin, path, "clean", "-ffdxq", check=False).returncode == 0
    if ok:
        left = worktrees.job_git(repo, admin, path, "status", "--porcelain", "--ignored=matching",
                                 "--untracked-files=all", "--ignore-submodules=none", check=False)
        ok = left.returncode == 0 and not left.stdout.strip()
    size, linked = measure(path) if ok else (0, True)
    if not ok or linked or sum(e.bytes for e in ready) + size > limit:
        return False, True
    name = f"pool-{os.urandom(4).hex()}"
    final, new_admin = pool_dir(repo) / name, repo.common_dir / "worktrees" / name
    _write(admin / "HEAD", f"{commit}\n")
    _write(admin / MARKER, json.dumps({"v": 1, "commit": commit, "bytes": size, "made": time.time(),
                                       "from": job_id}) + "\n")
    with file_lock(repo.state_dir / paths.WORKTREE_LOCK):
        if len(_scan(repo)[0]) >= count:
            (admin / MARKER).unlink()
            return False, True
        for marker in JOB_MARKERS:
            (admin / marker).unlink(missing_ok=True)
        # Renamed first: from here on the job owns no admin folder (a kill leaves the job's
        # folder, which names an admin folder that is gone, and a marked admin folder without
        # its pool folder: the next filler removes it).
        os.rename(admin, new_admin)
        _write(new_admin / "gitdir", f"{final / '.git'}\n")
        _write(path / ".git", f"gitdir: {new_admin}\n")
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, final)
    return True, True
