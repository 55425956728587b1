"""The words: one place that turns jobs into the lines people and agents read.

Shared by the record subject, the CLI, the MCP server and the notes, so a job reads the same
everywhere. Pure functions of data; nothing here touches git or files.

Invariants:
- Every text shown to a person goes through `safe` (done by each renderer here on what it
  returns, and by the CLI and MCP faces on everything else they print): a task, a summary, a
  file name or a reason may come from a model or a teammate's pushed record, and a raw escape
  sequence in it would retitle, clear or rewrite the reader's terminal (`git log
  --notes=subtask` prints notes raw). JSON output keeps the exact value, escaped (`json_text`).
- A field that must stay on its line (a reason, a verify command, a file name) goes through
  `safe_line`, so it cannot start a line of its own, e.g. a forged `subtask st-…` note header.
"""

from __future__ import annotations

import json
import re
import time
from decimal import Decimal

from subtask.model import money as _money
from subtask.model.job import ACTIVE, TERMINAL, placement, ray_job_id

# C0 controls but newline and tab, DEL, C1 controls, and the bidi marks, embeddings, overrides and
# isolates (and the line/paragraph separators some terminals break lines at).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_LINE = re.compile(_UNSAFE.pattern[:-1] + "\n\t]")

SUMMARY_MAX_LINES = 10  # the lines of an engine's output a summary keeps


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code == 0x0A:
        return "\\n"
    if code == 0x09:
        return "\\t"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: str) -> str:
    """`text` with every control character made visible (`\\x1b`, `\\u202e`); newlines and tabs kept."""
    return _UNSAFE.sub(_visible, text) if text else text


def safe_line(text: str) -> str:
    """Like `safe`, and newlines and tabs shown as `\\n`, `\\t`: the text stays on its line."""
    return _UNSAFE_LINE.sub(_visible, text) if text else text


def json_text(obj, **options) -> str:
    """JSON with the exact values, and no raw control character for a terminal to obey: json
    escapes C0 itself; C1 and bidi characters, legal raw in JSON, are escaped too."""
    options.setdefault("default", _money.json_default)  # an amount as its exact JSON number
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(obj, ensure_ascii=False, **options))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds:.2f}s"
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d"


def money(usd) -> str:
    """An amount exactly (`subtask.model.money.text`): $0.27, $0.135; "-" for none."""
    return _money.text(usd)


def size(n: int | None) -> str:
    """Bytes for a person: `0 B`, `812 B`, `4.0 KiB`, `1.2 MiB`, `15.3 GiB` (None: `-`)."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def short(sha: str | None) -> str:
    return (sha or "")[:7]


def task_title(task: str, width: int = 60) -> str:
    line = task.strip().splitlines()[0] if task.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def verify_word(verify) -> str:
    if verify is None:
        return "no verify"
    return "verify passed" if verify.passed else "verify failed"


def attempt_cost(attempt) -> Decimal | None:
    cost = attempt.cost
    return cost.charged if cost.charged is not None else cost.observed


def job_cost(job) -> Decimal | None:
    """What the job cost over all its attempts, as `spend` counts it (None: nothing known yet):
    exactly the sum of the attempts' amounts, so the rows shown add up to it."""
    costs = [c for c in (attempt_cost(a) for a in job.state.attempts) if c is not None]
    return _money.total(costs) if costs else None


def stall_facts(attempt) -> dict | None:
    """A stalled attempt's numbers: when its engine last spoke (`since`), how long it has been
    silent so far or was until the attempt ended (`silent_s`), the threshold (`after_s`, the
    `subtask.stallAfter` it ran with), and `action`. None when it is not stalled."""
    stalled = attempt.stalled if isinstance(attempt.stalled, dict) else None
    if not stalled:
        return None
    since, after = stalled.get("since"), stalled.get("after")
    until = attempt.ended_at if attempt.terminal else time.time()
    number = (int, float)
    silent = until - since if isinstance(since, number) and isinstance(until, number) else None
    return {"since": since, "silent_s": round(max(0.0, silent), 1) if silent is not None else None,
            "after_s": after if isinstance(after, number) else None,
            "action": stalled.get("action")}


