"""The claude engine: a fake CLI for the SDK protocol and error mapping, the real bundled CLI
against a fake Messages API on 127.0.0.1 for the end-to-end path. Never a paid call."""

from __future__ import annotations

import os
import subprocess
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fake_claude import (
    FAKE_SESSION,
    FakeMessagesAPI,
    api_error,
    cli_options,
    read_record,
    record_path,
    text_turn,
    tool_turn,
    write_fake_cli,
)

from subtask.engines.base import DELEGATION_PROTOCOL, EngineContext, Outcome
from subtask.engines.claude import (
    ClaudeEngine,
    _bundled_cli,
    _exit_status,
    classify,
)

OFFLINE_URL = "http://127.0.0.1:9"  # nothing listens; the fake CLI never calls it anyway
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.com",
                "GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "test@example.com"}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    (path / "README.md").write_text("hello\n")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "init")
    return path


def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, **GIT_IDENTITY)
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                         check=True, env=env)
    return out.stdout


def make_ctx(repo: Path, env: dict[str, str], events: list[dict[str, Any]],
             **fields: Any) -> EngineContext:
    return EngineContext(job_id="j7", attempt=1, task="Tidy the README", worktree=repo,
                         repo_root=repo, git_common_dir=repo / ".git", env=env,
                         emit=events.append, **fields)


