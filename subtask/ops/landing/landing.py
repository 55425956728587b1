"""Landing delegated work: merge a job, notice jobs that landed by any route, clean up after them, gc.

A finished job has *landed* when its head is reachable from the land target (the current branch,
or `git config subtask.landTarget`), or when its work is already upstream as patches: the job's
combined diff has the patch-id of an upstream commit (squash merge), or every non-merge commit of
base..head has the patch-id of one (rebase merge, cherry-pick). Patch-ids come from libgit2
(`Diff.patchid`, the same value as `git patch-id --stable`) and are cached by commit id, since a
commit's patch-id never changes.

Invariants:
- Nothing unmerged is ever deleted. A job branch is deleted only when it has landed, by a
  compare-and-swap on the exact tip that was found landed (so a commit added meanwhile keeps it),
  never while a worktree has it checked out.
- A worktree is removed only when it is clean (no changes, no untracked files) and its HEAD is a
  commit the branch, the pins or the target keep alive; `git worktree remove` without `--force`
  re-checks cleanliness itself.
- Only this clone's jobs (`ownership.owns`: never `spec.repo`, a path any record can name) are
  landed or cleaned here: a record pulled from a teammate is theirs to update, so records never
  diverge by our sweep, and nothing it names is ours to remove.
- A branch is deleted only when it is `subtask/<id>` of a job this clone owns and points where
  the record leaves the job (`why_not_deletable`), never a branch a record names.
- `merge` takes a record's verify only from a record this clone wrote or one an allowed signer
  signed (`trust_of`); otherwise it runs the verify here on the exact commit it then merges.
- `merge` takes a job whose branch is gone (a teammate's, pulled without it) from its head pin,
  only where the record leaves the job, through the same gate; a teammate's job that landed is
  this clone's mark (`where_landed`), never a write to its record.
- `merge` never stashes or touches a dirty worktree; a conflict is aborted (`git merge --abort`,
  or `git reset --merge` for a squash), leaving the worktree as it was.
- Records stay: landing, cleanup and gc only add facts (landed_in, worktree_removed,
  branch_deleted) to them.
- Merges into one worktree are serialized (`index_lock`, keyed by the worktree's own git dir) and
  hold the job's run-lock; a failed merge resets to the HEAD read under that lock, never when
  HEAD has moved. A detached HEAD is never merged into, nor a land target.
- Nothing is removed (worktree, branch) unless the job's run-lock is ours and the record re-read
  under it shows the same, ended attempt (`quiet_job`); a busy job is left for a later pass.
- A worktree is removed only when this clone's worker made it for this job
  (`worktrees.created_here`): a record's paths are data, never authority.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from subtask.git import notes, ownership, records, where_landed, worktrees
from subtask.git.gitrepo import Repo, git
from subtask.git.records import Job
from subtask.model import faults
from subtask.model.errors import EXIT_FATAL, SubtaskError
from subtask.model.job import work_base
from subtask.state import liveness, paths
from subtask.state.statefiles import LockTimeout, file_lock, write_json

if TYPE_CHECKING:
    import pygit2

SWEEP_STAMP = paths.SWEEP_STAMP
PATCH_ID_CACHE = paths.PATCH_ID_CACHE
# Upstream commits examined per sweep: bounds the first sweep of an old repository; jobs whose
# base is further back than this are still found when merged (reachability), not when squashed.
MAX_UPSTREAM_COMMITS = 5000
# First-parent steps walked to name the merge commit that brought a job in.
MAX_FIRST_PARENT_STEPS = 1000
MERGE_MODES = ("merge", "squash", "no-ff", "ff-only")


@dataclass
class Target:
    name: str  # branch name, or the commit id when HEAD is detached
    sha: str


@dataclass
class Sweep:
    """What a cleanup/gc pass did (or would do, on a dry run), one line per action."""

    lines: list[str] = field(default_factory=list)
    landed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    removed: dict[str, str] = field(default_factory=dict)  # job id -> the worktree removed (or that would be)


# ---------------------------------------------------------------- the land target

def land_target(repo: Repo) -> Target | None:
    """`subtask.landTarget`, else the current branch (a job branch or detached HEAD defers to the main worktree)."""
    import pygit2

    configured = repo.config.get("landTarget")
    if configured:
        try:
            return Target(configured, str(repo.git.revparse_single(configured).peel(pygit2.Commit).id))
        except (KeyError, ValueError, pygit2.GitError):
            raise SubtaskError("fatal", f"git config subtask.landTarget names no commit: {configured!r}",
                               hint="git config subtask.landTarget main") from None
    for candidate in (repo.git, _main_repo(repo)):
        target = _branch_target(candidate)
        if target is not None:
            return target
    # Detached (or unborn) everywhere: no branch keeps anything, so nothing counts as landed; a
    # job checked out detached for a look must not have its branch deleted by the sweep.
    return None


def _main_repo(repo: Repo) -> pygit2.Repository:
    import pygit2

    return pygit2.Repository(str(repo.root))


def _branch_target(git_repo: pygit2.Repository) -> Target | None:
    # A job branch is never a target: a job based on another would make it look landed.
    if git_repo.head_is_detached or git_repo.head_is_unborn:
        return None
    name = git_repo.head.shorthand
    if name.startswith("subtask/"):
        return None
    return Target(name, str(git_repo.head.target))


# ---------------------------------------------------------------- landed?

class PatchIds:
    """Patch-ids of commits, cached on disk by commit id."""

    def __init__(self, repo: Repo):
        self.repo = repo
        self.path = repo.state_dir / PATCH_ID_CACHE
        try:
            self.cache: dict[str, str] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.cache = {}
        self.dirty = False

    def of_commit(self, commit: pygit2.Commit) -> str | None:
        sha = str(commit.id)
        if sha not in self.cache:
            if len(commit.parents) != 1:
                return None  # merges and roots have no patch of their own (as in git cherry)
            self.cache[sha] = _patch_id(self.repo.git.diff(commit.parents[0], commit))
            self.dirty = True
        return self.cache[sha] or None

    def of_range(self, base: str, head: str) -> str | None:
        """The patch-id of the combined diff base..head (what a squash merge commits)."""
        key = f"{base}..{head}"
        if key not in self.cache:
            self.cache[key] = _patch_id(self.repo.git.diff(base, head))
            self.dirty = True
        return self.cache[key] or None

    def save(self) -> None:
        if self.dirty:
            write_json(self.path, self.cache)


def _patch_id(diff: pygit2.Diff) -> str:
    return "" if len(diff) == 0 else str(diff.patchid)


class Upstream:
    """The target's commits since the oldest base of the jobs in question: one walk serves every job.

    Reachability is membership in that set (a job head descends from its base, so if the target
    reaches it the walk meets it), which avoids one `descendant_of` graph search per job.
    """

    def __init__(self, repo: Repo, target: Target, bases: list[str], pids: PatchIds):
        import pygit2

        self.repo, self.target, self.pids = repo, target, pids
        self.commits: list[pygit2.Commit] = []
        self.complete = True
        oids = [pygit2.Oid(hex=b) for b in dict.fromkeys(bases)]
        stop = None if not oids else oids[0] if len(oids) == 1 else repo.git.merge_base_octopus(oids)
        walker = repo.git.walk(target.sha, pygit2.enums.SortMode.TOPOLOGICAL)
        if stop is not None:
            walker.hide(stop)
        for commit in walker:
            if len(self.commits) >= MAX_UPSTREAM_COMMITS:
                self.complete = False
                break
            self.commits.append(commit)
        self.shas = {str(c.id) for c in self.commits}
        self._patch_ids: dict[str, str] | None = None

    def reaches(self, head: str) -> bool:
        if head == self.target.sha or head in self.shas:
            return True
        return not self.complete and self.repo.git.descendant_of(self.target.sha, head)

    @property
    def patch_ids(self) -> dict[str, str]:
        """patch-id -> the newest upstream commit with it (computed on first need, cached on disk)."""
        if self._patch_ids is None:
            self._patch_ids = {}
            for commit in self.commits:
                pid = self.pids.of_commit(commit)
                if pid:
                    self._patch_ids.setdefault(pid, str(commit.id))
        return self._patch_ids


def landed_in(repo: Repo, base: str, head: str, upstream: Upstream) -> str | None:
    """The target commit that carries the job's work, or None while it has not landed."""
    import pygit2

    if head == base:
        return None  # nothing to land
    if upstream.reaches(head):
        return merge_point(repo, head, upstream.target.sha)
    ids = upstream.patch_ids
    combined = upstream.pids.of_range(base, head)
    if combined and combined in ids:
        return ids[combined]  # squash merge
    walker = repo.git.walk(head, pygit2.enums.SortMode.TOPOLOGICAL)
    walker.hide(base)
    hits = []
    for commit in walker:
        pid = upstream.pids.of_commit(commit)
        if pid is None:
            continue
        if pid not in ids:
            return None
        hits.append(ids[pid])
    return hits[0] if hits else None  # rebase merge / cherry-picks: the newest copy


