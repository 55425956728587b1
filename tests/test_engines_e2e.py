"""Engines through the whole tool: start -> worker -> record, ledger, note; registry; read-only jobs."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from conftest import git, refs
from fake_claude import (
    FAKE_SESSION,
    FakeMessagesAPI,
    cli_options,
    read_record,
    text_turn,
    tool_turn,
    write_fake_cli,
)
from fake_codex import FAKE_KEY_VAR, FakeResponsesAPI, codex_env, real_codex
from fake_codex import command_turn as codex_command
from fake_codex import text_turn as codex_text
from test_engine_claude import offline_env

from subtask.engines.claude import _bundled_cli

FAKE_AGENT = """import subprocess, sys
task = sys.argv[1]
open("agent.txt", "w").write(task + "\\n")
subprocess.run(["git", "add", "agent.txt"], check=True)
subprocess.run(["git", "commit", "-q", "-m", "Agent: " + task[:40]], check=True)
print("did: " + task)
if "{cost}":
    print("cost: ${cost}")
print("STATUS: done")
"""


# `start` refuses an engine with no credentials (preflight); the fake CLI never uses them.
FAKE_CREDENTIALS = {"ANTHROPIC_API_KEY": "sk-ant-test-fake"}


def paid_command_engine(repo: Path, name: str = "fakepaid", cost: str = "0.42") -> None:
    script = repo.parent / f"{name}.py"
    script.write_text(FAKE_AGENT.replace("{cost}", cost))
    git(repo, "config", f"subtask.engine.{name}.command", json.dumps([sys.executable, str(script), "{task}"]))
    git(repo, "config", f"subtask.engine.{name}.paid", "true")
    git(repo, "config", f"subtask.engine.{name}.costPattern", r"cost: \$([0-9.]+)")


def test_engines_lists_every_engine_without_spending(cli, repo):
    paid_command_engine(repo)
    data = cli.json("engines")
    by_name = {e["name"]: e for e in data["engines"]}
    assert {"shell", "claude", "codex", "command", "fakepaid"} <= set(by_name)
    assert by_name["shell"]["paid"] is False and by_name["shell"]["usable"] is True
    assert by_name["claude"]["paid"] is True
    assert by_name["claude"]["authenticated"] is False  # no key in the test environment
    assert by_name["fakepaid"]["paid"] is True
    text = cli.ok("engines")
    assert "isolation:" in text


def test_no_default_engine_is_a_clear_error_listing_usable_engines(cli, repo):
    git(repo, "config", "--unset", "subtask.engine")
    proc = cli("start", "true")
    assert proc.returncode == 129
    assert "usable engines: shell" in proc.stderr
    assert "--engine shell" in proc.stderr
    assert refs(repo, "refs/subtask") == []


def test_paid_engine_reserves_then_charges_the_observed_cost(cli, repo):
    paid_command_engine(repo)
    job = cli.start("write the agent file", "--engine", "fakepaid", "--max-usd", "3")
    cli.ok("wait", job)
    attempt = cli.json("show", job)["state_detail"]["attempts"][0]
    assert attempt["cost"] == {"v": 1, "reserved": 3.0, "observed": 0.42, "charged": 0.42, "billing": "observed",
                               "credit": None}
    spend = cli.json("spend")
    assert spend["committed_usd"] == pytest.approx(0.42) and spend["open_usd"] == 0
    assert spend["per_engine"]["fakepaid"]["committed"] == pytest.approx(0.42)
    assert "$0.42" in cli.ok("list")
    note = git(repo, "log", "--notes=subtask", "-1", f"subtask/{job}")
    assert "$0.42 observed" in note
    assert git(repo, "log", "-1", "--format=%s", f"subtask/{job}") == "Agent: write the agent file"


def test_unknown_cost_charges_the_whole_reservation(cli, repo):
    paid_command_engine(repo, "nocost", cost="")
    job = cli.start("work", "--engine", "nocost", "--max-usd", "1.5")
    cli.ok("wait", job)
    cost = cli.json("show", job)["state_detail"]["attempts"][0]["cost"]
    assert cost["charged"] == 1.5 and cost["billing"] == "charged"
    assert cli.json("spend")["committed_usd"] == pytest.approx(1.5)
    assert "charged (cost unknown" in git(repo, "log", "--notes=subtask", "-1", f"subtask/{job}")


def test_monthly_cap_refuses_a_start_and_changes_nothing(cli, repo):
    paid_command_engine(repo)
    git(repo, "config", "subtask.monthlyCapUsd", "5")
    first = cli.start("one", "--engine", "fakepaid", "--max-usd", "4")

    def others():  # the first job may finish meanwhile and add its own head pin and note
        return [r for r in refs(repo) if first not in r and not r.startswith("refs/notes/")]

    before = others()
    proc = cli("start", "two", "--engine", "fakepaid", "--max-usd", "4.7")  # over the cap whether or not one has ended
    assert proc.returncode == 1
    assert "monthly cap" in proc.stderr and "git subtask spend" in proc.stderr
    assert others() == before
    proc = cli("start", "three", "--engine", "fakepaid", "--max-usd", "25")
    assert proc.returncode == 129 and "subtask.maxJobUsd" in proc.stderr
    cli.ok("wait", first)


def test_claude_job_through_the_sdk_records_cost_session_and_resumes_on_reply(cli, repo, tmp_path):
    fake = write_fake_cli(tmp_path / "claude-cli", "success")
    env = {"SUBTASK_CLAUDE_CLI": str(fake), **FAKE_CREDENTIALS}
    job = cli.start("check the tree", "--engine", "claude", "--max-usd", "1", env=env)
    cli.ok("wait", job, env=env)
    shown = cli.json("show", job)
    attempt = shown["state_detail"]["attempts"][0]
    assert attempt["session_id"] == FAKE_SESSION
    assert attempt["outcome"] == "done"
    assert attempt["cost"]["observed"] == pytest.approx(0.0123) and attempt["cost"]["billing"] == "observed"
    seen = [c["command"] for c in shown["evidence"]["commands"]["seen"]]
    assert seen == ["git status", "make test"]
    assert cli.json("spend")["committed_usd"] == pytest.approx(0.0123)
    options = cli_options(read_record(fake)["argv"])
    assert float(options["--max-budget-usd"]) == 1.0 and options["--permission-mode"] == "acceptEdits"
    cli.ok("reply", job, "now fix it", env=env)
    cli.ok("wait", job, env=env)
    assert cli_options(read_record(fake)["argv"])["--resume"] == FAKE_SESSION
    assert [a["n"] for a in cli.json("show", job)["state_detail"]["attempts"]] == [1, 2]


def test_claude_error_result_becomes_an_error_kind_with_a_real_hint(cli, repo, tmp_path):
    fake = write_fake_cli(tmp_path / "claude-cli", "budget")
    env = {"SUBTASK_CLAUDE_CLI": str(fake), **FAKE_CREDENTIALS}
    job = cli.start("spend it all", "--engine", "claude", "--max-usd", "0.5", env=env)
    assert cli("wait", job).returncode == 1
    attempt = cli.json("show", job)["state_detail"]["attempts"][0]
    assert attempt["state"] == "failed" and attempt["error_kind"] == "budget"
    assert "git subtask reply" in attempt["hint"]
    assert attempt["cost"]["charged"] == pytest.approx(0.5)  # 0.51 observed, capped at the reservation


@pytest.mark.slow
def test_real_claude_code_cli_does_a_job_end_to_end(cli, repo, tmp_path, monkeypatch):
    if _bundled_cli() is None:
        pytest.skip("this claude-agent-sdk wheel bundles no CLI")
    worktree_of = {}

    def write_turn(body):
        return tool_turn("Write", {"file_path": str(worktree_of["path"] / "hello.txt"), "content": "hello\n"})

    turns = [
        write_turn,
        tool_turn("Bash", {"command": 'git add hello.txt && git commit -m "Add hello"', "description": "commit"}),
        text_turn("Wrote hello.txt and committed it.\nSTATUS: done"),
    ]
    with FakeMessagesAPI(turns) as api:
        env = offline_env(tmp_path, api.url)
        env.pop("SUBTASK_CLAUDE_CLI", None)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        out = cli.ok("start", "--engine", "claude", "--max-usd", "1", "--timeout", "120",
                     "write hello.txt and commit it", env=env)
        job = out.split()[0]
        worktree_of["path"] = repo / ".subtask" / "worktrees" / job
        cli.ok("wait", job, env=env, timeout=180)
    shown = cli.json("show", job)
    assert shown["state"] == "done"
    assert git(repo, "log", "-1", "--format=%s", f"subtask/{job}") == "Add hello"
    assert git(repo, "show", f"subtask/{job}:hello.txt") == "hello"
    attempt = shown["state_detail"]["attempts"][0]
    assert attempt["cost"]["billing"] == "observed" and attempt["cost"]["observed"] >= 0
    assert "Wrote hello.txt" in git(repo, "log", "--notes=subtask", "-1", f"subtask/{job}")


@pytest.mark.slow
@pytest.mark.parametrize("config", ["CLAUDE_CONFIG_DIR", "HOME"])
def test_real_claude_code_cli_works_confined_on_request(cli, repo, tmp_path, monkeypatch, config):
    """`--isolation worktree` with the real bundled CLI against the fake Messages API: it
    authenticates (its credentials and config are in its view, in `$CLAUDE_CONFIG_DIR` or in
    `~/.claude` and `~/.claude.json`), writes and commits in its worktree; a Bash write outside
    lands in its private /tmp, not on the host; the record says worktree."""
    from subtask.proc import isolation

    if _bundled_cli() is None:
        pytest.skip("this claude-agent-sdk wheel bundles no CLI")
    if not isolation.support().available:
        pytest.skip(f"no usable Landlock here: {isolation.support().reason}")
    outside = tmp_path / "outside.txt"
    worktree_of = {}

    def write_turn(body):
        return tool_turn("Write", {"file_path": str(worktree_of["path"] / "hello.txt"), "content": "hello\n"})

    turns = [
        write_turn,
        tool_turn("Bash", {"command": f"echo x > '{outside}'", "description": "write outside"}),
        tool_turn("Bash", {"command": 'git add hello.txt && git commit -m "Add hello"', "description": "commit"}),
        text_turn("Wrote hello.txt and committed it.\nSTATUS: done"),
    ]
    with FakeMessagesAPI(turns) as api:
        env = offline_env(tmp_path, api.url)
        env.pop("SUBTASK_CLAUDE_CLI", None)
        if config == "HOME":
            env.pop("CLAUDE_CONFIG_DIR")
            (Path(env["HOME"]) / ".claude.json").write_text("{}")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        out = cli.ok("start", "--engine", "claude", "--isolation", "worktree", "--max-usd", "1",
                     "--timeout", "120", "write hello.txt and commit it", env=env)
        job = out.split()[0]
        worktree_of["path"] = repo / ".subtask" / "worktrees" / job
        cli.ok("wait", job, env=env, timeout=180)
    shown = cli.json("show", job)
    assert shown["state"] == "done", shown["state_detail"]
    assert git(repo, "log", "-1", "--format=%s", f"subtask/{job}") == "Add hello"
    assert not outside.exists()
    assert shown["evidence"]["isolation"]["mode"] == "worktree"
    writable = [g["path"] for g in shown["evidence"]["isolation"]["writable"]]
    if config == "HOME":
        assert str(tmp_path / "home" / ".claude") in writable and str(tmp_path / "home" / ".claude.json") in writable
        assert (tmp_path / "home" / ".claude.json").read_text() != "{}"  # it kept its state there
    else:
        assert str(tmp_path / "claude-config") in writable
    commands = {c["command"]: c["exit"] for c in shown["evidence"]["commands"]["seen"]}
    assert commands[f"echo x > '{outside}'"] == 0  # into its private /tmp, gone with it


def test_readonly_job_has_no_branch_and_leaves_no_worktree(cli, repo):
    job = cli.start("ls > listing.txt; echo looked", "--readonly")
    cli.ok("wait", job)
    assert f"refs/heads/subtask/{job}" not in refs(repo)
    assert f"refs/subtask/{job}/record" in refs(repo)
    assert not (repo / ".subtask" / "worktrees" / job).exists()
    assert "(read-only" in cli.ok("show", job)
    note = git(repo, "notes", "--ref=subtask", "show", "HEAD")
    assert f"subtask {job} · done" in note and "looked" in note
    assert git(repo, "worktree", "list").count("\n") == 0


def test_a_background_process_holding_stdout_does_not_hang_the_job(cli):
    job = cli.start("sleep 60 & echo started")
    t0 = time.monotonic()
    cli.ok("wait", job, timeout=30)
    assert time.monotonic() - t0 < 20


def test_a_megabyte_on_stderr_does_not_deadlock(cli):
    job = cli.start("head -c 1048576 /dev/zero | tr '\\\\0' x >&2; echo fine")
    assert "done" in cli.ok("wait", job, timeout=60)
    assert "fine" in cli.ok("result", job)


def _money_agrees(cli, repo, job: str, total: float) -> None:
    """`spend`, `list`, the `show` header and the note say the same job total, to the cent."""
    from subtask.words import money

    assert cli.json("spend")["committed_usd"] == pytest.approx(total)
    listed = {e["id"]: e for e in cli.json("list")["jobs"]}
    assert listed[job]["cost"] == pytest.approx(total)
    assert f" {money(total)} " in next(line for line in cli.ok("list").splitlines() if line.startswith(job))
    assert f"· {money(total)} ·" in cli.ok("show", job).splitlines()[0]
    note = git(repo, "notes", "--ref=subtask", "show", f"subtask/{job}")
    assert f"· {money(total)} ·" in note.splitlines()[0]


@pytest.mark.slow
def test_real_claude_code_cli_replies_are_each_charged_their_own_turns(cli, repo, tmp_path, monkeypatch):
    """Claude Code reports a resumed session's cost as the session's running total: each reply
    is charged only what its own model calls cost, and every face shows the job's sum."""
    if _bundled_cli() is None:
        pytest.skip("this claude-agent-sdk wheel bundles no CLI")

    def bash(command):
        return tool_turn("Bash", {"command": command, "description": "run"})

    turns = [  # the fake API answers by the number of assistant turns in the history
        bash("echo one > one.txt && git add one.txt && git commit -qm one"), text_turn("One.\nSTATUS: done"),
        bash("echo two > two.txt"), bash("git add two.txt && git commit -qm two"), text_turn("Two.\nSTATUS: done"),
        text_turn("Nothing left.\nSTATUS: done"),
    ]
    calls = []
    with FakeMessagesAPI(turns, usage=(10_000, 1_000)) as api:  # cents a call, so rounding shows
        env = offline_env(tmp_path, api.url)
        env.pop("SUBTASK_CLAUDE_CLI", None)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        job = cli.ok("start", "--engine", "claude", "--max-usd", "2", "--timeout", "120",
                     "write one.txt and commit it", env=env).split()[0]
        cli.ok("wait", job, env=env, timeout=180)
        calls.append(len(api.main_requests()))
        for message in ("now two.txt", "anything else?"):
            cli.ok("reply", job, message, env=env)
            cli.ok("wait", job, env=env, timeout=180)
            calls.append(len(api.main_requests()))
    per_attempt_calls = [calls[0], calls[1] - calls[0], calls[2] - calls[1]]
    assert per_attempt_calls == [2, 3, 1]
    attempts = cli.json("show", job)["state_detail"]["attempts"]
    assert [a["state"] for a in attempts] == ["done", "done", "done"]
    assert len({a["session_id"] for a in attempts}) == 1  # one session, resumed twice
    per_call = attempts[0]["cost"]["charged"] / 2
    assert per_call > 0.01
    charged = [a["cost"]["charged"] for a in attempts]
    assert charged == [pytest.approx(n * per_call) for n in per_attempt_calls]
    assert [a["cost"]["billing"] for a in attempts] == ["observed"] * 3
    # what Claude Code reported, the session's running total, is kept for the next reply's share
    assert attempts[2]["totals"]["cost_usd"] == pytest.approx(6 * per_call)
    _money_agrees(cli, repo, job, sum(charged))


