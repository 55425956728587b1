"""Reviewing and landing a job's work: its diff and log (bounded), `verify` of its record,
`merge` and `land`, and the flags that choose their mode.

Invariants:
- Never put a whole diff or log in a reply unbounded (`max_bytes`, `OUTPUT_LIMIT` by default, at
  most `MAX_OUTPUT_LIMIT`), because an agent's context is the budget: it is cut at a line boundary
  within its byte limit, and what is left out is counted and said.
- Review works after landing: a job's head is its branch tip while it exists, else its head pin.
"""

from __future__ import annotations

import subprocess

from subtask.api.read import _positive, get, sweep
from subtask.api.replying import reply
from subtask.git.gitrepo import Repo
from subtask.git.records import Job
from subtask.model.dataclass import dataclass
from subtask.model.errors import SubtaskError


def diff_argv(repo: Repo, id_or_prefix: str, stat: bool = False, paths: list[str] | None = None) -> list[str]:
    job = get(repo, id_or_prefix)
    head = _head_of(repo, job)
    return ["git", "-C", str(repo.root), "diff", *(["--stat"] if stat else []), job.spec.base, head,
            *(["--", *_paths(paths)] if paths else [])]


def log_argv(repo: Repo, id_or_prefix: str) -> list[str]:
    job = get(repo, id_or_prefix)
    head = _head_of(repo, job)
    return ["git", "-C", str(repo.root), "log", "--notes=subtask", f"{job.spec.base}..{head}"]


OUTPUT_LIMIT = 50_000  # bytes of a diff or log a reply carries by default (an agent's context is the budget)
MAX_OUTPUT_LIMIT = 10_000_000


@dataclass
class GitOutput:
    """What git printed for a review command, cut at `limit` bytes on a line boundary."""

    id: str
    base: str
    head: str
    text: str
    truncated: bool
    size: int  # bytes git printed in all

    def to_dict(self) -> dict:
        return {"v": 1, "id": self.id, "base": self.base, "head": self.head, "text": self.text,
                "truncated": self.truncated, "bytes": self.size}


def diff(repo: Repo, id_or_prefix: str, stat: bool = False, paths: list[str] | None = None,
         limit: int | None = None) -> GitOutput:
    """`git diff base head` of a job (its stat, or its patch), bounded; works after landing."""
    job = get(repo, id_or_prefix)
    head = _head_of(repo, job)
    argv = ["diff", "--no-color", "--no-ext-diff", *(["--stat"] if stat else []), job.spec.base, head,
            *(["--", *_paths(paths)] if paths else [])]
    return _bounded(repo, job, head, argv, limit)


def log(repo: Repo, id_or_prefix: str, limit: int | None = None) -> GitOutput:
    """`git log --notes=subtask base..head` of a job, bounded."""
    job = get(repo, id_or_prefix)
    head = _head_of(repo, job)
    return _bounded(repo, job, head, ["log", "--no-color", "--notes=subtask", f"{job.spec.base}..{head}"], limit)


def _paths(paths) -> list[str]:
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise SubtaskError("usage", f"paths must be a list of paths, not {paths!r}")
    return paths


def _bounded(repo: Repo, job: Job, head: str, argv: list[str], limit: int | None) -> GitOutput:
    limit = OUTPUT_LIMIT if limit is None else int(_positive(limit, "max_bytes", integer=True))
    limit = min(limit, MAX_OUTPUT_LIMIT)
    text, truncated, size = git_output(repo, argv, limit)
    return GitOutput(job.id, job.spec.base, head, text, truncated, size)


