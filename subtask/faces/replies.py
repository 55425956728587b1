"""What a command answers, in words and as data: one `Reply` per operation, shared by the faces.

The CLI prints `text` (or, with `--json`, `data`); the MCP tool returns `text` as its content and
`data` as its structured content. So the JSON an agent gets over MCP is the JSON `--json` prints,
and the words are the CLI's. `notes` are what the CLI says on stderr (a timeout, jobs left out);
the MCP tool appends them to its text. `nothing` is said when there is no text: by the CLI on a
terminal only (scripts see what they always saw), always by the MCP tool.

Pure functions of what `api` returned; nothing here reads git, but `groups`' words read the
members they name.
"""

from __future__ import annotations

import time

from subtask import api  # api's names load on first use (api/__init__)
from subtask import words as render
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.model.job import VerifyResult
from subtask.words import group_pages

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    from typing import Any


@dataclass
class Reply:
    """What one operation answers, the same for the CLI and the MCP tool (see the module docstring)."""

    text: str
    data: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    nothing: str | None = None
    exit_code: int = 0
    # The operation did none of what it was asked (a land that landed nothing): the CLI prints
    # the words and exits `exit_code`, as ever; the MCP tool answers a tool error, `error: <this>`
    # then the words, as it does for a refused merge.
    failed: str | None = None

    def full_text(self) -> str:
        """The text with its notes, or what to say when there is none (the MCP tool's words)."""
        lines = [self.text] if self.text else [self.nothing] if self.nothing else []
        return "\n".join([*lines, *self.notes])


def job_json(job, position: int | None = None) -> dict[str, Any]:
    return {"v": 1, "id": job.id, "state": job.state.current.state, "position": position,
            "spec": job.spec.to_dict(), "state_detail": job.state.to_dict(),
            "evidence": job.evidence.to_dict() if job.evidence else None, "summary": job.summary}


# ---------------------------------------------------------------- starting

def started(result) -> Reply:
    """`start` (or a `reply`'s new attempt): the job's start line, or a group's lines."""
    if hasattr(result, "group"):
        group = result.group
        if group.is_map:
            files = sum(len(b) for b in getattr(result, "batches", []))
            first = (f"{group.id} started: {len(result.members)} jobs over {files} files · "
                     f"{group.concurrency or 'any'} at once" + (f" · verify {group.verify}" if group.verify else ""))
            note = f"(wait {group.id} for them all)"
        else:
            first = (f"{group.id} started: {len(result.members)} attempts · rule {group.rule_text} · "
                     f"verify {group.verify}")
            note = f"(wait {group.id} for the pick)"
        lines = [first, *("  " + render.started_line(r.job, r.position) for r in result.members)]
        warnings = list(dict.fromkeys(w for r in result.members for w in r.warnings))
        return Reply("\n".join(lines), {"v": 1, "group": group.id, "kind": group.kind, "members": [
            job_json(r.job, r.position or None) | {"state": r.state} for r in result.members],
            "warnings": warnings, **_left_out_json(result)},
            notes=[note, *warnings, *render.left_out_lines(result.left_out)])
    data = job_json(result.job, result.position or None)
    data |= {"state": result.state, "on": result.on, "warnings": result.warnings}
    return Reply(render.started_line(result.job, result.position), data | _left_out_json(result),
                 notes=[*result.warnings, *render.left_out_lines(result.left_out)])


def _left_out_json(result) -> dict[str, Any]:
    left_out = getattr(result, "left_out", None)
    return {"left_out": left_out.to_dict()} if left_out is not None else {}


def started_many(results: list, words=str) -> Reply:
    """`start_many`: one numbered line per item, its start or its error (`words`: as the face
    spells an error), in order."""
    lines, items, notes = [], [], []
    for n, result in enumerate(results, 1):
        if isinstance(result, SubtaskError):
            hint = f" (hint: {words(result.hint)})" if result.hint else ""
            lines.append(f"{n}. error: {words(result.message)}{hint}")
            items.append({"v": 1, "error": result.to_dict()})
        else:
            reply = started(result)
            lines.append(f"{n}. " + reply.text.replace("\n", "\n   "))
            items.append(reply.data)
            notes += reply.notes
    return Reply("\n".join(lines), {"v": 1, "items": items}, notes=[*dict.fromkeys(notes)])


