"""`wait`: block until jobs (or groups) end, waking on their run-locks, never by polling them.

Invariants:
- Never let `wait` return on an ended record while the job's run-lock is still held, because the
  worker writes that record before its wrap-up (note, reservation, slot): `wait && git log
  --notes=subtask` missed the note, and `wait && cleanup` answered "left for a later pass". A
  reply's starter holds the same lock before it appends its attempt, so a new attempt ends that
  wait too, and it never waits longer than `WRAP_UP_WAIT` (`tests/test_jobs.py`).
- Never let one of `wait`'s watcher threads end without a report, because `wait` would wait for it
  forever: any failure is handed to the waiting thread, which raises it.
- Never read which of a group's members still run after concluding the group, because a member
  that ends between the two is then neither concluded nor waited on: `wait --any JOB GROUP` hung
  on the job alone (CI, twice); the members are read first
  (`tests/test_git_habits.py::test_wait_any_over_a_mix_sees_members_that_end_while_it_concludes`).
"""

from __future__ import annotations

import itertools
import json
import os
import time

from subtask.api.read import _groups, _positive, _tail_lines, latest_activity, sweep
from subtask.git import records
from subtask.git.gitrepo import Repo, open_repo
from subtask.git.records import Job
from subtask.model import faults
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.model.job import WAITING, is_group_ref, job_passed, runs_remotely
from subtask.state import liveness, paths, slots

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    import queue
    import threading

    from subtask.ops.running.feed import Feed
    from subtask.state.statefiles import StrPath


@dataclass
class WaitResult:
    """What `wait` answers for jobs: each as it ended, or as it stands when the wait timed out."""

    jobs: list[Job]
    timed_out: bool
    stalled: list[str] = field(default_factory=list)  # running, but their engines went silent (`Attempt.stalled`)
    feed: Feed | None = None  # `wait --since`: the events after the cursor and the next cursor

    @property
    def all_passed(self) -> bool:
        return not self.timed_out and all(job_passed(j) for j in self.jobs)


QUEUED_FILL_INTERVAL = 1.0  # seconds between a waiter's fills of idle slots for a queued job


WAITING_LOOK = 0.25  # seconds between `wait`'s looks at a waiting job none of whose jobs runs yet


STALL_LOOK = 0.25  # seconds between looks at the waited jobs' events files, for a stall
RECORD_LOOKS = 8  # `wait --since` reads the record refs every 8th look (2 s): what only they say


WRAP_UP_WAIT = 60.0  # seconds `wait` gives an ended job's worker to let go of it
WRAP_UP_RECORD_LOOK = 0.1  # seconds between its looks for a reply's new attempt meanwhile
QUEUED_LOOK = 0.25  # seconds between `wait`'s reads of a queued job's record (its run-lock: every 20 ms)


def wait(repo: Repo, ids: list[str], timeout: float | None = None, any_: bool = False,
         on_tick=None, tick: float = 1.0, stalls: bool | set[str] = True,
         since: str | None = None) -> WaitResult:
    """Block until the jobs end (or one, with `any_`), waking on run-lock release, not by polling.

    A running job marked stalled (its engine silent for `subtask.stallAfter`) counts as answered
    too, unless `stalls` is False (or a set of job ids that leaves it out: a group's members,
    beside jobs): the caller is told, and decides (stop it, or wait again).
    `on_tick(elapsed, jobs_ended, total, activities)` is called about every `tick` seconds while
    waiting (the MCP server sends progress notifications from it).

    `since` (a cursor, `0` for the beginning; `ops.feed`): answer as soon as any job has an event
    after it, or as `wait` would; `feed` then holds those events and the cursor after them.
    """
    if since is not None:
        if timeout is not None:
            timeout = _positive(timeout, "--timeout")  # refused even when events answer at once
        return _wait_since(repo, ids, since, timeout=timeout, any_=any_, on_tick=on_tick, tick=tick)
    return _wait(repo, ids, timeout=timeout, any_=any_, on_tick=on_tick, tick=tick, stalls=stalls)


