"""The MCP server: the same jobs for agents, in process and over a real stdio subprocess.

Real repositories, real workers, the real CLI beside it; the slow test drives the server from
the real Claude Code CLI bundled in claude-agent-sdk, against a fake Messages API on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import blocked_on_run_lock, git, make_repo, refs, wait_until
from mcp import Client, StdioServerParameters

WORKTREE = str(Path(__file__).resolve().parents[1])
TOOLS = {"start", "start_many", "map", "wait", "status", "result", "reply", "stop", "cleanup", "list", "engines",
         "du", "routing", "show", "diff", "log", "compare", "merge", "land", "spend", "verify"}


def server_env() -> dict[str, str]:
    """The test's environment (paid-engine guard, git identity) plus this tree on PYTHONPATH."""
    path = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=WORKTREE + (os.pathsep + path if path else ""))


def stdio_params(repo: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "subtask.faces.mcp_server"], cwd=str(repo),
                                 env=server_env())


@asynccontextmanager
async def connect(how: str, repo: Path):
    """A connected client: `inproc` (Client(server, mode="legacy")) or `stdio` (a real subprocess)."""
    if how == "inproc":
        from subtask.faces.mcp_server import server

        async with Client(server, mode="legacy") as client:
            yield client
    else:
        async with Client(stdio_params(repo), mode="legacy") as client:
            yield client


def text(result) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def call(client, name: str, args: dict[str, Any] | None = None, *, ok: bool = True, **kwargs) -> str:
    result = await client.call_tool(name, args or {}, **kwargs)
    assert result.is_error is (not ok), f"{name}({args}) -> {text(result)}"
    if ok:  # the CLI's --json beside the CLI's words
        assert isinstance(result.structured_content, dict) and result.structured_content.get("v") == 1, \
            f"{name} returned no structured content: {result.structured_content!r}"
    else:
        assert result.structured_content is None
    return text(result)


async def call_json(client, name: str, args: dict[str, Any] | None = None) -> tuple[str, dict]:
    """A successful call's text and structured content."""
    result = await client.call_tool(name, args or {})
    assert not result.is_error, f"{name}({args}) -> {text(result)}"
    return text(result), result.structured_content


def job_id_in(line: str) -> str:
    match = re.search(r"\bst-[0-9a-f]{8}\b", line)
    assert match, f"no job id in {line!r}"
    return match.group(0)


@pytest.fixture(params=["inproc", "stdio"])
def how(request, repo, monkeypatch) -> str:
    monkeypatch.chdir(repo)  # the in-process server's working directory is the default repo
    return request.param


# A test of a tool's words and JSON only, which no transport changes: in-process alone (a stdio
# server costs ~0.65 s of CPU). The stdio twins above keep what the wire does: progress, a call
# answered while another blocks, errors that leave the server serving.
words_only = pytest.mark.parametrize("how", ["inproc"], indirect=True)


# --------------------------------------------------------------------------- the tools

def test_tools_are_listed_with_annotations(repo, how):
    async def main():
        async with connect(how, repo) as client:
            assert "start_many" in (client.instructions or "") and "git log --notes=subtask" in client.instructions
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == TOOLS
            for name in ("status", "result", "list", "engines", "wait", "show", "diff", "log", "compare", "spend"):
                assert tools[name].annotations.read_only_hint is True, name
            for name in ("stop", "cleanup", "merge"):
                assert tools[name].annotations.destructive_hint is True, name
            for t in tools.values():
                assert t.output_schema is None, f"{t.name} declares structured output"
            assert tools["start"].input_schema["required"] == ["task"]

    anyio.run(main)


def held(gate: Path, then: str) -> str:
    """A shell task that runs `then` once the test creates `gate`: the job runs until an event."""
    return f"while [ ! -e '{gate}' ]; do sleep 0.02; done; {then}"


def test_start_then_wait_reports_progress_then_result(repo, how, tmp_path):
    progress: list[tuple[float, float | None, str | None]] = []
    gate = tmp_path / "gate"  # the job ends once wait has sent two progress notifications

    async def on_progress(value, total, message):
        progress.append((value, total, message))
        if len(progress) >= 2:
            gate.touch()

    async def main():
        async with connect(how, repo) as client:
            started = await call(client, "start", {"task": held(gate, "echo hi > hello.txt"), "engine": "shell",
                                                   "verify": "test -f hello.txt"})
            job = job_id_in(started)
            assert started.startswith(f"{job} running · shell · branch subtask/{job}")
            waited = await call(client, "wait", {"ids": [job], "timeout": 60}, progress_callback=on_progress)
            assert waited.startswith(f"{job} done · verify passed")
            status = await call(client, "status", {"id": job})
            assert status.startswith(f"{job} done")
            result = await call(client, "result", {"id": job})
            assert result.splitlines()[0] == waited.splitlines()[0]
            assert "changes: 1 file, +1 -0" in result
            listing = await call(client, "list", {})
            assert listing.splitlines()[0].startswith("ID") and job in listing
            return job

    try:
        job = anyio.run(main)
    finally:
        gate.touch()
    assert len(progress) >= 2, progress
    values = [p[0] for p in progress]
    assert values == sorted(values) and len(set(values)) == len(values), "progress must increase"
    assert all(re.match(r"\d+(\.\d)?s: 0 of 1 ended · st-", p[2]) for p in progress), progress
    assert f"refs/subtask/{job}/record" in refs(repo)


def test_land_sends_progress_of_its_window_as_wait_does(repo, how, tmp_path):
    """Over MCP, `land` runs as a child; what its window does comes back as progress
    notifications (elapsed, landed so far, the states verifying), increasing, then the report."""
    progress: list[tuple[float, float | None, str | None]] = []
    gate = tmp_path / "gate"  # the verifies end once two progress notifications came

    async def on_progress(value, total, message):
        progress.append((value, total, message))
        if len(progress) >= 2:
            gate.touch()

    async def main():
        async with connect(how, repo) as client:
            jobs = [job_id_in(await call(client, "start", {"task": f"echo {n} > {n}.txt && git add {n}.txt && "
                                                                  f"git commit -qm 'add {n}'", "verify": "true"}))
                    for n in "ab"]
            await call(client, "wait", {"ids": jobs})
            landed = await call(client, "land", {"ids": jobs, "window": 2, "verify": held(gate, "true")},
                                progress_callback=on_progress)
            assert "(2 of 2 landed)" in landed, landed
            return jobs

    never = threading.Timer(120, gate.touch)  # no progress at all: the verifies end, the test fails
    never.start()
    try:
        jobs = anyio.run(main)
    finally:
        never.cancel()
        gate.touch()
    assert len(progress) >= 2, progress
    values = [p[0] for p in progress]
    assert values == sorted(values) and len(set(values)) == len(values), "progress must increase"
    assert all(re.match(r"land \d+(\.\d+)?s: 0 of 2 landed · verifying st-", p[2]) for p in progress), progress
    assert any(all(job in p[2] for job in jobs) and "(window 2)" in p[2] for p in progress), progress


@words_only
def test_evidence_is_a_json_envelope(repo, how):
    async def main():
        async with connect(how, repo) as client:
            job = job_id_in(await call(client, "start",
                                       {"task": "echo hi > a.txt && git add a.txt && git commit -qm 'Add a'",
                                        "verify": "true"}))
            await call(client, "wait", {"ids": job})
            return job, json.loads(await call(client, "result", {"id": job, "evidence": True}))

    job, envelope = anyio.run(main)
    assert envelope["v"] == 1 and envelope["id"] == job and envelope["state"] == "done"
    assert envelope["git"]["base"] == git(repo, "rev-parse", "HEAD")
    assert envelope["git"]["head"] == git(repo, "rev-parse", f"subtask/{job}")
    assert [c["subject"] for c in envelope["git"]["commits"]] == ["Add a"]
    assert [f["path"] for f in envelope["git"]["changed_files"]] == ["a.txt"]
    assert envelope["verification"]["passed"] is True
    assert envelope["cost"]["billing"] == "free"


def cli_error(cli, *args: str) -> str:
    proc = cli(*args)
    assert proc.returncode != 0
    return proc.stderr.strip()


def test_bad_arguments_are_tool_errors_with_the_cli_words(repo, cli, how, tmp_path):
    bare = tmp_path / "bare.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    expected = {
        "empty task": ("start", {"task": "  "}, cli_error(cli, "start", "  ")),
        "unknown engine": ("start", {"task": "x", "engine": "nope"}, cli_error(cli, "start", "--engine", "nope", "x")),
        "unknown id": ("result", {"id": "st-00000000"}, cli_error(cli, "result", "st-00000000")),
        "stop ended": None,
        "relative repo": ("start", {"task": "x", "repo": "repo"}, "error: repo must be an absolute path"),
        "missing repo": ("status", {"repo": str(tmp_path / "nowhere")}, "does not exist"),
        "not a repo": ("list", {"repo": str(tmp_path)}, "error: not a git repository"),
        "bare repo": ("start", {"task": "x", "repo": str(bare)}, "is a bare repository"),
        "bad timeout": ("wait", {"ids": ["st-00000000"], "timeout": -1}, "error: "),
        "bad state": ("list", {"state": "sleeping"}, cli_error(cli, "list", "--state", "sleeping")),
    }
    expected.pop("stop ended")

    async def main():
        async with connect(how, repo) as client:
            for what, (tool, args, words) in expected.items():
                answer = await call(client, tool, args, ok=False)
                assert words in answer, f"{what}: {answer!r} lacks {words!r}"
            # still serving after all that
            assert (await call(client, "list", {})).startswith("no jobs yet")

    anyio.run(main)


