"""Starting, replying, stopping, landing and the rest of the operations on jobs (`api` reads and
`wait` are `api/read.py` and `api/waiting.py`).

Invariants:
- `start` changes nothing until its input is valid, and a failure (or Ctrl-C) at any step before
  the worker is spawned undoes every earlier step: slot, reservation, branch, pins, record, lock.
- Admission and reservation happen in one critical section: slots lock, then ledger lock; the
  slot entry is saved before the money is reserved, so no crash leaves a reservation unfindable.
- What a caller writes reaches git only through `redact`: the task, a reply's message and the
  verify command are recorded redacted, and kept as written (for the engine) only in the state
  folder for the life of the attempt (`privatetext`).
- Every command first sweeps for dead workers (cheap: it reads only the slots file), so a crash
  is noticed by the next command and its slot and reservation come back.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from subtask import executors
from subtask.api.read import _groups, _positive, get, queue_position, repo_at, sweep
from subtask.git import leftout, ownership, records, worktrees
from subtask.git.gitrepo import (
    Repo,
    check_worktree_location,
    ensure_excluded,
    git,
    resolve_commit,
)
from subtask.git.leftout import LeftOut
from subtask.git.records import Job, branch_name
from subtask.model import faults, money
from subtask.model.errors import SubtaskError
from subtask.model.job import (
    ACTIVE,
    DEPTH_ENV,
    MAX_TASK_BYTES,
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
from subtask.model.start_options import BY_NAME as START_OPTIONS
from subtask.model.start_options import GROUP_ONLY, StartRequest
from subtask.model.transaction import Transaction
from subtask.ops.running import admission, lifecycle, spending
from subtask.state import jobenv, ledger, liveness, paths, privatetext, slots


@dataclass
class StartResult:
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


# ---------------------------------------------------------------- validation


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
    here = workdir.resolve()
    if here == repo.root.resolve() or not is_job_id(here.name):
        return None
    job = _job_or_none(repo, here.name)
    return job if job is not None and Path(job.spec.worktree).resolve() == here else None


def _job_of_env(repo: Repo) -> Job | None:
    job_id = os.environ.get("SUBTASK_JOB_ID", "")
    return _job_or_none(repo, job_id) if is_job_id(job_id) else None


def _job_of_ancestry(repo: Repo) -> Job | None:
    """The running job whose engine (its recorded process) this process descends from, or whose
    engine's process group it is in."""
    running = [entry for entry in slots.read(repo.state_dir).running if lifecycle.in_repo(repo, entry)]
    if not running:
        return None  # no job runs: none can be an ancestor (and /proc need not be walked)
    from subtask.proc import procs

    mine = set(procs.ancestors()) | {os.getpgrp()}
    for entry in running:
        if lifecycle.read_pids(repo.state_dir, entry["job"]).get("engine") in mine:
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
                           "a job may not start jobs this deep", hint="git config subtask.maxDepth N (raise it deliberately)")
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
                       + (", ".join(usable) or "none"), hint="git subtask start --engine shell '...'  or  git config subtask.engine shell")


def _check_engine_can_run(engine) -> None:
    """Refuse a job its engine cannot run (no credentials, not installed) before anything changes,
    instead of accepting one that fails or hangs retrying; cheap (`preflight`: no subprocess)."""
    from subtask.engines.base import preflight

    refusal = preflight(engine)
    if refusal:
        raise SubtaskError("engine", f"the {engine.name} engine cannot run here: {refusal}",
                           hint="check every engine: git subtask engines")


def _check_max_usd(requested) -> None:
    if requested is not None and not (isinstance(requested, (int, float, Decimal)) and money.is_money(requested)):
        raise SubtaskError("usage", f"--max-usd must be a finite amount >= 0, not {requested!r}")


def _max_usd(repo: Repo, engine, requested) -> Decimal:
    """The budget to reserve, in exact dollars: validated alike for every engine, then $0 for a
    free one."""
    _check_max_usd(requested)
    if requested is None and not engine.paid:
        return money.ZERO
    usd = money.usd(repo.config.number("defaultMaxUsd") if requested is None else requested)
    cap = money.usd(repo.config.number("maxJobUsd"))
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


# ---------------------------------------------------------------- start

def launch(repo: Repo, request: StartRequest, said: dict | None = None) -> StartResult | GroupStart:
    """What every face calls: a job (`start`), or with `best_of` a group of them (`start_group`);
    with what it leaves out of the caller's checkout (`said`: those already found, by base, so a
    call that starts many looks once)."""
    if request.best_of is not None:
        result = start_group(repo, request)
    else:
        given = [name for name in GROUP_ONLY if getattr(request, name)]
        if given:
            raise SubtaskError("usage", f"{' and '.join(START_OPTIONS[n].flag for n in given)} "
                               f"{'goes' if len(given) == 1 else 'go'} with --best-of N",
                               hint="git subtask start --best-of 3 --verify 'pytest -q' ...")
        result = start(repo, request)
    base = result.group.base if isinstance(result, GroupStart) else result.job.spec.base
    result.left_out = left_out(repo, request, None if request.after else base, said)
    return result


def left_out(repo: Repo, request: StartRequest, base: str | None,
             said: dict | None = None) -> LeftOut:
    """What a job from `base` does not see of the checkout the start was run in: found after it
    started (a failed start has nothing to say), never a reason to refuse."""
    from_checkout = base is not None and request.base in (None, "HEAD")
    key = (str(repo.common_dir), str(repo.opened_at), base, from_checkout)
    if said is not None and key in said:
        return said[key]
    found = leftout.left_out(repo, base, from_checkout=from_checkout)
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
            _sync_ledger(repo)
        result = _admit_and_launch(repo, prepared.job, prepared.paid,
                                   branch_at=None if request.readonly else prepared.job.spec.base,
                                   lock_fd=liveness.acquire(repo.state_dir, prepared.job.id, new=True),
                                   as_written=prepared.as_written)
    result.warnings = prepared.warnings
    return result


@dataclass
class _Prepared:
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
    worktree = repo.worktree_dir() / job_id
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
                   repo=str(repo.root), created_at=created, verify=stored_verify, verify_timeout=verify_timeout,
                   timeout=timeout, max_usd=max_usd if engine.paid else None, max_turns=max_turns,
                   model=_one_name(request.model, "--model"), readonly=bool(request.readonly), depth=delegated.depth,
                   parent=parent.id if parent is not None else None,
                   isolation=choice.mode, isolation_source=choice.source + (f": {choice.note}" if choice.note else ""),
                   network=network, sockets=sockets, group=group, member=member, clone=clone, retries=retries,
                   checks=job_checks, harness=harness,
                   after=after, on_fail=on_fail)
    attempt = Attempt(n=1, state="queued", message=stored_task, queued_at=created, cost=_reserved_cost(max_usd, engine),
                      rid=paths.reservation_id(job_id, 1) if engine.paid else None, timeout=timeout, max_usd=max_usd if engine.paid else None)
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


