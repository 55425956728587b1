"""Issue 31, the first week's rough edges: what a new user saw on a real project, each held by a test."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import git, wait_until


def held(gate: Path) -> str:
    """A shell task that runs until the test creates `gate`."""
    return f"while [ ! -e '{gate}' ]; do sleep 0.02; done"


def running(cli, repo, job: str) -> None:
    from subtask import liveness
    from subtask.gitrepo import open_repo

    state = open_repo(repo).state_dir
    assert wait_until(lambda: liveness.is_held(state, job)), f"{job} never ran"


# -- 1: Ctrl-C during wait, which git forwards again: exit 130, no traceback, no RuntimeError --


@pytest.mark.parametrize("served", ["0", "1"])
def test_ctrl_c_during_wait_exits_130_without_a_word_even_when_it_comes_twice(cli, repo, tmp_path, control_dir, served):
    """A Ctrl-C reaches `git-subtask` twice: from the terminal, and again from `git`, which passes
    the signal on to its child. The second one arrived while the first was unwinding `wait`'s
    locks and came out as `error: unexpected RuntimeError: release unlocked lock` or a traceback."""
    gate = control_dir / "gate"
    job = cli.start(held(gate))
    running(cli, repo, job)
    env = dict(os.environ, SUBTASK_SERVER=served)
    try:
        for n in range(8):
            proc = subprocess.Popen(["git-subtask", "wait", job], cwd=repo, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            time.sleep(0.3 + 0.05 * n)  # somewhere in wait: loading, reading, blocked
            proc.send_signal(signal.SIGINT)
            time.sleep(0.0005 * n)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
            # In process: 130. Served: the client dies of the signal that ended its command, as git's children do.
            assert proc.returncode in ((130,) if served == "0" else (130, -signal.SIGINT)), (n, proc.returncode, err)
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
    shutil.rmtree(repo / ".git" / "subtask")
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
