"""One description of a start (`subtask/start_options.py`): every option reaches the CLI, the MCP
`start` tool, a `start_many` item and the job's record from there."""

from __future__ import annotations

import json

import anyio
import pytest
from conftest import git

from subtask.model.start_options import MAP_OPTIONS, OPTIONS, StartRequest

# What each option is set to, and where the record keeps it (None: a group option, kept by the group).
VALUES = {
    "task": ("echo hi > hi.txt", lambda spec: spec["task"]),
    "engine": ("shell", lambda spec: spec["engine"]),
    "base": ("main", lambda spec: spec["base_ref"]),
    "verify": ("test -f hi.txt", lambda spec: spec["verify"]),
    "verify_timeout": (42.0, lambda spec: spec["verify_timeout"]),
    "timeout": (50.0, lambda spec: spec["timeout"]),
    "max_usd": (0.0, None),  # a free engine reserves nothing: its spec keeps no budget
    "max_turns": (7, lambda spec: spec["max_turns"]),
    "model": ("m-1", lambda spec: spec["model"]),
    "readonly": (False, lambda spec: spec["readonly"]),
    "isolation": ("none", lambda spec: spec["isolation"]),
    "on": ("local", lambda spec: spec.get("extra", {}).get("on", "local") if "on" not in spec else spec["on"]),
    "retries": (2, lambda spec: spec["retries"]),
    "check": (["paths=*.txt"], lambda spec: spec["checks"][-1:]),
    "harness": (["ci/**"], lambda spec: spec["harness"][-1:]),
    "best_of": (None, None), "pick": (None, None), "judge": (None, None), "first_pass": (False, None),
    # A job that waits needs one to wait for: tests/test_plans.py starts them on every face.
    "after": (None, lambda spec: spec.get("after")), "on_fail": (None, lambda spec: spec.get("on_fail")),
}


def test_every_option_is_described_once_and_covered_here():
    assert [o.name for o in OPTIONS] == list(StartRequest.__dataclass_fields__) == list(VALUES)
    for option in OPTIONS:
        assert option.help and "{" not in option.help_for("cli") and "{" not in option.help_for("mcp")


def test_the_cli_takes_every_option(cli):
    shown = cli.ok("start", "-h")
    for option in OPTIONS:
        assert (option.name.upper() if option.argument else option.flag) in shown, option.name
    mapped = cli.ok("map", "-h")  # map passes the same options to each of its jobs
    for option in MAP_OPTIONS:
        assert option.flag in mapped, option.name


def test_the_mcp_start_tool_and_start_many_items_take_every_option(repo, monkeypatch):
    from mcp import Client

    from subtask.faces.mcp_server import server

    monkeypatch.chdir(repo)

    async def main():
        async with Client(server, mode="legacy") as client:
            return {t.name: t for t in (await client.list_tools()).tools}

    tools = anyio.run(main)
    start = tools["start"].input_schema
    items = tools["start_many"].input_schema["properties"]["tasks"]["items"]
    for option in OPTIONS:
        assert start["properties"][option.name]["description"] == option.help_for("mcp")
        assert items["properties"][option.name]["description"] == option.help_for("mcp")
    assert start["required"] == ["task"] and items["required"] == ["task"]
    mapped = tools["map"].input_schema
    for option in MAP_OPTIONS:
        assert mapped["properties"][option.name]["description"] == option.help_for("mcp"), option.name
    assert sorted(mapped["required"]) == ["pattern", "task"]


def _cli_args() -> list[str]:
    args = []
    for option in OPTIONS:
        value = VALUES[option.name][0]
        if option.argument or value is None or value is False:
            continue
        if isinstance(value, list):
            for item in value:
                args += [option.flag, item]
            continue
        args += [option.flag] if value is True else [option.flag, str(value)]
    return [*args, VALUES["task"][0]]


def _mcp_args() -> dict:
    return {o.name: VALUES[o.name][0] for o in OPTIONS if VALUES[o.name][0] is not None}


@pytest.mark.parametrize("face", ["cli", "mcp start", "mcp start_many"])
def test_every_option_lands_in_the_record(face, cli, repo, monkeypatch):
    if face == "cli":
        job = cli.json("start", *_cli_args())["id"]
    else:
        from mcp import Client

        from subtask.faces.mcp_server import server

        monkeypatch.chdir(repo)

        async def main():
            async with Client(server, mode="legacy") as client:
                if face == "mcp start":
                    answer = await client.call_tool("start", _mcp_args())
                    return answer.structured_content["id"]
                answer = await client.call_tool("start_many", {"tasks": [_mcp_args()]})
                return answer.structured_content["items"][0]["id"]

        job = anyio.run(main)
    cli("wait", job)
    spec = json.loads(git(repo, "show", f"refs/subtask/{job}/record:spec.json"))
    for name, (value, kept) in VALUES.items():
        if kept is not None:
            assert kept(spec) == value, name
