"""The Ray executor, home side: submit a job to a Ray cluster, follow it, bring its results home.

A job is only refs, so git carries it both ways and Ray only schedules: `start` validates and
reserves money here as for a local job, creates the branch, base pin and record, pushes them to
`subtask.remote` (never forced) and submits a Ray job (Job Submission API) whose entrypoint is
`git-subtask run-remote <id>` (`subtask/executors/remote.py`) with one `subtask_slot` custom
resource: the cluster's slots bound how many run at once, and Ray queues the rest as PENDING (no
local slot is held). The node pushes the branch, record chain, pins and note back; `wait`, `list`,
`stop` and `pull` fetch them (`collect`).

Invariants:
- Never import Ray outside `subtask/executors/ray.py`, nor there unless a job runs on Ray, because
  `import ray` costs about a second: the CLI's hot path (and every local job) must not pay it.
- Nothing changes before the input is valid: Ray importable, the address answering, the remote
  accepting a dry-run push of the job's branch. A failure (or Ctrl-C) before the submission
  returns undoes every step, the refs pushed to the remote included (deleted with a lease on
  the exact commit pushed, never forced over anything else).
- The record is created before the money is reserved, and the starter holds the job's run-lock
  until the submission returned: a crash in between leaves a record that `collect` (which passes
  over a job whose run-lock is held) ends as failed when Ray has no such job, charged nothing.
- Never write the record of a job a Ray node runs while Ray says it runs, because the node's
  record chain must arrive home as a fast-forward; home writes it only after Ray says the job
  ended and the node's last push was fetched (then: failed with Ray's reason, or stopped).
- At most one status request per second per job while waiting.
- Never give a Ray job this machine's environment, because it is stored in the cluster's job
  config: `runtime_env` carries the engine's own variables (when set here) and those
  `subtask.ray.env` names, nothing else; the task as written never leaves this machine.
- Never let a node reserve money or a slot (a verify loop's retry on Ray), because neither is
  there: the loop's budgets are reserved at home with the job, in one reservation, and settled
  per attempt when it comes home (`ray.reserve`, `ray.settle_money`); and never stop or end a
  job that runs elsewhere through the local stop (a first pass, a group's stop), because its
  node writes its record while it runs: `lifecycle.stop_job` hands it to its executor.
- Never let a node run an attempt it has not claimed on the remote (a record commit naming the
  node, pushed as a fast-forward of the queued record), and never end a queued Ray attempt at
  home before the remote took that end the same way, because a `stop` races the node that Ray
  gives the job to: the remote's ref lets exactly one of the two win.
- Never hold a local slot for a Ray job, because the cluster's `subtask_slot`s bound it: a job
  whose record says it runs on Ray is left out of `slots.json` rebuilds and of doctor's orphans.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import shlex
import socket
import sys
import threading
import time
import urllib.request
import warnings
from typing import Any
from urllib.parse import urlparse

from subtask.engines import get_engine
from subtask.engines.base import resumes
from subtask.executors import placement, ray_job_id
from subtask.git import notes, records
from subtask.git.gitrepo import Repo, git
from subtask.git.records import Job
from subtask.model import config, money
from subtask.model.dataclass import dataclass
from subtask.model.errors import SubtaskError
from subtask.model.redact import redact
from subtask.model.transaction import Transaction
from subtask.ops.plans import groups, waiting
from subtask.ops.running import lifecycle, notify, spending
from subtask.ops.sharing import sync
from subtask.state import jobenv, ledger, liveness, privatetext

RESOURCE = "subtask_slot"
STATUS_INTERVAL = 1.0  # seconds between status requests for one job (the promise: at most 1/s)
GIT_FALLBACK_INTERVAL = 5.0  # while Ray cannot be reached, look in git for a pushed end this often
STOP_WAIT = 60.0  # seconds `stop` waits for Ray to say the job ended (Ray: SIGTERM, 3 s, SIGKILL)
CONNECT_TIMEOUT = 5.0
STOP_PUSH_SECONDS = 15  # after the engine's stop grace: the worker's last record and the node's push
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
LOG_TAIL_LINES = 6
# What each engine needs on a node, passed when set here (credentials, the CLI's location).
ENGINE_ENV = {
    "claude": ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_BASE_URL",
               "ANTHROPIC_MODEL", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX"),
    "codex": ("OPENAI_API_KEY", "CODEX_API_KEY", "OPENAI_BASE_URL"),
}


@dataclass
class Target:
    """The Ray cluster a job runs on and the remote its refs travel by, as `spec.executor` records it."""

    address: str  # the Ray dashboard / job server, http://head:8265
    remote: str  # the remote's name here (subtask.remote)
    url: str  # what nodes fetch from and push to

    def to_dict(self) -> dict:
        return {"kind": "ray", "address": self.address, "remote": self.remote, "url": self.url}


# ---------------------------------------------------------------- reaching Ray

def _ray_client_class():
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError as exc:
        raise SubtaskError("fatal", f"the ray executor needs Ray, which is not installed here ({exc})",
                           hint="pip install 'git-subtask[ray]'   "
                                "(or run here: git config subtask.executor local)") from None
    return JobSubmissionClient


_clients: dict[tuple[int, str], object] = {}


def client(address: str):
    """A job client for `address` (one per thread: `wait` watches jobs from several)."""
    key = (threading.get_ident(), address)
    if key in _clients:
        return _clients[key]
    cls = _ray_client_class()
    _check_reachable(address)
    hidden = {k: os.environ.pop(k) for k in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS") if k in os.environ}
    try:  # Ray lets RAY_ADDRESS override the address given; ours is the configured one
        made = cls(address)
    except Exception as exc:
        raise _unreachable(address, exc) from None
    finally:
        os.environ.update(hidden)
    _clients[key] = made
    return made


def _check_reachable(address: str) -> None:
    """Refuse an address nothing answers on within a few seconds (Ray's client would hang)."""
    parsed = urlparse(address if "://" in address else f"http://{address}")
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 8265)
        with socket.create_connection((parsed.hostname or "", port), timeout=CONNECT_TIMEOUT):
            pass
    except (OSError, ValueError) as exc:
        raise _unreachable(address, exc) from None