def merge_point(repo: Repo, head: str, target: str) -> str:
    """The first-parent commit of the target that brought `head` in (the head itself for a fast-forward)."""
    current = repo.git[target]
    last = str(current.id)
    for _ in range(MAX_FIRST_PARENT_STEPS):
        sha = str(current.id)
        if sha == head:
            return sha
        if not repo.git.descendant_of(sha, head):
            return last
        last = sha
        if not current.parents:
            return last
        current = current.parents[0]
    return last


def branch_ref(job: Job) -> str | None:
    """The job's branch, `refs/heads/subtask/<id>`; None for a read-only job, and for a record that
    names any other branch: a pulled record can name `main`, which is never read, merged or
    deleted as a job's."""
    if job.spec.branch and job.spec.branch == records.branch_name(job.id):
        return f"refs/heads/{job.spec.branch}"
    return None


def recorded_head(job: Job) -> str:
    """Where the job's record says its work ends: the evidence's head, the attempt's, else its base."""
    return (job.evidence.head if job.evidence is not None else None) or job.state.current.head or job.spec.base


def why_not_deletable(repo: Repo, job: Job, tip: str) -> str:
    """"" when the job's branch at `tip` is this clone's to delete, else why not: the job is this
    clone's (`ownership.owns`), the branch is `subtask/<id>`, and it points where the record says
    (its head or its base). Worth checking even for our own record, because a record is data."""
    if branch_ref(job) is None:
        return f"the record names the branch {job.spec.branch!r}, not {records.branch_name(job.id)}"
    if not ownership.owns(repo, job):
        return "the job is another clone's"
    if tip not in (recorded_head(job), job.spec.base):
        return f"it points at {tip[:7]}, not where the record leaves the job ({recorded_head(job)[:7]})"
    return ""


def job_head(repo: Repo, job: Job) -> str:
    """The job's head: its branch tip while it exists, else the head pin, else its base."""
    name = branch_ref(job)
    if name:
        ref = repo.git.references.get(name)
        if ref is not None:
            return str(ref.target)
    pin = repo.git.references.get(records.pin_ref(job.id, "head"))
    if pin is not None:
        return str(pin.target)
    return job.evidence.head if job.evidence else job.spec.base


# ---------------------------------------------------------------- cleaning one job

def worktree_removable(repo: Repo, job: Job, keepers: list[str]) -> tuple[bool, str]:
    """(True, "") when the job's worktree can go without losing anything; else (False, why).

    Call it under the job's run-lock (`quiet_job`), so no worker starts in it meanwhile.
    """
    path = Path(job.spec.worktree)
    if not path.exists():
        return False, "no worktree"
    if not worktrees.created_here(repo, job.id, path):
        return False, worktrees.why_not_ours(repo, job.id, path)
    if not ownership.owns(repo, job):
        return False, "the job is another clone's (a pulled record is a claim, not this clone's to clean up)"
    try:
        admin = worktrees.check_metadata(repo, job.id, path, job.spec.branch, job.spec.base, head=False)
    except worktrees.MetadataChanged as exc:
        return False, f"its git metadata is not what git-subtask wrote ({exc}): left for you to inspect"
    status = worktrees.job_git(repo, admin, path, "status", "--porcelain", "--untracked-files=normal",
                               "--ignore-submodules=none", check=False)
    if status.returncode != 0:
        return False, f"worktree {path} is not a readable git worktree"
    if status.stdout.strip() and not checkout_leftovers(repo, job):
        return False, f"worktree {path} has uncommitted changes or untracked files"
    proc = worktrees.job_git(repo, admin, path, "rev-parse", "HEAD", check=False)
    head = proc.stdout.strip()
    if proc.returncode != 0:
        return False, f"worktree {path} is not a readable git worktree"
    if not any(k == head or repo.git.descendant_of(k, head) for k in keepers if k):
        return False, f"worktree {path} has commits ({head[:7]}) that no branch keeps"
    return True, ""


def never_ran(job: Job) -> bool:
    """No engine of this job ever started (this clone's record says so: the worker records it
    before it starts one), so its worktree holds git's checkout and what a person put there."""
    return all(attempt.engine_started_at is None for attempt in job.state.attempts)


