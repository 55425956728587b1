"""Starting and ending attempts: spawn a worker, end a dead one, hand slots on.

Shared by `api` (start, stop, reply, every command's recovery sweep) and `worker` (its own end
and the hand-off to the next queued job), so each of these steps has exactly one implementation.

Invariants:
- An attempt is ended only through `end_attempt`, which writes its terminal state by
  compare-and-swap and never overwrites one; the ledger close that goes with it is idempotent.
  Together they make "charged once" hold however many processes notice a dead worker.
- A dead worker's engine process group is killed (`end_orphaned_engine`) before its attempt is
  ended and its slot freed, and only when the recorded group provably is that engine's (the
  leader's start time is recorded with its pid).
- A spawned worker inherits its run-lock fd; the spawner closes its copy without unlocking
  (unlocking would drop the worker's lock too: flock belongs to the shared file description).
- Never charge a dead worker's reservation on `running` alone, because `running` is recorded when
  the job is admitted (or, for a queued one, when a worker takes it, while its checkout is
  written); only `engine_started_at` (written just before the engine starts) means money may
  have been spent.
- Never free a dead worker's slot before its record says it ended, because nothing else would ever
  notice a `running` record without a slot entry or a run-lock holder; an end that fails keeps
  the entry for the next command (and `wait` ends a record no slot holds).
- Never let a stop request or a pid file outlive its attempt, because a reply would be stopped
  before it starts, and `stop` in a new worker's start-up gap would signal stale process groups.
- Never drop a damaged record as an orphan, because it is what there is to inspect: a dead worker's
  damaged record is kept, its reservation charged whole, its slot freed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings

from subtask.git import ownership, records
from subtask.git.gitrepo import Repo, open_repo, path_text
from subtask.git.records import Job
from subtask.model import executors, faults, money
from subtask.model.job import WAITING
from subtask.model.redact import redact
from subtask.proc import spawn
from subtask.state import jobenv, ledger, liveness, paths, ports, privatetext, slots
from subtask.state.statefiles import open_private, read_bytes, remove_file, write_json

TYPE_CHECKING = False  # not `typing`'s: `start` imports this module
if TYPE_CHECKING:
    from subtask.state.statefiles import StrPath

WORKER_DIED = "worker died"


def logs_dir(repo: Repo) -> str:
    return paths.logs_dir(repo.state_dir_str)


def pid_file(state_dir: StrPath, job_id: str) -> str:
    return paths.run_file(state_dir, job_id, "pid")


def stop_marker(state_dir: StrPath, job_id: str) -> str:
    return paths.run_file(state_dir, job_id, "stop")


def events_file(state_dir: StrPath, job_id: str) -> str:
    return paths.run_file(state_dir, job_id, "events.jsonl")


def engine_file(state_dir: StrPath, job_id: str) -> str:
    return paths.run_file(state_dir, job_id, "engine")


def _read_json(path: str) -> dict:
    try:
        data = json.loads(read_bytes(path))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def read_pids(state_dir: StrPath, job_id: str) -> dict:
    """The attempt's worker pid (`<id>.pid`) and engine group (`<id>.engine`), merged."""
    return {**_read_json(pid_file(state_dir, job_id)), **_read_json(engine_file(state_dir, job_id))}


def record_pid(state_dir: StrPath, job_id: str, **pids: int | None) -> None:
    """Write the worker's pid and the engine's group each to its own file. One file per writer:
    the starter records the worker it forked while that worker may already be recording its
    engine, and a read-modify-write of one shared file dropped the engine's entry. Neither is
    fsynced: they name live processes, which a crash that could lose the write ends too (a lost
    or empty file reads as no pids). A pid's start time is None when unknown (it is gone)."""
    engine = {key: value for key, value in pids.items() if key.startswith("engine")}
    worker = {key: value for key, value in pids.items() if key not in engine}
    if worker:
        data = _read_json(pid_file(state_dir, job_id))
        faults.point("recording_worker_pid")
        write_json(pid_file(state_dir, job_id), {**data, **worker, "v": 1}, durable=False)
    if engine:
        write_json(engine_file(state_dir, job_id), {"v": 1, **engine}, durable=False)


