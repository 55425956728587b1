"""A job's verify command run again here, on one exact commit: what `merge` does with a record it
cannot trust (another clone's, not signed by an allowed signer; or `merge --reverify`), and
`git subtask verify --run`.

The command is the one the record names (stored redacted: a command whose secret was redacted
fails here, and says so in its output). It runs with `sh -c` in a scratch worktree checked out
detached at the commit, `<worktreeDir>/.verify/<id>-<random>`, removed afterwards whatever
happened, and, where Landlock can enforce it, confined as a job's verify is (`worktree`: it may
write its scratch worktree, its admin folder, new objects and a private temp dir, nothing else;
in mount and pid namespaces where the machine has them, so nothing of it outlives the run).

The verdict is judged as a job's own verify is (`overlay`, docs/verify.md "The judge"): the
harness comes from the branch it lands on (`target_of`: the commit where the job's head meets
it), never from the commit under test; a landing takes the target's tip (`land`).

Invariants:
- Never take a record's opt-out of the harness (`--harness job`) from a record this clone
  cannot trust (`asked_harness`), because a teammate's record saying "judged by its own tests"
  is what a job that gamed its tests would also push.
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
- Never start a confined verify while this process has another thread, because the sandbox is
  process-wide while a child is spawned (`isolation.outside_sandbox` refuses to build one): the
  queue's pipeline does its other work in the main thread while the verify runs (plain git, no
  pre-exec hook), and the MCP `land` tool runs `git-subtask land` as a child process.
- Never make a sandbox the process's active one outside the worker (`isolation.confined`),
  because in a threaded process (the MCP server, `wait`'s watchers) every thread's children would
  get it: a re-run verify or a judge hands its sandbox to `procs.run(sandbox=...)` for its one
  child, so it is confined in any process (`groups::test_a_judge_runs_in_the_members_sandbox`
  went unconfined when a threaded `wait` concluded the group).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from subtask.git import checks, harness_rule
from subtask.git.gitrepo import Repo, ensure_excluded, git, tree_of
from subtask.model.dataclass import dataclass
from subtask.model.errors import SubtaskError
from subtask.model.job import VerifyResult, work_base
from subtask.model.redact import redact
from subtask.ops.landing import overlay, verified
from subtask.proc import isolation, procs
from subtask.state import paths
from subtask.state.statefiles import file_lock
from subtask.words import judge_line

TAIL_BYTES = 4096  # as much output as a job's own verify keeps
SCRATCH = ".verify"


@dataclass
class Rerun:
    """A verify run again here on one commit, or answered by a known result (`run`)."""

    result: VerifyResult
    confined: bool

    def line(self, job_id: str) -> str:
        r = self.result
        if r.reused:
            return (f"{job_id}: verify {'passed' if r.passed else 'failed'} on this tree before, reused: {r.command} "
                    f"(at {str(r.reused.get('commit'))[:7]}, {r.reused.get('job')}, {r.reused.get('by')})")
        how = "timed out" if r.timed_out else f"exit {r.exit_code}"
        how += "".join(f"; check {c} failed" for c in r.checks_failed or ())
        where = "" if self.confined else " (unconfined)"
        judged = judge_line(r)
        return (f"{job_id}: re-ran verify here on {r.head[:7]}{where}: {r.command} -> {how} in {r.seconds:.1f}s"
                + (f" ({judged})" if judged else ""))


@dataclass(frozen=True)
class Trusted:
    """What judges a re-run: the harness the job asks for (`asked`, its spec's), from `commit`,
    which is the branch it lands on (`source` target, `ref` its name)."""

    asked: list[str] | None
    commit: str
    source: str = "target"
    ref: str | None = None


def run(repo: Repo, job, head: str, *, trusted_record: bool = False, reuse: bool = False) -> Rerun:
    """Run `job.spec.verify` on `head` in a scratch worktree (see the module docstring);
    `trusted_record`: the record is this clone's or an allowed signer's (its opt-out holds);
    `reuse`: a result already known for the same key answers instead (`verified`), its checks
    run all the same. What runs here is kept for later lookups."""
    command = job.spec.verify
    if not command:
        raise SubtaskError("negative", f"{job.id} names no verify command to run", hint=f"git subtask show {job.id}")
    tree = _tree_of(repo, head)
    commit, ref = target_of(repo, head)
    judged = Trusted(asked_harness(job, trusted_record), commit, "target", ref)
    confined = isolation.support().available
    key = verified.key_of(repo, tree=tree, command=command, trusted=commit, asked=judged.asked, confined=confined,
                          network=job.spec.network)
    known = verified.Known(repo)
    found = known.find(key) if reuse else None
    if found is not None:
        result = found.reused()
        failed = checks.failed(checks.run(repo, work_base(job), head, job.spec.checks))
        if failed:  # its checks are its own change's, never reused
            result.checks_failed, result.passed = failed, False
        return Rerun(result, confined)
    with scratch(repo, head, f"{SCRATCH}/{job.id}") as path:
        rerun = run_in(repo, path, command, head, admin=scratch_admin(path), tree=tree, timeout=job.spec.verify_timeout,
                       network=job.spec.network, change=(work_base(job), head, job.spec.checks), trusted=judged)
    rerun.result.key = key
    if not rerun.result.checks_failed:
        known.remember(rerun.result, job.id)
    return rerun


def asked_harness(job, trusted_record: bool) -> list[str] | None:
    """The harness a re-run takes from the record: as recorded, but an opt-out (`--harness job`)
    only from a record this clone can trust; any other is judged by the default."""
    asked = job.spec.harness
    return None if harness_rule.judged_by_job(asked) and not trusted_record else asked


def target_of(repo: Repo, head: str) -> tuple[str, str | None]:
    """The trusted commit of a re-run and the branch's name: where `head` meets the branch this
    worktree has checked out (the tip when `head` holds it; the job's own era of its tests, never
    a commit of its own), or HEAD itself when detached."""
    git_repo = repo.git
    tip = str(git_repo.head.target)
    ref = None if git_repo.head_is_detached else git_repo.head.shorthand
    try:
        meet = git_repo.merge_base(tip, head)
    except (KeyError, ValueError):
        meet = None
    return (str(meet) if meet is not None else tip), ref


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
    path = repo.worktree_dir() / f"{name}-{os.urandom(4).hex()}"
    ensure_excluded(repo.common_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(repo.state_dir / paths.WORKTREE_LOCK):  # concurrent `worktree add` can fail (git 2.39)
        git(repo.root, "worktree", "add", "--quiet", "--detach", str(path), commit)
    return path


def scratch_admin(path: Path) -> Path:
    """The admin folder git made for the scratch worktree `add_scratch` just made; read before
    anything ran there, because a command run there may rewrite its `.git` file (git writes the
    absolute path there: read without a process; asked of git otherwise)."""
    try:
        said = (path / ".git").read_text().strip()
    except OSError:
        said = ""
    admin = Path(said.removeprefix("gitdir: ")) if said.startswith("gitdir: ") else None
    if admin is not None and admin.is_absolute() and (admin / "HEAD").is_file():
        return admin
    return Path(git(path, "rev-parse", "--absolute-git-dir").stdout.strip())


def remove_scratch(repo: Repo, path: Path, admin: Path | None = None) -> None:
    """Remove a scratch worktree, its temp dir and its overlay's stash. Given its `admin` folder
    (as `scratch_admin` read it when it was made), without a git process: the admin folder first,
    then the files, as `git worktree remove` does; else by git."""
    if admin is not None and admin.parent == repo.common_dir / "worktrees" and not admin.is_symlink():
        shutil.rmtree(admin, ignore_errors=True)
    else:
        git(repo.root, "worktree", "remove", "--force", str(path), check=False)
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(_tmpdir_of(path), ignore_errors=True)
    shutil.rmtree(_stash_of(path), ignore_errors=True)


def _tmpdir_of(path: Path) -> Path:
    return path.parent / f"{path.name}.tmp"


def _stash_of(path: Path) -> Path:
    """Where the overlay of a scratch keeps what it moved: beside it, outside its sandbox."""
    return path.parent / f"{path.name}{SIDE_SUFFIX}"


SIDE_SUFFIX = ".harness"


def run_in(repo: Repo, path: Path, command: str, head: str, *, admin: Path, tree: str, timeout: float,
           network: str, change: tuple[str, str, list[str] | None] | None = None,
           trusted: Trusted | None = None) -> Rerun:
    """`sh -c command` in the scratch worktree `path` (holding `head`; `admin`: its admin folder,
    `scratch_admin`), confined where this process can confine (`isolation.outside_sandbox`), with
    a private temp dir beside it; `change`: the job's checks to run on its diff (base, head,
    checks), which fail it whatever it exited; `trusted`: what judges it (the harness laid over
    the scratch while it runs)."""
    return start_in(repo, path, command, head, admin=admin, tree=tree, timeout=timeout, network=network,
                    change=change, trusted=trusted).wait()


class Pending:
    """A verify `start_in` started: `wait()` for its `Rerun`, `abort()` to end it; one of the two,
    always (its sandbox and temp dir go with it)."""

    def __init__(self, repo: Repo, command: str, head: str, tree: str, tmpdir: Path, sandbox,
                 running: procs.Running | None, change: tuple[str, str, list[str] | None] | None,
                 judge: overlay.Judge | None = None, laid: contextlib.ExitStack | None = None):
        self.repo, self.command, self.head, self.tree, self.tmpdir = repo, command, head, tree, tmpdir
        self.sandbox, self.running, self.change = sandbox, running, change
        self.judge, self.laid = judge, laid

    def wait(self) -> Rerun:
        confined = self.sandbox is not None
        try:
            result = self.running.wait() if self.running is not None else None
        finally:
            self._close()
        judge = self.judge
        failed = checks.failed(checks.run(self.repo, *self.change)) if self.change else []
        if judge is not None and not judge.own and judge.shadows:
            failed.append(overlay.SHADOWING)
        if result is None:  # the harness could not be laid: nothing ran
            return Rerun(VerifyResult(command=self.command, exit_code=None, seconds=0.0, head=self.head, tree=self.tree,
                                      passed=False, output_tail=redact(f"not run: {judge.error if judge else '?'}"),
                                      checks_failed=failed or None, harness=judge.facts() if judge else None), confined)
        output = result.stdout_tail + ("\n" if result.stdout_tail and result.stderr_tail else "") + result.stderr_tail
        return Rerun(VerifyResult(command=self.command, exit_code=result.exit_code, seconds=round(result.seconds, 3),
                                  head=self.head, tree=self.tree,
                                  passed=result.exit_code == 0 and not result.timed_out and not failed,
                                  timed_out=result.timed_out, output_tail=redact(output)[-TAIL_BYTES:],
                                  checks_failed=failed or None, harness=judge.facts() if judge else None), confined)

    def abort(self) -> None:
        try:
            if self.running is not None:
                self.running.abort()
        finally:
            self._close()

    def _close(self) -> None:
        try:
            if self.laid is not None:
                self.laid.close()  # the scratch as it was checked out: the overlay undone
                self.laid = None
        finally:
            if self.sandbox is not None:
                self.sandbox.close()
                self.sandbox = None
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def start_in(repo: Repo, path: Path, command: str, head: str, *, admin: Path, tree: str, timeout: float,
             network: str, change: tuple[str, str, list[str] | None] | None = None,
             trusted: Trusted | None = None) -> Pending:
    """`run_in`, returning once the command is started (`Pending`): the caller may do other work
    while it runs (its sandbox is the child's alone, whatever threads this process has)."""
    tmpdir = _tmpdir_of(path)
    sandbox = None
    laid = contextlib.ExitStack()
    try:
        tmpdir.mkdir(mode=0o700)
        env = dict(os.environ, **isolation.temp_env(tmpdir))
        judge = None
        if trusted is not None:
            judge = overlay.prepare(repo, asked=trusted.asked, command=command, trusted=trusted.commit,
                                    source=trusted.source, worktree=path, head=head, ref=trusted.ref, env=env)
            if judge.error:
                return Pending(repo, command, head, tree, tmpdir, None, None, change, judge, laid)
            env.update(laid.enter_context(overlay.overlaid(repo, judge, path, _stash_of(path), tmpdir)))
        sandbox = isolation.outside_sandbox(repo, path, admin, tmpdir, network)
        if sandbox is not None:
            env = sandbox.withhold(env) | {isolation.ACTIVE_ENV: "worktree"}
        running = procs.start(["sh", "-c", command], cwd=path, env=env, timeout=timeout,
                              tail_bytes=TAIL_BYTES, stdout_grace=2.0, redact=True, sandbox=sandbox)
    except BaseException:
        try:
            laid.close()
        finally:
            if sandbox is not None:
                sandbox.close()
            shutil.rmtree(tmpdir, ignore_errors=True)
        raise
    return Pending(repo, command, head, tree, tmpdir, sandbox, running, change, judge, laid)


def _tree_of(repo: Repo, head: str) -> str:
    if repo.objects.commit_of(head) != head:
        raise SubtaskError("fatal", f"commit {head[:12]} is not in this repository", hint="git fetch it first")
    return tree_of(repo, head)