def _after(repo: Repo, request: StartRequest, on: executors.Executor) -> tuple[list[str] | None, list[str] | None, str | None]:
    """(after, until, on_fail) of a start: the ids it waits for, the jobs to see end, what a failure does."""
    from subtask.model.job import ON_FAIL
    from subtask.ops.plans import waiting

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
    after, until = waiting.resolve_after(repo, list(names))
    return after, until, request.on_fail


def _start_waiting(repo: Repo, prepared: _Prepared) -> StartResult:
    """Record a job that waits (`plans`): its `waiting` entry, its words and environment, its
    record; nothing reserved, no branch. Then move it on at once if what it waits for has ended."""
    from subtask.ops.plans import waiting

    job, state_dir = prepared.job, repo.state_dir
    with Transaction() as tx:
        fd = liveness.acquire(state_dir, job.id, new=True)
        tx.done("start_locked", lambda: _drop_lock(state_dir, job.id, fd))
        kept = privatetext.keep(state_dir, job.id, 1, **prepared.as_written)
        tx.done("start_words_kept", (lambda: privatetext.discard(state_dir, job.id, 1)) if kept else None)
        jobenv.save(state_dir, job.id)
        tx.done("start_env_kept", lambda: jobenv.drop(state_dir, job.id))
        try:
            waiting.record_waiting(repo, job, prepared.until or [])
        finally:  # a half-written entry or record is taken back too
            tx.done("start_waiting_entry", lambda: (waiting.forget(repo, job.id), records.delete(repo, job.id)))
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
        raise SubtaskError("usage", "--retries makes no sense with --readonly: a read-only job changes nothing to retry")
    if retries:
        on.require("retries")
    given = [request.check] if isinstance(request.check, str) else request.check
    if not request.verify and not given:
        return retries, []  # nothing to check: no import of the checks on start's path
    from subtask.git import checks

    if given is not None and not isinstance(given, list):
        raise SubtaskError("usage", f"checks must be a list of names, not {given!r}")
    if request.readonly:
        if any(name != checks.NONE for value in given or () for name in checks.split(str(value))):
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
    from subtask.git import harness

    return harness.resolve(given, repo.config.get("verify.harness"))


def _isolation(repo: Repo, engine, request: StartRequest):
    """The confinement the job's engine gets; what was asked and cannot be enforced is refused."""
    from subtask.proc import isolation

    confined_as = os.environ.get(isolation.ACTIVE_ENV, "none")
    if confined_as != "none" or not _can_write_state(repo):
        # Landlock is inherited: a job started from here could write none of its records. The
        # environment can be edited; the state folder's refusal cannot.
        said = f"isolation {confined_as}" if confined_as != "none" else "it cannot write the state folder"
        raise SubtaskError("fatal", f"this process runs confined ({said}), so it cannot start jobs",
                           hint="start the job that delegates with --isolation none")
    return isolation.resolve(engine, readonly=bool(request.readonly), flag=request.isolation,
                             configured=repo.config.get("isolation"))


def _can_write_state(repo: Repo) -> bool:
    """Can this process make a file in the state folder's run/ (as `start` is about to)? False
    only for the refusals a sandbox gives (a read-only mount, Landlock); anything else is left to
    the write that follows, which says what it is."""
    import errno
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=paths.run_dir(repo.state_dir))
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

    return isolation.configured_paths(repo.config, repo.root, isolation.SOCKET_KEY) or None


def request_from_dict(item) -> tuple[str | None, StartRequest]:
    """(repo, request) from one start_many item: the fields of `start` (`StartRequest`), plus an
    optional `repo`; each checked for its kind as declared there."""
    if not isinstance(item, dict):
        raise SubtaskError("usage", f"each item must be an object with a task, not {type(item).__name__}")
    unknown = sorted(set(item) - set(START_OPTIONS) - {"repo", "id"})
    if unknown:
        raise SubtaskError("usage", f"unknown field {', '.join(map(repr, unknown))} "
                           f"(known: repo, id, {', '.join(START_OPTIONS)})")
    for key in ("repo", "id"):
        if item.get(key) is not None and not isinstance(item[key], str):
            raise SubtaskError("usage", f"{key} must be a string, not {item[key]!r}")
    for name, option in START_OPTIONS.items():
        value = item.get(name)
        if value is not None:
            check_option(option, value)
    fields = {k: item[k] for k in START_OPTIONS if item.get(k) is not None}
    return item.get("repo"), StartRequest(**{"task": ""} | fields)


def check_option(option, value) -> None:
    """`value` is of the kind `option` declares (numbers' ranges are checked where they are used)."""
    kind = option.kind
    if (option.names or option.multiple) and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return
    if kind is bool:
        ok, words = isinstance(value, bool), "true or false"
    elif kind is str:
        ok, words = isinstance(value, str), "a string" + (" or a list of strings" if option.names else "")
    elif kind is int:
        ok, words = isinstance(value, int) and not isinstance(value, bool), "a whole number"
    else:
        ok, words = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    if not ok:
        raise SubtaskError("usage", f"{option.name} must be {words}, not {value!r}")
    if option.choices and value not in option.choices:
        raise SubtaskError("usage", f"unknown {option.name} {value!r} ({', '.join(option.choices)})")


def _one_name(value, what: str) -> str | None:
    """One engine or model name: several go with --best-of only."""
    names = _names(value, what)
    if names and len(names) > 1:
        raise SubtaskError("usage", f"{what} takes one name, not {', '.join(names)}: several go with --best-of N")
    return names[0] if names else None


