"""What an engine claims against what the record shows, and how many tests a verify run passed.

Two readings of text, both pure (no git, no files):

- `test_counts(output)`: the passed/failed figures a test runner printed in its summary
  (pytest, unittest, jest, vitest, go test -v, cargo test), or None where the output says no such
  thing. The verify loop (`retries.best`) leaves a failed job's branch at the attempt that passed
  the most tests by these figures.
- `contradictions(...)`: an engine's summary that says the tests pass, or names files it changed,
  checked against the attempt's evidence: verify failed or never ran, the last test command it ran
  came before its last edit, a named file is absent from the diff. Each contradiction is one
  `{"claim", "against"}` pair; `line` writes them as the note and `result` show them:
  `claims: "all tests pass" — verify failed`.

Invariant: never decide anything on a claim. What an engine says is shown beside the evidence,
never used in its place (the state, the pick of a group, the verify loop read git and verify).

Invariants:
- Never decide on what an engine claims, because its summary is its word, not evidence: its
  summary's "all tests pass" or files it names are compared with the evidence and shown
  (`contradictions`), never used for the state, the loop or a pick.
"""

from __future__ import annotations

import re

from subtask.model import lazyre
from subtask.model.dataclass import dataclass

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any


# ---------------------------------------------------------------- test counts


@dataclass(frozen=True)
class Counts:
    """The passed and failed figures a test runner printed in its summary (`test_counts`)."""

    passed: int
    failed: int

    def words(self) -> str:
        return f"{self.passed} passed, {self.failed} failed"


_PYTEST = lazyre.compile(r"(\d+) (passed|failed|errors?)\b")
_PYTEST_LINE = lazyre.compile(r"^[=\s]*(?:\d+ (?:passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)"
                          r"(?:, )?)+(?: in [\d.]+s)?", re.MULTILINE)
_JEST = lazyre.compile(r"^Tests:\s+(.*\btotal)\s*$", re.MULTILINE)
_VITEST = lazyre.compile(r"^\s*Tests\s+(.*?)\s*\(\d+\)\s*$", re.MULTILINE)
_CARGO = lazyre.compile(r"^test result: \w+\. (\d+) passed; (\d+) failed", re.MULTILINE)
_UNITTEST_RAN = lazyre.compile(r"^Ran (\d+) tests? in", re.MULTILINE)
_UNITTEST_FAILED = lazyre.compile(r"^FAILED \(([^)]*)\)", re.MULTILINE)
_GO = lazyre.compile(r"^\s*--- (PASS|FAIL): ", re.MULTILINE)


def test_counts(output: str) -> Counts | None:
    """Passed and failed tests as the runner's summary says (the last summary wins), or None."""
    if not output:
        return None
    for reader in (_pytest, _jest, _vitest, _cargo, _unittest, _go):
        counts = reader(output)
        if counts is not None:
            return counts
    return None


def _pytest(output: str) -> Counts | None:
    lines = _PYTEST_LINE.findall(output)
    if not lines:
        return None
    figures = {kind.rstrip("s"): int(n) for n, kind in _PYTEST.findall(lines[-1])}
    if "passed" not in figures and "failed" not in figures and "error" not in figures:
        return None
    return Counts(figures.get("passed", 0), figures.get("failed", 0) + figures.get("error", 0))


def _figures(text: str) -> dict[str, int]:
    return {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed)", text)}


def _jest(output: str) -> Counts | None:
    lines = _JEST.findall(output)
    if not lines:
        return None
    figures = _figures(lines[-1])
    return Counts(figures.get("passed", 0), figures.get("failed", 0))


def _vitest(output: str) -> Counts | None:
    lines = [line for line in _VITEST.findall(output) if re.search(r"\d+ (passed|failed)", line)]
    if not lines:
        return None
    figures = _figures(lines[-1])
    return Counts(figures.get("passed", 0), figures.get("failed", 0))


def _cargo(output: str) -> Counts | None:
    results = _CARGO.findall(output)  # one line per test binary: they add up
    if not results:
        return None
    return Counts(sum(int(p) for p, _ in results), sum(int(f) for _, f in results))


def _unittest(output: str) -> Counts | None:
    ran = _UNITTEST_RAN.findall(output)
    if not ran:
        return None
    total = int(ran[-1])
    failed = 0
    verdict = _UNITTEST_FAILED.findall(output)
    if verdict:
        failed = sum(int(n) for kind, n in re.findall(r"(failures|errors)=(\d+)", verdict[-1]))
    skipped = (re.findall(r"skipped=(\d+)", verdict[-1]) if verdict else
               re.findall(r"^OK \(skipped=(\d+)\)", output, re.M))
    return Counts(max(0, total - failed - (int(skipped[-1]) if skipped else 0)), failed)


def _go(output: str) -> Counts | None:
    marks = _GO.findall(output)
    if not marks:
        return None
    return Counts(marks.count("PASS"), marks.count("FAIL"))


# ---------------------------------------------------------------- what the engine did, in order

EDIT_TOOLS = frozenset({"Write", "Edit", "MultiEdit", "NotebookEdit", "file_change", "apply_patch"})
_TEST_WORDS = ("pytest", "unittest", "npm test", "npm run test", "yarn test", "pnpm test", "go test",
               "cargo test", "make test", "tox", "jest", "vitest", "mvn test", "gradle test", "./gradlew test")


def looks_like_test(command: str) -> bool:
    return any(word in command for word in _TEST_WORDS)