# ---------------------------------------------------------------- waiting and reading

def waited(repo, result, timeout: float | None) -> Reply:
    lines = [render.ended_lines(job, api.queue_position(repo, job.id)) for job in result.jobs]
    notes = [render.stalled_hint(job) for job in result.jobs if job.id in result.stalled]
    if result.timed_out:
        still = sum(1 for job in result.jobs if not job.state.current.terminal)
        notes.append(f"{_timed_out(timeout)}{still} still running (they continue): wait again")
    data = {"v": 1, "timed_out": result.timed_out, "passed": result.all_passed, "stalled": result.stalled,
            "jobs": [job_json(j) for j in result.jobs]}
    feed = result.feed
    if feed is not None:  # wait --since: the events first, then where each job stands, then the cursor
        lines = [*(render.event_line(e) for e in feed.events), *lines, f"cursor: {feed.cursor}"]
        data.update(events=feed.events, cursor=feed.cursor, more=feed.more)
        if feed.more:
            notes.append("more events than one answer holds: wait --since the cursor again")
    return Reply("\n".join(lines), data, notes, exit_code=0 if result.all_passed else 1)


def _timed_out(timeout: float | None) -> str:
    """How a wait that ended before its jobs says so (a timeout of 0 is a poll: it did not wait)."""
    return f"timed out after {timeout:g}s; " if timeout else ""


def waited_groups(repo, result, timeout: float | None) -> Reply:
    notes = [f"{_timed_out(timeout)}the attempts continue: wait again"] if result.timed_out else []
    return Reply("\n\n".join(_group_result_text(repo, g) for g in result.groups),
                 {"v": 1, "timed_out": result.timed_out, "picked": result.all_picked, "passed": result.all_picked,
                  "groups": [g.to_dict() for g in result.groups]},
                 notes, exit_code=0 if result.all_picked else 1)


def waited_any(repo, result, timeout: float | None) -> Reply:
    """`wait` over jobs, groups or both (`api.MixedWait`): each part in its own words."""
    if result.groups is None:
        return waited(repo, result.jobs, timeout)
    if result.jobs is None:
        return waited_groups(repo, result.groups, timeout)
    jobs, groups = waited(repo, result.jobs, timeout), waited_groups(repo, result.groups, timeout)
    notes = [render.stalled_hint(job) for job in result.jobs.jobs if job.id in result.jobs.stalled]
    if result.timed_out:
        notes.append(f"timed out after {timeout:g}s; the jobs and attempts continue: wait again")
    data = {**jobs.data, "groups": groups.data["groups"], "timed_out": result.timed_out,
            "passed": result.passed}
    return Reply(f"{jobs.text}\n\n{groups.text}", data, notes, exit_code=0 if result.passed else 1)


def listed(repo, found_groups: dict, listing, *, state: str | None = None, unfold: bool = False,
           more_hint: str = "git subtask list --all", facts: bool = True) -> Reply:
    """`list`: a header and one row per job, each best-of group folded into one row (`unfold`:
    its members under it); the JSON says whose signature each record carries and whether the job
    is this clone's (`facts`: only where the JSON is wanted; the words do not say it)."""
    entries = listing.jobs
    data = {"v": 1, "jobs": api.add_record_facts(repo, entries) if facts else entries, "more": listing.more}
    if found_groups:
        data["groups"] = [g.to_dict() for g in found_groups.values()]
    text = "\n".join([render.LIST_HEADER, *folded_lines(found_groups, entries, unfold, time.time())]) if entries else ""
    nothing = None
    if not entries and not listing.more:
        nothing = (f"no {state} jobs" if state else
                   f"no jobs to show ({listing.hidden} landed: git subtask list --all)" if listing.hidden else
                   "no jobs yet (start one: git subtask start '...')")
    # What this call's lazy sweep removed: said once (the sweep runs once), to an agent too.
    notes = [*listing.swept, *([f"({listing.more} older jobs not shown: {more_hint})"] if listing.more else [])]
    return Reply(text, data, notes, nothing)