def stalled_text(attempt) -> str:
    """`stalled: no event from the engine for 10m05s`: so far, or until the attempt ended."""
    facts = stall_facts(attempt) or {}
    silent = facts.get("silent_s") if facts.get("silent_s") is not None else facts.get("after_s")
    return f"stalled: no event from the engine for {duration(silent)}"


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
        words = activity_text(event) if kind != "output" else (text.rstrip("\n") if isinstance(text, str) else None)
        words = words if words is not None else f"{kind}: " + json.dumps(
            {k: v for k, v in event.items() if k not in ("type", "t", "job", "worker", "attempt")})
    return safe_line(f"{event.get('job', '')} {when} {words}".strip())


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


def error_words(attempt) -> str:
    """The kind of a failed attempt, in words: which checks failed (`check no-suppression failed`),
    not the bare kind `check`."""
    verify = attempt.verify if attempt.error_kind == "check" else None
    failed = verify.checks_failed if verify is not None else None
    return f"check {', '.join(failed)} failed" if failed else attempt.error_kind


def after_text(job) -> str:
    """`after st-1a2b3c4d, sg-…` for a job started --after others (`, whatever they end`: --on-fail run)."""
    names = ", ".join(job.spec.after or [])
    return f"after {names}" + (" (whatever they end)" if job.spec.on_fail == "run" else "")


def stalled_hint(job) -> str:
    """What `wait` adds for a job it returned on because it stalled."""
    return safe_line(f"{job.id} is stalled and still running: stop it (git subtask stop {job.id}), "
                     f"or wait for it again (git subtask wait {job.id})")


def ended_lines(job, position: int | None = None) -> str:
    """`wait`'s answer for a job: its one line, and under it why verify failed when it did."""
    best = best_line(job)  # a verify loop that never passed: where it left the branch
    return "\n".join([one_line(job, position), *([f"  {best}"] if best else []), *verify_tail(job.state.current.verify)])


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
    return safe_line(f"{job.id} {state} · {job.spec.engine} · {where}" + (f" · attempt {attempt}" if attempt > 1 else ""))


def left_out_lines(left_out) -> list[str]:
    """`start`'s notes: one line for each thing of the caller's checkout the job will not see
    (`git/leftout.LeftOut`: its uncommitted changes, the subfolder it stood in, the base's
    submodules)."""
    if left_out is None:
        return []
    lines = []
    if changed := left_out.uncommitted:
        n = len(changed)
        lines.append(f"note: {_count(n, 'uncommitted change')} here {'is' if n == 1 else 'are'} "
                     f"not in the job ({_some(changed)}): it starts from {short(left_out.base)}")
    if left_out.subfolder:
        lines.append(f"note: started in {left_out.subfolder}: the job runs at the top of the "
                     "repository (paths in the task are read from there)")
    if subs := left_out.submodules:
        empty = "an empty folder" if len(subs) == 1 else "empty folders"
        lines.append(f"note: the base has {_count(len(subs), 'submodule')} the job's worktree does "
                     f"not check out ({_some(subs)}): the job sees {empty} there")
    return [safe_line(line) for line in lines]


def _count(n: int, word: str) -> str:
    """`1 commit`, `2 commits`."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _some(names: list[str], shown: int = 3) -> str:
    """`a, b, c, and 2 more`."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f", and {more} more" if more > 0 else "")


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
        more = f" and {_count(len(others) - 1, 'other')}" if len(others) > 1 else ""
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


def summary_lines(text: str, limit: int = SUMMARY_MAX_LINES) -> str:
    lines = [line.rstrip() for line in (text or "").strip().splitlines()]
    if len(lines) > limit:
        lines = lines[:limit - 1] + [f"… ({len(lines) - limit + 1} more lines: git subtask result <id> --full)"]
    return "\n".join(lines)


def changes_line(evidence) -> str:
    if evidence is None:
        return "-"
    totals = evidence.totals or {}
    files, commits = totals.get('files', 0), totals.get('commits', 0)
    text = (f"{files} file{'' if files == 1 else 's'}, +{totals.get('added', 0)} -{totals.get('deleted', 0)} "
            f"since {short(evidence.base)}, {commits} commit{'' if commits == 1 else 's'}")
    if evidence.autocommit:
        text += f" (worker committed leftovers in {short(evidence.autocommit.get('sha'))})"
    return text


