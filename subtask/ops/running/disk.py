"""`git subtask du`: what the jobs cost on disk, and what `cleanup --merged` and `gc` would free.

Per job whose worktree this clone checked out (`worktrees.created_here`: a folder under the
worktree folder whose admin folder's marker names the job, never a record's path), the worktree's
allocated bytes split into tracked, untracked and ignored files (folders count with what they
hold), and the objects only its refs keep (`git rev-list --disk-usage`: its branch, pins and
attempt pins, not reachable from another branch or a tag). Every other folder in the worktree
folder (scratch worktrees of `land` and `verify --run`, private temp dirs, a pool) is measured
whole, by name. A file linked twice is counted once.

Invariants:
- Never run git on a job's worktree while a process of the job may run, nor through discovery:
  the split needs the job's run-lock (`cleanup.quiet_job`) and its metadata checked
  (`worktrees.check_metadata`, then `job_git`); a running job is measured whole, unsplit.
- Never follow a symlink while measuring, because a job chooses its worktree's links.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from subtask.git import records, worktrees
from subtask.git.gitrepo import Repo
from subtask.model.dataclass import dataclass, field
from subtask.model.job import is_job_id
from subtask.ops.landing import cleanup

CLASSES = ("tracked", "untracked", "ignored")


@dataclass
class JobDisk:
    """One job's worktree on disk, and the objects only its refs keep (`du`)."""

    id: str
    state: str
    worktree: str
    total: int = 0
    split: dict[str, int] | None = None  # bytes by CLASSES; None: not split (why says why)
    why: str | None = None
    objects: int | None = None  # bytes of objects only the job's refs keep; None: not measurable

    def to_dict(self) -> dict:
        return {"id": self.id, "state": self.state, "worktree": self.worktree, "bytes": self.total,
                **({c: (self.split or {}).get(c) for c in CLASSES}), "split": self.split is not None,
                **({"why": self.why} if self.why else {}), "objects": self.objects}


@dataclass
class DiskUsage:
    """What `du` answers: every job's disk, the other folders, and what cleanup and gc would free."""

    jobs: list[JobDisk] = field(default_factory=list)
    other: dict[str, int] = field(default_factory=dict)  # folders in the worktree folder that are no job's
    frees: dict[str, dict] = field(default_factory=dict)  # "cleanup --merged", "gc": {"bytes", "jobs"}

    @property
    def total(self) -> int:
        return sum(j.total for j in self.jobs) + sum(self.other.values())

    def to_dict(self) -> dict:
        return {"v": 1, "jobs": [j.to_dict() for j in self.jobs], "other": self.other, "total": self.total,
                "objects": sum(j.objects or 0 for j in self.jobs), "frees": self.frees}


def usage(repo: Repo) -> DiskUsage:
    folder = repo.worktree_dir()
    found = DiskUsage()
    seen: set[tuple[int, int]] = set()
    try:
        children = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        children = []
    for entry in children:
        path = Path(entry.path)
        if is_job_id(entry.name) and entry.is_dir(follow_symlinks=False) \
                and worktrees.created_here(repo, entry.name, path):
            found.jobs.append(_job(repo, entry.name, path, seen))
        elif entry.is_dir(follow_symlinks=False):
            found.other[entry.name] = sum(_walk(path, seen).values())
    sizes = {j.id: j.total for j in found.jobs}
    for what, sweep in (("cleanup --merged", cleanup.cleanup_merged(repo, dry_run=True)),
                        ("gc", cleanup.gc(repo, dry_run=True))):
        gone = sorted(set(sweep.removed) & set(sizes))
        found.frees[what] = {"bytes": sum(sizes[j] for j in gone), "jobs": gone}
    return found