def reset_pids(state_dir: StrPath, job_id: str, worker: int) -> None:
    """Start a new attempt's pids with only its worker: no earlier engine group may be signalled."""
    remove_file(engine_file(state_dir, job_id))
    write_json(pid_file(state_dir, job_id), {"v": 1, "worker": worker}, durable=False)  # replaced, never missing


def remove_pids(state_dir: StrPath, job_id: str) -> None:
    remove_file(engine_file(state_dir, job_id))
    remove_file(pid_file(state_dir, job_id))


def stop_asked(state_dir: StrPath, job_id: str) -> bool:
    """Has `stop` marked this job (its marker file is there)?"""
    return os.path.exists(stop_marker(state_dir, job_id))


def clear_stop(state_dir: StrPath, job_id: str) -> None:
    remove_file(stop_marker(state_dir, job_id))


def record_engine(state_dir: StrPath, job_id: str, pid: int) -> None:
    """Remember the attempt's child group (the engine's, then verify's) and its leader's start
    time (which proves, later, that a process with that pid is still the leader, not a reused pid)."""
    from subtask.proc import procs

    record_pid(state_dir, job_id, engine=pid, engine_started=procs.start_time(pid))


def end_orphaned_engine(state_dir: StrPath, job_id: str) -> None:
    """End the engine process group a dead worker left behind. The caller holds the job's
    run-lock, so no live worker owns that group; the recorded start time guards against reuse."""
    from subtask.proc import procs

    pids = read_pids(state_dir, job_id)
    pgid, started = pids.get("engine"), pids.get("engine_started")
    if isinstance(pgid, int) and pgid > 1:
        procs.kill_orphaned_group(pgid, started if isinstance(started, int) else None)
    procs.end_marked(job_id)  # those that left the group (setsid), where no pid namespace ended them


def spawn_worker(repo: Repo, job_id: str, lock_fd: int) -> int:
    """Start the detached worker for `job_id`; it inherits the run-lock held on `lock_fd`.

    How (fork, fork server or exec) is `subtask.proc.spawn`'s: this module sits below the worker and
    never imports it.
    """
    # A previous attempt's pids must not survive: `stop` in this worker's start-up gap would
    # signal groups whose ids may belong to unrelated processes by now.
    remove_pids(repo.state_dir_str, job_id)
    log_fd = open_private(paths.log_file(repo.state_dir_str, job_id))
    try:
        pid = spawn.start_worker(repo.root_str, job_id, lock_fd, log_fd, repo)
    finally:
        os.close(log_fd)
    record_pid(repo.state_dir_str, job_id, worker=pid)
    return pid


def close_fd_keep_lock(fd: int | None) -> None:
    if fd is not None:
        liveness.disown(fd)
        os.close(fd)


def start_handoffs(repo: Repo, handed: list[slots.HandOff]) -> None:
    """Spawn workers for attempts that were just given slots (run-locks already held)."""
    for hand in handed:
        try:
            spawn_worker(entry_repo(repo, hand.entry), hand.entry["job"], hand.fd)
        except Exception as exc:  # a broken queued job must not block the rest of the queue
            print(f"git-subtask: could not start queued job {hand.entry['job']}: {exc}", file=sys.stderr)
        finally:
            close_fd_keep_lock(hand.fd)