def test_start_many_reports_each_item(repo, tmp_path, how):
    other = make_repo(tmp_path / "other")

    async def main():
        async with connect(how, repo) as client:
            answer = await call(client, "start_many", {"tasks": [
                {"task": "echo one > one.txt"},
                {"task": "", "engine": "shell"},
                {"task": "echo two > two.txt", "repo": str(other)},
                {"task": "x", "colour": "blue"},
            ]})
            lines = answer.splitlines()
            assert len(lines) == 4
            assert re.match(r"1\. st-[0-9a-f]{8} running · shell", lines[0])
            assert lines[1] == "2. error: the task is empty: say what the job should do"
            assert re.match(r"3\. st-[0-9a-f]{8} running · shell", lines[2])
            assert lines[3].startswith("4. error: unknown field 'colour'")
            first, third = job_id_in(lines[0]), job_id_in(lines[2])
            assert (await call(client, "wait", {"ids": [first]})).startswith(f"{first} done")
            waited = await call(client, "wait", {"ids": [third], "repo": str(other)})
            assert waited.startswith(f"{third} done")
            return third

    third = anyio.run(main)
    assert git(other, "show", f"subtask/{third}:two.txt") == "two"


def test_status_answers_while_a_wait_blocks(repo, how, tmp_path):
    gate = tmp_path / "gate"  # the job runs until status has answered: wait cannot end before

    async def main():
        async with connect(how, repo) as client:
            job = job_id_in(await call(client, "start", {"task": held(gate, "true")}))
            answers: dict[str, float] = {}

            async def waiter():
                await call(client, "wait", {"ids": [job]})
                answers["wait"] = time.monotonic()

            async with anyio.create_task_group() as group:
                group.start_soon(waiter)
                # The wait is under way (its watcher blocked on the run-lock), seen, not slept for.
                assert await anyio.to_thread.run_sync(lambda: wait_until(lambda: blocked_on_run_lock(repo, job),
                                                                         timeout=60))
                status = await call(client, "status", {})
                answers["status"] = time.monotonic()
                gate.touch()
                assert status.startswith(f"{job} running")
            assert answers["status"] < answers["wait"]

    try:
        anyio.run(main)
    finally:
        gate.touch()


# --------------------------------------------------------------------------- jobs outlive servers

def test_jobs_survive_a_killed_server(repo, cli, tmp_path):
    """SIGKILL the server in the middle of a wait: the job finishes; a new server reports it."""
    gate = tmp_path / "gate"  # the job runs until its server is dead

    # Start the server by hand so the test owns its pid.
    proc = subprocess.Popen([sys.executable, "-m", "subtask.faces.mcp_server"], cwd=str(repo), env=server_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    rpc = JsonRpc(proc)
    rpc.initialize()
    try:
        job = job_id_in(rpc.call_tool("start", {"task": held(gate, "echo done > out.txt")}))
        rpc.send_call("wait", {"ids": [job]})  # no reply will come: the server dies first
        assert wait_until(lambda: blocked_on_run_lock(repo, job), timeout=60)  # the wait is being served
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)
    finally:
        gate.touch()

    async def second_server():
        async with Client(stdio_params(repo), mode="legacy") as client:
            return await call(client, "wait", {"ids": [job], "timeout": 30})

    assert anyio.run(second_server).startswith(f"{job} done")
    assert git(repo, "show", f"subtask/{job}:out.txt") == "done"
    assert cli.ok("result", job).startswith(f"{job} done")


class JsonRpc:
    """Just enough JSON-RPC over a server's stdio for a test that must kill the server mid-call."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.next_id = 0

    def send(self, method: str, params: dict | None = None, *, notify: bool = False) -> int:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        if not notify:
            self.next_id += 1
            message["id"] = self.next_id
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()
        return self.next_id

    def reply(self, request_id: int) -> dict:
        while True:
            line = self.proc.stdout.readline()
            assert line, "the server closed stdout"
            message = json.loads(line)
            if message.get("id") == request_id:
                assert "result" in message, message
                return message["result"]

    def initialize(self) -> dict:
        answer = self.reply(self.send("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                                     "clientInfo": {"name": "test", "version": "0"}}))
        self.send("notifications/initialized", notify=True)
        return answer

    def send_call(self, name: str, arguments: dict) -> int:
        return self.send("tools/call", {"name": name, "arguments": arguments})

    def call_tool(self, name: str, arguments: dict) -> str:
        result = self.reply(self.send_call(name, arguments))
        assert not result.get("isError"), result
        assert result["structuredContent"]["v"] == 1, result
        return result["content"][0]["text"]


def test_two_servers_and_the_cli_share_max_running(repo, cli, tmp_path, control_dir):
    """Jobs started at once from two servers and the CLI never run more than subtask.maxRunning at a time."""
    git(repo, "config", "subtask.maxRunning", "2")
    log = control_dir / "spans.log"
    task = f"echo start $(date +%s.%N) >> {log}; sleep 0.6; echo end $(date +%s.%N) >> {log}"

    async def one_server(ids: list[str]):
        async with Client(stdio_params(repo), mode="legacy") as client:
            answer = await call(client, "start_many", {"tasks": [{"task": task}] * 3})
            ids.extend(job_id_in(line) for line in answer.splitlines())

    async def from_cli(ids: list[str]):
        for _ in range(2):
            proc = await anyio.run_process(["git", "subtask", "start", task], cwd=str(repo), check=True)
            ids.append(proc.stdout.decode().split()[0])

    async def main() -> list[str]:
        ids: list[str] = []
        async with anyio.create_task_group() as group:
            group.start_soon(one_server, ids)
            group.start_soon(one_server, ids)
            group.start_soon(from_cli, ids)
        async with Client(stdio_params(repo), mode="legacy") as client:
            waited = await call(client, "wait", {"ids": ids, "timeout": 60})
        assert all(" done · " in line for line in waited.splitlines()), waited
        return ids

    ids = anyio.run(main)
    assert len(ids) == 8
    events = sorted((float(t), +1 if kind == "start" else -1)
                    for kind, t in (line.split() for line in log.read_text().splitlines()))
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert len(events) == 16 and peak <= 2, f"{peak} jobs ran at once"


# --------------------------------------------------------------------------- a real client

def _bundled_cli() -> str | None:
    from subtask.engines.claude import _bundled_cli as find

    return find()


@pytest.mark.slow
def test_claude_code_starts_and_waits_through_the_server(repo, tmp_path, monkeypatch):
    """The real Claude Code CLI calls start, then wait with the id it read, then quotes the result."""
    cli = _bundled_cli()
    if cli is None:
        pytest.skip("this claude-agent-sdk wheel bundles no CLI")
    from fake_claude import FakeMessagesAPI, text_turn, tool_turn

    def wait_turn(body: dict) -> dict:
        return tool_turn("mcp__subtask__wait", {"ids": [job_id_in(last_tool_result(body))], "timeout": 60})

    def final_turn(body: dict) -> dict:
        return text_turn("The job finished:\n" + last_tool_result(body))

    turns = [tool_turn("mcp__subtask__start", {"task": "echo hi > hello.txt", "engine": "shell"}),
             wait_turn, final_turn]
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"subtask": {
        "command": sys.executable, "args": ["-m", "subtask.faces.mcp_server"], "cwd": str(repo),
        "env": {"PYTHONPATH": WORKTREE, "PATH": os.environ["PATH"], "HOME": os.environ["HOME"],
                **{k: v for k, v in os.environ.items() if k.startswith("GIT_")}}}}}))
    with FakeMessagesAPI(turns, marker="mcp__subtask__start") as api:
        env = claude_env(tmp_path, api.url)
        proc = subprocess.run([cli, "-p", "Start the job and wait for it.", "--mcp-config", str(config),
                               "--strict-mcp-config", "--allowedTools", "mcp__subtask__start,mcp__subtask__wait",
                               "--output-format", "json", "--max-turns", "6"],
                              cwd=str(repo), env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    reply = json.loads(proc.stdout)["result"]
    job = job_id_in(reply)
    assert f"refs/subtask/{job}/record" in refs(repo)
    assert git(repo, "show", f"subtask/{job}:hello.txt") == "hi"
    summary = git(repo, "log", "-1", "--format=%s", f"refs/subtask/{job}/record")
    assert summary.startswith(f"{job} done")
    assert render_one_line(repo, job) in reply


@pytest.mark.slow
def test_claude_code_lands_a_job_through_the_server(repo, tmp_path):
    """The real Claude Code CLI delegates over MCP alone: start, wait, diff, merge; main then has
    the job's change, and the model saw the diff and the merge in the tools' replies."""
    cli = _bundled_cli()
    if cli is None:
        pytest.skip("this claude-agent-sdk wheel bundles no CLI")
    from fake_claude import FakeMessagesAPI, text_turn, tool_turn

    seen: dict[str, str] = {}

    def after(name: str, tool: str, args=lambda job: {"id": job}):
        def turn(body: dict) -> dict:
            seen[name] = last_tool_result(body)
            seen.setdefault("job", job_id_in(seen[name]))
            return tool_turn(f"mcp__subtask__{tool}", args(seen["job"]))
        return turn

    def final_turn(body: dict) -> dict:
        seen["merge"] = last_tool_result(body)
        return text_turn("Landed:\n" + seen["merge"])

    turns = [tool_turn("mcp__subtask__start", {"task": "echo landed > landed.txt", "engine": "shell",
                                               "verify": "test -f landed.txt"}),
             after("start", "wait", lambda job: {"ids": [job], "timeout": 60}),
             after("wait", "diff"), after("diff", "merge"), final_turn]
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"subtask": {
        "command": sys.executable, "args": ["-m", "subtask.faces.mcp_server"], "cwd": str(repo),
        "env": {"PYTHONPATH": WORKTREE, "PATH": os.environ["PATH"], "HOME": os.environ["HOME"],
                **{k: v for k, v in os.environ.items() if k.startswith("GIT_")}}}}}))
    tools = ",".join(f"mcp__subtask__{t}" for t in ("start", "wait", "diff", "merge"))
    with FakeMessagesAPI(turns, marker="mcp__subtask__start") as api:
        proc = subprocess.run([cli, "-p", "Delegate the change, review it and land it.", "--mcp-config", str(config),
                               "--strict-mcp-config", "--allowedTools", tools, "--output-format", "json",
                               "--max-turns", "10"],
                              cwd=str(repo), env=claude_env(tmp_path, api.url), capture_output=True, text=True,
                              timeout=180)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    job = seen["job"]
    assert " done · verify passed" in seen["wait"], seen["wait"]
    assert "+landed" in seen["diff"], seen["diff"]
    assert f"{job}: merged into main" in seen["merge"], seen["merge"]
    assert git(repo, "show", "main:landed.txt") == "landed"
    log = git(repo, "log", "--notes=subtask", "-1", "main")
    assert f"subtask {job} · done · verify passed" in log and "landed:  in" in log


def last_tool_result(body: dict) -> str:
    """The text of the newest tool_result in a Messages API request's history."""
    for message in reversed(body.get("messages", [])):
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for block in reversed(content):
            if block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, list):
                    return "\n".join(b.get("text", "") for b in inner if b.get("type") == "text")
                return str(inner or "")
    raise AssertionError("no tool_result in the request history")


