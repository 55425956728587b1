"""Issue 31, the first week's rough edges: what a new user saw on a real project, each held by a test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import blocked_on_run_lock, git, wait_until


def held(gate: Path) -> str:
    """A shell task that runs until the test creates `gate`."""
    return f"while [ ! -e '{gate}' ]; do sleep 0.02; done"


def running(cli, repo, job: str) -> None:
    from subtask.git.gitrepo import open_repo
    from subtask.state import liveness

    state = open_repo(repo).state_dir
    assert wait_until(lambda: liveness.is_held(state, job)), f"{job} never ran"


# -- 1: Ctrl-C during wait, which git forwards again: exit 130, no traceback, no RuntimeError --


def test_ctrl_c_during_wait_exits_130_without_a_word_even_when_it_comes_twice(cli, repo, tmp_path, control_dir):
    """A Ctrl-C reaches `git-subtask` twice: from the terminal, and again from `git`, which passes
    the signal on to its child. The second one arrived while the first was unwinding `wait`'s
    locks and came out as `error: unexpected RuntimeError: release unlocked lock` or a traceback."""
    gate = control_dir / "gate"
    job = cli.start(held(gate))
    running(cli, repo, job)
    try:
        # Blocked on the run-lock (seen in /proc/locks, never guessed by a sleep: the first signal
        # then unwinds its locks), the second a few microseconds to a few milliseconds after.
        for n in range(8):
            proc = subprocess.Popen(["git-subtask", "wait", job], cwd=repo, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            assert wait_until(lambda: blocked_on_run_lock(repo, job), timeout=60), n
            proc.send_signal(signal.SIGINT)
            time.sleep(0.0005 * n)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 130, (n, proc.returncode, err)
            assert err.strip() == "" and out == "", (n, err)  # (click ends the ^C line)
    finally:
        gate.touch()


# -- 3: the state folder removed under a running job: never reported dead, nothing removed under it --


def test_a_running_job_survives_its_state_folder_being_removed(cli, repo, control_dir):
    """`rm -rf .git/subtask` while a job runs: its worker still holds its run-lock (through the
    removed file), so no command may call it dead, and nothing of it is removed; it ends as it
    would have, its work on its branch."""
    import shutil

    gate = control_dir / "gate"
    job = cli.start(f"echo kept > kept.txt; {held(gate)}; echo end >> kept.txt")
    running(cli, repo, job)
    # The engine has read its task file (in the state folder) once it wrote: not before.
    assert wait_until(lambda: (repo / ".subtask" / "worktrees" / job / "kept.txt").exists())
    state = repo / ".git" / "subtask"
    # As `rm -rf` does it: the worker may add a file meanwhile (its engine's pid file), so again until gone.
    assert wait_until(lambda: shutil.rmtree(state, ignore_errors=True) or not state.exists())
    try:
        waited = cli("wait", job, "--timeout", "1")
        assert waited.returncode == 1 and waited.stdout.startswith(f"{job} running"), waited.stdout + waited.stderr
        assert "worker died" not in waited.stdout + waited.stderr
        assert cli.ok("status", job).startswith(f"{job} running")
        assert cli.json("list")["jobs"][0]["state"] == "running"
        refused = cli("cleanup", job)
        assert refused.returncode == 1 and "running" in refused.stderr
        assert (repo / ".subtask" / "worktrees" / job / "kept.txt").exists()
        assert cli("gc", "--older-than", "0s").returncode == 0
        assert (repo / ".subtask" / "worktrees" / job / "kept.txt").exists()
    finally:
        gate.touch()
    assert cli("wait", job, "--timeout", "60").stdout.startswith(f"{job} done")
    assert git(repo, "show", f"subtask/{job}:kept.txt").splitlines() == ["kept", "end"]


# -- 2: two merge modes at once are refused, as git refuses them --


@pytest.mark.parametrize("flags", [["--squash", "--no-ff"], ["--no-ff", "--ff-only"], ["--squash", "--ff-only"]])
def test_two_merge_modes_are_a_usage_error_and_change_nothing(cli, repo, flags):
    job = cli.start("echo a > a.txt")
    cli("wait", job)
    before = git(repo, "rev-parse", "main")
    proc = cli("merge", *flags, job)
    assert proc.returncode == 129
    assert proc.stderr.splitlines()[0] == \
        f"error: {flags[0]} and {flags[1]} cannot be used together: give one merge mode"
    assert proc.stderr.splitlines()[1] == "hint: git subtask merge [--squash | --no-ff | --ff-only] ID"
    assert git(repo, "rev-parse", "main") == before and git(repo, "rev-parse", "--verify", f"subtask/{job}")


# -- 4: a worktree deleted by hand: reply checks it out again; cleanup leaves no stale registration --


def test_a_reply_to_a_job_whose_worktree_was_deleted_by_hand_runs(cli, repo):
    import shutil

    job = cli.start("echo a > a.txt")
    cli("wait", job)
    shutil.rmtree(repo / ".subtask" / "worktrees" / job)
    cli.ok("reply", job, "echo b > b.txt")
    waited = cli("wait", job)
    assert waited.stdout.startswith(f"{job} done"), cli.ok("show", job)
    assert git(repo, "show", f"subtask/{job}:a.txt") == "a" and git(repo, "show", f"subtask/{job}:b.txt") == "b"


def test_cleanup_of_a_worktree_deleted_by_hand_forgets_gits_registration(cli, repo):
    import shutil

    job = cli.start("echo a > a.txt")
    cli("wait", job)
    other = cli.start("echo o > o.txt")
    cli("wait", other)
    shutil.rmtree(repo / ".subtask" / "worktrees" / job)
    shutil.rmtree(repo / ".subtask" / "worktrees" / other)
    assert "prunable" in git(repo, "worktree", "list")
    said = cli.ok("cleanup", job)
    assert said.startswith(f"{job}: forgot git's registration of worktree") and "removed by hand" in said
    listed = git(repo, "worktree", "list", "--porcelain")
    assert job not in listed and other in listed  # only its own: git worktree prune would drop every missing one


def test_a_failed_checkout_says_so_on_one_line_with_a_hint_about_the_checkout(cli, repo):
    """A check-out git refuses (here: a registration of the folder that no marker says is this
    job's, so it is not ours to drop; git's message takes two lines) is reported in git's words on
    one line, with a hint about worktrees, not about subtask.setup."""
    job = cli.start("echo a > a.txt")
    cli("wait", job)
    import shutil

    shutil.rmtree(repo / ".subtask" / "worktrees" / job)
    (repo / ".git" / "worktrees" / job / "subtask-job").unlink()  # as made before the markers
    cli.ok("reply", job, "echo b > b.txt")
    cli("wait", job)
    shown = cli.ok("show", job)
    reason = next(line for line in shown.splitlines() if line.strip().startswith("reason:") and "check" in line)
    assert "\\n" not in reason, reason
    hint = next(line for line in shown.splitlines() if line.strip().startswith("hint:") and "worktree" in line)
    assert "subtask.setup" not in hint and "git worktree list" in hint


# -- 5: a stop during verify keeps the evidence of the work --


def test_stopping_a_job_during_its_verify_keeps_its_evidence(cli, repo, control_dir):
    gate = control_dir / "gate"
    job = cli.start("echo v > v.txt", "--verify", held(gate))
    from subtask import api

    assert wait_until(lambda: (api.latest_activity(api.repo_at(repo), job) or "").startswith("verifying")), \
        cli.ok("status", job)
    try:
        stopped = cli("stop", job)
        assert stopped.returncode == 0, stopped.stderr
    finally:
        gate.touch()
    data = json.loads(cli("result", job, "--json").stdout)
    assert data["state"] == "stopped" and data["verification"] is None
    head = git(repo, "rev-parse", f"subtask/{job}")
    assert data["git"]["head"] == head and [f["path"] for f in data["git"]["changed_files"]] == ["v.txt"]
    assert git(repo, "rev-parse", f"refs/subtask/{job}/head") == head  # pinned, as a finished job's head is
    assert "changes:   1 file, +1 -0" in cli.ok("show", job)


# -- 6: a verify timeout is reported as the limit that was set --


def test_a_verify_timeout_says_the_limit_it_hit(cli, repo):
    job = cli.start("echo v > v.txt", "--verify", "sleep 30", "--verify-timeout", "1")
    cli("wait", job)
    data = json.loads(cli("result", job, "--json").stdout)
    assert data["verification"]["timed_out"] is True and data["verification"]["seconds"] == 1.0
    assert "verify:  sleep 30 -> timed out after 1.0s (--verify-timeout)" in cli.ok("show", job)


# -- 8: a conflict's hint for a shell job is commands to run, not words its engine would run as a script --


def test_a_conflicts_hint_for_a_shell_job_is_not_a_reply(cli, repo):
    job = cli.start("echo job > README.md")
    cli("wait", job)
    (repo / "README.md").write_text("main\n")
    git(repo, "commit", "-qam", "Change README on main")
    proc = cli("merge", job)
    assert proc.returncode == 1 and "conflicts in: README.md" in proc.stderr
    hint = proc.stderr.splitlines()[1]
    assert hint.startswith("hint: rebase the job's branch by hand: git -C ") and "rebase main" in hint
    assert "git subtask reply" not in hint


# -- 9: result, show and list stop saying "verify passed" once the branch moved --


def test_a_branch_that_moved_after_verify_is_not_shown_as_passed(cli, repo):
    job = cli.start("echo v > v.txt", "--verify", "test -f v.txt")
    cli("wait", job)
    assert cli("result", job).returncode == 0
    worktree = repo / ".subtask" / "worktrees" / job
    (worktree / "w.txt").write_text("untested\n")
    git(worktree, "add", "w.txt")
    git(worktree, "commit", "-qm", "An untested commit")
    tip = git(repo, "rev-parse", f"subtask/{job}")
    result = cli("result", job)
    assert result.returncode == 1
    assert result.stdout.splitlines()[1].startswith("verify passed on ") and f"moved to {tip[:7]}" in result.stdout
    assert f"moved to {tip[:7]}" in cli.ok("show", job)
    row = next(line for line in cli.ok("list").splitlines() if line.startswith(job))
    assert " moved " in row and " passed " not in row
    assert cli.json("list")["jobs"][0]["moved"] == tip
    assert cli("merge", job).returncode == 1  # as before: merge refuses the untested tip


# -- 13: the post-merge hook says so when it cannot find git-subtask --


def test_the_hook_says_so_when_git_subtask_is_not_on_path(cli, repo):
    cli.ok("hooks", "install")
    assert "git-subtask on PATH at merge time" in cli.ok("hooks", "status")
    job = cli.start("echo a > a.txt")
    cli("wait", job)
    proc = subprocess.run(["git", "merge", "-q", "--no-edit", f"subtask/{job}"], cwd=repo, capture_output=True,
                          text=True, env=dict(os.environ, PATH="/usr/bin:/bin"))
    assert proc.returncode == 0, proc.stderr  # the merge itself is never failed
    assert "git-subtask is not on PATH here, so nothing was cleaned up" in proc.stderr
    assert git(repo, "branch", "--list", f"subtask/{job}")  # indeed nothing was cleaned up


# -- 13: ids in capitals name the same job; help works like git help; completion knows groups and values --


def test_ids_typed_in_capitals_name_the_same_job_and_group(cli, repo):
    job = cli.start("echo a > a.txt")
    cli("wait", job)
    assert cli.ok("show", job.upper()).startswith(f"{job} done")
    assert cli.ok("result", "ST-" + job[3:8].upper()).startswith(f"{job} done")
    gid = cli.ok("start", "--best-of", "2", "--verify", "true", "echo b > b.txt").split()[0]
    cli("wait", gid)
    assert cli.ok("show", gid.upper()).startswith(gid)
    assert cli("show", "ST-XYZ").returncode == 129  # still only ids


def test_help_works_like_git_help(cli):
    usage = cli.ok("help", "start")
    assert usage.startswith("Usage: git subtask start [OPTIONS] TASK") and "--verify-timeout" in usage
    assert cli.ok("help", "hooks", "install").startswith("Usage: git subtask hooks install")
    unknown = cli("help", "nope")
    assert unknown.returncode == 129 and unknown.stderr.startswith("error: no such command: git subtask nope")
    page = cli("help", env={"MANPAGER": "cat", "MANWIDTH": "100"})  # the manual page, or without man every usage
    assert page.returncode == 0 and "git subtask start" in page.stdout


def test_completion_knows_group_ids_and_option_values(cli, repo):
    gid = cli.ok("start", "--best-of", "2", "--verify", "true", "echo b > b.txt").split()[0]
    cli("wait", gid)
    assert gid in cli.ok("__complete", "show").split()
    assert gid in cli.ok("__complete", "compare").split()
    assert cli.ok("__complete", "start", "--pick").split() == ["smallest", "cheapest", "fastest"]
    assert cli.ok("__complete", "start", "--isolation").split() == ["none", "worktree", "readonly"]
    assert {"shell", "claude", "codex"} <= set(cli.ok("__complete", "start", "--engine").split())
    assert cli.ok("__complete", "list", "--state").split()[:2] == ["queued", "running"]
    assert cli.ok("__complete", "install", "--scope").split() == ["user", "project"]
    assert "start" in cli.ok("__complete", "help").split()


# -- 13: the quick start leaves no scratch repository and no process behind --


def test_the_quick_start_keeps_the_test_commands_editable_install(tmp_path):
    """Tests first, then the quick start, in the same checkout: its .venv stays an editable
    install of the checkout (a plain `pip install .` would freeze a copy the tests then run)."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(Path(__file__).resolve().parents[1] / "scripts" / "quickstart.sh", checkout / "scripts")
    venv_bin = checkout / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    calls = tmp_path / "pip-calls"
    (venv_bin / "pip").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (venv_bin / "pip").chmod(0o755)
    (venv_bin / "git-subtask").symlink_to(shutil.which("git-subtask"))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch))
    env.pop("QUICKSTART_SKIP_INSTALL", None)
    proc = subprocess.run(["bash", str(checkout / "scripts" / "quickstart.sh")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert calls.read_text().split() == ["install", "-q", "-e", str(checkout)]
    assert (venv_bin / "pip").read_text().startswith("#!/bin/sh")  # the venv was kept, not made anew


def test_the_quick_start_leaves_nothing_behind(tmp_path):
    script = Path(__file__).resolve().parents[1] / "scripts" / "quickstart.sh"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, QUICKSTART_SKIP_INSTALL="1", TMPDIR=str(scratch))
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert " done · verify passed" in proc.stdout and "the scratch repository is removed" in proc.stdout
    assert list(scratch.iterdir()) == []  # the scratch repository went with the script
    for pid in filter(str.isdigit, os.listdir("/proc")):  # nor any process in the scratch repository
        try:
            assert not os.readlink(f"/proc/{pid}/cwd").startswith(str(scratch)), pid
        except OSError:
            continue
