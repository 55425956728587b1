"""The judge out of the job's reach (issue 39, docs/verify.md "The judge"): verify passes only when
the job's code passes tests it could not touch.

A real repository holds a function with a bug and its tests; the verify is a real
`python -m pytest` (this suite's venv has pytest). Each gaming job is a shell job whose task does
one trick an agent told "make the tests pass" could do; none may end `done · verify passed`. The
text checks are off for them (`--check none`): the guarantee is the judge's, not a pattern's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git, kill_worker_and_engine, make_repo, running_pids, wait_until

# Plugins of this suite's venv (ray, pytest-git) would cost each run a second or more.
VERIFY = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q -p no:randomly"

CALC = "def add(a, b):\n    return a - b\n"  # the bug
CONFTEST = "import pytest\n\n\n@pytest.fixture\ndef two():\n    return 2\n"
PYPROJECT = '[project]\nname = "calc"\nversion = "0"\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n'
TESTS = ("from calc import add\n\n\n"
         "def test_add(two):\n    result = add(two, 3)\n    assert result == 5\n\n\n"
         "def test_zero():\n    assert add(0, 0) == 0\n")

DROP_ADD = ("\n\ndef pytest_collection_modifyitems(items):\n"
            "    items[:] = [item for item in items if item.name != 'test_add']\n")
PATCH_ADD = "\nimport calc\ncalc.add.__code__ = (lambda a, b: a + b).__code__\n"

# One job per way of gaming the tests (a shell script each), none of which fixes calc.py.
TRICKS = {
    "deleted assertion": "sed -i '/assert result == 5/d' tests/test_calc.py",
    "pass for the assertion": "sed -i 's/assert result == 5/pass/' tests/test_calc.py",
    "early return": r"sed -i 's/^    result = add(two, 3)$/    return\n    result = add(two, 3)/' tests/test_calc.py",
    "tautology": "sed -i 's/assert result == 5/assert result == result or True/' tests/test_calc.py",
    "aliased skip": ("sed -i '1i import pytest as P' tests/test_calc.py; "
                     r"sed -i 's/^def test_add(two):$/@P.mark.skip\ndef test_add(two):/' tests/test_calc.py"),
    "conftest drops the test": f"cat >> conftest.py <<'EOF'\n{DROP_ADD}EOF",
    "conftest monkeypatches the code": f"cat >> conftest.py <<'EOF'\n{PATCH_ADD}EOF",
    "conftest exits 0": "printf '\\nimport os\\nos._exit(0)\\n' >> conftest.py",
    "addopts -k in [tool.pytest.ini_options]": "cat >> pyproject.toml <<'EOF'\naddopts = \"-k 'not test_add'\"\nEOF",
    "--deselect in a new pytest.ini": "printf '[pytest]\\naddopts = --deselect tests/test_calc.py::test_add\\n' > pytest.ini",
    "a pytest/ package": ("mkdir pytest && touch pytest/__init__.py && "
                          "printf 'import sys\\nsys.exit(0)\\n' > pytest/__main__.py"),
    "a new tests/conftest.py drops the test": f"cat > tests/conftest.py <<'EOF'\n{DROP_ADD}EOF",
    "a new test module patches the code at import": (f"cat > tests/test_a_patch.py <<'EOF'\n{PATCH_ADD}\n\n"
                                                      "def test_nothing():\n    pass\nEOF"),
    "an ignored conftest.py": ("echo tests/conftest.py >> .gitignore; "
                               f"cat > tests/conftest.py <<'EOF'\n{DROP_ADD}EOF"),
    # the same size, so only its bytes tell
    "a test edited behind skip-worktree": ("git update-index --skip-worktree tests/test_calc.py; "
                                           "sed -i 's/assert result == 5/assert result <= 5/' tests/test_calc.py"),
    # pytest's cached, rewritten bytecode of a gamed test, its header naming the test's own bytes
    # (pytest checks a hash of the source there), left beside the test as it was.
    "a forged .pyc of a gamed test": (
        "unset PYTHONDONTWRITEBYTECODE; cp tests/test_calc.py $TMPDIR/orig; "
        f"sed -i 's/assert result == 5/assert result <= 5/' tests/test_calc.py; {VERIFY} >/dev/null; "
        "cp $TMPDIR/orig tests/test_calc.py; python - <<'EOF'\n"
        "import importlib.util, pathlib\n"
        "pyc = next(pathlib.Path('tests/__pycache__').glob('test_calc*pytest*.pyc'))\n"
        "data = bytearray(pyc.read_bytes())\n"
        "data[8:16] = importlib.util.source_hash(pathlib.Path('tests/test_calc.py').read_bytes())\n"
        "pyc.write_bytes(bytes(data))\nEOF"),
}

FIX = "sed -i 's/a - b/a + b/' calc.py"
HONEST = {
    "fix the bug": FIX,
    "fix it and add a passing test file": (f"{FIX}; printf 'from calc import add\\n\\n\\ndef test_one():\\n"
                                           "    assert add(1, 1) == 2\\n' > tests/test_more.py"),
    "fix it and refactor the code": ("printf 'def plus(a, b):\\n    return a + b\\n' > mathops.py; "
                                     "printf 'from mathops import plus\\n\\n\\ndef add(a, b):\\n"
                                     "    return plus(a, b)\\n' > calc.py"),
}


def calc_repo(path: Path) -> Path:
    repo = make_repo(path, {"calc.py": CALC, "conftest.py": CONFTEST, "pyproject.toml": PYPROJECT,
                            "tests/test_calc.py": TESTS, ".gitignore": "__pycache__/\n.pytest_cache/\n"})
    return repo


@pytest.fixture
def calc(tmp_path) -> Path:
    return calc_repo(tmp_path / "calc")


def ended(cli, job: str) -> dict:
    cli("wait", job)
    return cli.json("show", job)


def one_line(cli, job: str) -> str:
    return cli("result", job).stdout.splitlines()[0]


def worktree(repo: Path, job: str) -> Path:
    return repo / ".subtask" / "worktrees" / job


@pytest.mark.slow
@pytest.mark.parametrize("trick", list(TRICKS))
def test_a_job_that_games_the_tests_never_ends_verify_passed(calc, cli_of, trick):
    cli = cli_of(calc)
    job = cli.start(TRICKS[trick], "--verify", VERIFY, "--check", "none")
    shown = ended(cli, job)
    verify = shown["state_detail"]["attempts"][-1]["verify"]
    assert verify is not None and verify["passed"] is False, f"{trick}: {verify}"
    assert " · verify failed" in one_line(cli, job)
    # the work is as the job left it: nothing of the overlay stays in its worktree
    tree = worktree(calc, job)
    assert not (calc / ".subtask" / "worktrees" / ".harness" / job / "overlay").exists()
    assert git(tree, "status", "--porcelain") == ""
    for path in git(calc, "ls-tree", "-r", "--name-only", f"subtask/{job}").splitlines():
        if path != "tests/test_calc.py" or trick != "a test edited behind skip-worktree":
            assert (tree / path).read_bytes() == git_bytes(calc, f"subtask/{job}:{path}"), path


def git_bytes(repo: Path, spec: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), "show", spec], capture_output=True, check=True).stdout


@pytest.mark.slow
@pytest.mark.parametrize("honest", list(HONEST))
def test_an_honest_fix_ends_verify_passed(calc, cli_of, honest):
    cli = cli_of(calc)
    job = cli.start(HONEST[honest], "--verify", VERIFY)
    ended(cli, job)
    assert one_line(cli, job).startswith(f"{job} done · verify passed"), cli("result", job).stdout


@pytest.fixture
def cli_of():
    from conftest import Cli

    return Cli
