"""`git subtask land`: many finished jobs landed in order, each verified on the commit that lands.

For each job in turn: integrate it onto the target's current tip in a scratch worktree
(`integrate.py`), run verify there on the integrated commit, record that result in the job's
record and note (this clone's jobs only), and only then move the target, by compare-and-swap
against the tip it was built on. A person committing meanwhile makes the landing rebuild on
their commit. The target's checkout, where it has one, is moved as `merge` moves it: under
`landing.index_lock`, never when it has uncommitted changes, by `git merge --ff-only` (one git
run moves the branch, the index and the files). With `atomic` the target moves once, to the
last integrated commit, only if every job integrated and passed. `reconcile` answers a conflict
with a reply to the job (its worktree moved onto the new tip; a shell job's task run again) and
lands it once that reply passed its verify.

Invariants:
- Never move the target but from the tip the landing was built on (compare-and-swap), because a
  commit made meanwhile by a person must stay: the landing is built again on top of it.
- Never record a landing on a teammate's record (`ownership`): its verify runs here on the
  integrated commit all the same (that is the re-run `merge` would do), and is reported only.
- Never land a job with nothing to run on the integrated commit unless `force`, because landing
  many is only worth more than merging them one by one if what lands is what was tested.
- A kill at any step leaves the target before or after a whole landing: the integrated commit
  is built and verified off to the side, and the move is one ref update (or one `git merge
  --ff-only` in the checkout). What is recorded before the move (the verify) stays true after
  it; a landing whose record was not written is found by `cleanup --merged` (reachable, or
  patch-equivalent).

Lock order: `land.lock` (one queue per repository), then a job's run-lock (held while it lands,
so no reply starts meanwhile; let go while a reconciliation reply runs), then the target
checkout's `index_lock` (only around the move).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from subtask import (
    faults,
    groups,
    integrate,
    landing,
    liveness,
    notes,
    records,
    reverify,
    worktrees,
)
from subtask.errors import SubtaskError
from subtask.gitrepo import Repo, git
from subtask.model import Landing, VerifyResult, is_group_ref, now
from subtask.records import Job
from subtask.redact import redact
from subtask.statefiles import LockTimeout, file_lock

SCRATCH = ".land"
KEEP_LANDINGS = 10  # landings kept per record, latest last
MAX_REBUILDS = 5  # a target that moved under this many landings in a row stops the job
RUN_LOCK_WAIT = 3.0
QUEUE_LOCK_WAIT = 10.0

# A reconciliation: (job id, message) -> the job once that reply has ended (`api` hands it down).
Replier = Callable[[str, str], Job]


@dataclass
class Options:
    mode: str = "merge"
    verify: str | None = None  # run on every integrated commit instead of each job's own
    atomic: bool = False
    reconcile: bool = False
    force: bool = False


@dataclass
class Target:
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

    @property
    def ok(self) -> bool:
        return self.state in ("landed", "already")

    def to_dict(self) -> dict:
        return {"v": 1, "id": self.job, "group": self.group, "state": self.state, "onto": self.onto,
                "commit": self.commit, "how": self.how, "verify": self.verify.to_dict() if self.verify else None,
                "confined": self.confined, "conflicts": self.conflicts, "sides": self.sides, "why": self.why,
                "events": self.events, "lines": self.lines}


@dataclass
class LandResult:
    target: str
    before: str
    after: str
    mode: str
    atomic: bool
    outcomes: list[Outcome]
    stopped: str = ""  # why the queue stopped before its end

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    def text(self) -> str:
        return text(self)

    def to_dict(self) -> dict:
        return {"v": 1, "target": self.target, "before": self.before, "after": self.after, "mode": self.mode,
                "atomic": self.atomic, "ok": self.ok, "stopped": self.stopped,
                "jobs": [o.to_dict() for o in self.outcomes]}


@dataclass
class Item:
    """One job of the queue while it lands."""

    asked: str
    job: Job
    group: groups.Group | None = None
    head: str = ""
    trust: landing.Trust | None = None
    command: str | None = None
    timeout: float = 600.0
    fd: int | None = None


class Stop(SubtaskError):
    """The queue cannot go on (the checkout got uncommitted changes, git refused to update it)."""


# ---------------------------------------------------------------- the queue

def land(repo: Repo, asked: list[str], opts: Options, replier: Replier | None = None) -> LandResult:
    """Land the jobs (or best-of groups: their picks) in the order given; see the module docstring."""
    if opts.mode not in integrate.MODES:
        raise SubtaskError("usage", f"unknown land mode {opts.mode!r} ({', '.join(integrate.MODES)})")
    if opts.reconcile and replier is None:
        raise SubtaskError("usage", "--reconcile needs a way to reply to jobs (the CLI or the MCP server)")
    target = find_target(repo)
    items = resolve(repo, asked)
    if target.checkout is not None:
        landing.check_clean(target.checkout)
    with _queue_lock(repo):
        sweep_scratch(repo)
        before = tip(repo, target)
        result = LandResult(target.name, before, before, opts.mode, opts.atomic,
                            [Outcome(i.job.id, i.group.id if i.group else None) for i in items])
        try:
            (_land_atomic if opts.atomic else _land_each)(repo, target, items, result, opts, replier)
        finally:
            for item in items:
                liveness.release(item.fd)
                item.fd = None
        result.after = tip(repo, target)
    return result


def _land_each(repo: Repo, target: Target, items: list[Item], result: LandResult, opts: Options,
               replier: Replier | None) -> None:
    for item, out in zip(items, result.outcomes, strict=True):
        if result.stopped:
            break
        try:
            gate(repo, item, opts)
        except SubtaskError as exc:
            _refused(out, exc)
            continue
        try:
            _land_one(repo, target, item, out, opts, replier)
        except Stop as exc:
            out.state, out.why, result.stopped = "stopped", exc.message, exc.message
        finally:
            liveness.release(item.fd)
            item.fd = None


def _land_one(repo: Repo, target: Target, item: Item, out: Outcome, opts: Options, replier: Replier | None) -> None:
    reconciled = False
    for _ in range(MAX_REBUILDS):
        onto = tip(repo, target)
        built = _build(repo, target, item, onto, opts, out)
        if built.kind == "conflict" and opts.reconcile and not reconciled:
            reconciled = True
            if reconcile(repo, target, item, onto, built, out, opts, replier):
                continue  # the reply passed: build it again on the tip as it is now
        if built.kind == "already":
            _finish(repo, target, item, out, landing.merge_point(repo, item.head, onto), onto)
            return
        if out.state != "passed":
            return
        faults.point("land_verified")
        if move(repo, target, onto, built.commit) != "ok":
            out.events.append(f"{target.name} moved while it was built: building it again on top")
            continue
        faults.point("land_moved")
        _finish(repo, target, item, out, built.commit, built.commit)
        return
    out.state, out.why = "failed", f"{target.name} moved under each of {MAX_REBUILDS} landings in a row"


def _land_atomic(repo: Repo, target: Target, items: list[Item], result: LandResult, opts: Options,
                 replier: Replier | None) -> None:
    """Every job built on the one before, verified, then the target moved once: all or nothing."""
    for item, out in zip(items, result.outcomes, strict=True):
        try:
            gate(repo, item, opts)
        except SubtaskError as exc:
            _refused(out, exc)
            result.stopped = f"{item.job.id} was refused: nothing landed (--atomic)"
            return
    for _ in range(MAX_REBUILDS):
        start = chain = tip(repo, target)
        landed: list[tuple[Item, Outcome, str]] = []
        for n, (item, out) in enumerate(zip(items, result.outcomes, strict=True)):
            reconciled = False
            while True:
                built = _build(repo, target, item, chain, opts, out)
                if built.kind == "conflict" and opts.reconcile and not reconciled:
                    reconciled = True
                    if reconcile(repo, target, item, chain, built, out, opts, replier):
                        continue
                break
            if built.kind == "already":
                landed.append((item, out, landing.merge_point(repo, item.head, chain)))
                continue
            if out.state != "passed":
                result.stopped = f"{item.job.id} broke the queue ({out.state}): nothing landed (--atomic)"
                for _, before, _ in landed:
                    before.why = f"not landed: {item.job.id} broke the queue"
                for later in result.outcomes[n + 1:]:
                    later.state = "not reached"
                return
            chain = built.commit
            landed.append((item, out, built.commit))
        faults.point("land_verified")
        if move(repo, target, start, chain) != "ok":
            for out in result.outcomes:
                out.events.append(f"{target.name} moved while the queue was built: building it again")
            continue
        faults.point("land_moved")
        for item, out, commit in landed:
            _finish(repo, target, item, out, commit, chain)
        return
    result.stopped = f"{target.name} moved under each of {MAX_REBUILDS} builds of the queue: nothing landed"


def _refused(out: Outcome, exc: SubtaskError) -> None:
    out.state, out.why = "refused", exc.message + (f" (hint: {exc.hint})" if exc.hint else "")


# ---------------------------------------------------------------- one landing

def _build(repo: Repo, target: Target, item: Item, onto: str, opts: Options, out: Outcome) -> integrate.Built:
    """Integrate the job onto `onto` and verify the result, off to the side; say so in `out` and
    in the job's record (this clone's job)."""
    job = item.job
    out.onto, out.commit, out.verify, out.conflicts, out.sides, out.why = onto, None, None, [], {}, ""
    rerun = None
    with reverify.scratch(repo, onto, f"{SCRATCH}/{job.id}") as path:
        built = integrate.integrate(repo, path, job, item.head, onto, opts.mode)
        faults.point("land_built")
        if built.kind == "built" and item.command:
            tree = str(repo.git[built.commit].tree_id)
            rerun = reverify.run_in(repo, path, item.command, built.commit, tree=tree, timeout=item.timeout,
                                    network=job.spec.network)
            rerun.result.command = redact(item.command)  # a --verify as written never reaches a record
    out.commit, out.how = built.commit, built.how
    if built.kind == "conflict":
        out.state, out.conflicts = "conflict", built.conflicts
        out.sides = integrate.sides(repo, job, item.head, onto, built.conflicts)
    elif built.kind == "failed":
        out.state, out.why = "failed", f"git could not integrate it: {built.why}"
    elif built.kind == "already":
        out.state = "already"
    elif rerun is None:
        out.state, out.why = "passed", "nothing was run on it (--force)"
    else:
        out.verify, out.confined = rerun.result, rerun.confined
        out.state = "passed" if rerun.result.passed else "failed"
    if built.kind != "already":
        outcome = {"passed": "unverified" if rerun is None else "passed"}.get(out.state, out.state)
        _record(repo, item, Landing(at=now(), target=target.name, onto=onto, mode=opts.mode, outcome=outcome,
                                    commit=built.commit, verify=out.verify, conflicts=built.conflicts),
                note=out.state != "passed")
    return built


def _record(repo: Repo, item: Item, entry: Landing, *, note: bool) -> None:
    """The landing in the job's record (this clone's job only); its note at once when it failed
    (a passing one is noted when it lands)."""
    if not (item.trust and item.trust.owned):
        return

    def change(job: Job) -> None:
        job.state.landings = [*job.state.landings, entry][-KEEP_LANDINGS:]

    job = records.update(repo, item.job.id, change)
    item.job = job
    if note:
        notes.write_for_job(repo, job)


def _finish(repo: Repo, target: Target, item: Item, out: Outcome, commit: str, now_at: str) -> None:
    """The job landed in `commit` (the target is at `now_at`): record it, clean up after it as
    `merge` does, and land its group's pick."""
    job = item.job
    out.state = "landed" if out.state == "passed" else out.state

    def mark(j: Job) -> None:
        if j.state.landings and j.state.landings[-1].commit in (commit, out.commit):
            j.state.landings[-1].landed = True

    if item.trust and item.trust.owned:
        lines = landing.finish_landed(repo, job, item.head, commit, landing.Target(target.name, now_at), held=True,
                                      also=mark)
        out.lines += (lines or [""])[1:]
    else:
        out.lines.append(f"{job.id}: its record and branch are left as they are (another clone's job)")
    if item.group is not None:
        out.lines += groups.pick_landed(repo, item.group, commit, target.name)[1]


