"""Promises a one-line bug broke without any test going red (the deliberate-bug audit of issue 30).

Each test here was written against one such bug: break the line it names and it fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import git

from subtask.git.gitrepo import open_repo
from subtask.ops.running import lifecycle
from subtask.state import liveness, slots
from subtask.state.statefiles import write_json

# Secrets of shapes `redact` knows, spelled out at run time so this file holds none.
TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
KEY = "sk-" + "ant-api03-" + "Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2Rr1Qq0PpOoNnMmLl"

PLUGIN = textwrap.dedent(f"""
    from subtask.engines.base import Outcome, Probe

    class LeakyEngine:
        '''A third-party engine that reports secrets raw: the worker must redact them itself.'''
        name = "leaky"
        paid = False
        isolation = "none of its own"

        def probe(self):
            return Probe(self.name, True, True, "1.0", False, self.isolation)

        def run(self, ctx):
            ctx.emit({{"type": "text", "text": "found {TOKEN}"}})
            (ctx.worktree / "leaky.txt").write_text("work\\n")
            return Outcome(True, summary="the key is {KEY}", commands=[{{"command": "echo {TOKEN}", "exit": 0}}],
                           error=None)
""")


@pytest.fixture
def leaky_engine(tmp_path, monkeypatch):
    """`leaky`, registered under the `subtask.engines` entry point group as a package would be."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "leaky_engine.py").write_text(PLUGIN)
    info = site / "leaky_engine-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: leaky-engine\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[subtask.engines]\nleaky = leaky_engine:LeakyEngine\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))


def everything_of(repo: Path, cli, job: str) -> str:
    """Every byte of the repository's objects, the state folder's files and what the commands print."""
    objects = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch-all-objects", "--batch"],
                             capture_output=True, check=True).stdout.decode("utf-8", "replace")
    state = "".join(p.read_text(errors="replace") for p in (repo / ".git" / "subtask").rglob("*") if p.is_file())
    shown = cli.ok("show", job) + cli.ok("show", job, "--json") + cli("result", job).stdout
    return objects + state + shown + git(repo, "notes", "--ref=subtask", "show", f"subtask/{job}")


def test_a_third_party_engines_words_are_redacted_by_the_worker(cli, repo, leaky_engine):
    """Bug: the worker stores an engine's summary (or its events, its commands) as the engine gave
    them. Only built-in engines redact their own output."""
    job = cli.start("anything", "--engine", "leaky")
    cli("wait", job)
    assert cli.json("show", job)["state"] == "done"
    seen = everything_of(repo, cli, job)
    assert TOKEN not in seen and KEY not in seen
    assert "[REDACTED]" in cli.json("show", job)["summary"]


def test_an_attempt_ended_by_someone_else_records_its_reason_redacted(cli, repo, tmp_path):
    """Bug: `end_attempt` stores its reason as given (`worker error: {exc}`, whose words may quote
    what the job held). A queued job, ended from here as a dead worker's settler would."""
    git(repo, "config", "subtask.maxRunning", "1")
    gate = tmp_path / "gate"
    holder = cli.start(f"while [ ! -e '{gate}' ]; do sleep 0.05; done")
    try:
        queued = cli.start("true")
        assert cli.json("show", queued)["state"] == "queued"
        lifecycle.end_attempt(open_repo(repo), queued, 1, "failed", reason=f"worker error: token {TOKEN}",
                              error_kind="engine", engine_may_have_spent=False)
    finally:
        gate.touch()
    cli("wait", holder)
    attempt = cli.json("show", queued)["state_detail"]["attempts"][0]
    assert attempt["state"] == "failed" and "[REDACTED]" in attempt["reason"]
    assert TOKEN not in everything_of(repo, cli, queued)


def test_a_slot_is_freed_for_its_own_attempt_only(tmp_path):
    """Bug: a slot freed by job id alone. The old worker of attempt 1, releasing late, must not
    free the slot of the job's attempt 2 (a reply running now)."""
    current = slots.Slots()
    current.running.append({"v": 1, "job": "st-00000001", "attempt": 2})
    assert slots.remove(current, "st-00000001", 1) is False
    assert [(e["job"], e["attempt"]) for e in current.running] == [("st-00000001", 2)]
    assert slots.remove(current, "st-00000001", 2) is True and current.running == []


def test_a_state_file_is_replaced_never_rewritten_in_place(tmp_path):
    """Bug: a state file written in place. A reader holding the old file (here: a second name for
    its inode) must see it whole, never half of the new one; and the file stays 0600."""
    path = tmp_path / "state" / "slots.json"
    write_json(path, {"v": 1, "old": True})
    old = tmp_path / "held-by-a-reader"
    os.link(path, old)
    write_json(path, {"v": 1, "new": "x" * 10_000})
    assert json.loads(old.read_text()) == {"v": 1, "old": True}
    assert json.loads(path.read_text())["new"] == "x" * 10_000
    assert os.stat(path).st_mode & 0o777 == 0o600


# It blocks SIGTERM, so a signal sent to it stays pending, where the test can see it (no timing).
STRANGER = ("import signal, time\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
            "print('ready', flush=True)\ntime.sleep(120)\n")


def pending_sigterm(pid: int) -> bool:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return any(int(fields[name].strip(), 16) & (1 << (signal.SIGTERM - 1)) for name in ("SigPnd", "ShdPnd"))


def test_a_recorded_group_is_signalled_only_while_its_run_lock_is_held(cli, repo):
    """Bug: `signal_job` signals the groups a pid file names without checking that the job's
    run-lock is held. A finished job's pid file naming a stranger (a reused pid) must not get it
    killed by `stop`, nor by anything that signals the job."""
    job = cli.start("true")
    cli("wait", job)
    stranger = subprocess.Popen([sys.executable, "-c", STRANGER], start_new_session=True, stdout=subprocess.PIPE,
                                text=True)
    try:
        assert stranger.stdout.readline().strip() == "ready"
        state = open_repo(repo).state_dir
        assert not liveness.is_held(state, job)
        lifecycle.record_pid(state, job, worker=stranger.pid, engine=stranger.pid)
        lifecycle.signal_job(state, job, signal.SIGTERM)
        assert cli("stop", job).returncode == 1  # finished: nothing to stop
        assert not pending_sigterm(stranger.pid), "a stranger was signalled"
    finally:
        stranger.kill()
        stranger.wait()
