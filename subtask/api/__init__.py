"""Every operation, once. The CLI and the MCP server call only this package.

Functions take plain arguments, validate them before changing anything, and return data
(`Job`, `StartResult`, `WaitResult`, …); they never print. Failures a user can act on raise
`SubtaskError` with git's exit code.

`api.<name>` is found in the module that does it, imported on first use: `read` (a job, the
listing, status, a group), `waiting` (wait), and `jobs` (start, reply, stop, cleanup, merge, land and the
rest). A reading command so imports the reading operations only, never what starts or lands a
job (tests/test_imports.py).
"""

from __future__ import annotations

_READ = frozenset({
    "DEFAULT_LIST_LIMIT", "LIST_STATES", "Listing", "_positive", "add_record_facts",
    "branch_moved", "evidence_envelope", "get", "get_group", "job_passed", "latest_activity", "list_groups", "list_jobs", "queue_position",
    "record_facts", "repo_at", "status", "sweep", "worker_log", "worktree_present"})
_WAIT = frozenset({"GroupWait", "MixedWait", "QUEUED_FILL_INTERVAL", "RECORD_LOOKS", "STALL_LOOK", "WAITING_LOOK",
                   "WRAP_UP_WAIT", "WaitResult", "wait", "wait_groups", "wait_ids"})


def use_forked_workers() -> None:
    """Workers this process starts are forks of it (a single-threaded CLI call): `proc/spawn`."""
    from subtask.proc import spawn

    spawn.use_worker_main(_run_worker)


def _run_worker(job_id: str, root: str, lock_fd: int) -> int:
    """A worker in a child forked from this process: `worker/attempt` imported only there."""
    from subtask.worker import attempt

    return attempt.run_detached(job_id, root, lock_fd)


def __getattr__(name: str):
    # A submodule named as one of its functions would shadow it (importing `subtask.api.x` sets
    # `api.x` to the module): hence `waiting`, not `wait`.
    module = "read" if name in _READ else "waiting" if name in _WAIT else "jobs"
    value = getattr(__import__(f"subtask.api.{module}", fromlist=[name]), name)
    globals()[name] = value
    return value
