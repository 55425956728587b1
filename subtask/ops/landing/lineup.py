"""What `land` (land.py) takes and answers: its options, the jobs asked for (resolved and gated),
each job's outcome, the target branch (found, read, and moved by compare-and-swap, its checkout as
`merge` moves it). Invariants: land.py's docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from subtask.git import records
from subtask.git.gitrepo import Repo, git
from subtask.git.records import Job
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.model.job import Landing, VerifyResult, is_group_ref
from subtask.ops.landing import (
    merge,
)
from subtask.ops.plans import groups
from subtask.state import liveness

MAX_REBUILDS = 5  # a target that moved under this many landings in a row stops the job
RUN_LOCK_WAIT = 3.0



# A reconciliation: (job id, message) -> the job once that reply has ended (`api` hands it down).
Replier = Callable[[str, str], Job]



# What the window is doing, for a live line (`render.land_progress`): see `Queue.progress`.
Progress = Callable[[dict], None]



@dataclass
class Options:
    """The options of one `land`, as `git subtask land` takes them."""

    mode: str = "merge"
    verify: str | None = None  # run on every integrated commit instead of each job's own
    atomic: bool = False
    reconcile: bool = False
    force: bool = False
    window: int | None = None  # integrated states verified at once (None: `subtask.land.window`)
    batch: int | None = None  # jobs per batch (None: no batches; 0: `subtask.land.batch`)
    reuse: bool | None = None  # reuse known verify results (None: `subtask.verify.reuse`)
    first: list[str] = field(default_factory=list)  # put at the head of the queue (the hotfix lane)
    progress: Progress | None = None



@dataclass
class Target:
    """The branch `land` moves, and the worktree that has it checked out (`find_target`)."""

    name: str  # the branch
    checkout: Path | None = None  # the worktree that has it checked out
    git_dir: Path | None = None  # that worktree's own git dir

    @property
    def ref(self) -> str:
        return f"refs/heads/{self.name}"



@dataclass
class Outcome:
    """What became of one job of the queue."""

    job: str
    group: str | None = None
    # landed | already (the target had it) | conflict | failed | refused | stopped | not reached
    # | passed (--atomic: built and verified, then not landed because another job broke the queue)
    state: str = "not reached"
    onto: str | None = None
    commit: str | None = None
    how: str = ""
    verify: VerifyResult | None = None
    confined: bool = True
    conflicts: list[str] = field(default_factory=list)
    sides: dict[str, list[str]] = field(default_factory=dict)
    why: str = ""
    events: list[str] = field(default_factory=list)  # what happened on the way: rebuilds, a reconciliation
    lines: list[str] = field(default_factory=list)  # what followed its landing: the cleanup
    batch: str | None = None  # the tree of the batch state whose verify covers it (--batch)

    @property
    def ok(self) -> bool:
        return self.state in ("landed", "already")

    def to_dict(self) -> dict:
        return {"v": 1, "id": self.job, "group": self.group, "state": self.state, "onto": self.onto,
                "commit": self.commit, "how": self.how, "verify": self.verify.to_dict() if self.verify else None,
                "confined": self.confined, "conflicts": self.conflicts, "sides": self.sides, "why": self.why,
                "events": self.events, "lines": self.lines, "batch": self.batch}

    @classmethod
    def from_dict(cls, data: dict) -> Outcome:
        """An outcome another queue answered (`landfirst`): read as input, what does not fit left out."""
        def text(key: str, default: str = "") -> str:
            value = data.get(key)
            return value if isinstance(value, str) else default

        def texts(key: str) -> list[str]:
            value = data.get(key)
            return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []

        verify = data.get("verify")
        sides = data.get("sides")
        if not isinstance(sides, dict):
            sides = {}
        return cls(text("id", "?"), data.get("group") if isinstance(data.get("group"), str) else None,
                   text("state", "not reached"), text("onto") or None, text("commit") or None, text("how"),
                   VerifyResult.from_dict(verify) if isinstance(verify, dict) else None,
                   data.get("confined") is not False, texts("conflicts"),
                   {k: [x for x in v if isinstance(x, str)] for k, v in sides.items() if isinstance(v, list)},
                   text("why"), texts("events"), texts("lines"), text("batch") or None)



@dataclass
class LandResult:
    """What one `land` answers: each job's outcome and how the queue went."""

    target: str
    before: str
    after: str
    mode: str
    atomic: bool
    outcomes: list[Outcome]
    stopped: str = ""  # why the queue stopped before its end
    window: int = 1  # integrated states verified at once
    batch: int | None = None  # jobs per batch (None: every state verified)
    runs: int = 0  # verifies run
    reused: int = 0  # verifies answered by a known result
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    def to_dict(self) -> dict:
        return {"v": 1, "target": self.target, "before": self.before, "after": self.after, "mode": self.mode,
                "atomic": self.atomic, "ok": self.ok, "stopped": self.stopped, "window": self.window,
                "batch": self.batch, "runs": self.runs, "reused": self.reused, "seconds": self.seconds,
                "jobs": [o.to_dict() for o in self.outcomes]}