def render_one_line(repo: Path, job: str) -> str:
    from subtask import api, words

    return words.one_line(api.get(api.repo_at(repo), job))


def claude_env(tmp_path: Path, url: str) -> dict[str, str]:
    home, config = tmp_path / "claude-home", tmp_path / "claude-config"
    home.mkdir(exist_ok=True)
    config.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env["CLAUDE_CODE_TMPDIR"] = os.environ["CLAUDE_CODE_TMPDIR"]  # the test's (conftest.claude_code_temp)
    env.update(HOME=str(home), CLAUDE_CONFIG_DIR=str(config), ANTHROPIC_BASE_URL=url,
               ANTHROPIC_API_KEY="sk-ant-test-fake", ENABLE_TOOL_SEARCH="false",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1", DISABLE_TELEMETRY="1",
               DISABLE_ERROR_REPORTING="1", CLAUDE_CODE_MAX_RETRIES="0", MCP_TIMEOUT="30000")
    return env


# --------------------------------------------------------------------------- entry points

def test_git_subtask_mcp_serves_the_same_tools(repo):
    async def main():
        params = StdioServerParameters(command="git", args=["subtask", "mcp"], cwd=str(repo), env=server_env())
        async with Client(params, mode="legacy") as client:
            return {t.name for t in (await client.list_tools()).tools}

    assert anyio.run(main) == TOOLS


