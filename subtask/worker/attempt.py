"""The detached worker: one process runs a job's attempt from checkout to final record.

`python -m subtask.worker.attempt <id> <repo>` is spawned by `start` (or by whoever hands it a slot) with
its run-lock already held on the inherited fd `SUBTASK_LOCK_FD`. Steps: check the worktree out,
record `running`, run the engine with events streaming to `<state>/run/<id>.events.jsonl`, commit
what the engine left uncommitted, compute the evidence from git, run verify on that exact commit,
close the reservation with the real cost, write the head pin, the final record and the note, then
free the slot and hand it on. When the next queued job is in the same repository, the worker runs
it itself (no new process: hand-off costs no start-up).

Invariants:
- Exactly one terminal state per attempt: the final write goes through `Attempt.finish`, which
  never overwrites one, by compare-and-swap.
- The run-lock is released last, after the final record, so a waiter that wakes reads the end.
- The head pin is written before the final record; a worker killed after the record and before
  its note leaves its slot entry, and whoever reaps it completes the note (`lifecycle`).
- Every text from the engine or verify passes `redact` before it reaches the record, the note or
  the events file; streamed text (events with a `stream`, child output, verify output) through
  one `StreamRedactor` per stream, so a key printed over many lines is redacted whole.
- The engine and verify get the task and the verify command as written (`privatetext`), while
  the record only ever holds them redacted; that private copy goes when the attempt ends.
- Each job runs with its starter's kept environment (`jobenv.adopt`), never with that of the
  worker that was handed its slot.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import traceback
from decimal import Decimal
from pathlib import Path

from subtask.engines import get_engine, settings_reader
from subtask.engines.base import ERROR_HINTS, Baseline, EngineContext, Outcome
from subtask.git import checks, harness, notes, packing, pool, records, worktrees
from subtask.git.gitrepo import (
    NO_HOOKS,
    Repo,
    author_signature,
    diff_stats,
    ensure_excluded,
    finish_preload,
    git,
    open_repo,
    preload_pygit2,
)
from subtask.git.records import Job
from subtask.model import claims, faults, money, phases, render
from subtask.model.errors import SubtaskError
from subtask.model.job import DEPTH_ENV, WAITING, Evidence, VerifyResult, work_base
from subtask.model.redact import Redactor, StreamRedactor, redact, redact_obj
from subtask.ops import groups, lifecycle, notify, overlay, plans
from subtask.ops.stall import StallWatch
from subtask.ops.stall import action_of as stall_action
from subtask.proc import context, isolation, spawn
from subtask.proc import view as views
from subtask.state import jobenv, ledger, liveness, paths, ports, privatetext, slots
from subtask.state.statefiles import file_lock, open_private
from subtask.worker import retries

VERIFY_TAIL_BYTES = 4096


class StopRequested(KeyboardInterrupt):
    """Raised in the worker by SIGTERM (from `stop`); a KeyboardInterrupt so child runners kill their group."""


def _on_sigterm(signum, frame):
    raise StopRequested()


@contextlib.contextmanager
def stop_deferred():
    """A `stop` arriving inside waits until the block is done, then is raised: a `git worktree
    add` killed half-way leaves a folder that is no registered worktree, which no cleanup may
    then remove (it is not provably ours). (Run such git `own_group`: stop signals our group.)"""
    arrived: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
    if arrived and previous is _on_sigterm:
        raise StopRequested()


class EventSink:
    """Appends redacted events to the events file and keeps a tail for the record.

    Bounded: streamed output past the first `HEAD_BYTES` is held in memory, only its last
    `TAIL_BYTES` kept, and written (after a `dropped` event saying how many lines and bytes went
    between them) when the stream pauses for another event or `flush` is called. A job printing
    50 MB leaves ~1.3 MB of events, and the disk it shares with every other job stays free."""

    HEAD_BYTES = 1 << 20
    TAIL_BYTES = 256 << 10

    def __init__(self, path: Path, attempt: int):
        self.path = path
        self.attempt = attempt
        self.tail: list[str] = []
        self._streams: dict[tuple, StreamRedactor] = {}
        self._redactor = Redactor()  # the job's environment (adopted before the attempt) stays
        self._fd: int | None = None
        self._written = 0
        self._held: collections.deque[dict] = collections.deque()
        self._held_bytes = 0
        self._dropped = [0, 0]  # lines, bytes

    def __call__(self, event: dict) -> None:
        event = dict(event)
        streamed = isinstance(event.get("stream"), str) and isinstance(event.get("text"), str)
        if streamed:
            key = (event.get("type"), event["stream"])
            redactor = self._streams.get(key)
            if redactor is None:  # not setdefault: each StreamRedactor reads the environment's secrets
                redactor = self._streams[key] = StreamRedactor()
            text = redactor.key_blocks_only(event["text"])  # the patterns run once, as it is written
            if text is None:
                return  # inside a private key block: nothing of it is kept
            event["text"] = text
        event.setdefault("t", round(time.time(), 3))
        if streamed and self._written >= self.HEAD_BYTES:
            self._hold(event)
            return
        self.flush()
        self._write(event)

    def _hold(self, event: dict) -> None:
        self._held.append(event)
        self._held_bytes += len(event["text"])
        while self._held_bytes > self.TAIL_BYTES and len(self._held) > 1:
            size = len(self._held.popleft()["text"])
            self._held_bytes -= size
            self._dropped[0] += 1
            self._dropped[1] += size

    def flush(self) -> None:
        """Write what is held: how much was dropped, then the tail kept."""
        lines, size = self._dropped
        if lines:
            self._write({"type": "dropped", "lines": lines, "bytes": size,
                         "text": f"[{lines} lines of output ({size} bytes) dropped here]"})
            self._dropped = [0, 0]
        while self._held:
            self._write(self._held.popleft())
        self._held_bytes = 0

    def _write(self, event: dict) -> None:
        event = self._redactor.obj(event)
        event.setdefault("attempt", self.attempt)
        event.setdefault("worker", os.getpid())  # which worker ran it: hand-offs run several jobs
        line = json.dumps(event, ensure_ascii=True)
        data = (line + "\n").encode()
        try:
            if self._fd is None:
                self._fd = open_private(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC)
            os.write(self._fd, data)
            self._written += len(data)
        except OSError as exc:  # a full disk loses events, never the job
            print(f"git-subtask: an event was not written to {self.path}: {exc}", file=sys.stderr)
        self.tail.append(line)
        if len(self.tail) > records.EVENTS_TAIL_LINES:
            del self.tail[: len(self.tail) - records.EVENTS_TAIL_LINES]

    def close(self) -> None:
        self.flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def worktree_path(repo: Repo, job: Job) -> Path:
    """Where the job's worktree is on this machine: the recorded path, except for a job a cluster
    node runs (`spec.executor`), which gets one in the node's own cache (`subtask/executors/remote.py`)."""
    if isinstance(job.spec.extra.get("executor"), dict):
        return repo.worktree_dir() / job.id
    return Path(job.spec.worktree)


