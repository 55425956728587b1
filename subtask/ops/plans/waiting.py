"""Jobs that wait for jobs (`start --after`): recorded at once, started once what they wait for ended.

A job started `--after` others (jobs, or groups: a best-of group's pick, every member of a map)
is recorded `waiting`: its record and ownership ref, its words as written (`privatetext`) and its
starter's environment (`jobenv`), and an entry in slots.json's `waiting` list naming the jobs it
waits for (`until`). No branch, no slot, no reservation, no process: nothing has to stay alive.

Whoever next sees none of those jobs in slots.json (every command's sweep, the worker that ended
the last of them, `wait`, `stop`, the start itself) calls `advance`, which moves each such job on
(`move_on`): under the job's run-lock, with its record read again there,
- while one of the jobs it waits for has not ended (a Ray job, another clone's), nothing;
- one did not end `done` with verify passed (and `spec.on_fail` is not `run`): `skipped`, naming it;
- else its base is the head of the one it waits for, or the integration of their heads (a merge
  commit made with `git merge-tree`; a conflict ends it `failed`, naming the files);
- then: its branch and base pin at that base; its record `waiting -> queued` with that base, by
  compare-and-swap (the commit point); admission (a slot or the queue, and its reservation, taken
  now); its `waiting` entry removed; its worker spawned when it got a slot.

Invariants:
- Never move a waiting job on but under its run-lock with its record re-read there, and never
  from any state but `waiting` (the record update refuses any other), because the worker that
  ended the last job it waits for, a `list` and a `wait` may all see it ready at once: exactly
  one starts it (or skips it); the others find the lock busy or the record moved on.
- Never take a waiting job's slot or money before its record says `queued` (its base written with
  it), because a mover killed in between would leave a reservation for a job still waiting; a
  mover killed before that leaves it waiting (its branch, still at the base, reused), one killed
  after it a `queued` job whose `waiting` entry says its admission is still to come, which the
  next `move_on` completes and `end_orphan` leaves alone
  (`plans::test_a_mover_killed_while_starting_a_waiter_leaves_it_to_the_next_command`).
- Never decide from slots.json that what a job waits for has ended, because a Ray job or another
  clone's holds no slot here: the file only says which waiting jobs to look at; their records say
  whether, and how, what they wait for ended.
- Never give a waiting job a reservation id in its record before the ledger holds this
  repository's mark, because a ledger rebuilt from the records would open that reservation and the
  start's own would then be refused as a duplicate: `spending.sync_ledger` runs first.
"""

from __future__ import annotations

import sys
import time
import warnings
from types import SimpleNamespace

from subtask import words as render
from subtask.engines import get_engine
from subtask.git import ownership, records
from subtask.git.gitobjects import commit_tree
from subtask.git.gitrepo import Repo, git
from subtask.git.records import Job
from subtask.model import executors, faults, money
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.model.job import WAITING, Cost, job_passed, now
from subtask.model.transaction import Transaction
from subtask.ops.running import admission, lifecycle, spending
from subtask.state import jobenv, ledger, liveness, paths, privatetext, slots

MAX_ROUNDS = 100  # passes of `advance`: each job it ends may let the next one in a chain move on
LOCK_TRIES = 5  # a liveness probe holds a run-lock (shared) for microseconds: a few tries tell it apart
STOP_WAIT = 30.0  # seconds `stop` waits for whoever is moving the job on to finish
CONFLICT_NAMES = 20


# ---------------------------------------------------------------- what a job waits for

def resolve_after(repo: Repo, names: list[str]) -> tuple[list[str], list[str]]:
    """(the ids `--after` names, whole; the jobs to see end: each job, each group's members).

    A job id or a unique prefix of one (st-…), or a group id (sg-…); each must exist here."""
    from subtask.ops.plans import groups

    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise SubtaskError("usage", f"--after needs job or group ids, not {names!r}")
    after: list[str] = []
    until: list[str] = []
    for name in (n.strip() for n in names):
        if name.lower().startswith("sg-"):
            gid = groups.resolve(repo, name.lower())
            group, _tip = groups.read(repo, gid)
            after.append(gid)
            until.extend(group.members)
        else:
            job_id = records.resolve(repo, name)
            records.read(repo, job_id)  # a damaged record is named now, not waited on
            after.append(job_id)
            until.append(job_id)
    return list(dict.fromkeys(after)), list(dict.fromkeys(until))