@dataclass
class Item:
    """One job of the queue while it lands."""

    asked: str
    job: Job
    group: groups.Group | None = None
    head: str = ""
    trust: merge.Trust | None = None
    command: str | None = None
    timeout: float = 600.0
    fd: int | None = None
    entry: Landing | None = None  # its latest build's landing, until recorded
    checked: tuple[tuple, list[dict]] | None = None  # its checks' results, and on what (`Queue.checks_of`)
    handed: str | None = None  # taken from `land --first` of another process: the target's tip then



class Stop(SubtaskError):
    """The queue cannot go on (the checkout got uncommitted changes, git refused to update it)."""



def find_target(repo: Repo) -> Target:
    """`subtask.landTarget`, else the current branch; a branch, never a job's, never a detached HEAD."""
    configured = (repo.config.get("landTarget") or "").strip()
    if configured:
        name = configured.removeprefix("refs/heads/")
        if repo.objects.ref(f"refs/heads/{name}") is None:
            raise SubtaskError("fatal", f"git config subtask.landTarget names no local branch: {configured!r}",
                               hint="git config subtask.landTarget main")
    else:
        name = repo.head_branch() or ""
        if not name:
            raise SubtaskError("fatal", "HEAD is detached: land moves a branch, and none is "
                               "checked out here",
                               hint="git switch main   (or: git config subtask.landTarget main)")
        if repo.objects.ref(f"refs/heads/{name}") is None:
            raise SubtaskError("fatal", f"the current branch {name} has no commits yet")
    if name.startswith("subtask/"):
        raise SubtaskError("usage", f"{name} is a job's branch: never a land target",
                           hint="git switch main   (or: git config subtask.landTarget main)")
    return Target(name, *_checkout_of(repo, f"refs/heads/{name}"))



def _checkout_of(repo: Repo, ref: str) -> tuple[Path | None, Path | None]:
    """The worktree that has `ref` checked out, and its git dir; (None, None) when none has."""
    out = git(repo.root, "worktree", "list", "--porcelain", check=False).stdout
    path = None
    for line in out.splitlines():
        if line.startswith("worktree "):
            path = Path(line[len("worktree "):])
        elif line == f"branch {ref}" and path is not None and path.is_dir():
            git_dir = git(path, "rev-parse", "--absolute-git-dir").stdout.strip()
            return path, Path(git_dir)
    return None, None



def tip(repo: Repo, target: Target) -> str:
    ref = repo.objects.ref(target.ref)
    if ref is None:
        raise SubtaskError("fatal", f"the branch {target.name} is gone")
    return ref.target



