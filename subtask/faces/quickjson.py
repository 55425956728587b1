"""A strict JSON reader with no imports, for what the MCP front end reads before its first reply.

`json` costs ~9 ms to import (it loads `re`, and `re` loads `enum`): as much as everything else the
front end (`subtask.faces.mcp_server`) does until it answers `initialize`, which a client waits for
at every session's start. The front end reads two small texts before that reply: the client's
first line and the head of its reply cache. This module reads them.

Invariants:
- Never return a value `json.loads` would not return for the same text, because the front end
  answers from it: `loads` returns exactly `json.loads(data)` (strict: no NaN or Infinity, no
  control character in a string) or raises ValueError, and raises for anything it does not read
  the way `json` does (a byte-order mark, another encoding than UTF-8, nesting deeper than
  `MAX_DEPTH`, a text over `MAX_BYTES`). The caller then reads the text with `json`: such a
  text is only read slower, never misread (tests/test_quickjson.py compares the two on
  generated and damaged texts).
- Standard library only, and not even that: nothing is imported.
"""

from __future__ import annotations

MAX_DEPTH = 64
MAX_BYTES = 1 << 16  # a character at a time: longer texts are `json`'s (C) work
_SPACE = frozenset(" \t\n\r")
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")  # a set, not a str: "" is not in it
_SIGNS = frozenset("+-")
_EXPONENT = frozenset("eE")
_ESCAPED = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_WORDS = (("true", True), ("false", False), ("null", None))


def loads(data: bytes) -> object:
    """The value of a JSON text in UTF-8, as `json.loads` gives it; ValueError when it is not
    one, or not one this reader takes (see the module's invariants)."""
    if len(data) > MAX_BYTES:
        raise ValueError("a long text: left to json")
    text = data.decode("utf-8")  # UnicodeDecodeError is a ValueError
    value, at = _value(text, _skip(text, 0), 0)
    if _skip(text, at) != len(text):
        raise ValueError(f"extra data at {at}")
    return value


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in _SPACE:
        at += 1
    return at


def _value(text: str, at: int, depth: int) -> tuple[object, int]:
    first = text[at:at + 1]
    if first == '"':
        return _string(text, at + 1)
    if first == "{":
        return _object(text, at + 1, depth + 1)
    if first == "[":
        return _array(text, at + 1, depth + 1)
    for word, value in _WORDS:
        if text.startswith(word, at):
            return value, at + len(word)
    return _number(text, at)


def _digits(text: str, at: int) -> int:
    while at < len(text) and text[at] in _DIGITS:
        at += 1
    return at


def _number(text: str, at: int) -> tuple[object, int]:
    """As CPython's scanner: `-?(0|[1-9][0-9]*)`, then a fraction and an exponent only when
    digits follow them (else the number ends before them)."""
    start = at
    if text[at:at + 1] == "-":
        at += 1
    if text[at:at + 1] == "0":
        at += 1
    elif text[at:at + 1] in _DIGITS:
        at = _digits(text, at)
    else:
        raise ValueError(f"expecting a value at {start}")
    whole = at
    if text[at:at + 1] == "." and text[at + 1:at + 2] in _DIGITS:
        at = _digits(text, at + 1)
    if text[at:at + 1] in _EXPONENT:
        sign = 2 if text[at + 1:at + 2] in _SIGNS else 1
        if text[at + sign:at + sign + 1] in _DIGITS:
            at = _digits(text, at + sign)
    number = text[start:at]
    return (float(number) if at != whole else int(number)), at


def _hex4(text: str, at: int) -> int:
    digits = text[at:at + 4]
    if len(digits) != 4 or not _HEX.issuperset(digits):
        raise ValueError(f"a bad \\u escape at {at}")
    return int(digits, 16)


def _string(text: str, at: int) -> tuple[str, int]:
    """From after the opening quote; a surrogate pair in escapes is one character, as in `json`."""
    out: list[str] = []
    while at < len(text):
        char = text[at]
        if char == '"':
            return "".join(out), at + 1
        if char < " ":
            raise ValueError(f"a control character in a string at {at}")
        if char != "\\":
            out.append(char)
            at += 1
            continue
        escape = text[at + 1:at + 2]
        if escape != "u":
            if escape not in _ESCAPED:
                raise ValueError(f"a bad escape at {at}")
            out.append(_ESCAPED[escape])
            at += 2
            continue
        code = _hex4(text, at + 2)
        at += 6
        if 0xD800 <= code <= 0xDBFF and text.startswith("\\u", at):
            low = _hex4(text, at + 2)
            if 0xDC00 <= low <= 0xDFFF:
                code = 0x10000 + ((code - 0xD800) << 10 | (low - 0xDC00))
                at += 6
        out.append(chr(code))
    raise ValueError("an unterminated string")


def _object(text: str, at: int, depth: int) -> tuple[dict, int]:
    found: dict = {}
    closed, at = _open(text, at, depth, "}")
    while not closed:
        if text[at:at + 1] != '"':
            raise ValueError(f"expecting a key at {at}")
        key, at = _string(text, at + 1)
        at = _skip(text, at)
        if text[at:at + 1] != ":":
            raise ValueError(f"expecting ':' at {at}")
        found[key], at = _value(text, _skip(text, at + 1), depth)
        closed, at = _after_item(text, at, "}")
    return found, at


def _array(text: str, at: int, depth: int) -> tuple[list, int]:
    found: list = []
    closed, at = _open(text, at, depth, "]")
    while not closed:
        value, at = _value(text, at, depth)
        found.append(value)
        closed, at = _after_item(text, at, "]")
    return found, at


def _open(text: str, at: int, depth: int, close: str) -> tuple[bool, int]:
    """Past an object's or array's opening and the whitespace after it: (empty, where next)."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply: left to json")
    at = _skip(text, at)
    return (True, at + 1) if text[at:at + 1] == close else (False, at)


def _after_item(text: str, at: int, close: str) -> tuple[bool, int]:
    """Past an item's comma or the closing bracket, and the whitespace: (closed, where next)."""
    at = _skip(text, at)
    if text[at:at + 1] == close:
        return True, at + 1
    if text[at:at + 1] != ",":
        raise ValueError(f"expecting ',' or '{close}' at {at}")
    return False, _skip(text, at + 1)