def _real_codex_env(repo: Path, tmp_path: Path, url: str) -> dict[str, str]:
    """The real codex for the worker (named in git config: the suite's guard comes first on PATH),
    reaching only the fake Responses API through a custom provider in its config.toml."""
    binary = real_codex()
    if binary is None:
        pytest.skip("the codex CLI is not installed here (npm install -g @openai/codex)")
    git(repo, "config", "subtask.engine.codex.path", binary)
    return codex_env(tmp_path / "codex-user", url)


@pytest.mark.slow
def test_real_codex_replies_are_each_charged_their_own_tokens(cli, repo, tmp_path):
    """Codex reports the thread's running usage on `exec resume`: each reply is charged its own
    calls' tokens at the configured prices, and every face shows the job's sum. Its custom
    model provider's key (config.toml `env_key`) passes the credentials check."""
    git(repo, "config", "subtask.engine.codex.costPerMTokIn", "2")
    git(repo, "config", "subtask.engine.codex.costPerMTokOut", "8")
    turns = [codex_command("echo one > one.txt && git add one.txt && git commit -qm one"),
             codex_text("One.\nSTATUS: done"),
             codex_command("echo two > two.txt"), codex_command("git add two.txt && git commit -qm two"),
             codex_text("Two.\nSTATUS: done"),
             codex_text("Nothing left.\nSTATUS: done")]
    calls = []
    with FakeResponsesAPI(turns, usage=(100_000, 5_000)) as api:
        env = _real_codex_env(repo, tmp_path, api.url)
        job = cli.start("write one.txt and commit it", "--engine", "codex", "--max-usd", "5", "--timeout", "100",
                        env=env)
        cli.ok("wait", job, env=env, timeout=120)
        calls.append(len(api.requests))
        for message in ("now two.txt", "anything else?"):
            cli.ok("reply", job, message, env=env)
            cli.ok("wait", job, env=env, timeout=120)
            calls.append(len(api.requests))
    per_attempt_calls = [calls[0], calls[1] - calls[0], calls[2] - calls[1]]
    assert per_attempt_calls == [2, 3, 1]
    attempts = cli.json("show", job)["state_detail"]["attempts"]
    assert [a["state"] for a in attempts] == ["done"] * 3, attempts[-1]
    per_call = (100_000 * 2 + 5_000 * 8) / 1e6  # $0.24
    assert [a["cost"]["charged"] for a in attempts] == [pytest.approx(n * per_call) for n in per_attempt_calls]
    assert [a["tokens"]["input"] for a in attempts] == [n * 100_000 for n in per_attempt_calls]
    assert attempts[2]["totals"]["tokens"]["input"] == 6 * 100_000  # the thread's, as codex said it
    assert git(repo, "log", "--format=%s", f"main..subtask/{job}").split() == ["two", "one"]
    _money_agrees(cli, repo, job, 6 * per_call)


