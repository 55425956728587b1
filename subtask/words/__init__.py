"""The words: what every layer shows a person or an agent, so a job reads the same in the CLI,
the MCP server, the record subjects and the notes.

A layer of its own, just above `model`: it imports `model` and the standard library only, and
nothing here touches git or files. Modules by subject, each importing only those before it:

- `terminal`: text made safe for a terminal (`safe`, `safe_line`, `json_text`);
- `formats`: durations, money, sizes, short shas, titles and summaries as text;
- `fields`: a record's parts in words (cost, verify, judge, checks, stall, evidence, landing);
- `lines`: a job, a list row or an event in one line (`status`, `list`, `start`, `wait`);
- `pages`: `show`, `result` and the review note block;
- `group_pages`: a group's headline, table, `show`, `result` and `list` row (imported as a module).

Callers import from the package (`from subtask.words import one_line`); the names below are its
surface.

Invariants:
- Every text shown to a person goes through `safe` (done by each renderer here on what it
  returns, and by the CLI and MCP faces on everything else they print): a task, a summary, a
  file name or a reason may come from a model or a teammate's pushed record, and a raw escape
  sequence in it would retitle, clear or rewrite the reader's terminal. JSON output keeps the
  exact value, escaped (`json_text`).
- A field that must stay on its line (a reason, a verify command, a file name) goes through
  `safe_line`, so it cannot start a line of its own, e.g. a forged `subtask st-…` note header.
- Never print a job's text to a person without `words.safe` (CLI `echo`, the renderers, the MCP
  `tool` wrapper), because tasks, summaries and file names come from models and teammates and a
  terminal obeys escape sequences; JSON goes through `words.json_text`.
- Never put words for a person in `model/`, nor import anything but `model/` from `words/`,
  because every layer from `git/` (the notes, the record subjects) to the faces shows them: the
  words sit just above the data they describe (`tests/test_layers.py` ALLOWED).
"""

from subtask.words.fields import (
    attempt_cost,
    job_cost,
    judge_line,
    reason_text,
    stall_facts,
    stalled_text,
    verify_line,
    verify_tail,
)
from subtask.words.formats import (
    SUMMARY_MAX_LINES,
    duration,
    money,
    short,
    size,
    summary_lines,
    task_title,
)
from subtask.words.lines import (
    LIST_HEADER,
    activity_text,
    ended_lines,
    event_line,
    land_progress,
    left_out_lines,
    list_line,
    list_row,
    one_line,
    stalled_hint,
    started_line,
    status_line,
)
from subtask.words.pages import note_block, result_text, show_text
from subtask.words.terminal import json_text, safe, safe_line

__all__ = [
    "LIST_HEADER", "SUMMARY_MAX_LINES", "activity_text", "attempt_cost", "duration", "ended_lines",
    "event_line", "job_cost", "land_progress", "json_text", "judge_line", "left_out_lines", "list_line", "list_row",
    "money", "note_block", "one_line", "reason_text", "result_text", "safe", "safe_line", "short",
    "show_text", "size", "stall_facts", "stalled_hint", "stalled_text", "started_line",
    "status_line", "summary_lines", "task_title", "verify_line", "verify_tail",
]
