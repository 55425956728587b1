"""`git subtask land`: many finished jobs landed in order, each verified on the commit that lands.

Each job is integrated on the one before it, from the target's tip (`integrate.py`), and up to
`--window` of those integrated states are verified at once, each in a scratch worktree (the
window's rules: `landwindow.py`; a result already known for the same tree is reused:
`verified.py`); each result is recorded in the job's record and note (this clone's jobs only),
and the target moves, by compare-and-swap against the tip the states were built on, to the end of
the verified prefix. A person committing meanwhile makes the states rebuild on their commit. The target's checkout, where it has one, is moved as `merge` moves it: under
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

import os
import queue as queue_module
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from subtask.git import checks, notes, records
from subtask.git.gitrepo import Repo, git
from subtask.git.records import Job
from subtask.model import faults, phases
from subtask.model.errors import EXIT_FATAL, SubtaskError
from subtask.model.job import Landing, VerifyResult, is_group_ref, now, work_base
from subtask.model.redact import redact
from subtask.ops.landing import (
    integrate,
    landfirst,
    landing,
    landwindow,
    reconcile,
    reverify,
    verified,
)
from subtask.ops.plans import groups
from subtask.proc import isolation
from subtask.state import liveness, paths
from subtask.state.statefiles import LockTimeout, file_lock

KEEP_LANDINGS = 10  # landings kept per record, latest last
MAX_REBUILDS = 5  # a target that moved under this many landings in a row stops the job
RUN_LOCK_WAIT = 3.0
QUEUE_LOCK_WAIT = 10.0
HANDED_POLL = 0.2  # seconds between looks for the answer of a queue a job was handed to
PROGRESS_TICK = 1.0  # seconds between progress reports while verifies run
MAX_WINDOW = 64
SCRATCH_MAKERS = 4  # scratch worktrees checked out at once, beside the verifies
FINISHERS = 2  # landings finished at once (records, cleanup), beside the verifies

# A reconciliation: (job id, message) -> the job once that reply has ended (`api` hands it down).
Replier = Callable[[str, str], Job]


# What the window is doing, for a live line (`render.land_progress`): see `Queue.progress`.
Progress = Callable[[dict], None]


@dataclass
class Options:
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
        sides = data.get("sides") if isinstance(data.get("sides"), dict) else {}
        return cls(text("id", "?"), data.get("group") if isinstance(data.get("group"), str) else None,
                   text("state", "not reached"), text("onto") or None, text("commit") or None, text("how"),
                   VerifyResult.from_dict(verify) if isinstance(verify, dict) else None,
                   data.get("confined") is not False, texts("conflicts"),
                   {k: [x for x in v if isinstance(x, str)] for k, v in sides.items() if isinstance(v, list)},
                   text("why"), texts("events"), texts("lines"), text("batch") or None)


@dataclass
class LandResult:
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
    trust: landing.Trust | None = None
    command: str | None = None
    timeout: float = 600.0
    fd: int | None = None
    entry: Landing | None = None  # its latest build's landing, until recorded
    checked: tuple[tuple, list[dict]] | None = None  # its checks' results, and on what (`Queue.checks_of`)
    handed: str | None = None  # taken from `land --first` of another process: the target's tip then


class Stop(SubtaskError):
    """The queue cannot go on (the checkout got uncommitted changes, git refused to update it)."""


# ---------------------------------------------------------------- the queue

def land(repo: Repo, asked: list[str], opts: Options, replier: Replier | None = None) -> LandResult:
    """Land the jobs (or best-of groups: their picks) in the order given (`first` ahead of the
    rest); see the module docstring. With `first` while another queue runs, the jobs are handed
    to it (`landfirst`) and their outcomes come back from it."""
    if opts.mode not in integrate.MODES:
        raise SubtaskError("usage", f"unknown land mode {opts.mode!r} ({', '.join(integrate.MODES)})")
    if opts.reconcile and replier is None:
        raise SubtaskError("usage", "--reconcile needs a way to reply to jobs (the CLI or the MCP server)")
    if opts.window is not None and not 1 <= opts.window <= MAX_WINDOW:
        raise SubtaskError("usage", f"--window must be a whole number from 1 to {MAX_WINDOW}, not {opts.window}")
    if opts.batch is not None and opts.batch < 0:
        raise SubtaskError("usage", f"--batch-size must be a whole number >= 0, not {opts.batch}")
    target = find_target(repo)
    items = resolve(repo, first_of(asked, opts.first))
    if target.checkout is not None and (changed := _checkout_state(target.checkout)[2]):
        raise SubtaskError("dirty", f"the worktree {target.checkout} has uncommitted changes "
                           f"({', '.join(changed[:10])}): not landing into it (your work is never stashed)",
                           hint="commit or stash them yourself, then land again",
                           exit_code=EXIT_FATAL)
    opts.window = window_width(repo, opts.window)
    if opts.batch is not None:
        opts.batch = opts.batch or repo.config.integer("land.batch") or len(items)
    if opts.reuse is None:
        opts.reuse = repo.config.flag("verify.reuse")
    lock = _queue_lock(repo, wait=0.0 if opts.first else QUEUE_LOCK_WAIT)
    if not lock.take():
        if not opts.first:
            raise SubtaskError("negative", "another git subtask land is running in this repository",
                               hint="wait for it to finish, then land again   (a hotfix: git subtask land --first ID)")
        if len(items) != len(opts.first):
            raise SubtaskError("usage", "another git subtask land is running: --first hands it only the jobs it "
                               "names", hint="git subtask land --first ID   (land the others once it ended)")
        return hand_over(repo, target, items, opts, replier, lock)
    try:
        return run_queue(repo, target, items, opts, replier)
    finally:
        lock.release()


def run_queue(repo: Repo, target: Target, items: list[Item], opts: Options, replier: Replier | None,
              handed: dict[str, str] | None = None) -> LandResult:
    """The queue itself, under the land lock (see `Queue`)."""
    phases.begin()
    sweep_scratch(repo)
    before = tip(repo, target)
    queue = Queue(repo, target, opts, replier,
                  LandResult(target.name, before, before, opts.mode, opts.atomic,
                             [Outcome(i.job.id, i.group.id if i.group else None) for i in items]))
    queue.items = list(items)
    try:
        queue.run(items)
    finally:
        try:
            queue.finish_landed()
        finally:
            queue.answer_handed()  # a handed job the queue did not end: said as it stands
            for scratch in queue.scratches:
                scratch.close()
            for item in queue.items:
                liveness.release(item.fd)
                item.fd = None
    queue.result.after = tip(repo, target)
    queue.result.window, queue.result.batch = opts.window, opts.batch
    queue.result.runs, queue.result.reused = queue.runs, queue.reused
    queue.result.seconds = round(time.monotonic() - queue.started, 3)
    phases.mark("end")
    phases.flush("land", len(queue.items))
    return queue.result


def hand_over(repo: Repo, target: Target, items: list[Item], opts: Options, replier: Replier | None,
              lock) -> LandResult:
    """`land --first` while another queue runs: hand it the jobs (`landfirst`) and wait for their
    outcomes; a job the queue ends without (it ended first, it is --atomic, it was killed) is
    taken back and landed here once the lock is free."""
    before = tip(repo, target)
    ids = [item.job.id for item in items]
    for job_id in ids:
        landfirst.ask(repo, job_id)
    answers: dict[str, dict] = {}
    try:
        while True:
            for job_id in ids:
                if job_id not in answers and (said := landfirst.answered(repo, job_id)) is not None:
                    answers[job_id] = said
            if len(answers) == len(ids):
                break
            if not lock.take():
                time.sleep(HANDED_POLL)
                continue
            try:  # no queue runs now: what it did not answer is landed here
                for job_id in ids:
                    if job_id not in answers and (said := landfirst.answered(repo, job_id)) is not None:
                        answers[job_id] = said
                rest = [item for item in items if item.job.id not in answers]
                for item in rest:
                    landfirst.take_back(repo, item.job.id)
                mine = run_queue(repo, target, rest, opts, replier) if rest else None
            finally:
                lock.release()
            for outcome in mine.outcomes if mine else []:
                answers[outcome.job] = {"outcome": outcome.to_dict()}
            break
    except BaseException:
        for job_id in ids:
            if job_id not in answers and landfirst.pending(repo, job_id):
                landfirst.take_back(repo, job_id)
        raise
    outcomes = [Outcome.from_dict(answers[job_id].get("outcome") or {"id": job_id}) for job_id in ids]
    return LandResult(target.name, before, tip(repo, target), opts.mode, opts.atomic, outcomes)


def first_of(asked: list[str], first: list[str]) -> list[str]:
    """The queue's order: the jobs `--first` names (the hotfix lane), then the others as given."""
    return [*first, *(text for text in asked if text not in first)]


