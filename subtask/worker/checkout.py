"""The first step of an attempt: the job's worktree checked out, and a new one set up.

The registration (`git worktree add --no-checkout`) is serialized by `worktree.lock`; git writes
the files after it (`FilesCheckout`) while the worker records `running`. A worktree that exists
(a reply, a retry, a dead worker's attempt) has its git metadata checked first. A new worktree
gets the `.worktreeinclude` files copied from the main worktree and `subtask.setup` run in it,
confined as the job is (`set_up_fresh`).

Invariants:
- Never write a worktree's files under `worktree.lock`, because that serialized every job's
  checkout (10 jobs started together checked out one after another); only the registration
  (`git worktree add --no-checkout`) needs it. Never run an engine in a registered worktree whose
  index git has not written, because its files are not all there and the autocommit would record
  them deleted: `checkout.FilesCheckout` writes them again (issue 14).
- A stop never cuts `git worktree add` half-way (`stop.stop_deferred`); only a worktree marked
  here (`worktrees.mark`) may ever be removed for the job.
- Never copy a `.worktreeinclude` file that git does not ignore, because the autocommit would commit it.
- Never run `subtask.setup` outside the job's sandbox, because the job may have rewritten the
  script it names. The worker's own git commands (autocommit, evidence, notes) run unconfined,
  but never on what a job could have chosen (`worktrees.job_git`).
- No git process is left running on any way out (`FilesCheckout.finish`,
  `MainWorktreeStatus.lines`).
- Never follow a symlink below a worktree when copying into it (`copy_into`), because the
  job's base decides what the worktree holds and a symlinked folder would carry the copy out.
- Never run git or build a sandbox for a worktree that already exists (a reply, a retry, an
  attempt after a dead worker) before its metadata is checked (`begin_checkout`), because
  the job wrote it: a change ends the attempt failed (kind `isolation`) with nothing run, and the
  files checkout and the sandbox take the checked admin folder (`containment::test_a_reply_*`).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from subtask.git import harness, harness_rule, packing, pool, worktrees
from subtask.git.gitrepo import Repo, ensure_excluded, git
from subtask.git.records import Job
from subtask.model import faults, phases
from subtask.model.job import work_base
from subtask.model.redact import redact
from subtask.ops.landing import overlay
from subtask.ops.running import lifecycle
from subtask.proc import isolation, procs
from subtask.state import paths
from subtask.state.statefiles import file_lock
from subtask.worker import refill
from subtask.worker.confinement import Confinement, MainWorktreeStatus
from subtask.worker.events import EventSink
from subtask.worker.progress import mark_running, setup_failed
from subtask.worker.stop import stop_deferred
from subtask.worker.verify import verify_command


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
        # What HEAD names: the branch's tip, which is the base only for a first attempt (a reply
        # in a new worktree starts from the job's own commits).
        tip = repo.objects.ref(f"refs/heads/{job.spec.branch}") if job.spec.branch else None
        at = tip.target if tip is not None and not tip.symbolic else job.spec.base
        with stop_deferred(), file_lock(repo.state_dir / paths.WORKTREE_LOCK):
            worktrees.drop_stale(repo, job.id, path)  # its folder deleted by hand: only its own registration
            pooled = pool.take(repo, job.id, path, head, at)  # the files that differ from `at`, below
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
        merged = isinstance(self.proc.args, list) and "-m" in self.proc.args
        if self.proc.returncode != 0 and merged:  # not the commit's files: HEAD's, whatever they are
            assert self.repo is not None and self.path is not None and self.admin is not None  # set with a proc
            self.proc = self._git(self.repo, self.path, self.admin, ["--reset", "-u", "HEAD"])
            _, err = self.proc.communicate()
        if self.proc.returncode != 0:
            return f"git read-tree failed: {err.decode(errors='replace').strip()}"
        if self.admin is not None:
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

    result = procs.run(["sh", "-c", command], cwd=worktree, env=env,
                       timeout=repo.config.number("setupTimeout"), tail_bytes=SETUP_TAIL_BYTES, redact=True)
    if result.exit_code == 0 and not result.timed_out:
        return None
    output = (result.stdout_tail + "\n" + result.stderr_tail).strip()
    ending = "timed out" if result.timed_out else f"exited {result.exit_code}"
    return redact(f"setup command ({command}) {ending}" + (f": {output[-SETUP_TAIL_BYTES:]}" if output else ""))


def set_up_worktree(repo: Repo, job: Job, sink: EventSink) -> tuple[Job, Path, Path, MainWorktreeStatus] | None:
    """Check the worktree out, recording `running` meanwhile; None when the attempt ended here
    (stopped in the spawn gap, the checkout failed, or the job had changed the git metadata of
    the worktree it runs in again: failed, kind `isolation`, nothing run). The main
    worktree's status is taken meanwhile too (once the job's own folder is registered and
    excluded: it then shows alike before and after the engine)."""
    job_id, attempt_n = job.id, job.state.current.n
    # pygit2 is imported once the engine runs (worker/engine.py): imported from here, beside the
    # checkout, it shared the GIL with every step to the engine's start (a pooled start's steps
    # took 45-60 ms instead of ~25 on 2 cores).
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
        setup_failed(repo, job_id, attempt_n, redact(f"could not check the worktree out: {' '.join(str(exc).split())}"),
                      hint=f"see what git has: git worktree list; then try again: git subtask reply {job_id} '...'")
        return None
    main_before = MainWorktreeStatus(repo)
    ready = None
    try:
        ready = _finish_checkout(repo, job, sink, worktree, files)
    finally:
        if not ready:
            main_before.lines()  # no git process is left behind
    if ready:  # beside the job from here on
        refill.start(repo, job)
    return (ready, worktree, admin, main_before) if ready else None


def _finish_checkout(repo: Repo, job: Job, sink: EventSink, worktree: Path, files: FilesCheckout) -> Job | None:
    job_id, attempt_n = job.id, job.state.current.n
    running = None
    try:  # recorded while git writes the files: off the job's critical path
        running = mark_running(repo, job)
        if running is not None:
            sink({"type": "state", "state": "running"})
        phases.mark("record_running")
    finally:
        unwritten = files.finish()
    if running is None:
        return None
    if unwritten:
        setup_failed(repo, job_id, attempt_n, redact(f"could not set up the worktree: {unwritten}"))
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
        if not failure and job.spec.verify and not harness_rule.judged_by_job(job.spec.harness):
            # what the worktree held beyond its tree before the job ran is not the job's
            overlay.keep_snapshot(repo, job.id, harness.snapshot(repo, work_base(job), worktree, job.spec.harness,
                                                                 verify_command(repo, job)))
    except Exception as exc:
        failure = redact(f"could not set up the worktree: {exc}")
    if failure:
        setup_failed(repo, job.id, job.state.current.n, failure)
        return False
    phases.mark("setup")
    return True
