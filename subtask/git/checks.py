"""Checks on a job's diff from its base, run before verify: did it game its tests?

An agent told to make the tests pass can delete the failing test, skip it, silence the linter or
edit files nobody asked it to touch. These checks read the change (base..head) from git objects
and fail the attempt's verify, naming the check, when it does:

- `no-test-deletion`: no test file removed, emptied or renamed into a non-test name, and no test
  function removed (one moved to another test file is not removed). Test files are known by the
  usual names of Python, JavaScript/TypeScript, Go, Rust and Java; test functions are read with
  the standard library's `ast` for Python and by pattern elsewhere.
- `no-suppression`: no added skip or xfail marker (also through an alias: `import pytest as P`,
  `from pytest import skip`), `# noqa`, `# type: ignore`, `eslint-disable`, `@ts-ignore`,
  `#[ignore]`, `t.Skip`, `@Disabled` (more of a marker in a file's added lines than in its removed
  ones); no conftest.py hook that deselects or rewrites results, nor `os._exit`; no `-k`,
  `--deselect`, `--ignore` or `-p no:` added to pytest's configuration; and no test assertion
  turned into a no-op (commented out, or replaced by one that always holds).

These read text, and the job moves last: they are early, cheap signals. What keeps a verdict
honest is the judge (`ops/landing/overlay.py`): the tests come from a tree the job could not touch.
- `paths=GLOB` (several allowed): every changed path matches one of the globs; those outside are
  named. `*` and `?` stay inside one folder, `**` crosses folders (`src/**`, `**/*.md`).

Which checks a job runs is decided at start (`resolve`) and recorded in its spec: the default
`subtask.git.checks` (`no-test-deletion,no-suppression`) for a job with a verify command, plus each
`--check`; `--check none` drops every check named before it.

Invariants:
- Never read a job's change for the checks from its worktree, because the job writes that
  worktree's git metadata: the diff base..head comes from the repository's objects (git's diff).
- Never let a check's result come from the job's own words: only the diff decides.
- Bounded: a change of many files reads at most `MAX_FILES` patches and `MAX_BLOB` bytes of a
  blob; what was not read is said (a check that could not look at everything says so, it does
  not pass silently).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from pathlib import PurePosixPath

from subtask.git import pipes
from subtask.git.gitrepo import DIFF, NO_HOOKS, raw_entries
from subtask.model import lazyre
from subtask.model.checknames import (  # noqa: F401  (the names, spelled once, for callers)
    DEFAULT,
    NAMED,
    NO_SUPPRESSION,
    NO_TEST_DELETION,
    NONE,
    PATHS,
    check_name,
    split,
)
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    import ast
    from typing import Any

    from subtask.git.gitrepo import Repo

MAX_FILES = 5000
MAX_BLOB = 2 << 20
MAX_FOUND = 20  # findings kept per check


# ---------------------------------------------------------------- which checks a job runs

def resolve(given: Iterable[str] | None, configured: str | None, *, has_verify: bool) -> list[str]:
    """The checks a job records: the configured default (`subtask.git.checks`, else `DEFAULT`) when
    it has a verify command, then each of `given` in order; `none` drops all named before it."""
    chosen: list[str] = []
    if has_verify:
        for item in split(configured if configured is not None else DEFAULT):
            try:
                name = check_name(item)
            except SubtaskError as exc:
                raise SubtaskError("fatal", f"git config subtask.git.checks: {exc.message}",
                                   hint=f"git config subtask.git.checks {DEFAULT}") from None
            chosen = [] if name == NONE else [*chosen, name]
    for value in given or ():
        if not isinstance(value, str):
            raise SubtaskError("usage", f"a check must be a string, not {value!r}")
        for item in split(value):
            name = check_name(item)
            chosen = [] if name == NONE else [*chosen, name]
    return list(dict.fromkeys(chosen))


# ---------------------------------------------------------------- running them

@dataclass
class Result:
    """One check's verdict on a job's diff, and what it found."""

    check: str
    passed: bool
    found: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)  # paths=: the changed paths no glob matched

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "passed": self.passed, "found": self.found[:MAX_FOUND],
                **({"outside": self.outside[:MAX_FOUND]} if self.outside else {})}


def failed(results: list[dict[str, Any]] | None) -> list[str]:
    """The names of the checks that failed, from recorded results."""
    return [r.get("check", "?") for r in results or () if isinstance(r, dict) and r.get("passed") is False]


def failure_text(results: list[dict[str, Any]] | None, limit: int = 3) -> str:
    """`check no-suppression failed: src/a.py:3 adds "# noqa"` (every failed check, a few findings each)."""
    parts = []
    for r in results or ():
        if isinstance(r, dict) and r.get("passed") is False:
            found = [str(f) for f in (r.get("found") or [])]
            more = f" (+{len(found) - limit} more)" if len(found) > limit else ""
            parts.append(f"check {r.get('check')} failed" + (f": {'; '.join(found[:limit])}{more}" if found else ""))
    return "; ".join(parts)


HINT_PATHS = 5  # outside paths a hint names


def retry_hint(results: list[dict[str, Any]] | None, recorded: list[str]) -> str:
    """What a person whose change means what the failed checks found runs next, keeping every other
    check: the paths it needed added to its `paths=` globs, only the failed named checks dropped
    (`--check none` then the rest: `none` alone would drop the others too)."""
    failed_names = set(failed(results))
    outside = [p for r in results or () if isinstance(r, dict) and r.get("passed") is False
               for p in r.get("outside") or () if isinstance(p, str)]
    kept = [c for c in recorded if c not in failed_names or c.startswith(PATHS)]
    dropped = any(c in failed_names and not c.startswith(PATHS) for c in recorded)
    # A path as a glob that matches it: `?` stands for each character a glob or a list would read.
    added = [PATHS + re.sub(r"[*?{},\[\]]", "?", p) for p in outside[:HINT_PATHS]]
    left = len(outside) - HINT_PATHS
    more = f" (and {left} more paths: git subtask show <id>)" if left > 0 else ""
    given = ([NONE] if dropped else []) + kept + added
    flags = " ".join(f"--check {shlex.quote(c)}" for c in given)
    return (f"see what the checks found: git subtask show <id>; if the change is meant, start it "
            f"again with the other checks kept: git subtask start {flags} ...{more}")


@dataclass
class _File:
    """One file of the change base..head, as `Change` reads it for the checks."""

    old_path: str | None  # None: added
    new_path: str | None  # None: deleted
    old: bytes | None = None
    new: bytes | None = None
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


class Change:
    """The change base..head as the checks need it, read from git objects: one `git diff` (each
    file's status and ids, then its patch with no context: the lines added and removed) and one
    read of the blobs (no libgit2: a judged job's worker runs these)."""

    def __init__(self, repo: Repo, base: str, head: str):
        self.files: list[_File] = []
        self.unread = 0  # files past MAX_FILES: not looked at
        if base == head:
            return
        argv = ["git", *NO_HOOKS, "-C", str(repo.root), *DIFF, "--raw", "--no-abbrev", "-z", "-p", "--unified=0"]
        raw, _, patch = pipes.run([*argv, base, head])[1].partition(b"\0\0diff --git ")
        sections = iter(f"diff --git {patch.decode('utf-8', 'replace')}".split("\ndiff --git ")) if patch else iter(())
        wanted: list[tuple[_File, str, str]] = []  # (file, its old blob's id, its new one's)
        for status, paths, old_id, new_id in raw_entries(raw.decode("utf-8", "replace").split("\0"))[0]:
            halves = [(status, paths, old_id, new_id, next(sections, ""))]
            if status == "T":  # a file that became a link (or the reverse): two files, its new one first
                gone, made = halves[0][4], next(sections, "")
                halves = [("A", paths, ZERO, new_id, made), ("D", paths, old_id, ZERO, gone)]
            for half, named, old, new, lines in halves:
                if len(self.files) >= MAX_FILES:
                    self.unread += 1
                    continue
                entry = _File(None if half == "A" else named[0], None if half == "D" else named[-1])
                if _patch_lines(lines, entry):
                    wanted += [(entry, old, new)]
                self.files.append(entry)
        ids = [oid for _, old, new in wanted for oid in (old, new) if oid != ZERO]
        blobs = dict(zip(ids, repo.objects.read(ids), strict=True))
        for entry, old, new in wanted:
            entry.old = _blob(blobs.get(old)) if entry.old_path is not None else None
            entry.new = _blob(blobs.get(new)) if entry.new_path is not None else None

    def paths(self) -> list[str]:
        seen: list[str] = []
        for f in self.files:
            for path in (f.old_path, f.new_path):
                if path is not None and path not in seen:
                    seen.append(path)
        return seen


ZERO = "0" * 40


def _patch_lines(section: str, entry: _File) -> bool:
    """The lines one file's patch adds and removes, into `entry` (each with its newline, but the
    last of a file that ends without one); False for a binary file (no lines, no blobs read)."""
    lines = section.split("\n")
    hunks = False
    for n, line in enumerate(lines[1:], 1):
        if not hunks:
            if line.startswith("Binary files ") or line == "GIT binary patch":
                return False
            hunks = line.startswith("@@")
        elif line[:1] in "+-" and line:
            ends = not (n + 1 < len(lines) and lines[n + 1].startswith("\\"))
            (entry.added if line[0] == "+" else entry.removed).append(line[1:] + ("\n" if ends else ""))
    return True


def _blob(found: tuple[str, bytes] | None) -> bytes | None:
    # A submodule's entry names a commit (here, when this repository holds it): no file to read.
    return found[1] if found is not None and found[0] == "blob" and len(found[1]) <= MAX_BLOB else None


def run(repo: Repo, base: str, head: str, checks: list[str] | None) -> list[dict[str, Any]]:
    """Each check's result on base..head (empty when there are none)."""
    if not checks:
        return []
    change = Change(repo, base, head)
    globs = [c[len(PATHS):] for c in checks if c.startswith(PATHS)]
    results = []
    for name in checks:
        if name == NO_TEST_DELETION:
            results.append(_no_test_deletion(change))
        elif name == NO_SUPPRESSION:
            results.append(_no_suppression(change))
    if globs:
        results.append(_paths(change, globs))
    unread = (f"1 changed file beyond the first {MAX_FILES} was not read" if change.unread == 1
              else f"{change.unread} changed files beyond the first {MAX_FILES} were not read")
    for r in results:
        if change.unread:
            r.found.append(unread)
            r.passed = False
    return [r.to_dict() for r in results]


# ---------------------------------------------------------------- no-test-deletion

_JS_EXT = ("js", "jsx", "ts", "tsx", "mjs", "cjs", "mts", "cts")
_TEST_NAME = lazyre.compile(
    r"(?:^|/)(?:test_[^/]*\.py|[^/]*_test\.py"
    r"|[^/]*\.(?:test|spec)\.(?:" + "|".join(_JS_EXT) + r")"
    r"|__tests__/[^/]*\.(?:" + "|".join(_JS_EXT) + r")"
    r"|[^/]*_test\.go"
    r"|tests/[^/]*\.rs"
    r"|(?:Test[^/]*|[^/]*Tests?|[^/]*IT)\.java|src/test/[^/]*\.java)$")


def is_test_file(path: str | None) -> bool:
    return path is not None and _TEST_NAME.search(path) is not None


_JS_TEST = lazyre.compile(r"\b(?:it|test)(?:\.(?:only|concurrent|each\s*\([^)]*\)))?\s*\(\s*"
                       r"(['\"`])((?:(?!\1).){1,200})\1")
_GO_TEST = lazyre.compile(r"^func\s+((?:Test|Benchmark|Example|Fuzz)\w*)\s*\(", re.MULTILINE)
_RUST_TEST = lazyre.compile(r"#\[(?:[\w:]+::)?test(?:\([^)]*\))?\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?"
                        r"(?:async\s+)?fn\s+(\w+)")
_JAVA_TEST = lazyre.compile(r"@(?:Test|ParameterizedTest|RepeatedTest|TestFactory)\b(?:\s*\([^)]*\))?\s+"
                        r"(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:public|protected|private|static|final)\s+)*void\s+(\w+)\s*\(")


def test_names(path: str, data: bytes | None) -> set[str] | None:
    """The test functions a file defines (None: it could not be read)."""
    if data is None:
        return None
    text = data.decode("utf-8", "replace")
    suffix = _suffix(path)
    if suffix == "py":
        return _python_tests(text)
    if suffix in _JS_EXT:
        return {name for _, name in _JS_TEST.findall(text)}
    if suffix == "go":
        return set(_GO_TEST.findall(text))
    if suffix == "rs":
        return set(_RUST_TEST.findall(text))
    if suffix == "java":
        return set(_JAVA_TEST.findall(text))
    return set()


def _python_tests(text: str) -> set[str] | None:
    import ast  # a check's reading of Python tests: not a plain job's worker's (~0.8 ms)

    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return set(re.findall(r"^\s*(?:async\s+)?def\s+(test\w*)\s*\(", text, re.MULTILINE)) or None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
                    names.add(f"{node.name}.{item.name}")
    return names


def _no_test_deletion(change: Change) -> Result:
    result = Result(NO_TEST_DELETION, True)
    # every test function of the changed test files after the change, by language: one moved to
    # another test file is not removed
    after: set[tuple[str, str]] = set()
    for f in change.files:
        if f.new_path is not None and (is_test_file(f.new_path) or _has_rust_tests(f.new_path, f.new)):
            after |= {(_suffix(f.new_path), name) for name in test_names(f.new_path, f.new) or ()}
    for f in change.files:
        if f.old_path is None:
            continue  # an added file: no test of it can be gone
        if not (is_test_file(f.old_path) or _has_rust_tests(f.old_path, f.old)):
            continue
        if f.new_path is None:
            result.found.append(f"{f.old_path} removed")
            continue
        if not is_test_file(f.new_path) and not _has_rust_tests(f.new_path, f.new):
            result.found.append(f"{f.old_path} renamed to {f.new_path}, which is no test file")
            continue
        if f.new is not None and not f.new.strip() and f.old is not None and f.old.strip():
            result.found.append(f"{f.new_path} emptied")
            continue
        before = test_names(f.old_path, f.old) or set()
        gone = sorted(name for name in before if (_suffix(f.old_path), name) not in after)
        if gone:
            result.found.append(f"{f.new_path}: {', '.join(gone[:5])} removed"
                                + (f" (+{len(gone) - 5})" if len(gone) > 5 else ""))
    result.passed = not result.found
    return result


def _suffix(path: str) -> str:
    return PurePosixPath(path).suffix.lstrip(".")


def _has_rust_tests(path: str | None, data: bytes | None) -> bool:
    return bool(path and path.endswith(".rs") and data and b"#[test]" in data)


# ---------------------------------------------------------------- no-suppression

_PY = ("py", "pyi")
_JS = (*_JS_EXT, "vue", "svelte")
# (what a finding calls it, pattern, the file suffixes it is looked for in); matched on each added
# and removed line: a marker a line only moved does not count
_MARKERS: list[tuple[str, re.Pattern[str], tuple[str, ...]]] = [
    ("@pytest.mark.skip", lazyre.compile(r"\bpytest\.mark\.skip(?:if)?\b"), _PY),
    ("@pytest.mark.xfail", lazyre.compile(r"\bpytest\.mark\.xfail\b"), _PY),
    ("pytest.skip()", lazyre.compile(r"\bpytest\.(?:skip|xfail)\s*\("), _PY),
    ("@unittest.skip",
     lazyre.compile(r"\bunittest\.skip(?:If|Unless)?\b|\bself\.skipTest\s*\(|@unittest\.expectedFailure"), _PY),
    ("# noqa", lazyre.compile(r"#\s*noqa\b", re.IGNORECASE), _PY),
    ("# type: ignore", lazyre.compile(r"#\s*type:\s*ignore\b"), _PY),
    ("# pyright: ignore", lazyre.compile(r"#\s*pyright:\s*ignore\b"), _PY),
    ("# pylint: disable", lazyre.compile(r"#\s*pylint:\s*disable\b"), _PY),
    ("eslint-disable", lazyre.compile(r"\beslint-disable\b"), _JS),
    ("@ts-ignore", lazyre.compile(r"@ts-(?:ignore|nocheck|expect-error)\b"), _JS),
    (".skip()", lazyre.compile(r"\b(?:it|test|describe)\.(?:skip|todo)\s*\(|\bx(?:it|test|describe)\s*\("), _JS),
    ("#[ignore]", lazyre.compile(r"#\[ignore\b"), ("rs",)),
    ("t.Skip", lazyre.compile(r"\b\w+\.Skip(?:Now|f)?\s*\("), ("go",)),
    ("//nolint", lazyre.compile(r"//\s*nolint\b"), ("go",)),
    ("@Disabled", lazyre.compile(r"@(?:Disabled|Ignore)\b"), ("java", "kt")),
]
_ASSERTION = lazyre.compile(r"^\s*(?:assert\b|self\.assert\w*\s*\(|expect\s*\(|assert(?:_eq|_ne)?!\s*\(|"
                        r"assert\w*\s*\(|(?:t|b)\.(?:Error|Errorf|Fatal|Fatalf|Fail)\w*\s*\(|require\.\w+\s*\()")
_COMMENT = lazyre.compile(r"^\s*(?:#|//|/\*|\*)\s?")
_NOOP_ASSERTIONS = lazyre.compile(
    r"^\s*(?:assert\s+(?:True|1|not\s+(?:False|None|0))\s*(?:,.*)?$"
    r"|self\.assert(?:True|Equal)\s*\(\s*(?:True|1)\s*(?:,\s*(?:True|1)\s*)?\)"
    r"|expect\s*\(\s*(true|1)\s*\)\s*\.\s*(?:toBe|toEqual|toBeTruthy)\s*\(\s*(?:true|1)?\s*\)"
    r"|assert!\s*\(\s*true\s*\)"
    r"|assert_eq!\s*\(\s*(\w+)\s*,\s*\2\s*\)"
    r"|assert(?:True|Equals)\s*\(\s*(?:true|1)\s*(?:,\s*(?:true|1)\s*)?\))")


# What a conftest.py or the runner's configuration adds that drops or rewrites tests: the hooks
# that deselect, collect or report, an exit before the tests run; `-k`, `--deselect`, `--ignore`,
# a plugin turned off in addopts.
_HOOKS = ("collection_modifyitems", "ignore_collect", "deselected", "collect_file", "pycollect_makeitem",
          "runtest_protocol", "runtest_setup", "runtest_call", "runtest_makereport", "pyfunc_call",
          "report_teststatus")
_CONFTEST_MARKERS: list[tuple[str, re.Pattern[str]]] = [
    *((f"pytest_{hook}", lazyre.compile(rf"^\s*(?:async\s+)?def\s+pytest_{hook}\b")) for hook in _HOOKS),
    ("os._exit", lazyre.compile(r"\bos\._exit\s*\(")),
]
_CONFIG_FILES = ("pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg", "pyproject.toml")
_CONFIG_MARKERS: list[tuple[str, re.Pattern[str]]] = [
    ("--deselect", lazyre.compile(r"--deselect\b")),
    ("--ignore", lazyre.compile(r"--ignore(?:-glob)?\b")),
    ("-k", lazyre.compile(r"(?:^|[\s\"'=\[,])-k(?=[\s=\"']|$)")),
    ("-p no:", lazyre.compile(r"-p\s*no:")),
]


def _no_suppression(change: Change) -> Result:
    result = Result(NO_SUPPRESSION, True)
    for f in change.files:
        if f.new_path is None:
            continue
        suffix = _suffix(f.new_path)
        name = f.new_path.rpartition("/")[2]
        markers = [(label, pattern) for label, pattern, suffixes in _MARKERS if suffix in suffixes]
        if name == "conftest.py":
            markers += _CONFTEST_MARKERS
        if name in _CONFIG_FILES:
            markers += _CONFIG_MARKERS
        for label, pattern in markers:
            more = _count(pattern, f.added) - _count(pattern, f.removed)
            if more > 0:
                where = _first_line(f.new, pattern, f.added)
                result.found.append(f"{f.new_path}{where} adds {label}" + (f" ({more} times)" if more > 1 else ""))
        if suffix == "py":
            result.found.extend(_aliased_skips(f))
        if is_test_file(f.new_path) or _has_rust_tests(f.new_path, f.new):
            result.found.extend(f"{f.new_path}: {what}" for what in _assertions_made_noop(f))
    result.passed = not result.found
    return result


_SKIPS = frozenset({"pytest.skip", "pytest.xfail", "pytest.importorskip", "pytest.mark.skip", "pytest.mark.skipif",
                    "pytest.mark.xfail", "unittest.skip", "unittest.skipIf", "unittest.skipUnless",
                    "unittest.expectedFailure"})


def _aliased_skips(f: _File) -> list[str]:
    """A skip spelled through an alias (`import pytest as P`, `from pytest import skip`, `from
    pytest import mark`), more of them after the change than before: the literal spellings are
    `_MARKERS`' to find."""
    after, before = _skip_uses(f.new), _skip_uses(f.old)
    if len(after) <= len(before):
        return []
    line, what = after[0]
    more = len(after) - len(before)
    return [f"{f.new_path}:{line} adds a skip through an alias ({what})" + (f" ({more} times)" if more > 1 else "")]


def _skip_uses(data: bytes | None) -> list[tuple[int, str]]:
    import ast

    if not data:
        return []
    try:
        tree = ast.parse(data.decode("utf-8", "replace"))
    except (SyntaxError, ValueError):
        return []
    modules: dict[str, str] = {}  # a local name -> the module it stands for, under another name
    names: dict[str, str] = {}  # a local name -> the skip it is
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in ("pytest", "unittest") and alias.asname and alias.asname != alias.name:
                    modules[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module in ("pytest", "unittest", "pytest.mark"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in _SKIPS:
                    names[alias.asname or alias.name] = full
                elif full == "pytest.mark":
                    modules[alias.asname or alias.name] = full
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in names:
            uses.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            root, _, rest = dotted.partition(".") if dotted else ("", "", "")
            if dotted and root in modules and f"{modules[root]}.{rest}" in _SKIPS:
                uses.append((node.lineno, dotted))
    return sorted(uses)


def _dotted(node: ast.expr) -> str | None:
    import ast

    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _count(pattern: re.Pattern[str], lines: list[str]) -> int:
    return sum(len(pattern.findall(line)) for line in lines)


def _first_line(data: bytes | None, pattern: re.Pattern[str], added: list[str]) -> str:
    """`:12`, the line number in the new file of the first added line with the marker ("" if unknown)."""
    if data is None:
        return ""
    marked = {line.rstrip("\n") for line in added if pattern.search(line)}
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if line in marked:
            return f":{number}"
    return ""


def _assertions_made_noop(f: _File) -> list[str]:
    removed = [line.strip() for line in f.removed if _ASSERTION.match(line)]
    if not removed:
        return []
    found = []
    kept = {line.strip() for line in f.added}
    for line in f.added:
        stripped = line.strip()
        uncommented = _COMMENT.sub("", stripped, count=1).strip() if _COMMENT.match(stripped) else None
        if uncommented and uncommented in removed and uncommented not in kept:
            found.append(f"assertion commented out: {uncommented[:80]}")
        elif _NOOP_ASSERTIONS.match(stripped):
            found.append(f"assertion replaced by one that always holds: {stripped[:80]}")
    return found


# ---------------------------------------------------------------- paths=GLOB

def glob_regex(glob: str) -> re.Pattern[str]:
    """`src/**` -> any path below src/; `*` and `?` stay inside one folder; `{a,b}` either."""
    out, i = "", 0
    while i < len(glob):
        char = glob[i]
        if glob.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
            continue
        if glob.startswith("**", i):
            out += ".*"
            i += 2
            continue
        if char == "*":
            out += "[^/]*"
        elif char == "?":
            out += "[^/]"
        elif char == "{":
            end = glob.find("}", i)
            if end == -1:
                out += re.escape(char)
            else:
                out += "(?:" + "|".join(re.escape(p) for p in glob[i + 1:end].split(",")) + ")"
                i = end
        else:
            out += re.escape(char)
        i += 1
    if glob.endswith("/"):
        out += ".*"
    return re.compile(out + r"\Z")


def _paths(change: Change, globs: list[str]) -> Result:
    patterns = [glob_regex(g) for g in globs]
    outside = [p for p in change.paths() if not any(r.match(p) for r in patterns)]
    shown = "paths=" + ",".join(globs)
    found = [f"{p} is outside {', '.join(globs)}" for p in outside]
    return Result(shown, not outside, found, outside)