def isolation_line(evidence) -> str | None:
    """What confined the engine, what it refused, and whether the main worktree changed meanwhile."""
    iso = getattr(evidence, "isolation", None) if evidence is not None else None
    main = getattr(evidence, "main_worktree", None) if evidence is not None else None
    if not iso and not main:
        return None  # recorded before isolation existed
    parts = []
    if iso:
        mode = iso.get("mode", "none")
        own = iso.get("engine_sandbox")  # codex's own, when ours was not used
        if mode != "none":
            parts.append(f"{mode} ({iso.get('enforced_by', '?')})")
        else:
            parts.append(f"none ({own} sandbox)" if own else mode)
        refused, claimed = iso.get("refused") or [], iso.get("claimed") or []
        if refused:
            parts.append(f"{len(refused)} access{'' if len(refused) == 1 else 'es'} refused by its view")
        if claimed:
            parts.append(f"{len(claimed)} refusal{'' if len(claimed) == 1 else 's'} claimed in the output")
    if main is not None:
        if main.get("changed"):
            paths = main.get("paths") or []
            parts.append("main worktree CHANGED while the job ran (by the job or someone else): "
                         + ", ".join(paths[:5]) + (" …" if len(paths) > 5 else ""))
        else:
            parts.append("main worktree unchanged")
    return " · ".join(parts)


def verify_line(verify) -> str:
    if verify is None:
        return "not run"
    if verify.timed_out:
        text = f"{verify.command} -> timed out after {duration(verify.seconds)} (--verify-timeout) at {short(verify.head)}"
    else:
        text = f"{verify.command} -> exit {verify.exit_code} in {duration(verify.seconds)} at {short(verify.head)}"
    if verify.checks_failed:
        text += " · check " + ", ".join(verify.checks_failed) + " failed"
    return safe_line(text)


JUDGES = {"base": "the base", "target": "the target"}


def judge_line(verify) -> str | None:
    """Who judged a verify, in one line (show, result, the note): `tests from the base 1a2b3c4 ·
    not used, the job's: tests/test_x.py · its own tests: failed (exit 1)`; `judged by its own
    tests` for a job started with `--harness job`; None for a record from before the harness."""
    facts = getattr(verify, "harness", None) if verify is not None else None
    if not isinstance(facts, dict):
        return None
    source = facts.get("source")
    if source == "job":
        return "judged by its own tests (--harness job)"
    commit = short(facts.get("commit") if isinstance(facts.get("commit"), str) else None)
    ref = facts.get("ref")
    where = f"{ref} at {commit}" if isinstance(ref, str) and ref else f"{JUDGES.get(source, str(source))} {commit}"
    text = f"tests from {where}"
    unused = [str(u) for u in facts.get("unused") or [] if isinstance(u, str)]
    more = facts.get("unused_more") if isinstance(facts.get("unused_more"), int) else 0
    if isinstance(facts.get("error"), str):
        text += f" · not run: {facts['error']}"
    elif facts.get("files") == 0 and not unused:
        text = f"{where} holds no tests or test configuration: the command alone judged it"
    elif unused:
        rest = len(unused) - 3 + more
        text += " · not used, the job's: " + ", ".join(unused[:3]) + (f" (+{rest} more)" if rest > 0 else "")
        if isinstance(facts.get("tree"), str):  # the job's code with the trusted tests: a tree of its own
            text += f" · ran on tree {short(facts['tree'])}"
    else:
        text += " · the job changed none of them"
    own = facts.get("own")
    if isinstance(own, dict):
        if own.get("passed") is True:
            text += " · its own tests: passed"
        else:
            text += " · its own tests: " + ("timed out" if own.get("timed_out") else f"failed (exit {own.get('exit_code')})")
    return safe_line(text)


def verify_brief(verify) -> str:
    """`verify failed (exit 1; 2 passed, 3 failed)`, `verify failed (check no-suppression)`."""
    if verify is None:
        return "no verify"
    why = []
    if verify.checks_failed:
        why.append("check " + ", ".join(verify.checks_failed))
    elif not verify.passed:
        why.append("timed out" if verify.timed_out else f"exit {verify.exit_code}")
    tests = verify.tests if isinstance(verify.tests, dict) else None
    if tests:
        why.append(f"{tests.get('passed', 0)} passed, {tests.get('failed', 0)} failed")
    return verify_word(verify) + (f" ({'; '.join(why)})" if why else "")


