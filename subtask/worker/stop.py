"""How a `stop` reaches the worker: `stop` sends SIGTERM, which `on_sigterm` turns into
`StopRequested` wherever the worker is (a KeyboardInterrupt, so a child runner kills its process
group), except inside `stop_deferred`, which holds it until a git step that must not be cut
half-way is done.

Invariants:
- A stop held by `stop_deferred` is raised once the block ends, and only when `on_sigterm` was
  the handler before it: never where the worker had chosen to ignore a stop (its bookkeeping).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import NoReturn


class StopRequested(KeyboardInterrupt):
    """Raised in the worker by SIGTERM (from `stop`); a KeyboardInterrupt so child runners kill their group."""


def on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    raise StopRequested()


@contextlib.contextmanager
def stop_deferred() -> Iterator[None]:
    """A `stop` arriving inside waits until the block is done, then is raised: a `git worktree
    add` killed half-way leaves a folder that is no registered worktree, which no cleanup may
    then remove (it is not provably ours). (Run such git `own_group`: stop signals our group.)"""
    arrived: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
    if arrived and previous is on_sigterm:
        raise StopRequested()
