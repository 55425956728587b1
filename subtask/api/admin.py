"""Keeping house: cleanup and gc, disk use, the worktree pool, spend, engines' plugins, the
repository's setup (init, notes, hooks), the MCP client's configuration, push and pull.

Invariants:
- Cleanup never removes a dirty worktree or a branch with commits beyond its base; the record
  and pins are always kept.
- A pull brings home the jobs of this clone that ran elsewhere and ended: their branch,
  reservation and note, then the jobs waiting for them move on.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Collection
from pathlib import Path

from subtask import executors
from subtask.api.read import _groups, _positive, get, repo_at, sweep
from subtask.git import notes, notes_store, ownership, pool, records
from subtask.git.gitrepo import Repo, ensure_excluded, git
from subtask.model.errors import SubtaskError
from subtask.model.job import ACTIVE
from subtask.ops.landing import cleanup as landing_cleanup
from subtask.ops.landing import landed
from subtask.ops.running import spending
from subtask.state import ledger


def cleanup(repo: Repo, id_or_prefix: str, dry_run: bool = False) -> str:
    """Remove a finished job's worktree when it is clean, and its branch when it has no commits
    beyond its base; keep a branch with commits, and the record and pins always."""
    job = get(repo, id_or_prefix)
    if not job.state.current.terminal:
        raise SubtaskError("not_finished", f"{job.id} is {job.state.current.state}; stop it or wait for it first",
                           hint=f"git subtask wait {job.id}")
    path = Path(job.spec.worktree)
    removal, branch = landing_cleanup.clean_job(repo, job, landed.land_target(repo), dry_run=dry_run)
    if removal.kind == "busy":
        raise SubtaskError("not_finished", f"{job.id}: keeping the worktree: {removal.why}",
                           hint=f"git subtask wait {job.id}")
    if removal.kind == "failed":
        raise SubtaskError("fatal", f"{job.id}: {removal.why}", hint="git worktree list")
    if removal.kind == "kept":
        raise SubtaskError("dirty", f"{job.id}: keeping the worktree: {removal.why}",
                           hint=f"commit or discard what is there, or put its commits on a branch (git -C '{path}' "
                                f"status), then: git subtask cleanup {job.id}")
    words = "would remove" if dry_run else "removed"
    tree = (f"{words} worktree {path}" if removal.kind == "removed" else
            f"{'would forget' if dry_run else 'forgot'} git's registration of worktree {path} ({removal.why})"
            if removal.kind == "pruned" else "no worktree to remove")
    if branch.kind == "removed":
        gone = "would delete" if dry_run else "deleted"
        return f"{job.id}: {tree}; {gone} branch {job.spec.branch} ({landing_cleanup.EMPTY_BRANCH}; record kept)"
    if removal.kind != "removed" or dry_run:
        return f"{job.id}: {tree}"
    kept = f"branch {job.spec.branch} and record kept" if job.spec.branch else "record kept"
    return f"{job.id}: {tree} ({kept})"


def engine_plugins() -> list[str]:
    """The engines other packages register (each reads `subtask.engine.<name>.*` of its own)."""
    from subtask.engines import plugin_names

    return plugin_names()


def spend(repo: Repo, month: str | None = None, all_clones: bool = False):
    """This month's spend: committed, open reservations, per engine, cap left.

    `all_clones`: the spend of every clone whose records are here (pulled), from the records only.
    """
    if month is not None:
        ledger.check_month(month)
    sweep(repo)
    if all_clones:
        return spending.team_spend(repo, month)
    spending.sync_ledger(repo)  # the ledger caches the records: restored from them when lost
    return ledger.summary(repo.state_dir, repo.config.number("monthlyCapUsd"), month)


def init(repo: Repo, display: bool = False) -> list[str]:
    """Set the repository up: notes merge strategy, notes ref, and (`display`) notes in plain `git log`."""
    changed = notes.ensure_notes_config(repo)
    notes_store.ensure_ref(repo.objects)
    ensure_excluded(repo.common_dir)
    if display:
        shown = git(repo.root, "config", "--get-all", "notes.displayRef", check=False).stdout.split()
        if notes_store.NOTES_REF not in shown:
            git(repo.root, "config", "--local", "--add", "notes.displayRef", notes_store.NOTES_REF)
            changed.append(f"notes.displayRef += {notes_store.NOTES_REF} (plain git log shows the review notes)")
    return changed


def notes_rebuild(repo: Repo) -> int:
    """Regenerate every job's note block from its record; idempotent. Returns blocks changed."""
    return notes.rebuild(repo)