def attempt_brief(attempt) -> str:
    """One attempt in one line: `2: retry 1 · done · verify passed · $0.42 · 1a2b3c4`."""
    state = attempt.state
    if state == "failed" and attempt.error_kind and attempt.error_kind != "check":
        state += f" ({attempt.error_kind})"
    parts = [f"{attempt.n}: " + (f"retry {attempt.retry} · " if attempt.retry else "") + state]
    if attempt.terminal:
        parts.append(verify_brief(attempt.verify))
        parts.append(money(attempt_cost(attempt)))
    if attempt.head:
        parts.append(short(attempt.head))
    if attempt.not_retried:
        parts.append(f"not retried: {attempt.not_retried}")
    return safe_line(" · ".join(parts))


def best_line(job) -> str | None:
    """`left at attempt 2: most tests passed (4 passed, 1 failed)` when a loop's attempts all failed."""
    best = job.state.best if isinstance(job.state.best, dict) else None
    if not best:
        return None
    moved = f" (the branch moved back from {short(best.get('moved_from'))})" if best.get("moved_from") else ""
    return safe_line(f"left at attempt {best.get('attempt')}: {best.get('why')}{moved}")


def claims_line(evidence) -> str | None:
    """`"all tests pass" — verify failed`: what the engine claimed and the record contradicts."""
    found = getattr(evidence, "claims", None) if evidence is not None else None
    if not found:
        return None  # (no import: a reading command need not compile the claims' patterns)
    from subtask.model.claims import line

    return line(found)


def checks_text(found) -> str:
    """Each check's verdict: `no-test-deletion passed, no-suppression failed: src/a.py:3 adds # noqa`."""
    parts = []
    for r in found or ():
        if not isinstance(r, dict):
            continue
        text = f"{r.get('check')} {'passed' if r.get('passed') else 'failed'}"
        items = [str(f) for f in r.get("found") or []]
        if items and not r.get("passed"):
            text += ": " + "; ".join(items[:3]) + (f" (+{len(items) - 3} more)" if len(items) > 3 else "")
        parts.append(text)
    return safe_line(", ".join(parts))


VERIFY_TAIL_LINES = 5


def verify_tail(verify, limit: int = VERIFY_TAIL_LINES, prefix: str = "  ") -> list[str]:
    """The last lines verify printed when it did not pass (its reason: `sh: 1: [[: not found`),
    each kept on its own line; nothing when it passed."""
    if verify is None or verify.passed:
        return []
    tail = [line for line in (verify.output_tail or "").strip().splitlines() if line.strip()][-limit:]
    return [prefix + safe_line(line.rstrip()) for line in tail]


def cost_line(attempt) -> str:
    """The attempt's money in words: a paid attempt (it has a reservation id) is never "free"."""
    cost = attempt.cost
    if attempt.state == "waiting":
        return "nothing reserved while it waits"
    if attempt.rid and not attempt.terminal:
        return f"{money(cost.reserved)} reserved"
    if cost.billing in ("free", "reserved"):
        return f"{money(cost.charged or 0)} (reservation released)" if attempt.rid else "$0.00 (free engine)"
    if cost.billing == "not_started":
        return "$0.00 (the engine never started: nothing spent)"
    if cost.billing == "not_billed":
        return "$0.00 (the model never answered: nothing billed)"
    if cost.billing == "charged":
        return f"{money(cost.charged)} charged (cost unknown: whole reservation)"
    text = f"{money(cost.charged if cost.charged is not None else cost.observed)} observed"
    if cost.credit:
        # a resumed session's figures counted again what earlier attempts were charged whole
        text += f" (less {money(cost.credit)} charged already to earlier attempts of the session)"
    return text


_TOKEN_WORDS = (("input", "in"), ("cached_input", "cached in"), ("cache_read", "cache read"),
                ("cache_creation", "cache write"), ("output", "out"))


def tokens_text(tokens) -> str:
    """`12,345 in, 1,000 cached in, 567 out`, or "" when the engine reported none."""
    if not isinstance(tokens, dict) or not tokens:
        return ""
    known = dict(_TOKEN_WORDS)
    keys = [key for key, _ in _TOKEN_WORDS if key in tokens] + sorted(k for k in tokens if k not in known)
    parts = []
    for key in keys:
        value = tokens[key]
        if isinstance(value, int) and not isinstance(value, bool):
            parts.append(f"{value:,} {known.get(key, key)}")
    return safe_line(", ".join(parts))


def engine_line(job) -> str:
    attempt = job.state.current
    text = job.spec.engine
    model = attempt.model or job.spec.model
    if model:
        text += f" ({model})"
    if attempt.turns:
        text += f", {attempt.turns} turns"
    return text


