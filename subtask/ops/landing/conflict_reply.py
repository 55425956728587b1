"""`land --reconcile`: a conflict answered by a reply to the job, on the tip it conflicted with.

The job's branch (and its worktree, when it has one) is moved onto that tip; then `land` starts
a reply, an ordinary attempt (recorded, charged against the job's budget), and builds the job
again once that reply passed its verify. The reply speaks the engine's language: a shell job's
task is a script, so the same task runs again on the new tip; an agent gets its earlier changes
applied on top, uncommitted, with the conflicts marked, and is asked in words to resolve them.

Invariants:
- Never move a job's branch or worktree but under its run-lock (the caller's), this clone's own
  job only, and never over uncommitted changes in its worktree, because they may be the only
  copy of someone's work; git runs there only through the paths git-subtask made
  (`worktrees.check_metadata`, `worktrees.job_git`).
- Never move a job's branch away from its head before that head is pinned as its attempt's
  (`refs/subtask/<id>/attempts/<n>`), because the reply's worker then moves the head pin, and a
  failed reply would leave the verified head to the reflog alone. It also stays in the record
  (its attempts, its landings); the job's work is counted from `state.rebased_onto` afterwards.
- Never move a job's branch in `land --reconcile` but by compare-and-swap from the head `land`
  read, nor reset a worktree whose HEAD does not name the job's branch, because `reset` moves
  whatever branch HEAD names, and a verify runs after the worker's last look at the metadata: a
  HEAD naming `release` had `reset --hard` move `release`, and a commit made on the branch
  meanwhile was reset away (`landqueue::test_reconcile_*`).
"""

from __future__ import annotations

from pathlib import Path

from subtask.git import records, worktrees
from subtask.git.gitrepo import Repo
from subtask.git.records import Job
from subtask.model.errors import SubtaskError


def prepare(repo: Repo, job: Job, head: str, onto: str, target: str, conflicts: list[str],
            theirs: list[str]) -> str:
    """Move the job onto `onto` and say what its reply is to do; a `SubtaskError` when it cannot
    be moved (changes in its worktree, a branch that moved). `theirs`: what the target changed
    in the conflicting files (`integrate.sides`)."""
    shell = job.spec.engine == "shell"
    # Its reply's worker moves the head pin: the head it is moved away from keeps its attempt's
    # pin, so more than the reflog keeps it when the reply fails. (A tip no attempt recorded, landed
    # with --force, names no attempt: never pinned as one.)
    kept = job.state.kept
    if head != job.spec.base and kept.head == head:
        records.pin_attempt(repo, job.id, kept.n, head)
    applied = _move_onto(repo, job, head, onto, apply_old=not shell)
    records.update(repo, job.id, lambda j: setattr(j.state, "rebased_onto", onto))
    return job.spec.task if shell else agent_message(target, head, onto, conflicts, theirs, applied)


def _move_onto(repo: Repo, job: Job, old: str, onto: str, *, apply_old: bool) -> bool:
    """Put the job's branch (and its worktree, when it has one) at `onto`; with `apply_old`, its
    earlier changes applied on top, uncommitted, conflicts marked. True when they were applied.

    The branch moves by compare-and-swap from `old`, the head `land` read; the worktree follows
    through its checked admin folder, whose HEAD must name the job's branch (a verify runs after
    the worker's last look at it, and a HEAD naming another branch would have `reset` move that)."""
    path = Path(job.spec.worktree)
    branch = f"refs/heads/{job.spec.branch}"
    if not (path.exists() and worktrees.created_here(repo, job.id, path)):
        if not records.cas_ref(repo, branch, old, onto, "git-subtask land: onto the new tip"):
            raise SubtaskError("negative", "its branch moved since it was checked")
        return False
    try:
        admin = worktrees.check_metadata(repo, job.id, path, job.spec.branch, job.spec.base)
    except worktrees.MetadataChanged as exc:
        raise SubtaskError("negative", f"its worktree's git metadata is not what git-subtask wrote ({exc})") from None
    if worktrees.job_git(repo, admin, path, "status", "--porcelain", check=False).stdout.strip():
        raise SubtaskError("dirty", f"its worktree {path} has uncommitted changes (never reconciled over)")
    if not records.cas_ref(repo, branch, old, onto, "git-subtask land: onto the new tip"):
        raise SubtaskError("negative", "its branch moved since it was checked")
    try:
        worktrees.job_git(repo, admin, path, "reset", "--quiet", "--hard", onto)  # HEAD names the branch, now at onto
    except SubtaskError:
        records.cas_ref(repo, branch, onto, old)  # the worktree still holds `old`
        raise
    if apply_old:
        worktrees.job_git(repo, admin, path, "merge", "--squash", "--quiet", old, check=False)
        return True
    return False


def agent_message(target: str, old: str, onto: str, conflicts: list[str], theirs: list[str], applied: bool) -> str:
    """The reply an agent gets: what moved, what was done to its worktree, what to do."""
    files = ", ".join(conflicts)
    said = "".join(f"\n  {line}" for line in theirs)
    how = (f"Your branch was moved onto {onto[:12]} and your earlier changes (commit {old[:12]}) were applied on "
           f"top, uncommitted, with conflict markers in: {files}." if applied else
           f"Your branch was moved onto {onto[:12]}. Apply your earlier changes on top with "
           f"`git merge --squash {old[:12]}`; it conflicts in: {files}.")
    return (f"{target} moved on while you worked (it is now at {onto[:12]}), and your change no longer merges "
            f"into it: both change {files}.\n{how}\n"
            + (f"What {target} changed there:{said}\n" if said else "")
            + f"Resolve every conflict so that both {target}'s changes and yours are kept, check that it "
              "works, and commit.")
