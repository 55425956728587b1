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

from subtask.model import money as _money

# C0 controls but newline and tab, DEL, C1 controls, and the bidi marks, embeddings, overrides and
# isolates (and the line/paragraph separators some terminals break lines at).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_LINE = re.compile(_UNSAFE.pattern[:-1] + "\n\t]")


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
