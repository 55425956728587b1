"""docs/architecture.md points at the code instead of copying it: every module, function and test
it names exists. A rename that leaves the page naming what is gone fails here, so the page's
invariants ("never X, because Y") keep pointing at the docstring and the test that hold them."""

from __future__ import annotations

import ast
import fnmatch
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
CODE = re.compile(r"`([^`\n]+)`")
TEST_REF = re.compile(r"^(?:tests/)?(?:test_)?([\w]+?)(?:\.py)?::([\w*]+)(?:\[[^\]]*\])?$")
FILE_REF = re.compile(r"^[\w/.-]+\.py$")
NAME_REF = re.compile(r"^([a-z_]+)\.([A-Za-z_]\w*)(?:\(\))?$")
# `x.json` is a file's name, `subtask.setup` a setting, `state.landed_in` a record's field: not code.
NOT_CODE = re.compile(r"^(?:subtask|spec|state)\.|\.(?:json|jsonl|lock|txt|md|toml|log|env)$")


@cache
def python_files() -> tuple[Path, ...]:
    return tuple(p for folder in ("subtask", "tests", "bench", "scripts", "hooks")
                 for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


@cache
def defined(path: Path) -> frozenset[str]:
    """Every name a module defines or imports at its top level, and the methods of its classes."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names.update(n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def modules_named(stem: str) -> list[Path]:
    """The subtask modules (or packages) a short name like `records` or `words` may mean, and the
    suite's `conftest`."""
    return [p for p in python_files() if (p.parts[len(ROOT.parts)] == "subtask" or p.name == "conftest.py")
            and (p.stem == stem or (p.name == "__init__.py" and p.parent.name == stem))]


def missing(reference: str) -> str | None:
    """Why a reference in the page names nothing (None: it names something, or is not code)."""
    if match := TEST_REF.match(reference):
        path = ROOT / "tests" / f"test_{match.group(1)}.py"
        if not path.exists():
            return f"no file {path.relative_to(ROOT)}"
        tests = [n for n in defined(path) if n.startswith("test_")]
        return None if fnmatch.filter(tests, match.group(2)) else f"no test {match.group(2)} in {path.name}"
    if FILE_REF.match(reference):
        hits = [p for p in python_files() if p.as_posix().endswith("/" + reference.lstrip("./"))]
        return None if hits else f"no file {reference}"
    if NOT_CODE.search(reference):
        return None
    if (match := NAME_REF.match(reference)) and (found := modules_named(match.group(1))):
        return None if any(match.group(2) in defined(p) for p in found) else \
            f"no {match.group(2)} in {', '.join(str(p.relative_to(ROOT)) for p in found)}"
    return None


def test_every_module_function_and_test_the_page_names_exists():
    wrong = sorted({f"`{ref}`: {why}" for ref in CODE.findall(PAGE.read_text(encoding="utf-8"))
                    if (why := missing(ref))})
    assert wrong == [], "docs/architecture.md names what is not there:\n" + "\n".join(wrong)


def test_the_checker_finds_what_is_gone():
    assert missing("tests/test_layers.py::test_no_two_folders_import_each_other") is None
    assert missing("layers::test_the_rules_catch_*") is None
    assert missing("layers::test_nothing_like_this") == "no test test_nothing_like_this in test_layers.py"
    assert missing("chains.cas_ref") is None and missing("chains.no_such_function") is not None
    assert missing("git/chains.py") is None and missing("git/no_such.py") == "no file git/no_such.py"
    assert missing("os.replace") is None  # not ours: not checked


# The invariants: each bullet of the page's "Invariants" section is one rule, "Never X, because Y",
# shortened, ending in the module whose docstring tells it whole: "... — `subtask/git/pool.py`".
# Only "The whole house" (rules no one module keeps) may name none, and tells them whole.
WHOLE_HOUSE = "The whole house"
KEEPERS = re.compile(r" — ((?:`subtask/[\w/]+\.py`(?:, )?)+)$")
BARE_TEST_REF = re.compile(r"(?<![\w/.`-])((?:tests/)?\w+(?:\.py)?::test_[\w*]*(?:\[[^\]\n]*\])?)")


def invariants() -> list[tuple[str, str]]:
    """(the heading it is under, its text in one line) for each bullet of the Invariants section."""
    found: list[tuple[str, str]] = []
    heading, inside = "", False
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            inside = line.startswith("## Invariants")
        elif not inside:
            continue
        elif line.startswith("### "):
            heading = line[4:]
        elif line.startswith("- "):
            found.append((heading, line[2:]))
        elif line.startswith("  ") and found:
            found[-1] = (heading, f"{found[-1][1]} {line.strip()}")
    return found


ASIDE = re.compile(r"\([^()]*\)")


def words(text: str) -> str:
    """Text compared as words: backticks, emphasis and asides in parentheses dropped (the page's
    short line may leave out what the docstring spells out), any whitespace one space, lower case."""
    text = text.replace("`", "").replace("*", "")
    while (bare := ASIDE.sub("", text)) != text:
        text = bare
    return re.sub(r" ([,;:.])", r"\1", " ".join(text.split())).lower()


def rule(bullet: str) -> str | None:
    """A bullet's "Never X" (its words up to "because"), or None when it is not "Never X, because Y"."""
    said = words(bullet)
    never, because, _ = said.partition(" because ")
    never = never.rstrip(" ,;:")
    return never if because and never.startswith("never ") and len(never.split()) >= 4 else None


@cache
def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def unkept(heading: str, bullet: str) -> str | None:
    """Why an invariant bullet is not kept (None: it is): not "Never X, because Y", no module named,
    or a named module that is gone or whose docstring does not say "Never X"."""
    if not (never := rule(bullet)):
        return "is not 'Never X, because Y'"
    if not (keepers := KEEPERS.search(bullet)):
        return None if heading == WHOLE_HOUSE else "names no module (end it with ' — `subtask/…/module.py`')"
    for name in CODE.findall(keepers.group(1)):
        if not (path := ROOT / name).is_file():
            return f"names {name}, which is not there"
        if never not in words(docstring(path)):
            return f"{name}'s docstring does not say {never!r}"
    return None


def test_every_invariant_is_told_whole_in_the_docstring_of_the_module_it_names():
    bullets = invariants()
    assert len(bullets) > 100, "the Invariants section was not found"
    wrong = [f"{heading}: {bullet[:90]}…: {why}" for heading, bullet in bullets if (why := unkept(heading, bullet))]
    assert wrong == [], "docs/architecture.md's invariants are not kept:\n" + "\n".join(wrong)


def test_every_test_a_module_docstring_names_exists():
    wrong = sorted({f"{path.relative_to(ROOT)}: `{ref}`: {why}" for path in python_files()
                    if path.parts[len(ROOT.parts)] == "subtask"
                    for ref in {*CODE.findall(docstring(path)), *BARE_TEST_REF.findall(docstring(path))}
                    if TEST_REF.match(ref) and (why := missing(ref))})
    assert wrong == [], "a module docstring names a test that is not there:\n" + "\n".join(wrong)


def test_the_invariant_checker_finds_a_rule_gone_from_its_docstring():
    kept = "Never let a line the SDK cannot read reach it unanswered, because it drops it"
    kept += " — `subtask/faces/mcp_server.py`"
    assert unkept("`faces/`", kept) is None
    assert unkept("`faces/`", kept.replace("reach it", "reach the SDK")) is not None  # not what the docstring says
    gone = "names subtask/faces/mcp_serve.py, which is not there"
    assert unkept("`faces/`", kept.replace("mcp_server", "mcp_serve")) == gone
    assert unkept("`faces/`", kept.partition(" — ")[0]).startswith("names no module")
    assert unkept(WHOLE_HOUSE, kept.partition(" — ")[0]) is None
    assert unkept("`faces/`", "Pid files are not fsynced, because") == "is not 'Never X, because Y'"
