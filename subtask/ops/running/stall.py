"""Stalls: an engine that has said nothing for `subtask.stallAfter` seconds.

The worker runs one `StallWatch` around each engine run. Every event the engine emits (but its
retries: codex's "Reconnecting...") counts as progress. Silent for `stallAfter` seconds, the
attempt is marked: `Attempt.stalled` in the record (so `list`, `status`, `wait` and the note see
it) and a `stalled` event (so MCP progress does); an event after that clears the mark. With
`subtask.stallAction = stop` the engine's process group is ended instead of waited on, and the
worker records the attempt `stopped` with the stall as its reason.

"Stalled" is a condition of a running attempt, not a state: the state machine stays queued ->
running -> done | failed | stopped, and only the worker ends an attempt.

Invariants:
- Never let the stall watch end an attempt or write over a terminal one, because exactly one
  writer ends an attempt: it writes the record only on a change (marked, cleared), by
  compare-and-swap on a running attempt of its own number, and with `stallAction stop` ends the
  engine's process group, after which the worker records `stopped`; the watch's thread never
  outlives the engine run (`__exit__` stops and joins it), so its last write lands before the
  worker's final record.
- No test waits for real time: the bound is configurable (fractions of a second) and a test makes
  the engine silent with a gate it controls; the bound then only bounds a failure.
- Never count an engine's retries as progress, because codex retries an API it cannot reach for
  as long as it takes ("Reconnecting..."): the stall watch ignores `retry` events.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

from subtask.git import records
from subtask.git.gitrepo import Repo
from subtask.ops.running import lifecycle, notify
from subtask.proc import procs

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any

NOT_PROGRESS = ("retry",)  # events that say the engine is waiting, not working


def action_of(repo: Repo) -> str:
    """`subtask.stallAction`: mark (default) or stop; anything else reads as mark (doctor names it)."""
    return repo.config.choice("stallAction")


class StallWatch:
    """Marks the attempt stalled while its engine is silent; ends the engine with action `stop`."""

    def __init__(self, repo: Repo, job_id: str, attempt_n: int, sink: Callable[[dict], None], *,
                 after: float, action: str, grace: float) -> None:
        self.repo, self.job_id, self.attempt_n, self.sink = repo, job_id, attempt_n, sink
        self.after, self.action, self.grace = after, action, grace
        self.stopped = False  # the stall ended the engine (action stop)
        self._cond = threading.Condition()
        self._last = time.monotonic()
        self._last_wall = time.time()
        self._marked_at: float | None = None  # monotonic time of the last event when marked
        self._done = False
        self._thread: threading.Thread | None = None

    @property
    def reason(self) -> str:
        return (f"stalled: no event from the engine for {self.after:g}s; "
                "stopped (git config subtask.stallAction stop)")

    def emitter(self, emit: Callable[[dict], None]) -> Callable[[dict], None]:
        """`emit`, noting each event that shows progress."""
        def on_event(event: dict[str, Any]) -> None:
            if event.get("type") not in NOT_PROGRESS:
                with self._cond:
                    self._last, self._last_wall = time.monotonic(), time.time()
                    if self._marked_at is not None:
                        self._cond.notify()
            emit(event)

        return on_event

    def __enter__(self) -> StallWatch:
        if self.after > 0:
            self._thread = threading.Thread(target=self._run, name=f"subtask-stall-{self.job_id}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._done = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        repo = self.repo.for_thread()  # this thread's own handle: pygit2 objects are not shared
        while True:
            with self._cond:
                since: float | None = None
                if self._marked_at is not None and self._last > self._marked_at and not self.stopped:
                    self._marked_at = None  # it spoke again (also in its last words before it ended)
                elif self._done:
                    return
                elif self._marked_at is None:
                    left = self.after - (time.monotonic() - self._last)
                    if left > 0:
                        self._cond.wait(left)
                        continue
                    self._marked_at, since = self._last, self._last_wall
                else:  # marked; a stopped engine's last words do not count
                    self._cond.wait()
                    continue
            try:  # outside the condition: the engine's events never wait for a record write
                if since is not None:
                    self._mark(repo, since)
                else:
                    self._clear(repo)
            except Exception as exc:  # a failed mark must not end the job: say so and go on
                self.sink({"type": "warning", "text": f"could not record the stall: {exc}"})

    def _mark(self, repo: Repo, since: float) -> None:
        stalled = {"since": round(since, 3), "after": self.after, "action": self.action}
        job = self._write(repo, stalled)
        self.sink({"type": "stalled", **stalled})
        if self.action == "stop":
            self.stopped = True
            self._stop_engine()  # its end is told (ops/notify), the stall as its reason
        elif job.state.current.n == self.attempt_n and job.state.current.stalled == stalled:
            notify.stalled(repo, job)

    def _clear(self, repo: Repo) -> None:
        self._write(repo, None)
        self.sink({"type": "stall_ended"})

    def _write(self, repo: Repo, stalled: dict | None):
        def change(job) -> bool:
            attempt = job.state.current
            if attempt.n != self.attempt_n or attempt.terminal:
                return False
            attempt.stalled = stalled
            return True

        return records.update(repo, self.job_id, change)

    def _stop_engine(self) -> None:
        """End the engine's process group as a timeout would: the engine then reports what it saw
        (its cost and tokens so far). With no group recorded (it started none), the worker is
        interrupted the way `stop` interrupts it."""
        pgid = lifecycle.read_pids(self.repo.state_dir, self.job_id).get("engine")
        if isinstance(pgid, int) and pgid > 1 and pgid != os.getpgrp():
            procs.kill_group(pgid, self.grace)
        else:
            os.kill(os.getpid(), signal.SIGTERM)