def _wait_since(repo: Repo, ids: list[str], since: str, **options) -> WaitResult:
    from subtask.ops.running import feed

    positions = feed.parse(since)  # a bad cursor is refused before anything is read
    if not ids:
        raise SubtaskError("usage", "wait needs at least one job id")
    job_ids = list(dict.fromkeys(records.resolve(repo, i) for i in ids))
    found = feed.collect(repo, job_ids, positions)
    if found.events or found.more:
        jobs = [records.read(repo, job_id) for job_id in job_ids]
        return WaitResult(jobs, timed_out=False, stalled=[], feed=found)

    looks = itertools.count()  # the record refs every RECORD_LOOKS-th look, the events files every look
    result = _wait(repo, job_ids, wake=lambda: feed.grew(repo, job_ids, positions,
                                                         records_too=next(looks) % RECORD_LOOKS == 0), **options)
    result.feed = feed.collect(repo, job_ids, positions)
    return result


def _wait(repo: Repo, ids: list[str], timeout: float | None = None, any_: bool = False,
          on_tick=None, tick: float = 1.0, stalls: bool | set[str] = True, wake=None) -> WaitResult:
    """`wait` without a cursor; `wake()`, asked every STALL_LOOK seconds, ends it early when True."""
    if not ids:
        raise SubtaskError("usage", "wait needs at least one job id")
    if timeout is not None:  # 0: look once, as a poll
        timeout = _positive(timeout, "--timeout", zero=True)
    job_ids = list(dict.fromkeys(records.resolve(repo, i) for i in ids))
    first_read = [records.read(repo, job_id) for job_id in job_ids]  # a damaged record is named now, not waited on
    if all(j.state.current.terminal and not liveness.is_held(repo.state_dir_str, j.id) for j in first_read):
        return WaitResult(first_read, timed_out=False, stalled=[])  # all ended and let go of: no watcher needed
    import queue  # a wait that blocks: its watchers are threads
    import threading

    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    ended: queue.Queue[tuple[str, Job | BaseException]] = queue.Queue()
    cancel = threading.Event()
    for job in first_read:
        threading.Thread(target=_watch_one, args=(repo.for_thread(), job, ended, cancel), daemon=True).start()
    done: dict[str, Job] = {}
    watched = [j for j in first_read if stalls is True or (stalls and j.id in stalls)]
    stalled = _StallLook(repo, watched) if watched else None
    needed = 1 if any_ else len(job_ids)
    next_tick = started + tick
    next_wake = started if wake else None
    try:
        while len(done) + len(stalled.found if stalled else ()) < needed:
            now_ = time.monotonic()
            if deadline is not None and now_ >= deadline:
                break
            if next_wake is not None and now_ >= next_wake:
                next_wake = now_ + STALL_LOOK
                if wake():
                    break
            if on_tick and now_ >= next_tick:
                next_tick = now_ + tick
                on_tick(now_ - started, len(done), len(job_ids),
                        {j: latest_activity(repo, j) for j in job_ids if j not in done})
            if stalled is not None and stalled.look(done, now_):
                continue
            until = min(t for t in (deadline, next_tick if on_tick else None, now_ + 3600, next_wake,
                                    stalled.next_look if stalled else None) if t is not None)
            try:
                job_id, seen = ended.get(timeout=max(0.0, until - now_))
            except queue.Empty:
                continue
            if isinstance(seen, BaseException):
                raise seen  # its watcher could not read it: say why, never wait on
            done[job_id] = seen
    finally:
        cancel.set()  # watcher threads stop at their next look
    jobs = [done[j] if j in done else records.read(repo, j) for j in job_ids]  # an ended state is final
    found = [j.id for j in jobs if stalled and j.id in stalled.sizes and j.id not in done
             and j.state.current.stalled and not j.state.current.terminal]
    # Read again, a job found stalled may have ended meanwhile (stallAction stop), or spoken again:
    # only a deadline that passed is a timeout.
    answered = sum(1 for j in jobs if j.state.current.terminal) + len(found)
    timed_out = deadline is not None and time.monotonic() >= deadline and answered < needed
    return WaitResult(jobs, timed_out=timed_out, stalled=found)


