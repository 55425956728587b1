"""The judge out of the job's reach (issue 39, docs/verify.md "The judge"): verify passes only when
the job's code passes tests it could not touch.

A real repository holds a function with a bug and its tests; the verify is a real
`python -m pytest` (this suite's venv has pytest). Each gaming job is a shell job whose task does
one trick an agent told "make the tests pass" could do; none may end `done · verify passed`. The
text checks are off for them (`--check none`): the guarantee is the judge's, not a pattern's.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import git, kill_worker_and_engine, make_repo, wait_until

# Plugins of this suite's venv (ray's, xdist, anyio) would cost each run a second or more.
VERIFY = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q -p no:randomly"

CALC = "def add(a, b):\n    return a - b\n"  # the bug
CONFTEST = "import pytest\n\n\n@pytest.fixture\ndef two():\n    return 2\n"
PYPROJECT = '[project]\nname = "calc"\nversion = "0"\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n'
TESTS = ("from calc import add\nfrom five import FIVE\n\n\n"
         "def test_add(two):\n    result = add(two, 3)\n    assert result == FIVE\n\n\n"
         "def test_zero():\n    assert add(0, 0) == 0\n")

DROP_ADD = ("\n\ndef pytest_collection_modifyitems(items):\n"
            "    items[:] = [item for item in items if item.name != 'test_add']\n")
PATCH_ADD = "\nimport calc\ncalc.add.__code__ = (lambda a, b: a + b).__code__\n"

# One job per way of gaming the tests (a shell script each), none of which fixes calc.py.
TRICKS = {
    "deleted assertion": "sed -i '/assert result == FIVE/d' tests/test_calc.py",
    "pass for the assertion": "sed -i 's/assert result == FIVE/pass/' tests/test_calc.py",
    "early return": r"sed -i 's/^    result = add(two, 3)$/    return\n    result = add(two, 3)/' tests/test_calc.py",
    "tautology": "sed -i 's/assert result == FIVE/assert result == result or True/' tests/test_calc.py",
    "aliased skip": ("sed -i '1i import pytest as P' tests/test_calc.py; "
                     r"sed -i 's/^def test_add(two):$/@P.mark.skip\ndef test_add(two):/' tests/test_calc.py"),
    "conftest drops the test": f"cat >> conftest.py <<'EOF'\n{DROP_ADD}EOF",
    "conftest monkeypatches the code": f"cat >> conftest.py <<'EOF'\n{PATCH_ADD}EOF",
    "conftest exits 0": "printf '\\nimport os\\nos._exit(0)\\n' >> conftest.py",
    "addopts -k in [tool.pytest.ini_options]": "cat >> pyproject.toml <<'EOF'\naddopts = \"-k 'not test_add'\"\nEOF",
    "--deselect in a new pytest.ini": ("printf '[pytest]\\naddopts = --deselect tests/test_calc.py::test_add\\n' "
                                       "> pytest.ini"),
    "a pytest/ package": ("mkdir pytest && touch pytest/__init__.py && "
                          "printf 'import sys\\nsys.exit(0)\\n' > pytest/__main__.py"),
    "a new tests/conftest.py drops the test": f"cat > tests/conftest.py <<'EOF'\n{DROP_ADD}EOF",
    "a new test module patches the code at import": (f"cat > tests/test_a_patch.py <<'EOF'\n{PATCH_ADD}\n\n"
                                                      "def test_nothing():\n    pass\nEOF"),
    "an ignored conftest.py": ("echo tests/conftest.py >> .gitignore; "
                               f"cat > tests/conftest.py <<'EOF'\n{DROP_ADD}EOF"),
    # the same size, so only its bytes tell
    "a test edited behind skip-worktree": ("git update-index --skip-worktree tests/test_calc.py; "
                                           "sed -i 's/assert result == FIVE/assert result <= FIVE/' "
                                           "tests/test_calc.py"),
    # Python's cached bytecode of a gamed helper, left beside the helper restored to its size and time
    "a stale .pyc of a gamed helper": ("unset PYTHONDONTWRITEBYTECODE; cp -p tests/five.py $TMPDIR/orig; "
                                       "printf 'FIVE =-1\\n' > tests/five.py; touch -r $TMPDIR/orig tests/five.py; "
                                       "python -c 'import sys; sys.path.insert(0, \"tests\"); import five'; "
                                       "cp -p $TMPDIR/orig tests/five.py"),
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


CALC_FILES = {"calc.py": CALC, "conftest.py": CONFTEST, "pyproject.toml": PYPROJECT, "tests/test_calc.py": TESTS,
              "tests/five.py": "FIVE = 5\n", ".gitignore": "__pycache__/\n.pytest_cache/\n"}


def calc_repo(path: Path) -> Path:
    return make_repo(path, CALC_FILES)


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


def test_an_honest_job_that_adds_tests_passes_and_its_own_tests_are_reported_apart(calc, cli_of):
    cli = cli_of(calc)
    job = cli.start(HONEST["fix it and add a passing test file"], "--verify", VERIFY)
    ended(cli, job)
    result = cli("result", job).stdout
    assert result.startswith(f"{job} done · verify passed")
    assert "judge: tests from the base " in result
    assert "not used, the job's: tests/test_more.py (added) · ran on tree " in result
    assert result.split(" · ran on tree ", 1)[1].split(" · ", 1)[1].startswith("its own tests: passed")
    verify = cli.json("show", job)["state_detail"]["attempts"][-1]["verify"]
    base = git(calc, "rev-parse", f"refs/subtask/{job}/base")
    assert verify["harness"]["source"] == "base" and verify["harness"]["commit"] == base
    assert (verify["harness"]["own"]["passed"] is True
            and verify["harness"]["own"]["tests"] == {"passed": 3, "failed": 0})
    # the tree it ran on: the job's code and the base's tests (its new test file left out)
    ran_on = verify["harness"]["tree"]
    assert git(calc, "ls-tree", "--name-only", "-r", ran_on) == git(calc, "ls-tree", "--name-only", "-r", base)
    assert git(calc, "rev-parse", f"{ran_on}:calc.py") == git(calc, "rev-parse", f"subtask/{job}:calc.py")


def test_a_job_started_with_harness_job_is_judged_by_its_own_tests_and_says_so(tmp_path, cli_of):
    wrong = "from calc import add\n\n\ndef test_add():\n    assert add(2, 2) == 5\n"  # the test is wrong
    repo = make_repo(tmp_path / "wrong", {"calc.py": "def add(a, b):\n    return a + b\n", "tests/test_calc.py": wrong})
    cli = cli_of(repo)
    correct_the_test = "sed -i 's/== 5/== 4/' tests/test_calc.py"
    ruled = cli.start(correct_the_test, "--verify", VERIFY)  # the base's wrong test judges it
    own = cli.start(correct_the_test, "--verify", VERIFY, "--harness", "job")
    ended(cli, ruled)
    ended(cli, own)
    assert one_line(cli, ruled).startswith(f"{ruled} done · verify failed")
    assert "not used, the job's: tests/test_calc.py · ran on tree" in cli("result", ruled).stdout
    assert "its own tests: passed" in cli("result", ruled).stdout
    assert one_line(cli, own).startswith(f"{own} done · verify passed")
    assert cli.json("show", own)["spec"]["harness"] == []
    note = git(repo, "notes", "--ref=subtask", "show", f"subtask/{own}")
    for text in (cli("result", own).stdout, cli.ok("show", own), note, mcp_result(repo, own)):
        assert "judged by its own tests (--harness job)" in text


def mcp_result(repo: Path, job: str) -> str:
    """What the MCP `result` tool answers (the real SDK client, in process)."""
    import anyio
    from mcp import Client

    from subtask.faces.mcp_server import server

    async def main() -> str:
        async with Client(server, mode="legacy") as client:
            answer = await client.call_tool("result", {"id": job})
            return answer.content[0].text

    cwd = os.getcwd()
    os.chdir(repo)
    try:
        return anyio.run(main)
    finally:
        os.chdir(cwd)


@pytest.mark.slow
@pytest.mark.parametrize("trick", ["pass for the assertion", "a new tests/conftest.py drops the test"])
def test_land_verifies_with_the_targets_tests_and_lands_no_gamed_job(calc, cli_of, trick):
    cli = cli_of(calc)
    job = cli.start(TRICKS[trick], "--verify", VERIFY, "--check", "none")
    ended(cli, job)
    before = git(calc, "rev-parse", "main")
    # past the gate: the integrated commit is verified all the same (run here: not the worker's
    # result for this very tree reused, issue 43, which fails it too)
    landed = cli("land", "--force", "--no-reuse", job)
    assert landed.returncode == 1, landed.stdout
    assert f"{job}: failed: its verify failed on the integrated commit" in landed.stdout
    assert f"judge:  tests from main at {before[:7]}" in landed.stdout
    assert git(calc, "rev-parse", "main") == before
    assert not list((calc / ".subtask" / "worktrees" / ".land").glob("*.harness"))


def test_a_batch_is_judged_by_the_targets_tests_never_by_a_job_inside_it(calc, cli_of):
    """`land --batch` verifies only a batch's last state: the tests judging it are the target's,
    never those of a job ahead of it in the batch, which no trusted test ever judged (issue 43)."""
    cli = cli_of(calc)
    subprocess.run(["sh", "-c", FIX], cwd=calc, check=True)
    git(calc, "commit", "-qam", "fix the bug")
    gamed = cli.start(f"sed -i 's/a + b/a - b/' calc.py; {TRICKS['pass for the assertion']}; git commit -qam gamed",
                      "--verify", VERIFY, "--check", "none")
    honest = cli.start("echo note > NOTE.txt && git add NOTE.txt && git commit -qm note", "--verify", VERIFY)
    ended(cli, gamed), ended(cli, honest)
    before = git(calc, "rev-parse", "main")
    landed = cli("land", "--batch", "--force", gamed, honest, timeout=300)
    assert landed.returncode == 1 and f"{gamed}: failed" in landed.stdout, landed.stdout + landed.stderr
    assert f"{honest}: landed" in landed.stdout, landed.stdout
    assert "return a + b" in git(calc, "show", "main:calc.py") and git(calc, "rev-parse", "main") != before


@pytest.mark.slow
@pytest.mark.parametrize("trick", ["conftest exits 0", "a new test module patches the code at import"])
def test_verify_run_judges_a_job_by_the_tests_of_the_branch_it_lands_on(calc, cli_of, trick):
    cli = cli_of(calc)
    job = cli.start(TRICKS[trick], "--verify", VERIFY, "--check", "none")
    ended(cli, job)
    checked = cli("verify", job, "--run", "--no-reuse")  # run here, not the worker's result reused
    run = next(line for line in checked.stdout.splitlines() if "verify --run:" in line)
    assert "failed (exit 1) here" in run and f"tests from main at {git(calc, 'rev-parse', 'main')[:7]}" in run, run


@pytest.mark.slow
def test_a_teammates_record_that_opts_out_is_rerun_with_our_tests(tmp_path):
    """`--harness job` in a record this clone cannot trust is the teammate's word: a re-run here
    judges the job by the tests of the branch it lands on."""
    from conftest import make_team

    remote, ((theirs, their_cli), (ours, our_cli)) = make_team(tmp_path)
    for name, text in CALC_FILES.items():
        (theirs / name).parent.mkdir(exist_ok=True)
        (theirs / name).write_text(text)
    git(theirs, "add", "-A")
    git(theirs, "commit", "-qm", "calc")
    git(theirs, "push", "-q", "origin", "HEAD:main")
    git(ours, "pull", "-q", "origin", "main")
    job = their_cli.start(TRICKS["conftest drops the test"], "--verify", VERIFY, "--check", "none",
                          "--harness", "job")
    their_cli("wait", job)
    assert one_line(their_cli, job).startswith(f"{job} done · verify passed")  # by its own tests
    their_cli.ok("push")
    git(theirs, "push", "-q", "origin", f"subtask/{job}")
    our_cli.ok("pull")
    git(ours, "fetch", "-q", "origin", f"subtask/{job}")
    checked = our_cli("verify", job, "--run")
    run = next(line for line in checked.stdout.splitlines() if "verify --run:" in line)
    assert run.startswith("MISMATCH") and "failed (exit 1) here" in run and "tests from main at" in run, run


@pytest.mark.slow
def test_a_job_that_replaces_the_tests_folder_by_a_link_never_gets_the_trusted_tests_written_through_it(
        calc, cli_of, control_dir):
    cli = cli_of(calc)
    job = cli.start(f"git rm -rq tests && ln -s {control_dir} tests && git add tests", "--verify", VERIFY,
                    "--check", "none")
    ended(cli, job)
    assert " · verify failed" in one_line(cli, job)  # the base's tests ran, in a real folder
    assert list(control_dir.iterdir()) == []  # nothing was written through the link
    assert os.readlink(worktree(calc, job) / "tests") == str(control_dir)


@pytest.fixture
def control_dir(calc, tmp_path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    return path


@pytest.mark.slow
def test_files_the_setup_made_are_not_the_jobs_and_stay_for_the_verdict(calc, cli_of):
    """An ignored test fixture `subtask.setup` writes is no file the job added."""
    git(calc, "config", "subtask.setup", "echo 2 > tests/two.txt")
    (calc / ".gitignore").write_text("__pycache__/\n.pytest_cache/\ntests/two.txt\n")
    (calc / "conftest.py").write_text("import pathlib\n\nimport pytest\n\n\n@pytest.fixture\ndef two():\n"
                                      "    return int(pathlib.Path('tests/two.txt').read_text())\n")
    git(calc, "commit", "-qam", "two from a file the setup writes")
    cli = cli_of(calc)
    job = cli.start(FIX, "--verify", VERIFY)
    ended(cli, job)
    assert one_line(cli, job).startswith(f"{job} done · verify passed"), cli("result", job).stdout
    assert "the job changed none of them" in cli("result", job).stdout


@pytest.mark.slow
def test_a_retry_is_told_what_the_trusted_tests_said(calc, cli_of):
    cli = cli_of(calc)
    told = "cp \"$SUBTASK_VERIFY_OUTPUT\" told.txt; " + FIX
    job = cli.start(f"if [ -n \"$SUBTASK_RETRY\" ]; then {told}; else {TRICKS['pass for the assertion']}; fi",
                    "--verify", VERIFY, "--check", "none", "--retries", "1")
    ended(cli, job)
    assert one_line(cli, job).startswith(f"{job} done · verify passed")
    report = git(calc, "show", f"subtask/{job}:told.txt")
    assert "judge: tests from the base" in report and "not used, the job's: tests/test_calc.py" in report
    assert "FAILED tests/test_calc.py::test_add - assert -1 == 5" in report


@pytest.mark.slow
def test_a_worker_killed_during_its_verify_leaves_the_job_its_own_files(calc, cli_of, tmp_path):
    gate = tmp_path / "gate"
    git(calc, "config", "--add", "subtask.isolation.writable", str(tmp_path))
    cli = cli_of(calc)
    # verify waits while the trusted tests are laid over the job's: the worker is killed then
    hold = f"touch {tmp_path}/verifying; while [ ! -e {gate} ]; do sleep 0.05; done; {VERIFY}"
    job = cli.start("echo gamed > tests/conftest.py; " + TRICKS["pass for the assertion"], "--verify", hold,
                    "--check", "none")
    assert wait_until(lambda: (tmp_path / "verifying").exists(), timeout=120)
    tree = worktree(calc, job)
    assert (tree / "tests/test_calc.py").read_text() == TESTS and not (tree / "tests/conftest.py").exists()
    kill_worker_and_engine(calc, job)
    gate.touch()
    # the next attempt (or whoever settles the dead worker) puts the job's files back first
    cli("wait", job)
    reply = "cat tests/conftest.py > seen.txt; grep -c pass tests/test_calc.py >> seen.txt"
    cli.ok("reply", job, reply)
    cli("wait", job)
    assert git(calc, "show", f"subtask/{job}:seen.txt").split() == ["gamed", "1"]
    assert not (calc / ".subtask" / "worktrees" / ".harness" / job / "overlay").exists()


def test_harness_needs_a_verify_and_a_relative_glob(repo, cli_of):
    cli = cli_of(repo)
    refused = cli("start", "--harness", "job", "true")
    assert refused.returncode == 129 and "--harness goes with --verify" in refused.stderr
    refused = cli("start", "--verify", "true", "--harness", "../outside/**", "true")
    assert refused.returncode == 129 and "relative to the repository's top" in refused.stderr
    assert git(repo, "for-each-ref", "refs/subtask/") == ""


def test_a_pyproject_keeps_the_jobs_tables_and_takes_the_bases_pytest_table(calc, cli_of):
    cli = cli_of(calc)
    edit = (f"{FIX}; sed -i 's/^version = \"0\"$/version = \"0\"\\ndependencies = [\"requests\"]/' pyproject.toml; "
            "printf 'addopts = \"-k not_here\"\\n' >> pyproject.toml")
    # passes only on the job's [project] beside the base's [tool.pytest.ini_options]
    verify = f"grep -q requests pyproject.toml && ! grep -q addopts pyproject.toml && {VERIFY}"
    job = cli.start(edit, "--verify", verify, "--check", "none")
    ended(cli, job)
    result = cli("result", job).stdout
    assert result.startswith(f"{job} done · verify passed"), result
    assert "not used, the job's: pyproject.toml [tool.pytest]" in result
    assert b"addopts" in (worktree(calc, job) / "pyproject.toml").read_bytes()  # the job's, back in place


@pytest.mark.slow
def test_a_best_of_judge_scores_each_member_with_its_bases_tests(calc, cli_of):
    """A member that adds tests of its own (collected by the judge's pytest) scores no higher for it."""
    cli = cli_of(calc)
    more = ("printf 'def test_a():\\n    pass\\n\\n\\ndef test_b():\\n    pass\\n' > tests/test_padding.py")
    task = f'{FIX}; if [ "$SUBTASK_GROUP_MEMBER" = 1 ]; then {more}; fi'
    judge = f"{VERIFY} --collect-only | grep -c '::'"  # the score: how many tests it collects
    out = cli.ok("start", "--best-of", "2", task, "--verify", VERIFY, "--judge", judge)
    gid = out.splitlines()[0].split()[0]
    cli("wait", gid)
    table = cli.json("show", gid)["table"]
    assert sorted(row.get("score") for row in table) == [2, 2], table  # the base's two tests, for both
