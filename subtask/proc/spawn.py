"""The local executor: start a detached worker process by fork, by the fork server, or by exec.

Below the worker in the layers (the worker starts its hand-offs through here), so nothing here
imports the worker or anything above it. What the worker *is* reaches this module only by being
handed in:
- `use_worker_main(fn)`: how a forked child runs the worker in this interpreter. The entry points
  hand it over (the CLI; a worker hands its own `run_detached` for its hand-offs). A process that
  handed nothing (a library caller) starts each worker as a fresh interpreter instead.
- `use_fork_server(server)`: the zygote (`subtask.worker.zygote`), which registers itself when a
  threaded face starts it.

Invariants:
- Never fork a worker from a process that has other threads (the MCP server, `wait`'s watchers),
  because a fork copies only the calling thread and a lock another thread held stays locked in the
  child; such callers start a fresh interpreter instead. The single-threaded CLI forks, which
  saves the worker ~0.1 s of start-up. The MCP server forks a zygote (`subtask/worker/zygote.py`) while
  it still has one thread and has it fork the workers; the zygote never starts a thread.
- Any failure of the fork server falls back to exec: a job never fails to start because of it.
- The spawned worker inherits the run-lock fd; the caller keeps and closes its own copy.
- Never let a worker carry another attempt's run mark (`SUBTASK_RUN`, by which `procs.end_adopted`
  and `procs.end_marked` end what an attempt left running), because a `start` inside a job's
  engine has its parent's: the child's worker, orphaned once that command exits, is adopted by the
  parent's worker (their subreaper) and was SIGKILLed with the parent's leftovers when the parent
  ended first (`failed: worker died`). A caller that carries the mark, in `os.environ` or in the
  environment block it was started with (which a fork copies, and /proc/<pid>/environ shows), starts
  a fresh interpreter without it (`spawn.start_worker`), and `jobenv` never keeps it
  (`queue_money::test_a_child_that_outlives_its_parent_runs_on_in_the_slot_it_was_lent`).
- A child forked beside a job (`in_background`) leads a process group of its own and dies with
  its parent (PR_SET_PDEATHSIG); `end_background` returns only once nothing of that group runs.
- Standard library only: the CLI and the MCP front end import this before anything heavy.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    from subtask.state.statefiles import StrPath

SPAWN_ENV = "SUBTASK_SPAWN"  # "exec": always start the worker as a fresh interpreter
RUN_MARKER_ENV = "SUBTASK_RUN"  # `<job>.<attempt>.<worker pid>` in every process of an attempt (`procs`)
EXEC_ENTRY = "subtask.worker.attempt"  # `python -m subtask.worker.attempt JOB ROOT`, the run-lock in SUBTASK_LOCK_FD

# (job id, repository: its root, or in a forked child the caller's open Repo, run-lock fd) -> exit code
WorkerMain = Callable[[str, object, int], int]

_worker_main: WorkerMain | None = None
_fork_server = None  # a subtask.worker.zygote.Zygote (not imported: the zygote sits above the worker)


def use_worker_main(main: WorkerMain) -> None:
    """Hand over how a forked child of this process runs a worker (see the module docstring)."""
    global _worker_main
    _worker_main = main


def use_fork_server(server: object) -> None:
    global _fork_server
    _fork_server = server


def fork_server():
    """This process's fork server, if it registered one that has not retired."""
    server = _fork_server
    if server is None or server.retired or server.owner != os.getpid():
        return None
    return server


def start_worker(root: StrPath, job_id: str, lock_fd: int, log_fd: int, repo: object = None) -> int:
    """Start the detached worker for `job_id` in `root`, its output on `log_fd`; its pid.

    A single-threaded caller that was handed a worker main forks: the child already has every
    module imported, which saves the worker's ~0.1 s of interpreter start-up and imports, and it
    gets `repo` (the caller's open repository, if given) rather than the root, so it need not ask
    git again what the caller found out. A caller with other threads (the MCP server, `wait`'s
    watchers) asks its fork server when it has one, and starts a fresh interpreter otherwise, or
    when the fork server fails in any way. A caller that carries an attempt's run mark (a `start`
    inside a job) starts a fresh interpreter without it (see the module docstring).
    """
    if _carries_run_mark():
        return _exec_worker(root, job_id, lock_fd, log_fd)
    if _may_fork():
        return _fork_worker(root, job_id, lock_fd, log_fd, repo)
    return _zygote_or_exec_worker(root, job_id, lock_fd, log_fd, repo)


def _may_fork() -> bool:
    return (_worker_main is not None and os.environ.get(SPAWN_ENV) != "exec" and hasattr(os, "fork")
            and _one_thread())


def _one_thread() -> bool:
    """No thread but this one (none can exist while `threading` was never imported: a reading
    command's, which does not import it, `subprocess` or `signal` for this module's sake)."""
    threading = sys.modules.get("threading")
    return threading is None or threading.active_count() == 1