def start_many(items: list, repo_for=repo_at) -> list[StartResult | GroupStart | SubtaskError]:
    """Start each item; an item that fails is reported in its place and the rest still start.

    Each item is a dict with the fields of `start` and an optional `repo` (a path `repo_for` opens;
    None = its default), so one call can fan out over several repositories. Each repository is
    opened once per call (finding it and reading its settings are two git processes).

    An item may name itself (`id`) and wait for others (`after`: ids of items of this call, or
    job and group ids): items start in an order where each comes after those it names, which it
    then waits for (`start --after`). An item after one that could not start is not started;
    items that wait for each other in a circle are refused.
    """
    if not isinstance(items, list) or not items:
        raise SubtaskError("usage", "start_many needs at least one task")
    opened: dict[str | None, Repo] = {}
    said: dict = {}  # what the jobs leave out of each checkout, looked at once per base

    def repo_of(path: str | None) -> Repo:
        if path not in opened:
            opened[path] = repo_for(path)
        return opened[path]

    results: list[StartResult | GroupStart | SubtaskError | None] = [None] * len(items)
    local: dict[str, int] = {}
    for n, item in enumerate(items):
        name = item.get("id") if isinstance(item, dict) else None
        if isinstance(name, str) and name.strip():
            if name.strip() in local:
                results[n] = SubtaskError("usage", f"two items have the id {name!r}: ids must be unique in a call")
            local.setdefault(name.strip(), n)

    def local_after(item) -> list[int]:
        names = item.get("after") if isinstance(item, dict) else None
        names = [names] if isinstance(names, str) else names if isinstance(names, list) else []
        return [local[a.strip()] for a in names if isinstance(a, str) and a.strip() in local]

    waits = {n: local_after(item) for n, item in enumerate(items)}
    for n in _dependency_order(waits):
        if results[n] is not None:
            continue
        item = items[n]
        if n not in waits:  # in a circle
            results[n] = SubtaskError("usage", f"item {n + 1} waits for itself through others: `after` makes a circle")
            continue
        failed = [m for m in waits[n] if isinstance(results[m], SubtaskError)]
        if failed:
            results[n] = SubtaskError("usage", f"item {n + 1} waits for item {failed[0] + 1}, which did not start")
            continue
        try:
            path, request = request_from_dict(item)
            if request.after:  # this call's ids become the jobs (or groups) they started
                request.after = [_started_id(results[local[a]]) if a in local else a for a in _list(request.after)]
            results[n] = launch(repo_of(path), request, said)
        except SubtaskError as exc:
            results[n] = exc
    return [r if r is not None else SubtaskError("usage", "`after` makes a circle") for r in results]


def _started_id(result) -> str:
    return result.group.id if isinstance(result, GroupStart) else result.job.id


def _list(names) -> list[str]:
    """`after` as given: one name or a list of them, each maybe several separated by commas."""
    if isinstance(names, str):
        names = [names]
    return [n for text in names or [] if isinstance(text, str) for n in text.replace(",", " ").split() if n]


def _dependency_order(waits: dict[int, list[int]]) -> list[int]:
    """Every item after those it waits for (stable: in the call's order where free); the items of
    a circle come last, removed from `waits` so the caller refuses them."""
    order: list[int] = []
    done: set[int] = set()
    left = sorted(waits)
    while left:
        ready = [n for n in left if all(m in done for m in waits[n])]
        if not ready:
            for n in left:
                waits.pop(n)
            return order + left
        order.append(ready[0])
        done.add(ready[0])
        left.remove(ready[0])
    return order


# ---------------------------------------------------------------- best-of-N groups (subtask/groups.py)


@dataclass
class GroupStart:
    group: object  # groups.Group
    members: list[StartResult]
    left_out: LeftOut | None = None


def _names(values, what: str) -> list[str] | None:
    """A list of names from a list or a comma-separated string; None when none is given."""
    if values is None or values == "":
        return None
    items = values.split(",") if isinstance(values, str) else list(values)
    if not all(isinstance(v, str) for v in items) or not all(v.strip() for v in items):
        raise SubtaskError("usage", f"{what} must be names separated by commas, not {values!r}")
    return [v.strip() for v in items] or None


def start_group(repo: Repo, request: StartRequest) -> GroupStart:
    """Start a best-of-N group (`request.best_of`): N ordinary jobs at one task and base, admitted
    and reserved all or none, and the group record that names them (the pick is `groups.settle`'s).
    `request.engine` and `.model` may name several, cycled over the members."""
    groups = _groups()
    how = request
    n = how.best_of
    if isinstance(n, bool) or not isinstance(n, int) or not groups.MIN_MEMBERS <= n <= groups.MAX_MEMBERS:
        raise SubtaskError("usage", f"--best-of must be a whole number from {groups.MIN_MEMBERS} to "
                           f"{groups.MAX_MEMBERS}, not {n!r}")
    if how.pick is not None and how.pick not in groups.RULES:
        raise SubtaskError("usage", f"unknown --pick {how.pick!r} ({', '.join(groups.RULES)})")
    if how.judge is not None and (how.pick is not None or not how.judge.strip()):
        raise SubtaskError("usage", "--judge needs a command, and takes the place of --pick (give one of them)")
    if how.first_pass and (how.pick is not None or how.judge is not None):
        raise SubtaskError("usage", "--first-pass picks the first attempt to pass verify: it takes no --pick or --judge")
    if request.readonly:
        raise SubtaskError("usage", "--best-of makes no sense with --readonly: read-only jobs change nothing to pick from")
    if request.after:
        raise SubtaskError("usage", "--best-of starts its attempts now: a group cannot wait (--after) yet",
                           hint="start one job --after, and the group once it ended: git subtask wait ID && ...")
    on = executors.choose(repo.config, request.on)
    on.require("best_of")
    if how.judge is not None:
        on.require("judge")
    verify = request.verify if request.verify is not None else repo.config.get("verify")
    if not verify or not verify.strip():
        raise SubtaskError("usage", "--best-of needs --verify (or git config subtask.verify): there is nothing to "
                           "choose by", hint="git subtask start --best-of 3 --verify 'pytest -q' '...'")
    engines = _names(request.engine, "--engine") or [default_engine(repo)]
    models = _names(request.model, "--model") or [None]
    base = resolve_commit(repo, request.base or "HEAD")  # one base for every member
    gid = groups.new_group_id()
    member_request = {**request.__dict__, "verify": verify, "base": base, "best_of": None, "pick": None,
                      "judge": None, "first_pass": False}
    prepared = [_prepare(repo, StartRequest(**{**member_request, "engine": engines[k % len(engines)],
                                               "model": models[k % len(models)]}),
                         group=gid, member=k + 1) for k in range(n)]
    if any(p.paid for p in prepared):
        _sync_ledger(repo)
    first = prepared[0].job.spec
    group = groups.Group(id=gid, task=first.task, base=base, verify=first.verify or "", created_at=first.created_at,
                         members=[p.job.id for p in prepared], engines=[p.job.spec.engine for p in prepared],
                         models=[p.job.spec.model for p in prepared], rule="judge" if how.judge else how.pick or "smallest",
                         judge=redact(how.judge) if how.judge else None, first_pass=bool(how.first_pass))
    return GroupStart(group, _launch_group(repo, gid, group, prepared, what=f"the {n} attempts of this group",
                                           judge=how.judge))