@pytest.fixture
def fake_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run the engine against a fake CLI for a scenario: (outcome, events, record)."""

    def run(scenario: str, **fields: Any) -> tuple[Outcome, list[dict[str, Any]], Path]:
        cli = write_fake_cli(tmp_path / f"claude-{scenario}", scenario)
        monkeypatch.setenv("SUBTASK_CLAUDE_CLI", str(cli))
        monkeypatch.setenv("ANTHROPIC_BASE_URL", OFFLINE_URL)
        env = dict(os.environ, SUBTASK_CLAUDE_CLI=str(cli), ANTHROPIC_BASE_URL=OFFLINE_URL)
        events: list[dict[str, Any]] = []
        ctx = make_ctx(fields.pop("repo"), env, events, **fields)
        return ClaudeEngine().run(ctx), events, cli

    return run


# --- the fake CLI ----------------------------------------------------------------------------


def test_success_maps_the_result(fake_cli, repo: Path) -> None:
    outcome, events, _ = fake_cli("success", repo=repo, max_usd=0.5)
    assert outcome.ok and outcome.error_kind is None
    assert outcome.outcome == "done"
    assert outcome.summary.endswith("STATUS: done")
    assert outcome.cost_usd == Decimal("0.0123")  # exact: money is never a float
    assert outcome.tokens == {"input": 100, "output": 50, "cache_read": 10, "cache_creation": 5}
    assert outcome.turns == 3
    assert outcome.session_id == FAKE_SESSION
    assert outcome.commands == [{"command": "git status", "exit": 0},
                                {"command": "make test", "exit": 2}]
    kinds = [e["type"] for e in events]
    assert {"text", "tool", "command", "result"} <= set(kinds)
    assert {"type": "command", "command": "make test", "exit": 2} in events
    assert kinds[-1] == "result"


def test_options_reach_the_cli(fake_cli, repo: Path) -> None:
    _, _, cli = fake_cli("success", repo=repo, max_usd=0.5, max_turns=7, model="claude-test")
    record = read_record(cli)
    argv = record["argv"]
    assert arg_after(argv, "--permission-mode") == "acceptEdits"
    assert float(arg_after(argv, "--max-budget-usd")) == 0.5
    assert int(arg_after(argv, "--max-turns")) == 7
    assert arg_after(argv, "--model") == "claude-test"
    allowed = arg_after(argv, "--allowedTools").split(",")
    assert {"Read", "Write", "Edit", "Bash", "Glob", "Grep"} <= set(allowed)
    protocol = arg_after(argv, "--append-system-prompt")
    assert "job j7" in protocol and str(repo) in protocol and "STATUS: done|partial|blocked" in protocol
    assert arg_after(argv, "--setting-sources") == "user,project,local"
    assert "bypassPermissions" not in argv and "--dangerously-skip-permissions" not in argv
    assert "--resume" not in cli_options(argv)
    assert Path(record["cwd"]).resolve() == repo.resolve()


def test_resume_passes_the_session(fake_cli, repo: Path) -> None:
    _, _, cli = fake_cli("success", repo=repo, session_id="sess-42")
    argv = read_record(cli)["argv"]
    assert arg_after(argv, "--resume") == "sess-42"


def test_readonly_allows_only_reading(fake_cli, repo: Path) -> None:
    _, _, cli = fake_cli("success", repo=repo, readonly=True)
    argv = read_record(cli)["argv"]
    assert set(arg_after(argv, "--allowedTools").split(",")) == {"Read", "Glob", "Grep", "LS"}
    denied = set(arg_after(argv, "--disallowedTools").split(","))
    assert {"Write", "Edit", "MultiEdit", "NotebookEdit", "Bash"} <= denied
    assert arg_after(argv, "--permission-mode") != "acceptEdits"


@pytest.mark.parametrize("scenario, cost", [
    ("budget", 0.51), ("max_turns", 0.0123), ("auth", 0.0), ("usage_limit", 0.0),
    ("api_error", 0.0123),
])
def test_error_results_map_to_kinds(fake_cli, repo: Path, scenario: str, cost: float) -> None:
    outcome, events, _ = fake_cli(scenario, repo=repo, max_usd=0.5)
    assert not outcome.ok
    assert outcome.error_kind == scenario
    assert outcome.hint is not None
    assert outcome.error
    # What is known is kept: the worker charges the cost and can resume the session.
    assert outcome.cost_usd == Decimal(str(cost))
    assert outcome.session_id == FAKE_SESSION
    assert outcome.tokens and outcome.turns == 3
    assert {"command": "make test", "exit": 2} in outcome.commands
    assert any(e["type"] == "result" and e["is_error"] for e in events)


def test_crash_without_result_is_an_engine_error(fake_cli, repo: Path) -> None:
    outcome, _, _ = fake_cli("crash", repo=repo)
    assert not outcome.ok and outcome.error_kind == "engine"
    assert outcome.exit_code == 3
    assert "boom" in (outcome.error or "")  # the CLI's stderr tail is kept
    assert outcome.session_id == FAKE_SESSION  # from system/init


def test_missing_cli_is_not_installed(repo: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no-such-claude"
    monkeypatch.setenv("SUBTASK_CLAUDE_CLI", str(missing))
    monkeypatch.setenv("ANTHROPIC_BASE_URL", OFFLINE_URL)
    env = dict(os.environ, SUBTASK_CLAUDE_CLI=str(missing), ANTHROPIC_BASE_URL=OFFLINE_URL)
    outcome = ClaudeEngine().run(make_ctx(repo, env, []))
    assert not outcome.ok and outcome.error_kind == "not_installed"
    assert outcome.hint is not None


def test_config_names_the_cli(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cli = write_fake_cli(tmp_path / "configured-claude", "success")
    monkeypatch.delenv("SUBTASK_CLAUDE_CLI", raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", OFFLINE_URL)
    env = {k: v for k, v in os.environ.items() if k != "SUBTASK_CLAUDE_CLI"}
    config = {"engine.claude.cliPath": str(cli)}
    outcome = ClaudeEngine().run(make_ctx(repo, env, [], config=config.get))
    assert outcome.ok and record_path(cli).exists()


@pytest.mark.parametrize("scenario", ["hang", "hang_stubborn"])
def test_timeout_ends_the_cli_and_its_children(fake_cli, repo: Path, scenario: str) -> None:
    pids: list[int] = []
    started = time.monotonic()
    # 5 s: the fake (a Python process) must have said its session and started its child first,
    # which took over 1.5 s on a loaded CI machine.
    outcome, _, cli = fake_cli(scenario, repo=repo, timeout=5, on_pid=pids.append)
    assert time.monotonic() - started < 20
    assert not outcome.ok and outcome.error_kind == "timeout"
    assert outcome.session_id == FAKE_SESSION
    cli_pid = read_record(cli)["pid"]
    assert pids == [cli_pid]  # reported as its own process group
    child_pid = int(Path(f"{record_path(cli)}.child").read_text())
    for pid in (cli_pid, child_pid):
        assert wait_gone(pid), f"process {pid} survived the timeout"


# --- pure helpers ----------------------------------------------------------------------------


@pytest.mark.parametrize("subtype, text, status, assistant_error, kind", [
    ("error_max_budget_usd", "Reached maximum budget ($1)", None, None, "budget"),
    ("error_max_turns", "Reached maximum number of turns (5)", None, None, "max_turns"),
    ("success", "Invalid API key · Please run /login", 401, "authentication_failed", "auth"),
    ("success", "OAuth token has expired", None, None, "auth"),
    ("success", "Claude AI usage limit reached|1760000000", 429, "rate_limit", "usage_limit"),
    ("success", "Credit balance is too low", 400, "billing_error", "usage_limit"),
    ("success", "API Error: 529 Overloaded", 529, "server_error", "api_error"),
    ("success", "API Error: 500 Internal server error", 500, None, "api_error"),
    ("error_during_execution", "something broke", None, None, "engine"),
])
def test_classify(subtype: str, text: str, status: int | None, assistant_error: str | None,
                  kind: str) -> None:
    assert classify(subtype, text, status, assistant_error) == kind


def test_exit_status() -> None:
    assert _exit_status("all fine, exit code 5 mentioned", False) == 0
    assert _exit_status("Exit code 3\noops", True) == 3
    assert _exit_status([{"type": "text", "text": "Exit code 127\nnot found"}], True) == 127
    assert _exit_status("Command timed out", True) is None


def test_probe_without_spending(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_AUTH_TOKEN",
                "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SUBTASK_CLAUDE_CLI", str(write_fake_cli(tmp_path / "c", "success")))
    monkeypatch.setenv("ANTHROPIC_BASE_URL", OFFLINE_URL)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "config"))
    engine = ClaudeEngine()
    probe = engine.probe()
    assert probe.installed and probe.paid and probe.authenticated is False
    assert "acceptEdits" in probe.isolation and "not a sandbox" in probe.isolation
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / ".credentials.json").write_text("{}")
    assert engine.probe().authenticated is True
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-fake")
    assert engine.probe().authenticated is True
    monkeypatch.setenv("SUBTASK_CLAUDE_CLI", str(tmp_path / "missing"))
    assert engine.probe().installed is False


def test_bundled_cli_version() -> None:
    cli = _bundled_cli()
    if cli is None:
        pytest.skip("this claude-agent-sdk wheel bundles no CLI")
    out = subprocess.run([cli, "--version"], capture_output=True, text=True, timeout=30)
    assert "Claude Code" in out.stdout


def test_protocol_names_the_job() -> None:
    text = DELEGATION_PROTOCOL.format(job_id="j1", worktree="/w")
    assert "j1" in text and "/w" in text and "Do not push" in text


# --- the real bundled CLI against a fake Messages API ----------------------------------------


def offline_env(tmp_path: Path, url: str) -> dict[str, str]:
    """An environment in which the real CLI can reach nothing but the fake API."""
    home, config = tmp_path / "home", tmp_path / "claude-config"
    home.mkdir(exist_ok=True)
    config.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANTHROPIC_", "CLAUDE_")) and k != "SUBTASK_CLAUDE_CLI"}
    env["CLAUDE_CODE_TMPDIR"] = os.environ["CLAUDE_CODE_TMPDIR"]  # the test's (conftest.claude_code_temp)
    env.update(GIT_IDENTITY, HOME=str(home), CLAUDE_CONFIG_DIR=str(config),
               ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="sk-ant-test-fake",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1",
               DISABLE_TELEMETRY="1", DISABLE_ERROR_REPORTING="1", CLAUDE_CODE_MAX_RETRIES="0")
    return env


@pytest.fixture
def real_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if _bundled_cli() is None:
        pytest.skip("this claude-agent-sdk wheel bundles no CLI")
    monkeypatch.delenv("SUBTASK_CLAUDE_CLI", raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", OFFLINE_URL)  # until the fake API is up

    def run(api: FakeMessagesAPI, repo: Path, **fields: Any):
        env = offline_env(tmp_path, api.url)
        # The SDK lays ctx.env over os.environ: keep os.environ offline as well.
        for key in ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "HOME", "CLAUDE_CONFIG_DIR"):
            monkeypatch.setenv(key, env[key])
        events: list[dict[str, Any]] = []
        started = time.monotonic()
        outcome = ClaudeEngine().run(make_ctx(repo, env, events, timeout=120, **fields))
        return outcome, events, time.monotonic() - started

    return run


@pytest.mark.slow
def test_real_cli_writes_and_commits(real_cli, repo: Path) -> None:
    turns = [
        tool_turn("Write", {"file_path": str(repo / "hello.txt"), "content": "hello\n"}),
        tool_turn("Bash", {"command": 'git add hello.txt && git commit -m "Add hello"',
                           "description": "Commit hello.txt"}),
        text_turn("Wrote hello.txt\nSTATUS: done"),
    ]
    with FakeMessagesAPI(turns) as api:
        outcome, events, seconds = real_cli(api, repo, max_usd=1.0, max_turns=10)
    print(f"real CLI run: {seconds:.1f}s, {len(api.requests)} API requests")
    assert outcome.ok, outcome.error
    assert outcome.outcome == "done"
    assert outcome.summary.endswith("STATUS: done")
    assert git(repo, "log", "-1", "--format=%s").strip() == "Add hello"
    assert git(repo, "show", "HEAD:hello.txt") == "hello\n"
    assert {"command": 'git add hello.txt && git commit -m "Add hello"', "exit": 0} \
        in outcome.commands
    assert isinstance(outcome.cost_usd, Decimal) and outcome.cost_usd >= 0
    assert outcome.session_id
    assert any(e["type"] == "tool" and e["name"] == "Write" for e in events)
    main = api.main_requests()
    assert main and all(r.get("tools") for r in main)


@pytest.mark.slow
def test_real_cli_readonly_cannot_write(real_cli, repo: Path) -> None:
    turns = [
        tool_turn("Write", {"file_path": str(repo / "hello.txt"), "content": "hello\n"}),
        text_turn("Could not write.\nSTATUS: blocked"),
    ]
    with FakeMessagesAPI(turns) as api:
        outcome, _, _ = real_cli(api, repo, readonly=True)
    assert outcome.ok, outcome.error
    assert outcome.outcome == "blocked"
    assert not (repo / "hello.txt").exists()
    main = api.main_requests()
    names = {t.get("name") for t in main[0]["tools"]}
    assert "Read" in names and not names & {"Write", "Edit", "Bash"}


@pytest.mark.slow
def test_real_cli_stops_at_the_budget(real_cli, repo: Path) -> None:
    """The budget reaches Claude Code and binds it: each answer costs more than the whole budget
    (a million tokens in), so the CLI itself ends the run after the first call, whichever way the
    SDK spells the option."""
    turns = [tool_turn("Bash", {"command": "true", "description": "Do nothing"}) for _ in range(5)]
    turns.append(text_turn("Finished.\nSTATUS: done"))
    with FakeMessagesAPI(turns, usage=(1_000_000, 1_000)) as api:
        outcome, _, _ = real_cli(api, repo, max_usd=0.05, max_turns=10)
    assert not outcome.ok and outcome.error_kind == "budget", outcome.error
    assert len(api.main_requests()) < len(turns)
    assert outcome.cost_usd is not None and outcome.cost_usd > 0.05


@pytest.mark.slow
@pytest.mark.parametrize("status, kind, message, expected", [
    (401, "authentication_error", "invalid x-api-key", "auth"),
    (529, "overloaded_error", "Overloaded", "api_error"),
])
def test_real_cli_api_errors(real_cli, repo: Path, status: int, kind: str, message: str,
                             expected: str) -> None:
    with FakeMessagesAPI([], fail_main=api_error(status, kind, message)) as api:
        outcome, _, _ = real_cli(api, repo)
    assert not outcome.ok and outcome.error_kind == expected
    assert outcome.hint is not None and outcome.session_id


# --- small helpers ---------------------------------------------------------------------------


def arg_after(argv: list[str], flag: str) -> str:
    """The value Claude Code reads for `flag`, whichever spelling the SDK chose."""
    value = cli_options(argv)[flag]
    assert isinstance(value, str), f"{flag} has no value in {argv}"
    return value


def wait_gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def alive(pid: int) -> bool:
    """Running and not a zombie (a reaped-later child of ours still counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
