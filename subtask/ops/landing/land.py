"""`git subtask land`: many finished jobs landed in order, each verified on the commit that lands.

Each job is integrated on the one before it, from the target's tip (`integrate.py`), and up to
`--window` of those integrated states are verified at once, each in a scratch worktree (the window's
rules: `landwindow.py`; a result already known for the same tree is reused: `verified.py`); each
result is recorded in the job's record and note (this clone's jobs only), and the target moves, by
compare-and-swap against the tip the states were built on, to the end of the verified prefix. A
person committing meanwhile makes the states rebuild on their commit. The target's checkout, where
it has one, is moved as `merge` moves it: under `merge.index_lock`, never when it has uncommitted
changes, by `git merge --ff-only` (one git run moves the branch, the index and the files). With
`atomic` the target moves once, to the last integrated commit, only if every job integrated and
passed. `reconcile` answers a conflict with a reply to the job (its worktree moved onto the new tip;
a shell job's task run again) and lands it once that reply passed its verify.

Invariants:
- Never move the land target but by compare-and-swap against the tip a landing was built on
  (`update-ref` old value, or `git merge --ff-only` in its checkout after checking HEAD there under
  `index_lock`), because a commit a person made meanwhile must stay: the landing is built again on
  top of it and verified again (test: `landqueue::test_a_commit_a_person_makes_on_main_during_the_queue_is_kept`).
  The check there is of the branch checked out as well as its commit (one `git status`): a checkout
  switched to another branch at the same commit stops the queue, because `merge --ff-only` moves
  whatever is checked out
  (`landqueue::test_a_branch_switched_to_in_the_target_checkout_during_the_queue_is_never_moved`).
- Never write a teammate's record in `land` (`ownership`; a conflict is not reconciled either: the
  branch is theirs), because the records would diverge; their verify runs on the integrated commit
  all the same, which is the re-run `merge` would do for an unsigned record, and is reported only;
  one that lands is this clone's mark (`where_landed`), as after `merge`.
- Never land a job without running its checks on its own change (`work_base`..head), `--force`
  or not, a verify command or not, because `--force` skips the gate, not the checking of what
  lands: a job that deleted its failing test passes every command. They run once per head
  (`Queue.checks_of`), whatever the rebuilds
  (`landqueue::test_a_forced_landing_of_a_job_with_no_verify_command_still_runs_its_checks`).
- Never land a job with nothing to run on the integrated commit unless `force`, because landing
  many is only worth more than merging them one by one if what lands is what was tested.
- Never record a landing that lands before its move, because the move is the commit point: a kill
  at any step leaves the target before or after a whole landing (the integrated commit is built
  and verified off to the side, and the move is one ref update, or one `git merge --ff-only` in
  the checkout). It is recorded once, its verify and `landed` mark in one write, after the move
  (off the critical path, while the next job verifies); one that does not land is recorded at
  once. A kill between a move and its record leaves a landed job whose record lacks that verify:
  `cleanup --merged` (or the next `land`, "already": reachable, or patch-equivalent) records it
  as landed.

Lock order: `land.lock` (one queue per repository), then a job's run-lock (held while it lands,
so no reply starts meanwhile; let go while a reconciliation reply runs), then the target
checkout's `index_lock` (only around the move).
"""

from __future__ import annotations

import os
import time

from subtask.git.gitrepo import Repo
from subtask.model import phases
from subtask.model.errors import EXIT_FATAL, SubtaskError
from subtask.ops.landing import hotfix, integrate, verify_rerun
from subtask.ops.landing.lineup import (
    Item,
    LandResult,
    Options,
    Outcome,
    Replier,
    Target,
    _checkout_state,
    find_target,
    resolve,
    tip,
)
from subtask.ops.landing.queue import Queue
from subtask.state import liveness, paths, slots
from subtask.state.statefiles import LockTimeout, file_lock

RUN_LOCK_WAIT = 3.0
QUEUE_LOCK_WAIT = 10.0


QUEUE_LOCK_WAIT = 10.0
HANDED_POLL = 0.2  # seconds between looks for the answer of a queue a job was handed to


PROGRESS_TICK = 1.0  # seconds between progress reports while verifies run
MAX_WINDOW = 64



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
    queue.result.window, queue.result.batch = queue.width, opts.batch
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
        hotfix.ask(repo, job_id)
    answers: dict[str, dict] = {}
    try:
        while True:
            for job_id in ids:
                if job_id not in answers and (said := hotfix.answered(repo, job_id)) is not None:
                    answers[job_id] = said
            if len(answers) == len(ids):
                break
            if not lock.take():
                time.sleep(HANDED_POLL)
                continue
            try:  # no queue runs now: what it did not answer is landed here
                for job_id in ids:
                    if job_id not in answers and (said := hotfix.answered(repo, job_id)) is not None:
                        answers[job_id] = said
                rest = [item for item in items if item.job.id not in answers]
                for item in rest:
                    hotfix.take_back(repo, item.job.id)
                mine = run_queue(repo, target, rest, opts, replier) if rest else None
            finally:
                lock.release()
            for outcome in mine.outcomes if mine else []:
                answers[outcome.job] = {"outcome": outcome.to_dict()}
            break
    except BaseException:
        for job_id in ids:
            if job_id not in answers and hotfix.pending(repo, job_id):
                hotfix.take_back(repo, job_id)
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

    running = len(slots.read(repo.state_dir).running)
    free = repo.config.integer("maxRunning") - running
    return max(1, min(os.cpu_count() or 1, free, MAX_WINDOW))



def sweep_scratch(repo: Repo) -> None:
    """Remove the scratch worktrees a killed `land` left (under the queue lock: none is in use)."""
    folder = repo.worktree_dir() / integrate.SCRATCH
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        name = path.name.removesuffix(".tmp").removesuffix(verify_rerun.SIDE_SUFFIX)
        verify_rerun.remove_scratch(repo, path.with_name(name))



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
