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
  subtask/checks.py) run on base..commit here too, because a record that claims a pass is what
  a job that deleted its failing test would also have.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass

from subtask import checks, isolation, procs
from subtask.errors import SubtaskError
from subtask.gitrepo import Repo, ensure_excluded, git
from subtask.model import VerifyResult
from subtask.redact import redact
from subtask.statefiles import file_lock

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
    path = repo.worktree_dir() / SCRATCH / f"{job.id}-{secrets.token_hex(4)}"
    ensure_excluded(repo.common_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(repo.state_dir / "worktree.lock"):  # concurrent `worktree add` can fail (git 2.39)
        git(repo.root, "worktree", "add", "--quiet", "--detach", str(path), head)
    tmpdir = path.parent / f"{path.name}.tmp"
    sandbox = None
    try:
        tmpdir.mkdir(mode=0o700)
        env = dict(os.environ, TMPDIR=str(tmpdir), TMP=str(tmpdir), TEMP=str(tmpdir))
        sandbox = isolation.outside_sandbox(repo, path, tmpdir, job.spec.network)
        confined = sandbox is not None
        if confined:
            env[isolation.ACTIVE_ENV] = "worktree"
        result = procs.run(["sh", "-c", command], cwd=path, env=env, timeout=job.spec.verify_timeout,
                           tail_bytes=TAIL_BYTES, stdout_grace=2.0, redact=True, sandbox=sandbox)
    finally:
        if sandbox is not None:
            sandbox.close()
        git(repo.root, "worktree", "remove", "--force", str(path), check=False)
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(tmpdir, ignore_errors=True)
    output = result.stdout_tail + ("\n" if result.stdout_tail and result.stderr_tail else "") + result.stderr_tail
    failed = checks.failed(checks.run(repo, job.spec.base, head, job.spec.checks))
    return Rerun(VerifyResult(command=command, exit_code=result.exit_code, seconds=round(result.seconds, 3), head=head,
                              tree=tree, passed=result.exit_code == 0 and not result.timed_out and not failed,
                              timed_out=result.timed_out, output_tail=redact(output)[-TAIL_BYTES:],
                              checks_failed=failed or None), confined)


def _tree_of(repo: Repo, head: str) -> str:
    if repo.objects.commit_of(head) != head:
        raise SubtaskError("fatal", f"commit {head[:12]} is not in this repository", hint="git fetch it first")
    return str(repo.git[head].tree_id)