def folded_lines(found_groups: dict, entries: list[dict], unfold: bool, now: float) -> list[str]:
    """List rows with each group's members folded under one group line (`unfold`: shown under it)."""
    lines, shown = [], set()
    for entry in entries:
        gid = entry.get("group")
        if gid not in found_groups:
            lines.append(render.list_line(entry, entry.get("position"), now))
            continue
        if gid in shown:
            continue
        shown.add(gid)
        members = [e for e in entries if e.get("group") == gid]
        lines.append(group_pages.list_line(found_groups[gid], members, now))
        if unfold:
            lines += ["  " + render.list_line(e, e.get("position"), now) for e in members]
    return lines


def status(rows: list) -> Reply:
    return Reply("\n".join(render.status_line(*row) for row in rows),
                 {"v": 1, "jobs": [{"id": job.id, "state": job.state.current.state, "position": position,
                                    "activity": activity, "line": render.status_line(job, position, activity, marks),
                                    **({"marks": marks} if marks else {}),
                                    **({"stalled": render.stall_facts(job.state.current)}
                                       if job.state.current.stalled else {})}
                                   for job, position, activity, marks in rows]},
                 nothing="no active jobs")


def shown(repo, job, position: int | None) -> Reply:
    moved = api.branch_moved(repo, job)
    facts = api.record_facts(repo, job)
    return Reply(render.show_text(job, position, worktree_present=api.worktree_present(job), moved=moved,
                                  provenance=facts["signature"], mine=facts["mine"]),
                 job_json(job, position) | ({"moved": moved} if moved else {})
                 | {"signature": facts["signature"].to_dict(), "mine": facts["mine"]})


def shown_group(repo, group) -> Reply:
    rows = api.group_page(repo, group).rows
    return Reply(group_pages.show_text(group, rows), group.to_dict() | {"rows": rows})


def result(repo, job, *, full: bool = False) -> Reply:
    """`result`: exit 0 only for a job done with verify passed on its branch's tip as it is now."""
    moved = api.branch_moved(repo, job)
    return Reply(render.result_text(job, full=full, moved=moved),
                 api.evidence_envelope(job) | ({"moved": moved} if moved else {}),
                 exit_code=0 if api.job_passed(job) and not moved else 1)


def group_result(repo, group) -> Reply:
    page = api.group_page(repo, group)
    return Reply(group_pages.result_text(group, page.rows, page.pick), group.to_dict(),
                 exit_code=0 if page.passed else 1)


def _group_result_text(repo, group) -> str:
    page = api.group_page(repo, group)
    return group_pages.result_text(group, page.rows, page.pick)


def git_output(output, *, what: str, hint: str) -> Reply:
    """`diff` or `log`: what git printed, and when it was cut, by how much and how to see the rest."""
    notes = []
    if output.truncated:
        notes.append(f"({what} cut at {len(output.text.encode()):,} of {output.size:,} bytes: {hint})")
    return Reply(output.text.rstrip("\n"), output.to_dict(), notes, nothing=f"no {what}: the job changed nothing")


def compared(data: dict) -> Reply:
    lines = []
    for pair in data["pairs"]:
        lines.append(f"== {pair['a']} .. {pair['b']}")
        if pair["text"].strip():
            lines.append(pair["text"].rstrip("\n"))
        if pair["truncated"]:
            lines.append(f"(cut at {len(pair['text'].encode()):,} of {pair['bytes']:,} bytes)")
    return Reply("\n".join(lines), data, nothing="nothing to compare: fewer than two members have a head")


# ---------------------------------------------------------------- changing

def merged(result) -> Reply:
    job = result.job
    return Reply("\n".join(result.lines), {"v": 1, "id": job.id, "mode": result.mode, "commit": result.commit,
                                           "into": result.into, "landed_in": job.state.landed_in,
                                           "lines": result.lines})


