"""A job, a list row or an event in one line: the record subject, `status`, `list`, `start`'s
and `wait`'s answers, `wait --since`'s events, what a running job is doing now.

Invariant: every line a command prints from here went through `terminal.safe_line` (one line,
nothing a terminal obeys); `activity_text` and `marks_text` are parts of `status_line` and
`list_line`, made safe there.
"""

from __future__ import annotations

import json
import time

from subtask.model.job import ACTIVE, TERMINAL, placement, ray_job_id
from subtask.words.fields import (
    after_text,
    best_line,
    error_words,
    job_cost,
    stalled_text,
    verify_tail,
    verify_word,
)
from subtask.words.formats import counted, duration, first_few, money, short, task_title
from subtask.words.terminal import safe_line


def one_line(job, position: int | None = None) -> str:
    """`st-1a2b3c4d done · verify passed · $0.00 · 3.2s · shell · echo hi` — the job in one line."""
    attempt = job.state.current
    parts = [f"{job.id} {attempt.state}"]
    if attempt.state == "queued" and position:
        parts[0] += f" (#{position} in queue)"
    if attempt.state == "running" and attempt.stalled:
        parts[0] += f" ({stalled_text(attempt)})"
    if attempt.state == "waiting":
        parts.append(after_text(job))
    if attempt.state == "skipped":
        parts.append(task_title(attempt.reason or "", 80))
    elif attempt.state in ("done", "failed", "stopped"):
        parts.append(verify_word(attempt.verify))
        if attempt.error_kind and attempt.state == "failed":
            parts.append(error_words(attempt))
        parts.append(money(job_cost(job)))
        if attempt.started_at and attempt.ended_at:
            parts.append(duration(attempt.ended_at - attempt.started_at))
    parts.append(job.spec.engine)
    if attempt.n > 1:
        parts.append(f"attempt {attempt.n}")
    parts.append(task_title(job.spec.task))
    return safe_line(" · ".join(parts))


def status_line(job, position: int | None = None, activity: str | None = None, marks: dict | None = None) -> str:
    """One job now: its one-line status, plus what it is doing when it is still active, and
    `marks_text` (a stale base, jobs that change the same files)."""
    line = one_line(job, position) + (f" · {marks_text(marks)}" if marks else "")
    if job.state.current.stalled:
        return safe_line(line)  # its last event says no more than "stalled"
    return safe_line(f"{line} · now: {activity}") if activity else safe_line(line)


def marks_text(marks: dict | None) -> str:
    """`base: 12 behind main · same file as st-1a2b3c4d: a.txt`: what makes a landing likely to
    conflict or to test something other than what lands (`overlap.mark`)."""
    if not marks:
        return ""
    parts = [f"base: {marks['behind']} behind {marks.get('target')}"] if marks.get("behind") else []
    overlaps = marks.get("overlaps") or {}
    if overlaps:  # once per row: the first job, how many more, the files they share
        others = list(overlaps)
        files = sorted({f for named in overlaps.values() for f in named})
        shown = ", ".join(files[:3]) + (" …" if len(files) > 3 else "")
        more = f" and {counted(len(others) - 1, 'other')}" if len(others) > 1 else ""
        parts.append(f"same file{'' if len(files) == 1 else 's'} as {others[0]}{more}: {shown}")
    return " · ".join(parts)


def list_line(entry: dict, position: int | None = None, now: float | None = None) -> str:
    """One row of `list`: id, state, verify, age, cost, task (from the compact list entry)."""
    now = now or time.time()
    state = entry.get("state", "?")
    if state == "queued" and position:
        state = f"queued#{position}"
    elif state == "running" and entry.get("stalled"):
        state = "stalled"
    verify = "moved" if entry.get("moved") else entry.get("verify") or "-"  # passed on a tip no longer the branch's
    age = duration(now - (entry.get("created") or now))
    cost = money(entry.get("cost"))
    task = task_title(entry.get("task") or "", 50)
    marks = marks_text(entry.get("marks"))
    return list_row(entry.get("id", "?"), state, verify, age, cost, entry.get("engine", "?"),
                    task + (f"  ({marks})" if marks else ""))


def list_row(ident: str, state: str, verify: str, age: str, cost: str, engine: str,
             text: str) -> str:
    """A row of `list` in its columns (`LIST_HEADER`): a job's, or a group's."""
    return safe_line(f"{ident:<11}  {state:<10}  {verify:<7}  {age:>6}  {cost:>6}  {engine:<6}  "
                     f"{text}")


LIST_HEADER = f"{'ID':<11}  {'STATE':<10}  {'VERIFY':<7}  {'AGE':>6}  {'COST':>6}  {'ENGINE':<6}  TASK"


def started_line(job, position: int) -> str:
    """What `start` and `reply` answer: `st-1a2b3c4d running · shell · branch subtask/st-1a2b3c4d`
    (`· attempt N` for a reply)."""
    where = f"branch {job.spec.branch}" if job.spec.branch else "read-only"
    recorded = job.state.current.state
    if recorded == "waiting" or job.state.current.terminal:  # --after: waiting, or moved on at once
        return one_line(job)
    state = "running" if position == 0 else f"queued (#{position} in queue)"
    if placement(job.spec) is not None:
        state = f"submitted to ray as {ray_job_id(job.state.current)}"
    attempt = job.state.current.n
    return safe_line(f"{job.id} {state} · {job.spec.engine} · {where}"
                     + (f" · attempt {attempt}" if attempt > 1 else ""))


