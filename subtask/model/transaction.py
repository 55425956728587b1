"""The start transaction: one undo stack for every way a job begins (start, reply, a group's
members, a map's jobs, a job that waits, a retry, a job handed to Ray).

A way of beginning a job runs its steps inside `with Transaction() as tx:` and says after each
one `tx.done(step, undo)`: what it made and how to take it back. A failure anywhere (an error, a
Ctrl-C) runs the undos of the steps done, newest first, uninterrupted (`undo_uninterrupted`), then
`tx.then` (what must follow an undo: hand the freed slots on), and re-raises. Once the block ends
without a failure, nothing is undone: what was made is the job's.

Invariants:
- Never undo a step that was not done, nor one twice, because an undo deletes what another
  start may own by then (a branch of the same name made after ours was dropped): an undo is
  registered by the step that made the thing, after it made it, and the stack is emptied once run.
- Every step is a fault point (`faults.point`, its name the step's), so a test can crash or fail
  a start after any step of any way a job begins (tests/test_start_transaction.py).
- Never begin a job with a hand-written undo list, because five of them drifted apart (a group's
  other members' slot entries were left behind on a failure, an undone reply left its record
  two commits longer): every way a job begins runs its steps in one `transaction.Transaction`,
  registering each undo as the step that made the thing completes
  (`tests/test_start_transaction.py::test_a_failure_after_any_step_undoes_exactly_what_was_done`).
"""

from __future__ import annotations

from collections.abc import Callable

from subtask.model import faults
from subtask.model.errors import undo_uninterrupted

# The steps a start may take, in order; each is also the name of its fault point.
STEPS = ("locked", "admitted", "words_kept", "env_kept", "reserved", "refs_made", "recorded",
         "group_recorded", "pushed", "spawned")


class Transaction:
    """One start's undo stack (see the module's docstring)."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], object]] = []
        self.then: Callable[[], object] | None = None  # run after an undo (and only then)

    def done(self, step: str, *undo: Callable[[], object] | None) -> None:
        """`step` is done; `undo` (none, one, or one per thing it made) takes it back should a
        later step fail."""
        self._undo.extend(u for u in undo if u is not None)
        faults.point(step)

    def __enter__(self) -> Transaction:
        return self

    def undo(self) -> None:
        """Take back every step done, newest first, now (a commit point that was not reached:
        a retry whose record did not take it)."""
        steps, self._undo = self._undo, []
        undo_uninterrupted(steps, then=self.then)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        if error is not None:
            self.undo()
        self._undo = []
