"""One landing built off to the side: a job integrated onto a target's tip in a scratch worktree.

`land` (subtask/ops/landing/land.py) builds each landing here before anything moves: a worktree checked
out detached at the tip (`Scratch`, `<worktreeDir>/.land/queue-<random>`), the job's head merged
(`merge`, `no-ff`), squashed (`squash`) or replayed (`rebase`) onto it by git itself, so the
result is what `git merge` would make; then the verify runs there, on that very commit
(`verify_rerun.run_in`: confined as a job's verify is).

Invariants:
- Never let a landing move the target before the verify on its integrated commit passed, and never
  integrate in the user's checkout, because a failing or conflicting job must leave both as they
  were; a kill at any step leaves the target before or after a whole landing and the checkout clean
  (`landqueue::test_killing_land_at_any_step_*`).
- Never find the scratch's repository through its `.git` file or trust its admin folder's
  `HEAD`, because a verify (a job's command, or the job's code it runs) may rewrite them: our
  git runs with `GIT_DIR`, `GIT_WORK_TREE` and `GIT_COMMON_DIR` named (as `worktrees.job_git`
  does), and moves HEAD itself, detached, before each landing.
- Never reuse the scratch after a build or verify that did not pass, nor after a verify command
  this clone does not trust (a teammate's unsigned record names it), because what that command
  left (a tracked file rewritten and marked skip-worktree, which `checkout --force` leaves alone)
  would be in the next job's checkout, which does not carry the code that did it: the scratch is
  spoiled, and the next build gets a fresh checkout. Nor after a command that changed what git
  follows from it (`.git`, `commondir`, `gitdir`) or left a config.worktree git did not write
  (`Scratch.tampered`), because our `checkout --force` would run the filters such a file names,
  unconfined. Otherwise it is reused (moved to the next
  tip, untracked files removed): checking out every file again per job cost the queue more than
  the merges and verifies themselves, and the landed job's code is in every later tree anyway.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from subtask.git import worktrees
from subtask.git.gitrepo import Repo, git, tree_of
from subtask.git.records import Job
from subtask.model import lazyre
from subtask.model.dataclass import dataclass, field
from subtask.model.job import work_base
from subtask.ops.landing import merge, verify_rerun
from subtask.words import safe_line, task_title

MODES = ("merge", "no-ff", "squash", "rebase")
SCRATCH = ".land"
SIDE_COMMITS = 3  # commits named per side of a conflict


@dataclass
class Built:
    """One landing as `integrate` built it in the scratch worktree, or why it was not built."""

    kind: str  # built | already (the tip has the job's work) | conflict | failed
    onto: str
    commit: str | None = None  # the integrated commit (the tip itself for "already")
    conflicts: list[str] = field(default_factory=list)
    why: str = ""
    how: str = ""  # what git did: fast-forward, merge, no-ff, squash, rebase


class Scratch:
    """A scratch worktree of the queue: made fresh at first and once spoiled, else reused."""

    def __init__(self, repo: Repo):
        self.repo = repo
        self.path: Path | None = None
        self.admin: Path | None = None
        self.spoiled = False

    def at(self, commit: str) -> Path:
        """The scratch worktree, detached at `commit`, with nothing but its files."""
        if self.path is not None and not self.spoiled and not self.tampered():
            if self.git("checkout", "--quiet", "--force", "--detach", commit).returncode == 0 and \
                    self.git("clean", "-ffdxq").returncode == 0:
                return self.path
        self.close()

        self.path = verify_rerun.add_scratch(self.repo, commit, f"{SCRATCH}/queue")
        self.admin = verify_rerun.scratch_admin(self.path)  # before anything ran there
        return self.path

    def tampered(self) -> bool:
        """Did a command run here change what git follows from the scratch (its `.git`, its admin
        folder's `commondir`, `gitdir`), or leave a config.worktree git did not write (git may read
        it, and the filters it names would run here unconfined)?"""
        assert self.path is not None and self.admin is not None
        if not worktrees.config_worktree_ours(self.repo, self.admin):
            return True
        try:
            worktrees.check_admin(self.repo, self.admin, self.path, head=None)  # HEAD: `at` moves it itself
        except worktrees.MetadataChanged:
            return True
        return False

    def spoil(self) -> None:
        """A command ran here and has not passed, or a build stopped half-way: never reused."""
        self.spoiled = True

    def passed(self) -> None:
        self.spoiled = False

    def head(self) -> str:
        """HEAD, detached, as our own git just left it (read from the file: no process)."""
        assert self.admin is not None
        return (self.admin / "HEAD").read_text().strip()

    def git(self, *args: str, input: str | None = None, check: bool = False):
        assert self.path is not None and self.admin is not None
        env = dict(os.environ, GIT_EDITOR=":")
        return worktrees.job_git(self.repo, self.admin, self.path, *args, input=input, env=env, check=check)

    def close(self) -> None:
        if self.path is not None:
            verify_rerun.remove_scratch(self.repo, self.path, self.admin)
        self.path = self.admin = None
        self.spoiled = False


def build(repo: Repo, job: Job, head: str, onto: str, mode: str, scratch: Callable[[], Scratch]) -> Built:
    """`head` (the job's) integrated onto `onto`: for `merge`, `no-ff` and `squash` by git's own
    merge machinery without a worktree (`merge-tree --write-tree`, then `commit-tree`: the tree
    and parents `git merge` makes, ~2 git runs instead of a checkout); `rebase` replays the
    commits in a scratch worktree (`scratch()` gives one), as `integrate` does."""
    if mode == "rebase":
        work = scratch()
        work.at(onto)
        return integrate(repo, work, job, head, onto, mode)
    if head == onto or repo.git.descendant_of(onto, head):
        return Built("already", onto, onto, how=mode)  # git merge: "Already up to date"
    if mode == "merge" and repo.git.descendant_of(head, onto):
        return Built("built", onto, head, how="fast-forward")
    proc = git(repo.root, "merge-tree", "--write-tree", "--name-only", "--no-messages", "-z", onto, head,
               check=False)
    fields = proc.stdout.split("\0")
    if proc.returncode == 1:
        return Built("conflict", onto, conflicts=list(dict.fromkeys(name for name in fields[1:] if name)))
    if proc.returncode != 0 or not fields[0]:
        return _failed(onto, proc)
    tree = fields[0]
    if mode == "squash" and tree == tree_of(repo, onto):
        return Built("already", onto, onto, how="squash")
    parents = [onto] if mode == "squash" else [onto, head]
    message = merge.merge_message(repo, job, head, mode)
    who = _identity(repo)
    if who is not None:  # as `commit-tree` would write it, without a process per landing
        import pygit2

        now = int(time.time())
        author, committer = (pygit2.Signature(name, email, now, offset) for name, email, offset in who)
        commit = repo.git.create_commit(None, author, committer, message, pygit2.Oid(hex=tree),
                                        [pygit2.Oid(hex=p) for p in parents])
        return Built("built", onto, str(commit), how=mode)
    proc = git(repo.root, "commit-tree", *(["-S"] if _signs(repo) else []), tree,
               *(a for p in parents for a in ("-p", p)), input=message, check=False)
    if proc.returncode != 0:
        return _failed(onto, proc)
    return Built("built", onto, proc.stdout.strip(), how=mode)


_SIGNS: dict[str, bool] = {}
_IDENTITIES: dict[str, tuple | None] = {}
_IDENT_RE = lazyre.compile(r"^(.*) <([^<>]*)> \d+ ([+-])(\d\d)(\d\d)$")


def _signs(repo: Repo) -> bool:
    """Does git sign the commits a person's `git merge` makes (`commit.gpgSign`)? The one setting
    `commit-tree`, plumbing, does not read itself."""
    key = str(repo.common_dir)
    if key not in _SIGNS:
        proc = git(repo.root, "config", "--type=bool", "--get", "commit.gpgSign", check=False)
        _SIGNS[key] = proc.stdout.strip() == "true"
    return _SIGNS[key]


def _identity(repo: Repo) -> tuple | None:
    """((name, email, minutes east of UTC) of the author, of the committer) as git names them
    here (`git var`: config, environment, its rules), asked once; None where a commit must come
    from git itself: it signs, its dates are set, or git knows no identity (its own words say why)."""
    key = str(repo.common_dir)
    if key not in _IDENTITIES:
        found = None
        if not _signs(repo) and not any(os.environ.get(v) for v in ("GIT_AUTHOR_DATE", "GIT_COMMITTER_DATE")):
            idents = [git(repo.root, "var", var, check=False).stdout.strip()
                      for var in ("GIT_AUTHOR_IDENT", "GIT_COMMITTER_IDENT")]
            matched = [m for m in map(_IDENT_RE.match, idents) if m is not None]
            if len(matched) == len(idents):
                found = tuple((m[1], m[2], (1 if m[3] == "+" else -1) * (int(m[4]) * 60 + int(m[5])))
                              for m in matched)
        _IDENTITIES[key] = found
    return _IDENTITIES[key]


def integrate(repo: Repo, scratch: Scratch, job: Job, head: str, onto: str, mode: str) -> Built:
    """Integrate `head` (the job's) in the scratch worktree, detached at `onto`; a build that did
    not end with a commit spoils the scratch (git left its state half-way)."""
    built = _integrate(repo, scratch, job, head, onto, mode)
    if built.kind in ("conflict", "failed"):
        scratch.spoil()
    return built


def _integrate(repo: Repo, scratch: Scratch, job: Job, head: str, onto: str, mode: str) -> Built:
    run = scratch.git
    if mode == "rebase":
        proc = run("rebase", "--quiet", "--onto", onto, work_base(job), head)
    else:
        args = {"merge": ["--ff"], "no-ff": ["--no-ff"], "squash": ["--squash"]}[mode]
        proc = run("merge", "--quiet", "--no-edit", *args, "-m", merge.merge_message(repo, job, head, mode), head)
    if proc.returncode != 0:
        return _not_built(run, onto, proc)
    if mode == "squash":
        if run("diff", "--cached", "--quiet").returncode == 0:
            return Built("already", onto, onto, how="squash")
        proc = run("commit", "--quiet", "--no-verify", "-F", "-", input=merge.merge_message(repo, job, head, mode))
        if proc.returncode != 0:
            return _not_built(run, onto, proc)
    commit = scratch.head()
    if commit == onto:
        return Built("already", onto, onto, how=mode)
    how = "fast-forward" if mode == "merge" and commit == head else mode
    return Built("built", onto, commit, how=how)


def _not_built(run, onto: str, proc) -> Built:
    conflicts = [f for f in run("diff", "--name-only", "--diff-filter=U").stdout.split("\n") if f]
    if conflicts:
        return Built("conflict", onto, conflicts=conflicts)
    return _failed(onto, proc)


def _failed(onto: str, proc) -> Built:
    words = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    why = " ".join(words[-3:]) if words else f"git exited {proc.returncode}"
    if merge.IDENTITY_RE.search(why):
        why += " (set your identity: git config user.name ...; git config user.email ...)"
    return Built("failed", onto, why=why)


def sides(repo: Repo, job: Job, head: str, onto: str, files: list[str]) -> dict[str, list[str]]:
    """Both sides of a conflict in `files`: the target's commits since the job's base that touched
    them, and the job's own (its summary first), a few lines each."""
    def commits(rev_range: str) -> list[str]:
        out = git(repo.root, "log", f"-{SIDE_COMMITS}", "--no-merges", "--format=%h %s", rev_range, "--", *files,
                  check=False).stdout
        return [safe_line(line) for line in out.splitlines() if line.strip()]

    summary = (job.summary or "").strip()
    said = task_title(summary, 80) if summary else task_title(job.spec.task, 80)
    base = work_base(job)
    return {"target": commits(f"{base}..{onto}"), "job": [safe_line(said), *commits(f"{base}..{head}")]}