@dataclass
class MapStart(GroupStart):
    batches: list[list[str]] = field(default_factory=list)


def map_files(repo: Repo, pattern: str, base: str) -> list[str]:
    """The files of `base` that git's glob `pattern` matches (from the top of the repository)."""
    import tempfile

    if not isinstance(pattern, str) or not pattern.strip() or "\0" in pattern or "\n" in pattern:
        raise SubtaskError("usage", f"not a glob: {pattern!r}")
    with tempfile.TemporaryDirectory(prefix="subtask-map-") as scratch:  # the base's files, not the index's
        env = dict(os.environ, GIT_INDEX_FILE=str(Path(scratch) / "index"))
        git(repo.root, "read-tree", base, env=env)
        out = git(repo.root, "ls-files", "-z", "--full-name", "--", f":(top,glob){pattern}", env=env).stdout
    return [name for name in out.split("\0") if name]


def start_map(repo: Repo, pattern: str, request: StartRequest, *, batch: int = 1,
              concurrency: int | None = None) -> MapStart:
    """One job per batch of the base's files matching `pattern` (`{files}` in the task: the batch,
    shell-quoted), as one group (`groups.Group`, kind "map"): admitted and reserved all or none;
    at most `concurrency` of them run at once (slots pools), within maxRunning."""
    import shlex

    groups = _groups()
    batch = int(_positive(batch, "--batch", allow_none=False, integer=True))
    if concurrency is not None:
        concurrency = int(_positive(concurrency, "--concurrency", integer=True))
    template = _check_task(request.task)
    if "{files}" not in template:
        raise SubtaskError("usage", "the task names no {files}: say where each job's files go",
                           hint="git subtask map 'src/*.py' 'add type hints to {files}'")
    if request.readonly or request.after:
        raise SubtaskError("usage", "map starts writing jobs now: no --readonly or --after")
    on = executors.choose(repo.config, request.on)
    on.require("map")
    if concurrency is not None:
        on.require("concurrency")
    base = resolve_commit(repo, request.base or "HEAD")
    files = map_files(repo, pattern, base)
    if not files:
        raise SubtaskError("usage", f"no tracked file matches {pattern!r} at {base[:12]}",
                           hint="git ls-files ':(glob)PATTERN' shows what a glob matches")
    batches = [files[i:i + batch] for i in range(0, len(files), batch)]
    if len(batches) > groups.MAX_MAP_JOBS:
        raise SubtaskError("usage", f"{len(files)} files by {batch} make {len(batches)} jobs; the limit is "
                           f"{groups.MAX_MAP_JOBS}", hint="give a larger --batch")
    gid = groups.new_group_id()
    prepared = []
    for k, names in enumerate(batches):
        task = template.replace("{files}", " ".join(shlex.quote(n) for n in names))
        member = _prepare(repo, StartRequest(**{**request.__dict__, "task": task, "base": base}), group=gid, member=k + 1)
        member.job.spec.concurrency = concurrency
        prepared.append(member)
    if any(p.paid for p in prepared):
        _sync_ledger(repo)
    first = prepared[0].job.spec
    group = groups.Group(id=gid, task=redact(template), base=base, verify=first.verify or "", created_at=first.created_at,
                         members=[p.job.id for p in prepared], engines=[first.engine], models=[first.model],
                         rule="map", kind="map", concurrency=concurrency, pattern=pattern, batch=batch)
    results = _launch_group(repo, gid, group, prepared, what=f"the {len(prepared)} jobs of this map")
    return MapStart(group, results, left_out=left_out(repo, request, base), batches=batches)


def _launch_group(repo: Repo, gid: str, group, prepared: list[_Prepared], *, what: str, judge: str | None = None
                  ) -> list[StartResult]:
    """Admit and start a group's members all or none, then write the group record."""
    groups = _groups()

    def write_group() -> None:
        groups.keep_judge(repo, gid, judge)
        groups.create(repo, group)

    if not prepared[0].on.runs_here:
        return _launch_elsewhere(repo, prepared, what=what, then_record=write_group)
    launches = []
    try:
        for p in prepared:
            launches.append(_Launch(p.job, p.paid, p.job.spec.base, liveness.acquire(repo.state_dir, p.job.id, new=True),
                                    p.as_written))
    except BaseException:
        for launch in launches:
            _drop_lock(repo.state_dir, launch.job.id, launch.lock_fd)
        raise
    results = _launch_all(repo, launches, what=what, then_record=write_group,
                          undo_record=lambda: groups.delete(repo, gid))
    for result, p in zip(results, prepared, strict=True):
        result.warnings = p.warnings
    return results


def _launch_elsewhere(repo: Repo, prepared: list[_Prepared], *, what: str, then_record) -> list[StartResult]:
    """A group's members handed to the executor that runs them elsewhere, all or none: their
    money is checked against the cap together first; a member that cannot be handed over stops
    the ones handed over before it (charged nothing: none has run)."""
    on = prepared[0].on
    usd = sum((p.job.state.current.cost.reserved * (1 + (p.job.spec.retries or 0)) for p in prepared if p.paid),
              money.ZERO)
    if usd:
        left = ledger.summary(repo.state_dir, repo.config.number("monthlyCapUsd")).left_usd
        if usd > left:
            raise SubtaskError("budget", f"{what} reserve {money.text(usd)} together, more than this month's cap "
                               f"has left ({money.text(max(left, money.ZERO))})", hint="git subtask spend")
    started: list[StartResult] = []
    try:
        for p in prepared:
            started.append(StartResult(on.backend().submit(repo, p.job, p.paid), 0, on=on.name))
        then_record()
    except BaseException:
        for result in started:
            try:
                on.backend().stop(repo, result.job.id)
            except Exception as exc:  # said, never hidden: that one still runs there
                warnings.warn(f"{result.job.id} could not be stopped: {getattr(exc, 'message', exc)}", stacklevel=2)
        raise
    return started


def stop_group(repo: Repo, gid_or_prefix: str):
    gid = _groups().resolve(repo, gid_or_prefix)
    if not ownership.started_here(repo, gid):
        raise SubtaskError("negative", f"{gid} is another clone's group: only its own workers end its members")
    return _groups().stop(repo, gid)