class _StallLook:
    """`wait`'s look for stalled jobs, every STALL_LOOK seconds: a stat of each job's events file,
    its tail read only when it grew, the record only when the tail's last word on stalls is
    "stalled" (the stall watch records it before it says it). The ends still wake `wait` at once
    through the run-locks; a stall is a fact that no lock announces."""

    def __init__(self, repo: Repo, jobs: list[Job]):
        self.repo = repo
        self.sizes: dict[str, int | None] = {job.id: None for job in jobs}
        self.found: set[str] = set()
        self.next_look = time.monotonic()

    def look(self, done: dict[str, Job], now_: float) -> bool:
        """Look if it is time; True when a job was found stalled (or no longer stalled)."""
        if now_ < self.next_look:
            return False
        self.next_look = now_ + STALL_LOOK
        changed = False
        for job_id, seen in self.sizes.items():
            if job_id in done:
                continue
            path = paths.run_file(self.repo.state_dir_str, job_id, "events.jsonl", make=False)
            try:
                size = os.stat(path).st_size
            except OSError:
                continue
            if size == seen:
                continue
            self.sizes[job_id] = size
            stalled = _last_stall_event(path) == "stalled"
            if stalled:
                attempt = records.read(self.repo, job_id).state.current
                stalled = bool(attempt.stalled) and not attempt.terminal
            if stalled != (job_id in self.found):
                (self.found.add if stalled else self.found.discard)(job_id)
                changed = True
        return changed


def _last_stall_event(path: str) -> str | None:
    """"stalled" or "stall_ended", whichever the events file's tail says last (None: neither)."""
    for line in reversed(_tail_lines(path)):
        if '"stall' not in line:
            continue
        try:
            kind = json.loads(line).get("type")
        except (ValueError, AttributeError):
            continue
        if kind in ("stalled", "stall_ended"):
            return kind
    return None


def _watch_one(repo: Repo, job: Job, ended: queue.Queue, cancel: threading.Event) -> None:
    """Report (its id, the job) on `ended` when `job`'s current attempt is terminal (as read, or
    once read again). Runs in its own thread.

    Any failure (a record damaged while we wait) is reported as (`job_id`, error) rather than
    ending the thread silently, because `wait` would then wait for a report that never comes.
    """
    try:
        _watch_until_ended(repo, job, ended, cancel)
    except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, which raises it
        ended.put((job.id, exc))


def _watch_until_ended(repo: Repo, job: Job, ended: queue.Queue, cancel: threading.Event) -> None:
    state_dir, job_id = repo.state_dir_str, job.id
    next_fill = 0.0
    latest: Job | None = job  # as `wait` read it; read again at each later look
    while not cancel.is_set():
        latest = latest or records.read(repo, job_id)
        if latest.state.current.terminal:
            ended.put((job_id, _after_wrap_up(repo, latest, cancel)))
            return
        if latest.state.current.state == WAITING:
            # Nothing holds a waiting job: look again now and then, moving it on when it can be
            # (the worker that ends the last job it waits for does it too, at once).
            latest = None
            if time.monotonic() >= next_fill:
                next_fill = time.monotonic() + QUEUED_FILL_INTERVAL
                sweep(open_repo(repo.root_str))
            running = _running_dependency(state_dir, job_id)
            if running is not None:
                liveness.wait_released(state_dir, running)  # in the kernel until its worker lets go
            else:
                time.sleep(WAITING_LOOK)
            continue
        if runs_remotely(latest):
            from subtask import executors  # its executor's status (Ray: at most once a second)

            executors.of(latest).backend().watch(repo, job_id, cancel)
            latest = None
            continue
        latest = None
        if liveness.is_held(state_dir, job_id):
            liveness.wait_released(state_dir, job_id)
            continue
        if slots.read(state_dir).position(job_id) is None:
            sweep(repo)  # not queued and no worker: it died (end it), or its mover did (move it on)
            from subtask.ops.running import lifecycle

            lifecycle.end_orphan(repo, job_id)  # ... even when no slot entry is left to reap
        else:
            if time.monotonic() >= next_fill:
                # Queued: fill idle slots now and then, with the settings as they are now (a fixed
                # maxRunning must take effect without another command).
                next_fill = time.monotonic() + QUEUED_FILL_INTERVAL
                from subtask.ops.running import lifecycle

                lifecycle.reconcile(open_repo(repo.root_str))
            _until_held(state_dir, job_id, QUEUED_LOOK, cancel)
            continue
        time.sleep(0.02)