# ---------------------------------------------------------------- the target

def find_target(repo: Repo) -> Target:
    """`subtask.landTarget`, else the current branch; a branch, never a job's, never a detached HEAD."""
    configured = (repo.config.get("landTarget") or "").strip()
    if configured:
        name = configured.removeprefix("refs/heads/")
        if repo.objects.ref(f"refs/heads/{name}") is None:
            raise SubtaskError("fatal", f"git config subtask.landTarget names no local branch: {configured!r}",
                               hint="git config subtask.landTarget main")
    else:
        proc = git(repo.workdir() or repo.root, "symbolic-ref", "-q", "--short", "HEAD", check=False)
        name = proc.stdout.strip()
        if proc.returncode != 0 or not name:
            raise SubtaskError("negative", "HEAD is detached: land moves a branch, and none is checked out here",
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
    as `merge` (no uncommitted changes; HEAD still at `old`); else one compare-and-swap of the ref.
    """
    message = f"git-subtask land: {old[:7]} -> {new[:7]}"
    if target.checkout is None:
        return "ok" if records.cas_ref(repo, target.ref, old, new, message) else "moved"
    with landing.index_lock(repo, target.checkout, target.git_dir):
        try:
            landing.check_clean(target.checkout)
        except SubtaskError as exc:
            raise Stop("dirty", f"{exc.message.removesuffix(': not merging into it (your work is never stashed)')}: "
                                f"the queue stopped before moving {target.name}", hint=exc.hint) from None
        if git(target.checkout, "rev-parse", "HEAD").stdout.strip() != old:
            return "moved"
        proc = git(target.checkout, "merge", "--ff-only", "--quiet", new, check=False)
        if proc.returncode == 0:
            return "ok"
        if git(target.checkout, "rev-parse", "HEAD").stdout.strip() != old:
            return "moved"
        words = " ".join((proc.stderr.strip() or proc.stdout.strip()).splitlines()[-3:])
        raise Stop("negative", f"git would not move {target.name} in {target.checkout}: {words}: the queue stopped "
                               "(nothing of this landing changed)")


# ---------------------------------------------------------------- the jobs

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
        item.group = groups.picked(repo, item.group.id)
        item.job = records.read(repo, item.group.pick)
    item.fd = _take(repo, item.job.id)
    try:
        item.job = records.read(repo, item.job.id)
        check(repo, item, opts)
    except BaseException:
        liveness.release(item.fd)
        item.fd = None
        raise


def check(repo: Repo, item: Item, opts: Options) -> None:
    """`merge`'s gate (done, verified on its head unless its record cannot be taken at its word,
    commits to land), and a command to run on the integrated commit unless `force`."""
    job = item.job
    item.trust = landing.trust_of(repo, job)
    item.head = landing.check_mergeable(repo, job, opts.force, item.trust.claims)
    item.command = opts.verify or job.spec.verify
    item.timeout = job.spec.verify_timeout if not opts.verify else repo.config.number("verifyTimeout")
    if not item.command and not opts.force:
        raise SubtaskError("negative", f"{job.id}: nothing to run on the integrated commit (it was started "
                           "without --verify)", hint=f"git subtask land --verify 'make test' {job.id}   "
                                                      f"(land it unverified: --force)")


def _take(repo: Repo, job_id: str) -> int:
    deadline = time.monotonic() + RUN_LOCK_WAIT
    while (fd := liveness.acquire(repo.state_dir, job_id, block=False)) is None:
        if time.monotonic() >= deadline:
            raise SubtaskError("not_finished", f"{job_id} is busy: its worker or a reply holds it",
                               hint=f"git subtask wait {job_id}")
        time.sleep(0.02)
    return fd


# ---------------------------------------------------------------- reconciling a conflict

def reconcile(repo: Repo, target: Target, item: Item, onto: str, built: integrate.Built, out: Outcome,
              opts: Options, replier: Replier | None) -> bool:
    """Answer a conflict with a reply to the job, in its worktree moved onto `onto`; True once that
    reply ended done with its verify passed (the job is then ready to build again)."""
    job = item.job
    if not (item.trust and item.trust.owned) or replier is None:
        out.events.append("not reconciled: another clone's job (its branch is theirs)")
        return False
    shell = job.spec.engine == "shell"
    applied = _move_job_onto(repo, job, item.head, onto, apply_old=not shell)
    message = job.spec.task if shell else _agent_message(target, job, item.head, onto, out, applied)
    out.events.append(f"conflict in {', '.join(built.conflicts)}: reconciling: "
                      + ("its task runs again on " if shell else "a reply resolves it on ") + f"{target.name} at {onto[:7]}")
    liveness.release(item.fd)
    item.fd = None
    ended = replier(job.id, message)
    item.fd = _take(repo, job.id)
    fresh = item.job = records.read(repo, job.id)
    attempt = fresh.state.current
    verify = attempt.verify
    said = "no verify" if verify is None else ("verify passed" if verify.passed else "verify failed")
    out.events.append(f"reconciliation (attempt {attempt.n}) ended {attempt.state}, {said}")
    if ended.id != job.id or attempt.state != "done" or (verify is not None and not verify.passed):
        out.why = f"its reconciliation (attempt {attempt.n}) ended {attempt.state}, {said}"
        return False
    try:
        item.head = landing.check_mergeable(repo, fresh, opts.force, item.trust.claims)
    except SubtaskError as exc:
        out.why = f"after its reconciliation: {exc.message}"
        return False
    return True


def _move_job_onto(repo: Repo, job: Job, old: str, onto: str, *, apply_old: bool) -> bool:
    """Put the job's branch (and its worktree, when it has one) at `onto`; with `apply_old`, its
    earlier changes applied on top, uncommitted, conflicts marked. The earlier head stays in the
    record and the branch's reflog. True when they were applied."""
    path = Path(job.spec.worktree)
    if path.exists() and worktrees.created_here(repo, job.id, path):
        admin = worktrees.check_metadata(repo, job.id, path, job.spec.branch, job.spec.base, head=False)
        if worktrees.job_git(repo, admin, path, "status", "--porcelain", check=False).stdout.strip():
            raise Stop("dirty", f"{job.id}: its worktree {path} has uncommitted changes: not reconciling over them")
        worktrees.job_git(repo, admin, path, "reset", "--quiet", "--hard", onto)
        if apply_old:
            worktrees.job_git(repo, admin, path, "merge", "--squash", "--quiet", old, check=False)
            return True
        return False
    if not records.cas_ref(repo, f"refs/heads/{job.spec.branch}", old, onto, "git-subtask land: onto the new tip"):
        raise Stop("negative", f"{job.id}: its branch moved: not reconciling it")
    return False