def merge_group(repo: Repo, gid_or_prefix: str, mode: str = "merge", force: bool = False, reverify: bool = False):
    """Merge the group's pick (the ordinary gate), supersede the rest. Returns (group, lines)."""
    return _groups().merge(repo, _groups().resolve(repo, gid_or_prefix), mode=mode, force=force, reverify=reverify)


def compare_argvs(repo: Repo, gid_or_prefix: str, stat: bool = True) -> list[tuple[str, list[str]]]:
    """(title, git diff argv) for every pair of the group's members: their heads against each other."""
    return [(f"{a} .. {b}", ["git", "-C", str(repo.root), "diff", *(["--stat"] if stat else []), head_a, head_b])
            for a, head_a, b, head_b in _compare_pairs(repo, gid_or_prefix)]


def _compare_pairs(repo: Repo, gid_or_prefix: str) -> list[tuple[str, str, str, str]]:
    groups = _groups()
    group, _tip = groups.read(repo, groups.resolve(repo, gid_or_prefix))
    return groups.compare_pairs(repo, group)


def compare(repo: Repo, gid_or_prefix: str, stat: bool = True, limit: int | None = None) -> dict:
    """The diffs between a group's members, every pair (the pick first), bounded in all by `limit`."""
    left = min(OUTPUT_LIMIT if limit is None else int(_positive(limit, "max_bytes", integer=True)), MAX_OUTPUT_LIMIT)
    gid = _groups().resolve(repo, gid_or_prefix)
    pairs = []
    for a, head_a, b, head_b in _compare_pairs(repo, gid):
        text, truncated, size = git_output(repo, ["diff", "--no-color", "--no-ext-diff",
                                                  *(["--stat"] if stat else []), head_a, head_b], max(left, 1))
        left = max(0, left - len(text.encode()))
        pairs.append({"a": a, "head_a": head_a, "b": b, "head_b": head_b, "text": text, "truncated": truncated,
                      "bytes": size})
    return {"v": 1, "group": gid, "stat": stat, "pairs": pairs}


def _admit_and_launch(repo: Repo, job: Job, paid: bool, *, branch_at: str | None, lock_fd: int,
                      as_written: dict) -> StartResult:
    """Admit (or queue) and reserve, write branch/pins/record, spawn; undo it all on any failure.

    For attempt 1 the record is created; for a reply the new attempt is appended to it, by
    compare-and-swap on an ended attempt, so concurrent replies add exactly one.
    """
    return _launch_all(repo, [_Launch(job, paid, branch_at, lock_fd, as_written)])[0]


@dataclass
class _Launch:
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
    state_dir = repo.state_dir
    handed: list[slots.HandOff] = []
    dead: list[slots.HandOff] = []
    spawned: list[_Launch] = []
    unspawned: list[_Launch] = []
    with Transaction() as tx:
        for launch in launches:
            tx.done("start_locked", lambda launch=launch: _drop_lock(state_dir, launch.job.id, launch.lock_fd))
        admitted: tuple = (dead, handed)
        tx.then = lambda: admission.after_admission(repo, admitted)
        try:
            positions, dead, handed = admission.admit(repo, launches, what)
        except BaseException as exc:
            admitted = getattr(exc, "admission", admitted)
            raise
        admitted = (dead, handed)
        # Every member's slot entry was made at once: each is undone, whatever fails after.
        tx.done("start_admitted", *[lambda job=launch.job, n=launch.job.state.current.n: admission.unadmit(repo, job.id, n)
                                    for launch in launches])
        for launch in launches:
            job, attempt = launch.job, launch.job.state.current
            # Once the slot entry is on disk (whoever settles a crash from here drops them too), and
            # before anyone can be handed the job (we hold its run-lock): whoever runs it uses these.
            kept = privatetext.keep(state_dir, job.id, attempt.n, **launch.as_written)
            tx.done("start_words_kept",
                    (lambda job=job, attempt=attempt: privatetext.discard(state_dir, job.id, attempt.n)) if kept else None)
            jobenv.save(state_dir, job.id)
            tx.done("start_env_kept", lambda job=job: jobenv.drop(state_dir, job.id))
            if launch.paid:
                tx.done("start_reserved", lambda attempt=attempt: ledger.close(state_dir, attempt.rid, 0.0,
                                                                               reason="start undone"))
        for launch in launches:
            job, attempt = launch.job, launch.job.state.current
            if attempt.n == 1:  # its branch (none for a read-only job) and base pin: one ref transaction
                branch = job.spec.branch if launch.branch_at is not None else None
                records.create_start_refs(repo, job.id, branch, job.spec.base)
                tx.done("after_branch", lambda job=job, branch=branch: _drop_start_refs(repo, job.id, branch))
                records.create(repo, job)  # undone with the refs: `records.delete` drops the record too
                tx.done("start_job_recorded")
                continue
            if launch.branch_at is not None:  # a reply restores the job's branch here
                records.create_branch(repo, job.spec.branch, launch.branch_at)
                tx.done("after_branch", lambda job=job: _delete_branch(repo, job.spec.branch))
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


def _drop_lock(state_dir: Path, job_id: str, fd: int) -> None:
    liveness.release(fd)
    try:
        liveness.lock_path(state_dir, job_id).unlink()
    except FileNotFoundError:
        pass


def _drop_start_refs(repo: Repo, job_id: str, branch: str | None) -> None:
    """Undo `records.create_start_refs` (and `records.create`): the branch, the pins, the record."""
    if branch is not None:
        _delete_branch(repo, branch)
    records.delete(repo, job_id)


def _delete_branch(repo: Repo, branch: str) -> None:
    ref = repo.objects.ref(f"refs/heads/{branch}")
    if ref is not None:
        records.cas_ref(repo, ref.name, ref.target, None)


# ---------------------------------------------------------------- reply

REPLY_LOCK_WAIT = 3.0


