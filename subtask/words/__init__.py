"""The words: what every layer shows a person or an agent (status lines, list rows, `show`,
`result`, the review note block, money and durations as text), so a job reads the same in the
CLI, the MCP server, the record subjects and the notes.

A layer of its own, just above `model`: it imports `model` and the standard library only, and
nothing here touches git or files. Callers import from the package (`from subtask.words import
one_line`); the names below are its surface.
"""

from subtask.words.fields import (
    LIST_HEADER,
    SUMMARY_MAX_LINES,
    activity_text,
    attempt_cost,
    duration,
    ended_lines,
    event_line,
    job_cost,
    json_text,
    judge_line,
    left_out_lines,
    list_line,
    list_row,
    money,
    note_block,
    one_line,
    reason_text,
    result_text,
    safe,
    safe_line,
    short,
    show_text,
    size,
    stall_facts,
    stalled_hint,
    stalled_text,
    started_line,
    status_line,
    summary_lines,
    task_title,
    verify_line,
    verify_tail,
)

__all__ = [
    "LIST_HEADER", "SUMMARY_MAX_LINES", "activity_text", "attempt_cost", "duration", "ended_lines",
    "event_line", "job_cost", "json_text", "judge_line", "left_out_lines", "list_line", "list_row",
    "money", "note_block", "one_line", "reason_text", "result_text", "safe", "safe_line", "short",
    "show_text", "size", "stall_facts", "stalled_hint", "stalled_text", "started_line",
    "status_line", "summary_lines", "task_title", "verify_line", "verify_tail",
]
