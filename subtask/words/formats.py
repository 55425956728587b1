"""The small formatters: durations, money, sizes, short shas, titles and summaries as text.

Pure functions of a value; none of them makes its result terminal-safe (the texts built from
them do, `terminal.safe`).
"""

from __future__ import annotations

from subtask.model import money as _money

SUMMARY_MAX_LINES = 10  # the lines of an engine's output a summary keeps


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


def summary_lines(text: str, limit: int = SUMMARY_MAX_LINES) -> str:
    lines = [line.rstrip() for line in (text or "").strip().splitlines()]
    if len(lines) > limit:
        lines = lines[:limit - 1] + [f"… ({len(lines) - limit + 1} more lines: git subtask result <id> --full)"]
    return "\n".join(lines)


def counted(n: int, word: str) -> str:
    """`1 commit`, `2 commits`."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def first_few(names: list[str], shown: int = 3) -> str:
    """`a, b, c, and 2 more`."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f", and {more} more" if more > 0 else "")


def indented(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())
