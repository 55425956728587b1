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