def _unreachable(address: str, exc: BaseException) -> SubtaskError:
    words = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return SubtaskError("fatal", f"cannot reach the Ray cluster at {address}: {words}",
                        hint=f"ray status --address {address}   or   git config subtask.ray.address http://<head>:8265")


def configured_address(repo: Repo) -> str:
    address = (repo.config.get("ray.address") or os.environ.get("RAY_ADDRESS") or "").strip()
    if not address:
        raise SubtaskError("usage", "no Ray cluster to run on: "
                           "neither git config subtask.ray.address nor RAY_ADDRESS is set",
                           hint="git config subtask.ray.address http://<head>:8265")
    return address


# ---------------------------------------------------------------- start

def target(repo: Repo, job_id: str, base: str) -> Target:
    """Check everything a Ray start needs, changing nothing: Ray, the address, the remote."""
    address = configured_address(repo)
    remote = (repo.config.get("remote") or "origin").strip()
    proc = git(repo.root, "remote", "get-url", "--", remote, check=False) \
        if re.fullmatch(r"[A-Za-z0-9._/-]+", remote) else None
    if proc is None or proc.returncode != 0:
        raise SubtaskError("usage", f"no remote named {remote!r} for the cluster's nodes to fetch from and push to",
                           hint=f"git remote add {remote} <url>   or   git config subtask.remote <name>")
    url = _absolute_url(repo, proc.stdout.strip())
    _ray_client_class()
    _check_pushable(repo, remote, url, job_id, base)
    client(address)
    return Target(address, remote, url)


def _absolute_url(repo: Repo, url: str) -> str:
    """A remote path relative to this clone means nothing on a node: make it absolute."""
    if "://" in url or re.match(r"^[^/]+:", url):
        return url
    return str((repo.root / os.path.expanduser(url)).resolve())


def _check_pushable(repo: Repo, remote: str, url: str, job_id: str, base: str) -> None:
    """A dry-run push of the job's branch: a remote that refuses pushes is refused here, not on a node."""
    proc = git(repo.root, "push", "--dry-run", "--porcelain", url, f"{base}:refs/heads/{records.branch_name(job_id)}",
               check=False, timeout=120)
    if proc.returncode != 0 or "\t" not in proc.stdout \
            or any(line.startswith("!") for line in proc.stdout.splitlines()):
        why = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise SubtaskError("fatal", f"the cluster's nodes could not push to {remote} ({url}): "
                           f"a dry-run push was refused: {why[-1] if why else 'no answer'}",
                           hint=f"git push --dry-run {remote} HEAD:refs/heads/subtask/probe   "
                                "(or pick another: git config subtask.remote <name>)")