@dataclass
class Dependency:
    """One job or group a waiting job waits for, and how it ended if it has (`dependencies`)."""

    name: str  # a job id or a group id
    ended: bool
    passed: bool = False
    heads: list[str] = field(default_factory=list)  # what the waiting job's base integrates
    words: str = ""  # how it ended, for a skip's reason


def _head(job: Job) -> str:
    """The head a job ended at (what its verify ran on): its head pin's commit, else its base."""
    return lifecycle.pinned_head(job) or job.spec.base


def _job_dependency(repo: Repo, job_id: str) -> Dependency:
    try:
        job = records.read(repo, job_id)
    except SubtaskError as exc:
        return Dependency(job_id, True, words=f"{job_id} cannot be read: {exc.message}")
    attempt = job.state.current
    if not attempt.terminal and not executors.of(job).runs_here:
        # Nothing here notices a job elsewhere end but a look there (one status request, at most
        # as often as `advance` runs); what it brings home is moved on by our caller, not by it.
        executors.of(job).backend().collect(repo, job_id, advance=False)
        job = records.read(repo, job_id)
        attempt = job.state.current
    if not attempt.terminal:
        return Dependency(job_id, False)
    words = f"{job_id} ended {attempt.state}"
    if attempt.state == "done" and attempt.verify is not None and not attempt.verify.passed:
        words += " (verify failed)"
    elif attempt.reason and attempt.state != "done":  # a skip's reason says the first cause already
        words += f" ({attempt.reason if attempt.state == 'skipped' else render.reason_text(attempt)})"
    return Dependency(job_id, True, job_passed(job), [_head(job)], words)


def _group_dependency(repo: Repo, gid: str, conclude: bool = True) -> Dependency:
    from subtask.ops.plans import groups

    try:
        group = groups.conclude(repo, gid) if conclude else groups.read(repo, gid)[0]
    except SubtaskError as exc:
        return Dependency(gid, True, words=f"{gid} cannot be read: {exc.message}")
    if not group.terminal:
        return Dependency(gid, False)
    jobs = groups.members(repo, group)
    if group.pick:
        pick = jobs.get(group.pick)
        heads = [_head(pick)] if pick is not None else []
    elif group.kind == "map":
        heads = [_head(j) for j in jobs.values() if j is not None]
    else:
        heads = [group.base]
    return Dependency(gid, True, groups.passed_group(group), heads,
                      f"{gid} ended {group.state}" + (f" ({group.reason})" if group.reason else ""))


def dependencies(repo: Repo, job: Job, conclude: bool = True) -> list[Dependency]:
    """How each job or group `job` waits for ended (`conclude`: decide a group whose jobs all ended,
    which may run its judges; else a group counts as ended once its record says so)."""
    return [_group_dependency(repo, name, conclude) if name.startswith("sg-") else _job_dependency(repo, name)
            for name in job.spec.after or []]


# ---------------------------------------------------------------- the base: one head, or their integration

@dataclass
class Integration:
    """The base of a job that waits for several (`integrate`), or the heads that conflict."""

    base: str | None
    conflicts: list[str] = field(default_factory=list)
    between: tuple[str, str] = ("", "")  # whose heads conflict


