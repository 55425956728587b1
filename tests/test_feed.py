"""`wait --since CURSOR`: every event of a job's life after a cursor, none missed, none told twice.

Real jobs held by gate files; the cursor is carried from one call to the next exactly as a
client that shows no progress would carry it.
"""

from __future__ import annotations

import json
import subprocess

import anyio
import pytest
from conftest import blocked_on_run_lock, wait_until

from subtask.ops.running import feed


def since(cli, cursor: str, *ids: str, timeout: float = 60) -> dict:
    proc = cli("wait", "--since", cursor, "--timeout", str(timeout), "--json", *ids)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def words(events: list[dict]) -> list[str]:
    """What each event says, in order (a state, a stall mark, a line the job printed)."""
    said = []
    for event in events:
        if event["type"] == "state" and "attempt" in event and event.get("state") in (
                "queued", "running", "done", "failed", "stopped"):
            said.append(f"{event['state']}#{event['attempt']}")
        elif event["type"] == "output":
            said.append(event["text"])
        elif event["type"] == "state":
            said.append(event["state"])
    return said


def held(gate, then: str) -> str:
    return f"while [ ! -e '{gate}' ]; do sleep 0.02; done; {then}"


def test_a_cursor_sees_every_event_of_a_jobs_life_in_three_calls(cli, control_dir):
    one, two = control_dir / "one", control_dir / "two"
    job = cli.start(f"echo first; {held(one, 'echo second')}; {held(two, 'echo third; echo x > x.txt')}",
                    "--verify", "test -f x.txt")
    events_file = cli.cwd / ".git" / "subtask" / "run" / f"{job}.events.jsonl"
    assert wait_until(lambda: events_file.exists() and "first" in events_file.read_text())

    first = since(cli, "0", job)  # 1: what happened so far, at once
    assert words(first["events"])[:2] == ["running#1", "first"], first["events"]
    assert "second" not in words(first["events"])

    # 2: asked before the job prints again; answers once it does, with nothing told before
    second_call = subprocess.Popen(["git", "subtask", "wait", "--since", first["cursor"], "--json", job],
                                   cwd=cli.cwd, stdout=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: blocked_on_run_lock(cli.cwd, job)), "wait --since did not block"
        one.touch()
        second = json.loads(second_call.communicate(timeout=60)[0])
    finally:
        second_call.kill()
    assert second_call.returncode == 1  # the job still runs
    assert words(second["events"]) == ["second"], second["events"]

    two.touch()
    cli("wait", job, "--timeout", "60")
    third = since(cli, second["cursor"], job)  # 3: everything to the end, from the cursor of call 2
    assert words(third["events"]) == ["third", "checking", "verifying", "done#1"], third["events"]
    assert third["events"][-1]["verify"] == "passed"
    assert third["passed"] is True

    seen = first["events"] + second["events"] + third["events"]
    everything = since(cli, "0", job)["events"]
    assert [json.dumps(e, sort_keys=True) for e in seen] == [json.dumps(e, sort_keys=True) for e in everything]
    after = since(cli, third["cursor"], job)  # the end told, an ended job answers at once with nothing
    assert after["events"] == [] and after["cursor"] == third["cursor"]


def test_a_cursor_from_before_a_reply_sees_its_attempt(cli):
    job = cli.start("echo one")
    cli("wait", job)
    cursor = since(cli, "0", job)["cursor"]
    cli.ok("reply", job, "echo two")
    cli("wait", job)
    assert words(since(cli, cursor, job)["events"]) == ["running#2", "two", "finishing", "done#2"]


def test_a_cursor_answers_a_timeout_with_no_event_and_the_same_cursor(cli, control_dir):
    gate = control_dir / "gate"
    job = cli.start(f"echo held; {held(gate, 'true')}")
    try:
        # The engine's first line: every event of the job's start (its state, its isolation) is
        # written before it, and none after it until the gate opens.
        assert wait_until(lambda: "held" in words(since(cli, "0", job)["events"]))
        cursor = since(cli, "0", job, timeout=5)["cursor"]
        quiet = since(cli, cursor, job, timeout=0.3)
        assert quiet["timed_out"] is True and quiet["events"] == [] and quiet["cursor"] == cursor
    finally:
        gate.touch()


@pytest.mark.parametrize("cursor", ["bad", "st-12345678.abc", "st-1234567.ab.1", "st-12345678.xyz.1"])
def test_a_cursor_that_no_wait_gave_is_refused(cli, cursor):
    job = cli.start("true")
    proc = cli("wait", "--since", cursor, job)
    assert proc.returncode == 129 and "not a wait cursor" in proc.stderr, proc.stderr


def test_a_stall_mark_set_and_cleared_are_events_of_the_record():
    before = {"attempts": [{"n": 1, "state": "running", "started_at": 5.0}]}
    stalled = {"attempts": [{"n": 1, "state": "running", "stalled": {"since": 6.0, "after": 1, "action": "mark"}}]}
    assert [e["type"] for e in feed._changes(before, stalled, 8.0)] == ["stalled"]
    assert [e["type"] for e in feed._changes(stalled, before, 9.0)] == ["stall_ended"]
    assert feed._changes(before, before, 9.0) == []


def test_an_attempt_no_record_could_hold_gives_no_event_and_no_crash():
    """The feed reads every state.json of the record chain, which a pull may have brought from
    anywhere: an attempt whose `n` or `state` is not one (a list: no dict key) used to end `wait
    --since` with a TypeError."""
    good = {"attempts": [{"n": 1, "state": "running", "started_at": 5.0}]}
    damaged = {"attempts": [{"n": 1, "state": ["done"]}, {"n": [2], "state": "done"}, "x"]}
    assert feed._changes(good, damaged, 8.0) == []
    assert [(e["state"], e["attempt"]) for e in feed._changes(damaged, good, 9.0)] == [("running", 1)]


def test_mcp_wait_with_since_answers_the_events_and_the_next_cursor(repo, cli, monkeypatch):
    from mcp import Client

    from subtask.faces.mcp_server import server

    monkeypatch.chdir(repo)
    job = cli.start("echo over-mcp")
    cli("wait", job)

    async def main():
        async with Client(server, mode="legacy") as client:
            first = await client.call_tool("wait", {"ids": [job], "since": "0"})
            again = await client.call_tool("wait", {"ids": [job], "since": first.structured_content["cursor"]})
            return first, again

    first, again = anyio.run(main)
    text = first.content[0].text
    assert "over-mcp" in text and f"cursor: {first.structured_content['cursor']}" in text
    assert words(first.structured_content["events"]) == ["running#1", "over-mcp", "finishing", "done#1"]
    assert again.structured_content["events"] == []
