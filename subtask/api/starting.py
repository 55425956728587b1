"""Starting one job: its request checked and made into a record (`_prepare`), then `start`, and
the start transaction every way a job begins goes through (`_launch_all`: a job, a reply's
attempt, a group's members), with the checks a start and a reply share.

Invariants:
- Never change anything in `start` before all input is valid, because bad input must leave no
  branch, ref, slot or reservation behind (tests: `test_bad_input_*`, `test_failure_at_each_start_step_*`);
  a failure (or Ctrl-C) at any step before the worker is spawned undoes every earlier step: slot,
  reservation, branch, pins, record, lock. Its base is resolved before the state folder is probed,
  so a repository with no commits gets no `.git/subtask/` either.
- Admission and reservation happen in one critical section: slots lock, then ledger lock; the
  slot entry is saved before the money is reserved, so no crash leaves a reservation unfindable.
- What a caller writes reaches git only through `redact`: the task, a reply's message and the
  verify command are recorded redacted, and kept as written (for the engine) only in the state
  folder for the life of the attempt (`privatetext`).
- Never take the delegation depth from the environment alone, because `env -u SUBTASK_DEPTH`
  edits it: the job whose worktree is the cwd and the job whose engine's process group the command
  is in count too (`delegation`).
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from decimal import Decimal
from functools import partial

from subtask import executors
from subtask.api.read import _positive, queue_position
from subtask.git import leftout, ownership, records
from subtask.git.gitrepo import Repo, check_worktree_location, resolve_commit
from subtask.git.leftout import LeftOut
from subtask.git.records import Job, branch_name
from subtask.model import checknames, faults, money
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.model.job import (
    DEPTH_ENV,
    MAX_TASK_BYTES,
    ON_FAIL,
    TERMINAL,
    WAITING,
    Attempt,
    Cost,
    JobSpec,
    JobState,
    is_job_id,
    new_job_id,
    now,
)
from subtask.model.redact import redact
from subtask.model.start_options import StartRequest
from subtask.model.transaction import Transaction
from subtask.ops.running import admission, lifecycle, spending
from subtask.proc import lineage
from subtask.state import jobenv, ledger, liveness, paths, privatetext, slots, statefiles


@dataclass
class StartResult:
    """A job just started (or a reply's new attempt): its record and where it runs or waits."""

    job: Job
    position: int  # 0 = running now, n = position in the queue
    on: str = "local"  # its executor's name (elsewhere: queued there until a slot is free)
    warnings: list[str] = field(default_factory=list)  # one line each, said with the start
    left_out: LeftOut | None = None  # what the job does not see of the checkout it was started from

    @property
    def state(self) -> str:
        recorded = self.job.state.current.state
        if recorded == WAITING or recorded in TERMINAL:  # --after: waiting, or already moved on
            return recorded
        return "running" if self.position == 0 and executors.REGISTRY[self.on].runs_here else "queued"


MAX_RETRIES = 5


def _check_task(task) -> str:
    if not isinstance(task, str) or not task.strip():
        raise SubtaskError("usage", "the task is empty: say what the job should do")
    size = len(task.encode("utf-8", "surrogatepass"))
    if size > MAX_TASK_BYTES:
        raise SubtaskError("usage", f"the task is {size:,} bytes; the limit is {MAX_TASK_BYTES:,} (1 MiB)",
                           hint="put the details in a file in the repository and point the task at it")
    return task.encode("utf-8", "replace").decode("utf-8")  # lone surrogates become U+FFFD


def current_depth() -> int:
    """The delegation depth SUBTASK_DEPTH claims (a worker exports its job's depth + 1)."""
    try:
        return max(0, int(os.environ.get(DEPTH_ENV, "0")))
    except ValueError:
        return 0


@dataclass
class Delegation:
    """How deep this command delegates, and the job it runs inside (`delegation`)."""

    depth: int
    parent: Job | None  # the running job this command runs inside, when one is known


def delegation(repo: Repo) -> Delegation:
    """How deep this command delegates, known from where it runs, not only from the environment.

    The environment can be edited (`env -u SUBTASK_DEPTH`), so the job the command runs inside is
    also found from its working directory (a job's worktree knows its job) and from its
    ancestry (an engine's descendants descend from the process the worker recorded for it, in
    a pid namespace too, where the process group reads 0). The depth is the deepest of what
    each says.
    """
    parent = _job_of_cwd(repo) or _job_of_env(repo) or _job_of_ancestry(repo)
    depth = current_depth()
    if parent is not None:
        depth = max(depth, parent.spec.depth + 1)
    return Delegation(depth, parent)


def _job_of_cwd(repo: Repo) -> Job | None:
    workdir = repo.workdir()
    if workdir is None:
        return None
    here = os.path.realpath(workdir)
    name = os.path.basename(here)
    if here == os.path.realpath(repo.root_str) or not is_job_id(name):
        return None
    job = _job_or_none(repo, name)
    return job if job is not None and os.path.realpath(job.spec.worktree) == here else None


def _job_of_env(repo: Repo) -> Job | None:
    job_id = os.environ.get("SUBTASK_JOB_ID", "")
    return _job_or_none(repo, job_id) if is_job_id(job_id) else None


def _job_of_ancestry(repo: Repo) -> Job | None:
    """The running job whose engine (its recorded process) this process descends from, or whose
    engine's process group it is in."""
    running = [entry for entry in slots.read(repo.state_dir_str).running if lifecycle.in_repo(repo, entry)]
    if not running:
        return None  # no job runs: none can be an ancestor (and /proc need not be walked)
    mine = set(lineage.ancestors()) | {os.getpgrp()}
    for entry in running:
        if lifecycle.read_pids(repo.state_dir_str, entry["job"]).get("engine") in mine:
            return _job_or_none(repo, entry["job"])
    return None


def _job_or_none(repo: Repo, job_id: str) -> Job | None:
    """The job if it is running now: a person in a finished job's worktree delegates nothing."""
    try:
        job = records.read(repo, job_id)
    except Exception:  # not ours, gone, or damaged: it tells us nothing
        return None
    return None if job.state.current.terminal else job


def _check_depth(repo: Repo) -> Delegation:
    found = delegation(repo)
    limit = repo.config.integer("maxDepth")
    if found.depth >= limit:
        inside = f" (inside job {found.parent.id})" if found.parent is not None else ""
        raise SubtaskError("recursion", f"delegation depth {found.depth} reached subtask.maxDepth={limit}{inside}: "
                           "a job may not start jobs this deep",
                           hint="git config subtask.maxDepth N (raise it deliberately)")
    return found


def default_engine(repo: Repo) -> str:
    """`subtask.engine` (refused, exit 128, when it names no engine), else claude if it can run."""
    from subtask.engines import get_engine
    from subtask.engines.base import preflight

    configured = repo.config.get("engine")
    if configured and configured.strip() == "auto":
        return "auto"  # routed per job (`ops/routing`)
    if configured:
        try:
            get_engine(configured, repo.config)
        except SubtaskError as exc:
            raise SubtaskError("fatal", f"git config subtask.engine names no engine: {exc.message}",
                               hint="git config subtask.engine shell   (see: git subtask engines)"
                               ) from None
        return configured

    if preflight(get_engine("claude", repo.config)) is None:  # cheap: no `claude --version`
        return "claude"
    usable = [p.name for p in engines(repo) if p.usable]
    raise SubtaskError("usage", "no engine given and claude is not usable here; usable engines: "
                       + (", ".join(usable) or "none"),
                       hint="git subtask start --engine shell '...'  or  git config subtask.engine shell")


def _check_engine_can_run(engine) -> None:
    """Refuse a job its engine cannot run (no credentials, not installed) before anything changes,
    instead of accepting one that fails or hangs retrying; cheap (`preflight`: no subprocess)."""
    from subtask.engines.base import preflight

    refusal = preflight(engine)
    if refusal:
        raise SubtaskError("engine", f"the {engine.name} engine cannot run here: {refusal}",
                           hint="check every engine: git subtask engines")


def _check_max_usd(requested) -> Decimal | None:
    """`--max-usd` in exact dollars (None: not given); refused unless a finite amount >= 0."""
    if requested is None:
        return None
    amount = money.money_or_none(requested)
    if amount is None:
        raise SubtaskError("usage", f"--max-usd must be a finite amount >= 0, not {requested!r}")
    return amount


def _max_usd(repo: Repo, engine, requested) -> Decimal:
    """The budget to reserve, in exact dollars: validated alike for every engine, then $0 for a
    free one."""
    asked = _check_max_usd(requested)
    if asked is None and not engine.paid:
        return money.ZERO
    usd = spending.setting_usd(repo, "defaultMaxUsd") if asked is None else asked
    cap = spending.setting_usd(repo, "maxJobUsd")
    if usd > cap:
        raise SubtaskError("usage", f"--max-usd {money.plain(usd)} is above subtask.maxJobUsd={money.plain(cap)}",
                           hint=f"git config subtask.maxJobUsd {money.plain(usd)}")
    return usd if engine.paid else money.ZERO


def _reserved_cost(usd: Decimal, engine) -> Cost:
    """A new attempt's cost: a paid engine's says "reserved" until the attempt is settled."""
    return Cost(reserved=usd, billing="reserved") if engine.paid else Cost(reserved=usd)


def _default_timeout(repo: Repo, engine) -> float | None:
    """`subtask.defaultTimeout` for a paid engine (0: none); a free one runs until it ends. A paid
    agent that can no longer progress (an API it cannot reach, retried forever) must end some
    time, or its whole reservation is spent on waiting."""
    return (repo.config.number("defaultTimeout") or None) if engine.paid else None


def look_at_checkout(repo: Repo, request: StartRequest) -> leftout.Look:
    """The look at the checkout the start is run in, begun before the start's own work (git's
    status, which grows with the repository, runs beside it); read by `left_out`."""
    return leftout.Look(repo, from_checkout=not request.after and request.base in (None, "HEAD"))


def left_out(repo: Repo, request: StartRequest, base: str | None,
             said: dict | None = None, look: leftout.Look | None = None) -> LeftOut:
    """What a job from `base` does not see of the checkout the start was run in: found after it
    started (a failed start has nothing to say), never a reason to refuse. `look`: one begun
    before the start (`look_at_checkout`; its caller ends it), read if it looked for this."""
    from_checkout = base is not None and request.base in (None, "HEAD")
    key = (repo.common_dir_str, str(repo.opened_at_str), base, from_checkout)
    if said is not None and key in said:
        return said[key]
    if look is None or look.from_checkout != from_checkout:
        look = leftout.Look(repo, from_checkout=from_checkout)
    found = look.found(base)
    if said is not None:
        said[key] = found
    return found


def start(repo: Repo, request: StartRequest) -> StartResult:
    """Validate, admit (or queue), reserve, create branch + pins + record, spawn the worker.
    With `after`: record the job waiting (`_start_waiting`)."""
    if request.best_of is not None:
        raise SubtaskError("usage", "api.start starts one job: use api.launch or api.start_group for best_of")
    prepared = _prepare(repo, request)
    if prepared.until:
        if not prepared.on.runs_here:  # checked now, and its record says where it will run
            prepared.on.backend().place(repo, prepared.job)
        result = _start_waiting(repo, prepared)
    elif not prepared.on.runs_here:
        job = prepared.on.backend().submit(repo, prepared.job, prepared.paid)
        result = StartResult(job, 0, on=prepared.on.name)
    else:
        if prepared.paid:
            spending.sync_ledger(repo)
        result = _admit_and_launch(repo, prepared.job, prepared.paid,
                                   branch_at=None if request.readonly else prepared.job.spec.base,
                                   lock_fd=liveness.acquire_new(repo.state_dir_str, prepared.job.id),
                                   as_written=prepared.as_written)
    result.warnings = prepared.warnings
    return result


@dataclass
class _Prepared:
    """A start made ready by `_prepare`: the job to record and what its launch needs; nothing changed yet."""

    job: Job
    paid: bool
    as_written: dict
    on: executors.Executor = executors.REGISTRY["local"]
    until: list[str] | None = None  # --after: the jobs it waits to see end (a group's members)
    warnings: list[str] = field(default_factory=list)  # `StartResult.warnings`


def _prepare(repo: Repo, request: StartRequest, *, group: str | None = None, member: int | None = None) -> _Prepared:
    """The job a start request makes, validated; nothing is changed yet."""
    from subtask.engines import get_engine

    task = _check_task(request.task)
    repo.config.require_valid()
    on = executors.choose(repo.config, request.on)
    engine_name = _one_name(request.engine, "--engine") or default_engine(repo)
    routed = None
    if engine_name == "auto":
        routed = _routing(repo, request)
        if routed.chosen is None:
            raise routed.refusal()
        engine_name = routed.chosen.name
    engine = get_engine(engine_name, repo.config)
    repo.config.require_valid(engine_name)  # and the keys of its engine (`subtask.engine.<name>.*`)
    _check_engine_can_run(engine)
    verify_timeout = _positive(request.verify_timeout, "--verify-timeout") or repo.config.number("verifyTimeout")
    timeout = _positive(request.timeout, "--timeout") or _default_timeout(repo, engine)
    max_turns = _positive(request.max_turns, "--max-turns", integer=True)
    max_usd = _max_usd(repo, engine, request.max_usd)
    if request.verify is not None and not request.verify.strip():
        raise SubtaskError("usage", "--verify is empty: give a command, or leave --verify out")
    retries, job_checks = _verify_loop(repo, request, on)
    harness = _harness(repo, request)
    delegated = _check_depth(repo)
    parent = delegated.parent
    base = resolve_commit(repo, request.base or "HEAD")  # --after: a placeholder until it starts
    choice = _isolation(repo, engine, request)  # probes the state folder: after what makes nothing
    network = _network(repo)
    sockets = _sockets(repo) if choice.mode != "none" else None
    after, until, on_fail = _after(repo, request, on)
    job_id = new_job_id()
    worktree = os.path.join(repo.worktree_dir_str(), job_id)
    check_worktree_location(worktree)
    created = now()
    if repo.config.sign_mode() == "always":
        from subtask.git import signing

        signing.require_key(repo)
    clone = ownership.ensure_clone_id(repo)  # made once per clone, after every check of the input
    stored_task, stored_verify = redact(task), redact(request.verify) if request.verify else request.verify
    base_ref = f"after {', '.join(after)}" if after else request.base or "HEAD"
    spec = JobSpec(id=job_id, task=stored_task, engine=engine_name, base_ref=base_ref, base=base,
                   branch=None if request.readonly else branch_name(job_id), worktree=str(worktree),
                   repo=repo.root_str, created_at=created, verify=stored_verify, verify_timeout=verify_timeout,
                   timeout=timeout, max_usd=max_usd if engine.paid else None, max_turns=max_turns,
                   model=_one_name(request.model, "--model"), readonly=bool(request.readonly), depth=delegated.depth,
                   parent=parent.id if parent is not None else None,
                   isolation=choice.mode, isolation_source=choice.source + (f": {choice.note}" if choice.note else ""),
                   network=network, sockets=sockets, group=group, member=member, clone=clone, retries=retries,
                   checks=job_checks, harness=harness,
                   after=after, on_fail=on_fail)
    attempt = Attempt(n=1, state="queued", message=stored_task, queued_at=created, cost=_reserved_cost(max_usd, engine),
                      rid=paths.reservation_id(job_id, 1) if engine.paid else None, timeout=timeout,
                      max_usd=max_usd if engine.paid else None)
    if after:  # nothing reserved while it waits: its reservation is taken when it starts
        attempt.state, attempt.rid, attempt.cost = WAITING, None, Cost(billing="not_started")
    if routed is not None:  # the record says which engine --engine auto chose, and why
        spec.extra["routing"] = routed.record()
    job = Job(spec, JobState(attempts=[attempt]), None, "", "", None)
    as_written = {"message": task, "stored_message": stored_task, "verify": request.verify,
                  "stored_verify": stored_verify}
    from subtask.proc import isolation

    unconfined = isolation.unconfined_warning(engine, choice.mode, bool(request.readonly))
    warnings = [f"warning: {unconfined}"] if unconfined else []
    return _Prepared(job, engine.paid, as_written, on, until, warnings)


def _routing(repo: Repo, request: StartRequest):
    from subtask.ops.running import routing

    _check_max_usd(request.max_usd)
    return routing.route(repo, readonly=bool(request.readonly), isolation=request.isolation, max_usd=request.max_usd)


def routing_explain(repo: Repo, request: StartRequest):
    """Which engine `--engine auto` would choose for this start, every candidate's filter or
    score and terms (`ops/routing`); nothing is started."""
    _check_task(request.task)
    repo.config.require_valid()
    return _routing(repo, request)


def _after(repo: Repo, request: StartRequest,
           on: executors.Executor) -> tuple[list[str] | None, list[str] | None, str | None]:
    """(after, until, on_fail) of a start: the ids it waits for, the jobs to see end, what a failure does."""
    if request.after is not None and not isinstance(request.after, (str, list, tuple)):
        raise SubtaskError("usage", f"after must be job or group ids, not {request.after!r}")
    names = _list(request.after)
    if not names and request.after not in (None, [], ()):  # `--after "$ID"` with an empty $ID
        raise SubtaskError("usage", f"--after names no job: {request.after!r}",
                           hint="git subtask start --after ID '...'")
    if request.on_fail is not None and request.on_fail not in ON_FAIL:
        raise SubtaskError("usage", f"--on-fail must be {' or '.join(ON_FAIL)}, not {request.on_fail!r}")
    if not names:
        if request.on_fail is not None:
            raise SubtaskError("usage", "--on-fail goes with --after: it says what to do when a job it waits for fails")
        return None, None, None
    if request.base not in (None, "", "HEAD"):
        raise SubtaskError("usage", "--after starts the job from the head of what it waits for: give --base or "
                           "--after, not both")
    on.require("after")
    from subtask.ops.plans import waiting  # a start that waits: not a plain one's ~0.3 ms

    after, until = waiting.resolve_after(repo, list(names))
    return after, until, request.on_fail


def _start_waiting(repo: Repo, prepared: _Prepared) -> StartResult:
    """Record a job that waits (`plans`): its `waiting` entry, its words and environment, its
    record; nothing reserved, no branch. Then move it on at once if what it waits for has ended."""
    from subtask.ops.plans import waiting

    job, state_dir = prepared.job, repo.state_dir_str

    def forget_waiting() -> None:
        waiting.forget(repo, job.id)
        records.delete(repo, job.id)

    with Transaction() as tx:
        fd = liveness.acquire_new(state_dir, job.id)
        tx.done("start_locked", lambda: liveness.drop(state_dir, job.id, fd))
        kept = privatetext.keep(state_dir, job.id, 1, **prepared.as_written)
        tx.done("start_words_kept", (lambda: privatetext.discard(state_dir, job.id, 1)) if kept else None)
        jobenv.save(state_dir, job.id)
        tx.done("start_env_kept", lambda: jobenv.drop(state_dir, job.id))
        try:
            waiting.record_waiting(repo, job, prepared.until or [])
        finally:  # a half-written entry or record is taken back too
            tx.done("start_waiting_entry", forget_waiting)
        tx.done("after_record")
    liveness.release(fd)
    waiting.advance(repo)
    job = records.read(repo, job.id)
    return StartResult(job, queue_position(repo, job.id) or 0, on=prepared.on.name)


def _verify_loop(repo: Repo, request: StartRequest, on: executors.Executor) -> tuple[int, list[str]]:
    """The retries and checks a start asks for, validated (docs/verify.md)."""
    retries = request.retries
    if retries is None:
        retries = 0
    elif isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
        raise SubtaskError("usage", f"--retries must be a whole number from 0 to {MAX_RETRIES}, not {retries!r}")
    if retries and not request.verify:
        raise SubtaskError("usage", "--retries needs --verify: a retry starts when verify fails",
                           hint="git subtask start --verify 'pytest -q' --retries 2 '...'")
    if retries and request.readonly:
        raise SubtaskError("usage", "--retries makes no sense with --readonly: "
                           "a read-only job changes nothing to retry")
    if retries:
        on.require("retries")
    given = [request.check] if isinstance(request.check, str) else request.check
    if not request.verify and not given:
        return retries, []  # nothing to check: no import of the checks on start's path
    from subtask.git import checks

    if given is not None and not isinstance(given, list):
        raise SubtaskError("usage", f"checks must be a list of names, not {given!r}")
    if request.readonly:
        if any(name != checknames.NONE for value in given or ()
               for name in checknames.split(str(value))):
            raise SubtaskError("usage", "--check has nothing to look at in a read-only job: it changes nothing")
        return 0, []
    configured = repo.config.get("git.checks")
    return retries, checks.resolve(given, configured, has_verify=bool(request.verify))


def _harness(repo: Repo, request: StartRequest) -> list[str] | None:
    """What judges the job's verify (docs/verify.md "The judge"): `subtask.verify.harness`, then
    each `--harness`; [] for a job judged by its own tests; None for a job with no verify."""
    given = [request.harness] if isinstance(request.harness, str) else request.harness
    if given is not None and not isinstance(given, list):
        raise SubtaskError("usage", f"harness must be a list of globs, not {given!r}")
    if not request.verify:
        if given:
            raise SubtaskError("usage", "--harness goes with --verify: it says what judges the verify",
                               hint="git subtask start --verify 'pytest -q' --harness job '...'")
        return None
    from subtask.git import harness_rule

    return harness_rule.resolve(given, repo.config.get("verify.harness"))


def _isolation(repo: Repo, engine, request: StartRequest):
    """The confinement the job's engine gets; what was asked and cannot be enforced is refused."""
    from subtask.proc import isolation, landlock

    confined_as = os.environ.get(isolation.ACTIVE_ENV, "none")
    if confined_as != "none" or not _can_write_state(repo):
        # Landlock is inherited: a job started from here could write none of its records. The
        # environment can be edited; the state folder's refusal cannot.
        said = f"isolation {confined_as}" if confined_as != "none" else "it cannot write the state folder"
        raise SubtaskError("fatal", f"this process runs confined ({said}), so it cannot start jobs",
                           hint="start the job that delegates with --isolation none")
    return isolation.resolve(engine, readonly=bool(request.readonly), flag=request.isolation,
                             configured=repo.config.get("isolation"),
                             landlock=landlock.support_seen(repo.state_dir_str))


def _can_write_state(repo: Repo) -> bool:
    """Can this process make a file in the state folder's run/ (as `start` is about to)? False
    only for the refusals a sandbox gives (a read-only mount, Landlock); anything else is left to
    the write that follows, which says what it is."""
    try:
        fd, probe = statefiles.new_file_beside(os.path.join(paths.run_dir(repo.state_dir_str), "probe"))
    except OSError as exc:
        return exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS)
    os.close(fd)
    os.unlink(probe)
    return True


