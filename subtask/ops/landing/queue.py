"""The queue of `land` (land.py): its jobs built one on another, up to the window's width of the
integrated states verified at once, the target moved to the end of the verified prefix, each
landing recorded and cleaned up after; a conflict answered by a reply (`--reconcile`), `--atomic`.
The window's rules are window.py's; what a queue takes and answers, its target and its jobs,
lineup.py's. The queue's other invariants are land.py's.

Invariants:
- Never judge a state `land --batch` verifies by the tests of a job inside the batch (the
  harness comes from the target's tip), because that job was never verified on its own: its
  weakened test would judge its own broken code. Without batches a state is judged by the state
  it was built on, whose jobs each passed a verify of their own, or it is built again
  (`judge::test_a_batch_is_judged_by_the_targets_tests_never_by_a_job_inside_it`).
- Never record a landing a batch covered without that batch's tree and commit (`Landing.batch`,
  `batch_commit`), because its own commit was never verified: the record must name the state that
  vouches for it, and `show` says "verified as part of batch <tree>"
  (`landwindow::test_a_job_landed_by_a_batch_says_so_in_its_record`).
"""

from __future__ import annotations

import os
import queue as queue_module
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from subtask.git import checks, notes, records
from subtask.git.gitrepo import Repo, tree_of
from subtask.git.records import Job
from subtask.model import faults, phases
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.model.job import Landing, VerifyResult, now, work_base
from subtask.model.redact import redact
from subtask.ops.landing import (
    cleanup,
    conflict_reply,
    hotfix,
    integrate,
    landed,
    merge,
    verified,
    verify_rerun,
    window,
)
from subtask.ops.landing.lineup import (
    RUN_LOCK_WAIT,
    Item,
    LandResult,
    Options,
    Outcome,
    Replier,
    Stop,
    Target,
    gate,
    move,
    resolve,
    tip,
)
from subtask.ops.plans import groups
from subtask.proc import isolation
from subtask.state import liveness

KEEP_LANDINGS = 10  # landings kept per record, latest last


KEEP_LANDINGS = 10  # landings kept per record, latest last
MAX_REBUILDS = 5  # a target that moved under this many landings in a row stops the job


HANDED_POLL = 0.2  # seconds between looks for the answer of a queue a job was handed to
PROGRESS_TICK = 1.0  # seconds between progress reports while verifies run


MAX_WINDOW = 64
SCRATCH_MAKERS = 4  # scratch worktrees checked out at once, beside the verifies