def reply(repo: Repo, id_or_prefix: str, message: str, *, max_usd: float | None = None,
          timeout: float | None = None) -> StartResult:
    """A new attempt of a finished job in the same worktree, resuming the engine's session."""
    from subtask.engines import get_engine

    message = _check_task(message)
    job = get(repo, id_or_prefix)
    job_id = job.id
    previous = job.state.current
    if not previous.terminal:
        raise SubtaskError("not_finished", f"{job_id} is {previous.state}; only a finished job can be replied to",
                           hint=f"git subtask wait {job_id}")
    if not ownership.owns(repo, job):  # its spec (branch, worktree, task) is a teammate's claim, never ours to run
        raise SubtaskError("negative", f"{job_id} is another clone's job: a reply runs here only for a job this "
                           "clone started", hint=f"start a new job from its branch: git subtask start --base "
                           f"{job.spec.base} '...'")
    if job.spec.after and repo.objects.ref(records.pin_ref(job_id, "base")) is None:
        raise SubtaskError("negative", f"{job_id} never started ({previous.state} while it waited): there is no "
                           "work to reply to", hint=f"start it again: git subtask start --after ... (git subtask show {job_id})")
    executor = executors.of(job)
    executor.require("reply")
    repo.config.require_valid(job.spec.engine)
    engine = get_engine(job.spec.engine, repo.config)
    if executor.runs_here:  # elsewhere, the node that runs it needs the engine, not this machine
        _check_engine_can_run(engine)
    usd = _max_usd(repo, engine, max_usd if max_usd is not None else job.spec.max_usd)
    timeout = _positive(timeout, "--timeout") if timeout is not None else (job.spec.timeout or _default_timeout(repo, engine))
    _check_depth(repo)
    if executor.runs_here:
        worktrees.check_runnable(repo, job_id, Path(job.spec.worktree))  # a record's path is data, never authority
        worktrees.drop_stale(repo, job_id, Path(job.spec.worktree))  # removed by hand: the worker checks it out again
    lock_fd = _acquire_for_reply(repo, job_id)
    n = previous.n + 1
    stored = redact(message)
    attempt = Attempt(n=n, state="queued", message=stored, queued_at=now(), cost=_reserved_cost(usd, engine),
                      rid=paths.reservation_id(job_id, n) if engine.paid else None, timeout=timeout,
                      max_usd=usd if engine.paid else None, session_id=None)
    job.state.attempts.append(attempt)
    try:
        fresh = records.read(repo, job_id)
        if fresh.state.current.n != previous.n:
            raise SubtaskError("not_finished", f"another reply already started attempt {fresh.state.current.n} of {job_id}",
                               hint=f"git subtask wait {job_id}")
    except BaseException:
        liveness.release(lock_fd)
        raise
    # The stop of an earlier attempt must not end this one before it starts.
    lifecycle.stop_marker(repo.state_dir, job_id).unlink(missing_ok=True)
    if not executor.runs_here:
        try:
            return StartResult(executor.backend().reply(repo, job, attempt, engine.paid), 0, on=executor.name)
        finally:
            liveness.release(lock_fd)
    if engine.paid:
        _sync_ledger(repo)
    # A branch that cleanup or gc deleted (no commits beyond its base, or landed) comes back where
    # the job's work ends, so the reply continues from it.
    branch_at = None
    if job.spec.branch and repo.git.references.get(f"refs/heads/{job.spec.branch}") is None:
        from subtask.ops.landing import landed

        branch_at = landed.job_head(repo, job)
    return _admit_and_launch(repo, job, engine.paid, branch_at=branch_at, lock_fd=lock_fd,
                             as_written={"message": message, "stored_message": stored})


def _acquire_for_reply(repo: Repo, job_id: str) -> int:
    """The job's run-lock, once its previous worker has let go; busy means another reply has it."""
    return liveness.acquire_within(repo.state_dir, job_id, REPLY_LOCK_WAIT)


# ---------------------------------------------------------------- stop, cleanup

def stop(repo: Repo, id_or_prefix: str) -> Job:
    """End a job: drop it from the queue, or end its worker's process groups (TERM, then KILL)."""
    job = get(repo, id_or_prefix)
    job_id = job.id
    attempt = job.state.current
    if attempt.terminal:
        raise SubtaskError("negative", f"{job_id} already ended ({attempt.state}); nothing to stop")
    if not ownership.owns(repo, job):  # its worker runs in the clone that started it, and ends it there
        raise SubtaskError("negative", f"{job_id} is another clone's job: only its own worker ends it",
                           hint=f"ask whoever started it (its record names clone {job.spec.clone or 'unknown'})")
    executor = executors.of(job)
    if not executor.runs_here:
        return executor.backend().stop(repo, job_id)
    from subtask.ops.plans import waiting

    # A waiting job ends here, under its run-lock; one that started meanwhile is stopped as any job.
    if attempt.state != WAITING or not waiting.stop_waiting(repo, job_id):
        lifecycle.stop_job(repo, job_id)
    job = records.read(repo, job_id)
    if job.spec.group:  # a member stopped by hand may be the last one its group waited for
        _groups().after_member_ended(repo, job)
    waiting.advance(repo)  # the jobs waiting for it are skipped now, not at the next command
    return job


def cleanup(repo: Repo, id_or_prefix: str, dry_run: bool = False) -> str:
    """Remove a finished job's worktree when it is clean, and its branch when it has no commits
    beyond its base; keep a branch with commits, and the record and pins always."""
    job = get(repo, id_or_prefix)
    if not job.state.current.terminal:
        raise SubtaskError("not_finished", f"{job.id} is {job.state.current.state}; stop it or wait for it first",
                           hint=f"git subtask wait {job.id}")
    from subtask.ops.landing import cleanup, landed

    path = Path(job.spec.worktree)
    removal, branch = cleanup.clean_job(repo, job, landed.land_target(repo), dry_run=dry_run)
    if removal.kind == "busy":
        raise SubtaskError("not_finished", f"{job.id}: keeping the worktree: {removal.why}",
                           hint=f"git subtask wait {job.id}")
    if removal.kind == "failed":
        raise SubtaskError("fatal", f"{job.id}: {removal.why}", hint="git worktree list")
    if removal.kind == "kept":
        raise SubtaskError("dirty", f"{job.id}: keeping the worktree: {removal.why}",
                           hint=f"commit or discard what is there, or put its commits on a branch (git -C '{path}' "
                                f"status), then: git subtask cleanup {job.id}")
    words = "would remove" if dry_run else "removed"
    tree = (f"{words} worktree {path}" if removal.kind == "removed" else
            f"{'would forget' if dry_run else 'forgot'} git's registration of worktree {path} ({removal.why})"
            if removal.kind == "pruned" else "no worktree to remove")
    if branch.kind == "removed":
        gone = "would delete" if dry_run else "deleted"
        return f"{job.id}: {tree}; {gone} branch {job.spec.branch} ({cleanup.EMPTY_BRANCH}; record kept)"
    if removal.kind != "removed" or dry_run:
        return f"{job.id}: {tree}"
    kept = f"branch {job.spec.branch} and record kept" if job.spec.branch else "record kept"
    return f"{job.id}: {tree} ({kept})"


