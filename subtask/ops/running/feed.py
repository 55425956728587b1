"""What happened to jobs after a cursor: `wait --since` (CLI) and `wait(since=...)` (MCP).

A client that shows no progress notifications polls with a cursor and misses nothing. Two
sources, each only ever appended to, give a job's events:

- the record chain (`refs/subtask/<id>/record`, moved only by compare-and-swap from its tip):
  every change of an attempt's state and every stall mark set or cleared, one commit each, on
  whatever machine wrote it (a Ray node's commits arrive by fetch);
- the events file (`run/<id>.events.jsonl`, O_APPEND by the worker, across attempts): what the
  engine and the worker said (output, commands, tools, the worker's phases: checking,
  verifying, retrying). Its state and stall lines repeat the record's and are left out.

A cursor names, per job, the record commit last seen and the byte offset read in the events
file: `st-4f2a91c0.8821327abcde.612`, jobs joined by `,`; `0` is the beginning of every job's
life. Because both sources only grow, every event after a position is read by the next call
from it, and none twice: the new cursor stands exactly after the last event returned (a call
returns at most `MAX_BYTES` of a job's events file, and says `more`). A partial last line is
left for the next call.

Invariants:
- Never make a wait cursor from a time or from a record's current state, only from positions in
  what is only ever appended to (the record chain's commit, the events file's byte offset),
  because an event written in the second the cursor names, or a stall mark set and cleared
  between two calls, would be missed (`feed.py`, `tests/test_feed.py`).
"""

from __future__ import annotations

import json
import os

from subtask.git import records
from subtask.git.gitrepo import Repo
from subtask.model import lazyre
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.model.job import ACTIVE, TERMINAL
from subtask.ops.running import lifecycle

MAX_BYTES = 256 << 10  # of one job's events file per call
MAX_COMMITS = 10_000  # a record chain is walked at most this far back from its tip
_PART = lazyre.compile(r"(st-[0-9a-f]{8})\.([0-9a-f]{0,40})\.([0-9]{1,15})")
TIP_CHARS = 12
_RECORD_KINDS = ("stalled", "stall_ended")  # the record says these (a stall mark set, cleared)


@dataclass
class Position:
    """One job's part of a cursor: how far its record and its events file were read."""

    tip: str = ""  # the record commit last seen (a prefix of its id); "": none
    offset: int = 0  # bytes of the events file read


@dataclass
class Feed:
    """What `wait --since` answers: the events after the cursor and the cursor after them (`collect`)."""

    events: list[dict] = field(default_factory=list)
    cursor: str = "0"
    more: bool = False  # a job has more events than one call returns: call again at once


def parse(cursor: str | None) -> dict[str, Position]:
    """The positions a cursor names; `0` (or nothing) is the beginning. Bad text: exit 129."""
    text = (cursor or "").strip()
    if text in ("", "0"):
        return {}
    found: dict[str, Position] = {}
    for part in text.split(","):
        match = _PART.fullmatch(part.strip())
        if match is None:
            raise SubtaskError("usage", f"not a wait cursor: {cursor!r} (a cursor is what the last wait "
                               "--since answered, or 0 for the beginning)", hint="git subtask wait --since 0 ID")
        found[match.group(1)] = Position(match.group(2), int(match.group(3)))
    return found


def render_cursor(positions: dict[str, Position]) -> str:
    parts = [f"{job_id}.{p.tip[:TIP_CHARS]}.{p.offset}" for job_id, p in sorted(positions.items())]
    return ",".join(parts) or "0"


def grew(repo: Repo, job_ids: list[str], positions: dict[str, Position], *, records_too: bool = True) -> bool:
    """Whether any job has an event after its position: a stat of its events file, and with
    `records_too` a read of its record's ref (a process, before pygit2 is loaded: the caller asks
    less often; a worker says each state it records in the events file too)."""
    for job_id in job_ids:
        seen = positions.get(job_id, Position())
        try:
            if os.stat(lifecycle.events_file(repo.state_dir, job_id)).st_size > seen.offset:
                return True
        except OSError:
            pass
        ref = repo.objects.ref(records.record_ref(job_id)) if records_too else None
        if ref is not None and not ref.target.startswith(seen.tip or "-"):
            return True
    return False


def collect(repo: Repo, job_ids: list[str], positions: dict[str, Position]) -> Feed:
    """Every event of the jobs after their positions (in time order), and the cursor after them.
    Positions of jobs not asked about are kept in the new cursor."""
    moved = dict(positions)
    events: list[dict] = []
    more = False
    for job_id in job_ids:
        seen = positions.get(job_id, Position())
        record_events, tip = _record_events(repo, job_id, seen.tip)
        file_events, offset, left = _file_events(lifecycle.events_file(repo.state_dir, job_id), seen.offset)
        events += [dict(e, job=job_id) for e in record_events + file_events]
        moved[job_id] = Position(tip or seen.tip, offset)
        more = more or left
    events.sort(key=_time_of)
    return Feed(events, render_cursor(moved), more)