def _agent_message(target: Target, job: Job, old: str, onto: str, out: Outcome, applied: bool) -> str:
    files = ", ".join(out.conflicts)
    theirs = "".join(f"\n  {line}" for line in out.sides.get("target", []))
    how = (f"Your branch was moved onto {onto[:12]} and your earlier changes (commit {old[:12]}) were applied on "
           f"top, uncommitted, with conflict markers in: {files}." if applied else
           f"Your branch was moved onto {onto[:12]}. Apply your earlier changes on top with "
           f"`git merge --squash {old[:12]}`; it conflicts in: {files}.")
    return (f"{target.name} moved on while you worked (it is now at {onto[:12]}), and your change no longer merges "
            f"into it: both change {files}.\n{how}\n"
            + (f"What {target.name} changed there:{theirs}\n" if theirs else "")
            + f"Resolve every conflict so that both {target.name}'s changes and yours are kept, check that it "
              "works, and commit.")


# ---------------------------------------------------------------- leftovers

def sweep_scratch(repo: Repo) -> None:
    """Remove the scratch worktrees a killed `land` left (under the queue lock: none is in use)."""
    folder = repo.worktree_dir() / SCRATCH
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        if not path.name.endswith(".tmp"):
            reverify.remove_scratch(repo, path)
        else:
            reverify.remove_scratch(repo, path.with_name(path.name.removesuffix(".tmp")))