def move(repo: Repo, target: Target, old: str, new: str) -> str:
    """Move the target from `old` to `new`: "ok", or "moved" when it is no longer at `old`.

    Where the target is checked out, `git merge --ff-only` in that worktree moves the branch, the
    index and the files in one git run, under the worktree's `index_lock`, after the same checks
    as `merge` (no uncommitted changes; HEAD still at `old`), and with the target still the branch
    checked out there (a `Stop` if not: `merge --ff-only` moves whatever branch is checked out);
    else one compare-and-swap of the ref.
    """
    message = f"git-subtask land: {old[:7]} -> {new[:7]}"
    if target.checkout is None:
        return "ok" if records.cas_ref(repo, target.ref, old, new, message) else "moved"
    with merge.index_lock(repo, target.checkout, target.git_dir):
        branch, head, changed = _checkout_state(target.checkout)
        if branch != target.name:  # `git merge --ff-only` there would move that branch, not ours
            raise Stop("negative", f"the worktree {target.checkout} has {_words(branch)} checked out, not "
                                   f"{target.name}: the queue stopped before moving {target.name}",
                       hint=f"git switch {target.name} there, then land the rest again")
        if changed:
            raise Stop("dirty", f"the worktree {target.checkout} has uncommitted changes ({', '.join(changed[:10])}): "
                                f"the queue stopped before moving {target.name} (your work is never stashed)",
                       hint="commit or stash them yourself, then land the rest again")
        if head != old:
            return "moved"
        proc = git(target.checkout, "merge", "--ff-only", "--quiet", new, check=False)
        if proc.returncode == 0:
            return "ok"
        branch, head, _ = _checkout_state(target.checkout)
        if branch != target.name or head != old:
            return "moved"
        words = " ".join((proc.stderr.strip() or proc.stdout.strip()).splitlines()[-3:])
        raise Stop("negative", f"git would not move {target.name} in {target.checkout}: {words}: the queue stopped "
                               "(nothing of this landing changed)")



def _checkout_state(checkout: Path) -> tuple[str, str, list[str]]:
    """The checkout's branch (`(detached)` for a detached HEAD), its HEAD commit and its
    uncommitted changes to tracked files (`merge`'s rule: never merged into; untracked files are
    git's to refuse), from one `git status`."""
    out = git(checkout, "status", "--porcelain=v2", "--branch", "--untracked-files=no").stdout
    branch, head, changed = "", "", []
    for line in out.splitlines():
        if line.startswith("# branch.head "):
            branch = line[len("# branch.head "):]
        elif line.startswith("# branch.oid "):
            head = line[len("# branch.oid "):]
        elif line and not line.startswith("#"):
            changed.append(line.split(" ")[-1] if line[0] in "12u" else line)
    return branch, head, changed



def _words(branch: str) -> str:
    return "a detached HEAD" if branch in ("", "(detached)") else branch



def resolve(repo: Repo, asked: list[str]) -> list[Item]:
    """The queue's jobs in order (a group stands for its pick); bad input changes nothing."""
    if not asked:
        raise SubtaskError("usage", "land needs at least one job id (or best-of group id)")
    items, seen = [], set()
    for text in asked:
        group = None
        if is_group_ref(text):
            group = groups.read(repo, groups.resolve(repo, text))[0]
            job_id = group.pick or group.members[0]
        else:
            job_id = records.resolve(repo, text)
        if job_id in seen:
            raise SubtaskError("usage", f"{text} is named twice in the queue")
        seen.add(job_id)
        items.append(Item(text, records.read(repo, job_id), group))
    return items



def gate(repo: Repo, item: Item, opts: Options) -> None:
    """Take the job's run-lock and check it may land (`check`); a `SubtaskError` says why not."""
    if item.group is not None:
        item.group, pick = groups.picked_with_pick(repo, item.group.id)
        item.job = records.read(repo, pick)
    item.job = records.read(repo, item.job.id)
    check(repo, item, opts)  # a job still running is refused at once, not after waiting for its lock
    item.fd = liveness.acquire_within(repo.state_dir, item.job.id, RUN_LOCK_WAIT)
    try:
        item.job = records.read(repo, item.job.id)
        check(repo, item, opts)  # the record as it is now that no reply can start
    except BaseException:
        liveness.release(item.fd)
        item.fd = None
        raise



def check(repo: Repo, item: Item, opts: Options) -> None:
    """`merge`'s gate (done, verified on its head unless its record cannot be taken at its word,
    commits to land), and a command to run on the integrated commit unless `force`."""
    job = item.job
    item.trust = merge.trust_of(repo, job)
    item.head = merge.check_mergeable(repo, job, opts.force, item.trust.claims)
    item.command = opts.verify or job.spec.verify
    item.timeout = job.spec.verify_timeout if not opts.verify else repo.config.number("verifyTimeout")
    if not item.command and not opts.force:
        raise SubtaskError("negative", f"{job.id}: nothing to run on the integrated commit (it was started "
                           "without --verify)", hint=f"git subtask land --verify 'make test' {job.id}   "
                                                      f"(land it unverified: --force)")