def prepare(job: Job, where: Target) -> None:
    """Say in the job's record where it runs and which Ray job runs its attempt."""
    job.spec.extra["executor"] = where.to_dict()
    attempt = job.state.current
    attempt.extra["ray_job"] = f"subtask-{job.id}-{attempt.n}"


def start(repo: Repo, job: Job, paid: bool, where: Target) -> Job:
    """Create branch, base pin and record, reserve, push, submit; undo it all on any failure."""
    state_dir = repo.state_dir
    lock_fd = liveness.acquire(state_dir, job.id, new=True)  # collect passes over a job whose start is under way
    with Transaction() as tx:
        tx.then = lambda: liveness.drop(state_dir, job.id, lock_fd)
        if paid:
            spending.sync_ledger(repo)
        if job.spec.branch:
            records.create_branch(repo, job.spec.branch, job.spec.base)
            tx.done("after_branch", lambda: _delete_local(repo, f"refs/heads/{job.spec.branch}"))
        records.set_pin(repo, job.id, "base", job.spec.base)
        tx.done("start_pinned", lambda: records.delete(repo, job.id))
        records.create(repo, job)
        tx.done("start_job_recorded")
        _reserve_push_submit(repo, job, paid, where, tx)
    liveness.release(lock_fd)
    return job


def _reserve_push_submit(repo: Repo, job: Job, paid: bool, where: Target, tx: Transaction) -> None:
    """The hand-over of a recorded attempt: its money, its refs on the remote, the Ray job, each
    a step of the caller's start transaction."""
    if paid:
        rid = reserve(repo, job)
        tx.done("start_reserved", lambda: ledger.close(repo.state_dir, rid, 0.0, reason="start undone"))
    pushed = _push_start(repo, where, job.id)
    tx.done("start_pushed", lambda: _unpush(repo, where.url, pushed))
    _submit(repo, job, where)


def reserve(repo: Repo, job: Job) -> str:
    """Reserve the current attempt's budget; for a verify loop (`--retries N`) N + 1 budgets in
    that one reservation: a node runs the loop where this ledger cannot be asked, so the whole
    loop's money is held here, under the cap, until the job comes home (`settle_money`). The
    caller synced the ledger with the records (`spending.sync_ledger`) before the record named it:
    a ledger restored from a record that names it would hold it already."""
    attempt = job.state.current
    with ledger.lock(repo.state_dir):
        found = ledger.reserve_locked(repo.state_dir, job=job.id, attempt=attempt.n, engine=job.spec.engine,
                                      usd=attempt.cost.reserved * (1 + (job.spec.retries or 0)),
                                      cap_usd=repo.config.number("monthlyCapUsd"),
                                      now=spending.reserved_at(attempt.queued_at))
    return found.rid


def settle_money(repo: Repo, job: Job, *, lost_loop: bool = False) -> None:
    """A job that came home: each ended attempt's reservation closed with its recorded charge. The
    retries its node ran were held in their loop's first reservation (`reserve`), which closes
    first, at its attempt's charge; each retry's is then written here and closed at its own.
    `lost_loop`: its node was lost during a verify loop, any attempt of which may have run: the
    loop's whole reservation is charged."""
    for attempt in job.state.attempts:
        if not attempt.rid or not attempt.terminal:
            continue
        if lost_loop and attempt is job.state.current:
            ledger.close(repo.state_dir, attempt.rid, None, charge_all=True, reason="its node was lost during the loop")
            continue
        try:  # its money was spent under the loop's reservation: no cap refuses it now
            with ledger.lock(repo.state_dir):
                ledger.reserve_locked(repo.state_dir, job=job.id, attempt=attempt.n, engine=job.spec.engine,
                                      usd=attempt.cost.reserved, cap_usd=sys.float_info.max,
                                      now=spending.reserved_at(attempt.queued_at))
        except SubtaskError as exc:
            if exc.kind != "conflict":
                raise
            # reserved here already: the loop's first attempt, or one settled before
        ledger.close(repo.state_dir, attempt.rid, attempt.cost.charged, reason=f"{attempt.state} on ray")