def cleanup_merged(repo: Repo, dry_run: bool = False):
    return landing_cleanup.cleanup_merged(repo, dry_run=dry_run)


def du(repo: Repo):
    """What each job's worktree costs on disk (tracked, untracked, ignored), the objects only its
    refs keep, the other folders in the worktree folder, and what cleanup --merged and gc would free."""
    from subtask.ops.running import disk

    return disk.usage(repo)


def gc(repo: Repo, dry_run: bool = False, older_than: str = "30d"):
    sweep(repo)
    return landing_cleanup.gc(repo, dry_run=dry_run, older_than=older_than)


def pool_status(repo: Repo):
    """The worktree pool: its entries (commit, bytes), what `subtask.pool` and `poolMaxBytes` ask."""
    return pool.status(repo)


def pool_fill(repo: Repo, count: int | None = None):
    """Fill the worktree pool now, in this process, to `count` entries (default `subtask.pool`)
    at the main worktree's HEAD; (the entries made, the pool after)."""
    if count is not None:
        count = _positive(count, "the number of worktrees", integer=True) if count != 0 else 0
    made = pool.fill(repo, count, wait=600.0)
    return made, pool.status(repo)


def hooks(repo: Repo, action: str):
    from subtask.ops.sharing import hooks as hooks_mod

    return {"install": hooks_mod.install, "uninstall": hooks_mod.uninstall, "status": hooks_mod.status}[action](repo)


def install(client: str, scope: str = "user", *, uninstall: bool = False, dry_run: bool = False,
            where: str | os.PathLike | None = None, on_plan=None):
    """Register (or with `uninstall`, take out) the MCP server and the agent's guide in Claude
    Code's or Codex's own configuration (`client_config.py`); `on_plan(lines)` sees the plan first."""
    from subtask.ops.sharing import client_config

    root = repo_at(where).root if scope == "project" else None
    act = client_config.uninstall if uninstall else client_config.install
    return act(client, scope, root, dry_run=dry_run, on_plan=on_plan)


def push(repo: Repo, remote: str = "origin", branches: bool = False):
    from subtask.ops.sharing import sync

    return sync.push(repo, remote, branches=branches)


def pull(repo: Repo, remote: str = "origin"):
    from subtask.ops.sharing import sync

    active_elsewhere = {e["id"] for e in records.list_entries(repo) if e.get("on") and e.get("state") in ACTIVE}
    result = sync.pull(repo, remote)
    arrived = [ref[len(records.PREFIX):-len("/record")] for ref in result.updated if ref.endswith("/record")]
    _bring_home_from_elsewhere(repo, arrived + result.new_jobs, active_elsewhere)
    return result


def _bring_home_from_elsewhere(repo: Repo, job_ids: list[str],
                               active: Collection[str] = frozenset()) -> None:
    """Jobs of this clone run elsewhere whose final record a pull brought: their branch,
    reservation, note; the end told (`ops.notify`) of those this pull found still active."""
    from subtask.ops.running import notify

    for job_id in job_ids:
        try:
            job = records.read(repo, job_id)
            executor = executors.of(job)
        except SubtaskError:
            continue
        where = executors.placement(job.spec)  # None for a job run here
        if (where is not None and not executor.runs_here and job.state.current.terminal
                and ownership.owns(repo, job)):
            from subtask.ops.sharing import sync

            try:
                sync.fetch_job(repo, where["url"], job_id)  # its branch
            except SubtaskError as exc:
                warnings.warn(f"{job_id}: its branch could not be fetched: {exc.message}", stacklevel=2)
            executor.backend().bring_home(repo, records.read(repo, job_id))
            ended = records.read(repo, job_id)
            if job_id in active:
                notify.attempt_ended(repo, ended)
            if ended.spec.group:  # a member brought home may be the last its group waited for
                _groups().after_member_ended(repo, ended)
    from subtask.ops.plans import waiting

    waiting.advance_quietly(repo)  # ... and the jobs waiting for what came home