# Where a checkout's status may read as changed with nothing to lose: a tracked file missing.
_MISSING = ("D ", " D")


def checkout_leftovers(repo: Repo, job: Job) -> bool:
    """The worktree of a job whose engine never ran reads as changed, and only by what git's
    checkout stopped half-way leaves: tracked files missing (no index yet: git writes it last, so
    every file reads deleted) and, while there is no index, files exactly as the commit holds them
    at their path (the ones git wrote before the stop). What `git worktree remove` must be forced
    over; anything else (a file edited or added by a person: the checkout may be whole, the job
    failed at its setup) is kept by the usual check. Read through the job-safe git, never by discovery."""
    path = Path(job.spec.worktree)
    if not never_ran(job):
        return False
    try:
        admin = worktrees.check_metadata(repo, job.id, path, job.spec.branch, job.spec.base, head=False)
    except worktrees.MetadataChanged:
        return False
    quiet = dict(os.environ, GIT_OPTIONAL_LOCKS="0")  # never write an index: "none yet" is what the checkout goes by
    status = worktrees.job_git(repo, admin, path, "status", "--porcelain", "--untracked-files=all",
                               "--ignore-submodules=none", env=quiet, check=False)
    lines = [line for line in status.stdout.splitlines() if line]
    if status.returncode != 0 or not lines:
        return False
    written = [line[3:] for line in lines if line[:2] == "??"]
    if any(line[:2] not in _MISSING and line[:2] != "??" for line in lines):
        return False
    return not written or (not (admin / "index").exists() and _as_committed(repo, admin, path, written, quiet))


def _as_committed(repo: Repo, admin: Path, path: Path, names: list[str], env: dict) -> bool:
    """Is each of these files (as git's status names them) a regular file whose bytes are the
    blob the worktree's commit holds at its path? No filter runs: a file a filter would have
    changed reads as different, and is kept."""
    if any(name.startswith('"') for name in names):
        return False  # a name git quoted: not one to compare byte for byte
    if any((path / name).is_symlink() or not (path / name).is_file() for name in names):
        return False
    tree = worktrees.job_git(repo, admin, path, "ls-tree", "-r", "-z", "HEAD", env=env, check=False)
    hashed = worktrees.job_git(repo, admin, path, "hash-object", "--no-filters", "--stdin-paths",
                               input="".join(f"{name}\n" for name in names), env=env, check=False)
    if tree.returncode != 0 or hashed.returncode != 0:
        return False
    blobs = {}
    for entry in tree.stdout.split("\0"):
        meta, _, name = entry.partition("\t")
        fields = meta.split()
        if len(fields) == 3 and fields[0] in ("100644", "100755"):
            blobs[name] = fields[2]
    shas = hashed.stdout.split()
    return len(shas) == len(names) and all(blobs.get(name) == sha for name, sha in zip(names, shas, strict=True))


def remove_worktree(repo: Repo, job: Job, *, record: bool = True) -> bool:
    """`git worktree remove`, never forced but over what git's own checkout of a job whose engine
    never ran left (`checkout_leftovers`: stopped half-way, it reads as every file deleted); say
    so in the record. Its own status of the worktree runs with fsmonitor off: `worktree_removable`
    checked the admin folder git reads, not the config of what it names."""
    from subtask.ops.landing import overlay

    overlay.restore_left(repo, job.id)  # a killed verify's moved files go back before the worktree goes
    force = ["--force"] if checkout_leftovers(repo, job) else []
    removed = git(repo.root, "-c", "core.fsmonitor=false", "worktree", "remove", *force, job.spec.worktree,
                  check=False).returncode == 0
    if removed:
        overlay.forget(repo, job.id)  # its setup snapshot, beside the worktree
    if removed and record:
        records.update(repo, job.id, lambda j: setattr(j.state, "worktree_removed", True))
    return removed


BUSY = "a worker or a reply holds the job (or it changed since it was listed): left for a later pass"


@contextmanager
def quiet_job(repo: Repo, job: Job, *, held: bool = False) -> Iterator[Job | None]:
    """The job's fresh record while its run-lock is ours; None when it is busy or changed.

    A worker holds the run-lock for its whole life and `reply` takes it before it appends its
    attempt, so while we hold it no worker can start in the job's worktree or on its branch.
    None when someone else holds it, when the current attempt has not ended, or when the record
    has a newer attempt than the `job` the caller looked at (a reply ran meanwhile: its commits
    were never examined). `held`: the caller already holds the run-lock (merge).
    """
    faults.point("before_worktree_removal")
    fd = None if held else liveness.acquire(repo.state_dir, job.id, block=False)
    if fd is None and not held:
        yield None
        return
    try:
        try:
            fresh = records.read(repo, job.id)
        except Exception:
            fresh = None  # damaged meanwhile: touch nothing
        unchanged = fresh is not None and fresh.state.current.terminal and fresh.state.current.n == job.state.current.n
        faults.point("after_removal_recheck")
        yield fresh if unchanged else None
    finally:
        if fd is not None:
            liveness.release(fd)


@dataclass
class Removal:
    kind: str  # "removed" (or would be, on a dry run), "pruned" (a stale registration), "missing", "busy", "kept", "failed"
    why: str = ""


def remove_clean_worktree(repo: Repo, job: Job, target: Target | None, *, dry_run: bool = False) -> Removal:
    """Remove the job's worktree when that loses nothing, re-checked under its run-lock (cleanup, gc)."""
    return clean_job(repo, job, target, dry_run=dry_run, branches=False)[0]


EMPTY_BRANCH = "no commits beyond its base"


def clean_job(repo: Repo, job: Job, target: Target | None, *, dry_run: bool = False,
              branches: bool = True) -> tuple[Removal, Removal]:
    """(worktree, branch): remove the job's clean worktree, then its branch when it has no
    commits beyond its base (`branches`), both under one hold of its run-lock (cleanup ID, gc).

    A stopped or failed job that made no commit leaves a branch at its base that no landing
    ever removes; deleting it loses nothing (the base pin and the record stay).
    """
    with quiet_job(repo, job) as fresh:
        if fresh is None:
            return Removal("busy", BUSY), Removal("busy", BUSY)
        tree = _remove_worktree_locked(repo, fresh, target, dry_run)
        branch = _remove_empty_branch_locked(repo, fresh, dry_run, worktree_goes=tree.kind == "removed") \
            if branches else Removal("missing")
        return tree, branch