def landed(data: dict) -> Reply:
    """`land` (`lineup.LandResult.to_dict()`, or with `dry_run` `overlap.Plan.to_dict()`): from
    the data, so the MCP tool, which gets it from a `git-subtask land --json` child, says the same.
    Exit 1 unless every job landed (would land); `failed` when none did, as `merge` fails."""
    if data.get("dry_run"):
        return Reply(land_plan_text(data), data, exit_code=0 if data.get("ok") else 1)
    jobs = data.get("jobs") or []
    failed = None
    if jobs and not any(job.get("state") in ("landed", "already") for job in jobs):
        said = ", ".join(f"{job.get('id')} {job.get('state')}" for job in jobs)
        failed = render.safe_line(f"nothing landed onto {data.get('target', '?')} ({said})")
    return Reply(land_text(data), data, exit_code=0 if data.get("ok") else 1, failed=failed)


def land_text(data: dict) -> str:
    """A line per job (what happened on the way, its verify, both sides of a conflict, its
    cleanup), then where the target went."""
    short, safe_line = render.short, render.safe_line
    target, jobs = data.get("target", "?"), data.get("jobs") or []
    lines = [f"land onto {target} at {short(data.get('before'))} ({data.get('mode')}"
             f"{', atomic' if data.get('atomic') else ''}), {len(jobs)} job{'' if len(jobs) == 1 else 's'}:"]
    for job in jobs:
        state, name = job.get("state"), str(job.get("id")) + (f" ({job['group']})" if job.get("group") else "")
        if state in ("landed", "passed") and job.get("commit"):
            what = f"{state} as {short(job['commit'])} on {short(job.get('onto'))} ({job.get('how')})"
        elif state == "conflict":
            what = f"conflict with {target} at {short(job.get('onto'))} in {', '.join(job.get('conflicts') or [])}"
        elif state == "already":
            what = f"already in {target} at {short(job.get('onto'))}"
        else:
            what = f"{state}: {job['why']}" if job.get("why") else str(state)
        lines.append(safe_line(f"{name}: {what}"))
        lines += [safe_line(f"  {line}") for line in job.get("events") or []]
        verify = VerifyResult.from_dict(job["verify"]) if job.get("verify") else None
        if verify is not None:
            lines.append(f"  verify{'' if job.get('confined', True) else ' (unconfined)'}: "
                         f"{render.verify_line(verify)}")
            judged = render.judge_line(verify)
            if judged:
                lines.append(f"  judge:  {judged}")
            lines += render.verify_tail(verify, prefix="    ")
        if state in ("landed", "passed") and job.get("why"):
            lines.append(safe_line(f"  {job['why']}"))
        for side, said in (job.get("sides") or {}).items():
            who = target if side == "target" else job.get("id")
            lines += [safe_line(f"  {who}: {line}") for line in said] or [f"  {who}: -"]
        lines += [safe_line(f"  {line}") for line in job.get("lines") or [] if line]
    count = sum(1 for job in jobs if job.get("state") == "landed")
    before, after = data.get("before"), data.get("after")
    moved = f"{short(before)} -> {short(after)}" if after != before else f"stays at {short(before)}"
    lines.append(f"{target}: {moved} ({count} of {len(jobs)} landed)")
    if data.get("stopped"):
        lines.append(safe_line(f"stopped: {data['stopped']}"))
    return "\n".join(lines)


