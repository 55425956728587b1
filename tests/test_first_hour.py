"""Issue 13, "a first hour without surprises": what a new user saw, each held by a test."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

from conftest import git, grant_writable, kill_worker_and_engine, running_pids, wait_until

STATE = Path(".git") / "subtask"


def _state(repo: Path) -> Path:
    return repo / STATE


def _result(cli, job: str) -> dict:
    """The job's result as JSON (`result` exits 1 for a job that did not pass)."""
    return json.loads(cli("result", job, "--json").stdout)


# -- 9: a task up to the documented 1 MiB reaches the engine; the worker log says why it failed --


def test_a_600_kib_shell_task_runs(cli, repo):
    task = "echo start\n" + ("# " + "x" * 1022 + "\n") * 600 + "echo the end\n"
    assert len(task.encode()) > 600 * 1024
    job = cli.start("-", input=task)
    cli("wait", job)
    data = _result(cli, job)
    assert data["state"] == "done", data
    assert "the end" in data["summary"]
    assert not list((_state(repo) / "run").glob(f"{job}.*.task"))  # gone with the attempt


def test_a_command_engine_task_file_is_private_in_the_state_dir_and_goes_with_the_attempt(cli, repo, control_dir):
    probe = control_dir / "seen.json"
    script = ("import json,os,stat,sys; p=sys.argv[1]; "
              f"json.dump({{'path': p, 'mode': stat.S_IMODE(os.stat(p).st_mode), 'size': os.path.getsize(p)}}, "
              f"open({str(probe)!r}, 'w'))")
    git(repo, "config", "subtask.engine.catfile.command", json.dumps([sys.executable, "-c", script, "{task_file}"]))
    task = "y" * (600 * 1024)
    job = cli.start("-", "--engine", "catfile", input=task)
    cli("wait", job)
    assert _result(cli, job)["state"] == "done"
    seen = json.loads(probe.read_text())
    path = Path(seen["path"])
    assert path.parent.resolve() == (_state(repo) / "run").resolve()
    assert seen["mode"] == stat.S_IRUSR | stat.S_IWUSR
    assert seen["size"] == len(task)
    assert not path.exists()


def test_the_task_file_of_a_killed_worker_goes_when_its_attempt_is_ended(cli, repo):

    job = cli.start("sleep 60")
    run = _state(repo) / "run"
    running_pids(repo, job)
    task_file = run / f"{job}.1.task"
    assert task_file.exists() and stat.S_IMODE(task_file.stat().st_mode) == 0o600
    kill_worker_and_engine(repo, job)
    assert cli.json("list")["jobs"][0]["state"] == "failed"
    assert not task_file.exists()  # the next command ended the attempt, and its words with it


def test_the_worker_log_says_why_an_attempt_failed(cli, repo):
    job = cli.start("echo doing; exit 3")
    cli("wait", job)
    log = (_state(repo) / "logs" / f"{job}.log").read_text()
    assert "failed" in log and "exited with code 3" in log, log
    shown = cli.ok("show", job, "--log")
    assert "exited with code 3" in shown.split("worker log:")[1]


# -- 5: a failed verify says why wherever the job is shown ---------------------------------------


def test_a_failed_verify_shows_its_last_output_lines_in_show_result_and_wait(cli):
    job = cli.start("echo ok", "--verify", "echo first; echo \"$(printf 'bad\\033[2Jterm')\"; [[ 1 == 2 ]]")
    waited = cli("wait", job)
    assert waited.returncode == 1
    for out in (waited.stdout, cli("result", job).stdout, cli.ok("show", job)):
        assert "verify failed" in out
        assert "[[: not found" in out, out  # sh's own words, not just "verify failed"
        assert "\x1b" not in out and "bad\\x1b[2Jterm" in out  # made terminal-safe


def test_verify_help_says_it_runs_with_sh(cli):
    assert "sh -c" in " ".join(cli.ok("start", "--help").split())


# -- 10: a running paid job shows its reservation; tokens show when known -----------------------

HELD_AGENT = """import os, sys, time
open(sys.argv[1] + ".started", "w").close()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
print("STATUS: done")
"""