def _time_of(event: dict) -> float:
    when = event.get("t")
    return when if isinstance(when, (int, float)) else 0.0


# ---------------------------------------------------------------- the record chain

def _record_events(repo: Repo, job_id: str, seen: str) -> tuple[list[dict], str | None]:
    """The changes the record's commits after `seen` made (oldest first), and the tip read."""
    ref = repo.objects.ref(records.record_ref(job_id))
    if ref is None or ref.symbolic:
        return [], None
    chain: list[tuple[dict, float]] = []  # newest first: (state.json, commit time)
    before: dict | None = None
    commit: str | None = ref.target
    while commit and len(chain) < MAX_COMMITS:
        head, state = repo.objects.read([commit, f"{commit}:state.json"])
        if head is None or head[0] != "commit":
            break  # `records.read` names a damaged record; the feed gives what it could read
        parsed = _json(state[1]) if state else None
        if seen and commit.startswith(seen):
            before = parsed
            break
        chain.append((parsed or {}, _committed_at(head[1])))
        commit = _first_parent(head[1])
    events: list[dict] = []
    for state, when in reversed(chain):
        events += _changes(before, state, when)
        before = state
    return events, ref.target


def _changes(before: dict | None, after: dict, when: float) -> list[dict]:
    """What one record commit changed: an attempt's state, a stall mark set or cleared."""
    old = {a.get("n"): a for a in _attempts(before)}
    found = []
    for attempt in _attempts(after):
        n, state = attempt.get("n"), attempt.get("state")
        was = old.get(n, {})
        if state != was.get("state"):
            found.append(_state_event(attempt, when))
        stalled, was_stalled = isinstance(attempt.get("stalled"), dict), isinstance(was.get("stalled"), dict)
        if stalled and not was_stalled and state not in TERMINAL:
            mark = attempt["stalled"]
            found.append({"type": "stalled", "attempt": n, "t": when, "since": mark.get("since"),
                          "after": mark.get("after"), "action": mark.get("action")})
        elif was_stalled and not stalled:
            found.append({"type": "stall_ended", "attempt": n, "t": when})
    return found


def _state_event(attempt: dict, when: float) -> dict:
    state = attempt["state"]
    at = {"running": attempt.get("started_at")}.get(state) or (
        attempt.get("ended_at") if state in TERMINAL else attempt.get("queued_at") if state in ACTIVE else None)
    event = {"type": "state", "attempt": attempt.get("n"), "state": state,
             "t": at if isinstance(at, (int, float)) else when}
    if state in TERMINAL:
        verify = attempt.get("verify")
        event["verify"] = None if not isinstance(verify, dict) else "passed" if verify.get("passed") else "failed"
        for key in ("reason", "error_kind", "outcome"):
            if attempt.get(key):
                event[key] = attempt[key]
    return event


def _attempts(state: dict | None) -> list[dict]:
    """The attempts of a state.json that are ones: a number and a state (what `records` asks)."""
    attempts = (state or {}).get("attempts")
    if not isinstance(attempts, list):
        return []
    return [a for a in attempts
            if isinstance(a, dict) and isinstance(a.get("n"), int) and isinstance(a.get("state"), str)]


def _json(data: bytes) -> dict | None:
    try:
        value = json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _headers(raw: bytes) -> list[bytes]:
    return raw.partition(b"\n\n")[0].split(b"\n")


def _first_parent(raw: bytes) -> str | None:
    return next((line[7:].decode() for line in _headers(raw) if line.startswith(b"parent ")), None)


def _committed_at(raw: bytes) -> float:
    for line in _headers(raw):
        if line.startswith(b"committer "):
            try:
                return float(line.rsplit(b" ", 2)[1])
            except (IndexError, ValueError):
                break
    return 0.0


# ---------------------------------------------------------------- the events file

def _file_events(path: str, offset: int) -> tuple[list[dict], int, bool]:
    """The events file's lines after `offset` (whole lines only, at most MAX_BYTES), without the
    ones the record says too; the new offset; whether more is there."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < offset:
                offset = 0  # not the file the cursor read (never truncated in place): read it all
            fh.seek(offset)
            chunk = fh.read(MAX_BYTES)
    except OSError:
        return [], offset, False
    whole = chunk[: chunk.rfind(b"\n") + 1]
    events = []
    if not whole and len(chunk) == MAX_BYTES:  # a line longer than a call takes: its rest is no JSON
        whole = chunk
        events.append({"type": "dropped", "text": f"[an event line longer than {MAX_BYTES} bytes left out]"})
    for line in whole.splitlines():
        event = _json(line)
        if event is None or _told_by_record(event):
            continue
        events.append(event)
    return events, offset + len(whole), offset + len(whole) < size


def _told_by_record(event: dict) -> bool:
    kind = event.get("type")
    return kind in _RECORD_KINDS or (kind == "state" and event.get("state") in (*ACTIVE, *TERMINAL))
