"""Issue 31, the first week's rough edges: what a new user saw on a real project, each held by a test."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import wait_until


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