def _network(repo: Repo) -> str:
    from subtask.proc import isolation

    return isolation.resolve_network(repo.config.get("isolation.network"))


def _sockets(repo: Repo) -> list[str] | None:
    """The host sockets a confined job may reach, granted by name (`subtask.isolation.socket`),
    as its spec records them."""
    from subtask.proc import isolation

    return isolation.configured_paths(repo.config, repo.root_str, isolation.SOCKET_KEY) or None


def _one_name(value, what: str) -> str | None:
    """One engine or model name: several go with --best-of only."""
    names = _names(value, what)
    if names and len(names) > 1:
        raise SubtaskError("usage", f"{what} takes one name, not {', '.join(names)}: several go with --best-of N")
    return names[0] if names else None


def _list(names) -> list[str]:
    """`after` as given: one name or a list of them, each maybe several separated by commas."""
    if isinstance(names, str):
        names = [names]
    return [n for text in names or [] if isinstance(text, str) for n in text.replace(",", " ").split() if n]


def _names(values, what: str) -> list[str] | None:
    """A list of names from a list or a comma-separated string; None when none is given."""
    if values is None or values == "":
        return None
    items = values.split(",") if isinstance(values, str) else list(values)
    if not all(isinstance(v, str) for v in items) or not all(v.strip() for v in items):
        raise SubtaskError("usage", f"{what} must be names separated by commas, not {values!r}")
    return [v.strip() for v in items] or None