def _push_start(repo: Repo, where: Target, job_id: str) -> dict[str, str]:
    """Push the new job's refs (no notes yet); {ref: commit} of what the remote took."""
    refs = [ref for ref in sync.job_refs(job_id) if repo.git.references.get(ref) is not None]
    proc = git(repo.root, "push", "--porcelain", where.url, *[f"{ref}:{ref}" for ref in refs], check=False, timeout=300)
    taken = {line.split("\t")[1].split(":", 1)[1] for line in proc.stdout.splitlines()
             if line[:1] in ("*", " ", "=") and "\t" in line and ":" in line.split("\t")[1]}
    if proc.returncode != 0 or set(refs) - taken:
        lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        pushed = {ref: str(repo.git.references[ref].target) for ref in taken}
        _unpush(repo, where.url, pushed)
        raise SubtaskError("fatal", f"could not push {job_id} to {where.remote}: {lines[-1] if lines else 'refused'}",
                           hint=f"git push --dry-run {where.remote} HEAD:refs/heads/subtask/probe")
    return {ref: str(repo.git.references[ref].target) for ref in refs}


def _unpush(repo: Repo, url: str, pushed: dict[str, str]) -> None:
    """Delete refs this start pushed, each only while it is still the commit we pushed (a lease)."""
    if pushed:
        git(repo.root, "push", "--porcelain", *[f"--force-with-lease={ref}:{oid}" for ref, oid in pushed.items()],
            url, *[f":{ref}" for ref in pushed], check=False, timeout=120)


def _delete_local(repo: Repo, ref: str) -> None:
    found = repo.git.references.get(ref)
    if found is not None:
        records.cas_ref(repo, ref, str(found.target), None)


def runtime_env(repo: Repo, job: Job) -> dict:
    """Only what the engine needs (its credentials when set here) and what subtask.ray.env names,
    plus how long Ray's stop waits after its SIGTERM before it SIGKILLs (Ray's default, 3 s, may
    not leave the worker time to record `stopped` and the node time to push it)."""
    names = list(ENGINE_ENV.get(job.spec.engine, ()))
    for entry in repo.git.config.get_multivar("subtask.ray.env"):
        names += [n for n in re.split(r"[\s,]+", entry or "") if n]
    env = {name: os.environ[name] for name in dict.fromkeys(names) if name in os.environ}
    env["RAY_JOB_STOP_WAIT_TIME_S"] = str(int(repo.config.number("stopGrace")) + STOP_PUSH_SECONDS)
    return {"env_vars": env}


def entrypoint(repo: Repo, job: Job, where: Target) -> str:
    command = repo.config.get("ray.command") or "git-subtask"
    return (f"exec {command} run-remote {shlex.quote(job.id)} --attempt {job.state.current.n} "
            f"--remote {shlex.quote(where.url)}")


def _resources(repo: Repo) -> dict[str, float]:
    """One subtask_slot, plus what `git config subtask.ray.resources` adds (JSON, e.g. {"gpu_box": 1})."""
    wanted: dict[str, float] = {RESOURCE: 1.0}
    raw = repo.config.get("ray.resources")
    if raw:
        extra = config.amounts(raw)
        if extra is None:
            raise SubtaskError("fatal", config.refusal("ray.resources", raw) or raw,
                               hint=config.fix_hint("ray.resources"))
        wanted.update(extra)
    return wanted


