"""The Ray executor, node side: `git-subtask run-remote <id> --attempt N --remote <url>`.

The entrypoint of the Ray job `start --on ray` submits. On the node it:
1. opens the node's cache for that remote: one mirror repository per remote URL under
   `$SUBTASK_RAY_CACHE` (default `~/.cache/git-subtask/ray`), reused across jobs; its work tree
   stays empty, each job gets its own worktree beside it (`<cache>/<key>/worktrees/<id>`);
2. fetches the job's refs (branch, record, pins) and the notes into it (fast-forward only);
3. runs exactly the worker a local job runs (`python -m subtask.worker.attempt <id> <mirror>`, the
   run-lock inherited), in this process group and with PR_SET_PDEATHSIG, so that Ray's stop and
   the death of the node take it down with the entrypoint;
4. streams the job's events (the redacted `events.jsonl`) to stdout: Ray's job log;
5. pushes the branch, record chain, pins and note (notes merged on a race), never forced, once
   when the job starts (so home sees `running`) and at the end; then removes the job's worktree
   (all of it is on the remote; the mirror keeps the objects for the next job).

Exit 0 when the job's terminal record is on the remote (whatever the job's own outcome: a failed
job is recorded failed by git, not by Ray); non-zero when it is not, so Ray says FAILED and home
ends the attempt with Ray's reason.

Invariants:
- Several jobs of one remote share the mirror at once: every ref it writes is a compare-and-swap
  (`sync.fetch_job`, records, notes), the mirror is created under a file lock.
- Never run a job whose record names another attempt than the one submitted (a stale Ray job).
- SIGTERM (Ray's stop) goes to the worker, which records the attempt stopped; this process
  ignores it so that it still pushes that record.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from subtask.git import records, worktrees
from subtask.git.gitrepo import Repo, git, open_repo
from subtask.model.errors import SubtaskError
from subtask.ops.landing import overlay
from subtask.ops.running import lifecycle
from subtask.ops.sharing import sync
from subtask.state import liveness
from subtask.state.statefiles import file_lock

CACHE_ENV = "SUBTASK_RAY_CACHE"
TAIL_INTERVAL = 0.2


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "git-subtask" / "ray"


def mirror(url: str) -> Repo:
    """The node's mirror of `url`, created on first use (under a lock: jobs start at once)."""
    base = cache_root() / hashlib.sha256(url.encode()).hexdigest()[:16]
    path = base / "mirror"
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    with file_lock(base / "init.lock"):
        if not (path / ".git").is_dir():
            git(base, "init", "-q", str(path))
            git(path, "config", "subtask.worktreeDir", str(base / "worktrees"))
            git(path, "remote", "add", "origin", url)
            (base / "url").write_text(url + "\n")
    return open_repo(path)


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def run(job_id: str, url: str, attempt_n: int) -> int:
    print(f"git-subtask: {job_id} attempt {attempt_n} on {socket.gethostname()} (pid {os.getpid()})", flush=True)
    repo = mirror(url)
    sync.fetch_job(repo, url, job_id)
    job = records.read(repo, job_id)
    current = job.state.current
    if current.n != attempt_n:
        print(f"error: {job_id} is at attempt {current.n}, this Ray job was submitted for attempt {attempt_n}",
              file=sys.stderr, flush=True)
        return 1
    if not current.terminal:
        if not _claim(repo, url, job_id, attempt_n):
            return 0
        code = _run_worker(repo, url, job_id)
        if code:
            print(f"git-subtask: the worker exited {code}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return _push_end(repo, url, job_id)


def _claim(repo: Repo, url: str, job_id: str, attempt_n: int) -> bool:
    """Take the attempt on the remote before anything runs: a record commit naming this node,
    pushed as a fast-forward. A `stop` at home pushes its own end of a queued attempt the same
    way, so the remote's ref decides: exactly one of the two wins, never both."""
    where = {"host": socket.gethostname(), "mirror": str(repo.root), "pid": os.getpid()}

    def change(job) -> bool:
        attempt = job.state.current
        if attempt.n != attempt_n or attempt.terminal or attempt.extra.get("node"):
            return False
        attempt.extra["node"] = where
        return True

    job = records.update(repo, job_id, change)
    if job.state.current.extra.get("node") != where:
        print(f"git-subtask: {job_id} attempt {attempt_n} is no longer waiting to run "
              f"({job.state.current.state}); nothing to do", flush=True)
        return False
    result = sync.push_job(repo, url, job_id, notes=False)
    if records.record_ref(job_id) in result.kept_local:
        records.cas_ref(repo, records.record_ref(job_id), job.tip, None)  # our claim was never shared: forget it
        print(f"git-subtask: {job_id} was stopped (or taken) before this node could claim it; nothing to do",
              flush=True)
        return False
    return True


def _run_worker(repo: Repo, url: str, job_id: str) -> int:
    """The local worker, exactly, on the inherited run-lock; its events echoed to stdout."""
    fd = liveness.acquire(repo.state_dir, job_id, block=False)
    if fd is None:
        raise SubtaskError("not_finished", f"{job_id} is already running on this node")
    env = dict(os.environ, SUBTASK_LOCK_FD=str(fd))
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # Ray's stop reaches the worker itself
    proc = subprocess.Popen([sys.executable, "-m", "subtask.worker.attempt", job_id, str(repo.root)],
                            stdin=subprocess.DEVNULL, cwd=str(repo.root), env=env, pass_fds=(fd,),
                            preexec_fn=_restore_and_die_with_parent)
    lifecycle.close_fd_keep_lock(fd)
    events = lifecycle.events_file(repo.state_dir, job_id)
    offset, announced = 0, False
    while True:
        ended = proc.poll() is not None
        offset, seen = _echo_new_events(events, offset)
        if seen and not announced:
            announced = True
            _push_quietly(repo, url, job_id)  # home sees `running` at its next look
        if ended:
            return proc.returncode
        time.sleep(TAIL_INTERVAL)


def _restore_and_die_with_parent() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()


def _echo_new_events(path: str, offset: int) -> tuple[int, bool]:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
    except FileNotFoundError:
        return offset, False
    complete = chunk[: chunk.rfind(b"\n") + 1]
    for line in complete.splitlines():
        print(line.decode("utf-8", "replace"), flush=True)
    return offset + len(complete), bool(complete)


def _push_quietly(repo: Repo, url: str, job_id: str) -> None:
    try:
        sync.push_job(repo, url, job_id, notes=False)
    except SubtaskError as exc:
        print(f"git-subtask: could not push {job_id} yet: {exc.message}", file=sys.stderr, flush=True)


def _push_end(repo: Repo, url: str, job_id: str) -> int:
    job = records.read(repo, job_id)
    result = sync.push_job(repo, url, job_id)
    for line in result.lines:
        print(f"git-subtask: {line}", flush=True)
    attempt = job.state.current
    if not attempt.terminal:
        print(f"error: {job_id} ended without a final record", file=sys.stderr, flush=True)
        return 1
    if not result.ok:
        print(f"error: the final record of {job_id} could not be pushed to {url}", file=sys.stderr, flush=True)
        return 1
    print(json.dumps({"v": 1, "subtask": job_id, "attempt": attempt.n, "state": attempt.state}), flush=True)
    _drop_worktree(repo, job_id)
    return 0


def _drop_worktree(repo: Repo, job_id: str) -> None:
    """Everything of the job is on the remote now: its worktree on this node is only disk used
    (a reply to a job run on Ray is not supported). Only the worktree this node made for it."""
    path = repo.worktree_dir() / job_id
    if path.is_dir() and worktrees.created_here(repo, job_id, path):
        git(repo.root, "worktree", "remove", "--force", str(path), check=False)

        overlay.forget(repo, job_id)