def end_attempt(repo: Repo, job_id: str, attempt_n: int, state: str, *, reason: str | None = None,
                error_kind: str | None = None, hint: str | None = None,
                engine_may_have_spent: bool | None = None) -> Job | None:
    """End attempt `attempt_n` of a job that no worker will finish (died, stopped, never spawned).

    Writes the terminal state once, closes the reservation once (whole reservation when the engine
    may have spent, nothing when it never started) and writes the note. Returns the job if this
    call ended it, None if it had already ended.
    """
    ended: list[Job] = []
    if reason:
        reason = redact(reason)  # e.g. an exception's words, which may quote what the job held

    def change(job: Job) -> bool:
        if not job.state.attempts or job.state.current.n != attempt_n:
            return False
        attempt = job.state.current
        spent = engine_may_have_spent if engine_may_have_spent is not None else attempt.engine_started_at is not None
        charge = attempt.cost.reserved if (spent and attempt.rid) else money.ZERO
        if not attempt.finish(state, reason=reason, error_kind=error_kind, hint=hint):
            return False
        if attempt.rid:
            attempt.cost.charged = charge
            attempt.cost.billing = "charged" if spent else "not_started"
        ended[:] = [job]
        return True

    job = records.update(repo, job_id, change)  # raises if it cannot be written: never half-written
    privatetext.discard(repo.state_dir_str, job_id, attempt_n)  # ended, now or before: its words go
    if job.state.attempts and job.state.current.n == attempt_n and job.state.current.terminal:
        # ... and so does its starter's environment (issue 11 item 8), also when its worker died
        # between its final record and dropping it; a newer attempt (a reply) keeps its own.
        jobenv.drop(repo.state_dir_str, job_id)
    if not ended:
        return None
    attempt = job.state.current
    if attempt.rid:
        ledger.close(repo.state_dir_str, attempt.rid, attempt.cost.charged, reason=reason or state)
    from subtask.git import notes
    from subtask.ops.running import notify

    notes.write_for_job(repo, job)
    notify.attempt_ended(repo, job)  # this call wrote the end: it tells it, once
    return job


def reconcile(repo: Repo) -> list[str]:
    """Notice dead workers and idle slots; end their attempts; hand slots on. Returns ended ids."""
    state_dir = repo.state_dir_str
    if slots.never_made(state_dir):
        return []
    if nothing_to_reconcile(state_dir):
        return []
    max_running = repo.config.integer("maxRunning")
    with slots.transaction(state_dir, rebuild=lambda: rebuild_slots(repo)) as current:
        reaped = slots.reap_dead(current, state_dir)
        handed = slots.fill(current, state_dir, max_running)
    start_handoffs(repo, handed)
    return end_reaped(repo, reaped)


def nothing_to_reconcile(state_dir: StrPath) -> bool:
    """True when a look without the slots lock finds nothing for `reconcile` to do: the file is
    whole, nothing is queued, and every running entry's run-lock is held (its worker lives, or
    someone is settling it). Reading commands then neither take the lock nor rewrite the file.
    Skipping is the same as a reconcile that ran just before this look: a worker that dies after
    it is found by the next command, as it would have been after a locked pass."""
    with warnings.catch_warnings():  # a damaged file is said once, by the locked pass that rebuilds it
        warnings.simplefilter("ignore")
        current = slots.read(state_dir)
    if current.damaged or current.queue:
        return False
    return all(liveness.is_held(state_dir, entry["job"]) for entry in current.running)


def end_reaped(repo: Repo, reaped: list[slots.HandOff]) -> list[str]:
    """Settle reaped dead entries (we hold their run-locks), then free their slots and hand them on.

    An entry whose record could not be written keeps its slot: the next command reaps it again,
    so a slot is never freed before its job's record says it ended.
    """
    if not reaped:
        return []
    handed: list[slots.HandOff] = []
    try:
        outcomes = [_end_quietly(repo, r.entry) for r in reaped]
        with slots.transaction(repo.state_dir_str, rebuild=lambda: rebuild_slots(repo)) as current:
            for r, outcome in zip(reaped, outcomes, strict=True):
                if outcome is not None:
                    slots.remove(current, r.entry["job"], r.entry["attempt"])
            handed = slots.fill(current, repo.state_dir_str, repo.config.integer("maxRunning"))
    finally:
        for r in reaped:
            liveness.release(r.fd)
    start_handoffs(repo, handed)
    return [r.entry["job"] for r, outcome in zip(reaped, outcomes, strict=True) if outcome]