def land_plan_text(data: dict) -> str:
    """`land --dry-run`: the order, each job's files, what a real run would do, the overlaps."""
    short, safe_line = render.short, render.safe_line
    target, tip = data.get("target", "?"), data.get("tip")
    lines = [f"would land onto {target} at {short(tip)} ({data.get('mode')}{', atomic' if data.get('atomic') else ''}),"
             " in this order:"]
    for n, job in enumerate(data.get("jobs") or [], 1):
        name = str(job.get("id")) + (f" ({job['group']})" if job.get("group") else "")
        files = job.get("files") or []
        stale = f" · base {job['behind']} behind {target}" if job.get("behind") else ""
        lines.append(safe_line(f"{n}. {name}: {len(files)} file{'' if len(files) == 1 else 's'}{stale}: "
                               + ", ".join(files[:8]) + (" …" if len(files) > 8 else "")))
        would = job.get("would")
        if would == "land":
            then = (f"verify {job['verify']} on the integrated commit" if job.get("verify") else
                    "nothing to verify (--force)")
            lines.append(safe_line(f"   would integrate ({job.get('how')}), then {then}, then move {target}"))
        elif would == "conflict":
            lines.append(safe_line(f"   would conflict in {', '.join(job.get('conflicts') or [])}"
                                   + (" (then --reconcile replies to it)" if job.get("how") == "reconcile" else "")))
        elif would == "already":
            lines.append(f"   {target} already has its work")
        else:
            lines.append(safe_line(f"   would be refused: {job.get('how')}"))
    pairs = data.get("pairs") or []
    lines += [safe_line(f"overlap: {_pair_words(p)}") for p in pairs] or \
        ["overlap: none (no two jobs change a file in common)"]
    if data.get("atomic") and not data.get("ok"):
        lines.append(f"--atomic: nothing would land ({target} stays at {short(tip)})")
    lines.append("nothing was changed (dry run)")
    return "\n".join(lines)


def _pair_words(pair: dict) -> str:
    files, same = pair.get("files") or [], set(pair.get("same_lines") or [])
    said = ", ".join(f + (" (same lines)" if f in same else "") for f in files[:5])
    return f"{pair.get('a')} and {pair.get('b')} both change {said}" \
        + (f" and {len(files) - 5} more" if len(files) > 5 else "")


def merged_group(group, lines: list[str]) -> Reply:
    return Reply("\n".join(lines), {"v": 1, "group": group.id, "pick": group.pick, "merged": group.merged,
                                    "lines": lines})


def stopped(job) -> Reply:
    return Reply(render.one_line(job), job_json(job))


def stopped_group(repo, group) -> Reply:
    return Reply(group_pages.show_text(group, api.group_page(repo, group).rows), group.to_dict())


def report(lines: list[str], nothing: str | None = None, **facts: Any) -> Reply:
    """Commands that report what they did (cleanup, gc): one line each."""
    return Reply("\n".join(lines), {"v": 1, **facts, "lines": lines}, nothing=nothing)


def pool(status, made: list | None = None) -> Reply:
    """`pool` (and `pool fill`): how many ready worktrees of how many wanted, their disk of the
    bound, one line each (its commit, size, age); `made`: what `pool fill` made."""
    lines = []
    if made is not None:
        lines.append(f"made {len(made)} pooled worktree{'s' if len(made) != 1 else ''}"
                     + (f" at {render.short(made[0].commit)}" if made else ""))
    lines.append(f"pool: {len(status.entries)} of {status.target} ready worktrees (subtask.pool), "
                 f"{render.size(status.bytes)} of {render.size(status.max_bytes)} (subtask.poolMaxBytes)"
                 + (f"; {status.debris} half-made, removed by the next fill or gc" if status.debris else ""))
    now = time.time()
    lines += [f"  {entry.name}  {render.short(entry.commit)}  {render.size(entry.bytes):>10}  "
              f"made {render.duration(now - entry.made)} ago" for entry in status.entries]
    data = status.to_dict() | ({"made": [e.to_dict() for e in made]} if made is not None else {})
    return Reply("\n".join(lines), data)


def spend(summary, all_clones: bool) -> Reply:
    if all_clones:
        lines = [f"{summary.month}, every clone (from the records): {render.money(summary.committed_usd)} "
                 f"committed, {render.money(summary.open_usd)} reserved by running jobs"]
        lines += [f"  {clone}  {render.money(amounts['committed'])} committed  "
                  f"{render.money(amounts['open'])} open  ({amounts['jobs']} jobs)"
                  for clone, amounts in summary.clones.items()]
    else:
        lines = [f"{summary.month}: {render.money(summary.committed_usd)} committed, "
                 f"{render.money(summary.open_usd)} reserved by {len(summary.open_reservations)} open jobs, "
                 f"{render.money(summary.left_usd)} left of {render.money(summary.cap_usd)}"]
        lines += [f"  {engine:<10} {render.money(amounts['committed'])} committed  {render.money(amounts['open'])} open"
                  for engine, amounts in sorted(summary.per_engine.items())]
    return Reply("\n".join(lines), {"v": 1} | summary.to_dict())


