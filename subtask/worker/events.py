"""The attempt's events file (`<state>/run/<id>.events.jsonl`, which `git subtask watch` and
`wait` follow) and the tail of it that the final record keeps.

Invariants:
- Every event passes `redact` before it is written or kept; streamed text (events with a
  `stream`: child output, verify output) through one `StreamRedactor` per stream, so a key
  printed over many lines is redacted whole, and a private key block is never kept.
- Never keep a job's output unbounded in the state folder, because it shares a disk with every
  other job's bookkeeping: events keep the first MiB and the last 256 KiB, with a `dropped`
  event between (`EventSink`: a job printing 50 MB leaves ~1.3 MB of events), and evidence lists
  1,000 files (totals exact).
- A full disk loses events, never the job.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

from subtask.git import records
from subtask.model.redact import Redactor, StreamRedactor
from subtask.state.statefiles import open_private


class EventSink:
    """Appends redacted events to the events file and keeps a tail for the record.

    Bounded: streamed output past the first `HEAD_BYTES` is held in memory, only its last
    `TAIL_BYTES` kept, and written (after a `dropped` event saying how many lines and bytes went
    between them) when the stream pauses for another event or `flush` is called. A job printing
    50 MB leaves ~1.3 MB of events, and the disk it shares with every other job stays free."""

    HEAD_BYTES = 1 << 20
    TAIL_BYTES = 256 << 10

    def __init__(self, path: str, attempt: int):
        self.path = path
        self.attempt = attempt
        self.tail: list[str] = []
        self._streams: dict[tuple, StreamRedactor] = {}
        self._redactor = Redactor()  # the job's environment (adopted before the attempt) stays
        self._fd: int | None = None
        self._written = 0
        self._held: collections.deque[dict] = collections.deque()
        self._held_bytes = 0
        self._dropped = [0, 0]  # lines, bytes

    def __call__(self, event: dict) -> None:
        event = dict(event)
        streamed = isinstance(event.get("stream"), str) and isinstance(event.get("text"), str)
        if streamed:
            key = (event.get("type"), event["stream"])
            redactor = self._streams.get(key)
            if redactor is None:  # not setdefault: each StreamRedactor reads the environment's secrets
                redactor = self._streams[key] = StreamRedactor()
            text = redactor.key_blocks_only(event["text"])  # the patterns run once, as it is written
            if text is None:
                return  # inside a private key block: nothing of it is kept
            event["text"] = text
        event.setdefault("t", round(time.time(), 3))
        if streamed and self._written >= self.HEAD_BYTES:
            self._hold(event)
            return
        self.flush()
        self._write(event)

    def _hold(self, event: dict) -> None:
        self._held.append(event)
        self._held_bytes += len(event["text"])
        while self._held_bytes > self.TAIL_BYTES and len(self._held) > 1:
            size = len(self._held.popleft()["text"])
            self._held_bytes -= size
            self._dropped[0] += 1
            self._dropped[1] += size

    def flush(self) -> None:
        """Write what is held: how much was dropped, then the tail kept."""
        lines, size = self._dropped
        if lines:
            self._write({"type": "dropped", "lines": lines, "bytes": size,
                         "text": f"[{lines} lines of output ({size} bytes) dropped here]"})
            self._dropped = [0, 0]
        while self._held:
            self._write(self._held.popleft())
        self._held_bytes = 0

    def _write(self, event: dict) -> None:
        event = self._redactor.obj(event)
        event.setdefault("attempt", self.attempt)
        event.setdefault("worker", os.getpid())  # which worker ran it: hand-offs run several jobs
        line = json.dumps(event, ensure_ascii=True)
        data = (line + "\n").encode()
        try:
            if self._fd is None:
                self._fd = open_private(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC)
            os.write(self._fd, data)
            self._written += len(data)
        except OSError as exc:  # a full disk loses events, never the job
            print(f"git-subtask: an event was not written to {self.path}: {exc}", file=sys.stderr)
        self.tail.append(line)
        if len(self.tail) > records.EVENTS_TAIL_LINES:
            del self.tail[: len(self.tail) - records.EVENTS_TAIL_LINES]

    def close(self) -> None:
        self.flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
