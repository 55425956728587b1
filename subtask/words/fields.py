"""A record's parts in words: an attempt's cost, verify, judge, checks, stall, tokens, engine,
routing, evidence and landing, each as the short text `show`, `result`, the note and the
one-line status put together.

Invariant: a part that may be shown alone returns text already through `terminal.safe_line`
(`verify_line`, `judge_line`, `landing_line`, `attempt_brief`…); the rest are safe only inside
the line or page that uses them (`lines`, `pages`), which pass the whole through `terminal`.

Invariants:
- Never show one attempt's cost as the job's, because `spend` counts every attempt: `list`, the
  `show` header and the note's first line show the sum (`job_cost`).
"""

from __future__ import annotations

import time
from decimal import Decimal

from subtask.model import money as _money
from subtask.words.formats import duration, money, short
from subtask.words.terminal import safe_line


def verify_word(verify) -> str:
    if verify is None:
        return "no verify"
    return "verify passed" if verify.passed else "verify failed"


def error_words(attempt) -> str:
    """The kind of a failed attempt, in words: which checks failed (`check no-suppression failed`),
    not the bare kind `check`."""
    verify = attempt.verify if attempt.error_kind == "check" else None
    failed = verify.checks_failed if verify is not None else None
    return f"check {', '.join(failed)} failed" if failed else attempt.error_kind


def reason_text(attempt) -> str:
    """`failed: exit: the script exited with code 3` reads `exit: the script…`; a reason that
    already says its state (`stopped by request`) is not prefixed again."""
    label = attempt.error_kind or attempt.state
    reason = attempt.reason or ""
    return reason if reason.lower().startswith(label.lower()) else f"{label}: {reason}"


def attempt_cost(attempt) -> Decimal | None:
    cost = attempt.cost
    return cost.charged if cost.charged is not None else cost.observed


def job_cost(job) -> Decimal | None:
    """What the job cost over all its attempts, as `spend` counts it (None: nothing known yet):
    exactly the sum of the attempts' amounts, so the rows shown add up to it."""
    costs = [c for c in (attempt_cost(a) for a in job.state.attempts) if c is not None]
    return _money.total(costs) if costs else None


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


def routing_text(routed) -> str | None:
    """What `--engine auto` chose and why, from the record's `spec.routing`: `auto chose aider
    (score 0.85: pass 0.75, $0.00, 0.1 min, room 1.00); over codex 0.41, claude (authenticated:
    no credentials)`."""
    if not isinstance(routed, dict) or not isinstance(routed.get("chosen"), str):
        return None
    terms = routed.get("terms")
    if not isinstance(terms, dict):
        terms = {}

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
    others = routed.get("others")
    if not isinstance(others, dict):
        others = {}
    if others:
        text += "; over " + ", ".join(f"{name} {why:.2f}" if isinstance(why, (int, float)) else f"{name} ({why})"
                                      for name, why in others.items())
    return safe_line(text)


def after_text(job) -> str:
    """`after st-1a2b3c4d, sg-…` for a job started --after others (`, whatever they end`: --on-fail run)."""
    names = ", ".join(job.spec.after or [])
    return f"after {names}" + (" (whatever they end)" if job.spec.on_fail == "run" else "")


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


def verify_line(verify) -> str:
    if verify is None:
        return "not run"
    if verify.timed_out:
        text = (f"{verify.command} -> timed out after {duration(verify.seconds)} (--verify-timeout) "
                f"at {short(verify.head)}")
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
    judge = JUDGES.get(source, source) if isinstance(source, str) else str(source)
    where = f"{ref} at {commit}" if isinstance(ref, str) and ref else f"{judge} {commit}"
    text = f"tests from {where}"
    unused = [str(u) for u in facts.get("unused") or [] if isinstance(u, str)]
    more = facts.get("unused_more")
    if not isinstance(more, int):
        more = 0
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
            text += " · its own tests: " + ("timed out" if own.get("timed_out") else
                                            f"failed (exit {own.get('exit_code')})")
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


VERIFY_TAIL_LINES = 5


def verify_tail(verify, limit: int = VERIFY_TAIL_LINES, prefix: str = "  ") -> list[str]:
    """The last lines verify printed when it did not pass (its reason: `sh: 1: [[: not found`),
    each kept on its own line; nothing when it passed."""
    if verify is None or verify.passed:
        return []
    tail = [line for line in (verify.output_tail or "").strip().splitlines() if line.strip()][-limit:]
    return [prefix + safe_line(line.rstrip()) for line in tail]


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


def landing_line(entry) -> str:
    """`land`'s latest landing of a job: `main 9f8e7d6 + this job (merge) = 1a2b3c4 · verify make test
    -> exit 0 in 0.1s · landed`: the verify ran on the integrated commit after `=` (or was reused:
    a result for the same tree, or a batch's, whose tree it names)."""
    built = f"{entry.target} {short(entry.onto)} + this job ({entry.mode})"
    if entry.commit and entry.commit != entry.onto:
        built += f" = {short(entry.commit)}"
    if entry.outcome == "conflict":
        return safe_line(f"{built}: conflict in {', '.join(entry.conflicts[:5])}")
    verify = entry.verify
    if verify is not None:
        exit_text = "timed out" if verify.timed_out else f"exit {verify.exit_code}"
        said = (f"verify {'passed' if verify.passed else 'failed'}: {verify.command} -> {exit_text} "
                f"in {duration(verify.seconds)}")
        if verify.checks_failed:
            said += " · check " + ", ".join(verify.checks_failed) + " failed"
        if verify.reused:
            said = (f"verify reused: {'passed' if verify.passed else 'failed'} on the same tree at "
                    f"{short(str(verify.reused.get('commit') or ''))} ({verify.reused.get('job')}): {verify.command}")
        if entry.batch:
            said += f" · verified as part of batch {short(entry.batch)} (its last state {short(entry.batch_commit)})"
    else:
        said = {"unverified": "nothing verified (--force)",
                "already": "already there"}.get(entry.outcome, entry.outcome)
    return safe_line(f"{built} · {said}" + (" · landed" if entry.landed else " · not landed"))


def group_place_line(place: dict) -> str:
    """A best-of-N member's place: `sg-1a2b3c4d · rank 2 of 3 · pick st-… · rule smallest`; a map
    member's: `sg-1a2b3c4d · job 2 of 4 · map done`."""
    if place.get("kind") == "map":
        return safe_line(f"{place.get('group')} · job {place.get('index')} of {place.get('of')} "
                         f"· map {place.get('state')}")
    if place.get("pick"):
        outcome = "the pick" if place.get("pick") == place.get("member") else f"pick {place['pick']}"
    else:
        outcome = f"no pick ({place.get('state')})"
    rank = f"rank {place['rank']} of {place.get('of')}" if place.get("rank") else f"{place.get('of')} members"
    why = f" ({place['note']})" if place.get("note") else ""
    return safe_line(f"{place.get('group')} · {rank}{why} · {outcome} · rule {place.get('rule')}"
                     + (" · superseded" if place.get("superseded") else ""))
