"""`--engine auto`: filters (installed, authenticated, isolation, budget, room), then a score
from an explicit utility over this repository's records; `routing explain` shows it all, the
record and note say what was chosen and why, and no candidate means a refusal naming each filter."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import git, refs

FAKE_AGENT = Path(__file__).parent / "fake_agent.py"
CODEX_KEY = {"OPENAI_API_KEY": "sk-test-fake"}  # codex is logged in: only the isolation removes it


def agent(repo: Path, name: str, *, paid: bool = False) -> None:
    """A command engine `name` (tests/fake_agent.py): writes and commits a file, prints a cost."""
    git(repo, "config", f"subtask.engine.{name}.command", json.dumps([sys.executable, str(FAKE_AGENT), "{task}"]))
    if paid:
        git(repo, "config", f"subtask.engine.{name}.paid", "true")
        git(repo, "config", f"subtask.engine.{name}.costPattern", r"cost: \$([0-9.]+)")


def three_engines_with_a_record(repo: Path, cli) -> None:
    """good (two jobs, verify passed), bad (two jobs, verify failed), fresh (no job yet), and
    codex, which cannot be confined by git-subtask while its own sandbox is on."""
    for name in ("good", "bad", "fresh"):
        agent(repo, name)
    git(repo, "config", "subtask.routing.engines", "codex claude bad fresh good")
    jobs = [cli.start(f"file={name}{n}.txt", "--engine", name, "--verify", "true" if name == "good" else "false")
            for name in ("good", "bad") for n in (1, 2)]
    cli("wait", *jobs)


def test_auto_chooses_the_top_score_and_the_record_says_why(repo, cli):
    three_engines_with_a_record(repo, cli)
    explained = cli.json("routing", "explain", "--isolation", "worktree", "file=x.txt", env=CODEX_KEY)
    by_name = {c["name"]: c for c in explained["candidates"]}
    assert by_name["codex"]["removed_by"] == "isolation" and "sandbox" in by_name["codex"]["why"]
    assert by_name["claude"]["removed_by"] == "authenticated"
    scores = {name: by_name[name]["score"] for name in ("good", "bad", "fresh")}
    assert scores["good"] > scores["fresh"] > scores["bad"], scores
    assert by_name["good"]["terms"]["pass"]["value"] == 0.75 and by_name["bad"]["terms"]["pass"]["value"] == 0.25
    assert by_name["fresh"]["history"]["ended"] == 0 and by_name["good"]["history"] == {
        "ended": 2, "passed": 2, "usd": 0.0, "minutes": by_name["good"]["history"]["minutes"]}
    assert explained["chosen"] == "good" == max(scores, key=scores.get)

    text = cli.ok("routing", "explain", "--isolation", "worktree", "file=x.txt", env=CODEX_KEY)
    assert "codex" in text and "removed by isolation" in text and text.rstrip().endswith("chosen: good")

    job = cli.start("file=auto.txt", "--engine", "auto", "--isolation", "worktree", env=CODEX_KEY)
    cli("wait", job)
    shown = cli.json("show", job)
    assert shown["spec"]["engine"] == "good"
    routing = shown["spec"]["routing"]
    assert routing["chosen"] == "good" and routing["score"] == round(scores["good"], 4)
    assert routing["others"]["codex"].startswith("isolation: ") and routing["others"]["bad"] == round(scores["bad"], 4)
    assert "routing:   auto chose good (score " in cli.ok("show", job)
    note = git(repo, "notes", "--ref=subtask", "show", f"subtask/{job}")
    assert "routing: auto chose good (score" in note and "codex (isolation:" in note

    git(repo, "config", "subtask.engine", "auto")  # the default engine may be auto too
    again = cli.start("file=again.txt", "--isolation", "worktree", env=CODEX_KEY)
    assert cli.json("show", again)["spec"]["engine"] == "good"
    cli("wait", again)


def test_no_candidate_left_is_refused_naming_each_filter_and_nothing_is_made(repo, cli):
    git(repo, "config", "subtask.routing.engines", "codex claude")
    before = refs(repo)
    proc = cli("start", "--engine", "auto", "--isolation", "worktree", "anything", env=CODEX_KEY)
    assert proc.returncode == 128, proc.stderr
    assert "no engine that can run this job" in proc.stderr
    assert "codex: isolation:" in proc.stderr and "claude: authenticated:" in proc.stderr
    assert "hint: git subtask routing explain" in proc.stderr
    assert refs(repo) == before and not (repo / ".subtask" / "worktrees").exists()
    explained = cli("routing", "explain", "--isolation", "worktree", "anything", env=CODEX_KEY)
    assert explained.returncode == 1 and explained.stdout.rstrip().endswith("chosen: none: every candidate was removed")


def test_budget_and_room_remove_a_paid_engine_and_its_running_jobs(repo, cli, control_dir):
    agent(repo, "pricey", paid=True)
    agent(repo, "free")
    git(repo, "config", "subtask.routing.engines", "pricey free")
    over = cli.json("routing", "explain", "--max-usd", "50", "file=x.txt")
    removed = {c["name"]: (c["removed_by"], c["why"]) for c in over["candidates"]}
    assert removed["pricey"][0] == "budget" and "subtask.maxJobUsd" in removed["pricey"][1]
    assert removed["free"][0] is None and over["chosen"] == "free"

    git(repo, "config", "subtask.routing.pricey.maxRunning", "1")
    gate = control_dir / "gate"
    held = cli.start(f"file=held.txt hold={gate} cost=0.10", "--engine", "pricey")
    try:
        full = cli.json("routing", "explain", "file=x.txt")
        pricey = next(c for c in full["candidates"] if c["name"] == "pricey")
        assert pricey["removed_by"] == "room" and "subtask.routing.pricey.maxRunning is 1" in pricey["why"]
    finally:
        gate.touch()
    cli("wait", held)
    after = next(c for c in cli.json("routing", "explain", "file=x.txt")["candidates"] if c["name"] == "pricey")
    assert after["removed_by"] is None and after["terms"]["cost"]["value"] == 0.1  # its one job here cost $0.10


def test_the_mcp_routing_tool_answers_what_the_cli_says(repo, cli, monkeypatch):
    import anyio
    from mcp import Client

    from subtask.faces.mcp_server import server

    agent(repo, "solo")
    git(repo, "config", "subtask.routing.engines", "solo codex")
    monkeypatch.chdir(repo)

    async def main():
        async with Client(server, mode="legacy") as client:
            return await client.call_tool("routing", {"task": "file=x.txt", "isolation": "worktree"})

    answer = anyio.run(main)
    assert answer.structured_content["chosen"] == "solo"
    said = cli.ok("routing", "explain", "--isolation", "worktree", "file=x.txt")
    assert answer.content[0].text == said.rstrip("\n")