def integrate(repo: Repo, heads: list[tuple[str, str]], for_job: str) -> Integration:
    """The base for a job after several: the one head that contains the others, or a merge commit
    of them all (`git merge-tree`, one pair at a time; parents: every head). `heads`: (whose, commit)."""
    order = list(dict.fromkeys(commit for _who, commit in heads))
    whose = {commit: who for who, commit in reversed(heads)}
    if len(order) > 1:
        independent = set(git(repo.root, "merge-base", "--independent", *order).stdout.split())
        order = [commit for commit in order if commit in independent]
    if len(order) == 1:
        return Integration(order[0])
    sign = repo.config.signing_key() is not None
    left, tree = order[0], ""
    merged = [whose[order[0]]]
    for index, commit in enumerate(order[1:], 1):
        proc = git(repo.root, "merge-tree", "--write-tree", "--name-only", "--no-messages", "-z", left, commit,
                   check=False)
        fields = proc.stdout.split("\0")
        if proc.returncode == 1:
            names = list(dict.fromkeys(name for name in fields[1:] if name))
            return Integration(None, names, (" + ".join(merged), whose[commit]))
        if proc.returncode != 0 or not fields[0]:
            raise SubtaskError("fatal", f"git merge-tree failed: {proc.stderr.strip()}")
        tree = fields[0]
        merged.append(whose[commit])
        if index < len(order) - 1:  # the next pair merges into this one
            left = commit_tree(repo.common_dir, tree, [left, commit], f"git-subtask: {' + '.join(merged)}\n",
                               sign=sign)
    message = f"git-subtask: the heads of {', '.join(merged)}, integrated for {for_job}\n"
    return Integration(commit_tree(repo.common_dir, tree, order, message, sign=sign))


# ---------------------------------------------------------------- moving waiting jobs on

def advance(repo: Repo, conclude: bool = True) -> list[str]:
    """Move on every waiting job of this repository none of whose jobs is listed in slots.json any
    more; repeat while that ends some (a chain of skips). Returns the ids moved on. Cheap when
    nothing is waiting: one read of slots.json. `conclude`: see `dependencies`."""
    moved: list[str] = []
    seen: set[str] = set()
    for _ in range(MAX_ROUNDS):
        with warnings.catch_warnings():  # a damaged file is said by the locked pass that rebuilds it
            warnings.simplefilter("ignore")
            current = slots.read(repo.state_dir)
        ready = [e["job"] for e in slots.ready_waiting(current) if lifecycle.in_repo(repo, e) and e["job"] not in seen]
        if not ready:
            break
        for job_id in ready:
            seen.add(job_id)
            try:
                outcome = move_on(repo, job_id, conclude)
            except Exception as exc:  # one broken job must not keep the others waiting
                print(f"git-subtask: could not start waiting job {job_id} yet: {exc}", file=sys.stderr)
                continue
            if outcome in ("started", "skipped", "failed"):
                moved.append(job_id)
    return moved


def advance_quietly(repo: Repo, conclude: bool = True) -> None:
    """`advance` where nothing may fail (a worker's wrap-up): the next command tries again."""
    try:
        advance(repo, conclude)
    except Exception as exc:
        print(f"git-subtask: could not move waiting jobs on yet: {exc}", file=sys.stderr)


def _try_lock(repo: Repo, job_id: str) -> int | None:
    for _ in range(LOCK_TRIES):
        fd = liveness.acquire(repo.state_dir, job_id, block=False)
        if fd is not None:
            return fd
        time.sleep(0.002)
    return None


def move_on(repo: Repo, job_id: str, conclude: bool = True) -> str:
    """Start, skip or fail one waiting job once what it waits for ended: "started", "skipped",
    "failed", "not yet", "busy" (someone else holds it), or "gone" (not waiting any more)."""
    fd = _try_lock(repo, job_id)
    if fd is None:
        return "busy"
    kept = False
    try:
        try:
            job = records.read(repo, job_id)
        except SubtaskError as exc:
            if exc.kind == "not_found":  # its start died before its record: nothing to start
                privatetext.discard(repo.state_dir, job_id, 1)
                jobenv.drop(repo.state_dir, job_id)
                forget(repo, job_id)
                return "gone"
            raise
        attempt = job.state.current
        if attempt.state != WAITING or not ownership.owns(repo, job):
            if attempt.state == "queued" and attempt.n == 1 and ownership.owns(repo, job) \
                    and not _in_slots(repo, job_id) \
                    and executors.of(job).runs_here:  # elsewhere, its executor's `collect` ends one
                kept = True
                _admit_and_spawn(repo, job, fd)  # its mover died between its record and its admission
                return "started"
            forget(repo, job_id)
            return "gone"
        found = dependencies(repo, job, conclude)
        if not all(d.ended for d in found):
            return "not yet"
        failed = [d for d in found if not d.passed]
        if failed and (job.spec.on_fail or "skip") != "run":
            _end(repo, job, "skipped", "; ".join(d.words for d in failed)[:500], "dependency",
                 f"git subtask show {failed[0].name}")
            return "skipped"
        heads = [(d.name, head) for d in found for head in d.heads]
        if not heads:
            _end(repo, job, "failed", "what it waits for left no head to start from", "dependency", None)
            return "failed"
        integration = integrate(repo, heads, job.id)
        if integration.base is None:
            a, b = integration.between
            shown = ", ".join(integration.conflicts[:CONFLICT_NAMES])
            more = len(integration.conflicts) - CONFLICT_NAMES
            _end(repo, job, "failed", f"the heads of {a} and {b} conflict in {shown}"
                 + (f" and {more} more" if more > 0 else ""),
                 "conflict", "merge their branches by hand (git merge subtask/<id> ...), then start it from the "
                 "merge: git subtask start --base <commit> '...'")
            return "failed"
        kept = _start(repo, job, integration.base, found, fd)
        return "started"
    finally:
        if not kept:
            liveness.release(fd)


