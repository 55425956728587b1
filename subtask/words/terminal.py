"""Text made safe for a terminal: the one place control characters are made visible.

A task, a summary, a file name or a reason may come from a model or a teammate's pushed record,
and a raw escape sequence in it would retitle, clear or rewrite the reader's terminal (`git log
--notes=subtask` prints notes raw).

Invariants:
- `safe` shows every control character as an escape (`\\x1b`, `\\u202e`) and keeps newlines and
  tabs; nothing is dropped.
- `safe_line` also shows newlines and tabs, so a field cannot start a line of its own (e.g. a
  forged `subtask st-…` note header).
- `json_text` keeps the exact values, escaped: no raw control character for a terminal to obey.
"""

from __future__ import annotations

import json
import re

from subtask.model import lazyre
from subtask.model import money as _money

# C0 controls but newline and tab, DEL, C1 controls, and the bidi marks, embeddings, overrides and
# isolates (and the line/paragraph separators some terminals break lines at).
_UNSAFE_CHARS = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE = lazyre.compile(f"[{_UNSAFE_CHARS}]")
_UNSAFE_LINE = lazyre.compile(f"[{_UNSAFE_CHARS}\n\t]")
_NEWLINE_TAB = str.maketrans("", "", "\n\t")


def _printable(text: str, lines: bool = False) -> bool:
    """No character either pattern matches (newlines and tabs aside when `lines`): each of them
    is Unicode's "Other" or "Separator", which `str.isprintable` refuses. Most texts are, and then
    no pattern is compiled (~0.3 ms each)."""
    return (text.translate(_NEWLINE_TAB) if lines else text).isprintable()


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code == 0x0A:
        return "\\n"
    if code == 0x09:
        return "\\t"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: str) -> str:
    """`text` with every control character made visible (`\\x1b`, `\\u202e`); newlines and tabs kept."""
    return text if _printable(text, lines=True) else _UNSAFE.sub(_visible, text)


def safe_line(text: str) -> str:
    """Like `safe`, and newlines and tabs shown as `\\n`, `\\t`: the text stays on its line."""
    return text if _printable(text) else _UNSAFE_LINE.sub(_visible, text)


def json_text(obj, **options) -> str:
    """JSON with the exact values, and no raw control character for a terminal to obey: json
    escapes C0 itself; C1 and bidi characters, legal raw in JSON, are escaped too."""
    options.setdefault("default", _money.json_default)  # an amount as its exact JSON number
    text = json.dumps(obj, ensure_ascii=False, **options)
    return text if _printable(text, lines=True) else _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
