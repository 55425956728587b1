"""Cleaning up after landed jobs: the landed sweep, `cleanup --merged`, gc, one job's worktree and
branch removed. Whether a job landed is landed.py's.

Invariants:
- Never delete a job branch unless its tip was found landed, and delete it by compare-and-swap on
  that exact tip, because a commit added meanwhile must survive: nothing unmerged is ever deleted.
- Never remove a worktree that is dirty, has untracked files, or whose HEAD no branch, pin or target
  keeps, because it holds the only copy of work; `git worktree remove` without `--force` re-checks
  cleanliness itself.
- Never land or clean up a job this clone does not own (`ownership.owns`, never `spec.repo`, a path
  any record can name), because updating a teammate's record makes the records diverge, and
  nothing it names is ours to remove.
- Records stay: landing, cleanup and gc only add facts (landed_in, worktree_removed,
  branch_deleted) to them.
- Never remove a worktree or delete a branch without holding the job's run-lock and re-reading its
  record under it (`cleanup.quiet_job`), because a reply may have started (its worker holds the
  lock), be queued (a non-terminal attempt), or have added commits since the job was listed.
- Never take a record's `spec.worktree` (or `spec.repo`) as the right to remove a path, because a
  pulled record can name anything; remove only a worktree under `subtask.worktreeDir` whose admin
  folder holds this job's marker (`worktrees.created_here`), written by this clone's worker; and
  never start a reply whose recorded worktree is not `<worktreeDir>/<id>` or is marked for another
  job (`worktrees.check_runnable`), because its engine would run in someone else's checkout.
- Never delete a job branch that has commits beyond its base unless it landed; one with none
  only under the job's run-lock, because a reply or a commit made meanwhile must keep it:
  `cleanup ID` and `gc` delete one with none (a stopped or failed job that made no commit) under
  the job's run-lock (`quiet_job`), never while a worktree has it checked out, and by
  compare-and-swap on the empty tip they saw. The record and pins stay, and a `reply` recreates
  the branch at the job's head (`landed.job_head`).
- Never force `git worktree remove` for a job whose engine never ran but over what git's own
  checkout stopped half-way leaves (`cleanup.checkout_leftovers`: tracked files missing and, while
  there is no index, files byte for byte the commit's at their path), because a job that failed at
  its setup has a whole checkout a person may have worked in: cleanup and gc removed their edits
  with `--force` (`crashes::test_a_person_s_edits_in_the_worktree_of_a_job_whose_engine_never_ran_are_kept`).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from subtask.git import notes, ownership, pool, records, worktrees
from subtask.git.gitrepo import Repo, git
from subtask.git.records import Job
from subtask.model import faults, lazyre
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.model.job import work_base
from subtask.ops.landing import overlay
from subtask.ops.landing.landed import (
    PatchIds,
    Target,
    Upstream,
    branch_ref,
    job_head,
    land_target,
    landed_in,
    why_not_deletable,
)
from subtask.state import liveness, paths, stamps

SWEEP_STAMP = paths.SWEEP_STAMP


@dataclass
class Sweep:
    """What a cleanup/gc pass did (or would do, on a dry run), one line per action."""

    lines: list[str] = field(default_factory=list)
    landed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    removed: dict[str, str] = field(default_factory=dict)  # job id -> the worktree removed (or that would be)



# ---------------------------------------------------------------- cleaning one job

def worktree_removable(repo: Repo, job: Job, keepers: list[str]) -> tuple[bool, str, str]:
    """(True, "", its HEAD's commit) when the job's worktree can go without losing anything; else
    (False, why, "").

    Call it under the job's run-lock (`quiet_job`), so no worker starts in it meanwhile.
    """
    path = Path(job.spec.worktree)
    if not path.exists():
        return False, "no worktree", ""
    if not worktrees.created_here(repo, job.id, path):
        return False, worktrees.why_not_ours(repo, job.id, path), ""
    if not ownership.owns(repo, job):
        return False, "the job is another clone's (a pulled record is a claim, not this clone's to clean up)", ""
    try:
        admin = worktrees.check_metadata(repo, job.id, path, job.spec.branch, job.spec.base, head=False)
    except worktrees.MetadataChanged as exc:
        return False, f"its git metadata is not what git-subtask wrote ({exc}): left for you to inspect", ""
    status = worktrees.job_git(repo, admin, path, "status", "--porcelain", "--untracked-files=normal",
                               "--ignore-submodules=none", check=False)
    if status.returncode != 0:
        return False, f"worktree {path} is not a readable git worktree", ""
    if status.stdout.strip() and not checkout_leftovers(repo, job):
        return False, f"worktree {path} has uncommitted changes or untracked files", ""
    proc = worktrees.job_git(repo, admin, path, "rev-parse", "--verify", "HEAD^{commit}", check=False)
    head = proc.stdout.strip()
    if proc.returncode != 0 or not head:
        return False, f"worktree {path} is not a readable git worktree", ""
    if not any(repo.objects.is_ancestor(head, k) for k in keepers if k):
        return False, f"worktree {path} has commits ({head[:7]}) that no branch keeps", ""
    return True, "", head


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
    moved_from = worktrees.pending_checkout(admin)
    if moved_from is not None:
        # A pooled worktree taken and not yet moved to HEAD (`pool.take`): every file that reads
        # as changed is the pooled commit's or HEAD's, or missing, as the move leaves them.
        present = [line[3:] for line in lines if line[:2] != " D"]
        return _as_committed(repo, admin, path, present, quiet, ("HEAD", moved_from))
    written = [line[3:] for line in lines if line[:2] == "??"]
    if any(line[:2] not in _MISSING and line[:2] != "??" for line in lines):
        return False
    return not written or (not (admin / "index").exists() and _as_committed(repo, admin, path, written, quiet))


def _as_committed(repo: Repo, admin: Path, path: Path, names: list[str], env: dict,
                  commits: tuple[str, ...] = ("HEAD",)) -> bool:
    """Is each of these files (as git's status names them) a regular file whose bytes are the
    blob one of `commits` holds at its path? No filter runs: a file a filter would have changed
    reads as different, and is kept."""
    if not names:
        return True
    if any(name.startswith('"') for name in names):
        return False  # a name git quoted: not one to compare byte for byte
    if any((path / name).is_symlink() or not (path / name).is_file() for name in names):
        return False
    hashed = worktrees.job_git(repo, admin, path, "hash-object", "--no-filters", "--stdin-paths",
                               input="".join(f"{name}\n" for name in names), env=env, check=False)
    if hashed.returncode != 0:
        return False
    blobs: dict[str, set[str]] = {}
    for commit in commits:
        tree = worktrees.job_git(repo, admin, path, "ls-tree", "-r", "-z", commit, env=env, check=False)
        if tree.returncode != 0:
            return False
        for entry in tree.stdout.split("\0"):
            meta, _, name = entry.partition("\t")
            fields = meta.split()
            if len(fields) == 3 and fields[0] in ("100644", "100755"):
                blobs.setdefault(name, set()).add(fields[2])
    shas = hashed.stdout.split()
    return len(shas) == len(names) and all(sha in blobs.get(name, ()) for name, sha in zip(names, shas, strict=True))


def remove_worktree(repo: Repo, job: Job, head: str, *, record: bool = True) -> bool:
    """`git worktree remove`, never forced but over what git's own checkout of a job whose engine
    never ran left (`checkout_leftovers`: stopped half-way, it reads as every file deleted); say
    so in the record. Its own status of the worktree runs with fsmonitor off: `worktree_removable`
    checked the admin folder git reads, not the config of what it names."""
    overlay.restore_left(repo, job.id)  # a killed verify's moved files go back before the worktree goes
    force = ["--force"] if checkout_leftovers(repo, job) else []
    pooled = touched = False
    if not force:  # a clean, whole worktree: the next job's, when the pool has room (`pool.give_back`)
        pooled, touched = pool.give_back(repo, job.id, Path(job.spec.worktree), job.spec.branch, job.spec.base, head)
    if touched and not pooled:
        force = ["--force"]  # its index was rebuilt from HEAD: clean as the caller saw it, but git cannot tell
    removed = pooled or git(repo.root, "-c", "core.fsmonitor=false", "worktree", "remove", *force,
                            job.spec.worktree, check=False).returncode == 0
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
    """What became of one worktree or branch a cleanup set out to remove."""

    # "removed" (or would be, on a dry run), "pruned" (a stale registration), "missing", "busy", "kept", "failed"
    kind: str
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
        branch = Removal("missing")
        try:
            if branches:
                branch = _remove_empty_branch_locked(repo, fresh, dry_run, worktree_goes=tree.kind == "removed")
        finally:  # what was removed is recorded, even when the branch's step failed
            if not dry_run:
                _record_removals(repo, fresh.id, worktree=tree.kind == "removed", branch=branch.kind == "removed")
        return tree, branch


def _record_removals(repo: Repo, job_id: str, *, worktree: bool, branch: bool) -> None:
    """What cleanup removed, in one record write (two git processes without pygit2: read, ref update)."""
    if not (worktree or branch):
        return

    def change(j: Job) -> bool:
        before = (j.state.worktree_removed, j.state.branch_deleted)
        j.state.worktree_removed = j.state.worktree_removed or worktree
        j.state.branch_deleted = j.state.branch_deleted or branch
        return (j.state.worktree_removed, j.state.branch_deleted) != before

    records.update(repo, job_id, change)


def _remove_worktree_locked(repo: Repo, job: Job, target: Target | None, dry_run: bool) -> Removal:
    path = Path(job.spec.worktree)
    if not path.exists():
        if ownership.owns(repo, job) and worktrees.stale_admin(repo, job.id, path) is not None:
            # Removed by hand: git still lists it (prunable) until its registration goes too.
            if not dry_run:
                worktrees.drop_stale(repo, job.id, path)
            return Removal("pruned", "its folder was removed by hand")
        return Removal("missing", "no worktree")  # e.g. a concurrent gc removed it: fine
    ok, why, head = worktree_removable(repo, job, keepers(repo, job, target))
    if not ok:
        return Removal("kept", why)
    if dry_run:
        return Removal("removed")
    if not remove_worktree(repo, job, head, record=False):  # recorded with the branch's removal (`clean_job`)
        return Removal("failed", f"git worktree remove {job.spec.worktree} failed")
    return Removal("removed")


def empty_branch_tip(repo: Repo, job: Job) -> str | None:
    """The tip of the job's branch when it is at its base (no commit beyond it)."""
    name = branch_ref(job)
    ref = repo.objects.ref(name) if name else None
    if ref is None:
        return None
    return ref.target if ref.target == job.spec.base else None


def _remove_empty_branch_locked(repo: Repo, job: Job, dry_run: bool, *, worktree_goes: bool) -> Removal:
    """Under the job's run-lock: delete its branch by compare-and-swap on the exact empty tip seen,
    so a commit made meanwhile (by hand, in another worktree) keeps it."""
    branch = job.spec.branch
    name = branch_ref(job)
    if name is None or repo.objects.ref(name) is None:
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
    return Removal("removed")  # recorded by the caller, with the worktree's removal


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
    pin = repo.objects.ref(records.pin_ref(job.id, "head"))
    if pin is not None:
        keep.append(pin.target)
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
        ok, why, worktree_head = worktree_removable(repo, job, keepers(repo, job, target))
        if ok:
            lines.append(f"{job.id}: {'would remove' if dry_run else 'removed'} worktree {path}")
            if not dry_run:
                removed = remove_worktree(repo, job, worktree_head, record=False)  # recorded with the landing below
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
        if not stamps.due(repo.state_dir, SWEEP_STAMP, repo.config.number("sweepInterval")):
            return False
        stamps.stamp(repo.state_dir, SWEEP_STAMP)  # first, so concurrent commands skip
        return bool(cleanup_merged(repo, entries=entries).landed)
    except Exception:
        return False


# ---------------------------------------------------------------- gc

_AGE_RE = lazyre.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "": 86400}


def parse_age(text: str) -> float:
    """"30d", "12h", "90m", "45s", "2w" (a bare number means days) -> seconds."""
    match = _AGE_RE.match(text or "")
    if not match:
        raise SubtaskError("usage", f"--older-than must look like 30d, 12h, 90m or 2w, not {text!r}")
    return float(match.group(1)) * _AGE_UNITS[match.group(2)]


def gc(repo: Repo, dry_run: bool = False, older_than: str = "30d") -> Sweep:
    """Land what has landed, remove clean worktrees of old finished jobs, empty the worktree pool,
    prune, `git gc --auto`."""
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
    sweep.lines += pool.empty(repo, dry_run)  # gc leaves no spare worktree: the next job's start refills
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
        if entry.get("state") not in ("done", "failed", "stopped") \
                or (entry.get("ended") or entry.get("created") or 0) > cutoff:
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