def test_a_running_paid_job_shows_its_reservation_not_free(cli, repo, tmp_path, control_dir):
    script = tmp_path / "held.py"
    script.write_text(HELD_AGENT)
    release = control_dir / "release"  # the agent writes release.started beside it
    git(repo, "config", "subtask.engine.heldpaid.command", json.dumps([sys.executable, str(script), str(release)]))
    git(repo, "config", "subtask.engine.heldpaid.paid", "true")
    job = cli.start("hold", "--engine", "heldpaid", "--max-usd", "2")
    try:
        assert wait_until(lambda: Path(f"{release}.started").exists())
        shown = cli.ok("show", job)
        assert "$2.00 reserved" in shown, shown
        assert "free engine" not in shown
    finally:
        release.touch()
        cli("wait", job)
    assert "free engine" not in cli.ok("show", job)


def test_tokens_show_in_show_and_the_note(cli, repo, tmp_path):
    from fake_claude import write_fake_cli

    fake = write_fake_cli(tmp_path / "claude-cli", "success")
    env = {"SUBTASK_CLAUDE_CLI": str(fake), "ANTHROPIC_API_KEY": "sk-ant-test-fake"}
    job = cli.start("check the tree", "--engine", "claude", "--max-usd", "1", env=env)
    cli.ok("wait", job, env=env)
    tokens = cli.json("show", job)["state_detail"]["attempts"][0]["tokens"]
    assert tokens and tokens["input"] == 100
    shown = cli.ok("show", job)
    assert "tokens:" in shown and "100 in" in shown and "50 out" in shown, shown
    note = git(repo, "notes", "--ref=subtask", "show", cli.json("show", job)["evidence"]["head"])
    assert "100 in" in note and "50 out" in note, note


# -- 12: words ---------------------------------------------------------------------------------

TTY = {"SUBTASK_TTY": "1"}  # what the CLI says only on a terminal, said off one for the test


def test_a_stopped_job_reason_does_not_stutter(cli, tmp_path):
    grant_writable(tmp_path)  # the job marks that it started beside the repository
    release = tmp_path / "release"
    job = cli.start(f"touch {tmp_path}/started; while [ ! -e {release} ]; do sleep 0.02; done")
    try:
        assert wait_until(lambda: (tmp_path / "started").exists())
        cli.ok("stop", job)
    finally:
        release.touch()
    cli("wait", job)
    shown = cli.ok("show", job)
    assert "stopped: stopped" not in shown, shown
    assert "reason:  stopped by request" in shown


def test_empty_list_status_gc_and_cleanup_say_so_on_stdout_at_a_terminal_else_on_stderr(cli):
    for args in (["list"], ["status"], ["gc"], ["gc", "--dry-run"], ["cleanup", "--merged"]):
        piped = cli(*args)
        assert piped.returncode == 0 and piped.stdout == "", args  # a script reading stdout gets nothing, as before
        assert len(piped.stderr.splitlines()) == 1 and piped.stderr.strip(), (args, piped.stderr)  # issue 31
        said = cli.ok(*args, env=TTY)
        assert len(said.splitlines()) == 1 and said.strip(), (args, said)
    assert "no jobs" in cli.ok("list", env=TTY)
    assert "no active jobs" in cli.ok("status", env=TTY)
    assert cli.json("list")["jobs"] == []  # JSON is unchanged


def test_show_says_a_missing_worktree_is_removed(cli, repo):
    job = cli.start("true", "--readonly")
    cli.ok("wait", job)
    worktree = cli.json("show", job)["spec"]["worktree"]
    assert not Path(worktree).exists()
    assert f"worktree:  {worktree} (removed)" in cli.ok("show", job)
    kept = cli.start("true")
    cli.ok("wait", kept)
    assert "(removed)" not in cli.ok("show", kept)