def _remove_worktree_locked(repo: Repo, job: Job, target: Target | None, dry_run: bool) -> Removal:
    path = Path(job.spec.worktree)
    if not path.exists():
        if ownership.owns(repo, job) and worktrees.stale_admin(repo, job.id, path) is not None:
            # Removed by hand: git still lists it (prunable) until its registration goes too.
            if not dry_run:
                worktrees.drop_stale(repo, job.id, path)
            return Removal("pruned", "its folder was removed by hand")
        return Removal("missing", "no worktree")  # e.g. a concurrent gc removed it: fine
    ok, why = worktree_removable(repo, job, keepers(repo, job, target))
    if not ok:
        return Removal("kept", why)
    if dry_run:
        return Removal("removed")
    if not remove_worktree(repo, job):
        return Removal("failed", f"git worktree remove {job.spec.worktree} failed")
    return Removal("removed")


def empty_branch_tip(repo: Repo, job: Job) -> str | None:
    """The tip of the job's branch when it is at its base (no commit beyond it)."""
    name = branch_ref(job)
    ref = repo.git.references.get(name) if name else None
    if ref is None:
        return None
    tip = str(ref.target)
    return tip if tip == job.spec.base else None


def _remove_empty_branch_locked(repo: Repo, job: Job, dry_run: bool, *, worktree_goes: bool) -> Removal:
    """Under the job's run-lock: delete its branch by compare-and-swap on the exact empty tip seen,
    so a commit made meanwhile (by hand, in another worktree) keeps it."""
    branch = job.spec.branch
    name = branch_ref(job)
    if name is None or repo.git.references.get(name) is None:
        return Removal("missing")  # a record naming another branch: never ours to delete (nor news)
    tip = empty_branch_tip(repo, job)
    if tip is None:
        return Removal("missing", "it has commits beyond its base")  # never ours to delete; not news
    why = why_not_deletable(repo, job, tip)
    if why:
        return Removal("kept", why)
    # On a dry run the job's own worktree is still there but would be gone by now.
    if f"refs/heads/{branch}" in checked_out_branches(repo) and not (worktree_goes and dry_run):
        return Removal("kept", "it is checked out in a worktree")
    if dry_run:
        return Removal("removed")
    faults.point("before_empty_branch_delete")
    if not records.cas_ref(repo, f"refs/heads/{branch}", tip, None, f"git-subtask: {EMPTY_BRANCH}"):
        return Removal("kept", "it moved")
    records.update(repo, job.id, lambda j: setattr(j.state, "branch_deleted", True))
    return Removal("removed")


def branch_line(job: Job, removal: Removal, dry_run: bool) -> str | None:
    """The line cleanup and gc print for an empty branch (nothing for one with commits)."""
    if removal.kind == "removed":
        return f"{job.id}: {'would delete' if dry_run else 'deleted'} branch {job.spec.branch} ({EMPTY_BRANCH})"
    if removal.kind == "kept":
        return f"{job.id}: kept branch {job.spec.branch}: {removal.why}"
    return None


def checked_out_branches(repo: Repo) -> set[str]:
    out = git(repo.root, "worktree", "list", "--porcelain", check=False).stdout
    return {line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("branch ")}


def keepers(repo: Repo, job: Job, target: Target | None) -> list[str]:
    keep = [job_head(repo, job), job.spec.base]
    pin = repo.git.references.get(records.pin_ref(job.id, "head"))
    if pin is not None:
        keep.append(str(pin.target))
    if target is not None:
        keep.append(target.sha)
    return keep


def finish_landed(repo: Repo, job: Job, head: str, landed: str, target: Target | None, *,
                  dry_run: bool = False, checked_out: set[str] | None = None, held: bool = False,
                  also: Callable[[Job], None] | None = None, sweep: Sweep | None = None) -> list[str] | None:
    """Record that the job landed in `landed`; remove its clean worktree; delete its landed branch.

    All of it under the job's run-lock (`quiet_job`); None when the job is busy or changed, and
    then nothing was done (a later pass sees it again). `also` changes the record in the same
    write (`land` marks its landing there); `sweep.removed` learns the worktree removed.
    """
    with quiet_job(repo, job, held=held) as fresh:
        if fresh is None:
            return None
        return _finish_landed(repo, fresh, head, landed, target, dry_run=dry_run, checked_out=checked_out, also=also,
                              sweep=sweep)


def _finish_landed(repo: Repo, job: Job, head: str, landed: str, target: Target | None, *,
                   dry_run: bool, checked_out: set[str] | None, also: Callable[[Job], None] | None = None,
                   sweep: Sweep | None = None) -> list[str]:
    lines = [f"{job.id}: landed in {landed[:7]}"]
    removed = False
    path = Path(job.spec.worktree)
    if not path.exists() and worktrees.stale_admin(repo, job.id, path) is not None:
        lines.append(f"{job.id}: {'would forget' if dry_run else 'forgot'} git's registration of its worktree "
                     f"{path} (its folder was removed by hand)")
        if not dry_run:
            removed = worktrees.drop_stale(repo, job.id, path)
    elif path.exists():
        ok, why = worktree_removable(repo, job, keepers(repo, job, target))
        if ok:
            lines.append(f"{job.id}: {'would remove' if dry_run else 'removed'} worktree {path}")
            if not dry_run:
                removed = remove_worktree(repo, job, record=False)  # recorded with the landing below
            if sweep is not None and (dry_run or removed):
                sweep.removed[job.id] = str(path)
        else:
            lines.append(f"{job.id}: kept worktree: {why}")
    deleted = False
    branch = job.spec.branch
    name = branch_ref(job)
    ref = repo.git.references.get(name) if name else None
    why = why_not_deletable(repo, job, str(ref.target)) if ref is not None else ""
    if ref is not None and repo.config.flag("deleteLandedBranches"):
        checked_out = checked_out if checked_out is not None else checked_out_branches(repo)
        if why:
            lines.append(f"{job.id}: kept branch {branch}: {why}")
        elif f"refs/heads/{branch}" in checked_out and not (removed or dry_run):
            lines.append(f"{job.id}: kept branch {branch}: it is checked out in a worktree")
        elif str(ref.target) != head:
            lines.append(f"{job.id}: kept branch {branch}: it moved after the landed check")
        elif dry_run:
            lines.append(f"{job.id}: would delete branch {branch} (was {head[:7]})")
        else:
            deleted = records.cas_ref(repo, ref.name, head, None, "git-subtask: landed")
            lines.append(f"{job.id}: deleted branch {branch} (was {head[:7]})" if deleted
                         else f"{job.id}: kept branch {branch}: it moved")
    if not dry_run:
        _record_landed(repo, job.id, landed, removed, deleted, also)
    return lines