def begin_checkout(repo: Repo, job: Job) -> tuple[Path, Path, FilesCheckout]:
    """Create the job's worktree; git goes on writing its files while the caller records that
    the job runs. Only the registration is serialized (concurrent `git worktree add` can fail):
    the files are written after the lock is released, so the checkouts of jobs that start
    together run in parallel instead of one after another. Returns the worktree, its admin folder
    and the checkout. A worktree that exists (a reply, a retry, a dead worker's attempt) held the
    job's processes: its git metadata is checked first (`worktrees.MetadataChanged` if it is not
    what git wrote), because the checkout's git and the attempt's sandbox follow it."""
    path = worktree_path(repo, job)
    if path.exists() and os.path.lexists(path / ".git"):
        overlay.restore_left(repo, job.id)  # a killed worker's trusted tests never reach the engine
        admin = worktrees.check_metadata(repo, job.id, path, job.spec.branch, job.spec.base)
    else:
        ensure_excluded(repo.common_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        target = [job.spec.branch] if job.spec.branch else ["--detach", job.spec.base]
        head = f"ref: refs/heads/{job.spec.branch}" if job.spec.branch else job.spec.base
        with stop_deferred(), file_lock(repo.state_dir / paths.WORKTREE_LOCK):
            worktrees.drop_stale(repo, job.id, path)  # its folder deleted by hand: only its own registration
            pooled = pool.take(repo, job.id, path, head, job.spec.base)  # the files that differ, below
            if not pooled:
                git(repo.root, "worktree", "add", "--quiet", "--no-checkout", str(path), *target, own_group=True)
            worktrees.mark(repo, job.id, path)  # only a worktree marked here may ever be removed for this job
        admin = worktrees.expected_admin(repo, job.id)  # `mark` made sure git registered it there
        phases.mark("pool" if pooled else "register")
        if not pooled:
            packing.pack_loose_objects(repo)  # the checkout below then reads one pack, not every loose blob
            phases.mark("pack")
    faults.point("before_files_checkout")
    return path, admin, FilesCheckout.start(repo, path, admin)


class FilesCheckout:
    """git writing the files of a worktree registered without them, unless that was done: git
    writes the worktree's index last, once every file is written, so no index means not (or not
    all) written, also when a worker died in the middle; then it is done again from the start.
    A pooled worktree just taken (`pool.take`) has the index and files of the commit its marker
    names: git moves them to HEAD rewriting only the files that differ (a two-tree merge, which
    looks at no other file), or, when that fails (a worker killed half-way), makes them HEAD's
    whatever they are. Never skipped: the engine would run in an empty folder and the autocommit
    would record the deletion of every file. `finish` must follow `start`, whatever happens in
    between: no git process is left running."""

    def __init__(self, proc: subprocess.Popen | None, repo: Repo | None = None, path: Path | None = None,
                 admin: Path | None = None):
        self.proc, self.repo, self.path, self.admin = proc, repo, path, admin

    @classmethod
    def start(cls, repo: Repo, path: Path, admin: Path) -> FilesCheckout:
        """`admin`: the worktree's admin folder, made just now or checked (`begin_checkout`)."""
        if not worktrees.needs_files(admin):
            return cls(None)
        # A worker killed while writing leaves git's lock behind; no one else touches this worktree
        # before its files are written (the job's run-lock is ours).
        (admin / "index.lock").unlink(missing_ok=True)
        moved_from = worktrees.pending_checkout(admin)
        # What `worktree add` does, minus the ref writes; through the checked admin folder, as
        # `worktrees.job_git` runs git, never by discovery from the worktree's `.git`.
        how = ["-m", "-u", moved_from, "HEAD"] if moved_from else ["--reset", "-u", "HEAD"]
        return cls(cls._git(repo, path, admin, how), repo, path, admin)

    @staticmethod
    def _git(repo: Repo, path: Path, admin: Path, how: list[str]) -> subprocess.Popen:
        return subprocess.Popen(["git", *worktrees.JOB_GIT, "read-tree", *how], cwd=path,
                                env=worktrees.job_git_env(repo, admin, path),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def finish(self) -> str | None:
        """Wait for git; what went wrong, or None."""
        if self.proc is None:
            return None
        _, err = self.proc.communicate()
        if self.proc.returncode != 0 and "-m" in self.proc.args:  # not the commit's files: HEAD's, whatever they are
            self.proc = self._git(self.repo, self.path, self.admin, ["--reset", "-u", "HEAD"])
            _, err = self.proc.communicate()
        if self.proc.returncode != 0:
            return f"git read-tree failed: {err.decode(errors='replace').strip()}"
        (self.admin / worktrees.PENDING_CHECKOUT).unlink(missing_ok=True)
        return None


WORKTREE_INCLUDE = ".worktreeinclude"
SETUP_TAIL_BYTES = 2048


def copy_included(repo: Repo, worktree: Path) -> list[str]:
    """Copy the untracked/ignored files `.worktreeinclude` names (gitignore syntax, e.g. `.env`).

    The convention Claude Code uses: a fresh worktree lacks the files git does not track, so it
    cannot run. Only files that exist in the main worktree and that git ignores there are copied:
    an untracked file git does not ignore would be swept into the job's branch by the autocommit
    (a `.env` committed is a leaked secret), so it is skipped. Never over a file already in the new
    worktree, and never from the job worktrees themselves. Never through a symlink: the job's
    base decides what the worktree holds, and a `conf -> /elsewhere` there would carry the copy
    out of the worktree (`copy_into`).
    """
    listing = repo.root / WORKTREE_INCLUDE
    if not listing.is_file():
        return []
    out = git(repo.root, "ls-files", "-z", "--others", "--ignored", f"--exclude-from={listing}", check=False).stdout
    skip = [p for p in (repo.worktree_dir(), repo.root / ".subtask") if p.is_relative_to(repo.root)]
    wanted = [rel for rel in out.split("\0") if rel and not any((repo.root / rel).is_relative_to(f) for f in skip)]
    if not wanted:
        return []
    ignored = git(repo.root, "check-ignore", "-z", "--stdin", input="\0".join(wanted) + "\0", check=False).stdout
    copied = []
    for rel in filter(None, ignored.split("\0")):
        source = repo.root / rel
        if not (source.is_file() or source.is_symlink()):
            continue
        try:
            if copy_into(worktree, rel, source, repo.root):
                copied.append(rel)
        except OSError as exc:
            print(f"git-subtask: not copying {rel!r} into the worktree: {exc}", file=sys.stderr)
    return copied


def copy_into(root: Path, rel: str, source: Path, source_root: Path) -> bool:
    """Copy `source` to `root/rel` without following a symlink anywhere below `root`; False if
    something is already there. Each folder is opened (or made) from its parent's fd with
    O_NOFOLLOW, the file is created O_EXCL|O_NOFOLLOW with the source's mode: a symlink in
    the way is an error (ELOOP/ENOTDIR), never a path out of the worktree."""
    *folders, name = Path(rel).parts
    nofollow_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, folder in enumerate(folders):
            if folder in ("", ".", ".."):
                raise OSError(f"unexpected path component {folder!r}")
            try:
                os.mkdir(folder, mode=stat.S_IMODE(os.stat(source_root.joinpath(*folders[:depth + 1])).st_mode),
                         dir_fd=fd)
            except FileExistsError:
                pass
            parent, fd = fd, os.open(folder, nofollow_dir, dir_fd=fd)
            os.close(parent)
        return _copy_file(fd, name, source)
    finally:
        os.close(fd)


def _copy_file(dir_fd: int, name: str, source: Path) -> bool:
    info = os.lstat(source)
    try:
        if stat.S_ISLNK(info.st_mode):  # the user's own link, made as a link: nothing is followed
            os.symlink(os.readlink(source), name, dir_fd=dir_fd)
            return True
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      stat.S_IMODE(info.st_mode), dir_fd=dir_fd)
    except FileExistsError:
        return False
    try:
        os.fchmod(out, stat.S_IMODE(info.st_mode))  # exactly the source's mode, whatever the umask
        with open(source, "rb") as src, os.fdopen(out, "wb", closefd=False) as dst:
            shutil.copyfileobj(src, dst)
        os.utime(out, ns=(info.st_atime_ns, info.st_mtime_ns))
    finally:
        os.close(out)
    return True


def run_setup(repo: Repo, job: Job, worktree: Path, env: dict) -> str | None:
    """Run `git config subtask.setup` in the new worktree; the failure reason, or None when it passed."""
    command = repo.config.get("setup")
    if not command or not command.strip():
        return None
    from subtask.proc import procs

    result = procs.run(["sh", "-c", command], cwd=worktree, env=env,
                       timeout=repo.config.number("setupTimeout"), tail_bytes=SETUP_TAIL_BYTES, redact=True)
    if result.exit_code == 0 and not result.timed_out:
        return None
    output = (result.stdout_tail + "\n" + result.stderr_tail).strip()
    ending = "timed out" if result.timed_out else f"exited {result.exit_code}"
    return redact(f"setup command ({command}) {ending}" + (f": {output[-SETUP_TAIL_BYTES:]}" if output else ""))


def _update_attempt(repo: Repo, job_id: str, attempt_n: int, apply) -> Job | None:
    """Apply `apply(attempt)` to attempt `attempt_n` unless it has ended; None if it has."""
    def change(job: Job) -> bool:
        attempt = job.state.current
        if attempt.n != attempt_n or attempt.terminal:
            return False
        apply(attempt)
        return True

    job = records.update(repo, job_id, change, lock_wait=owner_lock_wait(repo))
    current = job.state.current
    return job if current.n == attempt_n and not current.terminal else None


def mark_running(repo: Repo, job: Job) -> Job | None:
    """Record `running` as soon as the worker takes a handed-on attempt (while git writes its
    checkout), so the hand-off shows at once; None if the attempt already ended (stopped in the
    spawn gap). An attempt its starter admitted reads `running` already: the time it was taken is
    kept in `job` and recorded with the engine's start, one record write fewer before the engine."""
    taken = time.time()
    attempt = job.state.current
    if attempt.state == "running":
        attempt.started_at = taken
        return job

    def apply(attempt) -> None:
        attempt.state = "running"
        attempt.started_at = taken

    return _update_attempt(repo, job.id, attempt.n, apply)


def mark_engine_started(repo: Repo, job_id: str, attempt_n: int, taken_at: float | None) -> Job | None:
    """Record that the engine starts: from here on a dead worker's engine may have spent money."""
    def apply(attempt) -> None:
        attempt.started_at = attempt.started_at or taken_at
        attempt.engine_started_at = time.time()

    return _update_attempt(repo, job_id, attempt_n, apply)


def engine_env(job: Job, state_dir: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SUBTASK_LOCK_FD"}
    env[DEPTH_ENV] = str(job.spec.depth + 1)
    env["SUBTASK_JOB_ID"] = job.id
    env["SUBTASK_WORKER_PID"] = str(os.getpid())  # a pid namespace hides it: $PPID is 0 there
    if job.spec.group:  # a best-of-N member: its task may tell the attempts apart
        env["SUBTASK_GROUP_ID"], env["SUBTASK_GROUP_MEMBER"] = job.spec.group, str(job.spec.member or 0)
    if state_dir is not None and job.state.current.retry:  # the verify loop: which retry, what verify said
        env.update(retries.env_for(state_dir, job))
    return env


def resume_point(job: Job) -> tuple[str | None, Baseline | None, Decimal]:
    """What a reply resumes: the session of the latest earlier attempt that has one; the figures
    that session last reported (the baseline of this attempt's own share; `Baseline.start` when
    no attempt of it recorded any); and what its attempts since then were charged without figures
    of their own (killed, timed out), which the engine's next running total includes again: that
    much is credited, so nothing is charged twice.

    The session's attempts are those from the first that names it on: an earlier one belongs to
    another session (a reply resumes only a session that an attempt named), and one in between
    that names none (its worker died before it could) resumed this one, the latest there was."""
    earlier = job.state.attempts[:-1]
    session = next((a.session_id for a in reversed(earlier) if a.session_id), None)
    if session is None:
        return None, None, money.ZERO
    first = next(i for i, a in enumerate(earlier) if a.session_id == session)
    unreported: list[Decimal] = []
    for attempt in reversed(earlier[first:]):
        baseline = Baseline.from_totals(attempt.totals)
        if baseline is not None and baseline.session_id == session:
            return session, baseline, money.total(unreported)
        if baseline is not None or attempt.session_id not in (None, session):
            break  # figures of another session: nothing before it is in this one's total
        unreported.append(charged_so_far(attempt))
    return session, Baseline.start(session), money.total(unreported)


def charged_so_far(attempt) -> Decimal:
    """What an ended attempt was charged, as its record (and the ledger's close) says: its whole
    reservation when the record knows no charge."""
    if attempt.cost.charged is not None:
        return attempt.cost.charged
    return attempt.cost.reserved if attempt.rid else money.ZERO


def run_engine(repo: Repo, job: Job, worktree: Path, sink, env: dict | None = None) -> Outcome:
    attempt = job.state.current
    session, baseline, _ = resume_point(job)
    engine = get_engine(job.spec.engine, repo.config)
    launched: list[int] = []  # a process of the engine started: from here it may have spent
    ctx = EngineContext(
        job_id=job.id, attempt=attempt.n, task=privatetext.message(repo.state_dir, job.id, attempt),
        worktree=worktree, repo_root=repo.root,
        git_common_dir=repo.common_dir, env=env if env is not None else engine_env(job, repo.state_dir), emit=sink,
        session_id=session, baseline=baseline, model=job.spec.model,
        max_usd=attempt.max_usd if attempt.max_usd is not None else job.spec.max_usd,
        max_turns=job.spec.max_turns, readonly=job.spec.readonly,
        timeout=attempt.timeout if attempt.timeout is not None else job.spec.timeout,
        config=settings_reader(engine, repo.config),
        on_pid=lambda pid: (launched.append(pid), lifecycle.record_engine(repo.state_dir, job.id, pid)),
        on_launch=lambda pid: launched.append(pid),
        private_dir=paths.run_dir(repo.state_dir),
        write_task_file=functools.partial(privatetext.task_file, repo.state_dir, job.id, attempt.n),
    )
    try:
        outcome = engine.run(ctx)
    except StopRequested:
        raise
    except Exception as exc:
        traceback.print_exc()
        outcome = Outcome(False, error_kind="engine", error=f"the {job.spec.engine} engine crashed: {exc}")
    outcome.launched = bool(launched)
    return outcome


def checked_metadata(repo: Repo, job: Job, worktree: Path) -> Path | None:
    """The worktree's admin folder once its git metadata is as git wrote it (`MetadataChanged` if
    not); None for a read-only job, whose worktree no git of ours reads."""
    if job.spec.readonly:
        return None
    return worktrees.check_metadata(repo, job.id, worktree, job.spec.branch, job.spec.base)


def metadata_changed(exc: worktrees.MetadataChanged) -> Outcome:
    return Outcome(False, error_kind="isolation",
                   error=redact(f"the job changed its worktree's git metadata, so git-subtask ran no git on it "
                                f"(nothing of it was committed): {exc}"))


def autocommit(repo: Repo, job: Job, worktree: Path, admin: Path | None) -> dict | None:
    """Commit whatever the engine left uncommitted, with a Subtask-Id trailer; say what it was.
    git runs through the admin folder `checked_metadata` vouched for, never by discovery."""
    if admin is None or worktree_untouched(admin):
        return None
    keep_out = engine_excludes(repo, job.spec.engine)
    status = worktrees.job_git(repo, admin, worktree, "status", "--porcelain", "--untracked-files=all",
                               "--ignore-submodules=all", *keep_out).stdout
    if not status.strip():
        return None
    files = [line[3:] for line in status.splitlines() if line.strip()]
    worktrees.job_git(repo, admin, worktree, "add", "-A", "--ignore-errors", *keep_out)
    sig = author_signature(repo)
    message = (f"subtask {job.id}: work left uncommitted by the {job.spec.engine} engine\n\n"
               f"Subtask-Id: {job.id}\n")
    env = dict(os.environ, GIT_AUTHOR_NAME=sig.name, GIT_AUTHOR_EMAIL=sig.email,
               GIT_COMMITTER_NAME=sig.name, GIT_COMMITTER_EMAIL=sig.email)
    worktrees.job_git(repo, admin, worktree, "commit", "--quiet", "--no-verify", "-F", "-", input=message, env=env)
    return {"sha": branch_tip(repo, job), "files": files[:200]}


def engine_excludes(repo: Repo, engine: str) -> list[str]:
    """The pathspec that keeps an engine's own files (`git config --add subtask.engine.<name>.exclude
    PATTERN`: aider's chat history and tags cache) out of what the worker commits; [] for none."""
    try:
        patterns = [p.strip() for p in repo.git.config.get_multivar(f"subtask.engine.{engine}.exclude") if p.strip()]
    except (KeyError, ValueError):
        return []
    return ["--", ".", *(f":(exclude){p}" for p in patterns)] if patterns else []


def worktree_untouched(admin: Path) -> bool:
    """True only when libgit2 finds nothing in the worktree but what its index and HEAD hold: no
    change, no untracked file, not even an ignored one; then git's status is empty too, and is
    not asked. libgit2 compares timestamps to the nanosecond where this git (2.39, built without
    USE_NSEC) compares seconds, so it is the stricter of the two; git, unsure of every file
    written in the index's own second, reads each one again (25-35 ms of CPU for a 2,000-file
    checkout that the engine left as it was, against 10-14 for libgit2's stat). False, so git
    decides, for anything else: a change, submodules (their own status rules), any error."""
    try:
        import pygit2

        repository = pygit2.Repository(str(admin))
        if (Path(repository.workdir) / ".gitmodules").exists():
            return False
        return not repository.status(untracked_files="all", ignored=True)
    except Exception:
        return False


def branch_tip(repo: Repo, job: Job) -> str:
    """Where the job's branch points, read from the repository itself (pygit2: no subprocess on
    the worker's end path), never through the worktree's HEAD, which the job may write."""
    return str(repo.git.references[f"refs/heads/{job.spec.branch}"].target)


def current_head(repo: Repo, job: Job) -> str:
    """The job's head: its branch's tip (its base for a read-only job, or when the job deleted its
    branch, which the metadata check then reported)."""
    if job.spec.readonly:
        return job.spec.base
    try:
        return branch_tip(repo, job)
    except KeyError:
        return job.spec.base


def verify_command(repo: Repo, job: Job) -> str:
    """The verify command as written (the record holds it redacted)."""
    return privatetext.verify(repo.state_dir, job.id, job.state.current.n, job.spec.verify)


def judge_of(repo: Repo, job: Job, worktree: Path, head: str, env: dict) -> overlay.Judge:
    """What judges the attempt's verify: the job's base's harness over its worktree (docs/verify.md
    "The judge"), or its own tests (`--harness job`)."""
    return overlay.prepare(repo, asked=job.spec.harness, command=verify_command(repo, job), trusted=work_base(job),
                           source="base", worktree=worktree, head=head, kept=overlay.read_snapshot(repo, job.id),
                           env=env)


def run_verify(repo: Repo, job: Job, worktree: Path, head: str, env: dict, judge: overlay.Judge | None = None,
               tmpdir: str | None = None) -> VerifyResult | None:
    """Verify on the job's commit, judged by the trusted harness (`judge`); when the job changed
    that harness, run again on its tree as it wrote it: its own tests, recorded apart."""
    if not job.spec.verify:
        return None
    tree = str(repo.git[head].tree_id)
    if judge is None:
        judge = overlay.Judge("job")
    if judge.error:
        return VerifyResult(command=job.spec.verify, exit_code=None, seconds=0.0, head=head, tree=tree, passed=False,
                            output_tail=redact(f"not run: {judge.error}"), harness=judge.facts())
    with overlay.overlaid(repo, judge, worktree, overlay.stash_of(repo, job.id), tmpdir or worktree.parent) as extra:
        result = _verify_once(repo, job, worktree, {**env, **extra})
    # A timeout is reported as the limit it hit: the run also took the kill and the pipes' grace.
    seconds = min(result.seconds, job.spec.verify_timeout) if result.timed_out else result.seconds
    verify = VerifyResult(command=job.spec.verify, exit_code=result.exit_code, seconds=round(seconds, 3),
                          head=head, tree=tree, passed=(result.exit_code == 0 and not result.timed_out),
                          timed_out=result.timed_out, output_tail=_verify_output(result))
    own = None
    if judge.touched:
        mine = _verify_once(repo, job, worktree, env)
        counts = claims.test_counts(_verify_output(mine))
        own = {"passed": mine.exit_code == 0 and not mine.timed_out, "exit_code": mine.exit_code,
               "timed_out": mine.timed_out, "seconds": round(mine.seconds, 3),
               "tests": {"passed": counts.passed, "failed": counts.failed} if counts else None}
    verify.harness = judge.facts(own)
    return verify


def _verify_once(repo: Repo, job: Job, worktree: Path, env: dict):
    from subtask.proc import procs

    # recorded as the attempt's child group, as the engine was: a dead worker's reaper ends it too
    return procs.run(["sh", "-c", verify_command(repo, job)], cwd=worktree, env=env, timeout=job.spec.verify_timeout,
                     tail_bytes=VERIFY_TAIL_BYTES, stdout_grace=2.0, redact=True,
                     on_start=lambda pid: lifecycle.record_engine(repo.state_dir, job.id, pid))


def _verify_output(result) -> str:
    output = result.stdout_tail + ("\n" if result.stdout_tail and result.stderr_tail else "") + result.stderr_tail
    return redact(output)[-VERIFY_TAIL_BYTES:]


class Confinement:
    """One attempt's isolation: the policy and its sandbox (its view of the machine, its private
    folders), the environment its processes get, what the view refused (observed) and what its
    output claimed was refused, and whether the main worktree changed while the job ran (`git
    status` before and after). Without ours, an engine's own sandbox (codex's) may refuse: what the
    commands it ran printed about refusals is listed as claims too."""

    def __init__(self, repo: Repo, job: Job, worktree: Path, admin: Path, sink: EventSink, before: MainWorktreeStatus):
        self.repo, self.job, self.sink = repo, job, sink
        self.before, self.after = before, None
        self.claimed: list[str] = []
        self.tmpdir = private_tmpdir(repo, job.id)  # every job's own, confined or not (its namespace)
        engine = get_engine(job.spec.engine, repo.config)
        confined = job.spec.isolation != "none"
        self.engine_sandbox = None if confined else isolation.own_sandbox(engine, job.spec.readonly)
        self.env = engine_env(job, repo.state_dir)
        if confined:
            self.env[isolation.ACTIVE_ENV] = job.spec.isolation
        from subtask.proc import procs

        self.env[procs.RUN_MARKER_ENV] = self.token = f"{job.id}.{job.state.current.n}.{os.getpid()}"
        self.worktree = worktree
        self.context = None
        try:
            self.context = starter_context(repo, job)
            self.env.update(namespace_env(repo, job))
            n = job.state.current.n
            # The admin folder the checkout made or checked, never the one the job's `.git` names.
            self.policy = isolation.build_policy(
                job.spec.isolation, worktree=worktree, admin=admin,
                common_dir=repo.common_dir, has_branch=bool(job.spec.branch),
                tmpdir=self.tmpdir, extra=isolation.configured_writable(repo.config, repo.root),
                engine_extra=isolation.engine_paths(engine, self.env) if confined else [],
                env=self.env, state_dir=repo.state_dir,
                readable=isolation.configured_paths(repo.config, repo.root, isolation.READABLE_KEY),
                engine_readable=isolation.engine_paths(engine, self.env, "readable") if confined else [],
                sockets=job.spec.sockets or [],
                optional=[str(privatetext.task_file_path(repo.state_dir, job.id, n)),
                          str(privatetext.verify_output_path(repo.state_dir, job.id, n))])
            isolation.plan_namespaces(self.policy, network=job.spec.network,
                                      asked=not job.spec.isolation_source.startswith("default"))
            self.sandbox = isolation.Sandbox(self.policy)
        except BaseException:
            release_namespace(repo, job)
            context.use(None)
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            raise
        temp = "/tmp" if self.policy.view is not None else self.tmpdir
        self.env.update(isolation.temp_env(temp))
        if self.policy.view is not None:
            self.env.update(git_identity(repo, self.env))
        # What a confined job is not given (host sockets, credentials), but for the engine process
        # its own credentials; granted by name with `subtask.isolation.env`.
        self.withheld = views.withheld(self.env, set(isolation.configured_names(repo.config))) if confined else []
        own = set(isolation.engine_credentials(engine, self.env)) if confined else set()
        self.engine_env = {k: v for k, v in self.env.items() if k not in self.withheld or k in own}
        self.env = {k: v for k, v in self.env.items() if k not in self.withheld}

    def watch(self, event: dict) -> None:
        """The engine's sink: every event goes on; an output line reading like a refused access is
        noted as what the job claims (it can print anything)."""
        self.sink(event)
        if self.policy.mode == "none" and not self.engine_sandbox:
            return
        if event.get("type") in ("output", "log") and self.policy.mode != "none":
            self.note_claim(str(event.get("text", "")))
        elif event.get("type") == "command" and isinstance(event.get("output"), str):
            for line in event["output"].splitlines():  # what an agent's command printed (codex)
                self.note_claim(line)

    def note_claim(self, text: str) -> None:
        if not isolation.looks_refused(text) or len(self.claimed) >= isolation.MAX_REFUSED:
            return
        line = redact(text.strip())[:300]
        self.claimed.append(line)
        self.sink({"type": "isolation", "mode": self.policy.mode, "claimed": line})

    def observe(self) -> None:
        """What the view refused during the last sandboxed run, as the kernel saw it: an event each."""
        for line in self.sandbox.accounting.collect():
            self.sink({"type": "isolation", "mode": self.policy.mode, "refused": redact(line)})

    def look_after(self) -> None:
        """Take the main worktree's status once nothing confined runs any more (the engine, or
        verify), in the background: the autocommit and the evidence need not wait for it."""
        if self.after is None:
            self.after = MainWorktreeStatus(self.repo)

    def evidence(self, verify: VerifyResult | None) -> tuple[dict, dict]:
        if verify is not None and self.policy.mode != "none":
            for line in verify.output_tail.splitlines():
                self.note_claim(line)
        self.observe()
        self.look_after()
        changed = sorted(set(self.before.lines()) ^ set(self.after.lines()))
        main = {"changed": bool(changed), "paths": [entry[3:] for entry in changed][:50]}
        refused = [redact(line) for line in self.sandbox.accounting.seen]
        seen = {"source": self.job.spec.isolation_source, "refused": refused, "claimed": self.claimed,
                "env_withheld": self.withheld}
        if self.engine_sandbox:  # none of ours: the engine's own confined it
            seen["engine_sandbox"] = f"{self.job.spec.engine} {self.engine_sandbox}"
        return self.policy.to_dict() | seen, main

    def end_leftovers(self) -> None:
        """End what the last sandboxed run left running. In a pid namespace the kernel did it as
        its pid 1 exited; else they are orphans this worker (their subreaper) adopted. Then take
        what its view refused."""
        if not self.policy.plan.pid:
            from subtask.proc import procs

            procs.end_adopted(self.token)
        self.observe()

    def close(self) -> None:
        self.end_leftovers()
        try:
            run_teardown(self.repo, self.job, self.worktree, self)
        finally:
            release_namespace(self.repo, self.job)
            context.use(None)
            self.sandbox.close()
            for status in (self.before, self.after):
                if status is not None:
                    status.lines()  # no git process is left behind, whatever ended the attempt
            discard_private(self.tmpdir)


def git_identity(repo: Repo, env: dict[str, str]) -> dict[str, str]:
    """The identity git commits with, for a job whose view holds no global git config (it may
    name credential helpers or URLs with tokens): `user.name`/`user.email` as git resolves them
    here, passed as the variables git reads first, unless the environment already sets them."""
    found = {}
    for key, names in (("user.name", ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME")),
                       ("user.email", ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"))):
        value = repo.config.git(key)
        for name in names if value else ():
            if name not in env:
                found[name] = value
    return found


def starter_context(repo: Repo, job: Job) -> context.Prepared:
    """The context of the job's starter (nice value, limits, umask, namespaces: `jobenv`), made
    the context of every child this worker starts for the attempt; refused when it cannot be
    given (a setup failure that names why), never replaced by this worker's own."""
    try:
        prepared = context.prepare(jobenv.load_context(repo.state_dir, job.id))
    except context.ContextError as exc:
        raise SubtaskError("fatal", f"cannot run as its starter ran: {exc}") from exc
    context.use(prepared)
    return prepared


TMP_FOLDER = ".tmp"  # under the worktree folder: beside the job worktrees, outside .git and /tmp


GONE = ".gone-"  # a private folder moved aside at its attempt's end, removed once nothing waits for it
_gone: list[Path] = []


def discard_private(folder: str) -> None:
    """Take the attempt's private folder away now (one rename: nothing of it is where it was), and
    remove it after the run-lock is released (`remove_discarded`): deleting its few dozen
    folders costs ~60 ms on a file system mounted with `discard`, which `wait` need not wait for."""
    path = Path(folder)
    aside = path.with_name(f"{GONE}{path.name}.{os.getpid()}")
    try:
        os.rename(path, aside)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        return
    _gone.append(aside)


def _alive(pid: str) -> bool:
    """Is the worker that moved a folder aside alive (it removes its own)? A reused pid keeps a
    dead one's folder until that process ends: garbage, never anyone's work."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (ValueError, OSError):
        return True
    return True


def remove_discarded() -> None:
    while _gone:
        shutil.rmtree(_gone.pop(), ignore_errors=True)


def private_tmpdir(repo: Repo, job_id: str) -> str:
    """A fresh 0700 temp dir for the job's engine (`<worktreeDir>/.tmp/<id>`). One a killed worker
    left behind is replaced here, and the folders killed workers had moved aside are removed, so
    a crash leaks at most one folder per job, in the repo, until the next attempt of any job."""
    path = repo.worktree_dir() / TMP_FOLDER / job_id
    shutil.rmtree(path, ignore_errors=True)
    try:
        for entry in os.scandir(path.parent):
            if entry.name.startswith(GONE) and not _alive(entry.name.rpartition(".")[2]):
                shutil.rmtree(entry.path, ignore_errors=True)
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.mkdir(mode=0o700)
    return str(path)


# ---------------------------------------------------------------- the job's namespace (issue 34)

def namespace_env(repo: Repo, job: Job) -> dict[str, str]:
    """What keeps parallel jobs apart at run time: its own ports (`ports.allocate`: the first of
    `subtask.portsPerJob` consecutive ports no other running job holds and nothing has bound),
    and its id as the name of whatever it starts (compose project, test database)."""
    count = repo.config.integer("portsPerJob")
    first = ports.allocate(repo.state_dir, job.id, job.state.current.n, repo.config.integer("portBase"), count)
    return {"SUBTASK_PORT": str(first), "SUBTASK_PORTS": str(count), "SUBTASK_NAMESPACE": job.id,
            "COMPOSE_PROJECT_NAME": job.id}


def release_namespace(repo: Repo, job: Job) -> None:
    """Give the attempt's ports back (once: a second release finds nothing)."""
    try:
        ports.release(repo.state_dir, job.id, job.state.current.n)
    except Exception as exc:  # a dead worker's settle releases them otherwise
        print(f"git-subtask: could not release the ports of {job.id}: {exc}", file=sys.stderr)


TEARDOWN_TAIL_BYTES = 2048


def run_teardown(repo: Repo, job: Job, worktree: Path, confinement: Confinement) -> None:
    """Run `git config subtask.teardown` when the attempt ends (whatever ended it), in the job's
    sandbox with the job's environment (its ports and names), to stop what the job started
    outside its process tree (containers, databases). Its end is said in the events and the
    worker log; it changes nothing in the job's record."""
    command = repo.config.get("teardown")
    if not command or not command.strip() or not worktree.is_dir():
        return
    from subtask.proc import procs

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the attempt is ending: a stop must not cut it short
    try:
        with isolation.confined(confinement.sandbox):
            result = procs.run(["sh", "-c", command], cwd=worktree, env=confinement.env,
                               timeout=repo.config.number("setupTimeout"), tail_bytes=TEARDOWN_TAIL_BYTES, redact=True)
        confinement.end_leftovers()
    except Exception as exc:
        print(redact(f"git-subtask: {job.id}: teardown ({command}) could not run: {exc}"), file=sys.stderr)
        return
    ended = "timed out" if result.timed_out else f"exited {result.exit_code}"
    confinement.sink({"type": "teardown", "command": redact(command), "exit_code": result.exit_code,
                      "timed_out": result.timed_out})
    if result.exit_code != 0 or result.timed_out:
        output = (result.stdout_tail + "\n" + result.stderr_tail).strip()
        print(redact(f"git-subtask: {job.id}: teardown ({command}) {ended}" + (f": {output}" if output else "")),
              file=sys.stderr)


class MainWorktreeStatus:
    """`git status --porcelain` of the main worktree, never writing its index, run in the
    background from its start until `lines` is first asked (the worker's own work overlaps it).
    Lines, not -z: git quotes odd paths (control characters too), and a rename stays one entry.

    Through a private copy of the main index when there is one (`main_index_copy`), which git may
    refresh and keep; else with `--no-optional-locks`, which refreshes nothing: while the user's
    index has racily clean entries, every such status re-reads all of their files."""

    def __init__(self, repo: Repo):
        self._lines: list[str] | None = None
        copy = main_index_copy(repo)
        env = dict(os.environ, GIT_INDEX_FILE=str(copy)) if copy else None
        # git rewrites the copy with the umask's mode; the state folder's files are the owner's alone
        locks = ("-c", "core.sharedRepository=0600") if copy else ("--no-optional-locks",)
        self._proc = subprocess.Popen(["git", *NO_HOOKS, "-C", str(repo.root), *locks, "status", "--porcelain"],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True, env=env)

    def lines(self) -> list[str]:
        if self._lines is None:
            out, _ = self._proc.communicate()
            self._lines = [line for line in out.splitlines() if line.strip()]
        return self._lines


MAIN_INDEX_COPIES = paths.MAIN_INDEX_COPIES


def main_index_copy(repo: Repo) -> Path | None:
    """A private copy of the main worktree's index for its status to refresh, or None (read it in
    place). Each copy is of one version of the index (named by its inode, size and mtime) and
    keeps that version's mtime, so git judges its racily clean entries as it would the
    original's, until git itself rewrites the copy. None unless the main worktree's index is
    `<root>/.git/index` (a separate git dir may have other worktrees' roots here), for a split
    index (git would write a shared index of ours into .git), with submodules (their status would
    refresh their own index), and whenever copying fails."""
    if repo.common_dir != repo.root / ".git" or (repo.root / ".gitmodules").exists() or _split_index(repo.common_dir):
        return None
    folder = repo.state_dir / MAIN_INDEX_COPIES
    try:
        with open(repo.common_dir / "index", "rb") as source:
            info = os.fstat(source.fileno())
            copy = folder / f"{info.st_ino}-{info.st_size}-{info.st_mtime_ns}"
            if copy.exists():
                return copy
            tmp = folder / f".{copy.name}.{os.getpid()}"
            with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC), "wb") as out:
                shutil.copyfileobj(source, out)
            os.utime(tmp, ns=(info.st_atime_ns, info.st_mtime_ns))
            os.replace(tmp, copy)
    except OSError:
        return None
    for other in folder.iterdir():  # earlier versions, and their lock files
        if other.name != copy.name and not other.name.startswith(f".{copy.name}."):
            with contextlib.suppress(OSError):
                other.unlink()
    return copy


def _split_index(common: Path) -> bool:
    try:
        with os.scandir(common) as entries:  # not Path.glob: ~2 ms a call in a busy worker
            return any(entry.name.startswith("sharedindex.") for entry in entries)
    except OSError:
        return True


MAX_EVIDENCE_FILES = 1000


def build_evidence(repo: Repo, job: Job, head: str, outcome: Outcome, auto: dict | None,
                   verify: VerifyResult | None, state: str) -> Evidence:
    base = work_base(job)
    commits, files, totals = diff_stats(repo, base, head)
    # Bounded, so a job that writes 100,000 files leaves a record every later `list` can read.
    omitted, files, commits = max(len(files) - MAX_EVIDENCE_FILES, 0), files[:MAX_EVIDENCE_FILES], commits[:MAX_EVIDENCE_FILES]
    commits, files, auto = redact_obj(commits), redact_obj(files), redact_obj(auto)  # the engine named them
    seen = [redact_obj(c) for c in outcome.commands]
    tests = [c for c in seen if _looks_like_test(c.get("command", ""))]
    return Evidence(
        id=job.id, attempt=job.state.current.n, engine=job.spec.engine, state=state, base=base,
        head=head, branch=job.spec.branch, commits=commits, files=files, files_omitted=omitted, totals=totals,
        autocommit=auto,
        verification=verify.to_dict() if verify else None, commands={"seen": seen[-200:], "tests": tests[-50:]},
        summary=redact(outcome.summary), outcome=outcome.outcome, tokens=outcome.tokens,
        model=outcome.model or job.spec.model,
        error=({"kind": outcome.error_kind, "message": redact(outcome.error or ""), "hint": outcome.hint}
               if outcome.error_kind else None),
    )


def _looks_like_test(command: str) -> bool:
    words = ("pytest", "unittest", "npm test", "go test", "cargo test", "make test", "tox", "jest", "vitest")
    return any(w in command for w in words)


# ---------------------------------------------------------------- checks, claims (docs/verify.md)

def _seen_by(watch: claims.Watch, sink):
    """The engine's sink: each event is seen by `watch` (the order of edits and test runs), then goes on."""
    def see(event: dict) -> None:
        watch.see(event)
        sink(event)

    return see


def run_checks(repo: Repo, job: Job, head: str, sink) -> list[dict] | None:
    """The job's checks on its work (`work_base`..head), read from git objects (never git in its
    worktree); None for a job with none."""
    if not job.spec.checks or job.spec.readonly:
        return None
    sink({"type": "state", "state": "checking", "checks": job.spec.checks})
    return checks.run(repo, work_base(job), head, job.spec.checks)


def judge(verify: VerifyResult | None, found: list[dict] | None, outcome: Outcome,
          recorded: list[str] | None = None) -> Outcome:
    """A failed check fails verify, whatever it exited, and the attempt (kind `check`, its hint
    keeping the other checks, `recorded`: the job's); verify's test counts are read from its
    output."""
    failed = checks.failed(found)
    if verify is not None:
        counts = claims.test_counts(verify.output_tail)
        verify.tests = {"passed": counts.passed, "failed": counts.failed} if counts else None
        if failed:
            verify.checks_failed, verify.passed = failed, False
    if failed and outcome.ok:
        outcome.ok, outcome.error_kind, outcome.error = False, "check", redact(checks.failure_text(found))
        outcome.error_hint = redact(checks.retry_hint(found, recorded or []))
    return outcome


def _record_checks(job: Job, found: list[dict] | None) -> None:
    if found is not None:
        job.state.current.checks = found


def claims_of(evidence: Evidence, verify: VerifyResult | None, found: list[dict] | None,
              watch: claims.Watch) -> list[dict] | None:
    """What the engine's summary claims and the evidence contradicts (shown, never decided on)."""
    paths = [f["path"] for f in evidence.files] + [f["old_path"] for f in evidence.files if f.get("old_path")]
    said = claims.contradictions(evidence.summary, verify=verify, checks_failed=checks.failed(found), files=paths,
                                 files_complete=not evidence.files_omitted, watch=watch.to_dict())
    return said or None


def charge_of(job: Job, outcome: Outcome) -> Decimal | None:
    """What the current attempt is about to be charged (`finish` settles it the same way)."""
    attempt = copy.deepcopy(job.state.current)
    settle_outcome(job, attempt, outcome)
    return attempt.cost.charged


def settle_outcome(job: Job, attempt, outcome: Outcome) -> None:
    """`settle_cost` with what the engine said: the credit applies to a share of the resumed
    session's running figures; an engine that saw no answer is never billed."""
    settle_cost(attempt, outcome.cost_usd, launched=outcome.launched,
                credit=resume_point(job)[2] if outcome.since_baseline else money.ZERO,
                never_billed=outcome.billed is False)


def evidence_at_best(repo: Repo, job: Job, plan: retries.Plan, outcome: Outcome, state: str,
                     last: Evidence) -> Evidence:
    """The evidence of the head the loop left the branch at: its diff and its verify; what the
    engine said and how it was confined stay the last attempt's."""
    evidence = build_evidence(repo, job, plan.head, outcome, None, plan.best_verify, state)
    evidence.attempt = plan.best["attempt"] if plan.best else evidence.attempt
    evidence.isolation, evidence.main_worktree, evidence.claims = last.isolation, last.main_worktree, last.claims
    return evidence


def finish(repo: Repo, job_id: str, attempt_n: int, state: str, outcome: Outcome, evidence: Evidence | None,
           verify: VerifyResult | None, head: str | None, sink: EventSink, stop_reason: str | None = None,
           then=None) -> Job:
    """Write the final record once: state, cost, evidence, summary, events tail; `then(job)`
    adds to that same write (the verify loop's next attempt: `retries.Plan.apply`)."""
    def change(job: Job) -> bool:
        attempt = job.state.current
        if attempt.n != attempt_n or attempt.terminal:
            return False
        reason = redact(outcome.error) if outcome.error else None
        if state == "stopped":
            # `stop` may kill the engine's group before the worker's SIGTERM lands: the engine
            # then says "exited with code -15", which is the stop, not a reason of its own.
            reason = stop_reason or "stopped by request"
        attempt.finish(state, reason=reason, error_kind=outcome.error_kind if state == "failed" else None,
                       hint=(outcome.hint or None) if state == "failed" else None, outcome=outcome.outcome,
                       session_id=outcome.session_id or attempt.session_id, model=outcome.model,
                       turns=outcome.turns, tokens=outcome.tokens, head=head, verify=verify,
                       totals=outcome.totals or None)
        settle_outcome(job, attempt, outcome)
        if evidence is not None:
            evidence.state = state
            evidence.cost = attempt.cost.to_dict()
            job.evidence = evidence
        job.summary = redact(outcome.summary or "")
        job.events_tail = "\n".join(sink.tail) + ("\n" if sink.tail else "")
        if then is not None:
            then(job)
        return True

    return records.update(repo, job_id, change, lock_wait=owner_lock_wait(repo))


def owner_lock_wait(repo: Repo) -> float:
    """The worker waits out a held record lock until it is stale and removed: its own writes must
    not fail (a done job recorded failed) because some writer died holding that lock."""
    return repo.config.number("refLockStale") + 2 * records.LOCK_WAIT


def settle_cost(attempt, observed: object, *, launched: bool = True, credit: object = money.ZERO,
                never_billed: bool = False) -> None:
    """The attempt's charge from what its engine observed, in exact dollars: capped at the
    reservation; the whole reservation when unknown; nothing when no engine process ever ran, or
    when the engine saw no model answer and knows no cost (`never_billed`: an API it could not
    reach, however the attempt ended); `credit` (charged already, see `resume_point`) is taken
    off an observed share of a resumed session."""
    cost = attempt.cost
    observed, credit = money.usd(observed), money.usd(credit) or money.ZERO
    cost.observed = observed
    if attempt.rid and not launched:
        # Not installed, or failed to launch: no process of the engine ever ran, nothing was spent.
        cost.charged, cost.billing = money.ZERO, "not_started"
        attempt.engine_started_at = None
        return
    if not attempt.rid:
        cost.billing = "free"
        cost.charged = money.ZERO if observed is None else None
        return
    unknown = observed is None or observed < 0
    if unknown and never_billed:
        cost.charged, cost.billing = money.ZERO, "not_billed"
        return
    if not unknown and credit > 0:
        cost.credit = min(credit, observed)
        observed = observed - cost.credit
    cost.charged = cost.reserved if unknown else min(observed, cost.reserved)
    cost.billing = "charged" if unknown else "observed"


def run_attempt(repo: Repo, job: Job) -> None:
    """Run the current attempt of `job` (as just read) to its end. The caller holds the run-lock."""
    job_id, attempt_n = job.id, job.state.current.n
    if job.state.current.terminal or job.state.current.state == WAITING:
        return  # ended; or still waiting (`plans` starts it), never a worker's to run
    state_dir = repo.state_dir
    if lifecycle.stop_marker(state_dir, job_id).exists():
        lifecycle.end_attempt(repo, job_id, attempt_n, "stopped", reason="stopped before it started",
                              engine_may_have_spent=False)
        return
    sink = EventSink(lifecycle.events_file(state_dir, job_id), attempt_n)
    try:
        _run_attempt(repo, job, sink)
    finally:
        sink.close()


def _run_attempt(repo: Repo, job: Job, sink: EventSink) -> None:
    job_id, attempt_n = job.id, job.state.current.n
    fresh = not worktree_path(repo, job).exists()
    set_up = _set_up_worktree(repo, job, sink)
    if set_up is None:
        return
    job, worktree, admin, main_before = set_up
    try:
        confinement = Confinement(repo, job, worktree, admin, sink, main_before)
    except BaseException as exc:
        main_before.lines()  # no git process is left behind
        if isinstance(exc, SubtaskError):  # no ports to give it (`namespace_env`)
            _setup_failed(repo, job_id, attempt_n, redact(exc.message))
            return
        if not isinstance(exc, (isolation.IsolationError, OSError)):
            raise
        lifecycle.end_attempt(repo, job_id, attempt_n, "failed", reason=redact(f"isolation {job.spec.isolation}: {exc}"),
                              error_kind="isolation", hint=ERROR_HINTS["isolation"], engine_may_have_spent=False)
        return
    phases.mark("confinement")
    try:
        if fresh and not set_up_fresh(repo, job, worktree, confinement):
            return
        _run_confined(repo, job, worktree, sink, confinement)
    finally:
        confinement.close()


def refill_pool(repo: Repo, job: Job) -> None:
    """Make the next job's worktree while this one runs: a forked child fills the pool at this
    job's base (`pool.fill`), unless the pool has what it should or is being filled. The child
    holds `pool-fill.lock` (taken here, before the fork) and none of our run-locks; the worker
    waits for it before it lets go of its run-lock (`serve`), so the refill is part of the job:
    when `wait` returns, nothing of the job runs any more."""
    if not pool.wanted(repo):
        return
    lock = pool.filler(repo)
    if lock is None:
        return
    base = job.spec.base

    def fill() -> None:
        liveness.close_others(-1)
        pool.fill(repo, commit=base, lock=lock)

    try:
        spawn.in_background(fill)
    finally:
        lock.forget()  # the child's now: closed here, never unlocked


def _set_up_worktree(repo: Repo, job: Job, sink: EventSink) -> tuple[Job, Path, Path, MainWorktreeStatus] | None:
    """Check the worktree out, recording `running` meanwhile; None when the attempt ended here
    (stopped in the spawn gap, the checkout failed, or the job had changed the git metadata of
    the worktree it runs in again: failed, kind `isolation`, nothing run). The main
    worktree's status is taken meanwhile too (once the job's own folder is registered and
    excluded: it then shows alike before and after the engine)."""
    job_id, attempt_n = job.id, job.state.current.n
    try:
        worktree, admin, files = begin_checkout(repo, job)
    except worktrees.MetadataChanged as exc:
        path = worktree_path(repo, job)
        lifecycle.end_attempt(repo, job_id, attempt_n, "failed", error_kind="isolation", engine_may_have_spent=False,
                              reason=redact(f"the job changed its worktree's git metadata, so git-subtask ran nothing "
                                            f"of this attempt (no git, no engine) in it: {exc}"),
                              hint=f"start the task again as a new job; {path} is kept as the job left it, for you "
                                   "to inspect (its git metadata names what the job chose: run no git there)")
        return None
    except Exception as exc:
        # git's message on one line (it wraps its advice); the hint names the check-out, not subtask.setup
        _setup_failed(repo, job_id, attempt_n, redact(f"could not check the worktree out: {' '.join(str(exc).split())}"),
                      hint=f"see what git has: git worktree list; then try again: git subtask reply {job_id} '...'")
        return None
    refill_pool(repo, job)  # beside the job from here on, on the core its checkout leaves free
    main_before = MainWorktreeStatus(repo)
    ready = None
    try:
        ready = _finish_checkout(repo, job, sink, worktree, files)
    finally:
        if not ready:
            main_before.lines()  # no git process is left behind
    return (ready, worktree, admin, main_before) if ready else None


def _finish_checkout(repo: Repo, job: Job, sink: EventSink, worktree: Path, files: FilesCheckout) -> Job | None:
    job_id, attempt_n = job.id, job.state.current.n
    running = None
    try:  # recorded while git writes the files: off the job's critical path
        running = mark_running(repo, job)
        if running is not None:
            sink({"type": "state", "state": "running"})
        phases.mark("record_running")
        # While git writes the files, on the core it leaves free: the rest of the attempt writes
        # through pygit2. Not sooner: its import holds the GIL, which the steps above need between
        # their git processes.
        preload_pygit2()
    finally:
        unwritten = files.finish()
        finish_preload()  # whatever happened: fork or confine only from a single-threaded process
    if running is None:
        return None
    if unwritten:
        _setup_failed(repo, job_id, attempt_n, redact(f"could not set up the worktree: {unwritten}"))
        return None
    phases.mark("checkout")
    faults.point("after_checkout")
    return running


def set_up_fresh(repo: Repo, job: Job, worktree: Path, confinement: Confinement) -> bool:
    """Copy `.worktreeinclude` files into a new worktree and run `subtask.setup` there, confined
    as the job is: the setup script may be one the job rewrote on its branch. False when the
    attempt ended here."""
    try:
        copy_included(repo, worktree)
        with isolation.confined(confinement.sandbox):
            failure = run_setup(repo, job, worktree, confinement.env)
        confinement.end_leftovers()
        if not failure and job.spec.verify and not harness.judged_by_job(job.spec.harness):
            # what the worktree held beyond its tree before the job ran is not the job's
            overlay.keep_snapshot(repo, job.id, harness.snapshot(repo, work_base(job), worktree, job.spec.harness,
                                                                 verify_command(repo, job)))
    except Exception as exc:
        failure = redact(f"could not set up the worktree: {exc}")
    if failure:
        _setup_failed(repo, job.id, job.state.current.n, failure)
        return False
    phases.mark("setup")
    return True


def _setup_failed(repo: Repo, job_id: str, attempt_n: int, reason: str, hint: str | None = None) -> None:
    lifecycle.end_attempt(repo, job_id, attempt_n, "failed", reason=reason, error_kind="setup",
                          hint=hint or ERROR_HINTS["setup"], engine_may_have_spent=False)


def _run_confined(repo: Repo, job: Job, worktree: Path, sink: EventSink, confinement: Confinement) -> None:
    """From the engine's start to the final record; the engine and verify run under `confinement`."""
    state_dir = repo.state_dir
    job_id, attempt_n = job.id, job.state.current.n
    job = mark_engine_started(repo, job_id, attempt_n, job.state.current.started_at)
    if job is None:
        return
    # The main worktree as it was before the engine, whole: a status still running into the
    # engine's first writes would see them "before" as well, and their change would go unseen.
    confinement.before.lines()
    phases.mark("record_engine_started")
    if confinement.policy.mode != "none":
        sink({"type": "isolation", "mode": confinement.policy.mode,
              "writable": [g.to_dict()["path"] for g in confinement.policy.grants]})
    started_from = current_head(repo, job)  # an attempt that leaves it here changed nothing
    watch = claims.Watch()  # the order of the engine's edits and test runs, for its claims
    stopped = False
    stall = StallWatch(repo, job_id, attempt_n, sink, after=repo.config.number("stallAfter"),
                       action=stall_action(repo), grace=repo.config.number("stopGrace"))
    try:
        with isolation.confined(confinement.sandbox), stall:
            outcome = run_engine(repo, job, worktree, stall.emitter(_seen_by(watch, confinement.watch)),
                                 confinement.engine_env)
    except StopRequested:
        stopped = True
        outcome = Outcome(False, error_kind="stopped", error="stopped by request")
    finally:
        confinement.end_leftovers()  # nothing of the job runs while our git reads what it wrote
        sink.flush()  # the output's tail, before the record takes its events tail
    phases.mark("engine")
    faults.point("after_engine")
    stopped = stopped or stall.stopped or lifecycle.stop_marker(state_dir, job_id).exists()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the rest is quick bookkeeping; let it finish
    if stopped or not outcome.ok or not job.spec.verify:
        confinement.look_after()  # nothing confined runs any more
    admin = None
    try:
        admin = checked_metadata(repo, job, worktree)
        auto = autocommit(repo, job, worktree, admin)
    except worktrees.MetadataChanged as exc:
        outcome, auto = metadata_changed(exc), None
    head = current_head(repo, job)
    phases.mark("autocommit")
    verify = found = None
    if not stopped and outcome.ok:
        found = run_checks(repo, job, head, sink)
        judged_by = None
        if job.spec.verify:
            judged_by = judge_of(repo, job, worktree, head, confinement.env)
            if judged_by.check() is not None:
                found = [*(found or []), judged_by.check()]
        sink({"type": "state", "state": "verifying", "command": job.spec.verify} if job.spec.verify else {"type": "state", "state": "finishing"})
        # A stop ends verify too (its group is killed), and the attempt still records what the
        # work is: evidence, head pin, note. Ignoring it here left `stop` to SIGKILL the worker.
        signal.signal(signal.SIGTERM, _on_sigterm)
        try:
            with isolation.confined(confinement.sandbox):
                verify = run_verify(repo, job, worktree, head, confinement.env, judged_by, confinement.tmpdir)
        except StopRequested:
            stopped = True
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            confinement.end_leftovers()
        if lifecycle.stop_marker(state_dir, job_id).exists():
            stopped, verify = True, None  # ended by the stop: no verdict on the work
        faults.point("after_verify")
    phases.mark("verify")
    outcome = judge(verify, found, outcome, job.spec.checks)
    state = "stopped" if stopped else ("done" if outcome.ok else "failed")
    evidence = build_evidence(repo, job, head, outcome, auto, verify, state)
    evidence.isolation, evidence.main_worktree = confinement.evidence(verify)
    evidence.claims = claims_of(evidence, verify, found, watch)
    plan = retries.after_attempt(repo, job, retries.Facts(state, verify, head, started_from, charge_of(job, outcome),
                                                          found, outcome.session_id), admin, worktree)
    if plan.head != head:  # every attempt of the loop failed: the branch is left at the best one
        evidence = evidence_at_best(repo, job, plan, outcome, state, evidence)
    phases.mark("evidence")
    faults.point("before_final_record")
    retries.pin_attempt(repo, job, head)
    if plan.head != job.spec.base:
        # Before the terminal record, never after: a worker killed in between must not leave a
        # finished job whose commits nothing keeps alive once its branch is squashed away.
        records.set_pin(repo, job_id, "head", plan.head)
    phases.mark("pins")
    try:
        job = finish(repo, job_id, attempt_n, state, outcome, evidence, verify, head, sink,
                     stop_reason=stall.reason if stall.stopped and not lifecycle.stop_marker(state_dir, job_id).exists() else None,
                     then=lambda ended: (_record_checks(ended, found), plan.apply(ended)))
    except BaseException:
        plan.undo()  # no record of the next attempt: its slot entry and money go back
        raise
    retrying = plan.settle(job)
    privatetext.discard(state_dir, job_id, attempt_n)
    phases.mark("record")
    faults.point("after_final_record")
    attempt = job.state.attempts[attempt_n - 1]
    if attempt.rid:
        ledger.close(state_dir, attempt.rid, attempt.cost.charged, reason=state)
    phases.mark("ledger")
    if retrying:  # the job goes on: its note is written when its loop ends
        sink({"type": "state", "state": "retrying", "attempt": attempt_n + 1,
              "why": checks.failure_text(found) or "verify failed"})
        return
    notes.ensure_notes_config(repo)  # first use sets notes.subtask.mergeStrategy (never rewriteRef)
    notes.write_for_job(repo, job)
    phases.mark("note")
    if job.spec.readonly:
        git(repo.root, "worktree", "remove", "--force", str(worktree), check=False)
        overlay.forget(repo, job_id)
    sink({"type": "state", "state": attempt.state})
    phases.mark("terminal_event")
    notify.attempt_ended(repo, job, attempt_n)  # `finish` wrote the end: told once, here
    pack_refs_when_many(repo)


PACK_REFS_OVER = 1000


def pack_refs_when_many(repo: Repo) -> None:
    """Pack refs once many job refs are loose: listing 10,000 loose refs costs ~0.2 s more."""
    try:
        loose = sum(1 for _ in os.scandir(repo.common_dir / "refs" / "subtask"))
    except OSError:
        return
    if loose > PACK_REFS_OVER:
        git(repo.root, "pack-refs", "--all", check=False)
        # Packing prunes the emptied refs/heads/subtask/; a confined job still running could not
        # create it again (only the folder itself is granted), so its next commit would fail.
        (repo.common_dir / "refs" / "heads" / "subtask").mkdir(parents=True, exist_ok=True)


def release_and_next(repo: Repo, job_id: str, attempt_n: int) -> list[slots.HandOff]:
    with slots.transaction(repo.state_dir, rebuild=lambda: lifecycle.rebuild_slots(repo)) as current:
        slots.remove(current, job_id, attempt_n)
        return slots.fill(current, repo.state_dir, repo.config.integer("maxRunning"))


def serve(repo: Repo, job_id: str, lock_fd: int, started_at: float | None = None) -> None:
    """Run this job, then every queued job handed to us in this repository."""
    while True:
        phases.begin(started_at)
        started_at = None
        liveness.adopt(job_id, lock_fd)
        lifecycle.reset_pids(repo.state_dir, job_id, worker=os.getpid())
        signal.signal(signal.SIGTERM, _on_sigterm)
        attempt_n, ended = _run_current(repo, job_id)
        jobenv.drop(repo.state_dir, job_id)  # the attempt ended; a reply keeps its own
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        member = ended if ended is not None and ended.spec.group else None
        if member is not None:  # first pass: the rest stop before our slot is handed to one of them
            groups.after_member_ended(repo, member, first_pass_only=True)
        phases.mark("wrap_up")
        handed = release_and_next(repo, job_id, attempt_n)
        phases.mark("slot_hand_off")
        start_waiters(repo, settle=False)  # before our run-lock goes: `wait` for us returns with them started
        spawn.reap_background()  # the pool refill beside the job ends with it: when no job runs, nothing runs
        phases.mark("refill_joined")
        liveness.release(lock_fd)
        phases.mark("run_lock_released")
        remove_discarded()  # the attempt's private folder, moved aside: `wait` has returned meanwhile
        phases.flush(job_id, attempt_n)
        same_repo = [h for h in handed if lifecycle.in_repo(repo, h.entry)]
        lifecycle.start_handoffs(repo, [h for h in handed if h not in same_repo[:1]])
        if member is not None:  # our note is written and our run-lock released: settle the group
            groups.after_member_ended(repo, member)
            start_waiters(repo)  # ... and start the jobs waiting for the group
        if not same_repo:
            return
        job_id, lock_fd = same_repo[0].entry["job"], same_repo[0].fd
        jobenv.adopt(repo.state_dir, job_id)  # its starter's environment, not the previous job's


def start_waiters(repo: Repo, settle: bool = True) -> None:
    """Move on the jobs waiting for the one this worker just ended (`plans.advance`); cheap when
    none waits. Whatever fails here, the next command's sweep does it. `settle` False: a group they
    wait for is not decided here (its judges would hold our run-lock; we settle it after it)."""
    faults.point("before_advance")
    plans.advance_quietly(repo, settle)
    faults.point("after_advance")


def _run_current(repo: Repo, job_id: str) -> tuple[int, Job | None]:
    """Run the job's current attempt, ending it whatever happens; the attempt number, and the
    job as its record then says (None when it cannot be read)."""
    try:
        job = records.read(repo, job_id)
    except SubtaskError:
        # Its `start` crashed after queueing it, before writing its record: nothing of it ran.
        # Release its reservation and drop its branch; the caller frees the slot.
        lifecycle.settle_dead(repo, slots.make_entry(job_id, 1, repo.common_dir))
        return 1, None
    while True:
        attempt_n = _run_one(repo, job)
        try:  # read once for the log and for the caller (a group member's settling)
            ended = records.read(repo, job_id)
        except SubtaskError:
            return attempt_n, None
        log_end(ended, attempt_n)
        if not retries.retry_to_run(ended, attempt_n):
            return attempt_n, ended
        # The verify loop appended a retry: this worker runs it, in the slot it renamed to it.
        job = ended
        lifecycle.reset_pids(repo.state_dir, job_id, worker=os.getpid())
        signal.signal(signal.SIGTERM, _on_sigterm)


def _run_one(repo: Repo, job: Job) -> int:
    """Run the job's current attempt, ending it whatever happens; its number."""
    job_id, attempt_n = job.id, job.state.current.n
    try:
        run_attempt(repo, job)
    except StopRequested:
        lifecycle.end_attempt(repo, job_id, attempt_n, "stopped", reason="stopped by request")
    except Exception as exc:
        traceback.print_exc()
        if lifecycle.stop_marker(repo.state_dir, job_id).exists():
            # Stopped mid-wrap-up (a killed git leaves a broken index.lock behind): the end is
            # the one the user asked for, and the error stays in this log.
            lifecycle.end_attempt(repo, job_id, attempt_n, "stopped", reason="stopped by request")
        else:
            lifecycle.end_attempt(repo, job_id, attempt_n, "failed", reason=f"worker error: {exc}",
                                  error_kind="engine", hint=ERROR_HINTS["engine"])
    return attempt_n


LOG_TAIL_LINES = 10


def log_end(job: Job, attempt_n: int) -> None:
    """Say in the worker log (our stderr) how the attempt ended, and why when it did not pass:
    the hints send people to that log. Only recorded (redacted) text is written."""
    job_id = job.id
    attempt = next((a for a in job.state.attempts if a.n == attempt_n), None)  # a retry may follow it
    if attempt is None:
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    lines = [f"{stamp} {job_id} attempt {attempt_n} {attempt.state}"
             + (f" ({attempt.error_kind})" if attempt.error_kind else "")
             + (f": {attempt.reason}" if attempt.reason else "")]
    if attempt.hint:
        lines.append(f"  hint: {attempt.hint.replace('<id>', job_id)}")
    if attempt.state != "done" and job.summary:
        lines.append("  last output:")
        lines += ["    " + line for line in job.summary.splitlines()[-LOG_TAIL_LINES:]]
    verify = attempt.verify
    if verify is not None and not verify.passed:
        lines.append(f"  verify failed: {verify.command} (exit {verify.exit_code})")
        lines += render.verify_tail(verify, prefix="    ")
    print("\n".join(lines), file=sys.stderr, flush=True)


def run_detached(job_id: str, repo_path, lock_fd: int) -> int:
    """The worker's life, in a forked child or a fresh interpreter (`main`)."""
    started_at = time.time()
    spawn.use_worker_main(run_detached)  # hand-offs to other repositories fork this worker again
    from subtask.proc import procs

    procs.become_subreaper()  # a job's orphans are ours to end where no pid namespace does it
    liveness.close_others(lock_fd)  # forked from a holder of other run-locks: they are not ours
    repo = own_repo(repo_path)
    jobenv.adopt(repo.state_dir, job_id)  # whoever spawned us: the job runs as its starter ran
    faults.point("worker_start")
    try:
        serve(repo, job_id, lock_fd, started_at)
    finally:
        spawn.reap_background()  # a pool refill of an attempt that ended in an error: never left behind
    return 0


def own_repo(handed) -> Repo:
    """The worker's repository handle, never one shared with a parent: rebuilt from what the
    starter found (its `Repo` in a forked child, its `handover()` through the zygote) when it was
    opened at the main worktree, else found anew from the root (a linked worktree's settings
    may be its own)."""
    if isinstance(handed, dict):
        return Repo.from_handover(handed)
    if isinstance(handed, Repo):
        if handed.handover() is not None:
            return handed.for_thread()
        handed = handed.root
    return open_repo(handed)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_detached(argv[0], argv[1], int(os.environ.pop("SUBTASK_LOCK_FD")))


if __name__ == "__main__":
    sys.exit(main())
