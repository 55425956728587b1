"""Issue 38, git's habits: what a person who knows git expects of a git command, each held by a
test.

An interrupt is exit 130 and at most one line, at any point of a command's life; a refusal git
would call fatal exits 128; a repository with no commits is named as such and read commands create
nothing in it; `start` says what the job will not see of the caller's checkout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import blocked_on_run_lock, git, wait_until


def start_held(repo: Path, gate: Path) -> str:
    proc = subprocess.run(["git", "subtask", "start", held(gate)], cwd=repo, capture_output=True,
                          text=True, check=True)
    return proc.stdout.split()[0]


def held(gate: Path) -> str:
    """A shell task that runs until the test creates `gate`."""
    return f"while [ ! -e '{gate}' ]; do sleep 0.02; done"


def running(repo: Path, job: str) -> None:
    from subtask.git.gitrepo import open_repo
    from subtask.state import liveness

    state = open_repo(repo).state_dir
    assert wait_until(lambda: liveness.is_held(state, job)), f"{job} never ran"


# -- 1: an interrupt is never a traceback --


def interrupted(repo: Path, args: list[str], arrived, gap: float, env: dict | None = None):
    """`git-subtask ARGS` sent SIGINT once `arrived()` is true, and again `gap` seconds later (a
    terminal's Ctrl-C reaches git's child twice: from the terminal, and from git, which passes it
    on)."""
    proc = subprocess.Popen(["git-subtask", *args], cwd=repo, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, **(env or {})),
                            # Ctrl-C must reach it even when the suite runs with SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert wait_until(arrived, timeout=60), "the command never reached the point"
        proc.send_signal(signal.SIGINT)
        time.sleep(gap)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


@pytest.mark.parametrize("point", ["cli_start", "cli_dispatch", "cli_end"])
def test_ctrl_c_at_any_point_of_a_command_exits_130_without_a_word(repo, control_dir, point):
    """A Ctrl-C (twice) held at each point of `wait`'s life, from the first line of ours that runs
    to the command's end: 130, nothing on stderr but click's end of the ^C line. Early on it was a
    traceback out of an import; later `OSError: Signal 2 ignored due to race condition`."""
    gate = control_dir / "gate"
    job = start_held(repo, gate)
    args = ["wait", job, *(["--timeout", "0.1"] if point == "cli_end" else [])]
    try:
        for n, gap in enumerate((0, 0.0005, 0.002, 0.01)):
            hold = control_dir / f"hold-{n}"
            reached = control_dir / f"hold-{n}.reached"
            code, out, err = interrupted(repo, args, reached.exists, gap,
                                         env={"SUBTASK_FAULT_HOLD": f"{point}:{hold}"})
            assert code == 130, (point, gap, code, err)
            if point == "cli_end":  # what the command said before it ended, and nothing else
                said = err.splitlines()
                assert said[0].startswith("timed out after 0.1s") and len(said) <= 2, (gap, err)
            else:
                assert err.strip() == "" and out == "", (point, gap, err)
    finally:
        gate.touch()


def test_ctrl_c_while_wait_blocks_on_a_job_exits_130_without_a_word(repo, control_dir):
    gate = control_dir / "gate"
    job = start_held(repo, gate)
    running(repo, job)
    try:
        for gap in (0, 0.0002, 0.001, 0.005):
            blocked = lambda: blocked_on_run_lock(repo, job)  # noqa: E731
            code, out, err = interrupted(repo, ["wait", job], blocked, gap)
            assert code == 130, (gap, code, err)
            assert err.strip() == "" and out == "", (gap, err)
    finally:
        gate.touch()


SWALLOWED = """
import os, signal, sys, time, weakref
from subtask.model import errors

errors.interrupt_once()
class Lock: pass
lock = Lock()
def released(ref):  # as importlib's module-lock callback: Python swallows what is raised here
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10000):  # a few bytecodes: the handler runs here, inside the callback
        pass
kept = weakref.ref(lock, released)
try:
    del lock
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(3)  # the Ctrl-C was lost
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_a_ctrl_c_python_swallows_interrupts_the_command_again():
    """Measured under load: the Ctrl-C's KeyboardInterrupt raised inside importlib's module-lock
    weakref callback, which Python swallows ("Exception ignored in ..."); `wait` went on waiting
    and ignored every later Ctrl-C. Now nothing is printed and the command is interrupted again."""
    import sys

    def default_sigint():
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.run([sys.executable, "-c", SWALLOWED], capture_output=True, text=True,
                          timeout=60, preexec_fn=default_sigint)
    assert (proc.returncode, proc.stderr) == (130, ""), proc.stderr


