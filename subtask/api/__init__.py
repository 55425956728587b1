"""Every operation, once. The CLI and the MCP server call only this package.

Functions take plain arguments, validate them before changing anything, and return data
(`Job`, `StartResult`, `WaitResult`, …); they never print. Failures a user can act on raise
`SubtaskError` with git's exit code.

`api.<name>` is found in the module that does it (`_MODULES`), imported on first use: `read` (a
job, the listing, status, a group), `waiting` (wait), `starting` (one job's start and the start
transaction), `groups` (best-of, map, what acts on a group), `launching` (what the faces call to
start: `launch`, `start_many`), `replying` (reply, stop), `landing` (diff, log, verify, merge,
land), `admin` (cleanup, gc, spend, the pool, setup, install, push, pull) and `health` (doctor). A reading command
so imports the reading operations only, never what starts or lands a job (tests/test_imports.py).

Every command first sweeps for dead workers (cheap: it reads only the slots file), so a crash is
noticed by the next command and its slot and reservation come back (`read.sweep`).

Invariants:
- Never name a module of `api/` as one of its operations (a `wait` module in `api/`), because importing
  the submodule binds it as the package's attribute: `wait` became the module, and the MCP
  `wait` tool failed with "'module' object is not callable" (hence `api/waiting.py`).
"""

from __future__ import annotations

_MODULES = {
    "read": ("DEFAULT_LIST_LIMIT", "GroupPage", "LIST_STATES", "Listing", "_positive", "add_record_facts",
             "all_ids", "branch_moved", "engine_names", "evidence_envelope", "get", "get_group", "group_page",
             "job_passed", "latest_activity", "list_groups", "list_jobs", "notify_feed_end",
             "notify_feed_since", "queue_position", "record_facts", "repo_at", "status", "sweep", "worker_log",
             "worktree_present"),
    "waiting": ("GroupWait", "MixedWait", "QUEUED_FILL_INTERVAL", "RECORD_LOOKS", "STALL_LOOK", "WAITING_LOOK",
                "WRAP_UP_WAIT", "WaitResult", "wait", "wait_groups", "wait_ids"),
    "starting": ("Delegation", "MAX_RETRIES", "Repo", "StartRequest", "StartResult", "_prepare", "current_depth",
                 "default_engine", "delegation", "engines", "left_out", "routing_explain", "start"),
    "groups": ("GroupStart", "MapStart", "compare", "compare_argvs", "map_files", "merge_group", "start_group",
               "start_map", "stop_group"),
    "launching": ("check_option", "launch", "request_from_dict", "run_remote", "start_many"),
    "replying": ("REPLY_LOCK_WAIT", "reply", "stop"),
    "landing": ("GitOutput", "MAX_OUTPUT_LIMIT", "OUTPUT_LIMIT", "diff", "diff_argv", "git_output", "land",
                "land_mode", "log", "log_argv", "merge", "merge_mode", "verify"),
    "admin": ("cleanup", "cleanup_merged", "du", "engine_plugins", "gc", "hooks", "init", "install", "notes_rebuild",
              "pool_fill", "pool_status", "pull", "push", "spend"),
    "health": ("doctor",),
}
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}


def use_forked_workers() -> None:
    """Workers this process starts are forks of it (a single-threaded CLI call): `proc/spawn`."""
    from subtask.proc import spawn

    spawn.use_worker_main(_run_worker)


def start_fork_server() -> None:
    """Fork the workers' fork server now, while this (threaded face's) process has one thread
    (`worker/zygote`). Raises OSError when it cannot: workers then start as fresh interpreters."""
    from subtask.worker import zygote

    zygote.start()


def preload_fork_server() -> None:
    """Have the fork server, if one runs, import the worker's modules now (the caller's own
    imports are done, so the two do not compete for the CPU)."""
    from subtask.worker import zygote

    if (server := zygote.current()) is not None:
        server.preload()


def _run_worker(job_id: str, repo: object, lock_fd: int) -> int:
    """A worker in a child forked from this process (`repo`: its root, or the caller's open
    Repo, as `spawn.WorkerMain` says): `worker/attempt` imported only there."""
    from subtask.worker import attempt

    return attempt.run_detached(job_id, repo, lock_fd)


def __getattr__(name: str):
    # A submodule named as one of its functions would shadow it (importing `subtask.api.x` sets
    # `api.x` to the module): hence `waiting`, not `wait`.
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'subtask.api' has no attribute {name!r}")
    value = getattr(__import__(f"subtask.api.{module}", fromlist=[name]), name)
    globals()[name] = value
    return value