def diff_argv(repo: Repo, id_or_prefix: str, stat: bool = False, paths: list[str] | None = None) -> list[str]:
    job = get(repo, id_or_prefix)
    head = _head_of(repo, job)
    return ["git", "-C", str(repo.root), "diff", *(["--stat"] if stat else []), job.spec.base, head,
            *(["--", *_paths(paths)] if paths else [])]


def log_argv(repo: Repo, id_or_prefix: str) -> list[str]:
    job = get(repo, id_or_prefix)
    head = _head_of(repo, job)
    return ["git", "-C", str(repo.root), "log", "--notes=subtask", f"{job.spec.base}..{head}"]


OUTPUT_LIMIT = 50_000  # bytes of a diff or log a reply carries by default (an agent's context is the budget)
MAX_OUTPUT_LIMIT = 10_000_000


@dataclass
class GitOutput:
    """What git printed for a review command, cut at `limit` bytes on a line boundary."""

    id: str
    base: str
    head: str
    text: str
    truncated: bool
    size: int  # bytes git printed in all

    def to_dict(self) -> dict:
        return {"v": 1, "id": self.id, "base": self.base, "head": self.head, "text": self.text,
                "truncated": self.truncated, "bytes": self.size}


def diff(repo: Repo, id_or_prefix: str, stat: bool = False, paths: list[str] | None = None,
         limit: int | None = None) -> GitOutput:
    """`git diff base head` of a job (its stat, or its patch), bounded; works after landing."""
    job = get(repo, id_or_prefix)
    head = _head_of(repo, job)
    argv = ["diff", "--no-color", "--no-ext-diff", *(["--stat"] if stat else []), job.spec.base, head,
            *(["--", *_paths(paths)] if paths else [])]
    return _bounded(repo, job, head, argv, limit)


def log(repo: Repo, id_or_prefix: str, limit: int | None = None) -> GitOutput:
    """`git log --notes=subtask base..head` of a job, bounded."""
    job = get(repo, id_or_prefix)
    head = _head_of(repo, job)
    return _bounded(repo, job, head, ["log", "--no-color", "--notes=subtask", f"{job.spec.base}..{head}"], limit)


def _paths(paths) -> list[str]:
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise SubtaskError("usage", f"paths must be a list of paths, not {paths!r}")
    return paths


def _bounded(repo: Repo, job: Job, head: str, argv: list[str], limit: int | None) -> GitOutput:
    limit = OUTPUT_LIMIT if limit is None else int(_positive(limit, "max_bytes", integer=True))
    limit = min(limit, MAX_OUTPUT_LIMIT)
    text, truncated, size = git_output(repo, argv, limit)
    return GitOutput(job.id, job.spec.base, head, text, truncated, size)


def git_output(repo: Repo, argv: list[str], limit: int) -> tuple[str, bool, int]:
    """(text, truncated, bytes printed) of `git argv`: the first `limit` bytes, cut at a line end;
    the rest is read and counted, not kept."""
    import subprocess
    import tempfile

    with tempfile.TemporaryFile() as errors, subprocess.Popen(
            ["git", "-C", str(repo.root), "-c", "core.quotePath=false", *argv],
            stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL) as proc:
        kept = proc.stdout.read(limit + 1)
        size = len(kept)
        while chunk := proc.stdout.read(1 << 20):
            size += len(chunk)
        proc.wait()
        errors.seek(0)
        error = errors.read().decode("utf-8", "replace").strip()
    if proc.returncode != 0:
        raise SubtaskError("fatal", f"git {argv[0]} failed: {error or f'exit {proc.returncode}'}")
    truncated = size > limit
    if truncated:
        kept = kept[:limit]
        kept = kept[: kept.rfind(b"\n") + 1] or kept
    return kept.decode("utf-8", "replace"), truncated, size


def _head_of(repo: Repo, job: Job) -> str:
    """The job's head: its branch tip while it exists, else the head pin (so review works after landing)."""
    from subtask.ops.landing.landed import job_head

    return job_head(repo, job)


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


def engine_plugins() -> list[str]:
    """The engines other packages register (each reads `subtask.engine.<name>.*` of its own)."""
    from subtask.engines import plugin_names

    return plugin_names()


def spend(repo: Repo, month: str | None = None, all_clones: bool = False):
    """This month's spend: committed, open reservations, per engine, cap left.

    `all_clones`: the spend of every clone whose records are here (pulled), from the records only.
    """
    if month is not None:
        ledger.check_month(month)
    sweep(repo)
    if all_clones:
        return spending.team_spend(repo, month)
    _sync_ledger(repo)
    return ledger.summary(repo.state_dir, repo.config.number("monthlyCapUsd"), month)


def _sync_ledger(repo: Repo) -> None:
    """The ledger is a cache of the records: restore it from them when it lacks this repository's
    mark (a lost state directory), before any lock is taken (reading records is slow)."""
    spending.sync_ledger(repo)


# ---------------------------------------------------------------- notes, landing, hooks, sync

def init(repo: Repo, display: bool = False) -> list[str]:
    """Set the repository up: notes merge strategy, notes ref, and (`display`) notes in plain `git log`."""
    from subtask.git import notes, notes_store

    changed = notes.ensure_notes_config(repo)
    notes_store.ensure_ref(repo.git)
    ensure_excluded(repo.common_dir)
    if display:
        shown = git(repo.root, "config", "--get-all", "notes.displayRef", check=False).stdout.split()
        if notes_store.NOTES_REF not in shown:
            git(repo.root, "config", "--local", "--add", "notes.displayRef", notes_store.NOTES_REF)
            changed.append(f"notes.displayRef += {notes_store.NOTES_REF} (plain git log shows the review notes)")
    return changed


def notes_rebuild(repo: Repo) -> int:
    """Regenerate every job's note block from its record; idempotent. Returns blocks changed."""
    from subtask.git import notes

    return notes.rebuild(repo)


def verify(repo: Repo, id_or_prefix: str, run: bool = False, reuse: bool | None = None):
    """`git subtask verify`: the job's record checked against git (signature, pins, evidence, the
    verify result; with `run`, its verify command on the exact commit, unless a result for the
    same tree, command, harness and environment is known and `reuse` is not False). Returns a
    `record_check.Recheck`."""
    from subtask.ops.landing import record_check

    return record_check.recheck(repo, get(repo, id_or_prefix), run=run, reuse=reuse)


def merge_mode(*, squash: bool = False, no_ff: bool = False, ff_only: bool = False) -> str:
    """The one merge mode the flags ask for; two of them at once is a usage error, as in git."""
    asked = [flag for flag, on in (("--squash", squash), ("--no-ff", no_ff), ("--ff-only", ff_only)) if on]
    if len(asked) > 1:
        raise SubtaskError("usage", f"{' and '.join(asked)} cannot be used together: give one merge mode",
                           hint="git subtask merge [--squash | --no-ff | --ff-only] ID")
    return asked[0][2:] if asked else "merge"