class Watch:
    """The order of an attempt's edits and test commands, from the engine's events (the worker
    passes every event through `see`). Only what the engine reported is known: a shell script's
    edits are not events, so for it nothing is said about order."""

    def __init__(self) -> None:
        self.seen = 0
        self.last_edit: int | None = None
        self.last_test: tuple[int, str, Any] | None = None  # (order, command, exit)

    def see(self, event: dict[str, Any]) -> None:
        self.seen += 1
        kind = event.get("type")
        if kind == "tool" and event.get("name") in EDIT_TOOLS:
            self.last_edit = self.seen
        elif kind == "command" and isinstance(event.get("command"), str) and looks_like_test(event["command"]):
            self.last_test = (self.seen, event["command"], event.get("exit"))

    def to_dict(self) -> dict[str, Any]:
        test = self.last_test
        return {"last_edit": self.last_edit,
                "last_test": None if test is None else {"at": test[0], "command": test[1][:200], "exit": test[2]}}


# ---------------------------------------------------------------- claims

_NOT = lazyre.compile(
    r"\b(?:not|no|never|don't|doesn't|didn't|cannot|can't|couldn't|won't|isn't|aren't|fail\w*|still)\b"
                   r"[^.;:\n]{0,20}$", re.IGNORECASE)
_PASS_CLAIMS = lazyre.compile(
    r"\b(?:all (?:the )?(?:\d+ )?(?:unit |existing |remaining )?tests?(?: now)? "
    r"(?:pass(?:es|ed)?|are passing|succeed(?:ed)?|are green)"
    r"|(?:the )?(?:unit |existing )?tests? (?:now )?(?:all )?(?:pass(?:es|ed)?|are passing|are green|succeed(?:ed)?)"
    r"|test suite (?:now )?(?:passes|passed|is green)"
    r"|(\d+)/\1 tests? pass(?:ed|ing)?"
    r"|\d+ tests? pass(?:ed|ing)?(?:,? (?:and )?0 fail\w*)?(?=[\s.,;)]|$)"
    r"|verified (?:that )?(?:it|everything|the tests?) (?:works?|pass(?:es)?))",
    re.IGNORECASE)
_CHANGE_VERBS = lazyre.compile(r"\b(?:changed|modified|updated|edited|fixed|created|added|wrote|rewrote|refactored|"
                           r"touched|renamed|moved|implemented|adjusted|patched)\b", re.IGNORECASE)
_PATH = lazyre.compile(
    r"`([^`\s]{1,200})`|(?<![\w/.-])((?:[\w.-]+/)*[\w-][\w.-]*\.(?:py|pyi|js|jsx|ts|tsx|mjs|cjs|go|rs|"
                   r"java|kt|rb|php|c|h|cc|cpp|hpp|cs|swift|scala|sh|md|rst|txt|json|ya?ml|toml|cfg|ini|html|css|"
                   r"scss|sql|proto|lock))(?![\w/-])")
MAX_CLAIMS = 4


def test_claim(summary: str) -> str | None:
    """The words with which `summary` says the tests pass (as written, one line), or None."""
    for match in _PASS_CLAIMS.finditer(summary or ""):
        before = summary[max(0, match.start() - 40):match.start()]
        if _NOT.search(before.splitlines()[-1] if before.splitlines() else ""):
            continue
        return " ".join(match.group(0).split())
    return None


def named_files(summary: str) -> list[str]:
    """Paths `summary` says were changed: path-like words on a line that has a verb of change."""
    found: list[str] = []
    for line in (summary or "").splitlines():
        if not _CHANGE_VERBS.search(line):
            continue
        for quoted, bare in _PATH.findall(line):
            path = (quoted or bare).strip("./") if (quoted or bare) not in (".", "..") else ""
            if path and ("/" in path or "." in path) and not path.startswith(("http", "-")) and path not in found:
                found.append(path)
    return found


def _in_diff(path: str, files: list[str]) -> bool:
    return any(f == path or f.endswith("/" + path) for f in files)


def contradictions(summary: str, *, verify: Any, checks_failed: list[str], files: list[str],
                   files_complete: bool, watch: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each claim of `summary` the evidence contradicts: `{"claim", "against"}`. `verify` is the
    attempt's VerifyResult (None: no verify ran), `files` the paths of its diff from the base
    (`files_complete`: every one is listed), `watch` the order of its edits and test commands."""
    found: list[dict[str, Any]] = []
    claim = test_claim(summary)
    if claim:
        against = _against_test_claim(verify, checks_failed, watch)
        if against:
            found.append({"claim": claim, "against": against})
    if files_complete:
        for path in named_files(summary):
            if not _in_diff(path, files):
                found.append({"claim": f"changed {path}", "against": "not in the diff"})
            if len(found) >= MAX_CLAIMS:
                break
    return found[:MAX_CLAIMS]


def _against_test_claim(verify: Any, checks_failed: list[str], watch: dict[str, Any] | None) -> str | None:
    if verify is not None:
        if checks_failed:
            return "check " + ", ".join(checks_failed) + " failed"
        if not verify.passed:
            return "verify timed out" if verify.timed_out else f"verify failed (exit {verify.exit_code})"
        return None  # verify passed: the claim holds
    test = (watch or {}).get("last_test")
    last_edit = (watch or {}).get("last_edit")
    if not test:
        return "no verify ran, and no test command was seen"
    if test.get("exit") not in (0, None):
        return f"no verify ran, and its last test command failed (exit {test.get('exit')})"
    if last_edit is not None and isinstance(test.get("at"), int) and test["at"] < last_edit:
        return "no verify ran, and its last test command ran before its last edit"
    return None


def line(found: list[dict[str, Any]] | None) -> str | None:
    """`"all tests pass" — verify failed; "changed a.py" — not in the diff` (None: nothing to say)."""
    parts = [f'"{c.get("claim")}" — {c.get("against")}' for c in found or () if isinstance(c, dict)]
    return "; ".join(parts) if parts else None