def _record_landed(repo: Repo, job_id: str, landed: str, removed: bool, deleted: bool,
                   also: Callable[[Job], None] | None = None) -> None:
    def change(j: Job) -> bool:
        before = (j.state.landed_in, j.state.worktree_removed, j.state.branch_deleted)
        j.state.landed_in = j.state.landed_in or landed
        j.state.worktree_removed = j.state.worktree_removed or removed
        j.state.branch_deleted = j.state.branch_deleted or deleted
        if also is not None:
            also(j)
            return True
        return before != (j.state.landed_in, j.state.worktree_removed, j.state.branch_deleted)

    job = records.update(repo, job_id, change)
    notes.write_for_job(repo, job)


# ---------------------------------------------------------------- cleanup --merged

def candidates(repo: Repo, entries: list[dict] | None = None) -> list[Job]:
    """This clone's finished, not-yet-landed writing jobs with commits (the only ones a sweep looks at)."""
    jobs = []
    tips = _job_ref_tips(repo)
    owned = ownership.owned_keys(repo)
    for entry in records.list_entries(repo) if entries is None else entries:
        if entry.get("landed") or entry.get("readonly") or entry.get("state") not in ("done", "failed", "stopped"):
            continue
        if entry["id"] not in owned or not _may_have_commits(entry, tips):
            continue  # a teammate's job is never landed or cleaned here (its record stays theirs)
        try:
            job = records.read_commit(repo, entry["tip"], entry["id"])
        except Exception:
            continue
        if branch_ref(job) and ownership.owns(repo, job, owned):
            jobs.append(job)
    return jobs


def _job_ref_tips(repo: Repo) -> dict[str, str]:
    """Job branch tips and head pins by ref name, in one pass over the refs (a lookup per job
    costs 15x more at 10,000 jobs)."""
    return {ref.name: str(ref.target) for ref in repo.git.references.iterator()
            if ref.name.startswith("refs/heads/subtask/") or
            (ref.name.startswith(records.PREFIX) and ref.name.endswith("/head"))}


def _may_have_commits(entry: dict, tips: dict[str, str]) -> bool:
    """A job whose branch is gone or still at its base, and that has no head pin, made no commit
    anyone can land, so its record need not be read (10,000 old jobs would otherwise cost a
    second on every sweep)."""
    if records.pin_ref(entry["id"], "head") in tips:
        return True
    branch = tips.get(f"refs/heads/{records.branch_name(entry['id'])}")
    return branch is not None and branch != entry.get("base")


def cleanup_merged(repo: Repo, dry_run: bool = False, entries: list[dict] | None = None) -> Sweep:
    """Find every landed job, record it, remove its clean worktree, delete its landed branch.

    `entries` (from `records.list_entries`) saves a second listing when the caller has one.
    """
    sweep = Sweep()
    target = land_target(repo)
    jobs = candidates(repo, entries)
    if target is None or not jobs:
        return sweep
    pids = PatchIds(repo)
    heads = {job.id: job_head(repo, job) for job in jobs}
    upstream = Upstream(repo, target, [work_base(j) for j in jobs], pids)
    checked_out = None
    for job in jobs:
        landed = landed_in(repo, work_base(job), heads[job.id], upstream)
        if landed is None:
            continue
        checked_out = checked_out if checked_out is not None else checked_out_branches(repo)
        lines = finish_landed(repo, job, heads[job.id], landed, target, dry_run=dry_run, checked_out=checked_out,
                              sweep=sweep)
        if lines is None:
            sweep.kept.append(job.id)
            sweep.lines.append(f"{job.id}: skipped: {BUSY}")
            continue
        sweep.landed.append(job.id)
        sweep.lines += lines
    pids.save()
    return sweep


def maybe_sweep(repo: Repo, entries: list[dict] | None = None) -> bool:
    """The lazy sweep inside other commands: at most once every subtask.sweepInterval seconds.

    Hooks do not run on rebase, fetch or server-side merges, so landed jobs are noticed here. A
    failure must never break the command that hosts the sweep. Returns True when a job landed.
    """
    try:
        if not repo.state_dir.is_dir():
            return False  # no job ever started here: nothing to sweep (a read makes nothing)
        interval = repo.config.number("sweepInterval")
        stamp = repo.state_dir / SWEEP_STAMP
        try:
            last = json.loads(stamp.read_text()).get("t", 0)
        except (OSError, ValueError, AttributeError):
            last = 0
        now = time.time()
        if now - last < interval:
            return False
        write_json(stamp, {"v": 1, "t": now})  # first, so concurrent commands skip
        return bool(cleanup_merged(repo, entries=entries).landed)
    except Exception:
        return False


# ---------------------------------------------------------------- merge

@dataclass
class MergeResult:
    job: Job
    mode: str
    commit: str
    into: str
    lines: list[str]


def merge(repo: Repo, id_or_prefix: str, mode: str = "merge", force: bool = False,
          reverify: bool = False) -> MergeResult:
    """Merge a finished, verified job into the current branch, then clean up after it.

    The verify a record claims is taken only from a record this clone wrote, or one an allowed
    signer signed (`trust_of`); any other (and every one with `reverify`) has its verify run
    again here on the exact commit before anything is merged (`reverify.run`, outside the
    locks), and that commit is what is merged. `force` skips the gate, and nothing else does.
    Serialized per target worktree (`index_lock`) and holding the job's run-lock, so two merges
    never interleave in one index and no reply starts on the job meanwhile.
    """
    if mode not in MERGE_MODES:
        raise SubtaskError("usage", f"unknown merge mode {mode!r} ({', '.join(MERGE_MODES)})")
    job_id = records.resolve(repo, id_or_prefix)
    job = records.read(repo, job_id)
    trust = trust_of(repo, job, reverify)
    head = check_mergeable(repo, job, force, trust.claims)  # refuse at once, not after the locks
    lines = [trust.line] if trust.line else []
    if not force and not trust.claims:
        lines.append(_rerun_gate(repo, job, head, trust.line, trust.vouched))
    workdir = Path(repo.git.workdir)
    with index_lock(repo, workdir), _run_lock_for_merge(repo, job_id):
        fresh = records.read(repo, job_id)
        fresh_head = check_mergeable(repo, fresh, force, trust.claims)
        # What was judged (a re-run on `head`, a signature on that tip) holds for that record only.
        if not trust.owned and fresh.tip != job.tip or not trust.claims and fresh_head != head:
            raise SubtaskError("negative", f"{job.id} changed while it was checked (its branch or record moved): "
                               "not merging what was not checked", hint=f"git subtask merge {job.id}")
        return _merge_locked(repo, fresh, fresh_head, workdir, mode, lines, owned=trust.owned)