def _submit(repo: Repo, job: Job, where: Target, pinned: dict[str, float] | None = None) -> None:
    submission = ray_job_id(job.state.current)
    resources = {**_resources(repo), **(pinned or {})}
    try:
        client(where.address).submit_job(
            entrypoint=entrypoint(repo, job, where), submission_id=submission,
            entrypoint_num_cpus=0, entrypoint_resources=resources, runtime_env=runtime_env(repo, job),
            # what it asked for, where `ray job list` shows it (Ray's job details leave it out)
            metadata={"subtask_job": job.id, "subtask_attempt": str(job.state.current.n),
                      "subtask_resources": json.dumps(resources, sort_keys=True)})
    except SubtaskError:
        raise
    except Exception as exc:
        raise SubtaskError("fatal", f"the Ray cluster at {where.address} refused job {job.id}: {_first_line(exc)}",
                           hint=f"ray job list --address {where.address}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _stop_unclaimed(repo: Repo, job_id: str, url: str) -> bool:
    """End a queued attempt that no node has claimed: the stopped record is pushed first (a
    fast-forward of the queued one, never forced) and only then written here; False when the
    remote refused it (a node claimed the attempt first: Ray's stop ends it there)."""
    fd = liveness.acquire(repo.state_dir, job_id, block=False)
    if fd is None:
        return False
    try:
        job = records.read(repo, job_id)
        attempt = job.state.current
        if attempt.terminal:
            return True
        if attempt.extra.get("node"):
            return False
        old = job.tip
        attempt.finish("stopped", reason="stopped while queued")
        if attempt.rid:
            attempt.cost.charged, attempt.cost.billing = money.ZERO, "not_started"
        new = records.write_commit(repo, job, old)
        ref = records.record_ref(job_id)
        proc = git(repo.root, "push", "--porcelain", url, f"{new}:{ref}", check=False, timeout=120)
        if proc.returncode != 0 \
                or not any(line[:1] in ("*", " ") and f":{ref}\t" in line for line in proc.stdout.splitlines()):
            return False
        if not records.cas_ref(repo, ref, old, new):
            return False  # cannot happen while we hold the run-lock; the remote's copy arrives by fetch
        privatetext.discard(repo.state_dir, job_id, attempt.n)
        ended = records.read(repo, job_id)
        settle_money(repo, ended)
        jobenv.drop(repo.state_dir, job_id)
        notes.write_for_job(repo, ended)
        notify.attempt_ended(repo, ended)
        return True
    finally:
        liveness.release(fd)


# ---------------------------------------------------------------- following a job, bringing it home

@dataclass
class RayState:
    """What Ray says of a job's submission now (`ray_state`)."""

    status: str | None  # PENDING RUNNING SUCCEEDED FAILED STOPPED, "MISSING", or None: Ray not reached
    message: str = ""
    ran: bool = False  # an entrypoint was placed on a node (so the engine may have spent)


def _where(job: Job) -> dict[str, Any]:
    """Where a job run on Ray runs (`placement`): every caller here asks it of such a job."""
    where = placement(job.spec)
    if where is None:
        raise SubtaskError("fatal", f"{job.id} does not run on Ray: its record names no cluster")
    return where


def ray_state(job: Job) -> RayState:
    where = placement(job.spec)
    submission = ray_job_id(job.state.current)
    if where is None or submission is None:
        return RayState("MISSING", "the record names no Ray job")
    try:
        info = client(where["address"]).get_job_info(submission)
    except SubtaskError as exc:
        return RayState(None, exc.message)
    except Exception as exc:
        text = _first_line(exc)
        if f"{submission} does not exist" in text:  # Ray's own words (its job API's 404), no one else's
            return RayState("MISSING", f"Ray has no job {submission}")
        return RayState(None, text)  # a proxy's or another server's 404, a dashboard restarting: asked again later
    status = str(getattr(info.status, "value", info.status))
    return RayState(status, (info.message or "").strip(), ran=bool(getattr(info, "driver_node_id", None)))


def log_tail(job: Job) -> str:
    """The last lines of the Ray job's log (the node's words on why it ended), redacted."""
    try:
        text = client(_where(job)["address"]).get_job_logs(ray_job_id(job.state.current))
    except Exception:
        return ""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("{")]
    return redact("\n".join(lines[-LOG_TAIL_LINES:]))


def collect(repo: Repo, job_id: str, *, state: RayState | None = None, advance: bool = True) -> bool:
    """Bring a Ray job home once Ray says it ended; True when its attempt is now ended here.

    Fetches the node's refs; when no terminal record came, ends the attempt here with Ray's
    reason (stopped when Ray stopped it). Passes over a job whose run-lock is held (its start is
    under way, or another command is settling it). A job it brought home is then what a local
    worker's end is (`came_home`): its group concluded, the jobs waiting for it moved on
    (`advance` False: the caller is moving them on).
    """
    job = records.read(repo, job_id)
    if job.state.current.terminal:
        return True
    ended = _collect(repo, job_id, state)
    if ended:
        came_home(repo, records.read(repo, job_id), advance=advance)
    return ended


def came_home(repo: Repo, job: Job, *, advance: bool = True) -> None:
    """What follows a job's end here as it follows a local worker's: a first pass stops the
    group's other attempts, the group is concluded, the jobs waiting for it move on."""
    if job.spec.group:
        groups.after_member_ended(repo, job, first_pass_only=True)
        groups.after_member_ended(repo, job)
    if advance:
        waiting.advance_quietly(repo)


