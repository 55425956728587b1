"""Attention: tell the person when a job needs them (`subtask.notify`, and MCP log notifications).

Four events: a job `ended`; it ended with verify (or a check) failed, `verify_failed`; its engine
ended asking for more (`STATUS: partial|blocked`), `needs_reply`; its engine went silent,
`stalled`. An attempt that the verify loop retries has not ended: it is told once the loop ends.

For each event, once:
- `git config subtask.notify` runs (`sh -c`, unconfined: the person's own hook, like a git hook),
  in the repository's top folder, with `SUBTASK_JOB_ID`, `SUBTASK_EVENT`, `SUBTASK_STATE`,
  `SUBTASK_REASON`, `SUBTASK_SUMMARY` (the one-line status), `SUBTASK_ATTEMPT` and
  `SUBTASK_REPO` in its environment, never on its command line (a task or a reason is text a
  model wrote). It may run `NOTIFY_TIMEOUT` seconds; then its process group is killed. Its exit
  code and output are said (a warning, the worker's log) and change nothing.
- a line goes to the state folder's `notify.jsonl`, which an MCP server tails to send its client a
  log notification (`faces/mcp_calls.py`); rotated to `notify.jsonl.1` past `FEED_MAX` bytes.

Once per event: the process that writes an attempt's terminal record tells its end (the worker
after it lets go of the run-lock; `lifecycle.end_attempt` for every other end; at home, whoever
brings a cluster job's end home), and the worker's stall watch tells a stall mark it set.

Invariants:
- Never tell an event (`subtask.notify`, an MCP log notification) from anywhere but the write
  that made it (the terminal record's writer, the stall watch's mark), because every other
  process that notices an end (a waiter, a sweep, a second `bring_home`) would tell it again;
  and never put a job's words on the notify command's line, because a model wrote them
  (`tests/test_notify.py`).
- Never let a notify command change a job or fail a command, because it is a courtesy: every
  error here is a warning.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import warnings

from subtask import words as render
from subtask.git.gitrepo import Repo
from subtask.git.records import Job
from subtask.state import paths
from subtask.state.statefiles import file_lock, open_private

NOTIFY_TIMEOUT = 30.0
FEED_MAX = 1 << 20
TYPE_CHECKING = False
if TYPE_CHECKING:
    from subtask.state.statefiles import StrPath

EVENTS = ("ended", "verify_failed", "needs_reply", "stalled")
_PRIVATE = ("SUBTASK_LOCK_FD", "SUBTASK_RUN")  # a worker's own marks, never a hook's


def event_of(attempt) -> str:
    """Which event an ended attempt is: the most specific that holds."""
    if (attempt.verify is not None and not attempt.verify.passed) or attempt.error_kind == "check":
        return "verify_failed"
    if attempt.state == "done" and attempt.outcome in ("partial", "blocked"):
        return "needs_reply"
    return "ended"


def attempt_ended(repo: Repo, job: Job, attempt_n: int | None = None) -> None:
    """Tell that `job`'s attempt (default: its current one) ended; nothing when it has not."""
    attempt = job.state.current if attempt_n is None else next(
        (a for a in job.state.attempts if a.n == attempt_n), None)
    if attempt is None or not attempt.terminal:
        return
    event = event_of(attempt)
    reason = attempt.reason or ""
    if event == "verify_failed" and not reason:
        reason = "verify failed" + (f": exit {attempt.verify.exit_code}" if attempt.verify else "")
    tell(repo, job, event, attempt.state, reason, attempt.n)


def stalled(repo: Repo, job: Job) -> None:
    """Tell that `job`'s running attempt was just marked stalled."""
    attempt = job.state.current
    tell(repo, job, "stalled", "stalled", render.stalled_text(attempt), attempt.n)