@dataclass
class Trust:
    """What `merge` may take from a record: its verify as claimed (`claims`), or only by re-running it."""

    claims: bool
    owned: bool
    line: str  # what merge says about it; "" for this clone's own job taken as recorded
    vouched: bool = False  # this clone's record, or an allowed signer's: its opt-out of the harness holds


def trust_of(repo: Repo, job: Job, reverify: bool = False) -> Trust:
    from subtask.git import signing

    if ownership.owns(repo, job):
        return Trust(not reverify, True, "", True)
    provenance = signing.check_one(repo, job.tip, job.signed)
    if not provenance.trusted:
        return Trust(False, False, f"{job.id}: another clone's job, and its record is {provenance.words()}: "
                                   "its verify is run here before merging")
    if reverify:
        return Trust(False, False, "", True)
    return Trust(True, False, f"{job.id}: another clone's job; its record is {provenance.words()}: "
                              "its verify is taken as recorded", True)


def _rerun_gate(repo: Repo, job: Job, head: str, why: str, vouched: bool) -> str:
    """Run the job's verify here on `head` (`reverify`); its line, or the refusal (saying `why`
    the record was not taken at its word) when it fails."""
    from subtask.ops.landing import reverify

    because = f"\n{why}" if why else ""
    if not job.spec.verify:
        raise SubtaskError("negative", f"{job.id}: its record names no verify command to run here, and nothing "
                           f"else says it works: not merging it{because}",
                           hint=f"git subtask diff {job.id}   (merge anyway: git subtask merge --force {job.id})")
    rerun = reverify.run(repo, job, head, trusted_record=vouched)
    if not rerun.result.passed:
        how = "timed out" if rerun.result.timed_out else f"exit {rerun.result.exit_code}"
        if rerun.result.checks_failed:
            how += f"; check {', '.join(rerun.result.checks_failed)} failed"
        tail = rerun.result.output_tail.strip().splitlines()[-5:]
        raise SubtaskError("negative", f"{job.id}: verify failed when re-run here on {head[:7]} "
                           f"({rerun.result.command} -> {how}): not merging it"
                           + ("".join(f"\n  {line}" for line in tail)) + because,
                           hint=f"git subtask verify {job.id} --run   (merge anyway: git subtask merge --force {job.id})")
    return rerun.line(job.id)


def _merge_locked(repo: Repo, job: Job, head: str, workdir: Path, mode: str, lines: list[str], *,
                  owned: bool) -> MergeResult:
    into = _check_into(repo, job, workdir)
    check_clean(workdir)
    before = _head_of_worktree(workdir)
    message = merge_message(repo, job, head, mode)
    args = {"merge": ["--ff"], "no-ff": ["--no-ff"], "ff-only": ["--ff-only"], "squash": ["--squash"]}[mode]
    proc = git(workdir, "merge", "--no-edit", *args, "-m", message, head, check=False)
    if proc.returncode != 0:
        _abort(workdir, job, mode, into, proc, before)
    if mode == "squash":
        _commit_squash(workdir, job, message, into, before)
    commit = _head_of_worktree(workdir)
    how = merge_kind(mode, before, commit, head)
    landed = head if how == "fast-forward" else commit
    if how == "already":
        # The target already had the job's head (git said "Already up to date"): nothing merged,
        # but the work is in the target, so it has landed where the target first carried it.
        landed = merge_point(repo, head, commit)
        lines = [*lines, f"{job.id}: nothing to merge: {into} already has its commits (landed in {landed[:7]})"]
    else:
        lines = [*lines, f"{job.id}: merged into {into} ({how}) as {commit[:7]}"]
    target = Target(into, commit)
    if owned:
        lines += (finish_landed(repo, job, head, landed, target, held=True) or [""])[1:]
    else:
        lines.append(landed_elsewhere(repo, job, landed))
    return MergeResult(records.read(repo, job.id), mode, commit, into, lines)


def landed_elsewhere(repo: Repo, job: Job, commit: str) -> str:
    """A teammate's job landed here in `commit`: its record is theirs to update, its branch and
    worktree never ours to remove, so the fact is this clone's mark (`where_landed`), and its
    review block is written where the landing put it; the line that says so."""
    where_landed.mark(repo, job.id, commit)
    notes.write_for_job(repo, job)
    return f"{job.id}: its record and branch are left as they are (another clone's job)"


INDEX_LOCK_WAIT = 120.0
MERGE_RUN_LOCK_WAIT = 3.0


@contextmanager
def index_lock(repo: Repo, workdir: Path, git_dir: Path | None = None) -> Iterator[None]:
    """Exclusive right to write one worktree's index and HEAD, among git-subtask commands.

    Keyed by that worktree's own git dir (each worktree has its own index and HEAD; `git_dir`,
    default this repository's), kept in the state dir. git's `index.lock` alone does not
    serialize a merge: `merge --squash` then `commit` are two git runs, and another merge
    between them commits or resets the wrong index.
    """
    key = hashlib.sha1(str(Path(git_dir or repo.git.path).resolve()).encode()).hexdigest()[:16]
    lock = file_lock(paths.index_lock(repo.state_dir, key), timeout=INDEX_LOCK_WAIT)
    try:
        lock.acquire()
    except LockTimeout:
        raise SubtaskError("negative", f"another git-subtask merge into {workdir} has not finished after "
                           f"{INDEX_LOCK_WAIT:.0f} s: not merging now", hint="try again once it is done") from None
    try:
        yield
    finally:
        lock.release()


@contextmanager
def _run_lock_for_merge(repo: Repo, job_id: str) -> Iterator[None]:
    """The job's run-lock for the whole merge; a gc or cleanup holds it only briefly, so wait a little."""
    fd = liveness.acquire_within(repo.state_dir, job_id, MERGE_RUN_LOCK_WAIT)
    try:
        yield
    finally:
        liveness.release(fd)


def _head_of_worktree(workdir: Path) -> str:
    return git(workdir, "rev-parse", "HEAD").stdout.strip()


def merge_kind(mode: str, before: str, after: str, head: str) -> str:
    """What a successful `git merge` did: "fast-forward", "already" (HEAD unmoved), or the mode
    ("merge", "no-ff", "squash") when it made a commit; the words `merge` prints."""
    if after == before:
        return "already"
    if mode in ("merge", "ff-only") and after == head:
        return "fast-forward"
    return mode


