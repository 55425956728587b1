"""Attention: `subtask.notify` runs once per event (a job ended, failed verify, stalled), with
the job's words in its environment only; its failure changes nothing; an MCP client is told
the same events as log notifications while it is connected."""

from __future__ import annotations

import anyio
from conftest import git, wait_until

RECORD = 'printf "%s %s %s|%s\\n" "$SUBTASK_JOB_ID" "$SUBTASK_EVENT" "$SUBTASK_STATE" "$SUBTASK_SUMMARY" >> "{log}"'


def told(log) -> list[tuple[str, str, str]]:
    """(job, event, state) of every line the notify command wrote."""
    if not log.exists():
        return []
    return [tuple(line.split("|", 1)[0].split(" ")) for line in log.read_text().splitlines()]


def test_notify_runs_once_for_done_verify_failed_and_stalled(repo, cli, tmp_path):
    log = tmp_path / "notified.log"
    git(repo, "config", "subtask.notify", RECORD.format(log=log))
    pwned = tmp_path / "pwned"
    done = cli.start(f"echo '$(touch {pwned})' > words.txt", "--verify", "test -f words.txt")
    failed = cli.start("echo oops > oops.txt", "--verify", "false")
    cli("wait", done, failed)
    assert wait_until(lambda: len(told(log)) >= 2)

    git(repo, "config", "subtask.stallAfter", "0.3")  # only now: the jobs above never went silent
    gate = tmp_path / "gate"
    stalled = cli.start(f"echo started; while [ ! -e '{gate}' ]; do sleep 0.05; done; echo going on")
    try:
        assert wait_until(lambda: (stalled, "stalled", "stalled") in told(log))
    finally:
        gate.touch()
    cli("wait", stalled)
    assert wait_until(lambda: (stalled, "ended", "done") in told(log))

    assert sorted(told(log)) == sorted([(done, "ended", "done"), (failed, "verify_failed", "done"),
                                        (stalled, "stalled", "stalled"), (stalled, "ended", "done")])
    summary = next(line for line in log.read_text().splitlines() if line.startswith(done)).split("|", 1)[1]
    assert summary.startswith(f"{done} done · verify passed") and "$(touch" in summary
    assert not pwned.exists()  # the job's words reached the command as data, never as code
    assert sorted(told(log)) == sorted(told(log))  # nothing more arrived after the ends (each once)


def test_a_failing_or_hanging_notify_changes_nothing(repo, cli, tmp_path):
    git(repo, "config", "subtask.notify", "echo not today >&2; exit 3")
    job = cli.start("echo hi > hi.txt", "--verify", "test -f hi.txt")
    waited = cli("wait", job)
    assert waited.returncode == 0 and waited.stdout.startswith(f"{job} done · verify passed")
    log = (repo / ".git" / "subtask" / "logs" / f"{job}.log").read_text()
    assert "subtask.notify exited 3" in log and "not today" in log

    gate = tmp_path / "gate"
    git(repo, "config", "subtask.maxRunning", "1")
    holder = cli.start(f"while [ ! -e '{gate}' ]; do sleep 0.05; done")
    try:
        queued = cli.start("true")
        stopped = cli("stop", queued)  # this command wrote the end: it runs the notify command
        assert stopped.returncode == 0, stopped.stderr
        assert "warning: subtask.notify exited 3" in stopped.stderr
        assert cli.json("show", queued)["state"] == "stopped"
    finally:
        gate.touch()
    cli("wait", holder)


def test_an_mcp_client_is_told_a_jobs_end_as_a_log_notification(repo, cli, monkeypatch, tmp_path):
    from mcp import Client

    from subtask.faces.mcp_server import server

    monkeypatch.chdir(repo)
    messages = []

    async def on_log(params):
        messages.append(params)

    async def main():
        async with Client(server, mode="legacy", logging_callback=on_log) as client:
            started = await client.call_tool("start", {"task": "echo told > told.txt", "verify": "false"})
            job = started.structured_content["id"]
            await client.call_tool("wait", {"ids": [job]})
            with anyio.fail_after(30):
                while not any(m.data.get("job") == job for m in messages):
                    await anyio.sleep(0.05)
            return job

    job = anyio.run(main)
    [message] = [m for m in messages if m.data.get("job") == job]
    assert message.level == "warning" and message.logger == "subtask"
    assert message.data["event"] == "verify_failed" and message.data["message"].startswith(
        f"verify_failed: {job} done · verify failed")