def note_block(job, provenance=None, landed: str | None = None, from_head: str | None = None) -> str:
    """The review block under the job's head commit in `git log --notes=subtask`; `provenance`
    (`signing.Provenance` of the record tip, as this clone checked it) adds a `signed:` line.
    `landed`: the commit it landed in, when the record does not say (a teammate's job landed
    here); `from_head`: this copy stands on that commit, a new one made from the job's head."""
    attempt = job.state.current
    elapsed = (attempt.ended_at - attempt.started_at) if attempt.started_at and attempt.ended_at else None
    head = f"subtask {job.id} · {attempt.state}"
    if attempt.outcome:
        head += f" ({attempt.outcome})"
    head += f" · {verify_word(attempt.verify)} · {money(job_cost(job))} · {duration(elapsed)}"
    lines = [head, f"task:    {task_title(job.spec.task, 100)}", f"engine:  {engine_line(job)}"]
    routed = routing_text(job.spec.extra.get("routing"))
    if routed:
        lines.append(f"routing: {routed}")
    if attempt.retry:  # the verify loop's: its message is the task again, or what verify said
        lines.append(f"attempt: {attempt.n} (retry {attempt.retry} of {job.spec.retries}, while verify failed)")
    elif attempt.n > 1:
        lines.append(f"attempt: {attempt.n}: {task_title(attempt.message, 90)}")
    lines.append(f"verify:  {verify_line(attempt.verify)}")
    judged = judge_line(attempt.verify)
    if judged:
        lines.append(f"judge:   {judged}")
    lines.append(f"cost:    {cost_line(attempt)}" + (f" · job {money(job_cost(job))} over {attempt.n} attempts"
                                                      if attempt.n > 1 else ""))
    if attempt.stalled:
        lines.append(safe_line(stalled_text(attempt)
                               + (" (subtask.stallAction stop ended it)" if attempt.stalled.get("action") == "stop" else "")))
    if tokens_text(attempt.tokens):
        lines.append(f"tokens:  {tokens_text(attempt.tokens)}")
    lines.append(f"changes: {changes_line(job.evidence)}")
    confinement = isolation_line(job.evidence)
    if confinement:
        lines.append(f"sandbox: {confinement}")
    if attempt.state == "failed" and (attempt.reason or attempt.error_kind):
        lines.append(safe_line(f"error:   {reason_text(attempt)}".rstrip(": ")))
    if attempt.state == "skipped" and attempt.reason:
        lines.append(safe_line(f"skipped: {attempt.reason}"))
    if job.spec.after:
        lines.append(safe_line(f"after:   {after_text(job)[len('after '):]}"))
    lines.extend(_loop_lines(job, "attempts:", "  ", "left:    "))
    said = claims_line(job.evidence)
    if said:
        lines.append(safe_line(f"claims:  {said}"))
    summary = summary_lines(job.summary)
    if summary:
        first, *rest = summary.splitlines()
        lines.append(f"summary: {first}")
        lines.extend(f"         {line}" for line in rest)
    if job.state.landings:
        lines.append(f"land:    {landing_line(job.state.landings[-1])}")
    landed = landed or job.state.landed_in
    if from_head:
        lines.append(f"landed:  here, from its head {short(from_head)} (a new commit"
                     + ("; verify ran at that head)" if attempt.verify else ")"))
    elif landed:
        lines.append(f"landed:  in {short(landed)}")
    if provenance is not None and provenance.signed:
        lines.append(safe_line(f"record:  {provenance.words()}"))
    if job.state.group_place:
        lines.append(f"group:   {group_place_line(job.state.group_place)}")
    lines.append(f"more:    git subtask show {job.id} · git subtask diff {job.id}")
    return safe("\n".join(lines))