@pytest.mark.slow
def test_real_codex_runs_confined_in_git_subtasks_sandbox(cli, repo, tmp_path):
    """With its own sandbox off (`subtask.engine.codex.sandbox danger-full-access`, the user's
    choice), the real codex runs in git-subtask's view against the fake Responses API: it
    authenticates with its provider's key, which is given to codex alone (verify, run with the
    job's environment, finds none), and runs a command that commits in its worktree."""
    _landlock_or_skip()
    git(repo, "config", "subtask.engine.codex.sandbox", "danger-full-access")
    turns = [codex_command("echo one > one.txt && git add one.txt && git commit -qm one"),
             codex_text("One.\nSTATUS: done")]
    with FakeResponsesAPI(turns) as api:
        env = _real_codex_env(repo, tmp_path, api.url)
        job = cli.start("write one.txt and commit it", "--engine", "codex", "--isolation", "worktree",
                        "--max-usd", "5", "--timeout", "100", "--verify", f'test -z "${{{FAKE_KEY_VAR}:-}}"', env=env)
        cli.ok("wait", job, env=env, timeout=120)
    shown = cli.json("show", job)
    assert shown["state"] == "done", shown["state_detail"]["attempts"][-1]
    assert git(repo, "log", "-1", "--format=%s", f"subtask/{job}") == "one"
    iso = shown["evidence"]["isolation"]
    assert iso["mode"] == "worktree" and iso["view"] == "allowlist" and FAKE_KEY_VAR in iso["env_withheld"]