def _in_slots(repo: Repo, job_id: str) -> bool:
    current = slots.read(repo.state_dir)
    return any(e["job"] == job_id for e in current.running + current.queue)


def forget(repo: Repo, job_id: str) -> None:
    """Drop the job's `waiting` entry (its record moved on, or it has none)."""
    with slots.transaction(repo.state_dir, rebuild=lambda: lifecycle.rebuild_slots(repo)) as current:
        slots.remove_waiting(current, job_id)


def _end(repo: Repo, job: Job, state: str, reason: str, kind: str | None, hint: str | None) -> None:
    lifecycle.end_attempt(repo, job.id, job.state.current.n, state, reason=reason, error_kind=kind, hint=hint,
                          engine_may_have_spent=False)
    forget(repo, job.id)


def _start(repo: Repo, job: Job, base: str, found: list[Dependency], fd: int) -> bool:
    """Branch and base pin at `base`, the record `waiting -> queued` (the commit point), then the
    admission and the worker. True when `fd` was taken over (`_admit_and_spawn`)."""
    paid = get_engine(job.spec.engine, repo.config).paid
    names = [d.name for d in found]
    base_ref = f"head of {names[0]}" if len(names) == 1 else f"heads of {', '.join(names)}"
    try:
        with Transaction() as tx:
            if paid:  # before its record names a reservation: a ledger rebuilt from records would open it
                spending.sync_ledger(repo)
            branch = job.spec.branch
            made = branch is not None and _ensure_branch(repo, branch, base)
            tx.done("after_branch", (lambda: _delete_branch(repo, branch, base)) if branch and made else None)
            new_pin = repo.objects.ref(records.pin_ref(job.id, "base")) is None  # undone only if made here
            records.set_pin(repo, job.id, "base", base)
            tx.done("before_leaving_waiting",
                    (lambda: records.cas_ref(repo, records.pin_ref(job.id, "base"), base, None)) if new_pin else None)

            def leave_waiting(j: Job) -> bool:
                attempt = j.state.current
                if attempt.state != WAITING:
                    raise SubtaskError("conflict", f"{j.id} is {attempt.state} now, no longer waiting")
                j.spec.base, j.spec.base_ref = base, base_ref
                attempt.state, attempt.queued_at = "queued", now()  # its reservation is dated now
                if paid:
                    usd = attempt.max_usd if attempt.max_usd is not None else (j.spec.max_usd or money.ZERO)
                    attempt.rid, attempt.cost = paths.reservation_id(j.id, attempt.n), Cost(reserved=usd,
                                                                                             billing="reserved")
                return True

            job = records.update(repo, job.id, leave_waiting)
    except Exception as exc:  # undone; a Ctrl-C goes on up
        if not (isinstance(exc, SubtaskError) and exc.kind == "conflict"):  # else: stopped meanwhile
            _end(repo, job, "failed", f"could not start: {getattr(exc, 'message', exc)}", "setup", None)
        return False
    faults.point("after_leaving_waiting")
    executor = executors.of(job)
    if not executor.runs_here:
        _hand_over(repo, job, executor, paid)
        return False
    _admit_and_spawn(repo, job, fd)
    return True