def routing_text(routed) -> str | None:
    """What `--engine auto` chose and why, from the record's `spec.routing`: `auto chose aider
    (score 0.85: pass 0.75, $0.00, 0.1 min, room 1.00); over codex 0.41, claude (authenticated:
    no credentials)`."""
    if not isinstance(routed, dict) or not isinstance(routed.get("chosen"), str):
        return None
    terms = routed.get("terms") if isinstance(routed.get("terms"), dict) else {}

    def value(term: str) -> float | None:
        found = terms.get(term)
        return found.get("value") if isinstance(found, dict) and isinstance(found.get("value"), (int, float)) else None

    said = [f"pass {value('pass'):.2f}" if value("pass") is not None else None,
            f"${value('cost'):.2f}" if value("cost") is not None else None,
            f"{value('time'):.1f} min" if value("time") is not None else None,
            f"room {value('room'):.2f}" if value("room") is not None else None]
    score = routed.get("score")
    text = f"auto chose {routed['chosen']} (score {score:.2f}" if isinstance(score, (int, float)) else \
        f"auto chose {routed['chosen']} ("
    text += ": " + ", ".join(w for w in said if w) + ")"
    others = routed.get("others") if isinstance(routed.get("others"), dict) else {}
    if others:
        text += "; over " + ", ".join(f"{name} {why:.2f}" if isinstance(why, (int, float)) else f"{name} ({why})"
                                      for name, why in others.items())
    return safe_line(text)


def landing_line(entry) -> str:
    """`land`'s latest landing of a job: `main 9f8e7d6 + this job (merge) = 1a2b3c4 · verify make test
    -> exit 0 in 0.1s · landed`: the verify ran on the integrated commit after `=`."""
    built = f"{entry.target} {short(entry.onto)} + this job ({entry.mode})"
    if entry.commit and entry.commit != entry.onto:
        built += f" = {short(entry.commit)}"
    if entry.outcome == "conflict":
        return safe_line(f"{built}: conflict in {', '.join(entry.conflicts[:5])}")
    verify = entry.verify
    if verify is not None:
        exit_text = "timed out" if verify.timed_out else f"exit {verify.exit_code}"
        said = f"verify {'passed' if verify.passed else 'failed'}: {verify.command} -> {exit_text} in {duration(verify.seconds)}"
        if verify.checks_failed:
            said += " · check " + ", ".join(verify.checks_failed) + " failed"
    else:
        said = {"unverified": "nothing verified (--force)", "already": "already there"}.get(entry.outcome, entry.outcome)
    return safe_line(f"{built} · {said}" + (" · landed" if entry.landed else " · not landed"))


def _loop_lines(job, title: str, indent: str, best_label: str) -> list[str]:
    """A job with more than one attempt: each in one line; where its loop left the branch."""
    if len(job.state.attempts) < 2:
        return []
    lines = [title, *(indent + attempt_brief(a) for a in job.state.attempts)]
    best = best_line(job)
    if best:
        lines.append(best_label + best)
    return lines


def group_place_line(place: dict) -> str:
    """A best-of-N member's place: `sg-1a2b3c4d · rank 2 of 3 · pick st-… · rule smallest`; a map
    member's: `sg-1a2b3c4d · job 2 of 4 · map done`."""
    if place.get("kind") == "map":
        return safe_line(f"{place.get('group')} · job {place.get('index')} of {place.get('of')} · map {place.get('state')}")
    if place.get("pick"):
        outcome = "the pick" if place.get("pick") == place.get("member") else f"pick {place['pick']}"
    else:
        outcome = f"no pick ({place.get('state')})"
    rank = f"rank {place['rank']} of {place.get('of')}" if place.get("rank") else f"{place.get('of')} members"
    why = f" ({place['note']})" if place.get("note") else ""
    return safe_line(f"{place.get('group')} · {rank}{why} · {outcome} · rule {place.get('rule')}"
                     + (" · superseded" if place.get("superseded") else ""))


def moved_line(job, moved: str | None) -> list[str]:
    """What `result` and `show` say under a job whose branch moved after its verify passed."""
    if not moved:
        return []
    verify = job.state.current.verify
    return [f"verify passed on {short(verify.head)}, but the branch moved to {short(moved)} since: that tip is "
            f"untested (merge refuses it; git subtask diff {job.id})"]


