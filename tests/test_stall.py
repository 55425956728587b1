"""Stalls and time limits: an engine silent for `subtask.stallAfter` is marked stalled (list,
status, wait, the note, MCP progress), `wait` returns on it, `subtask.stallAction stop` ends it;
a paid engine without --timeout gets `subtask.defaultTimeout`.

No test waits for time to pass: the engine is made silent by a gate file the test holds, the
bound is a fraction of a second, and the only timeouts bound a failure."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from conftest import git, wait_until

FAKE_AGENT = Path(__file__).parent / "fake_agent.py"


def stall_after(repo: Path, seconds: str = "0.3", action: str | None = None) -> None:
    git(repo, "config", "subtask.stallAfter", seconds)
    if action:
        git(repo, "config", "subtask.stallAction", action)


def paid_agent(repo: Path) -> None:
    """A paid command engine (tests/fake_agent.py): `hold=PATH` keeps it silent until PATH exists."""
    git(repo, "config", "subtask.engine.agent.command", json.dumps([sys.executable, str(FAKE_AGENT), "{task}"]))
    git(repo, "config", "subtask.engine.agent.paid", "true")
    git(repo, "config", "subtask.engine.agent.costPattern", r"cost: \$([0-9.]+)")


def unreachable_codex(repo: Path, tmp_path: Path, mode: str) -> dict[str, str]:
    """The fake codex as `repo`'s codex, replaying what the real CLI printed while it could not
    reach its API (its "Reconnecting..." retries) in `mode`; the environment to start it with."""
    from test_engine_codex import FAKE_CODEX, recorded

    fake = tmp_path / "bin" / "codex"
    fake.parent.mkdir()
    fake.write_text(FAKE_CODEX.format(python=sys.executable))
    fake.chmod(0o755)
    git(repo, "config", "subtask.engine.codex.path", str(fake))
    return {"OPENAI_API_KEY": "sk-test-fake", "FAKE_CODEX_LOG": str(tmp_path / "argv.jsonl"),
            "FAKE_CODEX_MODE": mode,
            "FAKE_CODEX_EVENTS": json.dumps(recorded("codex-0.171-unreachable.jsonl"))}


def test_a_silent_engine_is_marked_stalled_and_wait_returns_naming_it(cli, repo, tmp_path):
    from subtask import api
    from subtask.git.gitrepo import open_repo

    stall_after(repo)
    gate = tmp_path / "gate"
    job = cli.start(f"echo started; while [ ! -e {gate} ]; do sleep 0.05; done; echo going on")
    try:
        proc = cli("wait", job, timeout=60)
        assert proc.returncode == 1, proc.stderr
        assert f"{job} running (stalled: no event from the engine for" in proc.stdout
        assert f"{job} is stalled and still running" in proc.stderr
        waited = cli("wait", job, "--json", timeout=60)
        assert waited.returncode == 1 and json.loads(waited.stdout)["stalled"] == [job]
        row = next(line for line in cli.ok("list").splitlines() if line.startswith(job))
        assert row.split()[1] == "stalled"
        entry = next(e for e in cli.json("list")["jobs"] if e["id"] == job)
        assert entry["state"] == "running" and entry["stalled"]["after"] == 0.3
        assert "running (stalled: no event from the engine" in cli.ok("status", job)
        activity = api.latest_activity(open_repo(repo), job)  # what MCP progress shows
        assert activity.startswith("stalled: no event from the engine")
        since = cli.json("show", job)["state_detail"]["attempts"][0]["stalled"]["since"]
        [row] = cli.json("status", job)["jobs"]
        assert row["stalled"]["after_s"] == 0.3 and row["stalled"]["since"] == since
        assert row["stalled"]["silent_s"] == pytest.approx(time.time() - since, abs=5)
        assert row["stalled"]["silent_s"] >= 0.3
        attempt = cli.json("show", job)["state_detail"]["attempts"][0]
        assert attempt["state"] == "running" and attempt["stalled"]["action"] == "mark"
    finally:
        gate.touch()
    # `wait` answers at once while the job is still marked stalled: only once its engine spoke
    # again (the worker clears the mark on its next event) does `wait` wait for its end.
    assert wait_until(lambda: "stalled" not in cli.json("status", job)["jobs"][0])
    assert "done" in cli.ok("wait", job, timeout=60)  # it spoke again: no longer stalled, and it ended
    shown = cli.json("show", job)
    assert shown["state_detail"]["attempts"][0]["stalled"] is None
    assert "stalled" not in git(repo, "notes", "--ref=subtask", "show", "HEAD")


def test_what_a_stall_says_is_how_long_the_engine_was_silent_beside_the_threshold():
    """A stall's activity line and `status --json` say the time silent, and the threshold apart
    (they said the threshold as the time silent: "for 5s" after minutes of silence)."""
    from subtask import words
    from subtask.model.job import Attempt

    since = time.time() - 100
    text = words.activity_text({"type": "stalled", "since": since, "after": 5, "action": "mark"})
    assert "for 1m40s" in text and "stallAfter 5s" in text, text
    attempt = Attempt(n=1, state="running", message="x", queued_at=since,
                      stalled={"since": since, "after": 5, "action": "mark"})
    facts = words.stall_facts(attempt)
    assert facts["after_s"] == 5 and facts["since"] == since
    assert facts["silent_s"] == pytest.approx(100, abs=5)


def test_stall_action_stop_ends_a_silent_paid_engine_charged_by_the_usual_rule(cli, repo, tmp_path):
    stall_after(repo, action="stop")
    paid_agent(repo)
    gate = tmp_path / "gate"  # made only if the test fails: the agent stays silent
    job = cli.start(f"hold={gate} cost=0.10", "--engine", "agent", "--max-usd", "1.5")
    try:
        assert cli("wait", job, timeout=60).returncode == 1
    finally:
        if cli.json("show", job)["state"] == "running":  # the stall rule did not end it: never leave it
            gate.touch()
            cli("stop", job)
    attempt = cli.json("show", job)["state_detail"]["attempts"][0]
    assert attempt["state"] == "stopped"
    assert attempt["reason"].startswith("stalled: no event from the engine for 0.3s")
    assert "subtask.stallAction stop" in attempt["reason"]
    assert attempt["stalled"]["action"] == "stop"
    # it never printed its cost: unknown, so the whole reservation, as for any engine
    assert attempt["cost"]["charged"] == 1.5 and attempt["cost"]["billing"] == "charged"
    assert cli.json("spend")["committed_usd"] == pytest.approx(1.5)
    note = git(repo, "notes", "--ref=subtask", "show", f"subtask/{job}")
    assert "stalled: no event from the engine" in note and "stallAction stop ended it" in note


def test_a_stalled_engine_that_the_model_never_answered_is_charged_nothing(cli, repo, tmp_path):
    """codex retrying an API it cannot reach ("Reconnecting...", recorded from the real CLI) makes
    no progress: it stalls, is stopped, and since no answer or usage ever came, costs nothing."""
    stall_after(repo, action="stop")
    env = unreachable_codex(repo, tmp_path, "events_then_sleep")
    job = cli.start("do it", "--engine", "codex", "--max-usd", "2", env=env)
    try:
        assert cli("wait", job, timeout=60).returncode == 1
    finally:
        if cli.json("show", job)["state"] == "running":  # the stall rule did not end it: never leave it
            cli("stop", job)
    attempt = cli.json("show", job)["state_detail"]["attempts"][0]
    assert attempt["state"] == "stopped" and attempt["stalled"]
    assert attempt["cost"]["charged"] == 0.0 and attempt["cost"]["billing"] == "not_billed"
    assert cli.json("spend")["committed_usd"] == 0.0
    assert "nothing billed" in cli.ok("show", job)


def test_an_engine_that_only_retries_is_stalled_and_stays_so_while_it_retries(cli, repo, tmp_path):
    """codex says "Reconnecting..." again and again while it cannot reach its API (recorded from
    the real CLI): a retry is no progress, so `wait` returns on the stall, and each retry after
    the mark leaves it marked."""
    stall_after(repo)
    env = unreachable_codex(repo, tmp_path, "events_then_repeat")
    job = cli.start("do it", "--engine", "codex", "--max-usd", "2", env=env)
    events = repo / ".git" / "subtask" / "run" / f"{job}.events.jsonl"

    def retries_after_the_mark() -> int:
        kinds = [json.loads(line).get("type") for line in events.read_text().splitlines()]
        return kinds[kinds.index("stalled"):].count("retry") if "stalled" in kinds else 0

    try:
        waited = cli("wait", job, "--timeout", "20", timeout=60)
        assert waited.returncode == 1 and f"{job} is stalled and still running" in waited.stderr
        assert wait_until(lambda: retries_after_the_mark() >= 3)
        assert '"stall_ended"' not in events.read_text()
        assert next(e for e in cli.json("list")["jobs"] if e["id"] == job)["stalled"]
    finally:
        cli("stop", job)
    assert cli.json("show", job)["state_detail"]["attempts"][0]["state"] == "stopped"


def test_a_paid_engine_without_a_timeout_gets_the_default_one(cli, repo, tmp_path):
    paid_agent(repo)

    def timeouts(job):
        shown = cli.json("show", job)
        return shown["spec"]["timeout"], shown["state_detail"]["attempts"][-1]["timeout"]

    paid = cli.start("cost=0.01", "--engine", "agent")
    jobs = [paid]
    assert timeouts(paid) == (3600, 3600)
    git(repo, "config", "subtask.defaultTimeout", "120")
    jobs.append(cli.start("cost=0.01", "--engine", "agent"))
    assert timeouts(jobs[-1]) == (120, 120)
    jobs.append(cli.start("cost=0.01", "--engine", "agent", "--timeout", "7"))
    assert timeouts(jobs[-1]) == (7, 7)
    jobs.append(cli.start("true"))
    assert timeouts(jobs[-1]) == (None, None)  # a free engine runs until it ends
    git(repo, "config", "subtask.defaultTimeout", "0")
    jobs.append(cli.start("cost=0.01", "--engine", "agent"))
    assert timeouts(jobs[-1]) == (None, None)
    cli.ok("wait", paid, timeout=60)
    cli.ok("reply", paid, "cost=0.01 file=more.txt")
    assert timeouts(paid) == (3600, 3600)  # the reply keeps the job's limit
    cli.ok("wait", *jobs, timeout=60)


def test_a_wrong_stall_action_is_refused_at_start_and_doctor_names_it(cli, repo):
    git(repo, "config", "subtask.stallAction", "explode")
    out = cli("doctor").stdout + cli("doctor").stderr
    assert "subtask.stallAction must be mark or stop" in out
    refused = cli("start", "true")
    assert refused.returncode == 128
    assert "subtask.stallAction must be mark or stop" in refused.stderr