def _admit_and_launch(repo: Repo, job: Job, paid: bool, *, branch_at: str | None, lock_fd: int,
                      as_written: dict) -> StartResult:
    """Admit (or queue) and reserve, write branch/pins/record, spawn; undo it all on any failure.

    For attempt 1 the record is created; for a reply the new attempt is appended to it, by
    compare-and-swap on an ended attempt, so concurrent replies add exactly one.
    """
    return _launch_all(repo, [_Launch(job, paid, branch_at, lock_fd, as_written)])[0]


@dataclass
class _Launch:
    """One job for `_launch_all` to admit, reserve, record and spawn: a start, a reply, a group's member."""

    job: Job
    paid: bool
    branch_at: str | None
    lock_fd: int
    as_written: dict


def _launch_all(repo: Repo, launches: list[_Launch], *, what: str | None = None,
                then_record=None, undo_record=None) -> list[StartResult]:
    """`_admit_and_launch` for one job or a group's members, all or nothing until the first spawn.

    The members are admitted and their money reserved in one critical section (`what` names them
    in a refusal); `then_record` writes the group's record once every member's record is there
    (so nobody ever reads a group whose members do not exist yet). A member whose worker cannot
    be spawned after another's was is left to the sweep, which ends it failed ("worker died").
    """
    state_dir = repo.state_dir_str
    handed: list[slots.HandOff] = []
    dead: list[slots.HandOff] = []
    spawned: list[_Launch] = []
    unspawned: list[_Launch] = []
    with Transaction() as tx:
        for launch in launches:
            tx.done("start_locked",
                    partial(liveness.drop, state_dir, launch.job.id, launch.lock_fd))
        admitted: tuple = (dead, handed)
        tx.then = lambda: admission.after_admission(repo, admitted)
        try:
            positions, dead, handed = admission.admit(repo, launches, what)
        except BaseException as exc:
            admitted = getattr(exc, "admission", admitted)
            raise
        admitted = (dead, handed)
        # Every member's slot entry was made at once: each is undone, whatever fails after.
        tx.done("start_admitted", *[
            partial(admission.unadmit, repo, launch.job.id, launch.job.state.current.n)
            for launch in launches])
        for launch in launches:
            job, attempt = launch.job, launch.job.state.current
            # Once the slot entry is on disk (whoever cleans up after a crash from here drops them too), and
            # before anyone can be handed the job (we hold its run-lock): whoever runs it uses these.
            kept = privatetext.keep(state_dir, job.id, attempt.n, **launch.as_written)
            tx.done("start_words_kept",
                    partial(privatetext.discard, state_dir, job.id, attempt.n) if kept else None)
            jobenv.save(state_dir, job.id)
            tx.done("start_env_kept", partial(jobenv.drop, state_dir, job.id))
            if launch.paid and attempt.rid is not None:  # (a paid attempt has its reservation id)
                tx.done("start_reserved",
                        partial(ledger.close, state_dir, attempt.rid, 0.0, reason="start undone"))
        for launch in launches:
            job, attempt = launch.job, launch.job.state.current
            if attempt.n == 1:  # its branch (none for a read-only job), pin and record: one ref transaction
                branch = job.spec.branch if launch.branch_at is not None else None
                records.create_started(repo, job, branch)
                tx.done("after_branch", partial(_drop_start_refs, repo, job.id, branch))
                tx.done("start_job_recorded")
                continue
            branch, at = job.spec.branch, launch.branch_at
            if branch and at is not None:  # a reply restores the job's branch here (a job with one)
                records.create_branch(repo, branch, at)
                tx.done("after_branch", partial(_delete_branch, repo, branch))
            tx.done("start_job_recorded", _append_attempt(repo, job.id, attempt))
        if then_record is not None:
            then_record()
            tx.done("start_group_recorded", undo_record)
        tx.done("after_record")
        for launch, position in zip(launches, positions, strict=True):
            if position != 0:
                continue
            try:
                faults.point("before_spawn")
                lifecycle.spawn_worker(repo, launch.job.id, launch.lock_fd)
                spawned.append(launch)
            except Exception as exc:
                if not spawned:
                    raise  # nothing runs yet: undo it all
                print(f"git-subtask: could not start the worker of {launch.job.id}: {exc}", file=sys.stderr)
                unspawned.append(launch)
    queued = False
    for launch, position in zip(launches, positions, strict=True):
        if launch in spawned:
            lifecycle.close_fd_keep_lock(launch.lock_fd)
        else:
            liveness.release(launch.lock_fd)  # queued; or not spawned: its entry is now a dead worker's
            queued = queued or position != 0
    if queued:
        handed += admission.fill_after_queueing(repo)
    admission.after_admission(repo, (dead, handed))
    if unspawned:
        lifecycle.reconcile(repo)
    return [StartResult(launch.job, position) for launch, position in zip(launches, positions, strict=True)]