def _end_quietly(repo: Repo, entry: dict) -> bool | None:
    """`end_dead`, or None when it could not be ended (one broken job must not keep the
    others' slots; its own slot stays until a later command ends it)."""
    try:
        return end_dead(repo, entry)
    except Exception as exc:
        print(f"git-subtask: could not end {entry['job']} yet (its slot is kept; the next command "
              f"retries): {exc}", file=sys.stderr)
        return None


def end_dead(repo: Repo, entry: dict) -> bool:
    """Settle a slot entry whose worker is gone: end its attempt, close its reservation, drop orphans.

    Returns True when this call ended the attempt. Raises when the record cannot be written (the
    caller keeps the slot). A job with no record died inside `start` before the record was
    written: its branch (never committed to: no worker ever ran) and pins go, and its reservation
    is released. A job whose worker died after its final record gets its pin and note completed.
    """
    target = repo_of(repo, entry)
    job_id, attempt_n = entry["job"], entry["attempt"]
    rid = paths.reservation_id(job_id, attempt_n)
    if target is None:
        return False
    # The engine dies before the attempt is ended and its slot freed: a dead worker's engine
    # must not run on beside the job that gets the slot, nor commit after the job is recorded.
    end_orphaned_engine(target.state_dir_str, job_id)
    ports.release(target.state_dir_str, job_id, attempt_n)  # a dead worker's range: nobody else frees it
    _undo_overlay(target, job_id)
    try:
        recorded = records.read(target, job_id)
    except records.DamagedRecord as exc:
        # Kept for the user to inspect (never dropped as an orphan); its engine may have spent.
        # Nothing more can be written to it, so it is ended as far as it can be: the slot goes.
        ledger.close(target.state_dir_str, rid, None, reason="record damaged")
        print(f"git-subtask: {exc.message}; its slot is freed and its reservation charged", file=sys.stderr)
        return False
    except Exception:
        _drop_orphan_refs(target, job_id)
        jobenv.drop(target.state_dir_str, job_id)
        privatetext.discard(target.state_dir_str, job_id, attempt_n)
        ledger.close(target.state_dir_str, rid, 0.0, reason="start did not finish")
        return False
    if recorded.state.attempts and recorded.state.current.n < attempt_n:
        attempt_n = _retry_never_recorded(target, recorded, attempt_n)
        ports.release(target.state_dir_str, job_id, attempt_n)
    if stop_asked(target.state_dir_str, job_id):
        # `stop` killed it (or it died while being stopped): that is the end the user asked for.
        job = end_attempt(target, job_id, attempt_n, "stopped", reason="stopped by request")
    else:
        job = end_attempt(target, job_id, attempt_n, "failed", reason=WORKER_DIED, error_kind="engine",
                          hint="read the worker log: git subtask show <id> --log")
    latest = records.read(target, job_id)
    if job is None:
        complete_ended(target, latest)
    for attempt in latest.state.attempts:
        if attempt.n == attempt_n and attempt.rid:
            charged = attempt.cost.charged if attempt.terminal else None
            ledger.close(target.state_dir_str, attempt.rid, charged, reason=WORKER_DIED)
    return job is not None


def _retry_never_recorded(repo: Repo, job: Job, attempt_n: int) -> int:
    """A slot entry of an attempt the record does not hold: a verify loop's retry (subtask/
    retries.py) whose worker died after it renamed its slot entry and reserved the retry's money,
    before the record took it. Nothing of the retry ran: its money and words go, and what is
    ended is the attempt the record holds (the one the dead worker was ending)."""
    ledger.close(repo.state_dir_str, paths.reservation_id(job.id, attempt_n), 0.0, reason="retry did not start")
    privatetext.discard(repo.state_dir_str, job.id, attempt_n)
    return job.state.current.n