def engines(probes: list, *, compact: bool) -> Reply:
    """`engines`: a block per engine for a person, one line per engine for an agent (`compact`)."""
    out = []
    for p in probes:
        auth = {True: "yes", False: "no", None: "unknown"}[p.authenticated]
        if compact:
            out.append(f"{p.name}: installed={'yes' if p.installed else 'no'} auth={auth} "
                       f"{'paid' if p.paid else 'free'} {p.version or '-'} · isolation: {p.isolation}")
        else:
            out.append(f"{p.name:<8} installed={'yes' if p.installed else 'no':<3} auth={auth:<7} "
                       f"{'paid' if p.paid else 'free'}  {p.version or '-'}\n         isolation: {p.isolation}"
                       + (f"\n         confinement here: {p.confinement}" if p.confinement else ""))
    return Reply("\n".join(out), {"v": 1, "engines": [p.__dict__ | {"usable": p.usable} for p in probes]})


# ---------------------------------------------------------------- disk

DU_HEADER = (f"{'ID':<12} {'STATE':<8} {'WORKTREE':>10} {'TRACKED':>10} "
             f"{'UNTRACKED':>10} {'IGNORED':>10} {'OBJECTS':>10}")


def disk(found) -> Reply:
    """`du`: a row per job's worktree, the other folders, the total, what cleanup and gc would free."""
    rows = []
    for job in found.jobs:
        split = job.split or {}
        rows.append(f"{job.id:<12} {job.state:<8} {render.size(job.total):>10} "
                    + " ".join(f"{render.size(split.get(c)) if job.split else '-':>10}"
                               for c in ("tracked", "untracked", "ignored"))
                    + f" {render.size(job.objects):>10}" + (f"  ({job.why})" if job.why else ""))
    lines = [DU_HEADER, *rows] if rows else []
    lines += [f"{name + '/':<21} {render.size(size):>10}  (no job's worktree)" for name, size in found.other.items()]
    data = found.to_dict()
    if lines:
        lines.append(f"total: {render.size(found.total)} in {len(found.jobs)} worktree(s)"
                     + (f" and {len(found.other)} other folder(s)" if found.other else "")
                     + f"; objects only job refs keep: {render.size(data['objects'])}")
    for what, freed in found.frees.items() if lines else ():
        lines.append(f"{what} would free {render.size(freed['bytes'])}"
                     + (f" ({', '.join(freed['jobs'])})" if freed["jobs"] else ""))
    return Reply("\n".join(lines), data, nothing="no job worktrees on disk")


# ---------------------------------------------------------------- routing

def routed(found) -> Reply:
    """`routing explain`: each candidate's score and terms, or the filter that removed it; the choice."""
    weights = found.weights
    chosen = found.chosen
    lines = [f"{'ENGINE':<12} {'SCORE':>7}  {'PASS':>6} {'USD':>7} {'MINUTES':>8} {'ROOM':>5}  HISTORY HERE"]
    for c in found.candidates:
        if c.score is None:
            lines.append(render.safe_line(f"{c.name:<12} {'-':>7}  removed by {c.filter}: {c.why}"))
            continue
        t = {term: c.terms[term]["value"] for term in c.terms}
        h = c.history
        past = (f"{h['ended']} ended, {h['passed']} passed" if h.get("ended") else "none")
        lines.append(render.safe_line(f"{c.name:<12} {c.score:>7.3f}  {t['pass']:>6.2f} {t['cost']:>7.2f} "
                                      f"{t['time']:>8.1f} {t['room']:>5.2f}  {past}"))
    lines.append(f"score = {weights['pass']:g} x pass - {weights['cost']:g} x usd - {weights['time']:g} x minutes"
                 f" + {weights['room']:g} x room   (git config subtask.routing.weightPass, weightCost, weightTime, "
                 "weightRoom)")
    lines.append(f"chosen: {chosen.name}" if chosen else "chosen: none: every candidate was removed")
    return Reply("\n".join(lines), found.to_dict(), exit_code=0 if chosen else 1)
