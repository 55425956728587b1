"""What the worker observes in git once the engine is done: the work the engine left
uncommitted, committed with a `Subtask-Id` trailer (`commit_work`); the job's head; and the
attempt's evidence (`gather_evidence`): its diff against `work_base`, the commands it ran, its
verify, how it was confined, and what its summary claims that the evidence contradicts.

Invariants:
- Never read the record from the worker's engine output, because what the engine says and what
  git shows are kept apart: evidence is computed from git.
- The worker's git runs through the admin folder `checked_metadata` vouched for, never by
  discovery from the worktree's `.git` (the job may write it); the head is read from the
  branch, never the worktree's HEAD.
- Never ask libgit2 whether a job left anything uncommitted, because its import (~50 ms of CPU)
  costs more than git's status of a pooled worktree, whose files are older than its index (~4 ms
  for 2,000; ~14 ms when the pool filled it in the same second: git 2.39 compares seconds and
  re-reads those files), and git decides what the autocommit takes (filters, submodules, ignore
  rules) (`tests/test_autocommit.py`, `tests/test_worker_git.py`).
- Evidence is bounded (`MAX_EVIDENCE_FILES`), and all the engine named in it is redacted.
- Never read a job's head from its worktree (`HEAD`, pygit2 opened on the worktree), only from its
  branch ref in the repository (`evidence.branch_tip`), because the worktree's `HEAD` is the job's to write.
"""

from __future__ import annotations

import os
from pathlib import Path

from subtask.engines.base import Outcome
from subtask.git import checks, worktrees
from subtask.git.gitrepo import Repo, author_identity, diff_stats
from subtask.git.leftout import porcelain_paths
from subtask.git.records import Job
from subtask.model import claims, phases
from subtask.model.dataclass import dataclass
from subtask.model.job import Evidence, VerifyResult, work_base
from subtask.model.redact import redact, redact_obj
from subtask.worker import retries
from subtask.worker.confinement import Confinement
from subtask.worker.verify import Verdict


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
    if admin is None:
        return None
    keep_out = engine_excludes(repo, job.spec.engine)
    status = worktrees.job_git(repo, admin, worktree, "status", "--porcelain", "-z", "--untracked-files=all",
                               "--ignore-submodules=all", *keep_out).stdout
    files = porcelain_paths(status)  # a name may hold a newline: -z, never a quoted line
    if not files:
        return None
    worktrees.job_git(repo, admin, worktree, "add", "-A", "--ignore-errors", *keep_out)
    name, email = author_identity(repo)
    message = (f"subtask {job.id}: work left uncommitted by the {job.spec.engine} engine\n\n"
               f"Subtask-Id: {job.id}\n")
    env = dict(os.environ, GIT_AUTHOR_NAME=name, GIT_AUTHOR_EMAIL=email, GIT_COMMITTER_NAME=name,
               GIT_COMMITTER_EMAIL=email)
    worktrees.job_git(repo, admin, worktree, "commit", "--quiet", "--no-verify", "-F", "-", input=message, env=env)
    return {"sha": branch_tip(repo, job), "files": files[:200]}


def engine_excludes(repo: Repo, engine: str) -> list[str]:
    """The pathspec that keeps an engine's own files (`git config --add subtask.engine.<name>.exclude
    PATTERN`: aider's chat history and tags cache) out of what the worker commits; [] for none."""
    patterns = [p.strip() for p in repo.config.get_all(f"engine.{engine}.exclude") if p.strip()]
    return ["--", ".", *(f":(exclude){p}" for p in patterns)] if patterns else []


def branch_tip(repo: Repo, job: Job) -> str:
    """Where the job's branch points, read from the repository itself (its loose ref, or pygit2
    once the worker loaded it: no subprocess), never through the worktree's HEAD, which the job
    may write. KeyError when the branch is gone."""
    ref = repo.objects.ref(f"refs/heads/{job.spec.branch}")
    if ref is None:
        raise KeyError(job.spec.branch)
    return ref.target


def current_head(repo: Repo, job: Job) -> str:
    """The job's head: its branch's tip (its base for a read-only job, or when the job deleted its
    branch, which the metadata check then reported)."""
    if job.spec.readonly:
        return job.spec.base
    try:
        return branch_tip(repo, job)
    except KeyError:
        return job.spec.base


@dataclass
class Work:
    """The job's work in git after the engine."""

    outcome: Outcome  # the engine's, or an isolation failure when the job changed its git metadata
    admin: Path | None  # the admin folder `checked_metadata` vouched for (None: not to be used)
    auto: dict | None  # what the autocommit took
    head: str


def commit_work(repo: Repo, job: Job, worktree: Path, outcome: Outcome) -> Work:
    """Commit what the engine left uncommitted and read the job's head."""
    admin = None
    try:
        admin = checked_metadata(repo, job, worktree)
        auto = autocommit(repo, job, worktree, admin)
    except worktrees.MetadataChanged as exc:
        outcome, auto = metadata_changed(exc), None
    head = current_head(repo, job)
    phases.mark("autocommit")
    return Work(outcome, admin, auto, head)


MAX_EVIDENCE_FILES = 1000


def build_evidence(repo: Repo, job: Job, head: str, outcome: Outcome, auto: dict | None,
                   verify: VerifyResult | None, state: str) -> Evidence:
    base = work_base(job)
    commits, files, totals = diff_stats(repo, base, head)
    # Bounded, so a job that writes 100,000 files leaves a record every later `list` can read.
    omitted, files, commits = (max(len(files) - MAX_EVIDENCE_FILES, 0), files[:MAX_EVIDENCE_FILES],
                               commits[:MAX_EVIDENCE_FILES])
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


def claims_of(evidence: Evidence, verify: VerifyResult | None, found: list[dict] | None,
              watch: claims.Watch) -> list[dict] | None:
    """What the engine's summary claims and the evidence contradicts (shown, never decided on)."""
    paths = [f["path"] for f in evidence.files] + [f["old_path"] for f in evidence.files if f.get("old_path")]
    said = claims.contradictions(evidence.summary, verify=verify, checks_failed=checks.failed(found), files=paths,
                                 files_complete=not evidence.files_omitted, watch=watch.to_dict())
    return said or None


def evidence_at_best(repo: Repo, job: Job, plan: retries.Plan, outcome: Outcome, state: str,
                     last: Evidence) -> Evidence:
    """The evidence of the head the loop left the branch at: its diff and its verify; what the
    engine said and how it was confined stay the last attempt's."""
    evidence = build_evidence(repo, job, plan.head, outcome, None, plan.best_verify, state)
    evidence.attempt = plan.best["attempt"] if plan.best else evidence.attempt
    evidence.isolation, evidence.main_worktree, evidence.claims = last.isolation, last.main_worktree, last.claims
    return evidence


def gather_evidence(repo: Repo, job: Job, work: Work, verdict: Verdict, confinement: Confinement,
                    watch: claims.Watch) -> Evidence:
    """The attempt's evidence: its work, its verdict, how it was confined, its summary's claims."""
    head, auto = work.head, work.auto
    outcome, state, verify, found = verdict.outcome, verdict.state, verdict.verify, verdict.found
    evidence = build_evidence(repo, job, head, outcome, auto, verify, state)
    evidence.isolation, evidence.main_worktree = confinement.evidence(verify)
    evidence.claims = claims_of(evidence, verify, found, watch)
    return evidence