def _collect(repo: Repo, job_id: str, state: RayState | None) -> bool:
    fd = liveness.acquire(repo.state_dir, job_id, block=False)
    if fd is None:
        return False
    try:
        job = records.read(repo, job_id)
        if job.state.current.terminal:
            return False  # brought home by another command meanwhile: its wrap-up is that command's
        state = state or ray_state(job)
        if state.status is None:  # Ray not reached (this machine offline?): what git already has
            if not _fetch_home(repo, job_id, quiet=True):
                return False
            notify.attempt_ended(repo, records.read(repo, job_id))
            return True
        if state.status == "RUNNING" and job.state.current.state == "queued":
            _fetch_home(repo, job_id, quiet=True)  # the node pushes `running` once it starts
        if state.status not in TERMINAL and state.status != "MISSING":
            return False
        if _fetch_home(repo, job_id, quiet=state.status == "MISSING"):
            notify.attempt_ended(repo, records.read(repo, job_id))  # its end came home under our hold: told once
            return True
        _end_here(repo, records.read(repo, job_id), state)
        return True
    finally:
        liveness.release(fd)


def _fetch_home(repo: Repo, job_id: str, quiet: bool = False) -> bool:
    """Fetch the job's refs from its remote; True when the record that came is terminal (then
    the reservation is closed with its cost, and a missing note or pin written here)."""
    job = records.read(repo, job_id)
    where = _where(job)
    try:
        sync.fetch_job(repo, where["url"], job_id)
    except SubtaskError as exc:
        if not quiet:
            warnings.warn(f"{job_id}: could not fetch its results from {where['remote']}: {exc.message}", stacklevel=2)
        return False
    job = records.read(repo, job_id)
    if not job.state.current.terminal:
        return False
    bring_home(repo, job)
    return True


def bring_home(repo: Repo, job: Job) -> None:
    """A Ray job whose terminal record arrived: close its reservation with the recorded cost,
    complete its head pin and note here (idempotent)."""
    settle_money(repo, job)
    lifecycle.complete_ended(repo, job)


def _end_here(repo: Repo, job: Job, state: RayState) -> None:
    """Ray ended the job and no terminal record came: end it here, charged by the usual rule
    (whole reservation when the engine may have started: it was placed on a node)."""
    attempt = job.state.current
    spent = attempt.engine_started_at is not None or state.ran or bool(attempt.extra.get("node"))
    lost_loop = spent and bool(job.spec.retries)
    if lost_loop and attempt.rid:  # before end_attempt closes it at one attempt's budget
        settle_money(repo, _ended_copy(job), lost_loop=True)
    if state.status == "STOPPED":
        reason = "stopped by request" if state.ran else "stopped while queued"
        lifecycle.end_attempt(repo, job.id, attempt.n, "stopped", reason=reason, engine_may_have_spent=spent)
        return
    tail = log_tail(job) if state.status != "MISSING" else ""
    what = {"MISSING": "Ray lost it (the cluster restarted, or its start was interrupted before it was submitted)",
            "SUCCEEDED": "its node ended without pushing a final record"}.get(
        state.status or "", f"Ray: {state.message or state.status}")
    reason = f"the Ray job {ray_job_id(attempt)} failed: {what}" + (f"; last log lines: {tail}" if tail else "")
    lifecycle.end_attempt(repo, job.id, attempt.n, "failed", reason=reason[:2000], error_kind="engine",
                          hint=f"ray job logs {ray_job_id(attempt)} --address {_where(job)['address']}",
                          engine_may_have_spent=spent)


def _ended_copy(job: Job) -> Job:
    """`job` as if its current attempt had ended (for `settle_money` before the record says so)."""
    ended = copy.deepcopy(job)
    ended.state.current.state = "failed"
    return ended


def collect_active(repo: Repo, entries: list[dict]) -> list[str]:
    """Settle every active Ray job among list entries (one status request each); ids ended.
    An unreachable cluster is a warning, never a failed command."""
    ended, unreached = [], set()
    for entry in entries:
        try:
            job = records.read(repo, entry["id"])
            where = placement(job.spec)
            if where is None or where["address"] in unreached:
                continue
            state = ray_state(job)
            if state.status is None:
                unreached.add(where["address"])
                warnings.warn(f"could not ask the Ray cluster at {where['address']} about its jobs ({state.message}); "
                              "git subtask wait or pull brings them home", stacklevel=2)
                continue
            if collect(repo, job.id, state=state):
                ended.append(job.id)
        except records.DamagedRecord:
            continue
    return ended


