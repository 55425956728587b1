"""Hostile text: control sequences in a task, a summary or a file name are never shown raw; a
`.worktreeinclude` copy never writes through a symlink; a malformed MCP line gets a parse error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git

from subtask.words import json_text, safe, safe_line

# What a hostile text carries: retitle the terminal, clear it, overwrite the line, erase, ring,
# and reverse what follows (right-to-left override).
HOSTILE = "title\x1b]0;pwned\x07 clear\x1b[2J cr\rover back\x08 bell\x07 rlo\u202etxt.exe"
RAW = ["\x1b", "\x07", "\r", "\x08", "\u202e", "\x9b"]


def raw_controls(text: str) -> list[str]:
    return [repr(c) for c in RAW if c in text]


def test_safe_makes_every_control_character_visible_and_keeps_lines():
    assert safe(HOSTILE) == r"title\x1b]0;pwned\x07 clear\x1b[2J cr\x0dover back\x08 bell\x07 rlo\u202etxt.exe"
    assert safe("a\n\tb\x9b\u2066c\u2069") == "a\n\tb\\x9b\\u2066c\\u2069"
    assert safe_line("one\ntwo\tthree") == r"one\ntwo\tthree"
    assert safe(safe(HOSTILE)) == safe(HOSTILE)
    assert safe("plain text, é, 日本") == "plain text, é, 日本"


def test_json_keeps_the_exact_value_escaped():
    text = json_text({"task": HOSTILE + "\x9b"})
    assert raw_controls(text) == []
    assert json.loads(text) == {"task": HOSTILE + "\x9b"}


def test_show_list_result_note_and_subject_show_no_raw_control_character(cli, repo):
    script = (f"printf '%s\\n' '{HOSTILE}'\n"
              "touch \"$(printf 'evil\\033[2Jname\\342\\200\\256gpj.txt')\"\n"
              f"# {HOSTILE}")
    job = cli.start(script)
    cli.ok("wait", job)
    record = cli.json("show", job)
    assert record["spec"]["task"] == script, "JSON keeps the exact value"
    assert any("\x1b[2J" in f["path"] for f in record["evidence"]["files"])
    assert "\x1b]0;pwned\x07" in record["summary"] and "\u202e" in record["summary"]
    listed = cli.json("list")["jobs"][0]
    assert listed["task"] == script.splitlines()[0]
    shown = {}
    for args in (["show", job], ["list"], ["list", "--all"], ["result", job], ["result", job, "--full"],
                 ["status", job], ["wait", job], ["log", job], ["show", job, "--json"], ["list", "--json"],
                 ["result", job, "--evidence"]):
        proc = cli(*args)
        shown[" ".join(args)] = raw_controls(proc.stdout + proc.stderr)
    shown["note"] = raw_controls(git(repo, "notes", "--ref=subtask", "show", record["evidence"]["head"]))
    shown["git log --notes"] = raw_controls(git(repo, "log", "--notes=subtask", "--all"))
    shown["record subjects"] = raw_controls(git(repo, "log", "--format=%s", f"refs/subtask/{job}/record"))
    assert all(not found for found in shown.values()), shown
    assert "\\x1b]0;pwned\\x07" in cli.ok("show", job), "made visible, not dropped"


def test_a_hostile_error_message_is_shown_harmlessly(cli):
    proc = cli("list", "--state", "\x1b]0;pwned\x07")
    assert proc.returncode == 129 and raw_controls(proc.stderr) == []
    assert "\\x1b]0;pwned\\x07" in proc.stderr


def test_mcp_text_shows_no_raw_control_character(repo, monkeypatch):
    import anyio
    from mcp import Client

    from subtask.faces.mcp_server import server

    monkeypatch.chdir(repo)

    async def talk() -> list[str]:
        async with Client(server, mode="legacy") as client:
            started = await client.call_tool("start", {"task": f"echo '{HOSTILE}'"})
            job = started.content[0].text.split()[0]
            texts = [started.content[0].text]
            for name, args in (("wait", {"ids": [job]}), ("result", {"id": job}), ("list", {}),
                               ("status", {"id": job}), ("result", {"id": job, "evidence": True})):
                answer = await client.call_tool(name, args)
                texts.append(answer.content[0].text)
            return texts

    texts = anyio.run(talk)
    assert [raw_controls(t) for t in texts] == [[]] * len(texts)
    assert "\x1b[2J" in json.loads(texts[-1])["summary"], "the evidence JSON keeps the exact value"


# ---------------------------------------------------------------- .worktreeinclude and symlinks

@pytest.fixture
def evil_branch(repo, tmp_path):
    """Main has an ignored conf/.env listed in .worktreeinclude; branch `evil` makes conf a symlink
    to a folder outside the repository."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (repo / ".gitignore").write_text(".env\n")
    (repo / ".worktreeinclude").write_text("conf/.env\n")
    (repo / "conf").mkdir()
    (repo / "conf" / "settings.txt").write_text("tracked\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "conf")
    (repo / "conf" / ".env").write_text("SECRET=from-main\n")
    os.chmod(repo / "conf" / ".env", 0o600)
    # The branch is built with plumbing in a private index: the main worktree stays as it is.
    env = dict(os.environ, GIT_INDEX_FILE=str(tmp_path / "evil.index"))

    def plumb(*args: str, input: str | None = None) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], input=input, env=env, capture_output=True,
                              text=True, check=True).stdout.strip()

    plumb("read-tree", "main")
    plumb("update-index", "--force-remove", "conf/settings.txt")
    link = plumb("hash-object", "-w", "--stdin", input=str(outside))
    plumb("update-index", "--add", "--cacheinfo", f"120000,{link},conf")
    commit = plumb("commit-tree", plumb("write-tree"), "-p", "main", "-m", "conf is a symlink out of the repository")
    git(repo, "update-ref", "refs/heads/evil", commit)
    assert (repo / "conf" / ".env").read_text() == "SECRET=from-main\n"
    return outside