def check_mergeable(repo: Repo, job: Job, force: bool, claims: bool = True) -> str:
    """The head to merge, or the refusal; `claims`: the record's verify may be taken as recorded
    (else only its state is, and `merge` runs its verify here)."""
    attempt = job.state.current
    if not job.spec.branch:
        raise SubtaskError("negative", f"{job.id} is a read-only job: it has no branch to merge")
    if branch_ref(job) is None:
        raise SubtaskError("negative", f"{job.id}: its record names the branch {job.spec.branch!r}, not "
                           f"{records.branch_name(job.id)}: never merging a branch a record names")
    if not attempt.terminal:
        raise SubtaskError("not_finished", f"{job.id} is {attempt.state}: it has not finished",
                           hint=f"git subtask wait {job.id}")
    if landed_in := where_landed.commit_of(repo, job):
        raise SubtaskError("negative", f"{job.id} already landed in {landed_in[:7]}")
    head = _head_to_merge(repo, job)
    if not force:
        _check_gate(job, head, claims)
    _check_has_commits(repo, job, head)
    return head


def _head_to_merge(repo: Repo, job: Job) -> str:
    """The job's branch tip; once the branch is gone (a teammate's job pulled without it), its
    head pin, where the record leaves the job: the gate then judges that commit as it would the
    branch's (a record this clone cannot trust has its verify run here on it)."""
    ref = repo.git.references.get(f"refs/heads/{job.spec.branch}")
    if ref is not None:
        return str(ref.target)
    pin = repo.git.references.get(records.pin_ref(job.id, "head"))
    if pin is None:
        raise SubtaskError("fatal", f"the branch {job.spec.branch} of {job.id} is gone, and so is its head pin "
                           f"{records.pin_ref(job.id, 'head')}: nothing says what its work is",
                           hint=f"git subtask verify {job.id}")
    head = str(pin.target)
    if head != recorded_head(job):
        raise SubtaskError("negative", f"{job.id}: its branch is gone and its head pin points at {head[:7]}, not "
                           f"where its record leaves the job ({recorded_head(job)[:7]}): not merging either",
                           hint=f"git subtask verify {job.id}")
    return head


def _check_has_commits(repo: Repo, job: Job, head: str) -> None:
    base = work_base(job)  # a reconciled job's branch holds the target's commits: none of them is its work
    if head == base or repo.git.descendant_of(base, head):
        # Not even --force: merging the base would be "Already up to date" dressed as a merge, and
        # recording it landed would claim work that never existed.
        raise SubtaskError("negative", f"nothing to merge: {job.id} made no commits (its branch is at its base "
                           f"{base[:7]})",
                           hint=f"git subtask show {job.id}   (remove its empty branch: git subtask cleanup {job.id})")


def _check_gate(job: Job, head: str, claims: bool = True) -> None:
    """Done, verify passed on this exact head (what --force skips); without `claims`, done only."""
    attempt = job.state.current
    if attempt.state != "done":
        raise SubtaskError("not_finished", f"{job.id} ended {attempt.state}, not done: not merging it",
                           hint=f"git subtask show {job.id}   (merge anyway: git subtask merge --force {job.id})")
    if not claims:
        return
    verify = attempt.verify
    if verify is not None and not verify.passed:
        raise SubtaskError("negative", f"{job.id}: verify failed ({verify.command} -> exit {verify.exit_code}): not merging it",
                           hint=f"git subtask result {job.id}   (merge anyway: git subtask merge --force {job.id})")
    if verify is not None and head != verify.head:
        raise SubtaskError("negative", f"{job.id}: its branch moved to {head[:7]} after verify tested {verify.head[:7]}: "
                           "the merged tree would be untested",
                           hint=f"git subtask diff {job.id}   (merge anyway: git subtask merge --force {job.id})")


def _check_into(repo: Repo, job: Job, workdir: Path) -> str:
    if repo.git.head_is_unborn:
        raise SubtaskError("fatal", "the current branch has no commits yet")
    if repo.git.head_is_detached:
        # A merge into a detached HEAD is kept by no branch, yet the job's branch would be deleted
        # as landed: after `git switch main` the work would hang on the pin alone.
        configured = repo.config.get("landTarget")
        fix = f"git switch {configured}" if configured else "git switch <branch>  (e.g. git switch main)"
        raise SubtaskError("fatal", f"HEAD is detached at {str(repo.git.head.target)[:7]}: "
                           f"not merging {job.id} into a commit no branch keeps",
                           hint=f"{fix}, then: git subtask merge {job.id}")
    name = repo.git.head.shorthand
    if name == job.spec.branch:
        raise SubtaskError("usage", f"the current branch is the job's own branch {name}",
                           hint="check out the branch to merge into, e.g. git switch main")
    return name


def check_clean(workdir: Path) -> None:
    # Tracked changes only: git itself refuses (changing nothing) when an untracked file would be overwritten.
    status = git(workdir, "status", "--porcelain", "--untracked-files=no").stdout
    if status.strip():
        files = [line[3:] for line in status.splitlines()][:10]
        raise SubtaskError("dirty", f"the worktree {workdir} has uncommitted changes ({', '.join(files)}): "
                           "not merging into it (your work is never stashed)",
                           hint="commit or stash them yourself, then merge again",
                           exit_code=EXIT_FATAL)


SUBTASK_ID = "Subtask-Id: "  # the trailer that names the job in a landing's commit message


def merge_message(repo: Repo, job: Job, head: str, mode: str) -> str:
    from subtask.words import task_title

    if mode == "squash":
        return _squash_message(repo, job, head)
    return f"Merge subtask {job.id}: {task_title(job.spec.task, 60)}\n\n{SUBTASK_ID}{job.id}\n"


def _squash_message(repo: Repo, job: Job, head: str) -> str:
    """One commit's message stays its own; several are named by the job's summary (else its task)
    and listed, oldest first, so the squash says what it holds."""
    from subtask.words import task_title

    commits = _commits_since_base(repo, work_base(job), head)
    trailer = f"Squashed from subtask {job.id}.\n\n{SUBTASK_ID}{job.id}\n"
    if len(commits) == 1:
        subject, _, body = commits[0].message.strip().partition("\n")
        # The worker's own commit carries the trailer already: said once, in the trailer above.
        body = "\n".join(line for line in body.splitlines() if line.strip() != f"{SUBTASK_ID}{job.id}").strip()
        return f"{subject.strip()}\n\n" + (f"{body}\n\n" if body else "") + trailer
    summary = (job.summary or "").strip()
    title = task_title(summary, 72) if summary else task_title(job.spec.task, 60)
    listed = "\n".join(f"- {c.message.strip().splitlines()[0] if c.message.strip() else str(c.id)[:7]}"
                        for c in commits)
    return f"{title}\n\n" + (f"{listed}\n\n" if listed else "") + trailer