def _landlock_or_skip():
    from subtask.proc import isolation

    if not isolation.support().available:
        pytest.skip(f"no usable Landlock here: {isolation.support().reason}")


def test_codex_under_isolation_is_refused_at_start_with_the_reason(cli, repo):
    """codex's own sandbox (bubblewrap) cannot start inside git-subtask's: `--isolation worktree`
    with codex's sandbox on is refused, never downgraded, and leaves nothing behind."""
    _landlock_or_skip()
    env = {"OPENAI_API_KEY": "sk-test-fake"}  # the suite's guard codex is on PATH
    for how in (["--isolation", "worktree"], ["--readonly", "--isolation", "readonly"]):
        proc = cli("start", "--engine", "codex", *how, "x", env=env)
        assert proc.returncode == 128, proc.stderr
        assert "bubblewrap" in proc.stderr and "danger-full-access" in proc.stderr
    git(repo, "config", "subtask.isolation", "worktree")
    assert cli("start", "--engine", "codex", "x", env=env).returncode == 128
    assert refs(repo, "refs/subtask") == [] and refs(repo, "refs/heads/subtask") == []


def test_refusals_printed_inside_codex_commands_are_in_the_evidence(cli, repo, tmp_path):
    """With its own sandbox off, codex runs in git-subtask's: a write it refused shows in the
    output of codex's command (`aggregated_output`), and lands in evidence.isolation.refused."""
    from test_engine_codex import FAKE_CODEX

    _landlock_or_skip()
    fake = tmp_path / "bin" / "codex"
    fake.parent.mkdir()
    fake.write_text(FAKE_CODEX.format(python=sys.executable))
    fake.chmod(0o755)
    logs = tmp_path / "codex-logs"
    logs.mkdir()
    git(repo, "config", "subtask.engine.codex.path", str(fake))
    git(repo, "config", "subtask.engine.codex.sandbox", "danger-full-access")
    git(repo, "config", "--add", "subtask.isolation.writable", str(logs))
    refused = "touch: cannot touch '/etc/x': Permission denied"
    events = [{"type": "thread.started", "thread_id": "t1"},
              {"type": "item.completed", "item": {"id": "i1", "type": "command_execution", "command": "touch /etc/x",
                                                  "aggregated_output": refused + "\n", "exit_code": 1,
                                                  "status": "failed"}},
              {"type": "item.completed", "item": {"id": "i2", "type": "agent_message", "text": "No.\nSTATUS: blocked"}},
              {"type": "turn.completed", "usage": {"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 1}}]
    env = {"OPENAI_API_KEY": "sk-test-fake", "FAKE_CODEX_LOG": str(logs / "argv.jsonl"),
           "FAKE_CODEX_EVENTS": json.dumps(events), "CODEX_HOME": str(tmp_path / "codex-home")}
    job = cli.start("try it", "--engine", "codex", "--isolation", "worktree", env=env)
    cli.ok("wait", job)
    evidence = cli.json("show", job)["evidence"]
    assert evidence["isolation"]["mode"] == "worktree"
    assert evidence["isolation"]["claimed"] == [refused]  # what its output said: a claim
    argv = json.loads((logs / "argv.jsonl").read_text().splitlines()[0])["argv"]
    assert "--dangerously-bypass-approvals-and-sandbox" in argv


def test_a_running_paid_jobs_evidence_says_reserved_and_an_unconfined_one_names_no_enforcer(cli, repo, tmp_path):
    """Item 6 of issue 35: a running paid job's money is "reserved", never "free"; and the
    evidence of an `isolation none` job names nothing as its enforcer."""
    agent = Path(__file__).parent / "fake_agent.py"
    git(repo, "config", "subtask.engine.agent.command", json.dumps([sys.executable, str(agent), "{task}"]))
    git(repo, "config", "subtask.engine.agent.paid", "true")
    gate = tmp_path / "gate"
    job = cli.start(f"hold={gate}", "--engine", "agent", "--max-usd", "1", "--isolation", "none")
    try:
        envelope = json.loads(cli("result", job, "--evidence").stdout)  # exit 1: not passed (yet)
        assert envelope["state"] in ("queued", "running")
        assert envelope["cost"]["billing"] == "reserved" and envelope["cost"]["reserved"] == 1.0
        assert cli.json("show", job)["state_detail"]["attempts"][0]["cost"]["billing"] == "reserved"
    finally:
        gate.touch()
    cli.ok("wait", job)
    isolation = json.loads(cli.ok("result", job, "--evidence"))["isolation"]
    assert isolation["mode"] == "none" and isolation["enforced_by"] is None


def test_every_face_shows_the_jobs_total_over_its_attempts(cli, repo):
    """`spend` counts every attempt; `list`, the `show` header and the note showed the last one's."""
    paid_command_engine(repo, cost="0.42")
    job = cli.start("write the agent file", "--engine", "fakepaid", "--max-usd", "3")
    cli.ok("wait", job)
    cli.ok("reply", job, "and again")
    cli.ok("wait", job)
    attempts = cli.json("show", job)["state_detail"]["attempts"]
    assert [a["cost"]["charged"] for a in attempts] == [0.42, 0.42]
    _money_agrees(cli, repo, job, 0.84)
    note = git(repo, "notes", "--ref=subtask", "show", f"subtask/{job}")
    assert "cost:    $0.42 observed · job $0.84 over 2 attempts" in note


def _user_text(body: dict) -> str:
    """Every text a request's user messages carry (the prompt, tool results)."""
    texts = []
    for message in body.get("messages", []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        for block in content if isinstance(content, list) else [{"type": "text", "text": content}]:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                texts.append(block["text"])
    return "\n".join(texts)


@pytest.mark.slow
def test_real_claude_code_cli_is_told_what_verify_said_in_its_resumed_session(cli, repo, tmp_path, monkeypatch):
    """`--retries`: the verify loop resumes the real Claude Code session with verify's command,
    exit and output; the agent fixes it, and the job ends done after two attempts, each charged
    its own calls."""
    if _bundled_cli() is None:
        pytest.skip("this claude-agent-sdk wheel bundles no CLI")

    def bash(command):
        return tool_turn("Bash", {"command": command, "description": "run"})

    told = []

    def fix_turn(body):  # the first call of the retry: what was it told?
        told.append(_user_text(body))
        return bash("echo fixed > fixed.txt && git add fixed.txt && git commit -qm fixed")

    turns = [
        bash("echo one > one.txt && git add one.txt && git commit -qm one"),
        text_turn("Wrote one.txt. All tests pass.\nSTATUS: done"),
        fix_turn,
        text_turn("Added fixed.txt.\nSTATUS: done"),
    ]
    verify = 'echo "checking fixed.txt"; test -f fixed.txt'
    with FakeMessagesAPI(turns, usage=(10_000, 1_000)) as api:
        env = offline_env(tmp_path, api.url)
        env.pop("SUBTASK_CLAUDE_CLI", None)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        job = cli.ok("start", "--engine", "claude", "--max-usd", "2", "--timeout", "120", "--verify", verify,
                     "--retries", "2", "write one.txt and commit it", env=env).split()[0]
        assert cli("wait", job, env=env, timeout=240).returncode == 0, cli.ok("show", job)
    assert len(told) == 1
    assert f"verify: {verify} -> exit 1 on " in told[0] and "checking fixed.txt" in told[0]
    assert "retry 1 of 2" in told[0]
    attempts = cli.json("show", job)["state_detail"]["attempts"]
    assert [(a["state"], a["verify"]["passed"], a["retry"]) for a in attempts] == [("done", False, None),
                                                                                  ("done", True, 1)]
    assert attempts[0]["session_id"] == attempts[1]["session_id"]  # resumed, not started anew
    assert attempts[1]["message"].startswith("git-subtask ran the verify command on your work and it failed")
    per_call = attempts[0]["cost"]["charged"] / 2
    assert attempts[1]["cost"]["charged"] == pytest.approx(2 * per_call)  # its own two calls, not the session's four
    _money_agrees(cli, repo, job, attempts[0]["cost"]["charged"] + attempts[1]["cost"]["charged"])


# -- money through the claude engine's real SDK path, with a fake CLI that always runs ----------

def _session_cli(tmp_path: Path, run_cost: str) -> tuple[Path, dict[str, str]]:
    """A fake Claude Code whose session cost runs on over resumed runs; each run costs `run_cost`."""
    fake = write_fake_cli(tmp_path / "claude-cli", "session")
    _run_cost(fake, run_cost)
    return fake, {"SUBTASK_CLAUDE_CLI": str(fake), **FAKE_CREDENTIALS}


def _run_cost(fake: Path, dollars: str) -> None:
    Path(f"{fake}.json.run-cost").write_text(dollars)


def _ledger_rows(repo: Path, job: str) -> list[dict]:
    rows = (repo / ".git" / "subtask" / "ledger.jsonl").read_text().splitlines()
    return [json.loads(row) for row in rows if f'"{job}.' in row]


def test_a_resumed_claude_session_is_charged_each_runs_own_share_exactly(cli, repo, tmp_path):
    """Claude Code reports a resumed session's cost as its running total ($0.20, then $0.37):
    each reply is charged its own run ($0.17, not $0.37, and not the float 0.16999999999999998),
    and the ledger rows, the records and every face hold the exact amounts."""
    fake, env = _session_cli(tmp_path, "0.20")
    job = cli.start("first part", "--engine", "claude", "--max-usd", "1", env=env)
    cli.ok("wait", job, env=env)
    _run_cost(fake, "0.17")
    cli.ok("reply", job, "second part", env=env)
    cli.ok("wait", job, env=env)
    attempts = cli.json("show", job)["state_detail"]["attempts"]
    assert [a["cost"]["charged"] for a in attempts] == [0.2, 0.17]
    assert attempts[1]["totals"]["cost_usd"] == 0.37  # what Claude Code said: the session's
    assert [row["usd_charged"] for row in _ledger_rows(repo, job) if row["op"] == "close"] == [0.2, 0.17]
    _money_agrees(cli, repo, job, 0.37)
    note = git(repo, "notes", "--ref=subtask", "show", f"subtask/{job}")
    assert "cost:    $0.17 observed · job $0.37 over 2 attempts" in note


def test_a_killed_first_attempt_is_credited_when_the_session_is_resumed(cli, repo, tmp_path):
    """Issue 38, money 1: the first run answered one $0.09 call and died before its result. It was
    charged its whole reservation ($0.09) and recorded no totals; Claude Code's report on resume
    ($0.59) counts that call again. The reply is charged $0.50, crediting $0.09, never $0.59."""
    fake, env = _session_cli(tmp_path, "0.09")
    Path(f"{fake}.json.die").touch()
    job = cli.start("first part", "--engine", "claude", "--max-usd", "0.09", env=env)
    assert cli("wait", job, env=env).returncode == 1
    first = cli.json("show", job)["state_detail"]["attempts"][0]
    assert first["state"] == "failed" and first["totals"] is None and first["session_id"] == FAKE_SESSION
    assert (first["cost"]["charged"], first["cost"]["billing"]) == (0.09, "charged")
    Path(f"{fake}.json.die").unlink()
    _run_cost(fake, "0.50")
    cli.ok("reply", job, "go on", "--max-usd", "1", env=env)
    cli.ok("wait", job, env=env)
    second = cli.json("show", job)["state_detail"]["attempts"][1]
    assert cli_options(read_record(fake)["argv"])["--resume"] == FAKE_SESSION
    assert second["cost"] == {"v": 1, "reserved": 1.0, "observed": 0.59, "charged": 0.5, "billing": "observed",
                              "credit": 0.09}
    _money_agrees(cli, repo, job, 0.59)
    assert "$0.50 observed (less $0.09 charged already" in cli.ok("show", job)


def test_a_claude_run_the_model_never_answered_is_charged_nothing_however_it_ended(cli, repo, tmp_path):
    """Issue 38, money 2: the CLI never got an answer and ran into its --timeout (no stall rule
    involved): no answered call was seen, so nothing is charged, not the whole reservation."""
    fake = write_fake_cli(tmp_path / "claude-cli", "hang")
    env = {"SUBTASK_CLAUDE_CLI": str(fake), **FAKE_CREDENTIALS}
    job = cli.start("never answered", "--engine", "claude", "--max-usd", "1", "--timeout", "1", env=env)
    assert cli("wait", job, env=env, timeout=60).returncode == 1
    attempt = cli.json("show", job)["state_detail"]["attempts"][0]
    assert attempt["error_kind"] == "timeout" and attempt["stalled"] is None
    assert (attempt["cost"]["charged"], attempt["cost"]["billing"]) == (0.0, "not_billed")
    assert cli.json("spend")["committed_usd"] == 0.0
    assert "$0.00 (the model never answered: nothing billed)" in cli.ok("show", job)


def _fake_codex(repo: Path, tmp_path: Path, events: list[dict], mode: str = "ok") -> dict[str, str]:
    """The suite's stand-in codex (test_engine_codex.FAKE_CODEX) replaying `events`: its env."""
    from test_engine_codex import FAKE_CODEX

    fake = tmp_path / "bin" / "codex"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(FAKE_CODEX.format(python=sys.executable))
    fake.chmod(0o755)
    git(repo, "config", "subtask.engine.codex.path", str(fake))
    return {"OPENAI_API_KEY": "sk-test-fake", "FAKE_CODEX_LOG": str(tmp_path / "argv.jsonl"),
            "FAKE_CODEX_MODE": mode, "FAKE_CODEX_EVENTS": json.dumps(events),
            "CODEX_HOME": str(tmp_path / "codex-home")}


@pytest.mark.parametrize("ended_by", ["timeout", "exit"])
def test_a_codex_run_its_api_never_answered_is_charged_nothing_however_it_ended(cli, repo, tmp_path, ended_by):
    """Issue 38, money 2: codex retrying an API it cannot reach (recorded from the real CLI), ended
    by its --timeout or by giving up, with no stall rule: no answer, no usage, so $0.00, not the
    whole reservation (the stall rule charged nothing; a timeout charged $1.00)."""
    from test_engine_codex import recorded

    events = recorded("codex-0.171-unreachable.jsonl")
    env = _fake_codex(repo, tmp_path, events, mode="events_then_sleep" if ended_by == "timeout" else "ok")
    env["FAKE_CODEX_EXIT"] = "1"
    job = cli.start("do it", "--engine", "codex", "--max-usd", "1", "--timeout", "1", env=env)
    assert cli("wait", job, timeout=60).returncode == 1
    attempt = cli.json("show", job)["state_detail"]["attempts"][0]
    assert attempt["error_kind"] == ("timeout" if ended_by == "timeout" else "api_error") and attempt["stalled"] is None
    assert (attempt["cost"]["charged"], attempt["cost"]["billing"]) == (0.0, "not_billed")
    assert cli.json("spend")["committed_usd"] == 0.0


@pytest.mark.slow
def test_real_codex_pointed_at_a_closed_port_is_charged_nothing(cli, repo, tmp_path):
    """The real codex with its provider at a port nobody listens on: it never gets an answer."""
    import socket

    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = _real_codex_env(repo, tmp_path, f"http://127.0.0.1:{port}/v1")
    job = cli.start("write one.txt", "--engine", "codex", "--max-usd", "1", "--timeout", "3", env=env)
    assert cli("wait", job, env=env, timeout=120).returncode == 1
    attempt = cli.json("show", job)["state_detail"]["attempts"][0]
    assert attempt["state"] == "failed", attempt
    assert (attempt["cost"]["charged"], attempt["cost"]["billing"]) == (0.0, "not_billed"), attempt


# -- codex's own sandbox, said as it is (issue 38, money 3) ------------------------------------

def test_engines_and_start_say_when_codex_runs_with_its_sandbox_off(cli, repo, tmp_path):
    """`subtask.engine.codex.sandbox danger-full-access` turns codex's own sandbox off: `engines`
    no longer says "writes limited to the worktree", and `start` warns in one line when nothing
    else confines the job (a job then wrote in /var/tmp)."""
    env = _fake_codex(repo, tmp_path, [{"type": "thread.started", "thread_id": "t1"}])

    def codex_row():
        return next(e for e in cli.json("engines")["engines"] if e["name"] == "codex")

    assert "writes limited to the worktree" in codex_row()["isolation"]
    started = cli("start", "--engine", "codex", "x", env=env)
    assert started.returncode == 0 and "warning" not in started.stderr
    git(repo, "config", "subtask.engine.codex.sandbox", "danger-full-access")
    row = codex_row()
    assert "writes limited" not in row["isolation"] and "sandbox is off" in row["isolation"], row
    assert "nothing confines it" in row["confinement"], row
    started = cli("start", "--engine", "codex", "y", env=env)
    assert started.returncode == 0, started.stderr
    warnings = [line for line in started.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "danger-full-access" in warnings[0] and "--isolation worktree" in warnings[0]
    as_json = json.loads(cli.ok("start", "--engine", "codex", "--json", "z", env=env))
    assert as_json["warnings"] == [warnings[0]]
    if _landlock_available():  # confined by ours: nothing to warn of
        confined = cli("start", "--engine", "codex", "--isolation", "worktree", "w", env=env)
        assert confined.returncode == 0 and "warning" not in confined.stderr, confined.stderr
    for job in [line.split()[0] for line in cli.ok("list").splitlines() if line.startswith("st-")]:
        cli("wait", job, timeout=60)


def test_a_refusal_by_codexs_own_sandbox_is_in_the_evidence(cli, repo, tmp_path):
    """Under isolation none codex's own sandbox (workspace-write) confines it: a write it refused,
    printed in the output of codex's command, is listed as what the job claims (it printed it;
    no view of ours saw it), with who confined it."""
    refused = "touch: cannot touch '/var/tmp/x': Read-only file system"
    events = [{"type": "thread.started", "thread_id": "t1"},
              {"type": "item.completed", "item": {"id": "i1", "type": "command_execution",
                                                  "command": "touch /var/tmp/x", "aggregated_output": refused + "\n",
                                                  "exit_code": 1, "status": "failed"}},
              {"type": "item.completed", "item": {"id": "i2", "type": "agent_message", "text": "No.\nSTATUS: blocked"}},
              {"type": "turn.completed", "usage": {"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 1}}]
    env = _fake_codex(repo, tmp_path, events)
    job = cli.start("try it", "--engine", "codex", env=env)
    cli.ok("wait", job)
    isolation = cli.json("show", job)["evidence"]["isolation"]
    assert isolation["mode"] == "none" and isolation["claimed"] == [refused] and isolation["refused"] == []
    assert isolation["engine_sandbox"] == "codex workspace-write"
    assert "confinement: none (codex workspace-write sandbox) · 1 refusal claimed in the output" in cli.ok("show", job)


def _landlock_available() -> bool:
    from subtask.proc import isolation

    return isolation.support().available


# -- the aider recipe (docs/engines.md), with a stand-in aider (tests/fake_aider.py) -----------

FAKE_AIDER = Path(__file__).parent / "fake_aider.py"


def _documented_aider_recipe(repo: Path, *, identity: bool = True) -> list[str]:
    """Set every `git config subtask.engine.aider.*` line of docs/engines.md's recipe, with the
    stand-in aider as its program; `identity=False` leaves out the `env` prefix that gives aider a
    git identity (an older recipe). Returns the command template as set."""
    import re
    import shlex

    doc = (Path(__file__).parent.parent / "docs" / "engines.md").read_text()
    command = None
    for line in doc.splitlines():
        if not re.match(r"git config (--add )?subtask\.engine\.aider\.", line):
            continue
        args = shlex.split(line.split("  #")[0])[2:]
        if args[-2] == "subtask.engine.aider.command":
            template = json.loads(args[-1])
            at = template.index("aider")
            prefix = template[:at] if identity else []
            command = [*prefix, sys.executable, str(FAKE_AIDER), *template[at + 1:]]
            args[-1] = json.dumps(command)
        git(repo, "config", *args)
    assert command is not None, "docs/engines.md has no aider command"
    return command


def test_the_documented_aider_recipe_runs_without_a_git_identity_and_is_charged_its_session(cli, repo):
    """Issue 38, money 5: with no git identity anywhere, aider writes one into `.git/config`, which
    the job's sandbox refuses: it exited 1 after no model call and was charged $1.00. The recipe
    gives it an identity (never written), keeps its commit-message calls out (`--no-auto-commits`:
    the worker commits), and it is charged the session figure it printed."""
    assert git(repo, "config", "--get", "user.name", check=False) == ""
    _documented_aider_recipe(repo)
    job = cli.start("add a line", "--engine", "aider", "--max-usd", "1")
    cli.ok("wait", job)
    attempt = cli.json("show", job)["state_detail"]["attempts"][0]
    assert attempt["state"] == "done", attempt
    assert (attempt["cost"]["charged"], attempt["cost"]["billing"]) == (0.01, "observed")  # aider printed $0.01
    assert git(repo, "config", "--get", "user.name", check=False) == ""  # nothing written in .git/config
    # aider made no commit (no commit-message call): the worker committed what it left
    assert git(repo, "log", "--format=%s", f"main..subtask/{job}").splitlines() == \
        [f"subtask {job}: work left uncommitted by the aider engine"]


def test_an_aider_that_never_reached_its_model_is_charged_nothing(cli, repo):
    """aider (without the recipe's identity) refused its `.git/config` write and exited before any
    model call: its output has no `Tokens:` line (`answerPattern`), so nothing is charged."""
    _documented_aider_recipe(repo, identity=False)
    job = cli.start("add a line", "--engine", "aider", "--max-usd", "1")
    assert cli("wait", job).returncode == 1
    attempt = cli.json("show", job)["state_detail"]["attempts"][0]
    assert (attempt["state"], attempt["error_kind"]) == ("failed", "exit"), attempt
    assert (attempt["cost"]["charged"], attempt["cost"]["billing"]) == (0.0, "not_billed")
    assert any(".git/config" in line for line in cli.json("show", job)["evidence"]["isolation"]["claimed"])