def git_output(repo: Repo, argv: list[str], limit: int) -> tuple[str, bool, int]:
    """(text, truncated, bytes printed) of `git argv`: the first `limit` bytes, cut at a line end;
    the rest is read and counted, not kept."""
    import tempfile

    with tempfile.TemporaryFile() as errors, subprocess.Popen(
            ["git", "-C", str(repo.root), "-c", "core.quotePath=false", *argv],
            stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None  # stdout=PIPE
        kept = proc.stdout.read(limit + 1)
        size = len(kept)
        while chunk := proc.stdout.read(1 << 20):
            size += len(chunk)
        proc.wait()
        errors.seek(0)
        error = errors.read().decode("utf-8", "replace").strip()
    if proc.returncode != 0:
        raise SubtaskError("fatal", f"git {argv[0]} failed: {error or f'exit {proc.returncode}'}")
    truncated = size > limit
    if truncated:
        kept = kept[:limit]
        kept = kept[: kept.rfind(b"\n") + 1] or kept
    return kept.decode("utf-8", "replace"), truncated, size


def _head_of(repo: Repo, job: Job) -> str:
    """The job's head: its branch tip while it exists, else the head pin (so review works after landing)."""
    from subtask.ops.landing.landed import job_head

    return job_head(repo, job)


def verify(repo: Repo, id_or_prefix: str, run: bool = False, reuse: bool | None = None):
    """`git subtask verify`: the job's record checked against git (signature, pins, evidence, the
    verify result; with `run`, its verify command on the exact commit, unless a result for the
    same tree, command, harness and environment is known and `reuse` is not False). Returns a
    `record_check.Recheck`."""
    from subtask.ops.landing import record_check

    return record_check.recheck(repo, get(repo, id_or_prefix), run=run, reuse=reuse)


def merge_mode(*, squash: bool = False, no_ff: bool = False, ff_only: bool = False) -> str:
    """The one merge mode the flags ask for; two of them at once is a usage error, as in git."""
    asked = [flag for flag, on in (("--squash", squash), ("--no-ff", no_ff), ("--ff-only", ff_only)) if on]
    if len(asked) > 1:
        raise SubtaskError("usage", f"{' and '.join(asked)} cannot be used together: give one merge mode",
                           hint="git subtask merge [--squash | --no-ff | --ff-only] ID")
    return asked[0][2:] if asked else "merge"


def land_mode(*, squash: bool = False, no_ff: bool = False, rebase: bool = False) -> str:
    """The one landing mode the flags ask for (`merge` without any); two at once is a usage error."""
    asked = [flag for flag, on in (("--squash", squash), ("--no-ff", no_ff), ("--rebase", rebase)) if on]
    if len(asked) > 1:
        raise SubtaskError("usage", f"{' and '.join(asked)} cannot be used together: give one landing mode",
                           hint="git subtask land [--squash | --no-ff | --rebase] ID...")
    return asked[0][2:] if asked else "merge"


def merge(repo: Repo, id_or_prefix: str, mode: str = "merge", force: bool = False, reverify: bool = False):
    from subtask.ops.landing import merge

    return merge.merge(repo, id_or_prefix, mode=mode, force=force, reverify=reverify)


def land(repo: Repo, ids: list[str], *, mode: str = "merge", verify: str | None = None, atomic: bool = False,
         reconcile: bool = False, force: bool = False, dry_run: bool = False, window: int | None = None,
         batch: int | None = None, reuse: bool | None = None, first: list[str] | None = None,
         progress=None):
    """Land many jobs in order, each verified on the commit that lands (`lineup.LandResult`);
    with `dry_run`, what would happen and which jobs touch the same files (`overlap.Plan`).
    `window`: states verified at once; `batch`: jobs per batch (0: the configured size);
    `reuse` False: run every verify; `first`: jobs put ahead of the rest; `progress`: called
    with what the window is doing (`render.land_progress`)."""
    from subtask.ops.landing import land, lineup

    opts = lineup.Options(mode=mode, verify=verify, atomic=atomic, reconcile=reconcile, force=force,
                             window=window, batch=batch, reuse=reuse, first=list(first or []), progress=progress)
    sweep(repo)
    if dry_run:
        from subtask.ops.landing import overlap

        return overlap.plan(repo, ids, opts)
    return land.land(repo, ids, opts, replier=_reply_and_wait(repo))


def _reply_and_wait(repo: Repo):
    """How `land --reconcile` answers a conflict: a reply to the job, waited for to its end."""
    from subtask.api.waiting import wait

    def reply_and_wait(job_id: str, message: str) -> Job:
        reply(repo, job_id, message)
        return wait(repo, [job_id], stalls=False).jobs[0]

    return reply_and_wait