# -- 2: a refusal git would call fatal exits 128 --


def finished(cli, task: str = "echo done > done.txt") -> str:
    job = cli.start(task)
    cli.ok("wait", job)
    return job


def test_land_on_a_detached_head_is_fatal_and_changes_nothing(cli, repo):
    job = finished(cli)
    git(repo, "checkout", "-q", "--detach")
    before = git(repo, "for-each-ref")
    proc = cli("land", job)
    assert proc.returncode == 128, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: HEAD is detached"), proc.stderr
    assert "hint: git switch main" in proc.stderr
    assert git(repo, "for-each-ref") == before and not (repo / "done.txt").exists()


# -- 3: wait takes any mix of job ids and group ids --


def best_of_two(cli) -> str:
    started = cli.ok("start", "--best-of", "2", "echo $SUBTASK_GROUP_MEMBER > m.txt",
                     "--verify", "true")
    return started.split()[0]


def test_wait_takes_a_group_beside_a_job_and_answers_both(cli, repo, control_dir):
    """`wait st-… sg-…` was refused ("job ids or group ids, not both"). Now it waits for the job
    and settles the group, each said as its own `wait` says it; its exit says whether all passed."""
    gate = control_dir / "gate"
    job = cli.start(f"{held(gate)}; echo job > job.txt")
    gid = best_of_two(cli)
    proc = cli("wait", job, gid, "--timeout", "0.5")  # the job is held: a timeout, nothing refused
    assert proc.returncode == 1 and "timed out" in proc.stderr, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"{job} running"), proc.stdout
    gate.touch()
    waited = cli.json("wait", gid, job)
    assert waited["v"] == 1 and waited["passed"] and not waited["timed_out"], waited
    assert [j["id"] for j in waited["jobs"]] == [job] and waited["jobs"][0]["state"] == "done"
    assert [g["id"] for g in waited["groups"]] == [gid] and waited["groups"][0]["state"] == "picked"
    words = cli.ok("wait", job, gid)
    assert words.startswith(f"{job} done") and gid in words and "pick" in words, words


def test_wait_any_over_a_mix_returns_when_the_first_answers(cli, repo, control_dir):
    gate = control_dir / "gate"
    job = cli.start(held(gate))
    gid = best_of_two(cli)
    try:
        waited = cli("wait", "--any", job, gid, "--json", timeout=120)
        assert waited.returncode == 1, waited.stdout + waited.stderr  # the job still runs
        data = json.loads(waited.stdout)
        assert not data["timed_out"] and data["groups"][0]["state"] == "picked", data
        assert data["jobs"][0]["state"] == "running"
    finally:
        gate.touch()


def test_wait_any_over_a_mix_sees_members_that_end_while_it_concludes(cli, repo, control_dir):
    """The group's members ended after `wait` tried to conclude it and before it read them: it
    then waited on the held job alone and hung (CI, twice). A member's end is never missed."""
    gate, members_gate, hold = control_dir / "gate", control_dir / "members", control_dir / "hold"
    job = cli.start(held(gate))
    started = cli.ok("start", "--best-of", "2", f"{held(members_gate)}; echo $SUBTASK_GROUP_MEMBER > m.txt",
                     "--verify", "true")
    gid = started.split()[0]
    members = json.loads(cli.ok("show", gid, "--json"))["members"]
    waiter = subprocess.Popen(["git-subtask", "wait", "--any", job, gid, "--json"], cwd=repo, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=dict(os.environ, SUBTASK_FAULT_HOLD=f"wait_after_conclude:{hold}"))
    try:
        assert wait_until(lambda: Path(f"{hold}.reached").exists(), timeout=120), "wait never concluded"
        members_gate.touch()
        cli.ok("wait", *members, timeout=120)  # both members ended, after the conclusion was tried
        hold.touch()
        out, err = waiter.communicate(timeout=120)
        assert waiter.returncode == 1, out + err  # the job still runs
        data = json.loads(out)
        assert not data["timed_out"] and data["groups"][0]["state"] == "picked", data
    finally:
        gate.touch()
        members_gate.touch()
        hold.touch()
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()


# -- 4: a repository with no commits; read commands create nothing --

READ_COMMANDS = [["list"], ["list", "--json"], ["status"], ["status", "--json"], ["spend"],
                 ["spend", "--all-clones"], ["engines"], ["doctor"], ["hooks", "status"],
                 ["gc", "--dry-run"], ["cleanup", "--merged", "--dry-run"]]