def _hand_over(repo: Repo, job: Job, executor, paid: bool) -> None:
    """A job placed elsewhere leaves `waiting` for its executor (`Elsewhere.hand_over`: money,
    refs, submission), under the run-lock our caller holds; a failure ends it failed, with why."""
    try:
        executor.backend().hand_over(repo, job, paid)
    except Exception as exc:
        _end(repo, job, "failed", f"could not start on {executor.name}: {getattr(exc, 'message', exc)}", "setup",
             getattr(exc, "hint", None))
        return
    forget(repo, job.id)


def _admit_and_spawn(repo: Repo, job: Job, fd: int) -> None:
    """Admit a job recorded `queued` that holds no slot yet (a slot, or the queue; its money),
    drop its `waiting` entry, spawn its worker when it got a slot. Takes `fd` over: hands it to
    the worker or releases it, whatever happens."""
    try:
        rid = job.state.current.rid
        paid = bool(rid) and get_engine(job.spec.engine, repo.config).paid
        if paid:
            spending.sync_ledger(repo)
            # A ledger rebuilt from the records since (a lost state folder) opened it already.
            paid = not any(r.rid == rid for r in ledger.open_reservations(repo.state_dir))
        try:
            positions, dead, handed = admission.admit(repo, [SimpleNamespace(job=job, paid=paid)])
        except SubtaskError as exc:  # e.g. the monthly cap: it cannot start, now or later by itself
            admission.after_admission(repo, getattr(exc, "admission", ([], [])))
            _end(repo, job, "failed", exc.message, "budget" if exc.kind == "budget" else "setup", exc.hint)
            return
        faults.point("after_launch_admit")
        forget(repo, job.id)
    except BaseException:
        liveness.release(fd)
        raise
    handed_to_worker = False
    if positions[0] == 0:
        try:
            lifecycle.spawn_worker(repo, job.id, fd)
            lifecycle.close_fd_keep_lock(fd)
            handed_to_worker = True
        except Exception as exc:  # its slot entry is a dead worker's now: the sweep ends it
            print(f"git-subtask: could not start the worker of {job.id}: {exc}", file=sys.stderr)
    if not handed_to_worker:
        liveness.release(fd)
        handed += admission.fill_after_queueing(repo)
    admission.after_admission(repo, (dead, handed))


def _ensure_branch(repo: Repo, branch: str, base: str) -> bool:
    """The waiting job's branch at `base`: made now (True), or left at the base by a mover that
    died before the record said so (False). Anything else there is refused."""
    ref = repo.objects.ref(f"refs/heads/{branch}")
    if ref is None:
        records.create_branch(repo, branch, base)
        return True
    if ref.target != base:
        raise SubtaskError("fatal", f"the branch {branch} exists already, at {ref.target[:12]}, not at its base "
                           f"{base[:12]}", hint=f"git branch --list {branch}")
    return False


def _delete_branch(repo: Repo, branch: str, at: str) -> None:
    records.cas_ref(repo, f"refs/heads/{branch}", at, None)


# ---------------------------------------------------------------- recording and stopping waiting jobs

def record_waiting(repo: Repo, job: Job, until: list[str]) -> None:
    """The `waiting` entry, then the record (a crash between leaves an entry with no record, which
    `move_on` drops). The caller holds the job's run-lock and undoes both on failure."""
    with slots.transaction(repo.state_dir, rebuild=lambda: lifecycle.rebuild_slots(repo)) as current:
        slots.add_waiting(current, job.id, repo.common_dir, until)
    records.create(repo, job)


def stop_waiting(repo: Repo, job_id: str, reason: str = "stopped while waiting") -> bool:
    """End a waiting job `stopped`. False when it is not waiting any more (it started meanwhile:
    the caller stops it as any job)."""
    deadline = time.monotonic() + STOP_WAIT
    while True:
        fd = _try_lock(repo, job_id)
        if fd is not None:
            try:
                job = records.read(repo, job_id)
                if job.state.current.state != WAITING:
                    return False
                _end(repo, job, "stopped", reason, None, None)
                return True
            finally:
                liveness.release(fd)
        if records.read(repo, job_id).state.current.state != WAITING:
            return False
        if time.monotonic() >= deadline:
            raise SubtaskError("not_finished", f"{job_id} is being started by another process",
                               hint=f"git subtask stop {job_id}")
        time.sleep(0.02)