def watch(repo: Repo, job_id: str, cancel: threading.Event) -> None:
    """Until the job has ended here (or `cancel`): ask Ray at most once a second, woken early
    when Ray closes the job's log stream (it does when the job ends), and bring it home at its end;
    while Ray cannot be reached, look in git for the node's final push every few seconds."""
    next_git = 0.0
    job = records.read(repo, job_id)
    ended = _end_of(job)
    while not cancel.is_set():
        job = records.read(repo, job_id)
        if job.state.current.terminal:
            return
        asked = time.monotonic()
        state = ray_state(job)
        if state.status is not None or asked >= next_git:
            if state.status is None:
                next_git = asked + GIT_FALLBACK_INTERVAL
            if collect(repo, job_id, state=state):
                return
        if ended.is_set():  # the stream closed and the job has not ended: no more early wake
            ended = threading.Event()
        ended.wait(STATUS_INTERVAL)
        time.sleep(max(0.0, STATUS_INTERVAL - (time.monotonic() - asked)) if not ended.is_set() else 0.0)


def _end_of(job: Job) -> threading.Event:
    """An event set when Ray's log stream of the job's Ray job closes (Ray closes it when the job
    ends). Any failure to follow it leaves the event unset: `watch` then asks once a second."""
    ended = threading.Event()
    submission = ray_job_id(job.state.current)

    def follow() -> None:
        async def tail() -> None:
            async for _ in client(_where(job)["address"]).tail_job_logs(submission):
                pass

        try:
            asyncio.run(tail())
        except Exception:
            return
        ended.set()

    threading.Thread(target=follow, daemon=True, name=f"ray-end-{job.id}").start()
    return ended


def stop(repo: Repo, job_id: str) -> Job:
    """Stop the Ray job (queued or running), wait for Ray to say it ended, then bring it home."""
    job = records.read(repo, job_id)
    where = _where(job)
    submission = ray_job_id(job.state.current)
    try:
        client(where["address"]).stop_job(submission)
    except SubtaskError:
        raise
    except Exception as exc:
        if "does not exist" not in _first_line(exc):
            raise SubtaskError("fatal", f"could not stop the Ray job {submission}: {_first_line(exc)}",
                               hint=f"ray job stop {submission} --address {where['address']}") from None
    # Ray delivers a stop to a PENDING job only once a slot frees up for it: a job no node has
    # claimed yet ends here and now, if the remote takes our end before a node's claim.
    if not ray_state(job).ran and _stop_unclaimed(repo, job_id, where["url"]):
        return records.read(repo, job_id)
    deadline = time.monotonic() + STOP_WAIT
    while time.monotonic() < deadline:
        state = ray_state(job)
        if state.status in TERMINAL or state.status == "MISSING":
            break
        time.sleep(STATUS_INTERVAL)
    else:
        raise SubtaskError("fatal", f"Ray did not end {submission} within {STOP_WAIT:g}s",
                           hint=f"ray job status {submission} --address {where['address']}")
    deadline = time.monotonic() + 10
    while not collect(repo, job_id, state=state) and time.monotonic() < deadline:
        time.sleep(0.05)  # another command holds its run-lock while it brings it home
    return records.read(repo, job_id)


def submit(repo: Repo, job: Job, paid: bool) -> Job:
    """`executors.Elsewhere.submit`: checked first (Ray, its address, a dry-run push to the remote),
    then the record says where it runs, then branch, pin, record, reservation, push, submit. The
    task as written stays here: nodes run it as recorded (redacted)."""
    place(repo, job)
    return start(repo, job, paid, _target_of(job))


def place(repo: Repo, job: Job) -> None:
    """`executors.Elsewhere.place`: everything a start on Ray needs, checked (changing nothing),
    then said in the record about to be written (a job that waits is handed over later)."""
    prepare(job, target(repo, job.id, job.spec.base))


def _target_of(job: Job) -> Target:
    where = _where(job)
    return Target(where["address"], where["remote"], where["url"])


def hand_over(repo: Repo, job: Job, paid: bool) -> None:
    """`executors.Elsewhere.hand_over`: a job that waited (`--after`), recorded queued now with its
    branch at the base it starts from (`ops/plans`): reserve, push, submit; undone on a failure."""
    where = _target_of(job)
    client(where.address)
    with Transaction() as tx:
        _reserve_push_submit(repo, job, paid, where, tx)


