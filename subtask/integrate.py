"""One landing built off to the side: a job integrated onto a target's tip in a scratch worktree.

`land` (subtask/landqueue.py) builds each landing here before anything moves: a worktree checked
out detached at the tip (`reverify.scratch`, `<worktreeDir>/.land/<id>-<random>`), the job's
head merged (`merge`, `no-ff`), squashed (`squash`) or replayed (`rebase`) onto it by git
itself, so the result is what `git merge` would make; then the verify runs there, on that very
commit (`reverify.run_in`: confined as a job's verify is).

Invariants:
- Never integrate in the user's checkout, because a conflict or a failed verify must leave it
  untouched: only the ref moves later, by compare-and-swap, once the integrated commit passed.
- Never run our git in a scratch worktree after a command of the job's ran there, because that
  command may have rewritten its git metadata: integration happens before verify, and the
  worktree is removed after it, never reused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from subtask import landing
from subtask.gitrepo import Repo, git
from subtask.records import Job

MODES = ("merge", "no-ff", "squash", "rebase")
SIDE_COMMITS = 3  # commits named per side of a conflict


@dataclass
class Built:
    kind: str  # built | already (the tip has the job's work) | conflict | failed
    onto: str
    commit: str | None = None  # the integrated commit (the tip itself for "already")
    conflicts: list[str] = field(default_factory=list)
    why: str = ""
    how: str = ""  # what git did: fast-forward, merge, no-ff, squash, rebase


def integrate(repo: Repo, path: Path, job: Job, head: str, onto: str, mode: str) -> Built:
    """Integrate `head` (the job's) in the scratch worktree `path`, detached at `onto`."""
    env = dict(os.environ, GIT_EDITOR=":")
    if mode == "rebase":
        proc = git(path, "rebase", "--quiet", "--onto", onto, job.spec.base, head, check=False, env=env)
    else:
        args = {"merge": ["--ff"], "no-ff": ["--no-ff"], "squash": ["--squash"]}[mode]
        proc = git(path, "merge", "--quiet", "--no-edit", *args, "-m", landing.merge_message(repo, job, head, mode),
                   head, check=False, env=env)
    if proc.returncode != 0:
        return _not_built(path, onto, proc)
    if mode == "squash":
        if git(path, "diff", "--cached", "--quiet", check=False).returncode == 0:
            return Built("already", onto, onto, how="squash")
        proc = git(path, "commit", "--quiet", "--no-verify", "-F", "-",
                   input=landing.merge_message(repo, job, head, mode), check=False, env=env)
        if proc.returncode != 0:
            return _not_built(path, onto, proc)
    commit = git(path, "rev-parse", "HEAD").stdout.strip()
    if commit == onto:
        return Built("already", onto, onto, how=mode)
    how = "fast-forward" if mode == "merge" and commit == head else mode
    return Built("built", onto, commit, how=how)


def _not_built(path: Path, onto: str, proc) -> Built:
    conflicts = [f for f in git(path, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split("\n") if f]
    if conflicts:
        return Built("conflict", onto, conflicts=conflicts)
    words = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    why = " ".join(words[-3:]) if words else f"git exited {proc.returncode}"
    if landing.IDENTITY_RE.search(why):
        why += " (set your identity: git config user.name ...; git config user.email ...)"
    return Built("failed", onto, why=why)


def sides(repo: Repo, job: Job, head: str, onto: str, files: list[str]) -> dict[str, list[str]]:
    """Both sides of a conflict in `files`: the target's commits since the job's base that touched
    them, and the job's own (its summary first), a few lines each."""
    from subtask.render import safe_line, task_title

    def commits(rev_range: str) -> list[str]:
        out = git(repo.root, "log", f"-{SIDE_COMMITS}", "--no-merges", "--format=%h %s", rev_range, "--", *files,
                  check=False).stdout
        return [safe_line(line) for line in out.splitlines() if line.strip()]

    summary = (job.summary or "").strip()
    said = task_title(summary, 80) if summary else task_title(job.spec.task, 80)
    return {"target": commits(f"{job.spec.base}..{onto}"), "job": [safe_line(said), *commits(f"{job.spec.base}..{head}")]}
