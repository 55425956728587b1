"""A group (best-of or map) in words: its headline, its table, `show`, `result` and its `list`
row. A group is read duck-typed (`ops.plans.groups.Group`: this layer sits below it), its table
rows as `groups.table_rows` gives them.

Every text goes through `safe`/`safe_line` here, as in the rest of `words`.
"""

from __future__ import annotations

import math

from subtask.words.formats import duration, money, short, summary_lines, task_title
from subtask.words.lines import list_row, one_line
from subtask.words.terminal import safe, safe_line

TYPE_CHECKING = False  # not `typing`'s: `list` shows groups, and a reading command never imports typing
if TYPE_CHECKING:
    from typing import Any



MAP_HEADER = (f"{'job':<4}  {'member':<11}  {'engine':<10}  {'model':<12}  {'state':<7}  "
              f"{'verify':<6}  {'+/-':<11}  {'cost':>6}  {'time':>6}")
TABLE_HEADER = (f"{'rank':<4}  {'member':<11}  {'engine':<10}  {'model':<12}  {'state':<7}  "
                f"{'verify':<6}  {'+/-':<11}  {'cost':>6}  {'time':>6}")


def header(group) -> str:
    return MAP_HEADER if group.is_map else TABLE_HEADER


def table_line(row: dict[str, Any], in_map: bool = False) -> str:
    changes = f"+{row.get('added', 0)} -{row.get('deleted', 0)}"
    verify = row.get("verify") or "-"
    number = row.get("index") if in_map else row.get("rank")
    line = (f"{str(number or '-'):<4}  {row['member']:<11}  {(row.get('engine') or '-')[:10]:<10}  "
            f"{(row.get('model') or '-')[:12]:<12}  {row.get('state', '-'):<7}  {verify:<6}  {changes:<11}  "
            f"{money(row.get('cost')):>6}  {duration(row.get('seconds')):>6}")
    extra = []
    if row.get("score") is not None:
        extra.append(f"score {row['score']:g}")
    if row.get("note"):
        extra.append(str(row["note"]))
    return safe_line(line + ("  " + "; ".join(extra) if extra else ""))


def headline(group) -> str:
    if group.is_map:
        what = group.state + (f" ({group.reason})" if group.reason and group.state != "running" else "")
        return safe_line(f"{group.id} map {what} · {len(group.members)} jobs · {group.concurrency or 'any'} at "
                                f"once · {task_title(group.pattern or '', 40)}")
    if group.state == "picked":
        what = f"picked {group.pick} ({group.reason})"
    elif group.state == "no_pick":
        what = f"no pick: {group.reason}"
    elif group.state == "stopped":
        what = "stopped, no pick"
    else:
        what = "running"
    merged = f" · merged as {short(group.merged['commit'])}" if group.merged else ""
    return safe_line(f"{group.id} {what} · {len(group.members)} members · rule {group.rule_text}{merged}")


def show_text(group, rows: list[dict[str, Any]]) -> str:
    """`show` of a group: its headline, what it does, its table (`rows`), what to do next."""
    lines = [headline(group), f"task:    {task_title(group.task, 100)}",
             f"verify:  {group.verify or '(none)'}", f"base:    {short(group.base)}", "", header(group)]
    lines += [table_line(row, group.is_map) for row in rows]
    more = (f"git subtask wait {group.id} · git subtask start --after {group.id} '...'" if group.is_map else
            f"git subtask compare {group.id} · git subtask merge {group.id}")
    lines += ["", f"more:    {more}"]
    return safe("\n".join(lines))


def result_text(group, rows: list[dict[str, Any]], pick=None) -> str:
    """A few lines for an agent: the ranking table (`rows`), then the pick's (a `Job`) one line
    and summary."""
    lines = [headline(group), header(group), *(table_line(r, group.is_map) for r in rows)]
    if pick is not None:
        lines += ["", "pick: " + one_line(pick)]
        summary = summary_lines(pick.summary, 5)
        if summary:
            lines += ["  " + line for line in summary.splitlines()]
    return safe("\n".join(lines))


def list_line(group, members: list[dict], now: float) -> str:
    """One row of `list` for the group, in the jobs' columns (its members, `members` as listed, are
    folded under it): its state, the pick's verify (a map: its own), its age, what its listed
    members cost, their engine, then what it is and its task."""
    verify = ("passed" if group.pick or group.state == "done" else
              "failed" if group.terminal and group.state != "stopped" else "-")
    costs = [e["cost"] for e in members if isinstance(e.get("cost"), (int, float))]
    engines = sorted(set(group.engines))
    if group.is_map:
        what = f"map · {len(group.members)} jobs · {group.concurrency or 'any'} at once"
    else:
        chosen = f"pick {group.pick}" if group.pick else "no pick" if group.terminal else "picking"
        merged = f" · merged as {short(group.merged['commit'])}" if group.merged else ""
        what = f"best of {len(group.members)} · {chosen} · rule {group.rule_text}{merged}"
    return list_row(group.id, group.state, verify, duration(now - group.created_at),
                           money(math.fsum(costs)) if costs else "-",
                           engines[0] if len(engines) == 1 else "mixed",
                           f"{what} · {task_title(group.task, 40)}")
