"""A job's verify command run again here, on one exact commit: what `merge` does with a record it
cannot trust (another clone's, not signed by an allowed signer; or `merge --reverify`), and
`git subtask verify --run`.

The command is the one the record names (stored redacted: a command whose secret was redacted
fails here, and says so in its output). It runs with `sh -c` in a scratch worktree checked out
detached at the commit, `<worktreeDir>/.verify/<id>-<random>`, removed afterwards whatever
happened, and, where Landlock can enforce it, confined as a job's verify is (`worktree`: it may
write its scratch worktree, its admin folder, new objects and a private temp dir, nothing else;
in mount and pid namespaces where the machine has them, so nothing of it outlives the run).

Invariants:
- Never run a record's verify in the user's checkout or in the job's own worktree, because the
  record's command is a teammate's text: it gets a scratch checkout of exactly the commit that
  is about to be merged, and the merge then takes that very commit id.
- Never make its sandbox the process's active one (`isolation.confined`), because in a threaded
  caller (the MCP server, `wait`'s watchers) every other thread's children would get it: it is
  handed to `procs.run(sandbox=...)` for this one child. Unconfined only where the machine has no
  Landlock, and the result says so (`confined` False).
- Never pass a re-run on the command's exit alone: the checks the job recorded (`spec.checks`,
  subtask/checks.py) run on its work's base (`work_base`)..commit here too, because a record that claims a pass is what
  a job that deleted its failing test would also have.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from subtask.git import checks
from subtask.git.gitrepo import Repo, ensure_excluded, git
from subtask.model.errors import SubtaskError
from subtask.model.job import VerifyResult, work_base
from subtask.model.redact import redact
from subtask.proc import isolation, procs
from subtask.state import paths
from subtask.state.statefiles import file_lock

TAIL_BYTES = 4096  # as much output as a job's own verify keeps
SCRATCH = ".verify"


@dataclass
class Rerun:
    result: VerifyResult
    confined: bool

    def line(self, job_id: str) -> str:
        r = self.result
        how = "timed out" if r.timed_out else f"exit {r.exit_code}"
        how += "".join(f"; check {c} failed" for c in r.checks_failed or ())
        where = "" if self.confined else " (unconfined)"
        return f"{job_id}: re-ran verify here on {r.head[:7]}{where}: {r.command} -> {how} in {r.seconds:.1f}s"


def run(repo: Repo, job, head: str) -> Rerun:
    """Run `job.spec.verify` on `head` in a scratch worktree (see the module docstring)."""
    command = job.spec.verify
    if not command:
        raise SubtaskError("negative", f"{job.id} names no verify command to run", hint=f"git subtask show {job.id}")
    tree = _tree_of(repo, head)
    with scratch(repo, head, f"{SCRATCH}/{job.id}") as path:
        return run_in(repo, path, command, head, admin=scratch_admin(path), tree=tree, timeout=job.spec.verify_timeout,
                      network=job.spec.network, change=(work_base(job), head, job.spec.checks))


@contextmanager
def scratch(repo: Repo, commit: str, name: str) -> Iterator[Path]:
    """A worktree checked out detached at `commit`, `<worktreeDir>/<name>-<random>`, removed
    afterwards whatever happened (its temp dir beside it too)."""
    path = add_scratch(repo, commit, name)
    try:
        yield path
    finally:
        remove_scratch(repo, path)


def add_scratch(repo: Repo, commit: str, name: str) -> Path:
    """`<worktreeDir>/<name>-<random>`, a worktree checked out detached at `commit`."""
    path = repo.worktree_dir() / f"{name}-{secrets.token_hex(4)}"
    ensure_excluded(repo.common_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(repo.state_dir / paths.WORKTREE_LOCK):  # concurrent `worktree add` can fail (git 2.39)
        git(repo.root, "worktree", "add", "--quiet", "--detach", str(path), commit)
    return path


def scratch_admin(path: Path) -> Path:
    """The admin folder git made for the scratch worktree `add_scratch` just made; asked before
    anything ran there, because a command run there may rewrite its `.git` file."""
    return Path(git(path, "rev-parse", "--absolute-git-dir").stdout.strip())


def remove_scratch(repo: Repo, path: Path) -> None:
    git(repo.root, "worktree", "remove", "--force", str(path), check=False)
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(_tmpdir_of(path), ignore_errors=True)


def _tmpdir_of(path: Path) -> Path:
    return path.parent / f"{path.name}.tmp"


def run_in(repo: Repo, path: Path, command: str, head: str, *, admin: Path, tree: str, timeout: float,
           network: str, change: tuple[str, str, list[str] | None] | None = None) -> Rerun:
    """`sh -c command` in the scratch worktree `path` (holding `head`; `admin`: its admin folder,
    `scratch_admin`), confined where this process can confine (`isolation.outside_sandbox`), with
    a private temp dir beside it; `change`: the job's checks to run on its diff (base, head,
    checks), which fail it whatever it exited."""
    return start_in(repo, path, command, head, admin=admin, tree=tree, timeout=timeout, network=network,
                    change=change).wait()


class Pending:
    """A verify `start_in` started: `wait()` for its `Rerun`, `abort()` to end it; one of the two,
    always (its sandbox and temp dir go with it)."""

    def __init__(self, repo: Repo, command: str, head: str, tree: str, tmpdir: Path, sandbox, running: procs.Running,
                 change: tuple[str, str, list[str] | None] | None):
        self.repo, self.command, self.head, self.tree, self.tmpdir = repo, command, head, tree, tmpdir
        self.sandbox, self.running, self.change = sandbox, running, change

    def wait(self) -> Rerun:
        confined = self.sandbox is not None
        try:
            result = self.running.wait()
        finally:
            self._close()
        output = result.stdout_tail + ("\n" if result.stdout_tail and result.stderr_tail else "") + result.stderr_tail
        failed = checks.failed(checks.run(self.repo, *self.change)) if self.change else []
        return Rerun(VerifyResult(command=self.command, exit_code=result.exit_code, seconds=round(result.seconds, 3),
                                  head=self.head, tree=self.tree,
                                  passed=result.exit_code == 0 and not result.timed_out and not failed,
                                  timed_out=result.timed_out, output_tail=redact(output)[-TAIL_BYTES:],
                                  checks_failed=failed or None), confined)

    def abort(self) -> None:
        try:
            self.running.abort()
        finally:
            self._close()

    def _close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def start_in(repo: Repo, path: Path, command: str, head: str, *, admin: Path, tree: str, timeout: float,
             network: str, change: tuple[str, str, list[str] | None] | None = None) -> Pending:
    """`run_in`, returning once the command is started (`Pending`): the caller may do other work
    while it runs (its sandbox is the child's alone, whatever threads this process has)."""
    tmpdir = _tmpdir_of(path)
    sandbox = None
    try:
        tmpdir.mkdir(mode=0o700)
        env = dict(os.environ, TMPDIR=str(tmpdir), TMP=str(tmpdir), TEMP=str(tmpdir))
        sandbox = isolation.outside_sandbox(repo, path, admin, tmpdir, network)
        if sandbox is not None:
            env = sandbox.withhold(env) | {isolation.ACTIVE_ENV: "worktree"}
        running = procs.start(["sh", "-c", command], cwd=path, env=env, timeout=timeout,
                              tail_bytes=TAIL_BYTES, stdout_grace=2.0, redact=True, sandbox=sandbox)
    except BaseException:
        if sandbox is not None:
            sandbox.close()
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise
    return Pending(repo, command, head, tree, tmpdir, sandbox, running, change)


def _tree_of(repo: Repo, head: str) -> str:
    if repo.objects.commit_of(head) != head:
        raise SubtaskError("fatal", f"commit {head[:12]} is not in this repository", hint="git fetch it first")
    return str(repo.git[head].tree_id)