def test_the_cli_does_not_import_the_mcp_sdk():
    code = ("import sys, subtask.faces.cli; "
            "sys.exit(1 if any(m == 'mcp' or m.startswith('mcp.') for m in sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code], env=server_env()).returncode == 0


@pytest.mark.skipif(not hasattr(__import__("subtask.api").api, "reply"), reason="api.reply is not in this tree yet")
def test_reply_continues_a_finished_job(repo, how):
    async def main():
        async with connect(how, repo) as client:
            job = job_id_in(await call(client, "start", {"task": "echo one > one.txt"}))
            await call(client, "wait", {"ids": [job]})
            answer = await call(client, "reply", {"id": job, "message": "echo two > two.txt"})
            assert answer.startswith(job)
            waited = await call(client, "wait", {"ids": [job]})
            assert waited.startswith(f"{job} done") and "attempt 2" in waited
            assert "error: " in await call(client, "reply", {"id": "st-00000000", "message": "x"}, ok=False)

    anyio.run(main)


# --------------------------------------------------------------------------- the fast start (subtask.faces.mcp_server)

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {"roots": {"listChanged": True}},
                         "clientInfo": {"name": "test", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def initialize(version: str, ident: int | str = 1) -> dict:
    return {**INITIALIZE, "id": ident, "params": {**INITIALIZE["params"], "protocolVersion": version}}


def request(ident: int | str, method: str, params: dict | None = None) -> dict:
    return {"jsonrpc": "2.0", "id": ident, "method": method, **({"params": params} if params is not None else {})}


LIVE_SESSIONS: list[Session] = []


@pytest.fixture(autouse=True)
def _no_server_left_running():
    """A test that failed half way leaves no server behind (the zygote dies with its server)."""
    yield
    while LIVE_SESSIONS:
        proc = LIVE_SESSIONS.pop().proc
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class Session:
    """A server subprocess driven line by line: raw bytes in, raw lines out. A read waits at most
    READ_TIMEOUT seconds (a server that answers nothing fails the test instead of hanging it)."""

    READ_TIMEOUT = 60.0

    def __init__(self, repo: Path, *, front: bool = True, hold: Path | None = None, env: dict | None = None):
        """`hold`: the server waits before it loads the SDK until the test creates that file (the
        front end alone serves meanwhile), and creates `<hold>.reached` when it is there. `env`:
        more of the server's environment."""
        env = dict(server_env(), SUBTASK_MCP_FRONT="1" if front else "0", **(env or {}))
        if hold is not None:
            env["SUBTASK_FAULT_HOLD"] = f"mcp_before_sdk:{hold}"
        self.started = time.monotonic()
        self.errors = tempfile.TemporaryFile()  # not a pipe: the server never blocks on stderr
        self.proc = subprocess.Popen([sys.executable, "-m", "subtask.faces.mcp_server"], cwd=str(repo),
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errors)
        LIVE_SESSIONS.append(self)
        self.seen: list[bytes] = []
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def _read_stdout(self) -> None:
        for line in iter(self.proc.stdout.readline, b""):
            self.lines.put(line)
        self.lines.put(b"")

    def stderr(self) -> str:
        self.errors.seek(0)
        return self.errors.read().decode(errors="replace")

    def send(self, *messages: dict | bytes) -> None:
        data = b"".join(m if isinstance(m, bytes) else (json.dumps(m) + "\n").encode() for m in messages)
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def next_line(self) -> bytes:
        """The next line on stdout (kept in `seen`)."""
        try:
            line = self.lines.get(timeout=self.READ_TIMEOUT)
        except queue.Empty:
            self.proc.kill()
            pytest.fail(f"no reply in {self.READ_TIMEOUT:g}s; stderr: {self.stderr()[-2000:]}")
        if not line:
            self.lines.put(b"")
            pytest.fail(f"the server closed stdout; stderr: {self.stderr()[-2000:]}")
        self.seen.append(line)
        return line

    def next_message(self) -> Any:
        return json.loads(self.next_line())

    def reply(self, ident: int | str) -> bytes:
        """The raw line answering `ident` (notifications read on the way are kept in `seen`)."""
        while True:
            line = self.next_line()
            message = json.loads(line)
            if isinstance(message, dict) and "method" not in message and message.get("id") == ident:
                return line

    def read_until(self, marker: bytes) -> bytes:
        """The next line containing `marker` (every line read on the way is kept in `seen`)."""
        while marker not in (line := self.next_line()):
            pass
        return line

    def rest(self) -> bytes:
        """Everything on stdout until the server closes it."""
        out = []
        while line := self.lines.get(timeout=self.READ_TIMEOUT):
            out.append(line)
        self.lines.put(b"")
        return b"".join(out)

    def close(self) -> str:
        """Close stdin, wait for the exit; its stderr. Nothing may follow the last reply but the
        server's log notifications: a job's events are told as they happen (`mcp_calls.Attention`),
        so a job that ended just before a reply may be told just after it."""
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0
        rest = [line for line in self.rest().splitlines()
                if json.loads(line).get("method") != "notifications/message"]
        assert rest == [], f"more on stdout after the last reply: {rest[0][:200]!r}"
        return self.stderr()


SHIPPED_CACHE = Path(WORKTREE) / "subtask" / "faces" / "mcp_cache.json"


def parsed(cache: dict) -> dict:
    """`mcp_server.unpack`'s cache with each result's JSON text read, as `describe()` gives it."""
    return {**cache, "results": {version: {method: json.loads(text) for method, text in replies.items()}
                                 for version, replies in cache["results"].items()}}


def cached_sdk_versions() -> dict[str, str]:
    return json.loads(SHIPPED_CACHE.read_text(encoding="utf-8"))["sdk"]


@pytest.fixture(autouse=True, scope="module")
def a_cache_for_the_installed_sdk(tmp_path_factory):
    """The early path (replies sent before the SDK loads) under test with whatever SDK release is
    installed: where the shipped cache was made with another one, which the server would not
    serve, a cache for this one is made as scripts/mcp_cache.py makes it."""
    from subtask.faces import mcp_server
    from subtask.faces.mcp_versions import installed_versions

    if cached_sdk_versions() == installed_versions():
        yield
        return
    from subtask.faces.mcp_tools import describe

    path = tmp_path_factory.mktemp("mcp-cache") / "mcp_cache.json"
    path.write_text(mcp_server.pack(describe()), encoding="utf-8")
    saved = mcp_server.CACHE
    mcp_server.CACHE = os.environ["SUBTASK_MCP_CACHE"] = str(path)
    yield
    mcp_server.CACHE = saved
    del os.environ["SUBTASK_MCP_CACHE"]


def test_the_cached_description_is_what_the_sdk_says():
    """subtask/faces/mcp_cache.json must be the SDK's replies now: regenerate it with scripts/mcp_cache.py.

    Only where the SDK installed is the one the cache was made with: any other release (an older or
    a newer one the dependency range allows) gets its replies from the SDK itself, which the test
    below defends."""
    from subtask.faces import mcp_server
    from subtask.faces.mcp_tools import describe
    from subtask.faces.mcp_versions import installed_versions

    if cached_sdk_versions() != installed_versions():
        pytest.skip(f"the cache was made with {cached_sdk_versions()}, this is {installed_versions()}")
    assert parsed(mcp_server.unpack(SHIPPED_CACHE.read_bytes())) == describe(), \
        "stale subtask/faces/mcp_cache.json: run python scripts/mcp_cache.py"
    assert mcp_server.load_cache() is not None


def test_the_shipped_cache_holds_each_reply_once_and_compact():
    """The front end parses the whole cache before its first reply: four protocol versions'
    copies of the same tools/list, indented, were 246 KB and ~3 ms of the ~22 ms a client waited
    for `initialize` (bench/peer.py --initialize-only)."""
    text = SHIPPED_CACHE.read_text(encoding="utf-8")
    assert text.count('"name":"start_many"') == 1, "a reply stored more than once"
    assert "\n " not in text, "indented"


def test_a_cache_of_the_earlier_format_or_damaged_is_not_served(tmp_path, monkeypatch):
    from subtask.faces import mcp_server

    shipped = parsed(mcp_server.unpack(SHIPPED_CACHE.read_bytes()))
    for text in (json.dumps(shipped, indent=1), mcp_server.pack(shipped)[:-100], "[]", '{"v": 2}'):
        (tmp_path / "cache.json").write_text(text, encoding="utf-8")
        monkeypatch.setattr(mcp_server, "CACHE", str(tmp_path / "cache.json"))
        assert mcp_server.load_cache() is None, text[:80]


def test_a_cache_made_with_another_sdk_is_never_served(monkeypatch):
    from subtask.faces import mcp_server

    other = {**cached_sdk_versions(), "mcp": "0.0.1"}
    monkeypatch.setattr(mcp_server, "installed_versions", lambda: other)
    assert mcp_server.load_cache() is None


def test_the_front_end_loads_no_sdk():
    code = ("import sys, subtask.faces.mcp_server as m; m.load_cache(); "
            "print(sorted({n.split('.')[0] for n in sys.modules} "
            "& {'mcp', 'mcp_types', 'pydantic', 'anyio', 'pygit2'}))")
    proc = subprocess.run([sys.executable, "-c", code], env=server_env(), capture_output=True, text=True)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_the_front_end_answers_initialize_without_threading_queue_or_json():
    """`threading` and `queue` (~5 ms) come after the first reply; so does `json`, which loads
    `re` and `enum` (~9 ms of the ~10 ms the front end's imports cost before it answered:
    mcp_initialize was 1.00 of the peer's)."""
    code = ("import sys\n"
            "before = set(sys.modules)\n"
            "import subtask.faces.mcp_server as m\n"
            "class W:\n    def write(self, data): sys.stdout.write(data.decode())\n"
            "m.Front(W(), m.load_cache())._answer_first(sys.stdin.buffer.readline())\n"
            "print(sorted(n for n in set(sys.modules) - before\n"
            "             if n.split('.')[0] in ('threading', 'queue', '_json', 'json', 're', 'enum')))")
    line = json.dumps(INITIALIZE) + "\n"
    proc = subprocess.run([sys.executable, "-c", code], env=server_env(), input=line, capture_output=True, text=True)
    reply, modules = proc.stdout.splitlines()
    assert modules == "[]", proc.stdout + proc.stderr
    from subtask.faces import mcp_server

    cached = json.loads(mcp_server.load_cache()["results"]["2025-06-18"]["initialize"])
    assert json.loads(reply) == {"jsonrpc": "2.0", "id": 1, "result": cached}


@pytest.mark.parametrize("version", ["2024-11-05", "2099-01-01"])
def test_front_end_replies_are_the_sdks_byte_for_byte(repo, version):
    """initialize (the client's version, or the SDK's latest) and tools/list, as the plain SDK path sends them."""
    lists = [request(2, "tools/list"), request("p", "prompts/list", {}), request(4, "resources/list")]
    answers = {}
    for front in (True, False):
        session = Session(repo, front=front)
        session.send(initialize(version, "init"), INITIALIZED, *lists)
        answers[front] = [session.reply(i) for i in ("init", 2, "p", 4)]
        stderr = session.close()
        assert "differs" not in stderr, stderr
    assert answers[True] == answers[False]
    assert json.loads(answers[True][0])["result"]["protocolVersion"] == (version if version < "2099" else "2025-11-25")
    assert {t["name"] for t in json.loads(answers[True][1])["result"]["tools"]} == TOOLS


def test_ids_the_front_end_writes_by_hand_are_what_json_would_write(repo):
    """The front end writes its cached replies' ids itself (`json` is not loaded before its first
    reply): a string id with quotes, escapes, control and non-ASCII characters comes back equal.
    A lone surrogate (`"\\ud800"`) cannot be written as UTF-8: the front end leaves that request to
    the SDK, and the session goes on (its reader thread once died on one)."""
    odd = 'a "b" \\ c\n\t\x01 é ✳ 😀'
    session = Session(repo)
    session.send(initialize("2025-06-18", odd), INITIALIZED,
                 b'{"jsonrpc":"2.0","id":"\\ud800","method":"tools/list"}\n', request(3, "tools/list"))
    assert json.loads(session.reply(odd))["id"] == odd
    assert {t["name"] for t in json.loads(session.reply(3))["result"]["tools"]} == TOOLS
    lone = [line for line in session.seen if json.loads(line).get("id") == "\ud800"] or [session.reply("\ud800")]
    assert "Invalid JSON" in json.loads(lone[0])["error"]["message"]  # the SDK's (pydantic's) word
    stderr = session.close()
    assert "Traceback" not in stderr and "differs" not in stderr, stderr


class FakeWire:
    def __init__(self):
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


def test_the_sdks_own_initialize_reply_is_dropped_and_checked(capsys):
    from subtask.faces import mcp_server

    wire = FakeWire()
    front = mcp_server.Front(wire, mcp_server.load_cache())
    front.open((json.dumps(INITIALIZE) + "\n").encode())
    assert json.loads(wire.written[0])["result"]["protocolVersion"] == "2025-06-18"
    line, _ = front.lines.get_nowait()
    assert line == (json.dumps(INITIALIZE) + "\n").encode()  # the SDK sees it too
    front.from_sdk(wire.written[0].decode())  # the SDK's identical reply: dropped silently
    front.from_sdk('{"jsonrpc":"2.0","id":1,"result":{}}\n')  # a later reply with the same id passes
    assert len(wire.written) == 2 and capsys.readouterr().err == ""

    wire = FakeWire()
    front = mcp_server.Front(wire, mcp_server.load_cache())
    front.open((json.dumps(INITIALIZE) + "\n").encode())
    front.from_sdk('{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"no"}}\n')
    assert len(wire.written) == 1 and "differs from the one sent" in capsys.readouterr().err


def test_a_call_sent_with_initialize_is_served_by_the_sdk_with_progress(repo, tmp_path):
    """Everything at once, before the SDK is loaded: the call waits for the SDK; wait still sends progress."""
    gate = tmp_path / "gate"  # the job runs until wait has sent a progress notification
    session = Session(repo)
    session.send(INITIALIZE, INITIALIZED, request(2, "tools/list"),
                 request(3, "tools/call",
                         {"name": "start", "arguments": {"task": held(gate, "true"), "engine": "shell"}}))
    assert json.loads(session.reply(1))["result"]["serverInfo"]["name"] == "subtask"
    assert len(json.loads(session.reply(2))["result"]["tools"]) == len(TOOLS)
    started = json.loads(session.reply(3))["result"]
    assert not started.get("isError"), started
    job = job_id_in(started["content"][0]["text"])
    session.send(request(4, "tools/call",
                         {"name": "wait", "arguments": {"ids": [job]}, "_meta": {"progressToken": "w"}}))
    watchdog = threading.Timer(60, gate.touch)  # no progress ever: the job ends and the test fails
    watchdog.start()
    try:
        session.read_until(b'"notifications/progress"')
    finally:
        watchdog.cancel()
        gate.touch()
    waited = json.loads(session.reply(4))["result"]
    assert waited["content"][0]["text"].startswith(f"{job} done"), waited
    progress = [json.loads(line) for line in session.seen if b'"notifications/progress"' in line]
    assert progress and all(p["params"]["progressToken"] == "w" for p in progress), session.seen
    assert "differs" not in session.close()


REFUSED_INITIALIZE = {**INITIALIZE, "params": {"protocolVersion": "2025-06-18"}}  # no clientInfo


@pytest.mark.parametrize("first, answered", [
    (request("ping", "ping"), ["ping"]),  # a request before initialize
    (b"this is not json\n", []),          # garbage
    (REFUSED_INITIALIZE, [1]),            # an initialize the SDK refuses
], ids=["ping", "garbage", "refused-initialize"])
def test_anything_unexpected_first_goes_to_the_sdk_as_is(repo, first, answered):
    """The front end answers nothing: every reply is the plain SDK path's, byte for byte."""
    replies = {}
    for front in (True, False):
        session = Session(repo, front=front)
        session.send(first)
        head = [session.reply(ident) for ident in answered]
        session.send(initialize("2025-06-18", "init"), INITIALIZED, request(2, "tools/list"))
        replies[front] = [*head, session.reply("init"), session.reply(2)]
        session.close()
    assert replies[True] == replies[False]
    assert "result" in json.loads(replies[True][-1])


def test_a_client_that_leaves_after_initialize_does_not_wait_for_the_sdk(repo):
    """initialize, initialized, close: the front end exits at once; the plain path loads the SDK first."""
    took = {}
    for front in (True, False):
        session = Session(repo, front=front)
        session.send(INITIALIZE, INITIALIZED)
        session.reply(1)
        session.close()
        took[front] = time.monotonic() - session.started
    assert took[True] < took[False], took


# ------------------------------------------------------------ JSON-RPC 2.0 on the wire (issue 38)

def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def rpc(**members: Any) -> dict:
    return {"jsonrpc": "2.0", **members}


LIST_CALL = {"name": "list", "arguments": {}}
# (what, the line, its answer: a (code, id) error; a list of them for a batch; None: no answer)
BAD_LINES: list[tuple[str, dict | bytes, Any]] = [
    ("100,000 nested [", b"[" * 100_000 + b"\n", (-32700, None)),
    ("not JSON", b'{"jsonrpc": "2.0", "id": 60, "method"\n', (-32700, None)),
    ("NaN", b'{"jsonrpc": "2.0", "id": 61, "method": "ping", "params": {"x": NaN}}\n',
     (-32700, None)),
    ("batch", json.dumps([request(62, "ping"), INITIALIZED, request("b", "tools/list")]).encode()
     + b"\n", [(-32600, 62), (-32600, "b")]),
    ("empty batch", b"[]\n", (-32600, None)),
    ("id without method", rpc(id=63), (-32600, 63)),
    ("array params", rpc(id=64, method="tools/call", params=["list", {}]), (-32602, 64)),
    ("object id", rpc(id={"n": 65}, method="ping"), (-32600, None)),
    ("null id", rpc(id=None, method="tools/call", params=LIST_CALL), (-32600, None)),
    ("fractional id", rpc(id=66.5, method="ping"), (-32600, 66.5)),
    ("no jsonrpc member", {"id": 67, "method": "ping"}, (-32600, 67)),
    ("a number", b"68\n", (-32600, None)),
    ("method not a string", rpc(id=69, method=69), (-32600, 69)),
    ("a malformed response", rpc(id=70, result=70), (-32600, None)),
    ("nested deeper than the SDK reads",
     request(71, "tools/call", {"name": "list", "arguments": {"x": nested(300)}}), (-32600, 71)),
    ("a notification with array params", rpc(method="notifications/x", params=[1]), None),
]
TITLES = {-32700: "Parse error", -32600: "Invalid Request", -32602: "Invalid params"}


def expected_errors() -> list:
    found: list = []
    for _what, _line, answer in BAD_LINES:
        if isinstance(answer, list):
            found.append(("batch", tuple(answer)))
        elif answer is not None:
            found.append(answer)
    return sorted(found, key=repr)


@pytest.mark.parametrize("when", ["before the SDK loads", "after the SDK loaded"])
def test_each_bad_line_gets_its_json_rpc_error_and_the_session_goes_on(repo, tmp_path, when):
    """JSON-RPC 2.0: -32700 for what is not JSON, -32600 for what is not a request, -32602 for
    params that are not an object; each answered, and the next request still is."""
    gate = tmp_path / "sdk-gate"
    session = Session(repo, hold=gate)
    session.send(INITIALIZE, INITIALIZED)
    session.reply(1)
    if when == "after the SDK loaded":
        gate.touch()
        session.send(request("warm", "ping"))  # only the SDK answers a ping
        session.reply("warm")
    else:
        assert wait_until(Path(f"{gate}.reached").exists), "the server never reached the SDK's load"
    errors, lists = [], []

    def read_until_reply(ident: str) -> dict:
        while True:
            message = session.next_message()
            if isinstance(message, list):
                assert all(set(m) == {"jsonrpc", "id", "error"} for m in message), message
                errors.append(("batch", tuple((m["error"]["code"], m["id"]) for m in message)))
                assert all("batch" in m["error"]["message"] for m in message), message
            elif message.get("id") == ident:
                return message
            elif "error" in message:
                code = message["error"]["code"]
                assert message["error"]["message"].startswith(TITLES[code]), message
                errors.append((code, message["id"]))

    for n, (_what, line, _answer) in enumerate(BAD_LINES):
        session.send(line, request(f"list-{n}", "tools/list"))
        lists.append(read_until_reply(f"list-{n}"))
    assert all(len(m["result"]["tools"]) == len(TOOLS) for m in lists)
    gate.touch()
    session.send(request("call", "tools/call", {"name": "list", "arguments": {}}))
    called = read_until_reply("call")
    assert called["result"]["content"][0]["text"].startswith("no jobs yet"), called
    assert sorted(errors, key=repr) == expected_errors()
    assert "Traceback" not in session.close()


def test_a_call_read_before_the_end_of_input_is_answered_then_the_server_exits(repo, tmp_path):
    """The client sends a call and closes stdin before the SDK is loaded: the call is answered."""
    gate = tmp_path / "sdk-gate"
    session = Session(repo, hold=gate)
    session.send(INITIALIZE, INITIALIZED, request(2, "tools/call", LIST_CALL))
    session.reply(1)
    assert wait_until(Path(f"{gate}.reached").exists), "the server never reached the SDK's load"
    session.proc.stdin.close()
    gate.touch()
    answer = json.loads(session.reply(2))
    assert answer["result"]["content"][0]["text"].startswith("no jobs yet"), answer
    assert session.proc.wait(timeout=30) == 0


def start_held(session: Session, gate: Path) -> str:
    """Start a shell job that runs until `gate` exists, and a wait for it (request 3)."""
    start = {"name": "start", "arguments": {"task": held(gate, "true"), "engine": "shell"}}
    session.send(INITIALIZE, INITIALIZED, request(2, "tools/call", start))
    job = job_id_in(json.loads(session.reply(2))["result"]["content"][0]["text"])
    wait = {"ids": [job], "timeout": 60}
    session.send(request(3, "tools/call", {"name": "wait", "arguments": wait,
                                           "_meta": {"progressToken": "w"}}))
    session.read_until(b'"notifications/progress"')  # the wait is under way
    return job


def test_a_call_under_way_at_the_end_of_input_is_answered_then_the_server_exits(repo, tmp_path):
    """A wait under way when the client closes stdin ends as a wait does (the job's end)."""
    gate = tmp_path / "gate"  # the job runs until the test has closed the server's stdin
    session = Session(repo)
    watchdog = threading.Timer(60, gate.touch)
    watchdog.start()
    try:
        job = start_held(session, gate)
        session.proc.stdin.close()
        session.read_until(b'"notifications/progress"')  # the wait goes on after the end of input
    finally:
        watchdog.cancel()
        gate.touch()
    waited = json.loads(session.reply(3))
    assert waited["result"]["content"][0]["text"].startswith(f"{job} done"), waited
    assert session.proc.wait(timeout=30) == 0


def test_a_call_the_client_cancelled_is_not_waited_for_at_the_end_of_input(repo, tmp_path):
    """A cancelled request gets no answer (MCP): the server exits at the end of input."""
    gate = tmp_path / "gate"  # the job runs until the test ends
    session = Session(repo)
    try:
        start_held(session, gate)
        session.send(rpc(method="notifications/cancelled", params={"requestId": 3}))
        session.proc.stdin.close()
        assert session.proc.wait(timeout=30) == 0
        assert b'"id":3' not in session.rest()
    finally:
        gate.touch()


def test_a_client_gone_at_the_end_of_input_is_not_waited_for(repo, tmp_path):
    """The client died (both pipes closed) during a wait: the server exits at its next progress
    write, not when the wait would have ended."""
    gate = tmp_path / "gate"  # the job runs until the test ends
    # Not a Session: its reader thread holds stdout, which this test closes.
    proc = subprocess.Popen([sys.executable, "-m", "subtask.faces.mcp_server"], cwd=str(repo),
                            env=server_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    client = JsonRpc(proc)
    try:
        client.initialize()
        job = job_id_in(client.call_tool("start", {"task": held(gate, "true"), "engine": "shell"}))
        client.send("tools/call", {"name": "wait", "arguments": {"ids": [job], "timeout": 120},
                                   "_meta": {"progressToken": "w"}})
        while b'"notifications/progress"' not in proc.stdout.readline():
            pass  # the wait is under way
        proc.stdin.close()
        proc.stdout.close()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        gate.touch()


META_2026 = {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}
LISTS_WITH_PARAMS = [request(10, "tools/list", {"cursor": 5}),
                     request(11, "tools/list", {"_meta": 5}),
                     request(12, "tools/list", META_2026),
                     request(13, "prompts/list", {"cursor": "x"}),
                     request(14, "tools/list", {"cursor": "next"})]


def test_list_requests_with_params_are_answered_as_the_sdk_answers_them(repo, tmp_path):
    """A cursor or a `_meta` is the SDK's to judge (an invalid one is an error, a 2026 envelope is
    refused on this connection): the front end never answers those from its cache."""
    plain = Session(repo, front=False)
    plain.send(INITIALIZE, INITIALIZED, *LISTS_WITH_PARAMS)
    expected = {m["id"]: plain.reply(m["id"]) for m in LISTS_WITH_PARAMS}
    plain.close()
    assert "error" in json.loads(expected[10]) and "error" in json.loads(expected[12])
    gate = tmp_path / "sdk-gate"
    session = Session(repo, hold=gate)
    session.send(INITIALIZE, INITIALIZED, *LISTS_WITH_PARAMS, request("plain", "tools/list"))
    session.reply("plain")  # from the cache, the SDK held: what was answered before it came from it
    early = {json.loads(line).get("id") for line in session.seen}
    assert not early & {m["id"] for m in LISTS_WITH_PARAMS}, f"answered from the cache: {early}"
    gate.touch()
    assert {m["id"]: session.reply(m["id"]) for m in LISTS_WITH_PARAMS} == expected
    session.close()


# --------------------------------------------------------------------------- the whole loop over MCP (issue 31)

def test_an_agent_delegates_reviews_and_lands_over_mcp_with_no_cli_call(repo):
    """Three jobs, one start_many and one wait; each diff reviewed; two merged, one left; `git log
    --notes=subtask` on main shows the two landed, each with its verify result."""
    tasks = [{"task": f"echo {name} > {name}.txt", "verify": f"test -f {name}.txt"} for name in ("one", "two", "three")]

    async def main() -> tuple[list[str], dict[str, str]]:
        async with connect("stdio", repo) as client:
            started, data = await call_json(client, "start_many", {"tasks": tasks})
            ids = [item["id"] for item in data["items"]]
            assert [job_id_in(line) for line in started.splitlines()] == ids
            waited, data = await call_json(client, "wait", {"ids": ids, "timeout": 60})
            assert data["passed"] is True and all(" done · verify passed" in line for line in waited.splitlines())
            diffs = {}
            for job, name in zip(ids, ("one", "two", "three"), strict=True):
                stat, data = await call_json(client, "diff", {"id": job, "stat": True})
                assert f"{name}.txt | 1 +" in stat and data["truncated"] is False
                diffs[job] = await call(client, "diff", {"id": job})
                assert f"+{name}" in diffs[job]
            for job in ids[:2]:
                merged, data = await call_json(client, "merge", {"id": job})
                assert merged.startswith(f"{job}: merged into main") and data["landed_in"] == data["commit"]
            return ids, diffs

    ids, _ = anyio.run(main)
    log = git(repo, "log", "--notes=subtask", "main")
    for job, name in zip(ids[:2], ("one", "two"), strict=True):
        assert f"subtask {job} · done · verify passed" in log
        assert f"verify:  test -f {name}.txt -> exit 0" in log
        assert "landed:  in" in log
    assert ids[2] not in log and not (repo / "three.txt").exists()
    assert git(repo, "rev-parse", "--verify", "-q", f"subtask/{ids[2]}")  # left: its branch stays


@words_only
def test_review_tools_answer_the_clis_words_and_json(repo, cli, how):
    """show, result, diff, log, spend, list, status: the text is what the CLI prints, the structured
    content what its --json prints."""
    job = cli.start("echo hi > hi.txt && git add hi.txt && git commit -qm 'Add hi'", "--verify", "test -f hi.txt")
    cli("wait", job)
    same = {"show": ["show", job], "result": ["result", job], "spend": ["spend"], "status": ["status", job],
            "list": ["list"]}
    args = {"show": {"id": job}, "result": {"id": job}, "spend": {}, "status": {"id": job}, "list": {}}

    async def main() -> dict[str, tuple[str, dict]]:
        async with connect(how, repo) as client:
            answers = {name: await call_json(client, name, args[name]) for name in same}
            answers["diff"] = await call_json(client, "diff", {"id": job})
            answers["log"] = await call_json(client, "log", {"id": job})
            return answers

    answers = anyio.run(main)
    volatile = re.compile(r"\b\d+(\.\d+)?s\b|\d+\.\d+| +")  # ages and durations (and their columns) move
    for name, argv in same.items():
        text, data = answers[name]
        printed = cli(*argv).stdout.rstrip("\n")
        assert volatile.sub("T", text) == volatile.sub("T", printed), name
        as_json = json.loads(cli(*argv, "--json" if name != "result" else "--evidence").stdout)
        assert data.pop("reply") == text
        assert _without_times(data) == _without_times(as_json), name
    diff_text, diff_data = answers["diff"]
    assert "+hi" in diff_text and diff_data["head"] == git(repo, "rev-parse", f"subtask/{job}")
    assert diff_data["text"] == git(repo, "diff", diff_data["base"], diff_data["head"]) + "\n"
    assert "Add hi" in answers["log"][0] and f"subtask {job} · done · verify passed" in answers["log"][0]


def _without_times(data):
    if isinstance(data, dict):
        return {k: _without_times(v) for k, v in data.items() if k not in ("created", "ended", "age", "line")}
    if isinstance(data, list):
        return [_without_times(v) for v in data]
    return data


def test_a_diff_is_bounded_and_says_what_it_left_out(repo, cli, monkeypatch):
    monkeypatch.chdir(repo)
    job = cli.start("seq 1 20000 > big.txt")
    cli("wait", job)

    async def main():
        async with connect("inproc", repo) as client:
            return await call_json(client, "diff", {"id": job, "max_bytes": 1000})

    text, data = anyio.run(main)
    assert data["truncated"] is True and data["bytes"] > 100_000
    kept = data["text"]
    assert len(kept.encode()) <= 1000 and kept.endswith("\n")  # cut at a line end
    assert text.splitlines()[-1] == (f"(diff cut at {len(kept.encode()):,} of {data['bytes']:,} bytes: "
                                     "stat=true, or paths=[...])")


@words_only
def test_merge_over_mcp_refuses_as_the_cli_does_and_changes_nothing(repo, cli, how):
    failed = cli.start("echo x > x.txt", "--verify", "false")
    empty = cli.start("true")
    cli("wait", failed, empty)
    before = git(repo, "rev-parse", "main")
    expected = {failed: cli_error(cli, "merge", failed), empty: cli_error(cli, "merge", empty)}

    async def main():
        async with connect(how, repo) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["merge"].annotations.destructive_hint is True
            assert tools["merge"].input_schema["properties"]["mode"]["enum"] == ["merge", "squash", "no-ff", "ff-only"]
            for job, words in expected.items():
                assert await call(client, "merge", {"id": job}, ok=False) == words
            forced = await call(client, "merge", {"id": failed, "force": True, "mode": "squash"})
            assert forced.startswith(f"{failed}: merged into main (squash)")

    anyio.run(main)
    assert git(repo, "rev-parse", "main~1") == before and (repo / "x.txt").exists()


@words_only
def test_argument_errors_read_like_the_cli_never_like_pydantic(repo, how):
    async def main():
        async with connect(how, repo) as client:
            answers = [await call(client, tool, args, ok=False) for tool, args in (
                ("wait", {"ids": ["st-00000000"], "timeout": "soon"}),
                ("wait", {"idz": ["st-00000000"]}),
                ("result", {}),
                ("start", {"task": "x", "max_turns": 2.5}),
                ("start", {"task": "x", "pick": "best"}),
                ("merge", {"id": "st-00000000", "mode": "rebase"}),
                ("start", {"task": "x", "verfiy": "true"}),
                ("land", {"ids": []}),
            )]
            return answers

    answers = anyio.run(main)
    assert answers == [
        "error: timeout must be a number, not 'soon'\nhint: wait takes: ids (required), timeout, any, since, repo",
        "error: wait takes no 'idz'\nhint: wait takes: ids (required), timeout, any, since, repo",
        "error: result needs id\nhint: result takes: id (required), full, evidence, repo",
        answers[3], answers[4],
        "error: mode must be one of merge, squash, no-ff, ff-only, not 'rebase'\n"
        "hint: merge takes: id (required), mode, force, repo",
        answers[6],
        "error: land needs at least one job id (or best-of group id)",  # ids may be empty with first
    ]
    assert answers[3].startswith("error: max_turns must be a whole number, not 2.5\n"
                                 "hint: start takes: task (required), ")
    assert answers[4].startswith("error: pick must be one of smallest, cheapest, fastest, not 'best'\n")
    assert answers[6].startswith("error: start takes no 'verfiy'\n")
    for answer in answers:
        assert "validation error" not in answer and "pydantic" not in answer and "Input should" not in answer


# Argument mistakes an operation finds (not the schema): each tool's words name its parameters
# (`timeout`, `best_of`), never the CLI's flags (`--timeout`); a whole `git subtask ...` command in
# a hint is a command, and stays one.
OPERATION_ARGUMENT_ERRORS = [
    ("wait", {"ids": ["JOB"], "timeout": -1}, "timeout must be"),
    ("wait", {"ids": []}, "wait needs at least one job id"),
    ("start", {"task": "x", "timeout": 0}, "timeout must be"),
    ("start", {"task": "x", "verify_timeout": -1}, "verify_timeout must be"),
    ("start", {"task": "x", "max_usd": -1}, "max_usd must be"),
    ("start", {"task": "x", "max_turns": 0}, "max_turns must be"),
    ("start", {"task": "x", "verify": " "}, "verify is empty"),
    ("start", {"task": "x", "after": "nope"}, "not a job id"),
    ("start", {"task": "x", "on_fail": "run"}, "on_fail goes with after"),
    ("start", {"task": "x", "after": "JOB", "base": "main"}, "after starts the job"),
    ("start", {"task": "x", "retries": 99}, "retries must be"),
    ("start", {"task": "x", "retries": 1}, "retries needs verify"),
    ("start", {"task": "x", "retries": 1, "verify": "true", "readonly": True},
     "retries makes no sense with readonly"),
    ("start", {"task": "x", "check": "paths=src/**", "readonly": True},
     "check has nothing to look at"),
    ("start", {"task": "x", "best_of": 1}, "best_of must be"),
    ("start", {"task": "x", "best_of": 2}, "best_of needs verify"),
    ("start", {"task": "x", "best_of": 2, "verify": "true", "judge": " "}, "judge needs a command"),
    ("start", {"task": "x", "best_of": 2, "verify": "true", "first_pass": True, "pick": "smallest"},
     "first_pass"),
    ("start", {"task": "x", "best_of": 2, "verify": "true", "readonly": True},
     "best_of makes no sense"),
    ("start", {"task": "x", "best_of": 2, "verify": "true", "after": "JOB"},
     "a group cannot wait (after)"),
    ("start", {"task": "x", "engine": ["shell", "shell"]}, "engine takes one name"),
    ("start", {"task": "x", "on": "bogus"}, "on is 'bogus'"),
    ("start", {"task": "x", "pick": "smallest"}, "pick goes with best_of"),
    ("start", {"task": "x", "first_pass": True}, "first_pass goes with best_of"),
    ("map", {"pattern": "*.py", "task": "x {files}", "batch": 0}, "batch must be"),
    ("map", {"pattern": "*.py", "task": "x {files}", "concurrency": 0}, "concurrency must be"),
    ("reply", {"id": "JOB", "message": "x", "timeout": 0}, "timeout must be"),
    ("land", {"ids": ["JOB"], "atomic": True}, "nothing landed (atomic)"),
    ("land", {"ids": ["JOB"], "window": 0}, "window must be"),
    ("land", {"ids": ["JOB", "JOB"]}, "named twice"),
]
CLI_FLAG = re.compile(r"(?<![\w'\"-])--[a-z]")
A_CLI_COMMAND = re.compile(r"git[ -]subtask(?: [^\s;()]+)*")


def test_argument_errors_name_the_tools_parameters_never_the_clis_flags(repo, cli, monkeypatch):
    monkeypatch.chdir(repo)  # the in-process server works in its working directory
    job = cli.start("true")  # ended, nothing to land
    cli("wait", job)

    def with_job(value: Any) -> Any:
        if isinstance(value, list):
            return [with_job(v) for v in value]
        return job if value == "JOB" else value

    async def main() -> list[str]:
        async with connect("inproc", repo) as client:
            answers = []
            for tool, args, _words in OPERATION_ARGUMENT_ERRORS:
                args = {name: with_job(value) for name, value in args.items()}
                answers.append(await call(client, tool, args, ok=False))
            items = [{"task": "x", "timeout": 0}, {"task": "y", "retries": 1}]
            answers.append((await call_json(client, "start_many", {"tasks": items}))[1]["reply"])
            return answers

    answers = anyio.run(main)
    for (tool, args, words), answer in zip(OPERATION_ARGUMENT_ERRORS, answers, strict=False):
        assert words in answer, f"{tool} {args}: {answer!r} lacks {words!r}"
    for answer in answers:
        assert not CLI_FLAG.search(A_CLI_COMMAND.sub("", answer)), f"a CLI flag in {answer!r}"
    first, second = answers[-1].splitlines()  # start_many's item errors, in the same words
    assert first.startswith("1. error: timeout must be")
    assert second.startswith("2. error: retries needs verify")


@words_only
def test_a_land_that_lands_nothing_is_an_error_as_a_merge_of_the_same_job_is(repo, cli, how):
    """Every job refused or failed: `land` exits 1 as `merge` does, and over MCP both are tool
    errors naming why. A land that landed some is an answer (ok false), and a dry run is a plan."""
    failed = cli.start("echo x > x.txt", "--verify", "false")
    good = cli.start("echo y > y.txt", "--verify", "test -f y.txt")
    cli("wait", failed, good)
    assert cli("merge", failed).returncode == cli("land", failed).returncode == 1
    before = git(repo, "rev-parse", "main")

    async def main():
        async with connect(how, repo) as client:
            merged = await call(client, "merge", {"id": failed}, ok=False)
            landed = await call(client, "land", {"ids": [failed]}, ok=False)
            assert git(repo, "rev-parse", "main") == before
            planned, plan = await call_json(client, "land", {"ids": [failed], "dry_run": True})
            partial, data = await call_json(client, "land", {"ids": [failed, good]})
            return merged, landed, planned, partial, data

    merged, landed, planned, partial, data = anyio.run(main)
    assert merged.startswith(f"error: {failed}: verify failed")
    assert landed.startswith(f"error: nothing landed onto main ({failed} refused)\n"), landed
    assert f"{failed}: refused: {failed}: verify failed" in landed and "main: stays at" in landed
    assert "nothing was changed (dry run)" in planned
    assert data["ok"] is False and [j["state"] for j in data["jobs"]] == ["refused", "landed"]
    assert partial.endswith("(1 of 2 landed)")


def test_wait_with_timeout_zero_answers_the_current_states_at_once(repo, cli, how, tmp_path):
    """A poll: the jobs as they are now, at once; `timed_out` says some are still running."""
    gate = tmp_path / "gate"
    ended = cli.start("true")
    cli("wait", ended)
    running = cli.start(held(gate, "true"))
    try:
        polled = cli("wait", "--timeout", "0", running)
        assert polled.returncode == 1 and polled.stdout.startswith(f"{running} running"), polled
        assert "still running (they continue)" in polled.stderr and "timed out" not in polled.stderr
        assert cli("wait", "--timeout", "-1", running).returncode == 129

        async def main():
            async with connect(how, repo) as client:
                now, data = await call_json(client, "wait", {"ids": [running, ended], "timeout": 0})
                done, done_data = await call_json(client, "wait", {"ids": [ended], "timeout": 0})
                return now, data, done, done_data

        now, data, done, done_data = anyio.run(main)
    finally:
        gate.touch()
    assert now.startswith(f"{running} running") and f"{ended} done" in now and data["timed_out"] is True
    assert done.startswith(f"{ended} done") and done_data["timed_out"] is False


@words_only
def test_list_folds_a_group_as_the_cli_does(repo, cli, how):
    started = cli.ok("start", "--best-of", "2", "--verify", "true", "echo $SUBTASK_GROUP_MEMBER > m.txt")
    gid = started.split()[0]
    cli("wait", gid)

    async def main():
        async with connect(how, repo) as client:
            return await call_json(client, "list", {}), await call(client, "list", {"all": True})

    (folded, data), unfolded = anyio.run(main)
    assert folded == cli.ok("list").rstrip("\n").replace("\n\n", "\n") or folded.splitlines()[1].startswith(gid)
    assert folded.splitlines()[1].startswith(gid) and len(folded.splitlines()) == 2
    assert [g["id"] for g in data["groups"]] == [gid]
    assert len(unfolded.splitlines()) == 4 and unfolded.splitlines()[2].startswith("  st-")


def test_compare_answers_every_pair_of_a_group(repo, cli, monkeypatch):
    monkeypatch.chdir(repo)
    gid = cli.ok("start", "--best-of", "2", "--verify", "true", "seq 1 $SUBTASK_GROUP_MEMBER > m.txt").split()[0]
    cli("wait", gid)

    async def main():
        async with connect("inproc", repo) as client:
            assert "compare takes a group id" in await call(client, "compare", {"id": "st-00000000"}, ok=False)
            return await call_json(client, "compare", {"id": gid, "patch": True})

    text, data = anyio.run(main)
    assert data["group"] == gid and len(data["pairs"]) == 1
    assert text.splitlines()[0].startswith("== st-") and "+2" in text


def test_stop_cleanup_engines_and_a_groups_show_and_stop(repo, cli, how, tmp_path, control_dir):
    """The tools the other tests do not reach, through the real client: stop (a job, a group),
    cleanup, engines, show of a group."""
    gate = control_dir / "gate"

    async def main():
        async with connect(how, repo) as client:
            job = job_id_in(await call(client, "start", {"task": held(gate, "true")}))
            stopped, data = await call_json(client, "stop", {"id": job})
            assert stopped.startswith(f"{job} stopped") and data["state"] == "stopped"
            cleaned, data = await call_json(client, "cleanup", {"id": job})
            assert cleaned.startswith(f"{job}: ") and data["lines"] == [cleaned]  # (stopped before its checkout: none)
            engines, data = await call_json(client, "engines", {})
            assert engines.splitlines()[0].startswith("shell: installed=yes")
            assert [e["name"] for e in data["engines"]][:3] == ["shell", "claude", "codex"]
            started, data = await call_json(client, "start", {"task": held(gate, "true"), "best_of": 2,
                                                              "verify": "true"})
            gid = data["group"]
            shown, data = await call_json(client, "show", {"id": gid})
            assert shown.startswith(f"{gid} running") and [r["member"] for r in data["rows"]] == data["members"]
            stopped, data = await call_json(client, "stop", {"id": gid})
            assert stopped.startswith(f"{gid} stopped, no pick") and data["state"] == "stopped"

    try:
        anyio.run(main)
    finally:
        gate.touch()


def test_land_over_mcp_answers_the_clis_words_and_json_and_verifies_confined(repo, cli, how):
    """`land` runs `git-subtask land` as a child (a server with threads confines nothing), so its
    verifies on the integrated commits are confined as the CLI's; its refusals read as the CLI's."""
    jobs = [cli.start(f"echo {n} > {n}.txt && git add {n}.txt && git commit -qm 'add {n}'",
                      "--verify", f"test -f {n}.txt") for n in ("one", "two")]
    cli("wait", *jobs)
    expected_error = cli_error(cli, "land", "st-00000000")

    async def main():
        async with connect(how, repo) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["land"].annotations.destructive_hint is True
            assert await call(client, "land", {"ids": ["st-00000000"]}, ok=False) == expected_error
            planned, plan = await call_json(client, "land", {"ids": jobs, "dry_run": True})
            assert plan["dry_run"] and planned.endswith("nothing was changed (dry run)")
            return await call_json(client, "land", {"ids": jobs})

    words, data = anyio.run(main)
    assert data.pop("reply") == words and data["ok"] and [j["state"] for j in data["jobs"]] == ["landed", "landed"]
    assert words.splitlines()[-1].endswith("(2 of 2 landed)") and "(unconfined)" not in words
    assert all(j["confined"] for j in data["jobs"]) and (repo / "one.txt").exists() and (repo / "two.txt").exists()


def test_mcp_land_lands_in_the_repository_the_call_names_whatever_the_server_was_started_with(repo, tmp_path, cli):
    """`land` runs in a child process; a SUBTASK_REPO the server was given (as `install codex`
    forwards it) must not send that child to another repository than the call's `repo`."""
    from conftest import make_repo

    other = make_repo(tmp_path / "other")
    job = cli.start("echo landed > landed.txt", "--verify", "test -f landed.txt")
    cli("wait", job)
    params = StdioServerParameters(command=sys.executable, args=["-m", "subtask.faces.mcp_server"], cwd=str(other),
                                   env=dict(server_env(), SUBTASK_REPO=str(other)))

    async def main() -> str:
        async with Client(params, mode="legacy") as client:
            return (await call_json(client, "land", {"ids": [job], "repo": str(repo)}))[0]

    landed = anyio.run(main)
    assert job in landed and git(repo, "show", "main:landed.txt") == "landed", landed


def test_mcp_list_says_what_its_sweep_removed(repo, cli):
    """A job merged by plain git is cleaned up by the next `list`'s sweep: an agent's `list` says
    so, as the CLI does on stderr, never removing a branch without a word."""
    git(repo, "config", "subtask.sweepInterval", "0")
    job = cli.start("echo hi > hi.txt")
    cli("wait", job)
    git(repo, "merge", "-q", "--no-edit", f"subtask/{job}")

    async def main() -> str:
        async with connect("stdio", repo) as client:
            return await call(client, "list", {})

    listed = anyio.run(main)
    assert f"found 1 landed job: {job}" in listed, listed
    assert not git(repo, "branch", "--list", f"subtask/{job}")


GC_SPY = """import atexit, gc, os
counts = [0, 0, 0]
def _count(phase, info):
    if phase == "start":
        counts[info["generation"]] += 1
gc.callbacks.append(_count)
atexit.register(lambda: open(os.environ["GC_SPY_LOG"], "w").write(f"{counts} {gc.get_freeze_count()}"))
"""


def test_the_server_loads_the_sdk_without_walking_it_again_and_again(repo, tmp_path):
    """The SDK's import makes ~300,000 objects: at Python's default pace (a collection every 700)
    the server ran ~200 collections while loading it, one of them over everything (~25 ms of a
    ~450 ms load, before its first call is served). It loads at the CLI's pace, then freezes what
    it loaded: a long-lived server's later full collections never walk the SDK again."""
    (tmp_path / "sitecustomize.py").write_text(GC_SPY)
    log = tmp_path / "gc.log"
    session = Session(repo, env={"GC_SPY_LOG": str(log),
                                 "PYTHONPATH": f"{tmp_path}{os.pathsep}{server_env()['PYTHONPATH']}"})
    session.send(INITIALIZE, INITIALIZED, request(2, "tools/list"),
                 request(3, "tools/call", {"name": "list", "arguments": {}}))
    assert "error" not in json.loads(session.reply(3)), session.seen  # served by the SDK, loaded
    session.close()  # the exit, not a kill: the spy writes its counts at the exit
    counts, _, frozen = log.read_text().rpartition(" ")
    young, middle, full = json.loads(counts)
    assert (middle, full) == (0, 0) and young < 20, (young, middle, full)
    assert int(frozen) > 50_000, frozen  # the SDK's and the tools' objects (~100,000)
