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
  integrated commit all the same (that is the re-run `merge` would do), and is reported only;
  one that lands is this clone's mark (`where_landed`), as after `merge`.
- Never land a job with nothing to run on the integrated commit unless `force`, because landing
  many is only worth more than merging them one by one if what lands is what was tested; and
  never without its checks on its own change, `force` or not, a command or not (`checks_of`, once
  per head), because a job that deleted its failing test would pass everything else.
- A kill at any step leaves the target before or after a whole landing: the integrated commit
  is built and verified off to the side, and the move is one ref update (or one `git merge
  --ff-only` in the checkout). A landing that lands is recorded after its move, its verify and
  `landed` in one write (while the next job verifies); one killed in between is found by
  `cleanup --merged` or the next `land` (reachable, or patch-equivalent), its record then
  lacking that verify. One that does not land is recorded at once.

Lock order: `land.lock` (one queue per repository), then a job's run-lock (held while it lands,
so no reply starts meanwhile; let go while a reconciliation reply runs), then the target
checkout's `index_lock` (only around the move).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from subtask.git import checks, notes, records
from subtask.git.gitrepo import Repo, git
from subtask.git.records import Job
from subtask.model import faults, phases
from subtask.model.errors import EXIT_FATAL, SubtaskError
from subtask.model.job import Landing, VerifyResult, is_group_ref, now, work_base
from subtask.model.redact import redact
from subtask.ops import groups, integrate, landing, reconcile, reverify
from subtask.state import liveness, paths
from subtask.state.statefiles import LockTimeout, file_lock

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
    entry: Landing | None = None  # its latest build's landing, until recorded
    checked: tuple[tuple, list[dict]] | None = None  # its checks' results, and on what (`Queue.checks_of`)


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
    if target.checkout is not None and (changed := _checkout_state(target.checkout)[2]):
        raise SubtaskError("dirty", f"the worktree {target.checkout} has uncommitted changes "
                           f"({', '.join(changed[:10])}): not landing into it (your work is never stashed)",
                           hint="commit or stash them yourself, then land again",
                           exit_code=EXIT_FATAL)
    phases.begin()
    with _queue_lock(repo):
        sweep_scratch(repo)
        before = tip(repo, target)
        queue = Queue(repo, target, opts, replier,
                      LandResult(target.name, before, before, opts.mode, opts.atomic,
                                 [Outcome(i.job.id, i.group.id if i.group else None) for i in items]))
        try:
            queue.atomic(items) if opts.atomic else queue.each(items)
        finally:
            try:
                queue.finish_landed()
            finally:
                for scratch in queue.scratches:
                    scratch.close()
                for item in items:
                    liveness.release(item.fd)
                    item.fd = None
        queue.result.after = tip(repo, target)
    phases.mark("end")
    phases.flush("land", len(items))
    return queue.result


@dataclass
class Stage:
    """One job of the pipeline: built on `onto` in `scratch`, its verify started (`pending`)."""

    item: Item
    out: Outcome
    onto: str
    scratch: integrate.Scratch
    built: integrate.Built
    pending: reverify.Pending | None = None
    rebuilds: int = 0
    reconciled: bool = False

    def abort(self) -> None:
        if self.pending is not None:
            self.pending.abort()
            self.pending = None
        self.scratch.spoil()