def _until_held(state_dir: StrPath, job_id: str, seconds: float, cancel: threading.Event) -> None:
    """Return once a worker holds the queued job's run-lock, or after `seconds`: a look at the
    lock is a syscall, a look at the record git processes (50 a second each, on a loaded machine
    they starved the workers a `wait` waited for)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until and not cancel.is_set() and not liveness.is_held(state_dir, job_id):
        time.sleep(0.02)


def _running_dependency(state_dir: StrPath, job_id: str) -> str | None:
    """A job the waiting `job_id` waits for whose worker runs now (its run-lock is held), if any."""
    for entry in slots.read(state_dir).waiting:
        if entry["job"] == job_id:
            return next((other for other in entry["until"] if liveness.is_held(state_dir, other)), None)
    return None


def _after_wrap_up(repo: Repo, job: Job, cancel: threading.Event) -> Job:
    """`job`, whose attempt ended, once its worker has let go of it.

    A worker writes the terminal record before its wrap-up (the note, the reservation, the slot)
    and releases the run-lock after it: a caller's next step (`git log --notes=subtask`, cleanup)
    must find all of it done. A reply's starter holds the same lock before it appends its attempt:
    a new attempt ends the wait, and so does WRAP_UP_WAIT, so a stuck holder never keeps us.
    """
    deadline = time.monotonic() + WRAP_UP_WAIT
    if liveness.is_held(repo.state_dir_str, job.id):
        faults.point("wait_found_busy")
    next_read = 0.0
    while liveness.is_held(repo.state_dir_str, job.id) and time.monotonic() < deadline and not cancel.is_set():
        time.sleep(0.005)  # a look at the lock is a syscall; a look at the record, git processes:
        if time.monotonic() >= next_read:  # every 5 ms they starved the worker on a loaded machine
            next_read = time.monotonic() + WRAP_UP_RECORD_LOOK
            if records.read(repo, job.id).state.current.n != job.state.current.n:
                break
    return job


@dataclass
class GroupWait:
    """What `wait` answers for groups (`wait_groups`): each as concluded once its members ended."""

    groups: list  # groups.Group, concluded where their members ended
    timed_out: bool

    @property
    def all_picked(self) -> bool:
        """Every group has a passing pick (a map: every job passed)."""
        return not self.timed_out and all(_groups().passed_group(g) for g in self.groups)


def wait_groups(repo: Repo, gids: list[str], timeout: float | None = None, on_tick=None,
                tick: float = 1.0) -> GroupWait:
    """Block until every member of the groups has ended, then conclude each group (exit 0: a passing pick)."""
    groups = _groups()
    found = [groups.read(repo, groups.resolve(repo, g))[0] for g in gids]
    pending = [m for g in found for m in g.members if repo.objects.ref(records.record_ref(m)) is not None]
    if timeout is not None:
        timeout = _positive(timeout, "--timeout", zero=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    timed_out = False
    while pending and not timed_out:
        # Each end may decide a group (a first pass stops the rest): conclude, then wait for the others.
        left = None if deadline is None else max(0.01, deadline - time.monotonic())
        # A stalled member does not end a group's wait: the group waits for its members' ends.
        timed_out = wait(repo, pending, timeout=left, any_=True, on_tick=on_tick, tick=tick, stalls=False).timed_out
        for group in found:
            groups.conclude(repo, group.id)
        pending = [m for m in pending if not records.read(repo, m).state.current.terminal]
    concluded = [groups.conclude(repo, g.id, wait_for_workers=not timed_out) for g in found]
    return GroupWait(concluded, timed_out and not all(g.terminal for g in concluded))


@dataclass
class MixedWait:
    """`wait` over job ids and group ids: what each part answers, as its own `wait` would."""
    jobs: WaitResult | None
    groups: GroupWait | None

    @property
    def timed_out(self) -> bool:
        return any(part.timed_out for part in (self.jobs, self.groups) if part is not None)

    @property
    def passed(self) -> bool:
        return ((self.jobs is None or self.jobs.all_passed)
                and (self.groups is None or self.groups.all_picked))


def wait_ids(repo: Repo, ids: list[str], timeout: float | None = None, any_: bool = False,
             on_tick=None, tick: float = 1.0, since: str | None = None) -> MixedWait:
    """`wait` for any mix of job ids and group ids (`sg-…`): until every job has ended (or
    stalled) and every group is concluded, or with `any_` until the first of them has. With
    `since` (a cursor, `ops.feed`), jobs only: their events after it (`wait`)."""
    if not ids:
        raise SubtaskError("usage", "wait needs at least one job id")
    gids = [i for i in ids if is_group_ref(i)]
    jids = [i for i in ids if not is_group_ref(i)]
    if since is not None:
        if gids:
            raise SubtaskError("usage", "wait --since takes job ids, not a group's",
                               hint=f"git subtask show {gids[0]} names its jobs")
        return MixedWait(wait(repo, jids, timeout, any_, on_tick=on_tick, tick=tick, since=since), None)
    if not gids:
        return MixedWait(wait(repo, jids, timeout, any_, on_tick=on_tick, tick=tick), None)
    if not jids and not any_:
        return MixedWait(None, wait_groups(repo, gids, timeout, on_tick=on_tick, tick=tick))
    return _wait_mixed(repo, jids, gids, timeout, any_, on_tick, tick)


def _wait_mixed(repo: Repo, jids: list[str], gids: list[str], timeout: float | None, any_: bool,
                on_tick, tick: float) -> MixedWait:
    """One `wait` on the jobs and the groups' unended members at a time, first answer first; each
    answer concludes the groups it may decide. A stalled job answers; a stalled member does not (a
    group waits for its members' ends, as `wait_groups` does)."""
    groups = _groups()
    job_ids = list(dict.fromkeys(records.resolve(repo, i) for i in jids))
    gids = list(dict.fromkeys(groups.resolve(repo, g) for g in gids))
    found = [groups.read(repo, gid)[0] for gid in gids]
    for job_id in job_ids:
        records.read(repo, job_id)  # a damaged record is named now, not waited on
    deadline = None if timeout is None else time.monotonic() + _positive(timeout, "--timeout")
    answered: set[str] = set()
    concluded: set[str] = set()
    timed_out = False
    while True:
        # The members are read before the groups are concluded: one that ends between the two is
        # then seen by the conclusion, or waited on, never neither (`wait` hung on the jobs alone).
        unended = {g.id: [m for m in g.members if repo.objects.ref(records.record_ref(m)) is not None
                          and not records.read(repo, m).state.current.terminal]
                   for g in found if g.id not in concluded}
        concluded.update(gid for gid in unended if groups.conclude(repo, gid).terminal)
        if any_ and (answered or concluded):
            break
        faults.point("wait_after_conclude")
        pending = [j for j in job_ids if j not in answered]
        members = [m for gid, left in unended.items() if gid not in concluded for m in left]
        if not pending and not members:
            break
        left = None if deadline is None else max(0.01, deadline - time.monotonic())
        result = wait(repo, pending + members, timeout=left, any_=True, on_tick=on_tick, tick=tick,
                      stalls=set(pending))
        answered.update(j.id for j in result.jobs if j.id in pending
                        and (j.state.current.terminal or j.id in result.stalled))
        if result.timed_out:
            timed_out = True
            break
    jobs = [records.read(repo, j) for j in job_ids]
    stalled = [j.id for j in jobs if j.id in answered and not j.state.current.terminal]
    ended = [groups.conclude(repo, g.id, wait_for_workers=not timed_out) for g in found]
    nothing = timed_out and not (any_ and (answered or any(g.terminal for g in ended)))
    jobs_part = WaitResult(jobs, nothing and len(answered) < len(job_ids), stalled)
    groups_part = GroupWait(ended, nothing and not all(g.terminal for g in ended))
    return MixedWait(jobs_part if job_ids else None, groups_part)