def reply(repo: Repo, job: Job, attempt, paid: bool) -> Job:
    """`executors.Elsewhere.reply`: attempt n+1 of a job that ran on Ray, on Ray. Checked first
    (the cluster answers; for an engine that resumes its session, the node that holds it is alive:
    the reply is pinned to it with its `node:<ip>` resource), then the record takes the attempt
    (compare-and-swap on the ended one), the money is reserved, the record pushed (a fast-forward)
    and the Ray job submitted. The caller holds the job's run-lock."""
    where = _target_of(job)
    client(where.address)
    pinned = _session_node(repo, job)
    attempt.extra["ray_job"] = f"subtask-{job.id}-{attempt.n}"
    if pinned:
        attempt.extra["pinned"] = pinned

    def append(j: Job) -> bool:
        if j.state.current.n != attempt.n - 1 or not j.state.current.terminal:
            raise SubtaskError("not_finished", f"{j.id} changed meanwhile: attempt {j.state.current.n} is "
                               f"{j.state.current.state}", hint=f"git subtask wait {j.id}")
        j.state.attempts.append(attempt)
        return True

    if paid:
        spending.sync_ledger(repo)
    with Transaction() as tx:
        job = records.update(repo, job.id, append)
        tx.done("start_job_recorded", lambda: _drop_attempt(repo, job.id, attempt.n))
        if paid:
            rid = reserve(repo, job)
            tx.done("start_reserved", lambda: ledger.close(repo.state_dir, rid, 0.0, reason="reply undone"))
        _push_record(repo, where, job.id)
        tx.done("start_pushed")
    try:
        _submit(repo, job, where, pinned)
    except SubtaskError:  # the remote holds the attempt now: it ends failed, nothing ran, nothing charged
        lifecycle.end_attempt(repo, job.id, attempt.n, "failed", reason="its Ray job could not be submitted",
                              error_kind="engine", engine_may_have_spent=False)
        settle_money(repo, records.read(repo, job.id))
        _push_record(repo, where, job.id, quiet=True)
        raise
    return job


def _drop_attempt(repo: Repo, job_id: str, n: int) -> None:
    def change(j: Job) -> bool:
        if j.state.current.n != n or j.state.current.terminal:
            return False
        j.state.attempts.pop()
        return True

    records.update(repo, job_id, change)


def _push_record(repo: Repo, where: Target, job_id: str, quiet: bool = False) -> None:
    """Push the job's record as a fast-forward of the remote's (never forced)."""
    ref = records.record_ref(job_id)
    proc = git(repo.root, "push", "--porcelain", where.url, f"{ref}:{ref}", check=False, timeout=300)
    if quiet or (proc.returncode == 0 and any(line[:1] in ("*", " ", "=") and f":{ref}\t" in line
                                               for line in proc.stdout.splitlines())):
        return
    lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    raise SubtaskError("fatal", f"could not push the record of {job_id} to {where.remote}: "
                       f"{lines[-1] if lines else 'refused'}", hint=f"git subtask pull {where.remote}")


def _session_node(repo: Repo, job: Job) -> dict[str, float]:
    """For an engine that resumes its session (`resumes`), the resource that pins the reply to the
    node that holds that session (`node:<ip>`, as Ray names every node); {} when nothing is resumed."""
    earlier = next((a for a in reversed(job.state.attempts) if a.session_id and ray_job_id(a)), None)
    if earlier is None or not resumes(get_engine(job.spec.engine, repo.config)):
        return {}
    address = _where(job)["address"]
    try:
        node_id = client(address).get_job_info(ray_job_id(earlier)).driver_node_id
    except Exception as exc:
        raise SubtaskError("fatal", f"{job.id}'s session is on the node that ran {ray_job_id(earlier)}, and Ray "
                           f"cannot say which one it was: {_first_line(exc)}",
                           hint=f"start a new job from its branch: "
                                f"git subtask start --base {job.spec.branch} --on ray '...'") from None
    node = _alive_nodes(address).get(node_id or "")
    if node is None:
        raise SubtaskError("fatal", f"{job.id}'s session is on the node that ran {ray_job_id(earlier)} "
                           f"({node_id or 'unknown'}), which is not in the cluster any more: a reply resumes it there",
                           hint=f"start a new job from its branch: "
                                f"git subtask start --base {job.spec.branch} --on ray '...'")
    return {f"node:{node}": 0.001}


def _alive_nodes(address: str) -> dict[str, str]:
    """{node id: its ip} of the cluster's live nodes (the dashboard's state API)."""
    url = f"{address.rstrip('/')}/api/v0/nodes?limit=10000&detail=true"
    try:
        with urllib.request.urlopen(url, timeout=CONNECT_TIMEOUT * 3) as resp:
            listed = json.load(resp)["data"]["result"]["result"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _unreachable(address, exc) from None
    return {n["node_id"]: n["node_ip"] for n in listed if n.get("state") == "ALIVE" and n.get("node_ip")}