def tell(repo: Repo, job: Job, event: str, state: str, reason: str, attempt_n: int) -> None:
    """The feed line, then the notify command; never raises."""
    said = {"v": 1, "t": round(time.time(), 3), "job": job.id, "event": event, "state": state,
            "reason": reason, "attempt": attempt_n, "summary": render.one_line(job), "repo": str(repo.root)}
    try:
        _feed(repo, said)
    except OSError as exc:
        warnings.warn(f"{job.id}: could not add to {paths.notify_feed(repo.state_dir)}: {exc}", stacklevel=2)
    try:
        command = repo.config.get("notify")
    except Exception:  # a setting doctor names; never the job's end
        command = None
    if command and command.strip():
        _run(repo, command, said)


def _feed(repo: Repo, said: dict) -> None:
    path = paths.notify_feed(repo.state_dir)
    line = (json.dumps(said, ensure_ascii=True) + "\n").encode()
    with file_lock(paths.notify_lock(repo.state_dir)):
        try:
            if os.stat(path).st_size + len(line) > FEED_MAX:
                os.replace(path, paths.notify_feed(repo.state_dir, old=True))
        except FileNotFoundError:
            pass
        fd = open_private(path)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def _run(repo: Repo, command: str, said: dict) -> None:
    import tempfile  # a notify command's run only: every worker imports this module

    env = {k: v for k, v in os.environ.items() if k not in _PRIVATE}
    timed_out = False
    env.update(SUBTASK_JOB_ID=said["job"], SUBTASK_EVENT=said["event"], SUBTASK_STATE=said["state"],
               SUBTASK_REASON=said["reason"], SUBTASK_SUMMARY=said["summary"],
               SUBTASK_ATTEMPT=str(said["attempt"]), SUBTASK_REPO=said["repo"])
    try:
        # Output to a file, not a pipe: a notifier that leaves a child holding the pipe
        # (`notify-send &`) must not hold us until it exits.
        with tempfile.TemporaryFile() as out:
            proc = subprocess.Popen(["sh", "-c", command], cwd=str(repo.root), env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = proc.wait(timeout=NOTIFY_TIMEOUT)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                code, timed_out = proc.wait(), True
            if code == 0:
                return
            out.seek(0)
            words = out.read()[-2000:].decode("utf-8", "replace").strip().splitlines()
    except OSError as exc:
        code, words = None, [str(exc)]
    what = (f"timed out after {NOTIFY_TIMEOUT:g}s" if timed_out else "failed to run" if code is None else
            f"exited {code}")
    warnings.warn(render.safe_line(f"subtask.notify {what} for {said['job']} ({said['event']})"
                                   + (f": {words[-1]}" if words else "")), stacklevel=2)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


# ---------------------------------------------------------------- the feed, read (an MCP server tails it)

def feed_end(state_dir: StrPath) -> tuple[int, int]:
    """Where the state folder's notify.jsonl ends now, as (inode, offset): (0, 0) for none yet."""
    try:
        found = os.stat(paths.notify_feed(state_dir))
    except OSError:
        return (0, 0)
    return (found.st_ino, found.st_size)


def feed_since(state_dir: StrPath, position: tuple[int, int]) -> tuple[list[dict], tuple[int, int]]:
    """The events added to a state folder's notify.jsonl since `position` (inode, offset, as
    `feed_end` or this gave it), the rest of the rotated file first, and the new position."""
    inode, offset = position
    found: list[dict] = []
    path = paths.notify_feed(state_dir)
    try:
        now = os.stat(path)
    except OSError:
        return found, (inode, offset)
    if now.st_ino != inode:
        old = paths.notify_feed(state_dir, old=True)
        try:
            if inode and os.stat(old).st_ino == inode:
                found += _feed_read(old, offset)[0]
        except OSError:
            pass
        inode, offset = now.st_ino, 0
    lines, offset = _feed_read(path, offset)
    return found + lines, (inode, offset)


def _feed_read(path: str, offset: int) -> tuple[list[dict], int]:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
    except OSError:
        return [], offset
    whole = chunk[: chunk.rfind(b"\n") + 1]
    found = []
    for line in whole.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            found.append(event)
    return found, offset + len(whole)