def result_text(job, full: bool = False, moved: str | None = None) -> str:
    """What `result` prints: the one-line status, then the summary (at most 10 lines)."""
    attempt = job.state.current
    lines = [one_line(job), *moved_line(job, moved)]
    if attempt.state == "failed" and attempt.reason:
        lines.append(safe_line(f"error: {reason_text(attempt)}"))
        if attempt.hint:
            lines.append(safe_line(f"hint: {attempt.hint.replace('<id>', job.id)}"))
    if attempt.verify is not None and not attempt.verify.passed:
        lines.append(f"verify: {verify_line(attempt.verify)}")
        lines.extend(verify_tail(attempt.verify))
    judged = judge_line(attempt.verify)
    if judged:
        lines.append(f"judge: {judged}")
    if len(job.state.attempts) > 1:
        lines.append("attempts: " + " | ".join(attempt_brief(a) for a in job.state.attempts))
    best = best_line(job)
    if best:
        lines.append(best)
    said = claims_line(job.evidence)
    if said:
        lines.append(safe_line(f"claims: {said}"))
    if job.evidence is not None:
        lines.append(f"changes: {changes_line(job.evidence)}")
        refused = (job.evidence.isolation or {}).get("refused") or []
        if refused:
            lines.append(f"isolation {job.evidence.isolation.get('mode')} refused (see git subtask show {job.id}):")
            lines.extend("  " + safe_line(line) for line in refused[:3])
    text = job.summary.strip() if full else summary_lines(job.summary)
    if text:
        lines.append(text)
    return safe("\n".join(lines))


def worktree_note(job, present: bool | None) -> str:
    """What `show` adds after the worktree path: ` (removed)` when it is not on disk (cleaned up,
    or a read-only job's, which goes when the job ends), ` (not created yet)` for a queued job."""
    if present or (present is None and not job.state.worktree_removed):
        return ""
    if job.state.current.state in ("queued", "waiting") and not job.state.worktree_removed:
        return " (not created yet)"
    return " (removed)"


def branch_note(job) -> str:
    """What `show` adds after the branch name once cleanup, gc or a landing deleted it."""
    if not job.state.branch_deleted:
        return ""
    return " (deleted after landing)" if job.state.landed_in else " (deleted: no commits beyond its base)"


def reason_text(attempt) -> str:
    """`failed: exit: the script exited with code 3` reads `exit: the script…`; a reason that
    already says its state (`stopped by request`) is not prefixed again."""
    label = attempt.error_kind or attempt.state
    reason = attempt.reason or ""
    return reason if reason.lower().startswith(label.lower()) else f"{label}: {reason}"


def record_line(provenance, mine: bool | None) -> str:
    """Who wrote the record: its signature (`signing.Provenance`) and whether this clone started the job."""
    parts = [provenance.words() if provenance is not None else "signature not checked"]
    if mine is not None:
        parts.append("started in this clone" if mine else
                     "another clone's job: its record is a claim (merge re-runs its verify unless an allowed signer signed it)")
    return safe_line("record:    " + " · ".join(parts))


