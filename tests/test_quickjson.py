"""The MCP front end's JSON reader (`subtask/faces/quickjson.py`) against `json` itself.

Its promise: for any bytes, it returns exactly what `json.loads` returns (types included: 1 is
not 1.0), or raises ValueError. A text it refuses that `json` reads is allowed (the front end
then uses `json`); a value that differs, or a text it reads that `json` refuses, is a defect."""

from __future__ import annotations

import json
import random

import pytest

from subtask.faces import quickjson


def same(a: object, b: object) -> bool:
    """Equal, and of the same types all the way down (and in the same key order)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def json_reads(data: bytes) -> tuple[bool, object]:
    def refuse(constant: str) -> object:
        raise ValueError(constant)

    try:
        return True, json.loads(data, parse_constant=refuse)
    except (ValueError, RecursionError):
        return False, None


def agrees(data: bytes) -> str | None:
    """None when quickjson keeps its promise on `data`, else what went wrong."""
    ok, expected = json_reads(data)
    try:
        found = quickjson.loads(data)
    except ValueError:
        return None  # refused: the front end asks json
    if not ok:
        return f"read {data!r} that json refuses, as {found!r}"
    if not same(found, expected):
        return f"read {data!r} as {found!r}, json as {expected!r}"
    return None


CHARS = ['"', "\\", "/", "\n", "\t", "\x00", "\x1f", "é", "\u2028", "\ud83d\ude00", "\ud800", "\udc00",
         "a", " ", "{", "}", "[", "]", ",", ":", "0", "e", "-"]


def random_value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(9 if depth < 5 else 6)
    if kind == 0:
        return rng.choice([True, False, None])
    if kind == 1:
        return rng.choice([0, -0, 1, -1, 7, 10**20, -(10**30), rng.randrange(-10**6, 10**6)])
    if kind == 2:
        return rng.choice([0.0, -0.0, 0.5, -2.25, 1e-7, 1e300, 1.5e-300, rng.uniform(-1e6, 1e6)])
    if kind in (3, 4, 5):
        return "".join(rng.choice(CHARS) for _ in range(rng.randrange(6)))
    if kind in (6, 7):
        return {"".join(rng.choice(CHARS) for _ in range(rng.randrange(4))): random_value(rng, depth + 1)
                for _ in range(rng.randrange(4))}
    return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def spellings(value: object) -> list[bytes]:
    texts = [json.dumps(value), json.dumps(value, ensure_ascii=False), json.dumps(value, indent=2),
             json.dumps(value, separators=(",", ":"), ensure_ascii=False), " \t" + json.dumps(value) + "\r\n"]
    return [t.encode("utf-8", "surrogatepass") for t in texts]


def test_it_reads_what_json_writes_exactly_as_json_reads_it():
    rng = random.Random(42)
    for _ in range(3000):
        value = random_value(rng)
        for data in spellings(value):
            assert agrees(data) is None
            if b"\xed" not in data:  # a lone surrogate written raw is not UTF-8: refused, rightly
                ok, expected = json_reads(data)
                assert ok and same(quickjson.loads(data), expected), data


def test_a_damaged_text_is_refused_or_read_as_json_reads_it():
    rng = random.Random(7)
    alphabet = b' \t\r\n"\\/{}[],:-+.0123456789eEabfnrtu\x00\x1f\xc3\xa9\xff'
    for _ in range(6000):
        data = bytearray(rng.choice(spellings(random_value(rng))))
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(data) + 1)
            move = rng.randrange(3)
            if move == 0 and data:
                del data[min(at, len(data) - 1)]
            elif move == 1:
                data.insert(at, rng.choice(alphabet))
            elif data:
                data[min(at, len(data) - 1)] = rng.choice(alphabet)
        assert agrees(bytes(data)) is None


@pytest.mark.parametrize("text", [
    b"", b" ", b"1", b"-0", b"-0.0", b"01", b"1.", b"1.e5", b".5", b"1e", b"1e+", b"1E-2", b"-", b"--1",
    b"NaN", b"Infinity", b"-Infinity", b"[1,]", b'{"a":1,}', b"[1 2]", b'{"a" 1}', b'{1:2}',
    b'"\\u00e9"', b'"\\u00E9"', b'"\\ud83d\\ude00"', b'"\\ud83d"', b'"\\udc00\\ud83d"', b'"\\ud83d\\u0041"',
    b'"\\u12"', b'"\\u 123"', b'"\\u+123"', b'"\\x41"', b'"\\\'"', b'"a\x01b"', b'"\x7f"',
    b"\xef\xbb\xbf{}", b"{}\x00", b"\x00{\x00}", b"true", b"truex", b"nul", b'{"a":1,"a":2}',
    b"[" * 70 + b"]" * 70, b"[" * 10 + b"]" * 10, b"1" * 5000, b"\"" + b"x" * 70000 + b"\"",
    b"1 2", b"\n{}\n", b"\x0c{}", b"[\xa0]", b'"\xed\xa0\x80"', b"1e400", b"-1e-400",
])
def test_edge_cases_keep_the_promise(text):
    assert agrees(text) is None


def test_the_front_ends_first_line_is_read_here():
    """What an MCP client sends first is read here, not refused to `json`."""
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {"roots": {"listChanged": True}, "sampling": {}},
        "clientInfo": {"name": "claude-code", "version": "2.1.0", "title": "Claude Code ✳"}}}) + "\n"
    assert same(quickjson.loads(line.encode()), json.loads(line))