def window_width(repo: Repo, asked: int | None) -> int:
    """How many integrated states verify at once: `--window`, else `subtask.land.window`, else
    the cores, at most the worker slots no job holds now (a verify takes what a worker would)."""
    width = asked or repo.config.integer("land.window")
    if width:
        return min(width, MAX_WINDOW)
    from subtask.state import slots

    running = len(slots.read(repo.state_dir).running)
    free = repo.config.integer("maxRunning") - running
    return max(1, min(os.cpu_count() or 1, free, MAX_WINDOW))


def _reused_words(result: VerifyResult) -> str:
    found = result.reused or {}
    return (f"verify reused: {'passed' if result.passed else 'failed'} on the same tree at "
            f"{str(found.get('commit') or '?')[:7]} ({found.get('job')}, {found.get('by')}); --no-reuse runs it")


@dataclass
class Queue:
    """One run of `land`: the line of jobs, their scratch worktrees, the landings left to finish.

    The window (`landwindow` holds its rules): the jobs are built one on the other (tip+A,
    tip+A+B, ...; by `git merge-tree`, no checkout), and up to `width` of those states are
    verified at once, each in a scratch worktree of its own checked out at it (a pool, reused
    after a verify that passed); a state whose key a known result answers is not run at all
    (`verified`). As answers arrive the target moves, by one compare-and-swap, to the end of the
    verified prefix; a failure takes its job out of the chain and the states after it are built
    again without it. The landings that moved are finished (recorded, cleaned up) while the next
    states verify. Every verify is a child of this thread (its parent-death signal, its sandbox
    handed to `procs.start` alone); a small thread per verify only waits for its end.
    """

    repo: Repo
    target: Target
    opts: Options
    replier: Replier | None
    result: LandResult
    scratches: list[integrate.Scratch] = field(default_factory=list)  # every one made, closed at the end
    landed: list[Future] = field(default_factory=list)  # landings being finished (`finish_later`)
    checked_out: set[str] | None = None  # branches checked out in worktrees, read once

    def __post_init__(self) -> None:
        self.line: list[landwindow.Entry] = []
        self.tip = self.result.before  # the target as this queue last left or found it
        self.free: list[integrate.Scratch] = []
        self.answers: queue_module.Queue[landwindow.Probe] = queue_module.Queue()
        self.known = verified.Known(self.repo)
        self.width = self.opts.window or 1
        self.batch = self.opts.batch or 0
        self.started = time.monotonic()
        self.runs = 0  # verifies started
        self.reused = 0
        self.moves = 0  # moves of the target that did not take (a person's commit): --atomic's rebuilds
        self.makers: ThreadPoolExecutor | None = None  # threads checking scratches out (git only)
        self.finisher: ThreadPoolExecutor | None = None  # the thread finishing landings
        self.finisher_repo: Repo | None = None
        self.items: list[Item] = []  # every job it holds, those handed to it (`land --first`) too

    # ------------------------------------------------------------ the loop

    def run(self, items: list[Item]) -> None:
        """Land the line (see the class docstring); --atomic moves the target once, at the end,
        only if every job integrated and passed."""
        self.line = [landwindow.Entry(item, out) for item, out in zip(items, self.result.outcomes, strict=True)]
        try:
            while self.line and not self.result.stopped:
                changed = self.plan()
                changed = (self.settle_atomic() if self.opts.atomic else self.settle()) or changed
                if not self.line or self.result.stopped:
                    break
                if not changed and not self.wait_one():
                    raise RuntimeError("the land window has nothing to wait for")  # a bug, said plainly
        except Stop as exc:
            self.result.stopped = exc.message + (": nothing landed (--atomic)" if self.opts.atomic else "")
            for entry in self.line:
                if self.opts.atomic and entry.out.state == "passed":
                    entry.out.why = "not landed: the queue stopped"
                    _record(self.repo, entry.item)
                elif entry.built is not None and entry.out.state not in ("landed", "already"):
                    entry.out.state, entry.out.why = "stopped", exc.message
        finally:
            for entry in self.line:
                self.drop_probe(entry)  # a verify still running (an interrupt, a stop) ends with the queue
            if self.makers is not None:
                self.makers.shutdown(wait=True)  # checkouts under way end before their scratches go
            if self.finisher is not None:
                self.finisher.shutdown(wait=True)  # every landing finished (what failed: `finish_landed`)
            self.progress(final=True)

    def plan(self) -> bool:
        """Build what the window needs and start the verifies it has room for; True when anything
        changed."""
        changed = self.take_handed()
        now = tip(self.repo, self.target)
        if now != self.tip and not self.opts.atomic:
            self.moved_under(now)
            changed = True
        for entry in landwindow.stale(self.line, self.tip):
            self.reset(entry)
            changed = True
        for entry in list(self.line):
            if entry.built is not None:
                continue
            if not self.room_to_build():
                break
            if not self.gated(entry.item, entry.out):
                if self.opts.atomic:  # all or nothing: one refused, none lands
                    self.result.stopped = f"{entry.item.job.id} was refused: nothing landed (--atomic)"
                    return True
                self.line.remove(entry)  # refused: reported as it is
                self.release(entry.item)
                self.answer_handed(entry.item, entry.out)
                changed = True
                continue
            self.build(entry, landwindow.chain_tip(self.line, self.tip))
            self.start_wanted()  # the first verifies start while the rest is built
            self.handle(block=False)
            changed = True
        return self.start_wanted() or changed

    def start_wanted(self) -> bool:
        started = False
        for entry in landwindow.wanted(self.line, self.batch):
            if self.running() >= self.width:
                break
            self.start_probe(entry)
            started = True
        return started

    def take_handed(self) -> bool:
        """Jobs another `land --first` handed to this queue: put at its head (the states of the
        jobs behind them are built again on them). Not into an --atomic queue: all or nothing
        is about the jobs it was given."""
        if self.opts.atomic:
            return False
        taken = landfirst.take(self.repo)
        for job_id in reversed(taken):
            entry = next((e for e in self.line if e.item.job.id == job_id), None)
            if entry is not None:
                self.line.remove(entry)
            else:
                done = next((o for o in self.result.outcomes if o.job == job_id), None)
                if done is not None:  # it ended in this queue already
                    landfirst.answer(self.repo, job_id, self.handed_answer(self.tip, done))
                    continue
                try:
                    item = resolve(self.repo, [job_id])[0]
                except SubtaskError as exc:
                    out = Outcome(job_id)
                    _refused(out, exc)
                    landfirst.answer(self.repo, job_id, self.handed_answer(self.tip, out))
                    continue
                entry = landwindow.Entry(item, Outcome(item.job.id, item.group.id if item.group else None))
                self.items.append(item)
                self.result.outcomes.append(entry.out)
            entry.item.handed = self.tip
            entry.out.events.append("put at the head of the queue by land --first")
            self.line.insert(0, entry)
        return bool(taken)

    def handed_answer(self, before: str, out: Outcome, after: str | None = None) -> dict:
        return {"target": self.target.name, "before": before, "after": after or tip(self.repo, self.target),
                "outcome": out.to_dict(), "queue": os.getpid()}

    def answer_handed(self, item: Item | None = None, out: Outcome | None = None) -> None:
        """Say the outcome of a job handed to this queue (or of every one not said yet)."""
        if item is None:
            for one in self.items:
                if one.handed is not None:
                    self.answer_handed(one, next((o for o in self.result.outcomes if o.job == one.job.id), None))
            return
        if item.handed is None or out is None:
            return
        before, item.handed = item.handed, None
        landfirst.answer(self.repo, item.job.id, self.handed_answer(before, out))

    def room_to_build(self) -> bool:
        """Build ahead only as far as the window verifies: `width` states unverified (batches of
        `batch` each), counted from the target."""
        waiting = sum(1 for e in self.line if e.needs_verify and (e.probe is None or e.probe.running))
        return waiting < self.width * max(self.batch, 1)

    def running(self) -> int:
        return sum(1 for e in self.line if e.probe is not None and e.probe.running)

    def wait_one(self) -> bool:
        """Wait for a scratch to be ready or a verify to answer (at most a tick: the progress
        line), and take every event there is then; False when nothing runs."""
        if not self.running():
            return False
        if not self.handle(block=True):
            self.progress()
        return True

    def handle(self, block: bool) -> bool:
        """Take the events there are (a scratch checked out: its verify starts; a verify ended: its
        answer), waiting a tick for the first when `block`; True when there was one."""
        try:
            event, probe = self.answers.get(timeout=PROGRESS_TICK) if block else self.answers.get_nowait()
        except queue_module.Empty:
            return False
        while True:  # every answer there is before the next move: one move for all of them
            if event == "ready":
                self.launch(probe)
            else:
                self.answered(probe)
            try:
                event, probe = self.answers.get_nowait()
            except queue_module.Empty:
                return True

    # ------------------------------------------------------------ building

    def build(self, entry: landwindow.Entry, onto: str) -> None:
        """The job integrated onto `onto` (nothing recorded yet); its checks on its own change run
        once per head: a job that fails them is out of the chain whatever its state would say."""
        item = entry.item
        entry.built = integrate.build(self.repo, item.job, item.head, onto, self.opts.mode, self.scratch)
        entry.probe, entry.failing = None, False
        phases.mark("integrate")
        faults.point("land_built")
        if entry.built.kind in ("conflict", "failed"):
            entry.failing = True
            if entry.built.kind == "conflict" and self.opts.atomic and self.opts.reconcile and not entry.reconciled:
                self.reconcile_now(entry)  # --atomic: the chain ahead of it is what it lands on
        elif entry.built.kind == "built" and checks.failed(self.checks_of(item)):
            entry.failing = True
        elif entry.built.kind == "built" and not item.command:
            pass  # --force: nothing to run on it (its checks passed)

    def reset(self, entry: landwindow.Entry) -> None:
        """Built on a state that is no longer the chain ahead of it: built again."""
        self.drop_probe(entry)
        entry.built, entry.probe, entry.failing = None, None, False

    def moved_under(self, now: str) -> None:
        """The target moved, not by us (a person's commit): every state is built again on it."""
        for entry in list(self.line):
            if entry.built is None:
                continue
            entry.out.events.append(f"{self.target.name} moved while it was built: building it again on top")
            entry.rebuilds += 1
            if entry.rebuilds >= MAX_REBUILDS:
                self.drop_probe(entry)
                entry.out.state = "failed"
                entry.out.why = f"{self.target.name} moved under each of {MAX_REBUILDS} landings in a row"
                self.line.remove(entry)
                self.release(entry.item)
                self.answer_handed(entry.item, entry.out)
        self.tip = now

    # ------------------------------------------------------------ verifying

    def start_probe(self, entry: landwindow.Entry) -> None:
        """Verify the entry's state: a known answer for its key, else its verify started in a
        scratch worktree checked out at it."""
        item, built = entry.item, entry.built
        tree = str(self.repo.git[built.commit].tree_id)
        asked = reverify.asked_harness(item.job, bool(item.trust and item.trust.vouched))
        confined = isolation.support().available
        trusted = self.judge_of(entry)
        key = verified.key_of(self.repo, tree=tree, command=redact(item.command), trusted=trusted, asked=asked,
                              confined=confined, network=item.job.spec.network)
        found = self.known.find(key) if self.opts.reuse else None
        if found is not None:
            entry.probe = landwindow.Probe(key, reused=True, rerun=reverify.Rerun(found.reused(), confined))
            self.reused += 1
            self.answered(entry.probe, entry)
            return
        probe = entry.probe = landwindow.Probe(key, tree=tree, asked=asked, trusted=trusted)
        probe.scratch = self.scratch()
        if self.makers is None:
            self.makers = ThreadPoolExecutor(max_workers=min(self.width, SCRATCH_MAKERS),
                                             thread_name_prefix="subtask-land-scratch")
        probe.ready = self.makers.submit(probe.scratch.at, built.commit)
        probe.ready.add_done_callback(lambda _done, p=probe: self.answers.put(("ready", p)))

    def judge_of(self, entry: landwindow.Entry) -> str:
        """The commit whose harness judges the entry's state, never the job's own: the state it
        was built on, whose jobs' tests each passed a verify of their own judged the same way
        (or will, else this state is built again); with batches, the target's tip, because a
        job inside a batch was never judged on its own, so its tests may judge nothing."""
        return self.tip if self.batch else entry.built.onto

    def launch(self, probe: landwindow.Probe) -> None:
        """Its scratch is checked out at its state: start its verify (here, in the main thread:
        the child's parent-death signal follows the thread that forked it)."""
        ready, probe.ready = probe.ready, None
        if probe.dropped:
            probe.scratch.spoil()
            self.free.append(probe.scratch)
            ready.exception()  # a checkout that failed for a probe nobody wants says nothing
            return
        ready.result()  # what went wrong checking it out, raised here
        entry = next(e for e in self.line if e.probe is probe)
        item, built = entry.item, entry.built
        phases.mark("scratch")
        probe.scratch.spoil()  # until it passed
        trusted = reverify.Trusted(probe.asked, probe.trusted, "target", self.target.name)
        probe.pending = reverify.start_in(self.repo, probe.scratch.path, item.command, built.commit,
                                          admin=probe.scratch.admin, tree=probe.tree, timeout=item.timeout,
                                          network=item.job.spec.network, trusted=trusted)
        self.runs += 1
        probe.started = time.monotonic()
        threading.Thread(target=self._watch, args=(probe,), name="subtask-land-verify", daemon=True).start()
        self.progress()

    def _watch(self, probe: landwindow.Probe) -> None:
        """Wait for a verify's child to end (its reading and judging are the main thread's)."""
        try:
            if probe.pending.running is not None:
                probe.pending.running.wait()
        except BaseException:  # noqa: BLE001 - the main thread's `wait()` says what went wrong
            pass
        finally:
            self.answers.put(("done", probe))

    def answered(self, probe: landwindow.Probe, entry: landwindow.Entry | None = None) -> None:
        """A verify ended: its answer on its entry; a failure takes the job out of the chain (or
        cuts its batch), and the verifies after it stop."""
        entry = entry or next((e for e in self.line if e.probe is probe), None)
        if probe.dropped or entry is None:
            return
        if probe.rerun is None:
            pending, probe.pending = probe.pending, None
            probe.rerun = pending.wait()
            phases.mark("verify")
            result = probe.rerun.result
            result.command = redact(entry.item.command)  # a --verify as written never reaches a record
            result.key = probe.key
            if result.passed and (self.opts.verify or entry.item.trust and entry.item.trust.claims):
                probe.scratch.passed()  # a teammate's unsigned verify command may have changed it: never reused
            self.free.append(probe.scratch)
            probe.scratch = None
            self.known.add(result, entry.item.job.id)
            if not (entry.item.trust and entry.item.trust.owned):
                self.known.remember(result, entry.item.job.id)  # no record of ours will hold it
        if probe.passed:
            self.progress()
            return
        later = self.line[self.line.index(entry) + 1:]
        for other in later:
            self.drop_probe(other)  # built on a failure: their answers would say nothing
        if landwindow.culprit(self.line, entry):
            entry.failing = True
        self.progress()

    def drop_probe(self, entry: landwindow.Entry) -> None:
        """End the entry's verify if it still runs (an answer it has stays: it is its state's)."""
        probe = entry.probe
        if probe is None or not probe.running:
            return
        entry.probe = None
        probe.dropped = True
        if probe.ready is not None:
            return  # its scratch is still being checked out: `launch` frees it
        try:
            if probe.pending is not None:
                probe.pending.abort()
        finally:
            if probe.scratch is not None:
                probe.scratch.spoil()
                self.free.append(probe.scratch)

    def scratch(self) -> integrate.Scratch:
        """A scratch worktree nobody uses: a free one (one that passed first: it is reused as it
        is), else a new one."""
        if self.free:
            self.free.sort(key=lambda s: s.spoiled)
            return self.free.pop(0)
        made = integrate.Scratch(self.repo)
        self.scratches.append(made)
        return made

    # ------------------------------------------------------------ landing

    def settle(self) -> bool:
        """Land the verified prefix (one move of the target), report the failures that are final
        (every job ahead of them landed); True when anything changed."""
        changed = False
        while self.line:
            front = self.line[0]
            if front.built is None or front.onto != self.tip:
                break
            if front.failing:
                if front.built.kind == "conflict" and self.opts.reconcile and not front.reconciled:
                    self.reconcile_now(front)
                    return True
                if not front.judged:
                    self.verdict(front)
                    _record(self.repo, front.item)
                self.release(front.item)
                self.answer_handed(front.item, front.out)
                self.line.pop(0)
                changed = True
                continue
            last = landwindow.verified_prefix(self.line)
            if last is None:
                break
            commit = self.line[last].built.commit
            faults.point("land_verified")
            moved = move(self.repo, self.target, self.tip, commit) if commit != self.tip else "ok"
            if moved != "ok":
                self.moved_under(tip(self.repo, self.target))
                return True
            phases.mark("move")
            faults.point("land_moved")
            for n in range(last + 1):
                self.landing(self.line[n], self.line, n, commit)
            del self.line[:last + 1]
            self.tip = commit
            changed = True
        return changed

    def landing(self, entry: landwindow.Entry, line: list[landwindow.Entry], n: int, now_at: str) -> None:
        """One job of a prefix that moved: its outcome, its landing to record once finished."""
        cover = landwindow.covering(line, n)
        self.verdict(entry, cover)
        item, out = entry.item, entry.out
        if entry.built.kind == "already":
            self.finish_later(item, out, landing.merge_point(self.repo, item.head, entry.onto), now_at)
            return
        out.state = "landed"
        self.finish_later(item, out, entry.built.commit, now_at)

    def settle_atomic(self) -> bool:
        """--atomic: nothing moves until every job integrated and passed; the first job (in line
        order) that did not breaks the queue, the rest are not reached."""
        for n, entry in enumerate(self.line):
            if entry.built is None or (entry.needs_verify and (entry.probe is None or entry.probe.running)):
                if not entry.failing:
                    return False  # not all answered yet
            if entry.failing or (entry.needs_verify and entry.probe.passed is False):
                if any(e.needs_verify and e.probe is None for e in self.line[:n]) and self.batch:
                    continue  # a batch: its end answers for it
                self.broke(n)
                return True
        start, chain = self.tip, landwindow.chain_tip(self.line, self.tip)
        for n, entry in enumerate(self.line):
            self.verdict(entry, landwindow.covering(self.line, n))
        faults.point("land_verified")
        if move(self.repo, self.target, start, chain) != "ok":
            self.moves += 1
            for entry in self.line:
                entry.out.events.append(f"{self.target.name} moved while the queue was built: building it again")
            if self.moves >= MAX_REBUILDS:
                self.result.stopped = (f"{self.target.name} moved under each of {MAX_REBUILDS} builds of the queue: "
                                       "nothing landed")
                return True
            self.tip = tip(self.repo, self.target)
            return True
        faults.point("land_moved")
        for n, entry in enumerate(self.line):
            self.landing(entry, self.line, n, chain)
        self.line = []
        return True

    def broke(self, n: int) -> None:
        """--atomic: the job at `n` broke the queue: reported, those before it recorded as passed and
        not landed, those after it not reached."""
        entry = self.line[n]
        if not entry.judged:
            batch = not entry.failing and not landwindow.culprit(self.line, entry)
            self.verdict(entry)
            if batch:
                entry.out.why = "its batch failed on the integrated commit (it was not verified alone: --batch)"
            _record(self.repo, entry.item)
        for before in self.line[:n]:
            self.verdict(before, landwindow.covering(self.line, self.line.index(before)))
            before.out.why = f"not landed: {entry.item.job.id} broke the queue"
            _record(self.repo, before.item)
        for later in self.line[n + 1:]:
            self.drop_probe(later)
            later.out.state = "not reached"
        self.result.stopped = f"{entry.item.job.id} broke the queue ({entry.out.state}): nothing landed (--atomic)"

    def release(self, item: Item) -> None:
        liveness.release(item.fd)
        item.fd = None

    def progress(self, final: bool = False) -> None:
        """Tell `opts.progress` what the window is doing: elapsed, landed so far, each state
        verifying and for how long (a progress line must never end the queue)."""
        if self.opts.progress is None:
            return
        clock = time.monotonic()
        outcomes = self.result.outcomes
        snapshot = {"v": 1, "elapsed": round(clock - self.started, 1), "total": len(outcomes),
                    "landed": sum(1 for o in outcomes if o.state in ("landed", "already")),
                    "failed": sum(1 for o in outcomes if o.state in ("failed", "conflict", "refused")),
                    "verifying": [{"id": e.item.job.id, "seconds": round(clock - e.probe.started, 1)}
                                  for e in self.line if e.probe is not None and e.probe.running],
                    "window": self.width, "batch": self.batch or None, "runs": self.runs,
                    "reused": self.reused, "final": final}
        try:
            self.opts.progress(snapshot)
        except Exception:  # noqa: BLE001 - a broken progress line is not a broken queue
            pass

    # ------------------------------------------------------------ one job

    def gated(self, item: Item, out: Outcome) -> bool:
        """The job may land and its run-lock is ours (taken once)."""
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

    def checks_of(self, item: Item) -> list[dict]:
        """The job's own checks on its own change (did it delete a test?), as a re-run runs them:
        once per head, whatever the rebuilds, and whether or not there is a command to run."""
        on = (work_base(item.job), item.head, tuple(item.job.spec.checks or ()))
        if item.checked is None or item.checked[0] != on:
            item.checked = (on, checks.run(self.repo, on[0], on[1], list(on[2])))
        return item.checked[1]

    def verdict(self, entry: landwindow.Entry, cover: landwindow.Entry | None = None) -> None:
        """What the entry's build and verify (or the batch's that covers it) say: in its outcome,
        and in the landing its record gets (`item.entry`)."""
        item, out, built = entry.item, entry.out, entry.built
        repo, job = self.repo, item.job
        out.onto, out.commit, out.how = built.onto, built.commit, built.how
        out.verify, out.conflicts, out.sides, out.why, out.batch = None, [], {}, "", None
        batch = None
        if built.kind == "conflict":
            out.state, out.conflicts = "conflict", built.conflicts
            out.sides = integrate.sides(repo, job, item.head, built.onto, built.conflicts)
        elif built.kind == "failed":
            out.state, out.why = "failed", f"git could not integrate it: {built.why}"
        elif built.kind == "already":
            out.state = "already"
            return
        elif checks.failed(found := self.checks_of(item)):
            out.state = "failed"
            out.why = checks.failure_text(found) + (" (on its own change: --force skips the gate, never its checks)"
                                                    if not item.command else " (on its own change)")
        elif not item.command:  # --force: nothing to run, its checks passed
            out.state, out.why = "passed", "nothing was run on it (--force)"
        else:
            probe = entry.probe if entry.probe is not None else (cover.probe if cover is not None else None)
            rerun = probe.rerun if probe is not None else None
            if rerun is not None:
                out.verify, out.confined = rerun.result, rerun.confined
                out.state = "passed" if rerun.result.passed else "failed"
                out.why = "" if rerun.result.passed else "its verify failed on the integrated commit"
                if probe is not entry.probe:
                    batch = cover.built.commit
                    out.batch = str(repo.git[batch].tree_id)
                    out.why = f"verified as part of batch {out.batch[:7]} (its last state, {batch[:7]}: {cover.item.job.id})"
                elif rerun.result.reused and (words := _reused_words(rerun.result)) not in out.events:
                    out.events.append(words)  # said once, however often the entry is judged
            else:
                out.state, out.why = "failed", "its batch failed on the integrated commit"
        outcome = {"passed": "unverified" if out.verify is None and not batch else "passed"}.get(out.state, out.state)
        item.entry = Landing(at=now(), target=self.target.name, onto=built.onto, mode=self.opts.mode,
                             outcome=outcome, commit=built.commit, verify=out.verify, conflicts=built.conflicts,
                             batch=out.batch, batch_commit=batch)

    def finish_later(self, item: Item, out: Outcome, commit: str, now_at: str) -> None:
        """A landing that moved, finished (recorded, cleaned up) by a thread of its own while the
        window goes on: in the order they landed, on a repository handle of its own (pygit2
        objects are never shared between threads)."""
        if self.finisher is None:
            self.finisher = ThreadPoolExecutor(max_workers=FINISHERS, thread_name_prefix="subtask-land-finish")
            self.finisher_repo = self.repo.for_thread()
        self.landed.append(self.finisher.submit(self._finish_one, item, out, commit, now_at))

    def _finish_one(self, item: Item, out: Outcome, commit: str, now_at: str) -> None:
        try:
            self.finish(self.finisher_repo, item, out, commit, now_at)
        finally:
            liveness.release(item.fd)
            item.fd = None
            if item.handed is not None:
                before, item.handed = item.handed, None
                landfirst.answer(self.repo, item.job.id, self.handed_answer(before, out, after=now_at))
            phases.mark("finish")

    def finish_landed(self) -> None:
        """Wait until every landing made so far is finished; what went wrong in one is raised
        here, once all of them ended."""
        done, self.landed = self.landed, []
        for future in done:
            future.exception()  # waits
        for future in done:
            future.result()

    def finish(self, repo: Repo, item: Item, out: Outcome, commit: str, now_at: str) -> None:
        """Record the landing, clean up after it as `merge` does, land a group's pick."""
        job = item.job
        entry, item.entry = item.entry, None

        def mark(j: Job) -> None:
            if entry is not None:
                entry.landed = True
                j.state.landings = [*j.state.landings, entry][-KEEP_LANDINGS:]

        if item.trust and item.trust.owned:
            if self.checked_out is None:
                self.checked_out = landing.checked_out_branches(repo)
            lines = landing.finish_landed(repo, job, item.head, commit, landing.Target(self.target.name, now_at),
                                          held=True, also=mark, checked_out=self.checked_out)
            out.lines += (lines or [""])[1:]
        else:
            out.lines.append(landing.landed_elsewhere(repo, job, commit))
        if item.group is not None:
            out.lines += groups.pick_landed(repo, item.group, commit, self.target.name)[1]

    # ------------------------------------------------------------ conflicts

    def reconcile_now(self, entry: landwindow.Entry) -> None:
        """A conflict under `--reconcile`: judged (and recorded) once, then answered by a reply
        (`reconcile`); once that reply passed, the job is built again where it stands in the
        line, else the conflict as judged is its outcome (never judged a second time, on a
        branch the reply moved)."""
        item, out, built = entry.item, entry.out, entry.built
        entry.reconciled = entry.judged = True
        self.verdict(entry)
        _record(self.repo, item)
        self.finish_landed()  # before a reply that may take long
        if self.reconcile(item, built.onto, built, out):
            entry.built, entry.failing, entry.judged = None, False, False
            if self.opts.atomic:
                self.build(entry, built.onto)

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


def _queue_lock(repo: Repo, wait: float = QUEUE_LOCK_WAIT):
    """The land lock (one queue per repository): `take()` it (False when another holds it past
    `wait`), `release()` it."""
    repo.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    class _Lock:
        def __init__(self) -> None:
            self.lock = file_lock(repo.state_dir / paths.LAND_LOCK, timeout=wait)

        def take(self) -> bool:
            try:
                self.lock.acquire()
            except LockTimeout:
                self.lock = file_lock(repo.state_dir / paths.LAND_LOCK, timeout=0.0)  # later looks do not wait
                return False
            return True

        def release(self) -> None:
            self.lock.release()

    return _Lock()
