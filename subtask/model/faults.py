"""Fault injection for tests: make a process crash, or pause, at a named point.

`SUBTASK_FAULT=<point>` exits abruptly there (`os._exit`, skipping every cleanup, as a crash or
`kill -9` would). `SUBTASK_FAULT_PAUSE=<point>:<seconds>` sleeps there, so a test can interrupt
or stop a process at exactly that step. `SUBTASK_FAULT_HOLD=<point>:<path>` creates
`<path>.reached` there and waits until `<path>` exists, so a test can run another command at
exactly that step without depending on timing. `SUBTASK_FAULT_RAISE=<point>` raises there
(a fatal `SubtaskError`): what an operation undoes on a failure is what a test sees.

Points: cli_start (the console script, its Ctrl-C handler set, the CLI not yet imported),
cli_dispatch (the CLI loaded, the command not yet parsed), cli_end (the command over, before the
process exits); after_admit, after_reserve, after_branch, after_record, before_spawn,
recording_worker_pid (start); worker_start, before_files_checkout (the worktree registered, its
files not yet written), after_checkout, after_engine, after_verify, before_final_record,
after_final_record (worker); after_retry_reserved (a verify loop's retry: its slot entry renamed,
its money reserved, its record not yet written); before_worktree_removal, after_removal_recheck
(cleanup, cleanup --merged, the sweep, gc: before each job's re-check under its run-lock, and after
it with the lock held); before_group_decide (whoever concludes a best-of group, once it saw every
member ended); wait_after_conclude (`wait` on jobs and groups, once it tried to conclude the groups,
before it waits on their members); wait_found_busy (wait, when an ended job it waits on is still
held by its worker or a reply); before_advance, after_advance (a worker, its job ended and its slot
freed, before and after it starts the jobs waiting for it); before_leaving_waiting,
after_leaving_waiting, after_launch_admit (whoever starts a waiting job: its branch made, its record
moved to queued, its slot taken); pool_building (whoever fills the worktree pool: an entry
registered under `.pool/.building/`, its files not yet written), pool_claiming (a worker taking a
pooled worktree: its admin folder renamed to the job's, its folder not yet moved).
"""

from __future__ import annotations

import os
import time

from subtask.model.errors import SubtaskError

FAULT_ENV = "SUBTASK_FAULT"
PAUSE_ENV = "SUBTASK_FAULT_PAUSE"
HOLD_ENV = "SUBTASK_FAULT_HOLD"
HOLD_LIMIT_S = 60.0
RAISE_ENV = "SUBTASK_FAULT_RAISE"
FAULT_EXIT = 99




def point(name: str) -> None:
    if os.environ.get(FAULT_ENV) == name:
        os._exit(FAULT_EXIT)
    if os.environ.get(RAISE_ENV) == name:
        raise SubtaskError("fatal", f"injected fault at {name}")
    pause = os.environ.get(PAUSE_ENV)
    if pause and pause.rpartition(":")[0] == name:
        time.sleep(float(pause.rpartition(":")[2]))
    _hold(name)


def _hold(name: str) -> None:
    """Wait at `name` until the test creates the gate file (bounded: a test that dies frees us)."""
    hold = os.environ.get(HOLD_ENV)
    if not hold or hold.partition(":")[0] != name:
        return
    gate = hold.partition(":")[2]
    with open(f"{gate}.reached", "a") as reached:
        reached.write(f"{os.getpid()}\n")  # who holds here: a test may look at it, or end it
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