def _undo_overlay(repo: Repo, job_id: str) -> None:
    """A worker killed during its verify leaves the trusted tests over the job's: put the job's
    files back (the next attempt would too, before its engine starts)."""
    from subtask.ops.landing import overlay

    try:
        overlay.restore_left(repo, job_id)
    except OSError as exc:
        print(f"git-subtask: {job_id}: could not put back the files its verify moved aside ({exc}); "
              f"they are in {overlay.stash_of(repo, job_id)}", file=sys.stderr)


def missing_after_end(repo: Repo, job: Job) -> list[str]:
    """What a finished job's record promises but is not there: "head pin", "note" (a writer was
    killed after the final record). Empty for a job that has not ended."""
    from subtask.git import notes, notes_store
    from subtask.words import note_block

    if not job.state.attempts or not job.state.current.terminal:
        return []
    missing = []
    head = pinned_head(job)
    pin = repo.git.references.get(records.pin_ref(job.id, "head"))
    if head and head != job.spec.base and (pin is None or str(pin.target) != head):
        missing.append("head pin")
    block = notes_store.normalize_block(job.id, note_block(job))
    if notes_store.read_blocks(repo.objects, notes.target_commit(job)).get(job.id) != block:
        missing.append("note")
    return missing


def end_orphan(repo: Repo, job_id: str) -> bool:
    """Settle a job recorded queued or running that no slot entry, starter or worker holds (its
    slot was freed without its record ending it). True if this call ended it."""
    fd = liveness.acquire(repo.state_dir_str, job_id, block=False)
    if fd is None:
        return False  # a worker or starter holds it: not an orphan
    try:
        with slots.transaction(repo.state_dir_str, rebuild=lambda: rebuild_slots(repo)) as current:
            listed = job_id in slots.listed(current)
        if listed:
            # the sweep (a running entry), a hand-off (a queued one) or `plans.move_on` (a waiting
            # one, or one recorded queued whose admission its mover did not live to make) owns it
            return False
        job = records.read(repo, job_id)
        if job.state.current.terminal or job.state.current.state == WAITING or not ownership.owns(repo, job):
            return False  # ended, waiting (rebuilt into the file by the next pass), or a teammate's record
        return bool(_end_quietly(repo, slots.make_entry(job_id, job.state.current.n, repo.common_dir)))
    finally:
        liveness.release(fd)


def complete_ended(repo: Repo, job: Job) -> list[str]:
    """Write the head pin and the note of a finished job where they are missing. Idempotent and
    cheap when nothing is missing; returns what it wrote."""
    from subtask.git import notes

    missing = missing_after_end(repo, job)
    head = pinned_head(job)
    if "head pin" in missing and head:  # (it is missing only where there is a head to pin)
        records.set_pin(repo, job.id, "head", head)
    if "note" in missing:
        notes.write_for_job(repo, job)
    return missing


def pinned_head(job: Job) -> str | None:
    """The head commit a finished job's `head` pin must keep alive (None: it made none)."""
    if job.evidence is not None and job.evidence.head:
        return job.evidence.head
    return job.state.current.head


def _drop_orphan_refs(repo: Repo, job_id: str) -> None:
    """Remove the branch and pins of a job whose record was never written."""
    branch = repo.git.references.get(f"refs/heads/{records.branch_name(job_id)}")
    if branch is not None and sum(1 for _ in branch.log()) <= 1:
        records.cas_ref(repo, branch.name, str(branch.target), None)
    records.delete(repo, job_id)


def in_repo(repo: Repo, entry: dict) -> bool:
    """Does this slot entry belong to `repo`? (A shared stateDir holds several repositories' jobs.)"""
    return path_text(str(entry["git_dir"])) == repo.common_dir_str


def repo_of(repo: Repo, entry: dict) -> Repo | None:
    """The repository of a slot entry: `repo` itself, or the other one it names (None if that one
    is gone)."""
    try:
        return entry_repo(repo, entry)
    except Exception:
        return None