def land_mode(*, squash: bool = False, no_ff: bool = False, rebase: bool = False) -> str:
    """The one landing mode the flags ask for (`merge` without any); two at once is a usage error."""
    asked = [flag for flag, on in (("--squash", squash), ("--no-ff", no_ff), ("--rebase", rebase)) if on]
    if len(asked) > 1:
        raise SubtaskError("usage", f"{' and '.join(asked)} cannot be used together: give one landing mode",
                           hint="git subtask land [--squash | --no-ff | --rebase] ID...")
    return asked[0][2:] if asked else "merge"


def merge(repo: Repo, id_or_prefix: str, mode: str = "merge", force: bool = False, reverify: bool = False):
    from subtask.ops.landing import merge

    return merge.merge(repo, id_or_prefix, mode=mode, force=force, reverify=reverify)


def land(repo: Repo, ids: list[str], *, mode: str = "merge", verify: str | None = None, atomic: bool = False,
         reconcile: bool = False, force: bool = False, dry_run: bool = False, window: int | None = None,
         batch: int | None = None, reuse: bool | None = None, first: list[str] | None = None,
         progress=None):
    """Land many jobs in order, each verified on the commit that lands (`lineup.LandResult`);
    with `dry_run`, what would happen and which jobs touch the same files (`overlap.Plan`).
    `window`: states verified at once; `batch`: jobs per batch (0: the configured size);
    `reuse` False: run every verify; `first`: jobs put ahead of the rest; `progress`: called
    with what the window is doing (`render.land_progress`)."""
    from subtask.ops.landing import land, lineup

    opts = lineup.Options(mode=mode, verify=verify, atomic=atomic, reconcile=reconcile, force=force,
                             window=window, batch=batch, reuse=reuse, first=list(first or []), progress=progress)
    sweep(repo)
    if dry_run:
        from subtask.ops.landing import overlap

        return overlap.plan(repo, ids, opts)
    return land.land(repo, ids, opts, replier=_reply_and_wait(repo))


def _reply_and_wait(repo: Repo):
    """How `land --reconcile` answers a conflict: a reply to the job, waited for to its end."""
    from subtask.api.waiting import wait

    def reply_and_wait(job_id: str, message: str) -> Job:
        reply(repo, job_id, message)
        return wait(repo, [job_id], stalls=False).jobs[0]

    return reply_and_wait


def cleanup_merged(repo: Repo, dry_run: bool = False):
    from subtask.ops.landing import cleanup

    return cleanup.cleanup_merged(repo, dry_run=dry_run)


def du(repo: Repo):
    """What each job's worktree costs on disk (tracked, untracked, ignored), the objects only its
    refs keep, the other folders in the worktree folder, and what cleanup --merged and gc would free."""
    from subtask.ops.running import disk

    return disk.usage(repo)


def gc(repo: Repo, dry_run: bool = False, older_than: str = "30d"):
    from subtask.ops.landing import cleanup

    sweep(repo)
    return cleanup.gc(repo, dry_run=dry_run, older_than=older_than)


def pool_status(repo: Repo):
    """The worktree pool: its entries (commit, bytes), what `subtask.pool` and `poolMaxBytes` ask."""
    from subtask.git import pool

    return pool.status(repo)


def pool_fill(repo: Repo, count: int | None = None):
    """Fill the worktree pool now, in this process, to `count` entries (default `subtask.pool`)
    at the main worktree's HEAD; (the entries made, the pool after)."""
    from subtask.git import pool

    if count is not None:
        count = _positive(count, "the number of worktrees", integer=True) if count != 0 else 0
    made = pool.fill(repo, count, wait=600.0)
    return made, pool.status(repo)


def hooks(repo: Repo, action: str):
    from subtask.ops.sharing import hooks as hooks_mod

    return {"install": hooks_mod.install, "uninstall": hooks_mod.uninstall, "status": hooks_mod.status}[action](repo)


def install(client: str, scope: str = "user", *, uninstall: bool = False, dry_run: bool = False,
            where: str | os.PathLike | None = None, on_plan=None):
    """Register (or with `uninstall`, take out) the MCP server and the agent's guide in Claude
    Code's or Codex's own configuration (`client_config.py`); `on_plan(lines)` sees the plan first."""
    from subtask.ops.sharing import client_config

    root = repo_at(where).root if scope == "project" else None
    act = client_config.uninstall if uninstall else client_config.install
    return act(client, scope, root, dry_run=dry_run, on_plan=on_plan)


def push(repo: Repo, remote: str = "origin", branches: bool = False):
    from subtask.ops.sharing import sync

    return sync.push(repo, remote, branches=branches)


def pull(repo: Repo, remote: str = "origin"):
    from subtask.ops.sharing import sync

    active_elsewhere = {e["id"] for e in records.list_entries(repo) if e.get("on") and e.get("state") in ACTIVE}
    result = sync.pull(repo, remote)
    arrived = [ref[len(records.PREFIX):-len("/record")] for ref in result.updated if ref.endswith("/record")]
    _bring_home_from_elsewhere(repo, arrived + result.new_jobs, active_elsewhere)
    return result


def _bring_home_from_elsewhere(repo: Repo, job_ids: list[str], active: set[str] = frozenset()) -> None:
    """Jobs of this clone run elsewhere whose final record a pull brought: their branch,
    reservation, note; the end told (`ops.notify`) of those this pull found still active."""
    from subtask.ops.running import notify

    for job_id in job_ids:
        try:
            job = records.read(repo, job_id)
            executor = executors.of(job)
        except SubtaskError:
            continue
        if not executor.runs_here and job.state.current.terminal and ownership.owns(repo, job):
            from subtask.ops.sharing import sync

            try:
                sync.fetch_job(repo, executors.placement(job.spec)["url"], job_id)  # its branch
            except SubtaskError as exc:
                warnings.warn(f"{job_id}: its branch could not be fetched: {exc.message}", stacklevel=2)
            executor.backend().bring_home(repo, records.read(repo, job_id))
            ended = records.read(repo, job_id)
            if job_id in active:
                notify.attempt_ended(repo, ended)
            if ended.spec.group:  # a member brought home may be the last its group waited for
                _groups().after_member_ended(repo, ended)
    from subtask.ops.plans import waiting

    waiting.advance_quietly(repo)  # ... and the jobs waiting for what came home
