"""Stamps in the state folder: when something last ran, so that another command skips it.

Standard library only: every reading command looks here before it imports what the stamp spares.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


def last(state_dir: Path, name: str) -> float:
    """When `name` (a file name of `paths`) was last stamped; 0 when never, or unreadable."""
    try:
        value = json.loads((state_dir / name).read_text()).get("t", 0)
    except (OSError, ValueError, AttributeError):
        return 0.0
    return float(value) if isinstance(value, (int, float)) else 0.0


def due(state_dir: Path, name: str, interval: float) -> bool:
    """Has `interval` seconds passed since `name` was stamped?"""
    return time.time() - last(state_dir, name) >= interval


def stamp(state_dir: Path, name: str) -> None:
    from subtask.state.statefiles import write_json

    write_json(state_dir / name, {"v": 1, "t": time.time()})
