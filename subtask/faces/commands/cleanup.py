"""`git subtask cleanup`: a finished job's clean worktree (or, --merged, every landed job's)."""

from __future__ import annotations

from subtask.faces import output
from subtask.model.errors import SubtaskError


def run(job_id: str | None, merged: bool, dry_run: bool, quiet: bool, as_json: bool) -> None:
    from subtask import api

    if merged == bool(job_id):
        raise SubtaskError("usage", "give a job ID or --merged (not both)")
    repo = output.repo()
    lines = api.cleanup_merged(repo, dry_run=dry_run).lines if merged else [api.cleanup(repo, job_id, dry_run=dry_run)]
    if not quiet:
        output.emit_lines(lines, as_json,
                          nothing="nothing to clean up: no landed jobs left anything" if merged else None,
                          dry_run=dry_run)
