"""Patterns compiled on first use, and the checks every read makes without one: each answers
exactly what the regular expression it replaced answered (tests/test_imports.py holds the
reading commands to compiling none of ours)."""

from __future__ import annotations

import random
import re

import pytest

from subtask.git import gitobjects, ownership
from subtask.model import job, lazyre
from subtask.model.errors import SubtaskError
from subtask.words import terminal


def test_a_pattern_is_compiled_at_its_first_use_and_answers_as_re_compile():
    broken = lazyre.compile("(")  # re.compile would raise here
    with pytest.raises(re.error):
        broken.search("x")
    words = lazyre.compile(r"(\w+)@(\w+)", re.IGNORECASE)
    assert words.fullmatch("A@b").groups() == ("A", "b")
    assert (words.pattern, words.groups, words.flags & re.IGNORECASE) == (r"(\w+)@(\w+)", 2, re.IGNORECASE)
    assert words.sub(r"\2", "x@y z@w") == "y w"


# The regular expressions the string checks replaced, as they were written.
OID = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")
SHARED_REF = re.compile(r"(?!.*\.\.)(?!.*\.lock$)refs/(?:heads|tags|notes|subtask|subtask-[a-z-]+)"
                        r"(?:/(?!\.)[A-Za-z0-9_+@=,-][A-Za-z0-9_.+@=,-]*)+")
SHARED_PREFIX = re.compile(r"refs/(?:heads|tags|notes|subtask|subtask-[a-z-]+)/"
                           r"(?:[A-Za-z0-9_+@=,-][A-Za-z0-9_.+@=,-]*/)*")
JOB_ID = re.compile(r"st-[0-9a-f]{8}")
ID_PREFIX = re.compile(r"st-[0-9a-f]{0,8}|[0-9a-f]{1,8}")
CLONE_ID = re.compile(r"c-[0-9a-f]{16}")

REF_NAMES = [
    "refs/heads/main", "refs/heads/subtask/st-1a2b3c4d", "refs/subtask/st-1a2b3c4d/record", "refs/notes/subtask",
    "refs/subtask-owned/st-1a2b3c4d", "refs/subtask-theirs/origin/st-1/attempts/2", "refs/tags/v1.0",
    "refs/heads", "refs/heads/", "refs/heads//x", "refs/heads/.x", "refs/heads/x/.y", "refs/heads/a..b",
    "refs/heads/x.lock", "refs/heads/x.lock/y", "refs/heads/x y", "refs/heads/x\n", "refs/heads/é",
    "refs/remotes/origin/main", "refs/subtask-/x", "refs/subtask-A/x", "refs/subtask-a-b/x", "refs/x/y",
    "HEAD", "refs", "refs/", "/refs/heads/x", "refs/heads/x/", "refs/heads/a.b", "refs/heads/-x", "refs/heads/x~1",
    "refs/heads/x^", "refs/heads/x:y", "refs/heads/x@{1}", "refs/heads/+=,@_-.", "refs/subtask/", "refs/heads/a/b/",
]


def names(seed: int, count: int) -> list[str]:
    """Random names near the edges: ref-like parts of the characters either check looks at."""
    rng = random.Random(seed)
    alphabet = "refshadtgubk-/._+@=,:~ \nA0l"
    tops = ["refs/heads/", "refs/subtask/", "refs/subtask-", "refs/notes/", "refs/tags/", "refs/", ""]
    return [rng.choice(tops) + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(count)]


def test_a_ref_name_is_checked_as_the_patterns_checked_it():
    for name in REF_NAMES + names(1, 20000):
        assert gitobjects._shared_ref(name) == bool(SHARED_REF.fullmatch(name)), name
        assert gitobjects._shared_ref(name, folder=True) == bool(SHARED_PREFIX.fullmatch(name)) \
            or name.endswith(".lock/"), name  # a folder named `*.lock` is left to git now: stricter


def test_an_object_id_and_our_ids_are_checked_as_the_patterns_checked_them():
    rng = random.Random(2)
    samples = ["", "0" * 40, "a" * 64, "A" * 40, "0" * 39, "0" * 41, "0" * 63, "0" * 65, "0" * 40 + "\n",
               " " + "0" * 39, "g" + "0" * 39, "st-1a2b3c4d", "st-1A2B3C4D", "st-", "st-1a2b3c4", "st-1a2b3c4d0",
               "1a2b", "c-" + "0" * 16, "c-" + "0" * 15, "st-1a2b3c4d\n", "ST-1a2b3c4d", "st-1a2b 3c4", "123456789",
               "x"]
    samples += ["".join(rng.choice("0123456789abcdefAst-c \n") for _ in range(rng.choice([3, 8, 11, 18, 40, 64])))
                for _ in range(20000)]
    for text in samples:
        assert gitobjects.is_oid(text) == bool(OID.fullmatch(text)), text
        assert job.is_job_id(text) == bool(JOB_ID.fullmatch(text)), text
        assert (job.hex_named(text, "c-", 16)) == bool(CLONE_ID.fullmatch(text)), text
        if ID_PREFIX.fullmatch(text.lower()):
            assert job.check_id_prefix(text).startswith("st-")
        else:
            with pytest.raises(SubtaskError):
                job.check_id_prefix(text)
    assert ownership  # the clone id's reader uses hex_named (tests/test_ownership.py reads one)


def test_a_printable_text_holds_no_character_the_terminal_patterns_escape():
    """The fast path of `terminal.safe`: a text `str.isprintable` passes is returned as it is,
    which is right only while no character either pattern escapes is printable (Unicode's
    categories, in this interpreter's database)."""
    every = "".join(map(chr, range(0x110000)))
    escaped = set(terminal._UNSAFE_LINE.findall(every))
    assert len(escaped) > 60 and "\x1b" in escaped and "\u202e" in escaped and "\n" in escaped
    assert [c for c in escaped if c.isprintable()] == []
    for text in ("plain words", "a\tb\nc", "bell\x07", "rtl\u202eflip", "ok é ✓", "", "\x9b[31m", "two\u2028lines"):
        assert terminal.safe(text) == terminal._UNSAFE.sub(terminal._visible, text)
        assert terminal.safe_line(text) == terminal._UNSAFE_LINE.sub(terminal._visible, text)
    assert terminal.json_text({"k": "a\u202e\x85"}) == '{"k": "a\\u202e\\u0085"}'
