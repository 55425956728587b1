"""Landed?: the land target, and whether a job's work is in it by any route.

A finished job has *landed* when its head is reachable from the land target (the current branch,
or `git config subtask.landTarget`), or when its work is already upstream as patches: the job's
combined diff has the patch-id of an upstream commit (squash merge), or every non-merge commit of
base..head has the patch-id of one (rebase merge, cherry-pick). Patch-ids come from libgit2
(`Diff.patchid`, the same value as `git patch-id --stable`) and are cached by commit id, since a
commit's patch-id never changes. `merge` (merge.py), the landed sweep and cleanup (cleanup.py)
and `land` read it.

Invariants:
- Never delete a branch but `subtask/<id>` of a job this clone owns, and only where it points
  where the record leaves the job (its head, or its base for no commit), because a pulled record
  named `release` and `main` and `gc` deleted them (`landed.why_not_deletable`, every deleting
  path: gc, cleanup, cleanup --merged, the sweep, the hook, a group's superseded members).
"""

from __future__ import annotations

import json

from subtask.git import ownership, records
from subtask.git.gitrepo import Repo
from subtask.git.records import Job
from subtask.model.dataclass import dataclass
from subtask.model.errors import SubtaskError
from subtask.state import paths
from subtask.state.statefiles import write_json

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    import pygit2


PATCH_ID_CACHE = paths.PATCH_ID_CACHE
# Upstream commits examined per sweep: bounds the first sweep of an old repository; jobs whose
# base is further back than this are still found when merged (reachability), not when squashed.
MAX_UPSTREAM_COMMITS = 5000
# First-parent steps walked to name the merge commit that brought a job in.
MAX_FIRST_PARENT_STEPS = 1000


@dataclass
class Target:
    """The land target as `land_target` finds it, and the commit it is at."""

    name: str  # branch name, or the commit id when HEAD is detached
    sha: str



# ---------------------------------------------------------------- the land target

def land_target(repo: Repo) -> Target | None:
    """`subtask.landTarget`, else the current branch (a job branch or detached HEAD defers to the main
    worktree). Through `Repo.objects` and `git symbolic-ref`: `cleanup` never loads pygit2 for it."""
    configured = repo.config.get("landTarget")
    if configured:
        commit = repo.objects.commit_of(configured) if not configured.startswith("-") else None
        if commit is None:
            raise SubtaskError("fatal", f"git config subtask.landTarget names no commit: {configured!r}",
                               hint="git config subtask.landTarget main")
        return Target(configured, commit)
    for main in (False, True):
        target = _branch_target(repo, main)
        if target is not None:
            return target
    # Detached (or unborn) everywhere: no branch keeps anything, so nothing counts as landed; a
    # job checked out detached for a look must not have its branch deleted by the sweep.
    return None


def _branch_target(repo: Repo, main: bool) -> Target | None:
    """The branch HEAD names (this worktree's, or with `main` the main one's), unless HEAD is
    detached, the branch unborn, or it is a job's."""
    name = repo.head_ref(main) or ""
    # A job branch is never a target: a job based on another would make it look landed.
    if not name.startswith("refs/heads/") or name.startswith("refs/heads/subtask/"):
        return None
    ref = repo.objects.ref(name)
    return Target(name[len("refs/heads/"):], ref.target) if ref is not None and ref.target else None


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
        oids: list[pygit2.Oid | str] = [pygit2.Oid(hex=b) for b in dict.fromkeys(bases)]
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
    import pygit2

    current = repo.git[target].peel(pygit2.Commit)
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
        ref = repo.objects.ref(name)
        if ref is not None:
            return ref.target
    pin = repo.objects.ref(records.pin_ref(job.id, "head"))
    if pin is not None:
        return pin.target
    return job.evidence.head if job.evidence else job.spec.base