SCRATCH_MAKERS = 4  # scratch worktrees checked out at once, beside the verifies
FINISHERS = 2  # landings finished at once (records, cleanup), beside the verifies



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
        self.line: list[window.Entry] = []
        self.tip = self.result.before  # the target as this queue last left or found it
        self.free: list[integrate.Scratch] = []
        # ("ready" | "done", probe): a scratch checked out, a verify ended
        self.answers: queue_module.Queue[tuple[str, window.Probe]] = queue_module.Queue()
        self.known = verified.Known(self.repo)
        self.width = self.opts.window or 1
        self.batch = self.opts.batch or 0
        self.started = time.monotonic()
        self.runs = 0  # verifies started
        self.reused = 0
        self.moves = 0  # moves of the target that did not take (a person's commit): --atomic's rebuilds
        self.makers: ThreadPoolExecutor | None = None  # threads checking scratches out (git only)
        # The thread finishing landings, and its own repository handle (`finish_later`).
        self.finisher: tuple[ThreadPoolExecutor, Repo] | None = None
        self.items: list[Item] = []  # every job it holds, those handed to it (`land --first`) too

    # ------------------------------------------------------------ the loop

    def run(self, items: list[Item]) -> None:
        """Land the line (see the class docstring); --atomic moves the target once, at the end,
        only if every job integrated and passed."""
        self.line = [window.Entry(item, out) for item, out in zip(items, self.result.outcomes, strict=True)]
        try:
            while self.line and not self.result.stopped:
                changed = self.plan()
                changed = (self.land_atomic() if self.opts.atomic else self.land_verified()) or changed
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
                self.finisher[0].shutdown(wait=True)  # every landing finished (what failed: `finish_landed`)
            self.progress(final=True)

    def plan(self) -> bool:
        """Build what the window needs and start the verifies it has room for; True when anything
        changed."""
        changed = self.take_handed()
        now = tip(self.repo, self.target)
        if now != self.tip and not self.opts.atomic:
            self.moved_under(now)
            changed = True
        for entry in window.stale(self.line, self.tip):
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
            self.build(entry, window.chain_tip(self.line, self.tip))
            self.start_wanted()  # the first verifies start while the rest is built
            self.handle(block=False)
            changed = True
        return self.start_wanted() or changed

    def start_wanted(self) -> bool:
        started = False
        for entry in window.wanted(self.line, self.batch):
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
        taken = hotfix.take(self.repo)
        for job_id in reversed(taken):
            entry = next((e for e in self.line if e.item.job.id == job_id), None)
            if entry is not None:
                self.line.remove(entry)
            else:
                done = next((o for o in self.result.outcomes if o.job == job_id), None)
                if done is not None:  # it ended in this queue already
                    hotfix.answer(self.repo, job_id, self.handed_answer(self.tip, done))
                    continue
                try:
                    item = resolve(self.repo, [job_id])[0]
                except SubtaskError as exc:
                    out = Outcome(job_id)
                    _refused(out, exc)
                    hotfix.answer(self.repo, job_id, self.handed_answer(self.tip, out))
                    continue
                entry = window.Entry(item, Outcome(item.job.id, item.group.id if item.group else None))
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
        hotfix.answer(self.repo, item.job.id, self.handed_answer(before, out))

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

    def build(self, entry: window.Entry, onto: str) -> None:
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

    def reset(self, entry: window.Entry) -> None:
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

    def start_probe(self, entry: window.Entry) -> None:
        """Verify the entry's state: a known answer for its key, else its verify started in a
        scratch worktree checked out at it."""
        item, built = entry.item, entry.built
        tree = tree_of(self.repo, built.commit)
        asked = verify_rerun.asked_harness(item.job, bool(item.trust and item.trust.vouched))
        confined = isolation.support().available
        trusted = self.judge_of(entry)
        key = verified.key_of(self.repo, tree=tree, command=redact(item.command), trusted=trusted, asked=asked,
                              confined=confined, network=item.job.spec.network)
        found = self.known.find(key) if self.opts.reuse else None
        if found is not None:
            entry.probe = window.Probe(key, reused=True, rerun=verify_rerun.Rerun(found.reused(), confined))
            self.reused += 1
            self.answered(entry.probe, entry)
            return
        probe = entry.probe = window.Probe(key, tree=tree, asked=asked, trusted=trusted)
        probe.scratch = self.scratch()
        if self.makers is None:
            self.makers = ThreadPoolExecutor(max_workers=min(self.width, SCRATCH_MAKERS),
                                             thread_name_prefix="subtask-land-scratch")
        probe.ready = self.makers.submit(probe.scratch.at, built.commit)
        probe.ready.add_done_callback(lambda _done, p=probe: self.answers.put(("ready", p)))

    def judge_of(self, entry: window.Entry) -> str:
        """The commit whose harness judges the entry's state, never the job's own: the state it
        was built on, whose jobs' tests each passed a verify of their own judged the same way
        (or will, else this state is built again); with batches, the target's tip, because a
        job inside a batch was never judged on its own, so its tests may judge nothing."""
        return self.tip if self.batch else entry.built.onto

    def launch(self, probe: window.Probe) -> None:
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
        trusted = verify_rerun.Trusted(probe.asked, probe.trusted, "target", self.target.name)
        probe.pending = verify_rerun.start_in(self.repo, probe.scratch.path, item.command, built.commit,
                                          admin=probe.scratch.admin, tree=probe.tree, timeout=item.timeout,
                                          network=item.job.spec.network, trusted=trusted)
        self.runs += 1
        probe.started = time.monotonic()
        threading.Thread(target=self._watch, args=(probe,), name="subtask-land-verify", daemon=True).start()
        self.progress()

    def _watch(self, probe: window.Probe) -> None:
        """Wait for a verify's child to end (its reading and judging are the main thread's)."""
        try:
            if probe.pending.running is not None:
                probe.pending.running.wait()
        except BaseException:  # noqa: BLE001 - the main thread's `wait()` says what went wrong
            pass
        finally:
            self.answers.put(("done", probe))

    def answered(self, probe: window.Probe, entry: window.Entry | None = None) -> None:
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
        if window.culprit(self.line, entry):
            entry.failing = True
        self.progress()

    def drop_probe(self, entry: window.Entry) -> None:
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

    def land_verified(self) -> bool:
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
            last = window.verified_prefix(self.line)
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

    def landing(self, entry: window.Entry, line: list[window.Entry], n: int, now_at: str) -> None:
        """One job of a prefix that moved: its outcome, its landing to record once finished."""
        cover = window.covering(line, n)
        self.verdict(entry, cover)
        item, out = entry.item, entry.out
        if entry.built.kind == "already":
            self.finish_later(item, out, landed.merge_point(self.repo, item.head, entry.built.onto), now_at)
            return
        out.state = "landed"
        self.finish_later(item, out, entry.built.commit, now_at)

    def land_atomic(self) -> bool:
        """--atomic: nothing moves until every job integrated and passed; the first job (in line
        order) that did not breaks the queue, the rest are not reached."""
        for n, entry in enumerate(self.line):
            if entry.built is None or (entry.needs_verify and (entry.probe is None or entry.probe.running)):
                if not entry.failing:
                    return False  # not all answered yet
            if entry.failing or (entry.needs_verify and entry.probe is not None
                                 and entry.probe.passed is False):
                if any(e.needs_verify and e.probe is None for e in self.line[:n]) and self.batch:
                    continue  # a batch: its end answers for it
                self.broke(n)
                return True
        start, chain = self.tip, window.chain_tip(self.line, self.tip)
        for n, entry in enumerate(self.line):
            self.verdict(entry, window.covering(self.line, n))
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
            batch = not entry.failing and not window.culprit(self.line, entry)
            self.verdict(entry)
            if batch:
                entry.out.why = "its batch failed on the integrated commit (it was not verified alone: --batch)"
            _record(self.repo, entry.item)
        for before in self.line[:n]:
            self.verdict(before, window.covering(self.line, self.line.index(before)))
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
        out.job = item.job.id  # a group's pick, once concluded
        return True

    def checks_of(self, item: Item) -> list[dict]:
        """The job's own checks on its own change (did it delete a test?), as a re-run runs them:
        once per head, whatever the rebuilds, and whether or not there is a command to run."""
        on = (work_base(item.job), item.head, tuple(item.job.spec.checks or ()))
        if item.checked is None or item.checked[0] != on:
            item.checked = (on, checks.run(self.repo, on[0], on[1], list(on[2])))
        return item.checked[1]

    def verdict(self, entry: window.Entry, cover: window.Entry | None = None) -> None:
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
            # the entry has no verify of its own: its batch's last state answers for it
            covered_by = cover if entry.probe is None and cover is not None else None
            probe = covered_by.probe if covered_by is not None else entry.probe
            rerun = probe.rerun if probe is not None else None
            if rerun is not None:
                out.verify, out.confined = rerun.result, rerun.confined
                out.state = "passed" if rerun.result.passed else "failed"
                out.why = "" if rerun.result.passed else "its verify failed on the integrated commit"
                if covered_by is not None:
                    batch = covered_by.built.commit
                    out.batch = tree_of(repo, batch)
                    out.why = (f"verified as part of batch {out.batch[:7]} "
                               f"(its last state, {batch[:7]}: {covered_by.item.job.id})")
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
            pool = ThreadPoolExecutor(max_workers=FINISHERS,
                                      thread_name_prefix="subtask-land-finish")
            self.finisher = (pool, self.repo.for_thread())
        pool, repo = self.finisher
        self.landed.append(pool.submit(self._finish_one, repo, item, out, commit, now_at))

    def _finish_one(self, repo: Repo, item: Item, out: Outcome, commit: str, now_at: str) -> None:
        try:
            self.finish(repo, item, out, commit, now_at)
        finally:
            liveness.release(item.fd)
            item.fd = None
            if item.handed is not None:
                before, item.handed = item.handed, None
                hotfix.answer(self.repo, item.job.id, self.handed_answer(before, out, after=now_at))
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
                self.checked_out = cleanup.checked_out_branches(repo)
            lines = cleanup.finish_landed(repo, job, item.head, commit, landed.Target(self.target.name, now_at),
                                          held=True, also=mark, checked_out=self.checked_out)
            out.lines += (lines or [""])[1:]
        else:
            out.lines.append(merge.landed_elsewhere(repo, job, commit))
        if item.group is not None:
            out.lines += groups.pick_landed(repo, item.group, commit, self.target.name)[1]

    # ------------------------------------------------------------ conflicts

    def reconcile_now(self, entry: window.Entry) -> None:
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
        """Answer a conflict with a reply to the job, on `onto` (`conflict_reply.prepare`); True once
        that reply ended done with its verify passed (the job is then ready to build again)."""
        repo, job = self.repo, item.job
        if not (item.trust and item.trust.owned) or self.replier is None:
            out.events.append("not reconciled: another clone's job (its branch is theirs)")
            return False
        try:
            message = conflict_reply.prepare(repo, job, item.head, onto, self.target.name, built.conflicts,
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
            item.head = merge.check_mergeable(repo, fresh, self.opts.force, item.trust.claims)
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