def _carries_run_mark() -> bool:
    """Does this process (its `os.environ`, or the environment block it was started with, which a
    fork copies) carry an attempt's run mark?"""
    if RUN_MARKER_ENV in os.environ:
        return True
    try:
        with open("/proc/self/environ", "rb") as fh:
            block = fh.read()
    except OSError:
        return False
    mark = f"{RUN_MARKER_ENV}=".encode()
    return block.startswith(mark) or b"\0" + mark in block


def _zygote_or_exec_worker(root: StrPath, job_id: str, lock_fd: int, log_fd: int, repo: object) -> int:
    server = fork_server() if os.environ.get(SPAWN_ENV) != "exec" else None
    if server is not None:
        try:
            return server.spawn(job_id, root, lock_fd, log_fd, repo)
        except Exception as exc:  # the zygote's worker will not run: this one must
            print(f"git-subtask: the worker fork server failed ({exc}); starting {job_id} "
                  "as a fresh interpreter", file=sys.stderr)
    return _exec_worker(root, job_id, lock_fd, log_fd)


def _exec_worker(root: StrPath, job_id: str, lock_fd: int, log_fd: int) -> int:
    env = {k: v for k, v in os.environ.items() if k != RUN_MARKER_ENV}  # never a worker's (module docstring)
    env["SUBTASK_LOCK_FD"] = str(lock_fd)
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-m", EXEC_ENTRY, job_id, str(root)],
        stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT, cwd=str(root),
        env=env, start_new_session=True, pass_fds=(lock_fd,), close_fds=True,
    )
    return proc.pid


def _fork_worker(root: StrPath, job_id: str, lock_fd: int, log_fd: int, repo: object) -> int:
    main = _worker_main
    assert main is not None  # _may_fork checked
    import signal  # here: a child imports nothing before it runs the worker

    sys.stdout.flush()  # or the child would write the parent's buffered output a second time
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the child: detach like the exec path does, then run the worker in this interpreter
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.chdir(root)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        code = main(job_id, str(root) if repo is None else repo, lock_fd)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)  # never return into the caller's code, nor run its exit handlers


_background: list[int] = []  # children `in_background` forked, not yet reaped


def in_background(work: Callable[[], object]) -> int | None:
    """Run `work` in a forked child of this single-threaded process; its pid, or None when this
    process cannot fork now. The child leads a process group of its own (its pgid is its pid), so
    `end_background` ends it with every process it started, and dies with this process
    (PR_SET_PDEATHSIG). It never returns into the caller's code and runs none of its exit
    handlers. End it with `end_background` (a worker: before it lets go of its job). At the
    caller's priority: on a busy machine a niced child waited seconds behind everything else
    (measured: a pool refill at nice 19 never finished between two jobs at load 17), and on two
    cores it runs beside the job."""
    if not hasattr(os, "fork") or not _one_thread():
        return None
    import signal  # here: a child imports nothing before it runs its work

    sys.stdout.flush()  # or the child would write the parent's buffered output a second time
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid:
        _own_group(pid)  # here too: whichever of the two runs first, the group exists once fork returns
        _background.append(pid)
        return pid
    code = 1
    try:
        _own_group(0)
        _die_with_parent()
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(code)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        work()
        code = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGKILL when the parent's (single) thread exits; Linux only. (Not `procs`'s: it imports us.)"""
    if sys.platform == "linux":
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _own_group(pid: int) -> None:
    try:
        os.setpgid(pid, 0)
    except OSError:  # the child has exec'd or exited meanwhile: its group was set by then
        pass


def end_background(grace: float) -> None:
    """End the children `in_background` started: each gets `grace` seconds to finish, then its
    process group is killed; returns once nothing of any group runs (the leader reaped, the rest
    reaped too when they were handed to us as a subreaper, else gone)."""
    deadline = time.monotonic() + grace
    for pid in list(_background):
        if not _reaped(pid, until=deadline):
            _kill_group(pid)
            _reaped(pid, until=None)
        _background.remove(pid)
        _group_ended(pid)


def _reaped(pid: int, until: float | None) -> bool:
    """Reap `pid`, waiting until `until` (None: as long as it takes); False if it still runs."""
    while True:
        try:
            done, _ = os.waitpid(pid, 0 if until is None else os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere
            return True
        except InterruptedError:
            continue
        if done or until is None:
            return True
        if time.monotonic() >= until:
            return False
        time.sleep(0.01)


def _kill_group(pgid: int) -> None:
    if pgid > 1 and pgid != os.getpgrp():
        import signal

        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


GROUP_END_WAIT = 5.0  # seconds a killed group's other members get to be gone (SIGKILL: at once)


def _group_ended(pgid: int) -> None:
    """Wait until no process of group `pgid` is left, reaping those that are our children now
    (a worker is a subreaper: the orphans of the group's leader come to it)."""
    _kill_group(pgid)  # members the leader left behind when it exited on its own
    deadline = time.monotonic() + GROUP_END_WAIT
    while time.monotonic() < deadline:
        try:
            while os.waitpid(-pgid, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.005)