def entry_repo(repo: Repo, entry: dict) -> Repo:
    """`repo_of`, raising when the other repository cannot be opened."""
    if in_repo(repo, entry):
        return repo
    return open_repo(str(entry["git_dir"]))


def rebuild_slots(repo: Repo) -> slots.Slots:
    """Slots rebuilt from this repository's records and run-locks (the file was damaged)."""
    rebuilt = slots.Slots()
    for entry in records.list_entries(repo):
        if entry.get("state") == WAITING and isinstance(entry.get("after"), list):
            # A group's id stands for its members here: no slot lists it, so the job is looked at
            # (`plans.move_on` reads the group) at every pass until the group has ended.
            slots.add_waiting(rebuilt, entry["id"], repo.common_dir, [str(n) for n in entry["after"]])
            continue
        if entry.get("state") not in ("queued", "running") or not executors.of_entry(entry).runs_here:
            continue  # a job a cluster runs holds no local slot (subtask/executors)
        concurrency = entry.get("concurrency") if isinstance(entry.get("concurrency"), int) else None
        item = slots.make_entry(entry["id"], entry.get("attempt", 1), repo.common_dir,
                                pool=entry.get("group") if concurrency else None, pool_max=concurrency)
        item["since"] = entry.get("created") or time.time()
        if entry["state"] == "running" or liveness.is_held(repo.state_dir_str, entry["id"]):
            rebuilt.running.append(item)
        else:
            rebuilt.queue.append(item)
    rebuilt.queue.sort(key=lambda e: e["since"])
    return rebuilt


def stop_job(repo: Repo, job_id: str, *, reason: str = "stopped by request") -> bool:
    """End a job's current attempt `stopped`: drop it from the queue, or end its worker's process
    groups (TERM, then KILL). False when it had already ended."""
    job = records.read(repo, job_id)
    attempt = job.state.current
    if attempt.terminal:
        return False
    executor = executors.of(job)
    if not executor.runs_here:  # its node writes its record while it runs: its executor stops it
        executor.backend().stop(repo, job_id)
        return True
    state_dir = repo.state_dir_str
    with slots.transaction(state_dir, rebuild=lambda: rebuild_slots(repo)) as current:
        was_queued = current.position(job_id) is not None and not liveness.is_held(state_dir, job_id)
        if was_queued:
            slots.remove(current, job_id, attempt.n)
    if was_queued:
        end_attempt(repo, job_id, attempt.n, "stopped", reason="stopped while queued" if reason == "stopped by request"
                    else f"{reason}, while queued", engine_may_have_spent=False)
        return True
    stop_running(repo, job_id, repo.config.number("stopGrace"))
    end_attempt(repo, job_id, attempt.n, "stopped", reason=reason)
    reconcile(repo)
    return True


def signal_job(state_dir: StrPath, job_id: str, sig: int) -> None:
    """Signal the worker's and the engine's process groups, and the pool refill's beside the job
    (`worker/refill.py`), only while the job's run-lock is held."""
    if not liveness.is_held(state_dir, job_id):
        return
    pids = read_pids(state_dir, job_id)
    for key in ("engine", "worker", "refill"):
        pgid = pids.get(key)
        if isinstance(pgid, int) and pgid > 1:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def wait_lock_released(state_dir: StrPath, job_id: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while liveness.is_held(state_dir, job_id):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def stop_running(repo: Repo, job_id: str, grace: float) -> None:
    """SIGTERM the job's process groups, SIGKILL after `grace`; returns once the worker is gone."""
    state_dir = repo.state_dir_str
    os.close(open_private(stop_marker(state_dir, job_id), os.O_WRONLY | os.O_CREAT))
    signal_job(state_dir, job_id, signal.SIGTERM)
    if not wait_lock_released(state_dir, job_id, grace):
        signal_job(state_dir, job_id, signal.SIGKILL)
        wait_lock_released(state_dir, job_id, 10.0)
