"""Starting and ending attempts: spawn a worker, settle a dead one, hand slots on.

Shared by `api` (start, stop, reply, every command's recovery sweep) and `worker` (its own end
and the hand-off to the next queued job), so each of these steps has exactly one implementation.

Invariants:
- An attempt is ended only through `end_attempt`, which writes its terminal state by
  compare-and-swap and never overwrites one; the ledger close that goes with it is idempotent.
  Together they make "charged once" hold however many processes notice a dead worker.
- A spawned worker inherits its run-lock fd; the spawner closes its copy without unlocking
  (unlocking would drop the worker's lock too: flock belongs to the shared file description).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from subtask import jobenv, ledger, liveness, records, slots
from subtask.gitrepo import Repo, open_repo
from subtask.records import Job
from subtask.statefiles import ensure_dir, open_private, write_json

WORKER_DIED = "worker died"


def logs_dir(repo: Repo) -> Path:
    return ensure_dir(repo.state_dir / "logs")


def pid_file(state_dir: Path, job_id: str) -> Path:
    return liveness.run_dir(state_dir) / f"{job_id}.pid"


def stop_marker(state_dir: Path, job_id: str) -> Path:
    return liveness.run_dir(state_dir) / f"{job_id}.stop"


def events_file(state_dir: Path, job_id: str) -> Path:
    return liveness.run_dir(state_dir) / f"{job_id}.events.jsonl"


def read_pids(state_dir: Path, job_id: str) -> dict:
    try:
        data = json.loads(pid_file(state_dir, job_id).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def record_pid(state_dir: Path, job_id: str, **pids: int) -> None:
    data = read_pids(state_dir, job_id)
    data.update(pids)
    data["v"] = 1
    write_json(pid_file(state_dir, job_id), data)


SPAWN_ENV = "SUBTASK_SPAWN"  # "exec": always start the worker as a fresh interpreter


def spawn_worker(repo: Repo, job_id: str, lock_fd: int) -> int:
    """Start the detached worker for `job_id`; it inherits the run-lock held on `lock_fd`.

    A single-threaded caller (the CLI) forks: the child already has every module imported, which
    saves the worker's ~0.1 s of interpreter start-up and imports. A caller with other threads
    (the MCP server, `wait`'s watchers) must not fork, because a fork copies only the calling
    thread and a lock another thread held would stay locked in the child: it asks its zygote (a
    fork server it started while single-threaded, `subtask.zygote`) when it has one, and starts a
    fresh interpreter otherwise, or when the zygote fails in any way.
    """
    # A previous attempt's pids must not survive: `stop` in this worker's start-up gap would
    # signal groups whose ids may belong to unrelated processes by now.
    pid_file(repo.state_dir, job_id).unlink(missing_ok=True)
    log_fd = open_private(logs_dir(repo) / f"{job_id}.log")
    try:
        spawn = _fork_worker if _may_fork() else _zygote_or_exec_worker
        pid = spawn(repo, job_id, lock_fd, log_fd)
    finally:
        os.close(log_fd)
    record_pid(repo.state_dir, job_id, worker=pid)
    return pid


def _may_fork() -> bool:
    return os.environ.get(SPAWN_ENV) != "exec" and hasattr(os, "fork") and threading.active_count() == 1


def _zygote_or_exec_worker(repo: Repo, job_id: str, lock_fd: int, log_fd: int) -> int:
    from subtask import zygote

    server = zygote.current() if os.environ.get(SPAWN_ENV) != "exec" else None
    if server is not None:
        try:
            return server.spawn(job_id, repo.root, lock_fd, log_fd)
        except Exception as exc:  # the zygote's worker will not run: this one must
            print(f"git-subtask: the worker fork server failed ({exc}); starting {job_id} "
                  "as a fresh interpreter", file=sys.stderr)
    return _exec_worker(repo, job_id, lock_fd, log_fd)


def _exec_worker(repo: Repo, job_id: str, lock_fd: int, log_fd: int) -> int:
    env = dict(os.environ, SUBTASK_LOCK_FD=str(lock_fd))
    proc = subprocess.Popen(
        [sys.executable, "-m", "subtask.worker", job_id, str(repo.root)],
        stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT, cwd=str(repo.root),
        env=env, start_new_session=True, pass_fds=(lock_fd,), close_fds=True,
    )
    return proc.pid


def _fork_worker(repo: Repo, job_id: str, lock_fd: int, log_fd: int) -> int:
    sys.stdout.flush()  # or the child would write the parent's buffered output a second time
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the child: detach like the exec path does, then run the worker in this interpreter
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.chdir(repo.root)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        from subtask import worker

        code = worker.run_detached(job_id, repo.root, lock_fd)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)  # never return into the caller's code, nor run its exit handlers


def close_fd_keep_lock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def start_handoffs(repo: Repo, handed: list[slots.HandOff]) -> None:
    """Spawn workers for attempts that were just given slots (run-locks already held)."""
    for hand in handed:
        try:
            spawn_worker(repo_of(repo, hand.entry, strict=True), hand.entry["job"], hand.fd)
        except Exception as exc:  # a broken queued job must not block the rest of the queue
            print(f"git-subtask: could not start queued job {hand.entry['job']}: {exc}", file=sys.stderr)
        finally:
            close_fd_keep_lock(hand.fd)


def end_attempt(repo: Repo, job_id: str, attempt_n: int, state: str, *, reason: str | None = None,
                error_kind: str | None = None, hint: str | None = None, engine_may_have_spent: bool | None = None) -> Job | None:
    """End attempt `attempt_n` of a job that no worker will finish (died, stopped, never spawned).

    Writes the terminal state once, closes the reservation once (whole reservation when the engine
    may have spent, nothing when it never started) and writes the note. Returns the job if this
    call ended it, None if it had already ended.
    """
    ended: list[Job] = []
    if reason:
        from subtask.redact import redact

        reason = redact(reason)  # e.g. an exception's words, which may quote what the job held

    def change(job: Job) -> bool:
        if not job.state.attempts or job.state.current.n != attempt_n:
            return False
        attempt = job.state.current
        spent = engine_may_have_spent if engine_may_have_spent is not None else attempt.engine_started_at is not None
        charge = attempt.cost.reserved if (spent and attempt.rid) else 0.0
        if not attempt.finish(state, reason=reason, error_kind=error_kind, hint=hint):
            return False
        if attempt.rid:
            attempt.cost.charged = charge
            attempt.cost.billing = "charged" if charge else attempt.cost.billing
        ended[:] = [job]
        return True

    try:
        job = records.update(repo, job_id, change)
    except Exception:
        job = None
    from subtask import privatetext

    privatetext.discard(repo.state_dir, job_id, attempt_n)  # ended, now or before: its words go
    if not ended:
        return None
    attempt = job.state.current
    if attempt.rid:
        ledger.close(repo.state_dir, attempt.rid, attempt.cost.charged, reason=reason or state)
    jobenv.drop(repo.state_dir, job_id)  # issue 11 item 8: the starter's environment ends with the attempt
    from subtask import notes

    notes.write_for_job(repo, job)
    return job


def reconcile(repo: Repo) -> list[str]:
    """Notice dead workers and idle slots; end their attempts; hand slots on. Returns ended ids."""
    state_dir = repo.state_dir
    if not (state_dir / "slots.json").exists() and not (state_dir / "slots.lock").exists():
        return []
    max_running = repo.config.integer("maxRunning")
    with slots.transaction(state_dir, rebuild=lambda: rebuild_slots(repo)) as current:
        reaped = slots.reap_dead(current, state_dir)
        handed = slots.fill(current, state_dir, max_running)
    start_handoffs(repo, handed)
    return settle_reaped(repo, reaped)


def settle_reaped(repo: Repo, reaped: list[slots.HandOff]) -> list[str]:
    """Settle reaped dead entries (we hold their run-locks), then free their slots and hand them on."""
    if not reaped:
        return []
    ended = []
    handed: list[slots.HandOff] = []
    try:
        ended = [r.entry["job"] for r in reaped if _settle_quietly(repo, r.entry)]
        with slots.transaction(repo.state_dir, rebuild=lambda: rebuild_slots(repo)) as current:
            for r in reaped:
                slots.remove(current, r.entry["job"], r.entry["attempt"])
            handed = slots.fill(current, repo.state_dir, repo.config.integer("maxRunning"))
    finally:
        for r in reaped:
            liveness.release(r.fd)
    start_handoffs(repo, handed)
    return ended


def _settle_quietly(repo: Repo, entry: dict) -> bool:
    try:
        return settle_dead(repo, entry)
    except Exception as exc:  # one broken job must not keep the others' slots
        print(f"git-subtask: could not settle {entry['job']}: {exc}", file=sys.stderr)
        return False


def settle_dead(repo: Repo, entry: dict) -> bool:
    """Settle a slot entry whose worker is gone: end its attempt, close its reservation, drop orphans.

    A job with no record died inside `start` before the record was written: its branch (never
    committed to: no worker ever ran) and pins go, and its reservation is released.
    """
    target = repo_of(repo, entry)
    job_id, attempt_n = entry["job"], entry["attempt"]
    rid = f"{job_id}.{attempt_n}"
    if target is None:
        return False
    try:
        records.read(target, job_id)
    except Exception:
        _drop_orphan_refs(target, job_id)
        jobenv.drop(target.state_dir, job_id)
        ledger.close(target.state_dir, rid, 0.0, reason="start did not finish")
        return False
    if stop_marker(target.state_dir, job_id).exists():
        # `stop` killed it (or it died while being stopped): that is the end the user asked for.
        job = end_attempt(target, job_id, attempt_n, "stopped", reason="stopped by request")
    else:
        job = end_attempt(target, job_id, attempt_n, "failed", reason=WORKER_DIED, error_kind="engine",
                          hint="read the worker log: git subtask show <id> --log")
    current = records.read(target, job_id).state
    for attempt in current.attempts:
        if attempt.n == attempt_n and attempt.rid:
            charged = attempt.cost.charged if attempt.terminal else None
            ledger.close(target.state_dir, attempt.rid, charged, reason=WORKER_DIED)
    return job is not None


def _drop_orphan_refs(repo: Repo, job_id: str) -> None:
    """Remove the branch and pins of a job whose record was never written."""
    branch = repo.git.references.get(f"refs/heads/{records.branch_name(job_id)}")
    if branch is not None and sum(1 for _ in branch.log()) <= 1:
        records.cas_ref(repo, branch.name, str(branch.target), None)
    records.delete(repo, job_id)


def in_repo(repo: Repo, entry: dict) -> bool:
    """Does this slot entry belong to `repo`? (A shared stateDir holds several repositories' jobs.)"""
    return Path(entry["git_dir"]) == repo.common_dir


def repo_of(repo: Repo, entry: dict, strict: bool = False) -> Repo | None:
    """The repository of a slot entry: `repo` itself, or the other one it names (None if that one
    is gone, unless `strict`)."""
    if in_repo(repo, entry):
        return repo
    try:
        return open_repo(Path(entry["git_dir"]))
    except Exception:
        if strict:
            raise
        return None


def rebuild_slots(repo: Repo) -> slots.Slots:
    """Slots rebuilt from this repository's records and run-locks (the file was damaged)."""
    rebuilt = slots.Slots()
    for entry in records.list_entries(repo):
        if entry.get("state") not in ("queued", "running"):
            continue
        item = slots.make_entry(entry["id"], entry.get("attempt", 1), repo.common_dir)
        item["since"] = entry.get("created") or time.time()
        if entry["state"] == "running" or liveness.is_held(repo.state_dir, entry["id"]):
            rebuilt.running.append(item)
        else:
            rebuilt.queue.append(item)
    rebuilt.queue.sort(key=lambda e: e["since"])
    return rebuilt


def signal_job(state_dir: Path, job_id: str, sig: int) -> None:
    """Signal the worker's and the engine's process groups, only while the job's run-lock is held."""
    if not liveness.is_held(state_dir, job_id):
        return
    pids = read_pids(state_dir, job_id)
    for key in ("engine", "worker"):
        pgid = pids.get(key)
        if isinstance(pgid, int) and pgid > 1:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def wait_lock_released(state_dir: Path, job_id: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while liveness.is_held(state_dir, job_id):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def stop_running(repo: Repo, job_id: str, grace: float) -> None:
    """SIGTERM the job's process groups, SIGKILL after `grace`; returns once the worker is gone."""
    state_dir = repo.state_dir
    stop_marker(state_dir, job_id).touch(mode=0o600)
    signal_job(state_dir, job_id, signal.SIGTERM)
    if not wait_lock_released(state_dir, job_id, grace):
        signal_job(state_dir, job_id, signal.SIGKILL)
        wait_lock_released(state_dir, job_id, 10.0)