def left_out_lines(left_out) -> list[str]:
    """`start`'s notes: one line for each thing of the caller's checkout the job will not see
    (`git/leftout.LeftOut`: its uncommitted changes, the subfolder it stood in, the base's
    submodules)."""
    if left_out is None:
        return []
    lines = []
    if changed := left_out.uncommitted:
        n = len(changed)
        lines.append(f"note: {counted(n, 'uncommitted change')} here {'is' if n == 1 else 'are'} "
                     f"not in the job ({first_few(changed)}): it starts from {short(left_out.base)}")
    if left_out.subfolder:
        lines.append(f"note: started in {left_out.subfolder}: the job runs at the top of the "
                     "repository (paths in the task are read from there)")
    if subs := left_out.submodules:
        empty = "an empty folder" if len(subs) == 1 else "empty folders"
        lines.append(f"note: the base has {counted(len(subs), 'submodule')} the job's worktree does "
                     f"not check out ({first_few(subs)}): the job sees {empty} there")
    return [safe_line(line) for line in lines]


def ended_lines(job, position: int | None = None) -> str:
    """`wait`'s answer for a job: its one line, and under it why verify failed when it did."""
    best = best_line(job)  # a verify loop that never passed: where it left the branch
    return "\n".join([one_line(job, position), *([f"  {best}"] if best else []),
                      *verify_tail(job.state.current.verify)])


def stalled_hint(job) -> str:
    """What `wait` adds for a job it returned on because it stalled."""
    return safe_line(f"{job.id} is stalled and still running: stop it (git subtask stop {job.id}), "
                     f"or wait for it again (git subtask wait {job.id})")


def activity_text(event: dict) -> str | None:
    """What an event of a job's events file says it did ("running: pytest -q"); None: nothing to say."""
    kind = event.get("type")
    if kind == "stalled":  # silent since `since`; `after` is the threshold, never the time silent
        since, after = event.get("since"), event.get("after")
        silent = f" for {duration(time.time() - since)}" if isinstance(since, (int, float)) else ""
        return (f"stalled: no event from the engine{silent}"
                + (f" (stallAfter {after:g}s)" if isinstance(after, (int, float)) else ""))
    if kind == "command":
        return f"running: {event.get('command')}"
    if kind == "tool":
        return f"tool: {event.get('name')}"
    if kind in ("text", "output"):
        text = (event.get("text") or "").strip()
        return text.splitlines()[-1] if text else None
    if kind == "state" and event.get("state") == "retrying":  # the verify loop (docs/verify.md)
        return f"retrying as attempt {event.get('attempt')}: {event.get('why')}"
    if kind == "state":
        return str(event.get("state")) + (f": {event['command']}" if event.get("command") else "")
    return None


def event_line(event: dict) -> str:
    """One line of `wait --since`: `st-1a2b3c4d 14:02:07 attempt 1 done · verify passed`."""
    kind, t = event.get("type"), event.get("t")
    when = time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, (int, float)) else "--:--:--"
    if kind == "state" and event.get("state") in (*ACTIVE, *TERMINAL):
        words = f"attempt {event.get('attempt')} {event.get('state')}"
        if event.get("verify"):
            words += f" · verify {event['verify']}"
        if event.get("reason"):
            words += f": {event['reason']}"
    elif kind == "stalled":
        after = event.get("after")
        words = "stalled: no event from the engine" + (f" for {after:g}s" if isinstance(after, (int, float)) else "")
    elif kind == "stall_ended":
        words = "no longer stalled: the engine spoke again"
    elif kind == "isolation":
        words = f"isolation {event.get('mode')}" + (f": refused {event['refused']}" if event.get("refused") else "")
    else:
        text = event.get("text")
        said = activity_text(event) if kind != "output" else (text.rstrip("\n") if isinstance(text, str) else None)
        words = said if said is not None else f"{kind}: " + json.dumps(
            {k: v for k, v in event.items() if k not in ("type", "t", "job", "worker", "attempt")})
    return safe_line(f"{event.get('job', '')} {when} {words}".strip())


def land_progress(snapshot: dict) -> str:
    """`land`'s window in one line (a terminal's live line, an MCP progress message): `land 4.2s:
    3 of 12 landed · verifying st-1a2b3c4d 1.2s, st-5e6f7a8b 0.8s (window 4) · 5 run, 2 reused`."""
    parts = [f"land {duration(snapshot.get('elapsed'))}: {snapshot.get('landed', 0)} of {snapshot.get('total', 0)} "
             "landed"]
    if snapshot.get("failed"):
        parts[0] += f", {snapshot['failed']} not"
    verifying = snapshot.get("verifying") or []
    if verifying:
        shown = ", ".join(f"{v.get('id')} {duration(v.get('seconds'))}" for v in verifying[:6])
        more = f" +{len(verifying) - 6}" if len(verifying) > 6 else ""
        batch = f", batches of {snapshot['batch']}" if snapshot.get("batch") else ""
        parts.append(f"verifying {shown}{more} (window {snapshot.get('window')}{batch})")
    runs, reused = snapshot.get("runs", 0), snapshot.get("reused", 0)
    if runs or reused:
        parts.append(f"{runs} run" + (f", {reused} reused" if reused else ""))
    return safe_line(" · ".join(parts))
