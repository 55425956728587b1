"""The codex engine against a fake `codex` that replays recorded `codex exec --json` events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from subtask.engines.base import Baseline, EngineContext
from subtask.engines.codex import CodexEngine, classify_error

SESSION = "0199a213-81c0-7800-8aa1-bbab2a035a53"

# A realistic `codex exec --json` run: reasoning, two commands (one failing), a file change,
# the final agent message and the turn's usage.
RECORDED = [
    {"type": "thread.started", "thread_id": SESSION},
    {"type": "turn.started"},
    {"type": "item.completed", "item": {"id": "item_0", "type": "reasoning",
                                        "text": "**Looking at the repository layout**"}},
    {"type": "item.started", "item": {"id": "item_1", "type": "command_execution",
                                      "command": "bash -lc ls", "aggregated_output": "",
                                      "exit_code": None, "status": "in_progress"}},
    {"type": "item.completed", "item": {"id": "item_1", "type": "command_execution",
                                        "command": "bash -lc ls", "aggregated_output": "README.md\n",
                                        "exit_code": 0, "status": "completed"}},
    {"type": "item.started", "item": {"id": "item_2", "type": "command_execution",
                                      "command": "bash -lc 'python -m pytest -q'",
                                      "aggregated_output": "", "exit_code": None,
                                      "status": "in_progress"}},
    {"type": "item.completed", "item": {"id": "item_2", "type": "command_execution",
                                        "command": "bash -lc 'python -m pytest -q'",
                                        "aggregated_output": "no tests ran\n", "exit_code": 5,
                                        "status": "failed"}},
    {"type": "item.completed", "item": {"id": "item_3", "type": "file_change",
                                        "changes": [{"path": "hello.txt", "kind": "add"}],
                                        "status": "completed"}},
    {"type": "item.completed", "item": {"id": "item_4", "type": "agent_message",
                                        "text": "Added hello.txt with a greeting.\n"
                                                "Committed as 'Add hello'.\nSTATUS: done"}},
    {"type": "turn.completed", "usage": {"input_tokens": 24763, "cached_input_tokens": 24448,
                                         "output_tokens": 122}},
]

USAGE_LIMIT = [
    {"type": "thread.started", "thread_id": SESSION},
    {"type": "turn.started"},
    {"type": "turn.failed", "error": {"message": "You've hit your usage limit. Upgrade to Pro "
                                                 "or try again in 2 hours."}},
]

AUTH = [
    {"type": "thread.started", "thread_id": SESSION},
    {"type": "turn.started"},
    {"type": "error", "message": "unexpected status 401 Unauthorized: Missing bearer or basic "
                                 "authentication in header"},
]

FAKE_CODEX = r'''#!{python}
"""A stand-in for `codex`: records its argv, then replays events by mode."""
import json, os, subprocess, sys, time

if sys.argv[1:] == ["--version"]:
    print("codex-cli 0.99.0")
    sys.exit(0)
with open(os.environ["FAKE_CODEX_LOG"], "a") as log:
    log.write(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "stdin": sys.stdin.read()}}) + "\n")
mode = os.environ.get("FAKE_CODEX_MODE", "ok")
events = json.loads(os.environ.get("FAKE_CODEX_EVENTS", "[]"))
print("WARNING: not json, just a banner", flush=True)
print("starting", file=sys.stderr, flush=True)
if mode == "sleep":
    time.sleep(60)
if mode == "events_then_sleep":  # what an engine says, then silence
    for event in events:
        print(json.dumps(event), flush=True)
    time.sleep(60)
if mode == "events_then_repeat":  # what an engine says, then its last event again and again
    for event in events:
        print(json.dumps(event), flush=True)
    for _ in range(1200):
        print(json.dumps(events[-1]), flush=True)
        time.sleep(0.05)
    sys.exit(1)
if mode == "commit":
    workdir = sys.argv[sys.argv.index("-C") + 1]
    with open(os.path.join(workdir, "hello.txt"), "w") as f:
        f.write("hello\n")
    subprocess.run(["git", "-C", workdir, "add", "hello.txt"], check=True)
    subprocess.run(["git", "-C", workdir, "commit", "-q", "-m", "Add hello"], check=True)
for event in events:
    print(json.dumps(event), flush=True)
sys.exit(int(os.environ.get("FAKE_CODEX_EXIT", "0")))
'''


@pytest.fixture
def repo(tmp_path: Path) -> dict[str, Any]:
    """A real repository with one commit and a linked worktree, plus a fake codex on PATH."""
    env = dict(os.environ)
    env.update(GIT_AUTHOR_NAME="Test", GIT_AUTHOR_EMAIL="test@example.com",
               GIT_COMMITTER_NAME="Test", GIT_COMMITTER_EMAIL="test@example.com",
               GIT_CONFIG_NOSYSTEM="1", HOME=str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    root = tmp_path / "repo"
    root.mkdir()

    def git(*args: str, cwd: Path = root) -> str:
        return subprocess.run(["git", *args], cwd=cwd, env=env, check=True,
                              capture_output=True, text=True).stdout

    git("init", "-q", "-b", "main")
    (root / "README.md").write_text("hi\n")
    git("add", "README.md")
    git("commit", "-q", "-m", "init")
    worktree = tmp_path / "job1"  # named after its job, as the worker names them
    git("worktree", "add", "-q", "-b", "subtask/job1", str(worktree))

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "codex"
    fake.write_text(FAKE_CODEX.format(python=sys.executable))
    fake.chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["FAKE_CODEX_LOG"] = str(tmp_path / "argv.jsonl")
    env.pop("SUBTASK_CODEX_BIN", None)
    return {"root": root, "worktree": worktree, "env": env, "git": git, "tmp": tmp_path,
            "common": Path(git("rev-parse", "--path-format=absolute", "--git-common-dir").strip())}


def make_ctx(repo: dict[str, Any], events: list[dict[str, Any]], *, mode: str = "ok",
             exit_code: int = 0, config: dict[str, str] | None = None,
             **kwargs: Any) -> tuple[EngineContext, list[dict[str, Any]]]:
    env = dict(repo["env"], FAKE_CODEX_MODE=mode, FAKE_CODEX_EVENTS=json.dumps(events),
               FAKE_CODEX_EXIT=str(exit_code))
    emitted: list[dict[str, Any]] = []
    settings = config or {}
    ctx = EngineContext(job_id="job1", attempt=1, task=kwargs.pop("task", "Add hello.txt"),
                        worktree=repo["worktree"], repo_root=repo["root"],
                        git_common_dir=repo["common"], env=env, emit=emitted.append,
                        config=settings.get, **kwargs)
    return ctx, emitted


def calls(repo: dict[str, Any]) -> list[dict[str, Any]]:
    log = repo["tmp"] / "argv.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def prompt_of(call: dict[str, Any]) -> str:
    """The prompt codex was given: read from stdin when its argument is `-`, as codex does."""
    argv = call["argv"]
    assert argv[-2] == "--"  # a prompt starting with '-' stays a prompt
    return call["stdin"] if argv[-1] == "-" else argv[-1]


def test_a_task_beyond_the_argument_limit_reaches_codex_whole(repo):
    """One argv string may hold at most 128 KiB (MAX_ARG_STRLEN); the documented task limit is 1 MiB."""
    task = "Add hello.txt\n" + "x" * (300 * 1024)
    ctx, _ = make_ctx(repo, RECORDED, task=task)
    out = CodexEngine().run(ctx)
    assert out.ok, out.error
    assert prompt_of(calls(repo)[0]).startswith(task)


def test_recorded_run_becomes_an_outcome(repo):
    ctx, emitted = make_ctx(repo, RECORDED)
    out = CodexEngine().run(ctx)

    assert out.ok, out.error
    assert out.exit_code == 0
    assert out.session_id == SESSION
    assert out.commands == [{"command": "bash -lc ls", "exit": 0},
                            {"command": "bash -lc 'python -m pytest -q'", "exit": 5}]
    assert out.tokens == {"input": 24763, "cached_input": 24448, "output": 122}
    assert out.summary == "Added hello.txt with a greeting.\nCommitted as 'Add hello'.\nSTATUS: done"
    assert out.outcome == "done"
    assert out.cost_usd is None  # codex reports no dollars: the worker charges the reservation
    assert out.error_kind is None

    types = [e["type"] for e in emitted]
    assert {"session", "text", "reasoning", "tool", "command", "usage", "log"} <= set(types)
    assert {"type": "command", "command": "bash -lc ls", "exit": 0, "status": "completed",
            "output": "README.md\n"} in emitted
    assert {"type": "log", "stream": "stdout", "text": "WARNING: not json, just a banner"} in emitted
    from subtask.words import (
        activity_text as _activity_text,  # what `status` and MCP progress show
    )

    tools = [_activity_text(e) for e in emitted if e["type"] == "tool"]
    assert tools and all(t and "None" not in t for t in tools), tools


def test_argv_runs_exec_json_in_a_writable_sandbox(repo):
    ctx, _ = make_ctx(repo, RECORDED, model="gpt-5-codex")
    CodexEngine().run(ctx)
    (call,) = calls(repo)
    argv = call["argv"]

    assert argv[:2] == ["exec", "--json"]
    assert argv[argv.index("--sandbox") + 1] == "workspace-write"
    add_dirs = [argv[i + 1] for i, a in enumerate(argv) if a == "--add-dir"]
    assert str(repo["common"]) in add_dirs
    # the linked worktree's own admin dir (index, HEAD) is named too
    assert str(repo["common"] / "worktrees" / "job1") in add_dirs
    assert argv[argv.index("-C") + 1] == str(repo["worktree"])
    assert "--skip-git-repo-check" in argv
    assert argv[argv.index("-m") + 1] == "gpt-5-codex"
    assert "resume" not in argv
    prompt = prompt_of(call)
    assert prompt.startswith("Add hello.txt")
    assert "STATUS: done" in prompt and "commit" in prompt.lower()
    assert Path(call["cwd"]).resolve() == repo["worktree"].resolve()


def test_the_admin_dir_added_is_the_jobs_never_what_its_dot_git_names(repo):
    """The worktree's `.git` is the job's to write: read from it, a reply's sandbox took in any
    folder the job named there."""
    elsewhere = repo["tmp"] / "elsewhere"
    elsewhere.mkdir()
    (repo["worktree"] / ".git").write_text(f"gitdir: {elsewhere}\n")
    ctx, _ = make_ctx(repo, RECORDED)
    CodexEngine().run(ctx)
    argv = calls(repo)[0]["argv"]
    add_dirs = [argv[i + 1] for i, a in enumerate(argv) if a == "--add-dir"]
    assert str(elsewhere) not in add_dirs and str(repo["common"] / "worktrees" / "job1") in add_dirs, add_dirs


def test_reply_resumes_the_session(repo):
    ctx, _ = make_ctx(repo, RECORDED, session_id=SESSION, task="-now add tests")
    out = CodexEngine().run(ctx)
    argv = calls(repo)[0]["argv"]

    assert out.ok and out.session_id == SESSION
    assert argv[:2] == ["exec", "--json"]
    at = argv.index("resume")
    assert argv[at + 1] == SESSION
    assert argv[at + 2] == "--"  # a message starting with '-' stays a prompt
    assert prompt_of(calls(repo)[0]).startswith("-now add tests")
    # sandbox and working dir are root options, given before the subcommand
    assert argv.index("--sandbox") < at and argv.index("-C") < at


def test_readonly_job_uses_a_read_only_sandbox(repo):
    ctx, _ = make_ctx(repo, RECORDED, readonly=True)
    CodexEngine().run(ctx)
    argv = calls(repo)[0]["argv"]
    assert argv[argv.index("--sandbox") + 1] == "read-only"
    assert "--add-dir" not in argv


def test_usage_limit_turn_failure(repo):
    ctx, _ = make_ctx(repo, USAGE_LIMIT, exit_code=1)
    out = CodexEngine().run(ctx)
    assert not out.ok
    assert out.error_kind == "usage_limit"
    assert "usage limit" in out.error
    assert out.session_id == SESSION
    assert out.hint and "usage limit" in out.hint


def test_auth_error_event(repo):
    ctx, _ = make_ctx(repo, AUTH, exit_code=1)
    out = CodexEngine().run(ctx)
    assert not out.ok
    assert out.error_kind == "auth"
    assert "401" in out.error


def test_nonzero_exit_without_failure_event(repo):
    ctx, _ = make_ctx(repo, RECORDED[:2], exit_code=3)
    out = CodexEngine().run(ctx)
    assert not out.ok
    assert out.error_kind == "exit"
    assert out.exit_code == 3
    assert "starting" in out.error  # the stderr tail explains the exit


def test_fake_codex_can_commit_in_the_worktree(repo):
    ctx, _ = make_ctx(repo, RECORDED, mode="commit")
    out = CodexEngine().run(ctx)
    assert out.ok, out.error
    log = repo["git"]("log", "--format=%s", "main..subtask/job1")
    assert log.strip() == "Add hello"
    assert (repo["worktree"] / "hello.txt").read_text() == "hello\n"


def test_timeout(repo):
    ctx, _ = make_ctx(repo, RECORDED, mode="sleep", timeout=1.0)
    started = time.monotonic()
    out = CodexEngine().run(ctx)
    assert time.monotonic() - started < 20
    assert not out.ok
    assert out.error_kind == "timeout"


def test_missing_binary_is_an_outcome_not_an_exception(repo):
    ctx, _ = make_ctx(repo, RECORDED)
    ctx.env["SUBTASK_CODEX_BIN"] = str(repo["tmp"] / "nowhere" / "codex")
    out = CodexEngine().run(ctx)
    assert not out.ok
    assert out.error_kind == "not_installed"
    assert "codex not found" in out.error


def test_binary_from_git_config(repo):
    ctx, _ = make_ctx(repo, RECORDED, config={"engine.codex.path": str(repo["tmp"] / "bin" / "codex")})
    ctx.env["PATH"] = "/nonexistent"
    assert CodexEngine().run(ctx).ok


def test_configured_prices_give_a_cost(repo):
    prices = {"engine.codex.costPerMTokIn": "1.25", "engine.codex.costPerMTokOut": "10"}
    ctx, _ = make_ctx(repo, RECORDED, config=prices)
    out = CodexEngine().run(ctx)
    assert out.cost_usd == Decimal("0.032174")  # $0.03217375, to the micro-dollar


def test_cached_input_tokens_are_billed_at_their_own_price(repo):
    """24,448 of the run's 24,763 input tokens came from the cache: they cost the cached price,
    the other 315 the input price. At the full input price the run would cost $0.032174."""
    prices = {"engine.codex.costPerMTokIn": "1.25", "engine.codex.costPerMTokCachedIn": "0.125",
              "engine.codex.costPerMTokOut": "10"}
    ctx, _ = make_ctx(repo, RECORDED, config=prices)
    out = CodexEngine().run(ctx)
    # (315 x 1.25 + 24,448 x 0.125 + 122 x 10) / 1e6 = $0.00466975, to the micro-dollar
    assert out.cost_usd == Decimal("0.00467")


def test_probe(repo, monkeypatch):
    monkeypatch.setenv("PATH", repo["env"]["PATH"])
    monkeypatch.delenv("SUBTASK_CODEX_BIN", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("CODEX_API_KEY", raising=False)
    monkeypatch.setenv("CODEX_HOME", str(repo["tmp"] / "codex-home"))
    probe = CodexEngine().probe()
    assert probe.installed and probe.version == "codex-cli 0.99.0"
    assert probe.authenticated is False and not probe.usable
    assert probe.paid and "workspace-write" in probe.isolation

    (repo["tmp"] / "codex-home").mkdir()
    (repo["tmp"] / "codex-home" / "auth.json").write_text("{}")
    assert CodexEngine().probe().authenticated is True

    monkeypatch.setenv("PATH", "/nonexistent")
    assert not CodexEngine().probe().installed


RECORDED_DIR = Path(__file__).parent / "recorded"


def recorded(name: str) -> list[dict[str, Any]]:
    """Events the real codex printed (0.171, against tests/fake_codex.py's Responses API)."""
    return [json.loads(line) for line in (RECORDED_DIR / name).read_text().splitlines() if line.strip()]


def test_recorded_real_run_and_resume_give_each_attempt_its_own_tokens(repo):
    """codex 0.171's `exec resume` reports the thread's running usage (3600 in after the first
    run's 3 calls, 6000 after the resume's 2 more): the resume's own share is the difference."""
    prices = {"engine.codex.costPerMTokIn": "2", "engine.codex.costPerMTokOut": "8"}
    first_events = recorded("codex-0.171-exec.jsonl")
    ctx, emitted = make_ctx(repo, first_events, config=prices)
    first = CodexEngine().run(ctx)
    assert first.ok, first.error
    session = first_events[0]["thread_id"]
    assert first.session_id == session
    assert first.tokens == {"input": 3600, "cached_input": 0, "output": 240}
    assert first.cost_usd == Decimal(3600 * 2 + 240 * 8) / 1_000_000
    assert first.totals == {"session_id": session, "cost_usd": None, "tokens": first.tokens}
    assert first.commands == [{"command": "/bin/bash -lc 'echo hello > hello.txt && ls'", "exit": 0},
                              {"command": "/bin/bash -lc 'cat missing.txt'", "exit": 1}]
    assert {"type": "command", "command": "/bin/bash -lc 'cat missing.txt'", "exit": 1, "status": "failed",
            "output": "cat: missing.txt: No such file or directory\n"} in emitted
    assert any(e["type"] == "warning" and "Model metadata" in e["text"] for e in emitted)  # an error item: not fatal
    assert first.billed is True and not first.since_baseline

    ctx, _ = make_ctx(repo, recorded("codex-0.171-exec-resume.jsonl"), config=prices, session_id=session,
                      baseline=Baseline.from_totals(first.totals))
    second = CodexEngine().run(ctx)
    assert second.ok, second.error
    assert second.tokens == {"input": 2400, "cached_input": 0, "output": 160}
    assert second.cost_usd == Decimal(2400 * 2 + 160 * 8) / 1_000_000
    assert second.since_baseline
    assert second.totals["tokens"] == {"input": 6000, "cached_input": 0, "output": 400}


def test_a_usage_below_the_baseline_is_the_attempts_own(repo):
    """A figure smaller than the last one recorded cannot be a running total (a fresh thread, or a
    codex that reports per run): it is taken whole, never as a negative share."""
    ctx, _ = make_ctx(repo, recorded("codex-0.171-exec-resume.jsonl"), session_id="s",
                      baseline=Baseline("s", tokens={"input": 9000, "cached_input": 0, "output": 900}))
    out = CodexEngine().run(ctx)
    assert out.tokens == {"input": 6000, "cached_input": 0, "output": 400} and not out.since_baseline


def test_reconnecting_is_a_retry_and_an_unreachable_api_never_billed(repo):
    """The real codex retries an unreachable API with `error` events "Reconnecting...": they are
    retries (no progress for the stall rule), not failures; ended there, nothing was answered."""
    events = recorded("codex-0.171-unreachable.jsonl")
    # Ended by its time limit (however far a loaded machine let it get): nothing answered, never billed.
    ctx, emitted = make_ctx(repo, events, mode="events_then_sleep", timeout=1.0)
    out = CodexEngine().run(ctx)
    assert not [e for e in emitted if e["type"] == "error"]
    assert out.error_kind == "timeout" and out.billed is False and out.tokens is None

    # Every event replayed, then its exit: each "Reconnecting" a retry.
    ctx, emitted = make_ctx(repo, events, exit_code=1)
    out = CodexEngine().run(ctx)
    assert [e["type"] for e in emitted].count("retry") == 2
    assert out.error_kind == "api_error" and "Reconnecting" in out.error and out.billed is False


def _codex_home_with(repo, config: str) -> dict[str, str]:
    home = repo["tmp"] / "codex-config-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(config)
    return {"CODEX_HOME": str(home), "PATH": repo["env"]["PATH"]}


PROVIDER = """model_provider = "mine"
[model_providers.mine]
name = "mine"
base_url = "http://127.0.0.1:9/v1"
env_key = "MY_PROVIDER_KEY"
"""


def test_a_custom_model_providers_key_is_credentials(repo, monkeypatch):
    """codex's own config.toml names the provider and the variable its key is in: set, codex can
    run (and `start` lets it); unset, the refusal names that variable."""
    for var in ("OPENAI_API_KEY", "CODEX_API_KEY", "SUBTASK_CODEX_BIN", "MY_PROVIDER_KEY"):
        monkeypatch.delenv(var, raising=False)
    for key, value in _codex_home_with(repo, PROVIDER).items():
        monkeypatch.setenv(key, value)
    refusal = CodexEngine().preflight()
    assert refusal and "MY_PROVIDER_KEY" in refusal
    assert CodexEngine().probe().authenticated is False
    monkeypatch.setenv("MY_PROVIDER_KEY", "sk-mine")
    assert CodexEngine().preflight() is None
    assert CodexEngine().probe().authenticated is True
    # a provider that names no key (a local server) needs none; a broken config reads as none
    _codex_home_with(repo, PROVIDER.replace('env_key = "MY_PROVIDER_KEY"\n', ""))
    monkeypatch.delenv("MY_PROVIDER_KEY")
    assert CodexEngine().preflight() is None
    _codex_home_with(repo, "model_provider = [")
    assert CodexEngine().preflight() is not None
    _codex_home_with(repo, 'model_provider = "ollama"\n')  # a built-in local provider: no key
    assert CodexEngine().preflight() is None
    _codex_home_with(repo, 'model_provider = "nowhere"\n')
    assert CodexEngine().preflight() is not None


@pytest.mark.parametrize("message, kind", [
    ("You've hit your usage limit. Try again in 3 days.", "usage_limit"),
    ("exceeded retry limit, last status: 429 Too Many Requests", "usage_limit"),
    ("Rate limit reached for gpt-5 in organization", "usage_limit"),
    ("unexpected status 401 Unauthorized", "auth"),
    ("Not logged in. Please run codex login", "auth"),
    ("stream disconnected before completion: internal server error", "api_error"),
])
def test_classify_error(message, kind):
    assert classify_error(message) == kind


def test_fake_codex_commits_under_worktree_isolation_with_its_home_writable(repo):
    """On request (`--isolation worktree`) codex runs confined: its home stays writable, its
    commit lands, and a write outside is refused. (Its default stays `none`: its own sandbox.)"""
    from subtask.proc import isolation

    if not isolation.support().available:
        pytest.skip(f"no usable Landlock here: {isolation.support().reason}")
    codex_home = repo["tmp"] / "home" / ".codex"
    codex_home.mkdir()
    # codex's own sandbox cannot start inside ours: only with it off does ours confine codex
    ctx, _ = make_ctx(repo, RECORDED, mode="commit", config={"engine.codex.sandbox": "danger-full-access"})
    ctx.env["FAKE_CODEX_LOG"] = str(codex_home / "argv.jsonl")  # it writes only where it may
    ctx.env[isolation.ACTIVE_ENV] = "worktree"  # as the worker sets it
    tmpdir = repo["tmp"] / "job-tmp"
    tmpdir.mkdir()
    policy = isolation.build_policy("worktree", worktree=repo["worktree"], admin=repo["common"] / "worktrees" / "job1",
                                    common_dir=repo["common"],
                                    has_branch=True, tmpdir=str(tmpdir), extra=[],
                                    engine_extra=isolation.engine_paths(CodexEngine(), ctx.env))
    assert str(codex_home) in [g.path for g in policy.grants]
    ruleset = isolation.Sandbox(policy)
    try:
        with isolation.confined(ruleset):
            out = CodexEngine().run(ctx)
            outside = subprocess.run(["touch", str(repo["root"] / "outside.txt")], capture_output=True,
                                     preexec_fn=isolation.child_hook())
    finally:
        ruleset.close()
    assert out.ok, out.error
    assert repo["git"]("log", "--format=%s", "main..subtask/job1").strip() == "Add hello"
    assert (codex_home / "argv.jsonl").exists()
    assert outside.returncode != 0 and not (repo["root"] / "outside.txt").exists()


def test_under_git_subtasks_isolation_codexs_own_sandbox_is_refused_not_run(repo):
    """bubblewrap cannot set up its uid map inside Landlock (measured: every command failed and
    the job still ended done): a run under our isolation with codex's sandbox on never starts."""
    from subtask.proc import isolation

    ctx, _ = make_ctx(repo, RECORDED)
    ctx.env[isolation.ACTIVE_ENV] = "worktree"
    out = CodexEngine().run(ctx)
    assert not out.ok and out.error_kind == "isolation" and not out.launched
    assert "bubblewrap" in out.error and "danger-full-access" in out.hint
    assert calls(repo) == []


def test_with_its_own_sandbox_off_codex_runs_in_ours_even_read_only(repo):
    from subtask.proc import isolation

    ctx, _ = make_ctx(repo, RECORDED, readonly=True, config={"engine.codex.sandbox": "danger-full-access"})
    ctx.env[isolation.ACTIVE_ENV] = "readonly"
    assert CodexEngine().run(ctx).ok
    argv = calls(repo)[0]["argv"]
    assert "--dangerously-bypass-approvals-and-sandbox" in argv and "--sandbox" not in argv
