"""Fault injection for tests: make a process crash, or pause, at a named point.

`SUBTASK_FAULT=<point>` exits abruptly there (`os._exit`, skipping every cleanup, as a crash or
`kill -9` would). `SUBTASK_FAULT_PAUSE=<point>:<seconds>` sleeps there, so a test can interrupt
or stop a process at exactly that step.

Points: after_admit, after_reserve, after_branch, after_record, before_spawn (start);
worker_start, after_checkout, after_engine, after_verify, before_final_record,
after_final_record (worker).
"""

from __future__ import annotations

import os
import time

FAULT_ENV = "SUBTASK_FAULT"
PAUSE_ENV = "SUBTASK_FAULT_PAUSE"
FAULT_EXIT = 99


def point(name: str) -> None:
    if os.environ.get(FAULT_ENV) == name:
        os._exit(FAULT_EXIT)
    pause = os.environ.get(PAUSE_ENV)
    if pause and pause.rpartition(":")[0] == name:
        time.sleep(float(pause.rpartition(":")[2]))