@pytest.mark.parametrize("readonly", [False, True], ids=["writing", "readonly"])
def test_worktreeinclude_never_writes_through_a_symlink_out_of_the_worktree(cli, repo, evil_branch, readonly):
    job = cli.start("echo job ran", "--base", "evil", *(["--readonly"] if readonly else []))
    cli("wait", job)
    assert list(evil_branch.iterdir()) == [], "nothing was written outside the repository"


def test_worktreeinclude_copies_keep_the_source_mode(cli, repo, tmp_path):
    (repo / ".gitignore").write_text(".env\nkeys/\n")
    (repo / ".worktreeinclude").write_text(".env\nkeys/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "ignore")
    (repo / ".env").write_text("TOKEN=x\n")
    os.chmod(repo / ".env", 0o600)
    (repo / "keys").mkdir()
    (repo / "keys" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(repo / "keys" / "run.sh", 0o750)
    job = cli.start("stat -c '%a %n' .env keys/run.sh")
    cli.ok("wait", job)
    assert cli.json("show", job)["summary"].splitlines() == ["600 .env", "750 keys/run.sh"]


# ---------------------------------------------------------------- MCP: a malformed line

def test_a_malformed_json_line_gets_a_parse_error_from_the_stdio_server(repo):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-m", "subtask.faces.mcp_server"], cwd=str(repo), env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "test", "version": "0"}}}
        proc.stdin.write((json.dumps(initialize) + "\n").encode() + b"{this is not json\n"
                         + b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
                         + b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}\n' + b"\xff\xfe garbage\n"
                         + b'{"jsonrpc":"2.0","id":3,"method":"ping"}\n')
        proc.stdin.flush()
        replies = []
        while not any(r.get("id") == 3 for r in replies):
            line = proc.stdout.readline()
            assert line, proc.stderr.read().decode()
            replies.append(json.loads(line))
        errors = [r for r in replies if "error" in r]
        assert [(e["id"], e["error"]["code"]) for e in errors] == [(None, -32700), (None, -32700)]
        assert {r.get("id") for r in replies if "result" in r} == {1, 2, 3}, "the session goes on"
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
