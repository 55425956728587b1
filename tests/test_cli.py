"""The CLI as a git subcommand: help, version, man page, completion, doctor, JSON, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import Cli, git

ROOT = Path(__file__).resolve().parents[1]


def test_version_and_short_help(cli):
    assert cli.ok("--version").startswith("git-subtask ")
    usage = cli.ok("-h")
    assert "Usage:" in usage and "start" in usage and "wait" in usage


def test_the_man_page_matches_the_commands():
    from subtask.faces.cli import cli as group
    from subtask.faces.manpage import roff, to_html

    assert (ROOT / "man" / "git-subtask.1").read_text() == roff(group), "run: python scripts/gen_docs.py"
    assert (ROOT / "man" / "git-subtask.html").read_text() == to_html(group), "run: python scripts/gen_docs.py"


def test_the_man_page_renders_and_names_every_command(tmp_path):
    from subtask.faces.cli import cli as group
    from subtask.faces.manpage import commands

    page = subprocess.run(["man", "-l", str(ROOT / "man" / "git-subtask.1")], capture_output=True, text=True,
                          env={"MANPAGER": "cat", "PATH": "/usr/bin:/bin", "MANWIDTH": "200"}, check=False)
    if page.returncode != 0 and "not found" in page.stderr:
        pytest.skip("man is not installed")
    for name, _ in commands(group):
        assert f"git subtask {name}" in page.stdout


def test_git_subtask_help_finds_the_man_page_whatever_the_install(cli, tmp_path):
    """`git subtask --help` is git running `man git-subtask`: an editable install ships no data
    files, so the CLI puts the page beside its console script the first time it runs."""
    import shutil
    import sys

    if shutil.which("man") is None:
        pytest.skip("man is not installed")
    cli.ok("--version")
    env = {"MANPAGER": "cat", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "MANWIDTH": "200"}
    page = subprocess.run(["git", "subtask", "--help"], cwd=cli.cwd, capture_output=True, text=True,
                          env=env, check=False)
    assert page.returncode == 0, page.stderr
    assert "git subtask start" in page.stdout


@pytest.mark.parametrize("module, command", [("click", "gc"), ("json", "list")])
def test_ctrl_c_while_the_cli_loads_exits_130_without_a_traceback(cli, tmp_path, module, command):
    # A module interrupted while importing stands for a Ctrl-C during start-up: click for a
    # command click runs, json for one the registry runs without click.
    (tmp_path / f"{module}.py").write_text("raise KeyboardInterrupt\n")
    proc = cli(command, env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, code", [
    (["nonsense"], 129), (["start"], 129), (["wait"], 129), (["list", "--bogus"], 129),
    (["show", "st-ffffffff"], 128), (["completion", "tcsh"], 129),
])
def test_exit_codes_follow_git(cli, args, code):
    proc = cli(*args)
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.startswith(("error:", "Usage:")), proc.stderr
    assert "Traceback" not in proc.stderr


def test_json_on_the_empty_path_is_valid_and_versioned(cli):
    for args in (["list"], ["status"], ["spend"], ["engines"], ["gc", "--dry-run"], ["hooks", "status"],
                 ["cleanup", "--merged", "--dry-run"], ["doctor"]):
        proc = cli(*args, "--json")
        data = json.loads(proc.stdout)
        assert data.get("v") == 1 or data.get("schema_version") == 1, args


def test_json_mode_keeps_the_exit_codes(cli):
    failing = cli.start("exit 2")
    proc = cli("wait", failing, "--json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["passed"] is False
    assert cli("show", "st-ffffffff", "--json").returncode == 128


def run_bash_completion(cli: Cli, words: list[str], function: str) -> list[str]:
    script = cli.ok("completion", "bash")
    line = " ".join(f"'{w}'" for w in words)
    proc = subprocess.run(["bash", "-c", f'{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; {function}; '
                          'printf "%s\\n" "${COMPREPLY[@]}"'], cwd=cli.cwd, capture_output=True, text=True, check=True)
    return proc.stdout.split()


def test_bash_completion_of_commands_options_and_job_ids(cli):
    job = cli.start("true")
    assert set(run_bash_completion(cli, ["git", "subtask", "st"], "_git_subtask")) == {"start", "status", "stop"}
    assert set(run_bash_completion(cli, ["git-subtask", "st"], "_git_subtask_standalone")) == \
        {"start", "status", "stop"}
    assert run_bash_completion(cli, ["git", "subtask", "wait", job[:5]], "_git_subtask") == [job]
    assert "--verify-timeout" in run_bash_completion(cli, ["git-subtask", "start", "--verify"],
                                                     "_git_subtask_standalone")


def test_bash_completion_through_gits_own_completion(cli):
    git_completion = Path("/usr/share/bash-completion/completions/git")
    if not git_completion.exists():
        pytest.skip("git's bash completion is not installed")
    script = cli.ok("completion", "bash")
    proc = subprocess.run(["bash", "-c", f"source {git_completion}\n{script}\n"
                           "COMP_WORDS=(git subtask wai); COMP_CWORD=2; COMP_LINE='git subtask wai'; "
                           "COMP_POINT=${#COMP_LINE}; __git_wrap__git_main; printf '%s\\n' \"${COMPREPLY[@]}\""],
                          cwd=cli.cwd, capture_output=True, text=True, check=False)
    assert "wait" in proc.stdout.split(), proc.stderr


def test_zsh_and_fish_scripts_call_back_into_the_program(cli):
    for shell in ("zsh", "fish"):
        assert "git-subtask __complete" in cli.ok("completion", shell)


def test_doctor_reports_checks_with_remediation_and_strict_warnings(cli, repo):
    data = json.loads(cli("doctor", "--json").stdout)
    assert data["schema_version"] == 1
    names = {c["name"]: c for c in data["checks"]}
    assert {"git", "libgit2", "repository", "hooks", "notes", "state", "slots", "worktrees", "engines"} <= set(names)
    assert names["hooks"]["status"] == "warn" and names["hooks"]["remediation"] == ["git subtask hooks install"]
    assert cli("doctor").returncode == 0
    assert cli("doctor", "--strict").returncode == 1
    cli.ok("hooks", "install")
    cli.ok("init")
    assert json.loads(cli("doctor", "--json").stdout)["status"] == "ok"
    assert cli("doctor", "--strict").returncode == 0
    git(repo, "config", "notes.rewriteRef", "refs/notes/subtask")
    failing = json.loads(cli("doctor", "--json").stdout)
    assert failing["status"] == "fail" and cli("doctor").returncode == 1


def test_doctor_outside_a_repository_fails_with_a_remedy(tmp_path):
    proc = Cli(tmp_path)("doctor", "--json")
    assert proc.returncode == 1
    repo_check = next(c for c in json.loads(proc.stdout)["checks"] if c["name"] == "repository")
    assert repo_check["status"] == "fail" and "git init" in repo_check["remediation"]


def test_watch_prints_plain_lines_until_the_jobs_end(cli, tmp_path):
    gate = tmp_path / "gate"  # the job runs until the test has seen watch print its activity
    job = cli.start(f"echo one; while [ ! -e '{gate}' ]; do sleep 0.05; done; echo two")
    watcher = subprocess.Popen(["git", "subtask", "watch", job], cwd=cli.cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(60, watcher.kill)  # a watch that never prints "now:" fails, not hangs
    watchdog.start()
    try:
        lines = []
        for line in watcher.stdout:  # watch flushes each line; this blocks until the next one
            lines.append(line.rstrip("\n"))
            if "now:" in line:
                break
        assert lines and "now:" in lines[-1], lines
        gate.touch()
        rest, err = watcher.communicate(timeout=60)
    finally:
        watchdog.cancel()
        gate.touch()
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    assert watcher.returncode == 0, err
    output = "\n".join(lines) + "\n" + rest
    assert "\x1b[" not in output  # not a terminal: no cursor movement
    lines = output.splitlines()
    assert lines[-1].startswith(f"{job} done")
    assert any("now:" in line for line in lines[:-1])


def test_status_shows_queue_position_and_activity(cli, repo):
    git(repo, "config", "subtask.maxRunning", "1")
    first = cli.start("echo busy; sleep 60")
    second = cli.start("true")
    out = cli.ok("status")
    assert f"{first} running" in out and f"{second} queued (#1 in queue)" in out
    cli.ok("stop", second)
    cli.ok("stop", first)


def test_a_command_leaves_no_process_behind(cli, repo, tmp_path):
    """`git subtask list` in a fresh repository with default settings: when it returns, nothing it
    started runs on (a warm command server used to, on by default; git's own daemons are opt-in).
    Whatever such a process would be, it inherits the caller's environment: a mark there finds it."""
    mark = f"SUBTASK_TEST_MARK={tmp_path}"  # the whole path: another suite on the machine runs this test too
    for args in (("list",), ("status",), ("spend",), ("engines",)):
        cli.ok(*args, env=dict([mark.split("=", 1)]))
    assert [pid for pid in filter(str.isdigit, os.listdir("/proc")) if mark.encode() in _environ_of(pid)] == []


def _environ_of(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return fh.read()
    except OSError:
        return b""