def test_list_says_what_its_lazy_sweep_removed_once(cli, repo):
    git(repo, "config", "subtask.sweepInterval", "0")
    job = cli.start("echo work > work.txt")
    cli.ok("wait", job)
    git(repo, "merge", "-q", "--no-edit", f"subtask/{job}")
    listed = cli("list", env=TTY)
    assert listed.returncode == 0
    assert job in listed.stderr and "landed" in listed.stderr and len(listed.stderr.splitlines()) == 1, listed.stderr
    assert not git(repo, "branch", "--list", f"subtask/{job}")
    # off a terminal too, on stderr (issue 31: a read command never removes branches silently), once
    other = cli.start("echo more > more.txt")
    cli.ok("wait", other)
    git(repo, "merge", "-q", "--no-edit", f"subtask/{other}")
    said = cli("list")
    assert other in said.stderr and "landed" in said.stderr and other not in said.stdout.split("\n", 1)[0]
    assert other not in cli("list").stderr  # said once


# -- 14: start refuses an engine that cannot authenticate, quickly, and changes nothing ---------


def test_start_refuses_an_engine_that_cannot_authenticate_and_changes_nothing(cli, repo, tmp_path):
    from conftest import refs

    # conftest puts stand-in `claude`/`codex` executables on PATH and removes every credential
    for engine, word in (("codex", "codex login"), ("claude", "claude /login")):
        proc = cli("start", "--engine", engine, "do it", env={"CODEX_HOME": str(tmp_path / "no-codex-home")})
        assert proc.returncode == 128, (engine, proc.stderr)
        assert "not logged in" in proc.stderr or "cannot authenticate" in proc.stderr, proc.stderr
        assert word in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert refs(repo, "refs/subtask") == [] and not git(repo, "branch", "--list", "subtask/*")


def test_start_accepts_an_engine_with_credentials(cli, repo, tmp_path):
    from fake_claude import write_fake_cli

    fake = write_fake_cli(tmp_path / "claude-cli", "success")
    env = {"SUBTASK_CLAUDE_CLI": str(fake), "ANTHROPIC_API_KEY": "sk-ant-test-fake"}
    job = cli.start("check", "--engine", "claude", env=env)
    cli.ok("wait", job, env=env)


def test_preflight_runs_no_subprocess(monkeypatch, tmp_path):
    import subprocess

    from subtask.engines.claude import ClaudeEngine
    from subtask.engines.codex import CodexEngine

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"preflight started a process: {args}")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    monkeypatch.setenv("CODEX_HOME", str(tmp_path))
    assert "claude /login" in ClaudeEngine().preflight()
    assert "codex login" in CodexEngine(lambda key: None).preflight()
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-fake")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-fake")
    assert ClaudeEngine().preflight() is None
    assert CodexEngine(lambda key: None).preflight() is None


# -- 15: the aider example: the session cost, and a summary without edit-block markers ---------

AIDER_OUTPUT = """Aider v0.86.1
Tokens: 2.3k sent, 110 received. Cost: $0.0068 message, $0.0068 session.
utils.py
<<<<<<< SEARCH
def add(a, b):
=======
def add(a: int, b: int) -> int:
>>>>>>> REPLACE
Applied edit to utils.py
Tokens: 3.1k sent, 95 received. Cost: $0.0081 message, $0.0149 session.
Added type hints to utils.py.
"""


def _documented_aider(key: str) -> str:
    doc = (Path(__file__).parent.parent / "docs" / "engines.md").read_text()
    line = next(ln for ln in doc.splitlines() if f"subtask.engine.aider.{key} " in ln)
    return line.split(f"subtask.engine.aider.{key} ", 1)[1].split("'")[1]


def test_the_documented_aider_cost_pattern_takes_the_session_total():
    import re

    pattern = re.compile(_documented_aider("costPattern"))
    matches = [float(m.group(1)) for line in AIDER_OUTPUT.splitlines() for m in pattern.finditer(line)]
    assert matches[-1] == 0.0149
    command = json.loads(_documented_aider("command"))
    assert "--no-gitignore" in command


def test_a_command_engine_summary_skips_edit_block_markers(cli, repo, tmp_path):
    script = tmp_path / "aiderish.py"
    script.write_text(f"import sys\nsys.stdout.write({AIDER_OUTPUT!r})\n")
    git(repo, "config", "subtask.engine.aiderish.command", json.dumps([sys.executable, str(script)]))
    job = cli.start("add type hints", "--engine", "aiderish")
    cli.ok("wait", job)
    summary = _result(cli, job)["summary"]
    assert "Added type hints to utils.py." in summary
    for marker in ("<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"):
        assert marker not in summary, summary