def everything_in(repo: Path) -> list[str]:
    """Every file and folder under the repository (its .git too), with refs and config."""
    return [*sorted(str(p.relative_to(repo)) for p in repo.rglob("*")), git(repo, "for-each-ref")]


@pytest.fixture
def unborn(tmp_path) -> Path:
    path = tmp_path / "unborn"
    git(tmp_path, "init", "-q", "-b", "main", str(path))
    git(path, "config", "subtask.engine", "shell")
    return path


def test_start_in_a_repository_with_no_commits_says_so_and_makes_nothing(cli, unborn):
    before = everything_in(unborn)
    proc = cli("start", "echo hi > hi.txt", cwd=unborn)
    assert proc.returncode == 128, proc.stderr
    said = proc.stderr.splitlines()
    assert said[0] == "error: this repository has no commits yet: a job starts from one", said
    assert said[1].startswith("hint: ") and "git commit" in said[1] and "git log" not in said[1]
    assert everything_in(unborn) == before


def test_start_on_a_branch_with_no_commits_names_it(cli, repo):
    git(repo, "checkout", "-q", "--orphan", "fresh")
    proc = cli("start", "echo hi > hi.txt")
    assert proc.returncode == 128, proc.stderr
    assert "error: the current branch fresh has no commits yet" in proc.stderr, proc.stderr


@pytest.mark.parametrize("where", ["unborn", "repo"])
def test_read_commands_create_nothing(cli, request, where):
    """`list` in a repository with no commits made `.git/subtask/`; in any repository a read
    command (its lazy sweep, its ledger look) made the state folder."""
    path = request.getfixturevalue(where)
    before = everything_in(path)
    for args in READ_COMMANDS:
        proc = cli(*args, cwd=path)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        assert everything_in(path) == before, args


# -- 5: start says what the job will not see of the caller's checkout --


def notes_of(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line]


def test_start_says_uncommitted_edits_and_a_subfolder_are_left_behind(cli, repo):
    (repo / "src").mkdir()
    (repo / "src" / "app.py").write_text("print('hi')\n")
    git(repo, "add", "src")
    git(repo, "commit", "-qm", "src")
    head = git(repo, "rev-parse", "--short", "HEAD")
    clean = cli("start", "true")
    assert clean.returncode == 0 and notes_of(clean) == [], clean.stderr  # nothing left out
    (repo / "README.md").write_text("my unsaved edit\n")
    (repo / "src" / "new.py").write_text("x = 1\n")
    proc = cli("start", "cat README.md > seen.txt", cwd=repo / "src")
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.split()[0]
    assert notes_of(proc) == [
        "note: 2 uncommitted changes here are not in the job (README.md, src/new.py): "
        f"it starts from {head}",
        "note: started in src/: the job runs at the top of the repository "
        "(paths in the task are read from there)",
    ], proc.stderr
    data = cli.json("start", "true", cwd=repo / "src")
    assert data["left_out"] == {"uncommitted": ["README.md", "src/new.py"], "subfolder": "src/",
                                "submodules": []}
    cli.ok("wait", job)
    shown = cli.ok("diff", job)
    assert "+hello" in shown and "unsaved" not in shown  # the job read README.md as committed


def _children_named(name: str) -> set[int]:
    """This process's children whose command is `name`, a zombie (ended, not reaped) included."""
    found = set()
    for task in os.listdir("/proc/self/task"):
        for pid in Path(f"/proc/self/task/{task}/children").read_text().split():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                    found.add(int(pid))
            except OSError:
                pass
    return found


