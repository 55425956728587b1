"""Settings from `git config subtask.*`, with their defaults in one place.

Keys are given without the `subtask.` prefix (`config.get("maxRunning")`). Reading goes through
pygit2's config snapshot, so it costs no subprocess.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from subtask.errors import SubtaskError

DEFAULTS: dict[str, str] = {
    "maxRunning": "4",
    "maxDepth": "2",
    "monthlyCapUsd": "100",
    "defaultMaxUsd": "2",
    "maxJobUsd": "20",
    "verifyTimeout": "600",
    "deleteLandedBranches": "true",
    "stopGrace": "5",
    "sweepInterval": "30",  # seconds between lazy landed-job sweeps inside other commands
    "setupTimeout": "600",  # seconds `subtask.setup` may run in a new worktree
    "refLockStale": "10",  # seconds after which a record's ref lock is a dead writer's leftover
}


class Config:
    def __init__(self, reader: Callable[[str], str | None]):
        self._read = reader

    def get(self, key: str, default: str | None = None) -> str | None:
        value = self._read("subtask." + key)
        if value is None:
            return default if default is not None else DEFAULTS.get(key)
        return value

    def __call__(self, key: str) -> str | None:
        return self.get(key)

    def number(self, key: str) -> float:
        raw = self.get(key)
        try:
            value = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise SubtaskError("fatal", f"git config subtask.{key} is not a number: {raw!r}",
                               hint=f"git config subtask.{key} {DEFAULTS.get(key, 'N')}") from None
        if not math.isfinite(value) or value < 0:
            raise SubtaskError("fatal", f"git config subtask.{key} must be a finite number >= 0, not {raw!r}")
        return value

    def integer(self, key: str) -> int:
        return int(self.number(key))

    def flag(self, key: str) -> bool:
        return (self.get(key) or "").strip().lower() in ("1", "true", "yes", "on")


def pygit2_reader(repo) -> Callable[[str], str | None]:
    """A reader over the repository's config (system, global, local, worktree)."""
    cfg = repo.config

    def read(key: str) -> str | None:
        try:
            return cfg[key]
        except (KeyError, ValueError):
            return None

    return read