def show_text(job, position: int | None = None, worktree_present: bool | None = None, provenance=None,
              mine: bool | None = None, moved: str | None = None) -> str:
    """`git subtask show`: the record in words (`worktree_present`: whether it is on disk;
    `provenance` and `mine`: who wrote the record, `record_line`; `moved`: the branch's tip when
    it moved after verify passed)."""
    spec = job.spec
    lines = [one_line(job, position), *moved_line(job, moved), ""]
    lines.append(f"task:      {spec.task.strip()}" if "\n" not in spec.task.strip() else "task:\n" + _indent(spec.task.strip()))
    lines.append(f"engine:    {engine_line(job)}")
    routed = routing_text(job.spec.extra.get("routing"))
    if routed:
        lines.append(f"routing:   {routed}")
    lines.append(f"base:      {short(spec.base)} ({spec.base_ref})" if job.state.current.state != "waiting" else
                 "base:      the head of what it waits for, once that ended")
    waiting = job.state.current.state == "waiting"
    if spec.after:
        lines.append(safe_line(f"after:     {after_text(job)[len('after '):]}"))
    lines.append(f"branch:    {spec.branch or '(read-only job: none)'}"
                 + (" (made when it starts)" if waiting and spec.branch else branch_note(job)))
    where = placement(spec)
    if where is None:
        lines.append(safe_line(f"worktree:  {spec.worktree}{worktree_note(job, worktree_present)}"))
    else:  # a node's worktree, in its own cache: nothing of it is here
        node = job.state.current.extra.get("node") or {}
        lines.append(safe_line(f"ran on:    ray {where.get('address')} as {ray_job_id(job.state.current)}"
                               + (f" · node {node.get('host')}: {node.get('mirror')}" if isinstance(node, dict) and node else
                                  " · no node has claimed it yet")))
    lines.append(safe_line(f"isolation: {spec.isolation}" + (f" ({spec.isolation_source})" if spec.isolation_source else "")))
    if provenance is not None or mine is not None:
        lines.append(record_line(provenance, mine))
    if spec.verify:
        lines.append(safe_line(f"verify:    {spec.verify}"))
    if job.state.landed_in:
        lines.append(f"landed:    in {short(job.state.landed_in)}")
    if spec.checks:
        lines.append(safe_line(f"checks:    {', '.join(spec.checks)}"))
    if spec.retries:
        lines.append(f"retries:   {spec.retries} (while verify fails)")
    for attempt in job.state.attempts:
        elapsed = (attempt.ended_at - attempt.started_at) if attempt.started_at and attempt.ended_at else None
        text = f"attempt {attempt.n}" + (f" (retry {attempt.retry})" if attempt.retry else "") + f": {attempt.state}"
        if attempt.outcome:
            text += f" ({attempt.outcome})"
        if attempt.terminal:
            text += f" · {verify_brief(attempt.verify)}"
        text += f" · {duration(elapsed)} · {cost_line(attempt)}"
        lines.append(safe_line(text))
        if attempt.checks:
            lines.append(f"  checks:  {checks_text(attempt.checks)}")
        if attempt.not_retried:
            lines.append(safe_line(f"  not retried: {attempt.not_retried}"))
        if attempt.stalled:
            lines.append(safe_line(f"  {stalled_text(attempt)}"))
        if attempt.n > 1:
            lines.append(f"  message: {task_title(attempt.message, 90)}")
        if attempt.reason:
            lines.append(safe_line(f"  reason:  {reason_text(attempt)}"))
        if attempt.hint:
            lines.append(safe_line(f"  hint:    {attempt.hint.replace('<id>', job.id)}"))
        if attempt.verify:
            lines.append(f"  verify:  {verify_line(attempt.verify)}")
            lines.extend(verify_tail(attempt.verify, prefix="    "))
            judged = judge_line(attempt.verify)
            if judged:
                lines.append(f"  judge:   {judged}")
        if tokens_text(attempt.tokens):
            lines.append(f"  tokens:  {tokens_text(attempt.tokens)}")
        if attempt.session_id:
            lines.append(safe_line(f"  session: {attempt.session_id}"))
    best = best_line(job)
    if best:
        lines.append(best)
    evidence = job.evidence
    said = claims_line(evidence)
    if said:
        lines.append(safe_line(f"claims:    {said}"))
    if evidence is not None:
        lines.append(f"changes:   {changes_line(evidence)}")
        for commit in evidence.commits[:20]:
            lines.append(safe_line(f"  {short(commit['sha'])} {commit['subject']}"))
        for entry in evidence.files[:50]:
            lines.append(safe_line(f"  {entry['status']} {entry['path']} (+{entry['added']} -{entry['deleted']})"))
        more = (evidence.totals or {}).get("files", len(evidence.files)) - min(len(evidence.files), 50)
        if more > 0:
            lines.append(f"  … and {more} more (git subtask diff {job.id} --stat)")
        confinement = isolation_line(evidence)
        if confinement:
            lines.append(safe_line(f"confinement: {confinement}"))
            iso = evidence.isolation or {}
            grants = iso.get("writable", [])
            for grant in grants:
                if grant.get("why") != "device":
                    lines.append(safe_line(f"  writable: {grant.get('path')} ({grant.get('why')})"))
            devices = [g.get("path") for g in grants if g.get("why") == "device"]
            if devices:
                lines.append(safe_line(f"  writable devices: {', '.join(devices)}"))
            for path in iso.get("missing", []):
                lines.append(safe_line(f"  not granted (missing): {path}"))
            for path in iso.get("sockets") or []:
                lines.append(safe_line(f"  socket: {path} (subtask.isolation.socket)"))
            readable = [g.get("path") for g in iso.get("readable") or [] if g.get("why") not in ("system", "tools", "git dir")]
            if readable:
                lines.append(safe_line(f"  readable: {', '.join(str(p) for p in readable)}"))
            if iso.get("env_withheld"):
                lines.append(safe_line(f"  environment withheld: {', '.join(iso['env_withheld'])}"))
            for line in iso.get("refused", []):
                lines.append(safe_line(f"  refused: {line}"))
            for line in iso.get("claimed") or []:
                lines.append(safe_line(f"  claimed in its output: {line}"))
    if job.summary.strip():
        lines.append("summary:")
        lines.append(_indent(summary_lines(job.summary)))
    return safe("\n".join(lines))


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())