def test_a_refused_start_leaves_no_look_at_the_checkout_running(
        repo, tmp_path, monkeypatch):
    """git's status of the caller's checkout grows with the repository (~0.4 s at 50,000 files),
    so it begins before the start's own work and runs beside it; a start refused meanwhile ends
    and reaps it. Here a `git` first on PATH holds every `status` until the test lets it go."""
    import shutil

    from subtask import api
    from subtask.git.gitrepo import open_repo
    from subtask.model.errors import SubtaskError

    bin_dir, go = tmp_path / "bin", tmp_path / "go"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(
        f'#!/bin/sh\nfor a; do [ "$a" = status ] && {{ while [ ! -e "{go}" ]; do sleep 0.01; done; }}; '
        f'done\nexec {shutil.which("git")} "$@"\n')
    (bin_dir / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    (repo / "README.md").write_text("my unsaved edit\n")
    (repo / ".subtask").mkdir(exist_ok=True)
    (repo / ".subtask" / "made-meanwhile").write_text("")  # ours, whatever info/exclude says yet
    before = _children_named("git")
    try:
        with pytest.raises(SubtaskError, match="engine"):
            api.launch(open_repo(repo), api.StartRequest(task="true", engine="no-such-engine"))
        assert _children_named("git") - before == set()  # ended and reaped, held or not
    finally:
        go.touch()
    started = api.launch(open_repo(repo), api.StartRequest(task="true"))
    assert started.left_out.uncommitted == ["README.md"]
    assert _children_named("git") - before == set()
    subprocess.run(["git", "subtask", "wait", started.job.id], cwd=repo, capture_output=True, timeout=120)


def test_start_says_the_bases_submodules_are_not_checked_out(cli, repo, tmp_path):
    from conftest import make_repo

    dep = make_repo(tmp_path / "dep", {"lib.txt": "dep\n"})
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(dep), "vendor/dep")
    git(repo, "commit", "-qm", "add a submodule")
    proc = cli("start", "ls -A vendor/dep | wc -l > n.txt; git add n.txt; git commit -qm count")
    assert proc.returncode == 0, proc.stderr
    assert notes_of(proc) == ["note: the base has 1 submodule the job's worktree does not check "
                              "out (vendor/dep): the job sees an empty folder there"], proc.stderr
    job = proc.stdout.split()[0]
    cli.ok("wait", job)
    assert git(repo, "show", f"subtask/{job}:n.txt").strip() == "0"


def test_mcp_start_says_what_is_left_out_too(repo, monkeypatch):
    import anyio
    from mcp import Client

    monkeypatch.chdir(repo)
    (repo / "README.md").write_text("my unsaved edit\n")

    async def main():
        from subtask.faces.mcp_server import server

        async with Client(server, mode="legacy") as client:
            result = await client.call_tool("start", {"task": "true"})
            words = "\n".join(block.text for block in result.content if block.type == "text")
            assert not result.is_error, words
            note = "note: 1 uncommitted change here is not in the job (README.md)"
            assert words.splitlines()[1].startswith(note), words
            assert result.structured_content["left_out"]["uncommitted"] == ["README.md"]

    anyio.run(main)


# -- 6: smaller words --

SAME = "echo {text} > same.txt && git add same.txt && git commit -qm {text}"


def test_list_says_same_file_once_per_row_and_only_between_jobs_that_may_land(cli, repo):
    done = [finished(cli, SAME.format(text=f"d{n}")) for n in range(4)]
    failed = cli.start(SAME.format(text="f") + " && exit 3")
    assert cli("wait", failed).returncode == 1
    rows = {line.split()[0]: line for line in cli.ok("list").splitlines()[1:]}
    assert rows[failed].split()[1] == "failed" and "same file" not in rows[failed], rows[failed]
    for job in done:
        assert rows[job].count("same file") == 1 and failed not in rows[job], rows[job]
        assert "and 2 others" in rows[job] and rows[job].endswith(": same.txt)"), rows[job]
    marks = {e["id"]: e.get("marks") for e in cli.json("list")["jobs"]}
    assert failed not in marks[done[0]]["overlaps"] and marks[failed] is None, marks


def test_group_rows_keep_to_the_columns(cli, repo):
    gid = best_of_two(cli)
    cli.ok("wait", gid)
    header, *rows = cli.ok("list").splitlines()
    row = next(r for r in rows if r.startswith(gid))
    for column in ("VERIFY", "ENGINE", "TASK"):  # left-aligned: its text starts under its name
        at = header.index(column)
        assert row[at - 1] == " " and row[at] != " ", (column, header, row)
    assert row[header.index("VERIFY"):].startswith("passed "), row
    assert row[header.index("ENGINE"):].startswith("shell "), row
    assert "best of 2" in row[header.index("TASK"):], row


def test_verify_counts_in_words_that_agree_with_the_number(cli, repo):
    job = finished(cli, "echo x > one.txt && git add one.txt && git commit -qm one")
    said = cli.ok("verify", job)
    assert "1 file, +1 -0, 1 commit since" in said, said


def test_a_wait_line_names_the_check_that_failed(cli, repo):
    (repo / "tests").mkdir()
    (repo / "tests" / "test_a.py").write_text("def test_a():\n    assert True\n")
    git(repo, "add", "tests")
    git(repo, "commit", "-qm", "a test")
    job = cli.start("git rm -q tests/test_a.py && git commit -qm 'drop a test'",
                    "--verify", "true")
    line = cli("wait", job).stdout.splitlines()[0]
    assert " · check no-test-deletion failed · " in line and " · check · " not in line, line
