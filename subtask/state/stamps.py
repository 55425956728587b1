"""Stamps in the state folder: when something last ran, so that another command skips it.

Standard library only: every reading command looks here before it imports what the stamp spares.
"""

from __future__ import annotations

import json
import os
import time

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    from subtask.state.statefiles import StrPath


def last(state_dir: StrPath, name: str) -> float:
    """When `name` (a file name of `paths`) was last stamped; 0 when never, or unreadable."""
    try:
        with open(os.path.join(state_dir, name), "rb") as fh:
            value = json.loads(fh.read()).get("t", 0)
    except (OSError, ValueError, AttributeError):
        return 0.0
    return float(value) if isinstance(value, (int, float)) else 0.0


def due(state_dir: StrPath, name: str, interval: float) -> bool:
    """Has `interval` seconds passed since `name` was stamped?"""
    return time.time() - last(state_dir, name) >= interval


def stamp(state_dir: StrPath, name: str) -> None:
    from subtask.state.statefiles import write_json

    write_json(os.path.join(state_dir, name), {"v": 1, "t": time.time()})