@dataclass
class Queue:
    """One run of `land`: the jobs' outcomes, two scratch worktrees, the landings left to finish.

    Without `--atomic` the queue is a pipeline. While a job's verify runs, the landings before it
    are finished (recorded, cleaned up) and the next job is integrated, in the other scratch
    worktree, onto the commit this one would land; once this one passed, the next one's verify
    starts before this one's move, so the move overlaps it too. That work is used only if this
    one lands there: a failure, or a target that moved, throws it away. All in this thread: a
    verify is the one child a sandbox confines, started while no other thread runs
    (`isolation.outside_sandbox`); the work meanwhile starts plain git only.
    """

    repo: Repo
    target: Target
    opts: Options
    replier: Replier | None
    result: LandResult
    scratches: list[integrate.Scratch] = field(default_factory=list)
    landed: list[tuple[Item, Outcome, str, str]] = field(default_factory=list)  # to finish: commit, tip
    checked_out: set[str] | None = None  # branches checked out in worktrees, read once
    upcoming: list[tuple[Item, Outcome]] = field(default_factory=list)  # not started yet, in order

    def __post_init__(self) -> None:
        self.scratches = [integrate.Scratch(self.repo), integrate.Scratch(self.repo)]

    def each(self, items: list[Item]) -> None:
        """One landing after the other; a job that fails is reported and the rest go on."""
        self.upcoming = list(zip(items, self.result.outcomes, strict=True))
        stage: Stage | None = None
        try:
            while True:
                if stage is None:
                    got = self.take()
                    if got is None:
                        return
                    stage = self.stage(*got, self.scratches[0])
                stage = self.advance(stage)
        except Stop as exc:
            assert stage is not None
            if stage.out.state != "landed":
                stage.out.state, stage.out.why = "stopped", exc.message
            self.result.stopped = exc.message
        finally:
            if stage is not None:
                stage.abort()  # a verify still running (an interrupt, a stop) ends with the queue

    def peek(self) -> tuple[Item, Outcome] | None:
        """The next job that may land (its run-lock ours), left first in `upcoming`; the refused
        ones before it are reported and dropped."""
        while self.upcoming and not self.result.stopped:
            item, out = self.upcoming[0]
            if self.gated(item, out):
                return item, out
            self.upcoming.pop(0)
        return None

    def take(self) -> tuple[Item, Outcome] | None:
        got = self.peek()
        if got is not None:
            self.upcoming.pop(0)
        return got

    def gated(self, item: Item, out: Outcome) -> bool:
        """The job may land and its run-lock is ours (taken once: a look ahead may have taken it)."""
        if item.fd is not None:
            return True
        if out.state == "refused":
            return False
        try:
            gate(self.repo, item, self.opts)
        except SubtaskError as exc:
            _refused(out, exc)
            return False
        out.job = item.job.id  # a group's pick, once settled
        return True

    def stage(self, item: Item, out: Outcome, scratch: integrate.Scratch, *, rebuilds: int = 0,
              reconciled: bool = False, onto: str | None = None, built: integrate.Built | None = None) -> Stage:
        """The job built on `onto` (default: the target's tip) and its verify started."""
        onto = onto or tip(self.repo, self.target)
        built = built or self.integrated(item, onto, scratch)
        return Stage(item, out, onto, scratch, built, self.start_verify(item, built, scratch), rebuilds, reconciled)

    def other(self, scratch: integrate.Scratch) -> integrate.Scratch:
        return self.scratches[1] if scratch is self.scratches[0] else self.scratches[0]

    def advance(self, stage: Stage) -> Stage | None:
        """Take one job from verifying to landed (or reported); the stage that verifies next."""
        item, out, built = stage.item, stage.out, stage.built
        if built.kind == "conflict" and self.opts.reconcile and not stage.reconciled:
            if self.answer_conflict(item, out, stage.onto, built):  # build it on the tip as it is now
                return self.stage(item, out, stage.scratch, rebuilds=stage.rebuilds, reconciled=True)
            self.release(item)
            return None
        self.finish_landed()  # while it verifies
        ahead = None
        if built.kind == "built":
            nxt = self.peek()
            if nxt is not None:
                other = self.other(stage.scratch)
                ahead = (*nxt, other, self.integrated(nxt[0], built.commit, other))
        self.judge(item, out, built, stage.pending, stage.scratch)
        stage.pending = None
        if built.kind == "already":
            self.landed.append((item, out, landing.merge_point(self.repo, item.head, stage.onto), stage.onto))
            return None
        if out.state != "passed":
            self.release(item)
            return None
        faults.point("land_verified")
        following = None
        if ahead is not None:
            self.upcoming.pop(0)
            following = self.stage(ahead[0], ahead[1], ahead[2], onto=built.commit, built=ahead[3])
        try:
            moved = move(self.repo, self.target, stage.onto, built.commit)
        except BaseException:
            if following is not None:
                following.abort()
                self.upcoming.insert(0, (following.item, following.out))
            raise
        if moved != "ok":
            out.events.append(f"{self.target.name} moved while it was built: building it again on top")
            if following is not None:  # built on a commit that will not land
                following.abort()
                self.upcoming.insert(0, (following.item, following.out))
            if stage.rebuilds + 1 >= MAX_REBUILDS:
                out.state, out.why = "failed", f"{self.target.name} moved under each of {MAX_REBUILDS} landings in a row"
                self.release(item)
                return None
            return self.stage(item, out, stage.scratch, rebuilds=stage.rebuilds + 1, reconciled=stage.reconciled)
        phases.mark("move")
        faults.point("land_moved")
        out.state = "landed"
        self.landed.append((item, out, built.commit, built.commit))
        return following

    def release(self, item: Item) -> None:
        liveness.release(item.fd)
        item.fd = None

    def atomic(self, items: list[Item]) -> None:
        """Every job built on the one before, verified, then the target moved once: all or nothing."""
        try:
            self._atomic(items)
        except Stop as exc:
            self.result.stopped = f"{exc.message}: nothing landed (--atomic)"
            for item, out in zip(items, self.result.outcomes, strict=True):
                if out.state == "passed":
                    out.why = "not landed: the queue stopped"
                    _record(self.repo, item)

    def _atomic(self, items: list[Item]) -> None:
        result = self.result
        for item, out in zip(items, result.outcomes, strict=True):
            if not self.gated(item, out):
                result.stopped = f"{item.job.id} was refused: nothing landed (--atomic)"
                return
        scratch = self.scratches[0]
        for _ in range(MAX_REBUILDS):
            start = chain = tip(self.repo, self.target)
            landed: list[tuple[Item, Outcome, str]] = []
            for n, (item, out) in enumerate(zip(items, result.outcomes, strict=True)):
                built = self.integrated(item, chain, scratch)
                if built.kind == "conflict" and self.opts.reconcile:
                    if self.answer_conflict(item, out, chain, built):  # built again, once, on the same chain
                        built = self.integrated(item, chain, scratch)
                        self.judge(item, out, built, self.start_verify(item, built, scratch), scratch)
                else:
                    self.judge(item, out, built, self.start_verify(item, built, scratch), scratch)
                if built.kind == "already":
                    landed.append((item, out, landing.merge_point(self.repo, item.head, chain)))
                    continue
                if out.state != "passed":
                    result.stopped = f"{item.job.id} broke the queue ({out.state}): nothing landed (--atomic)"
                    for passed, before, _ in landed:
                        before.why = f"not landed: {item.job.id} broke the queue"
                        _record(self.repo, passed)
                    for later in result.outcomes[n + 1:]:
                        later.state = "not reached"
                    return
                chain = built.commit
                landed.append((item, out, built.commit))
            faults.point("land_verified")
            if move(self.repo, self.target, start, chain) != "ok":
                for out in result.outcomes:
                    out.events.append(f"{self.target.name} moved while the queue was built: building it again")
                continue
            faults.point("land_moved")
            for item, out, commit in landed:
                out.state = "landed" if out.state == "passed" else out.state
                self.landed.append((item, out, commit, chain))
            return
        result.stopped = f"{self.target.name} moved under each of {MAX_REBUILDS} builds of the queue: nothing landed"

    # ------------------------------------------------------------ one landing

    def integrated(self, item: Item, onto: str, scratch: integrate.Scratch) -> integrate.Built:
        """The job integrated onto `onto` in `scratch` (nothing recorded yet)."""
        scratch.at(onto)
        phases.mark("scratch")
        built = integrate.integrate(self.repo, scratch, item.job, item.head, onto, self.opts.mode)
        phases.mark("integrate")
        faults.point("land_built")
        return built

    def start_verify(self, item: Item, built: integrate.Built, scratch: integrate.Scratch) -> reverify.Pending | None:
        """The verify of an integrated commit, started in its scratch (None: nothing to run)."""
        if built.kind != "built" or not item.command:
            return None
        scratch.spoil()  # until it passed
        tree = str(self.repo.git[built.commit].tree_id)
        # Judged by the target's tests as they are at the tip it was built on, never the job's.
        trusted = reverify.Trusted(reverify.asked_harness(item.job, bool(item.trust and item.trust.vouched)),
                                   built.onto, "target", self.target.name)
        # The job's own checks are `judge`'s (`checks_of`): they run with a command or without one.
        return reverify.start_in(self.repo, scratch.path, item.command, built.commit, admin=scratch.admin, tree=tree,
                                 timeout=item.timeout, network=item.job.spec.network, trusted=trusted)

    def checks_of(self, item: Item) -> list[dict]:
        """The job's own checks on its own change (did it delete a test?), as a re-run runs them:
        once per head, whatever the rebuilds, and whether or not there is a command to run."""
        on = (work_base(item.job), item.head, tuple(item.job.spec.checks or ()))
        if item.checked is None or item.checked[0] != on:
            item.checked = (on, checks.run(self.repo, on[0], on[1], list(on[2])))
        return item.checked[1]

    def judge(self, item: Item, out: Outcome, built: integrate.Built, pending: reverify.Pending | None,
              scratch: integrate.Scratch | None = None) -> None:
        """What the build (and its verify, waited for here) says: in `out`, and in the job's
        record (this clone's job)."""
        repo, job = self.repo, item.job
        out.onto, out.commit, out.how = built.onto, built.commit, built.how
        out.verify, out.conflicts, out.sides, out.why = None, [], {}, ""
        rerun = pending.wait() if pending is not None else None
        phases.mark("verify")
        if built.kind == "conflict":
            out.state, out.conflicts = "conflict", built.conflicts
            out.sides = integrate.sides(repo, job, item.head, built.onto, built.conflicts)
        elif built.kind == "failed":
            out.state, out.why = "failed", f"git could not integrate it: {built.why}"
        elif built.kind == "already":
            out.state = "already"
            return
        elif rerun is None:  # --force: nothing to run, its checks all the same (a deleted test fails it)
            found = self.checks_of(item)
            failed = checks.failed(found)
            out.state = "failed" if failed else "passed"
            out.why = (checks.failure_text(found) + " (on its own change: --force skips the gate, never its checks)"
                       if failed else "nothing was run on it (--force)")
        else:
            if failed := checks.failed(self.checks_of(item)):  # fail it whatever the command exited
                rerun.result.checks_failed = [*failed, *(c for c in rerun.result.checks_failed or () if c not in failed)]
                rerun.result.passed = False
            rerun.result.command = redact(item.command)  # a --verify as written never reaches a record
            out.verify, out.confined = rerun.result, rerun.confined
            out.state = "passed" if rerun.result.passed else "failed"
            out.why = "" if rerun.result.passed else "its verify failed on the integrated commit"
            if rerun.result.passed and scratch is not None and (self.opts.verify or item.trust and item.trust.claims):
                scratch.passed()  # a teammate's unsigned verify command may have changed it: never reused
        outcome = {"passed": "unverified" if rerun is None else "passed"}.get(out.state, out.state)
        item.entry = Landing(at=now(), target=self.target.name, onto=built.onto, mode=self.opts.mode,
                             outcome=outcome, commit=built.commit, verify=out.verify, conflicts=built.conflicts)
        if out.state != "passed":  # a passing one is recorded once it landed, or the queue stopped
            _record(repo, item)
        phases.mark("record")

    def finish_landed(self) -> None:
        """Finish the landings made so far: record them, clean up after them as `merge` does, land
        a group's pick; then let go of their jobs."""
        while self.landed:
            item, out, commit, now_at = self.landed.pop(0)
            try:
                self.finish(item, out, commit, now_at)
            finally:
                liveness.release(item.fd)
                item.fd = None
            phases.mark("finish")

    def finish(self, item: Item, out: Outcome, commit: str, now_at: str) -> None:
        job = item.job
        entry, item.entry = item.entry, None

        def mark(j: Job) -> None:
            if entry is not None:
                entry.landed = True
                j.state.landings = [*j.state.landings, entry][-KEEP_LANDINGS:]

        if item.trust and item.trust.owned:
            if self.checked_out is None:
                self.checked_out = landing.checked_out_branches(self.repo)
            lines = landing.finish_landed(self.repo, job, item.head, commit,
                                          landing.Target(self.target.name, now_at), held=True, also=mark,
                                          checked_out=self.checked_out)
            out.lines += (lines or [""])[1:]
        else:
            out.lines.append(landing.landed_elsewhere(self.repo, job, commit))
        if item.group is not None:
            out.lines += groups.pick_landed(self.repo, item.group, commit, self.target.name)[1]

    def answer_conflict(self, item: Item, out: Outcome, onto: str, built: integrate.Built) -> bool:
        """A conflict under `--reconcile`, for the pipeline and `--atomic` alike: judged (and
        recorded) once, then answered by a reply (`reconcile`). True: the reply passed, build the
        job again; False: the conflict as judged is its outcome (never judged a second time, on a
        branch the reply moved)."""
        self.judge(item, out, built, None)
        self.finish_landed()  # before a reply that may take long
        return self.reconcile(item, onto, built, out)

    def reconcile(self, item: Item, onto: str, built: integrate.Built, out: Outcome) -> bool:
        """Answer a conflict with a reply to the job, on `onto` (`reconcile.prepare`); True once
        that reply ended done with its verify passed (the job is then ready to build again)."""
        repo, job = self.repo, item.job
        if not (item.trust and item.trust.owned) or self.replier is None:
            out.events.append("not reconciled: another clone's job (its branch is theirs)")
            return False
        try:
            message = reconcile.prepare(repo, job, item.head, onto, self.target.name, built.conflicts,
                                        out.sides.get("target", []))
        except SubtaskError as exc:
            out.events.append(f"not reconciled: {exc.message}")
            return False
        out.events.append(f"conflict in {', '.join(built.conflicts)}: reconciling: "
                          + ("its task runs again on " if job.spec.engine == "shell" else "a reply resolves it on ")
                          + f"{self.target.name} at {onto[:7]}")
        self.release(item)  # the reply's worker takes the job's run-lock
        try:
            ended = self.replier(job.id, message)
        finally:
            item.fd = liveness.acquire_within(repo.state_dir, job.id, RUN_LOCK_WAIT)
        fresh = item.job = records.read(repo, job.id)
        attempt = fresh.state.current
        verify = attempt.verify
        said = "no verify" if verify is None else ("verify passed" if verify.passed else "verify failed")
        out.events.append(f"reconciliation (attempt {attempt.n}) ended {attempt.state}, {said}")
        if ended.id != job.id or attempt.state != "done" or (verify is not None and not verify.passed):
            out.why = f"its reconciliation (attempt {attempt.n}) ended {attempt.state}, {said}"
            return False
        try:
            item.head = landing.check_mergeable(repo, fresh, self.opts.force, item.trust.claims)
        except SubtaskError as exc:
            out.why = f"after its reconciliation: {exc.message}"
            return False
        return True


