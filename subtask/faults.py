"""Fault injection for tests: `SUBTASK_FAULT=<point>` makes the process exit abruptly there.

Points: after_admit, after_reserve, after_branch, after_record, before_spawn (start);
worker_start, after_engine, after_verify, before_final_record (worker). `os._exit` skips every
cleanup handler, as a crash or `kill -9` would.
"""

from __future__ import annotations

import os

FAULT_ENV = "SUBTASK_FAULT"
FAULT_EXIT = 99


def point(name: str) -> None:
    if os.environ.get(FAULT_ENV) == name:
        os._exit(FAULT_EXIT)
