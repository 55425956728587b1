"""The long texts a person reads whole: `show`, `result` and the review note block under a
job's head commit (`git log --notes=subtask`).

Invariant: each page goes through `terminal.safe` as a whole, and each field that must stay on
its line through `terminal.safe_line` first.
"""

from __future__ import annotations

from subtask.model.job import placement, ray_job_id
from subtask.words.fields import (
    after_text,
    attempt_brief,
    best_line,
    changes_line,
    checks_text,
    claims_line,
    cost_line,
    engine_line,
    group_place_line,
    isolation_line,
    job_cost,
    judge_line,
    landing_line,
    reason_text,
    routing_text,
    stalled_text,
    tokens_text,
    verify_brief,
    verify_line,
    verify_tail,
    verify_word,
)
from subtask.words.formats import duration, indented, money, short, summary_lines, task_title
from subtask.words.lines import one_line
from subtask.words.terminal import safe, safe_line


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
                               + (" (subtask.stallAction stop ended it)" if attempt.stalled.get("action") == "stop"
                                  else "")))
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


def moved_line(job, moved: str | None) -> list[str]:
    """What `result` and `show` say under a job whose branch moved after its verify passed."""
    if not moved:
        return []
    verify = job.state.current.verify
    return [f"verify passed on {short(verify.head)}, but the branch moved to {short(moved)} since: that tip is "
            f"untested (merge refuses it; git subtask diff {job.id})"]


def show_text(job, position: int | None = None, worktree_present: bool | None = None, provenance=None,
              mine: bool | None = None, moved: str | None = None) -> str:
    """`git subtask show`: the record in words (`worktree_present`: whether it is on disk;
    `provenance` and `mine`: who wrote the record, `record_line`; `moved`: the branch's tip when
    it moved after verify passed)."""
    spec = job.spec
    lines = [one_line(job, position), *moved_line(job, moved), ""]
    lines.append(f"task:      {spec.task.strip()}" if "\n" not in spec.task.strip() else
                 "task:\n" + indented(spec.task.strip()))
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
                               + (f" · node {node.get('host')}: {node.get('mirror')}"
                                  if isinstance(node, dict) and node else " · no node has claimed it yet")))
    lines.append(safe_line(f"isolation: {spec.isolation}"
                           + (f" ({spec.isolation_source})" if spec.isolation_source else "")))
    if provenance is not None or mine is not None:
        lines.append(record_line(provenance, mine))
    if spec.verify:
        lines.append(safe_line(f"verify:    {spec.verify}"))
    if job.state.landed_in:
        lines.append(f"landed:    in {short(job.state.landed_in)}")
    if job.state.landings:
        lines.append(f"land:      {landing_line(job.state.landings[-1])}")
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
            readable = [g.get("path") for g in iso.get("readable") or []
                        if g.get("why") not in ("system", "tools", "git dir")]
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
        lines.append(indented(summary_lines(job.summary)))
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


def record_line(provenance, mine: bool | None) -> str:
    """Who wrote the record: its signature (`signing.Provenance`) and whether this clone started the job."""
    parts = [provenance.words() if provenance is not None else "signature not checked"]
    if mine is not None:
        parts.append("started in this clone" if mine else
                     "another clone's job: its record is a claim "
                     "(merge re-runs its verify unless an allowed signer signed it)")
    return safe_line("record:    " + " · ".join(parts))


def _loop_lines(job, title: str, indent: str, best_label: str) -> list[str]:
    """A job with more than one attempt: each in one line; where its loop left the branch."""
    if len(job.state.attempts) < 2:
        return []
    lines = [title, *(indent + attempt_brief(a) for a in job.state.attempts)]
    best = best_line(job)
    if best:
        lines.append(best_label + best)
    return lines