def _append_attempt(repo: Repo, job_id: str, attempt: Attempt) -> Callable[[], None]:
    """A reply's attempt added to the job's record; its undo: the record back to its commit
    before, exactly (we hold the job's run-lock: nobody writes it meanwhile), else, should
    someone have, the attempt dropped by a commit of its own."""
    name = records.record_ref(job_id)
    before = repo.objects.ref(name)

    def change(job: Job) -> bool:
        if job.state.current.n != attempt.n - 1 or not job.state.current.terminal:
            raise SubtaskError("not_finished", f"{job_id} changed meanwhile: attempt {job.state.current.n} is "
                               f"{job.state.current.state}", hint=f"git subtask wait {job_id}")
        job.state.attempts.append(attempt)
        if job.state.branch_deleted and repo.git.references.get(f"refs/heads/{job.spec.branch}") is not None:
            job.state.branch_deleted = False  # restored for this reply
        return True

    records.update(repo, job_id, change)
    after = repo.objects.ref(name)

    def undo() -> None:
        if before is None or after is None or not records.cas_ref(repo, name, after.target, before.target):
            _drop_attempt(repo, job_id, attempt.n)

    return undo


def _drop_attempt(repo: Repo, job_id: str, n: int) -> None:
    def change(job: Job) -> bool:
        if job.state.current.n != n or job.state.current.state != "queued":
            return False
        job.state.attempts.pop()
        return True

    records.update(repo, job_id, change)


def _drop_start_refs(repo: Repo, job_id: str, branch: str | None) -> None:
    """Undo `records.create_started`: the branch, the pins, the record and its ownership ref."""
    if branch is not None:
        _delete_branch(repo, branch)
    records.delete(repo, job_id)


def _delete_branch(repo: Repo, branch: str) -> None:
    ref = repo.objects.ref(f"refs/heads/{branch}")
    if ref is not None:
        records.cas_ref(repo, ref.name, ref.target, None)


def engines(repo: Repo):
    """Probe every known engine without spending anything."""
    from subtask.engines import configured_command_engines, engine_names, get_engine

    config_keys = [entry.name for entry in repo.git.config]
    names = engine_names(configured_command_engines(config_keys))
    from subtask.proc import isolation

    probes = []
    for name in names:
        try:
            engine = get_engine(name, repo.config)
            probe = engine.probe()
            probe.confinement = isolation.describe(engine, repo.config.get("isolation"))
            probes.append(probe)
        except Exception as exc:
            from subtask.engines.base import Probe

            probes.append(Probe(name, False, None, None, False, "unknown", detail=str(exc)))
    return probes
