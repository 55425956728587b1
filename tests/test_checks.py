"""Checks on a change from its base (subtask/checks.py), on real commits of a real repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import git, make_repo

from subtask.git import checks
from subtask.git.gitrepo import open_repo
from subtask.model.errors import SubtaskError

PY_TESTS = """import pytest


def test_parse():
    assert parse("1") == 1


class TestEdges:
    def test_empty(self):
        assert parse("") is None

    def test_spaces(self):
        assert parse(" 2 ") == 2
"""


def change(repo: Path, files: dict[str, str | None]) -> tuple[str, str]:
    """Commit `files` (None deletes one) on top of HEAD; (base, head)."""
    base = git(repo, "rev-parse", "HEAD")
    for name, text in files.items():
        path = repo / name
        if text is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", "change")
    return base, git(repo, "rev-parse", "HEAD")


def run(repo: Path, files: dict[str, str | None], which: list[str]) -> dict[str, dict]:
    base, head = change(repo, files)
    return {r["check"]: r for r in checks.run(open_repo(repo), base, head, which)}


@pytest.fixture
def project(tmp_path) -> Path:
    return make_repo(tmp_path / "project", {
        "src/parse.py": "def parse(text):\n    return int(text) if text.strip() else None\n",
        "tests/test_parse.py": PY_TESTS,
        "web/app.test.ts": "test('adds', () => {\n  expect(add(1, 2)).toBe(3);\n});\nit(\"subtracts\", () => {});\n",
        "go/calc_test.go": "package calc\n\nfunc TestAdd(t *testing.T) {\n"
                           "\tif Add(1, 2) != 3 {\n\t\tt.Fatal(\"no\")\n\t}\n}\n",
        "rust/src/lib.rs": "pub fn add(a: i32, b: i32) -> i32 { a + b }\n\n#[cfg(test)]\nmod tests {\n    #[test]\n"
                           "    fn adds() { assert_eq!(super::add(1, 2), 3); }\n}\n",
        "java/src/test/CalcTest.java": "class CalcTest {\n    @Test\n    public void adds() {\n"
                                       "        assertEquals(3, Calc.add(1, 2));\n    }\n}\n",
        "README.md": "hello\n",
    })


def test_a_removed_test_file_fails_no_test_deletion(project):
    result = run(project, {"tests/test_parse.py": None}, [checks.NO_TEST_DELETION])["no-test-deletion"]
    assert result == {"check": "no-test-deletion", "passed": False, "found": ["tests/test_parse.py removed"]}


def test_an_emptied_or_renamed_away_test_file_fails(project):
    found = run(project, {"tests/test_parse.py": "\n"}, [checks.NO_TEST_DELETION])["no-test-deletion"]["found"]
    assert found == ["tests/test_parse.py emptied"]
    git(project, "mv", "go/calc_test.go", "go/calc_old.go")
    git(project, "commit", "-qm", "rename")
    base = git(project, "rev-parse", "HEAD~1")
    result = checks.run(open_repo(project), base, git(project, "rev-parse", "HEAD"), [checks.NO_TEST_DELETION])[0]
    assert result["found"] == ["go/calc_test.go renamed to go/calc_old.go, which is no test file"]


def test_a_removed_test_function_is_named_in_every_language(project):
    edits = {
        "tests/test_parse.py": PY_TESTS.replace("    def test_spaces(self):\n        assert parse(\" 2 \") == 2\n", ""),
        "web/app.test.ts": "test('adds', () => {\n  expect(add(1, 2)).toBe(3);\n});\n",
        "go/calc_test.go": "package calc\n",
        "rust/src/lib.rs": "pub fn add(a: i32, b: i32) -> i32 { a + b }\n#[cfg(test)]\nmod tests {\n    #[test]\n"
                           "    fn other() {}\n}\n",
        "java/src/test/CalcTest.java": "class CalcTest {\n}\n",
    }
    found = run(project, edits, [checks.NO_TEST_DELETION])["no-test-deletion"]["found"]
    assert sorted(found) == ["go/calc_test.go: TestAdd removed", "java/src/test/CalcTest.java: adds removed",
                             "rust/src/lib.rs: adds removed", "tests/test_parse.py: TestEdges.test_spaces removed",
                             "web/app.test.ts: subtracts removed"]


def test_a_test_moved_to_another_test_file_and_new_tests_pass_the_check(project):
    moved = PY_TESTS.replace("def test_parse():\n    assert parse(\"1\") == 1\n", "")
    result = run(project, {"tests/test_parse.py": moved + "\n\ndef test_more():\n    assert True is not False\n",
                           "tests/test_parse_basic.py": "def test_parse():\n    assert parse('1') == 1\n"},
                 [checks.NO_TEST_DELETION])
    assert result["no-test-deletion"] == {"check": "no-test-deletion", "passed": True, "found": []}


@pytest.mark.parametrize("path, before, after, label", [
    ("tests/test_parse.py", "def test_parse():\n", "@pytest.mark.skip(reason='flaky')\ndef test_parse():\n",
     "@pytest.mark.skip"),
    ("tests/test_parse.py", "def test_parse():\n", "@pytest.mark.xfail\ndef test_parse():\n", "@pytest.mark.xfail"),
    ("src/parse.py", "def parse(text):\n", "def parse(text):  # noqa: E501\n", "# noqa"),
    ("src/parse.py", "def parse(text):\n", "def parse(text):  # type: ignore[no-untyped-def]\n", "# type: ignore"),
    ("web/app.test.ts", "test('adds'", "// eslint-disable-next-line\ntest('adds'", "eslint-disable"),
    ("web/app.test.ts", "test('adds'", "// @ts-ignore\ntest('adds'", "@ts-ignore"),
    ("web/app.test.ts", "it(\"subtracts\"", "it.skip(\"subtracts\"", ".skip()"),
    ("rust/src/lib.rs", "    #[test]\n", "    #[test]\n    #[ignore]\n", "#[ignore]"),
    ("go/calc_test.go", "\tif Add", "\tt.Skip(\"later\")\n\tif Add", "t.Skip"),
    ("java/src/test/CalcTest.java", "    @Test\n", "    @Test\n    @Disabled\n", "@Disabled"),
])
def test_an_added_suppression_fails_no_suppression_naming_file_and_line(project, path, before, after, label):
    text = (project / path).read_text()
    assert before in text
    found = run(project, {path: text.replace(before, after, 1)}, [checks.NO_SUPPRESSION])["no-suppression"]["found"]
    assert len(found) == 1 and found[0].startswith(path) and found[0].endswith(f"adds {label}"), found


ALIASED = {
    "import pytest as P": ("import pytest as P\n", "@P.mark.skip\ndef test_parse():\n"),
    "from pytest import skip as later": ("from pytest import skip as later\n",
                                         "def test_parse():\n    later('soon')\n"),
    "from pytest import mark": ("from pytest import mark\n", "@mark.xfail\ndef test_parse():\n"),
    "from unittest import skip": ("import pytest\nfrom unittest import skip\n", "@skip('later')\ndef test_parse():\n"),
}


@pytest.mark.parametrize("alias", list(ALIASED))
def test_a_skip_spelled_through_an_alias_fails_no_suppression(project, alias):
    """An early signal only: the judge (the base's tests) is what holds whatever the spelling."""
    importing, skipping = ALIASED[alias]
    text = PY_TESTS.replace("import pytest\n", importing, 1)
    assert run(project, {"tests/test_parse.py": text}, [checks.NO_SUPPRESSION])["no-suppression"]["found"] == []
    text = text.replace("def test_parse():\n", skipping, 1)
    found = run(project, {"tests/test_parse.py": text}, [checks.NO_SUPPRESSION])["no-suppression"]["found"]
    assert (len(found) == 1 and found[0].startswith("tests/test_parse.py:")
            and "skip through an alias" in found[0]), found


@pytest.mark.parametrize("path, text, label", [
    ("tests/conftest.py", "def pytest_collection_modifyitems(items):\n    items[:] = []\n",
     "pytest_collection_modifyitems"),
    ("conftest.py", "import os\nos._exit(0)\n", "os._exit"),
    ("pytest.ini", "[pytest]\naddopts = --deselect tests/test_parse.py::test_parse\n", "--deselect"),
    ("pyproject.toml", "[tool.pytest.ini_options]\naddopts = \"-k 'not parse'\"\n", "-k"),
])
def test_a_conftest_or_configuration_that_deselects_fails_no_suppression(project, path, text, label):
    found = run(project, {path: text}, [checks.NO_SUPPRESSION])["no-suppression"]["found"]
    assert len(found) == 1 and found[0].startswith(path) and label in found[0], found


def test_a_conftest_with_fixtures_only_passes(project):
    fixture = "import pytest\n\n\n@pytest.fixture\ndef two():\n    return 2\n"
    assert run(project, {"tests/conftest.py": fixture}, [checks.NO_SUPPRESSION])["no-suppression"]["passed"] is True


def test_a_suppression_that_only_moved_is_not_added(project):
    (project / "src/parse.py").write_text("import os  # noqa: F401\n\ndef parse(text):\n    return int(text)\n")
    git(project, "commit", "-qam", "noqa already there")
    moved = "def parse(text):\n    return int(text)\n\nimport os  # noqa: F401\n"
    assert run(project, {"src/parse.py": moved}, [checks.NO_SUPPRESSION])["no-suppression"]["passed"] is True


def test_an_assertion_turned_into_a_no_op_fails_no_suppression(project):
    commented = PY_TESTS.replace('    assert parse("1") == 1', '    # assert parse("1") == 1\n    pass')
    found = run(project, {"tests/test_parse.py": commented}, [checks.NO_SUPPRESSION])["no-suppression"]["found"]
    assert found == ['tests/test_parse.py: assertion commented out: assert parse("1") == 1']
    trivial = (project / "web/app.test.ts").read_text().replace("expect(add(1, 2)).toBe(3)", "expect(true).toBe(true)")
    found = run(project, {"web/app.test.ts": trivial}, [checks.NO_SUPPRESSION])["no-suppression"]["found"]
    assert found == ["web/app.test.ts: assertion replaced by one that always holds: expect(true).toBe(true);"]


def test_paths_names_each_change_outside_the_globs(project):
    result = run(project, {"src/parse.py": "def parse(t):\n    return 1\n", "README.md": "changed\n",
                           "src/sub/deep.py": "x = 1\n", "tests/test_parse.py": None},
                 ["paths=src/**", "paths=docs/*.md"])
    assert result == {"paths=src/**,docs/*.md": {
        "check": "paths=src/**,docs/*.md", "passed": False,
        "found": ["README.md is outside src/**, docs/*.md",
                  "tests/test_parse.py is outside src/**, docs/*.md"],
        "outside": ["README.md", "tests/test_parse.py"]}}


@pytest.mark.parametrize("glob, inside, outside", [
    ("src/**", ["src/a.py", "src/x/y/z.py"], ["srcs/a.py", "a/src/b.py"]),
    ("**/*.md", ["README.md", "docs/a/b.md"], ["README.txt"]),
    ("*.md", ["README.md"], ["docs/a.md"]),
    ("src/{a,b}/*", ["src/a/x", "src/b/y"], ["src/c/x", "src/a/x/y"]),
    ("docs/", ["docs/a", "docs/b/c"], ["doc/a"]),
])
def test_globs_cross_folders_only_with_two_stars(glob, inside, outside):
    pattern = checks.glob_regex(glob)
    assert all(pattern.match(p) for p in inside) and not any(pattern.match(p) for p in outside)


def test_resolve_defaults_only_with_a_verify_and_none_drops_what_came_before():
    assert checks.resolve(None, None, has_verify=True) == ["no-test-deletion", "no-suppression"]
    assert checks.resolve(None, None, has_verify=False) == []
    assert checks.resolve(["paths=src/**"], None, has_verify=True) == ["no-test-deletion", "no-suppression",
                                                                       "paths=src/**"]
    assert checks.resolve(["none", "paths=src/{a,b}/**"], None, has_verify=True) == ["paths=src/{a,b}/**"]
    assert checks.resolve(["none"], "no-suppression", has_verify=True) == []
    assert checks.resolve(None, "no-suppression", has_verify=True) == ["no-suppression"]
    assert checks.resolve(["no-suppression,paths=a/**"], "none", has_verify=True) == ["no-suppression", "paths=a/**"]


def test_a_bad_configured_check_names_the_setting():
    with pytest.raises(SubtaskError) as caught:
        checks.resolve(None, "no-test-deletion,nonsense", has_verify=True)
    assert (caught.value.kind == "fatal"
            and caught.value.message.startswith("git config subtask.git.checks: unknown check"))


@pytest.mark.parametrize("value", ["no-such-check", "paths=", "paths=/etc/**", "paths=../x/**"])
def test_an_unknown_or_unsafe_check_is_a_usage_error(value):
    with pytest.raises(SubtaskError) as caught:
        checks.resolve([value], None, has_verify=True)
    assert caught.value.kind == "usage"


def test_a_change_that_touches_nothing_passes_every_check(project):
    head = git(project, "rev-parse", "HEAD")
    assert all(r["passed"] for r in checks.run(open_repo(project), head, head,
                                               ["no-test-deletion", "no-suppression", "paths=src/**"]))


def test_a_change_of_more_files_than_the_checks_read_fails_every_check_and_says_why(project):
    """5,000 files are read at most: the test file deleted after them is never looked at, so no
    check may pass on that change. Each fails closed, saying how many files it did not read."""
    base = git(project, "rev-parse", "HEAD")
    blob = git(project, "hash-object", "-w", "src/parse.py")
    many = "".join(f"100644 {blob}\taaa/{n:05}.py\n" for n in range(checks.MAX_FILES))
    subprocess.run(["git", "-C", str(project), "update-index", "--index-info"], input=many,
                   text=True, check=True)
    git(project, "rm", "-q", "tests/test_parse.py")  # sorts after aaa/: the 5,001st changed file
    git(project, "commit", "-q", "-m", "5,000 files and a deleted test")
    which = [checks.NO_TEST_DELETION, checks.NO_SUPPRESSION, "paths=aaa/**"]
    results = checks.run(open_repo(project), base, git(project, "rev-parse", "HEAD"), which)
    assert [(r["check"], r["passed"]) for r in results] == [(n, False) for n in which], results
    for r in results:
        assert r["found"][-1] == f"1 changed file beyond the first {checks.MAX_FILES} was not read"
    assert "was not read" in checks.failure_text(results)


def test_a_submodule_entry_naming_a_commit_of_this_repository_is_no_file_to_read(project):
    """A gitlink whose commit this repository holds (a submodule of itself, or one whose commits
    were fetched here) was read as a blob: `AttributeError: Commit has no attribute size` ended
    the checks (mypy saw `repo[oid]` is any object). A pointer, not a file: nothing to read."""
    base = git(project, "rev-parse", "HEAD")
    git(project, "update-index", "--add", "--cacheinfo", f"160000,{base},vendor/self")
    git(project, "commit", "-q", "-m", "a submodule entry")
    head = git(project, "rev-parse", "HEAD")
    which = [checks.NO_TEST_DELETION, checks.NO_SUPPRESSION, "paths=vendor/**"]
    results = checks.run(open_repo(project), base, head, which)
    assert [(r["check"], r["passed"]) for r in results] == [(n, True) for n in which], results