def _refused(out: Outcome, exc: SubtaskError) -> None:
    out.state, out.why = "refused", exc.message + (f" (hint: {exc.hint})" if exc.hint else "")


def _record(repo: Repo, item: Item) -> None:
    """The job's landing that did not land (`item.entry`) in its record and note (this clone's
    job only). One that lands is recorded with its landing (`Queue.finish`), in one write."""
    entry, item.entry = item.entry, None
    if entry is None or not (item.trust and item.trust.owned):
        return

    def change(job: Job) -> None:
        job.state.landings = [*job.state.landings, entry][-KEEP_LANDINGS:]

    item.job = records.update(repo, item.job.id, change)
    notes.write_for_job(repo, item.job)


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
    with landing.index_lock(repo, target.checkout, target.git_dir):
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
    item.trust = landing.trust_of(repo, job)
    item.head = landing.check_mergeable(repo, job, opts.force, item.trust.claims)
    item.command = opts.verify or job.spec.verify
    item.timeout = job.spec.verify_timeout if not opts.verify else repo.config.number("verifyTimeout")
    if not item.command and not opts.force:
        raise SubtaskError("negative", f"{job.id}: nothing to run on the integrated commit (it was started "
                           "without --verify)", hint=f"git subtask land --verify 'make test' {job.id}   "
                                                      f"(land it unverified: --force)")


# ---------------------------------------------------------------- leftovers

def sweep_scratch(repo: Repo) -> None:
    """Remove the scratch worktrees a killed `land` left (under the queue lock: none is in use)."""
    folder = repo.worktree_dir() / integrate.SCRATCH
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        name = path.name.removesuffix(".tmp").removesuffix(reverify.SIDE_SUFFIX)
        reverify.remove_scratch(repo, path.with_name(name))


def _queue_lock(repo: Repo):
    repo.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = file_lock(repo.state_dir / paths.LAND_LOCK, timeout=QUEUE_LOCK_WAIT)

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