def _queue_lock(repo: Repo):
    repo.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = file_lock(repo.state_dir / "land.lock", timeout=QUEUE_LOCK_WAIT)

    class _Held:
        def __enter__(self):
            try:
                lock.acquire()
            except LockTimeout:
                raise SubtaskError("negative", "another git subtask land is running in this repository",
                                   hint="wait for it to finish, then land again") from None

        def __exit__(self, *exc):
            lock.release()

    return _Held()


# ---------------------------------------------------------------- the words

def text(result: LandResult) -> str:
    """What `land` prints: a line per job (and what followed from it), then where the target went."""
    from subtask.render import safe_line, short, verify_line, verify_tail

    head = f"land onto {result.target} at {short(result.before)} ({result.mode}{', atomic' if result.atomic else ''})"
    lines = [head + f", {len(result.outcomes)} job{'' if len(result.outcomes) == 1 else 's'}:"]
    for out in result.outcomes:
        name = out.job + (f" ({out.group})" if out.group else "")
        if out.state in ("landed", "passed") and out.commit:
            what = f"{out.state} as {short(out.commit)} on {short(out.onto)} ({out.how})"
        elif out.state == "conflict":
            what = f"conflict with {result.target} at {short(out.onto)} in {', '.join(out.conflicts)}"
        elif out.state == "already":
            what = f"already in {result.target} at {short(out.onto)}"
        else:
            what = f"{out.state}: {out.why}" if out.why else out.state
        lines.append(safe_line(f"{name}: {what}"))
        lines += [safe_line(f"  {line}") for line in out.events]
        if out.verify is not None:
            where = "" if out.confined else " (unconfined)"
            lines.append(f"  verify{where}: {verify_line(out.verify)}")
            lines += verify_tail(out.verify, prefix="    ")
        if out.state in ("landed", "passed") and out.why:
            lines.append(safe_line(f"  {out.why}"))
        for side, said in out.sides.items():
            who = result.target if side == "target" else out.job
            lines += [safe_line(f"  {who}: {line}") for line in said] or [f"  {who}: -"]
        lines += [safe_line(f"  {line}") for line in out.lines if line]
    landed = sum(1 for o in result.outcomes if o.state == "landed")
    moved = f"{short(result.before)} -> {short(result.after)}" if result.after != result.before else f"stays at {short(result.before)}"
    lines.append(f"{result.target}: {moved} ({landed} of {len(result.outcomes)} landed)")
    if result.stopped:
        lines.append(safe_line(f"stopped: {result.stopped}"))
    return "\n".join(lines)