def _job(repo: Repo, job_id: str, path: Path, seen: set[tuple[int, int]]) -> JobDisk:
    try:
        job = records.read(repo, job_id)
    except Exception as exc:  # a damaged record still has a worktree that takes disk
        disk = JobDisk(job_id, "?", str(path), why=f"its record cannot be read: {getattr(exc, 'message', exc)}")
        disk.total = sum(_walk(path, seen).values())
        return disk
    disk = JobDisk(job_id, job.state.current.state, str(path), objects=_objects(repo, job_id))
    names = None
    with cleanup.quiet_job(repo, job) as fresh:
        if fresh is None:
            disk.why = "running (or busy): measured whole"
        else:
            names, disk.why = _names(repo, fresh, path)
    by_class = _walk(path, seen, names)
    disk.total = sum(by_class.values())
    if names is not None:
        disk.split = {c: by_class.get(c, 0) for c in CLASSES}
    return disk


def _names(repo: Repo, job, path: Path) -> tuple[dict[str, set[str]] | None, str | None]:
    """The worktree's tracked and untracked file names, from git on its checked metadata."""
    try:
        admin = worktrees.check_metadata(repo, job.id, path, job.spec.branch, job.spec.base, head=False)
    except worktrees.MetadataChanged as exc:
        return None, f"its git metadata is not what git-subtask wrote ({exc}): measured whole"
    tracked = worktrees.job_git(repo, admin, path, "ls-files", "-z", "--cached", check=False)
    untracked = worktrees.job_git(repo, admin, path, "ls-files", "-z", "--others", "--exclude-standard", check=False)
    if tracked.returncode != 0 or untracked.returncode != 0:
        return None, "git could not list its files: measured whole"
    return {"tracked": set(filter(None, tracked.stdout.split("\0"))),
            "untracked": set(filter(None, untracked.stdout.split("\0")))}, None


def _walk(top: Path, seen: set[tuple[int, int]], names: dict[str, set[str]] | None = None) -> dict[str, int]:
    """Allocated bytes under `top` by class (everything "ignored" that git neither tracks nor
    lists as untracked; without `names`, all of it under one key), symlinks never followed."""
    holds: dict[str, set[str]] = {c: {""} if c == "tracked" else set() for c in CLASSES}
    for kind, listed in (names or {}).items():
        for name in listed:
            parent = os.path.dirname(name)
            while parent and parent not in holds[kind]:
                holds[kind].add(parent)
                parent = os.path.dirname(parent)
    sizes: dict[str, int] = {}

    def add(kind: str, st: os.stat_result) -> None:
        key = (st.st_dev, st.st_ino)
        if key in seen:
            return
        seen.add(key)
        sizes[kind] = sizes.get(kind, 0) + st.st_blocks * 512

    def kind_of(rel: str, folder: bool) -> str:
        if names is None:
            return "all"
        if folder:
            return next((c for c in ("tracked", "untracked") if rel in holds[c]), "ignored")
        return next((c for c in ("tracked", "untracked") if rel in names[c]), "ignored")

    for root, dirs, files in os.walk(top, onerror=lambda exc: None):
        rel_root = os.path.relpath(root, top)
        rel_root = "" if rel_root == "." else rel_root
        try:
            add(kind_of(rel_root, True), os.lstat(root))
        except OSError:
            pass
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            rel = os.path.join(rel_root, name) if rel_root else name
            if not rel_root and name == ".git":
                continue  # git's pointer to the admin folder
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                continue
            add(kind_of(rel, False), st)
    return sizes


def _objects(repo: Repo, job_id: str) -> int | None:
    """Bytes of the objects only this job's refs keep (its branch, pins, attempt pins), as git
    stores them; None when git cannot say."""
    refs = [r.name for r in repo.objects.refs(f"refs/subtask/{job_id}/")
            if not r.name.endswith("/record") and not r.symbolic]
    branch = f"refs/heads/{records.branch_name(job_id)}"
    if repo.objects.ref(branch) is not None:
        refs.append(branch)
    if not refs:
        return 0
    proc = subprocess.run(["git", "--git-dir", str(repo.common_dir), "rev-list", "--objects", "--disk-usage",
                           *refs, "--not", "--exclude=subtask/*", "--branches", "--tags"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    try:
        return int(proc.stdout.strip()) if proc.returncode == 0 else None
    except ValueError:
        return None