def _commits_since_base(repo: Repo, base: str, head: str) -> list[pygit2.Commit]:
    import pygit2

    walker = repo.git.walk(head, pygit2.enums.SortMode.TOPOLOGICAL | pygit2.enums.SortMode.REVERSE)
    walker.hide(base)
    return [c for c in walker if len(c.parents) <= 1]  # merges inside the job say nothing of their own


def _abort(workdir: Path, job: Job, mode: str, into: str, proc, before: str) -> None:
    conflicts = git(workdir, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split("\n")
    conflicts = [c for c in conflicts if c]
    _restore(workdir, before)
    if conflicts:
        raise SubtaskError("conflict", f"merging {job.id} into {into} conflicts in: {', '.join(conflicts)}; "
                           "the merge was aborted and nothing changed", hint=_conflict_hint(job, into))
    words = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    reason = " ".join(words[-3:]) if words else f"git merge exited {proc.returncode}"
    hint = "use --no-ff or plain merge, or rebase the job" if mode == "ff-only" else None
    raise SubtaskError("negative", f"git merge of {job.id} into {into} did not happen: {reason}", hint=hint)


def _conflict_hint(job: Job, into: str) -> str:
    """What to type after a conflict. An agent can be asked to rebase in words; a shell job's reply
    is a script, and words would run as one (and fail): it gets the commands to run by hand."""
    by_hand = f"git merge {job.spec.branch}   # then resolve, git add, git commit"
    if job.spec.engine == "shell":
        where = (f"git -C '{job.spec.worktree}' rebase {into}" if Path(job.spec.worktree).is_dir()
                 else f"git switch {job.spec.branch} && git rebase {into}")
        return f"rebase the job's branch by hand: {where}   (or merge by hand: {by_hand})"
    return (f"ask the job to rebase: git subtask reply {job.id} 'rebase onto {into} and resolve the conflicts'"
            f"   (or merge by hand: {by_hand})")


def _restore(workdir: Path, before: str) -> None:
    """Put the worktree back as it was before our merge: its tracked files were clean, so index
    and files equal `before`. Never when HEAD moved (someone else committed: keep their work)."""
    if git(workdir, "rev-parse", "HEAD", check=False).stdout.strip() == before:
        git(workdir, "reset", "--quiet", "--merge", before, check=False)


IDENTITY_RE = re.compile(r"who you are|ident|auto-detect|no (?:name|email) was given", re.IGNORECASE)


def _commit_squash(workdir: Path, job: Job, message: str, into: str, before: str) -> None:
    staged = git(workdir, "diff", "--cached", "--quiet", check=False).returncode
    if staged == 0:
        _restore(workdir, before)
        raise SubtaskError("negative", f"{job.id}: its changes are already in {into}; nothing to squash")
    proc = git(workdir, "commit", "--quiet", "--no-verify", "-F", "-", input=message, check=False)
    if proc.returncode != 0:
        _restore(workdir, before)
        words = proc.stderr.strip() or proc.stdout.strip()
        hint = ("set your identity: git config user.name ...; git config user.email ..." if IDENTITY_RE.search(words)
                else None)
        raise SubtaskError("fatal", f"could not commit the squash of {job.id} (nothing changed): {words}", hint=hint)


# ---------------------------------------------------------------- gc

_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "": 86400}


def parse_age(text: str) -> float:
    """"30d", "12h", "90m", "45s", "2w" (a bare number means days) -> seconds."""
    match = _AGE_RE.match(text or "")
    if not match:
        raise SubtaskError("usage", f"--older-than must look like 30d, 12h, 90m or 2w, not {text!r}")
    return float(match.group(1)) * _AGE_UNITS[match.group(2)]


def gc(repo: Repo, dry_run: bool = False, older_than: str = "30d") -> Sweep:
    """Land what has landed, remove clean worktrees of old finished jobs, prune, `git gc --auto`."""
    cutoff = time.time() - parse_age(older_than)
    sweep = cleanup_merged(repo, dry_run=dry_run)
    target = land_target(repo)
    for job in _old_finished(repo, cutoff):
        path = Path(job.spec.worktree)
        had_worktree = path.exists()
        removal, branch = clean_job(repo, job, target, dry_run=dry_run)
        branch_goes = branch.kind == "removed"
        if removal.kind == "removed":
            sweep.removed[job.id] = str(path)
            sweep.lines.append(f"{job.id}: {'would remove' if dry_run else 'removed'} worktree {path}"
                               + ("" if branch_goes else " (branch kept)"))
        elif removal.kind == "pruned":
            sweep.lines.append(f"{job.id}: {'would forget' if dry_run else 'forgot'} git's registration of its "
                               f"worktree {path} ({removal.why})")
        elif removal.kind == "missing":
            if had_worktree:
                sweep.lines.append(f"{job.id}: worktree already removed")
        else:
            sweep.kept.append(job.id)
            sweep.lines.append(f"{job.id}: kept worktree: {removal.why}")
        line = branch_line(job, branch, dry_run) if removal.kind != "busy" else None
        if line:
            sweep.lines.append(line)
    pruned = git(repo.root, "worktree", "prune", "--verbose", *(["--dry-run"] if dry_run else []), check=False)
    sweep.lines += [line for line in (pruned.stdout + pruned.stderr).splitlines() if line.strip()]
    if not dry_run:
        git(repo.root, "gc", "--auto", "--quiet", check=False)
    return sweep


def _old_finished(repo: Repo, cutoff: float) -> list[Job]:
    """This clone's jobs that ended before `cutoff` and still have a worktree or an empty branch."""
    jobs = []
    tips = _job_ref_tips(repo)
    owned = ownership.owned_keys(repo)
    for entry in records.list_entries(repo):
        if entry.get("state") not in ("done", "failed", "stopped") or (entry.get("ended") or entry.get("created") or 0) > cutoff:
            continue
        if entry["id"] not in owned:
            continue  # a teammate's record: nothing it names is this clone's to remove
        branch_at_base = tips.get(f"refs/heads/{records.branch_name(entry['id'])}") == entry.get("base")
        try:
            job = records.read_commit(repo, entry["tip"], entry["id"])
        except records.DamagedRecord as exc:  # left for the user to inspect; the rest are collected
            warnings.warn(f"{exc.message}; gc leaves it alone", stacklevel=2)
            continue
        if ownership.owns(repo, job, owned) and (Path(job.spec.worktree).exists() or branch_at_base):
            jobs.append(job)
    return jobs
