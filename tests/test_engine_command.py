"""The command engine: an argv template from config, run without a shell."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from subtask.engines.base import EngineContext
from subtask.engines.command import CommandEngine, parse_template, substitute

NASTY_TASK = """fix "quoted" and 'single' $(rm -rf x) `touch pwned` ; echo {worktree} > y"""

FAKE_AGENT = r'''#!{python}
"""A stand-in CLI agent: records argv and the task file, prints lines, exits as told."""
import json, os, sys, time

record = {{"argv": sys.argv[1:], "cwd": os.getcwd()}}
for arg in sys.argv[1:]:
    if arg.startswith("--file="):
        path = arg[len("--file="):]
        record["task_file"] = path
        record["task_file_content"] = open(path).read()
with open(os.environ["FAKE_AGENT_LOG"], "w") as log:
    json.dump(record, log)
for i in range(15):
    print(f"working line {{i}}")
print("tokens used; cost: $0.10", flush=True)
print("warning on stderr", file=sys.stderr, flush=True)
print("final cost: $0.42")
print("Did the thing.")
print("STATUS: partial", flush=True)
if os.environ.get("FAKE_AGENT_SLEEP"):
    time.sleep(60)
sys.exit(int(os.environ.get("FAKE_AGENT_EXIT", "0")))
'''


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
    env = dict(os.environ)
    env.update(GIT_AUTHOR_NAME="Test", GIT_AUTHOR_EMAIL="test@example.com",
               GIT_COMMITTER_NAME="Test", GIT_COMMITTER_EMAIL="test@example.com",
               GIT_CONFIG_NOSYSTEM="1", HOME=str(tmp_path))
    root = tmp_path / "repo"
    root.mkdir()
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "init"]):
        subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    agent = bin_dir / "fake-agent"
    agent.write_text(FAKE_AGENT.format(python=sys.executable))
    agent.chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["FAKE_AGENT_LOG"] = str(tmp_path / "agent.json")
    return {"root": root, "env": env, "tmp": tmp_path}


def engine(settings: dict[str, str], name: str = "fake") -> CommandEngine:
    return CommandEngine(name, settings.get)


def make_ctx(setup: dict[str, Any], settings: dict[str, str], *, task: str = NASTY_TASK,
             extra_env: dict[str, str] | None = None, **kwargs: Any):
    emitted: list[dict[str, Any]] = []
    ctx = EngineContext(job_id="job1", attempt=1, task=task, worktree=setup["root"],
                        repo_root=setup["root"], git_common_dir=setup["root"] / ".git",
                        env=dict(setup["env"], **(extra_env or {})), emit=emitted.append,
                        config=settings.get, private_dir=setup["tmp"], **kwargs)
    return ctx, emitted


def recorded(setup: dict[str, Any]) -> dict[str, Any]:
    return json.loads((setup["tmp"] / "agent.json").read_text())


def test_placeholders_arrive_as_literal_argv_elements(setup):
    template = ["fake-agent", "--message", "{task}", "--file={task_file}", "--cwd", "{worktree}",
                "--model={model}"]
    settings = {"engine.fake.command": json.dumps(template)}
    ctx, _ = make_ctx(setup, settings, model="sonnet")
    out = engine(settings).run(ctx)

    assert out.ok, out.error
    rec = recorded(setup)
    assert rec["argv"][1] == NASTY_TASK  # one element, no shell, `{worktree}` inside kept literal
    assert rec["argv"][4] == str(setup["root"])
    assert rec["argv"][5] == "--model=sonnet"
    assert rec["task_file_content"] == NASTY_TASK
    assert not Path(rec["task_file"]).exists()  # removed after the run
    assert not (setup["root"] / "x").exists() and not (setup["root"] / "pwned").exists()
    assert Path(rec["cwd"]).resolve() == setup["root"].resolve()


def test_model_is_empty_when_unset(setup):
    settings = {"engine.fake.command": json.dumps(["fake-agent", "m={model}", "{task}"])}
    ctx, _ = make_ctx(setup, settings, task="t")
    engine(settings).run(ctx)
    assert recorded(setup)["argv"] == ["m=", "t"]


def test_output_events_summary_and_status(setup):
    settings = {"engine.fake.command": json.dumps(["fake-agent", "{task}"])}
    ctx, emitted = make_ctx(setup, settings)
    out = engine(settings).run(ctx)

    assert out.ok and out.exit_code == 0
    lines = out.summary.splitlines()
    assert len(lines) == 10
    assert lines[-3:] == ["final cost: $0.42", "Did the thing.", "STATUS: partial"]
    assert "warning on stderr" not in out.summary  # summary is stdout only
    assert out.outcome == "partial"
    assert {"type": "output", "stream": "stdout", "text": "Did the thing."} in emitted
    assert {"type": "output", "stream": "stderr", "text": "warning on stderr"} in emitted


def test_cost_pattern_takes_the_last_match(setup):
    settings = {"engine.fake.command": json.dumps(["fake-agent", "{task}"]),
                "engine.fake.costPattern": r"cost: \$([0-9.]+)", "engine.fake.paid": "true"}
    ctx, _ = make_ctx(setup, settings)
    e = engine(settings)
    assert e.paid is True
    assert e.run(ctx).cost_usd == Decimal("0.42")


def test_cost_unknown_when_pattern_does_not_match(setup):
    settings = {"engine.fake.command": json.dumps(["fake-agent", "{task}"]),
                "engine.fake.costPattern": r"spent (\d+) dollars", "engine.fake.paid": "true"}
    ctx, _ = make_ctx(setup, settings)
    assert engine(settings).run(ctx).cost_usd is None


def test_free_engine_costs_nothing_and_paid_defaults_false(setup):
    settings = {"engine.fake.command": json.dumps(["fake-agent", "{task}"])}
    ctx, _ = make_ctx(setup, settings)
    e = engine(settings)
    assert e.paid is False
    assert e.run(ctx).cost_usd == 0.0
    paid = {**settings, "engine.fake.paid": "true"}
    assert engine(paid).run(make_ctx(setup, paid)[0]).cost_usd is None


@pytest.mark.parametrize("raw", [None, "", "not json", '"fake-agent {task}"', "[]", '["a", 1]',
                                 '{"argv": ["a"]}'])
def test_invalid_template(setup, raw):
    settings = {} if raw is None else {"engine.fake.command": raw}
    ctx, _ = make_ctx(setup, settings)
    out = engine(settings).run(ctx)
    assert not out.ok
    assert out.error_kind == "engine"
    assert out.error == ('subtask.engine.fake.command must be a JSON list of strings, '
                         'e.g. ["aider","--yes","--message","{task}"]')
    assert not engine(settings).probe().installed


def test_nonzero_exit(setup):
    settings = {"engine.fake.command": json.dumps(["fake-agent", "{task}"])}
    ctx, _ = make_ctx(setup, settings, extra_env={"FAKE_AGENT_EXIT": "2"})
    out = engine(settings).run(ctx)
    assert not out.ok
    assert out.error_kind == "exit" and out.exit_code == 2
    assert out.summary.endswith("STATUS: partial")  # the agent's words are kept


def test_timeout(setup):
    settings = {"engine.fake.command": json.dumps(["fake-agent", "{task}"])}
    ctx, _ = make_ctx(setup, settings, extra_env={"FAKE_AGENT_SLEEP": "1"}, timeout=1.0)
    out = engine(settings).run(ctx)
    assert not out.ok and out.error_kind == "timeout"


def test_missing_binary(setup):
    settings = {"engine.fake.command": json.dumps(["no-such-agent-xyz", "{task}"])}
    ctx, _ = make_ctx(setup, settings)
    out = engine(settings).run(ctx)
    assert not out.ok and out.error_kind == "not_installed"
    assert "no-such-agent-xyz" in out.error


def test_probe(setup, monkeypatch):
    monkeypatch.setenv("PATH", setup["env"]["PATH"])
    settings = {"engine.fake.command": json.dumps(["fake-agent", "{task}"])}
    probe = engine(settings).probe()
    assert probe.installed and probe.authenticated is None and probe.usable
    by_path = {"engine.fake.command": json.dumps([str(setup["tmp"] / "bin" / "fake-agent")])}
    assert engine(by_path).probe().installed
    missing = {"engine.fake.command": json.dumps(["no-such-agent-xyz"])}
    assert not engine(missing).probe().installed


def test_the_program_behind_an_env_prefix_is_the_one_looked_for(setup, monkeypatch):
    """A recipe may give its agent variables with `env NAME=VALUE ... program` (aider's identity):
    `env` is always there, so the program after it is the one `engines` and `start` look for."""
    monkeypatch.setenv("PATH", setup["env"]["PATH"])
    present = {"engine.fake.command": json.dumps(["env", "GIT_CONFIG_COUNT=0", "fake-agent", "{task}"])}
    assert engine(present).probe().installed
    missing = {"engine.fake.command": json.dumps(["env", "A=1", "no-such-agent-xyz", "--yes"])}
    probe = engine(missing).probe()
    assert not probe.installed and probe.detail == "no-such-agent-xyz not found on PATH"
    ctx, _ = make_ctx(setup, missing)
    out = engine(missing).run(ctx)
    assert out.error_kind == "not_installed" and "no-such-agent-xyz" in out.error


def test_reply_without_resume_template_sends_the_message_as_the_task(setup):
    settings = {"engine.fake.command": json.dumps(["fake-agent", "{task}"])}
    ctx, _ = make_ctx(setup, settings, task="now add tests", session_id="abc")
    out = engine(settings).run(ctx)
    assert recorded(setup)["argv"] == ["now add tests"]
    assert out.session_id == "abc"


def test_reply_with_resume_template(setup):
    settings = {"engine.fake.command": json.dumps(["fake-agent", "{task}"]),
                "engine.fake.resumeCommand": json.dumps(["fake-agent", "--resume", "{session}", "{task}"])}
    ctx, _ = make_ctx(setup, settings, task="continue", session_id="abc")
    engine(settings).run(ctx)
    assert recorded(setup)["argv"] == ["--resume", "abc", "continue"]


def test_substitute_is_single_pass():
    values = {"task": "{worktree} {model}", "worktree": "/w", "model": "m"}
    assert substitute(["{task}", "{worktree}/x", "{unknown}"], values) == ["{worktree} {model}", "/w/x", "{unknown}"]
    assert parse_template('["a", "{task}"]') == ["a", "{task}"]
