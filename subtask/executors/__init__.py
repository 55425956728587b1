"""Where a job runs: `local` (a detached worker on this machine, `subtask/spawn.py`) or `ray` (a
node of a Ray cluster, `subtask/executors/ray.py` at home and `subtask/executors/remote.py` on the node).

`git config subtask.executor local|ray` (and `start --on`) picks it. A job run elsewhere says so in
its record: `spec.executor = {"kind": "ray", "address": ..., "remote": ..., "url": ...}` and, per
attempt, `attempt.ray_job` (the Ray submission id). Everything else about the job is the same.

Standard library only, and nothing above the base layer: `api` asks here which executor a job
uses before anything heavy is imported (the CLI's hot path never imports Ray).
"""

from __future__ import annotations

from subtask.model.errors import SubtaskError
from subtask.model.job import placement, ray_job_id, runs_remotely

EXECUTORS = ("local", "ray")


def choose(config, flag: str | None) -> str:
    """The executor for a new job: `--on`, else `git config subtask.executor`, else local."""
    value = (flag or config.get("executor") or "local").strip().lower()
    if value not in EXECUTORS:
        source = "--on" if flag else "git config subtask.executor"
        raise SubtaskError("usage", f"{source} is {value!r}; it must be local or ray",
                           hint="git config subtask.executor local")
    return value


__all__ = ["EXECUTORS", "choose", "placement", "ray_job_id", "runs_remotely"]
