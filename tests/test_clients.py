"""`git subtask install | uninstall` (subtask/client_config.py) and doctor's handshake with what it set up.

Every test runs with a temporary HOME (conftest) and the real config formats: a person's own
`~/.claude.json` / `.mcp.json` and `config.toml`, with their own servers, comments and layout,
which must come back byte for byte after install then uninstall.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import BIN_DIR, git

# A person's own files, each in a layout no tool would write.
CLAUDE_JSON = """{
    "numStartups": 12,
    "mcpServers": {
        "mine": { "command": "my-server", "args": ["--fast"] }
    },
    "theme": "dark"
}
"""
MCP_JSON = '{"mcpServers": {"team-db": {"command": "db-mcp", "env": {"DB": "x"}}}}'  # no final newline
CODEX_TOML = """# my Codex settings
model = "o4"

[mcp_servers.docs]
command = "docs-mcp"
args = ["--port", "3"]   # keep this comment

[profiles.fast]
model = "o4-mini\""""  # no final newline either


def env(home: Path, *, with_claude: Path | None = None) -> dict[str, str]:
    """No `claude` on PATH (the suite's paid-engine guard is one) unless a test gives its own."""
    path = os.pathsep.join([*([str(with_claude)] if with_claude else []), BIN_DIR, "/usr/bin", "/bin"])
    return {"HOME": str(home), "PATH": path, "XDG_STATE_HOME": str(home / ".local" / "state"),
            "CLAUDE_CONFIG_DIR": "", "CODEX_HOME": ""}


def run(cli, home: Path, *args: str, ok: bool = True, **kwargs):
    proc = cli(*args, env=env(home, **kwargs))
    assert (proc.returncode == 0) is ok, proc.stderr + proc.stdout
    return proc


def person_files(home: Path, repo: Path) -> dict[Path, bytes]:
    files = {home / ".claude.json": CLAUDE_JSON, repo / ".mcp.json": MCP_JSON,
             home / ".codex" / "config.toml": CODEX_TOML, repo / ".codex" / "config.toml": CODEX_TOML}
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (home / ".codex" / "config.toml").chmod(0o600)
    return {path: path.read_bytes() for path in files}


def tree(*roots: Path) -> set[str]:
    return {str(p) for root in roots for p in root.rglob("*") if ".git" not in p.parts and ".local" not in p.parts}


@pytest.mark.parametrize("scope", ["user", "project"])
def test_install_then_uninstall_leaves_a_persons_configs_byte_identical(cli, repo, isolated_git, scope):
    home = isolated_git
    before = person_files(home, repo)
    listed = tree(home, repo)
    shown = run(cli, home, "install", "all", "--scope", scope).stdout
    assert shown.splitlines()[0] == f"git subtask install all --scope {scope}:"
    claude = home / ".claude.json" if scope == "user" else repo / ".mcp.json"
    codex = (home if scope == "user" else repo) / ".codex" / "config.toml"
    servers = json.loads(claude.read_text())["mcpServers"]
    assert set(servers) == ({"mine", "subtask"} if scope == "user" else {"team-db", "subtask"})
    assert servers["subtask"]["type"] == "stdio"
    assert servers["subtask"]["command"] == ("subtask-mcp" if scope == "project"
                                             else str(Path(BIN_DIR) / "subtask-mcp"))
    toml = tomllib.loads(codex.read_text())
    assert set(toml["mcp_servers"]) == {"docs", "subtask"} and toml["profiles"]["fast"]["model"] == "o4-mini"
    assert "ANTHROPIC_API_KEY" in toml["mcp_servers"]["subtask"]["env_vars"]
    assert toml["mcp_servers"]["subtask"]["tool_timeout_sec"] >= 600
    skills = [(home if scope == "user" else repo) / ".claude" / "skills" / "git-subtask" / "SKILL.md",
              (home if scope == "user" else repo) / ".agents" / "skills" / "git-subtask" / "SKILL.md"]
    assert all(p.read_text().startswith("---\nname: git-subtask\n") for p in skills)
    assert (home / ".codex" / "config.toml").stat().st_mode & 0o777 == 0o600  # its mode kept

    again = run(cli, home, "install", "all", "--scope", scope)  # idempotent: nothing changes
    assert "already installed" in again.stdout and json.loads(claude.read_text())["mcpServers"] == servers

    run(cli, home, "uninstall", "all", "--scope", scope)
    for path, data in before.items():
        assert path.read_bytes() == data, f"{path} changed"
    assert tree(home, repo) == listed  # the skill folders it made are gone, nothing else
    assert "nothing installed" in run(cli, home, "uninstall", "all", "--scope", scope).stdout


def test_files_in_claudes_own_layout_stay_in_it(cli, repo, isolated_git):
    """A ~/.claude.json as Claude Code writes it (two spaces) gets the entry in that layout, and
    loses it the same way, byte for byte."""
    home = isolated_git
    path = home / ".claude.json"
    path.write_text(json.dumps({"userID": "u", "mcpServers": {"mine": {"command": "x"}}, "é": "ü"}, indent=2,
                               ensure_ascii=False))
    before = path.read_bytes()
    run(cli, home, "install", "claude")
    text = path.read_text()
    assert text == json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    run(cli, home, "uninstall", "claude")
    assert path.read_bytes() == before


def test_new_files_are_made_and_removed_with_their_folders(cli, repo, isolated_git):
    home = isolated_git
    listed = tree(home, repo)
    run(cli, home, "install", "all", "--scope", "project")
    assert json.loads((repo / ".mcp.json").read_text())["mcpServers"]["subtask"]["command"] == "subtask-mcp"
    assert tomllib.loads((repo / ".codex" / "config.toml").read_text())["mcp_servers"]["subtask"]["command"] == \
        "subtask-mcp"
    run(cli, home, "uninstall", "all", "--scope", "project")
    assert tree(home, repo) == listed


def test_dry_run_shows_the_plan_and_changes_nothing(cli, repo, isolated_git):
    home = isolated_git
    before = person_files(home, repo)
    listed = tree(home, repo)
    shown = run(cli, home, "install", "all", "--dry-run").stdout
    assert "(dry run: nothing changes)" in shown.splitlines()[0]
    assert ("add ~/.claude.json: mcpServers.subtask" in shown
            and "add ~/.codex/config.toml: [mcp_servers.subtask]" in shown)
    assert {p: p.read_bytes() for p in before} == before and tree(home, repo) == listed
    plan = json.loads(run(cli, home, "install", "codex", "--dry-run", "--json").stdout)
    assert plan["v"] == 1 and plan["dry_run"] is True and [s["kind"] for s in plan["steps"]] == ["toml", "file"]


def test_a_persons_own_subtask_entry_is_left_alone_by_install_and_uninstall(cli, repo, isolated_git):
    home = isolated_git
    mine = '{"mcpServers": {"subtask": {"command": "my-own-subtask"}}}\n'
    (home / ".claude.json").write_text(mine)
    shown = run(cli, home, "install", "claude").stdout
    assert "already there, not written by git subtask install: left as it is" in shown
    run(cli, home, "uninstall", "claude")
    assert (home / ".claude.json").read_text() == mine


def test_an_entry_changed_after_install_is_left_and_said(cli, repo, isolated_git):
    home = isolated_git
    person_files(home, repo)
    run(cli, home, "install", "codex")
    config = home / ".codex" / "config.toml"
    config.write_text(config.read_text().replace("tool_timeout_sec = 900", "tool_timeout_sec = 1200"))
    changed = config.read_bytes()
    shown = run(cli, home, "uninstall", "codex").stdout
    assert "was changed since it was installed: left as it is" in shown
    assert config.read_bytes() == changed


def test_a_config_that_does_not_parse_is_refused_and_left_alone(cli, repo, isolated_git):
    home = isolated_git
    broken = home / ".codex" / "config.toml"
    broken.parent.mkdir()
    broken.write_text("[mcp_servers\ncommand = 1\n")
    proc = run(cli, home, "install", "codex", ok=False)
    assert proc.returncode == 128 and "is not valid TOML" in proc.stderr and proc.stderr.startswith("error: ")
    assert broken.read_text() == "[mcp_servers\ncommand = 1\n"
    inline = "mcp_servers = { docs = { command = \"d\" } }\n"  # an inline table no [table] may extend
    broken.write_text(inline)
    proc = run(cli, home, "install", "codex", ok=False)
    assert "cannot be added to it as it is written" in proc.stderr and broken.read_text() == inline


def test_every_changed_file_is_backed_up_first(cli, repo, isolated_git):
    home = isolated_git
    before = person_files(home, repo)
    run(cli, home, "install", "all")
    backups = list((home / ".local" / "state" / "git-subtask" / "backups").iterdir())
    originals = {b.read_bytes() for b in backups}
    assert before[home / ".claude.json"] in originals and before[home / ".codex" / "config.toml"] in originals
    assert all(b.stat().st_mode & 0o777 == 0o600 for b in backups)


def test_claude_on_path_registers_the_user_scope_with_its_own_command(cli, repo, isolated_git, tmp_path):
    """With the claude CLI on PATH, Claude Code writes its own ~/.claude.json (`claude mcp add`);
    uninstall asks it to remove exactly that entry."""
    home = isolated_git
    fake = tmp_path / "fakebin"
    fake.mkdir()
    calls = tmp_path / "claude-calls.jsonl"
    script = fake / "claude"
    script.write_text(f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
open({str(calls)!r}, "a").write(json.dumps(args) + "\\n")
path = os.path.join(os.environ["HOME"], ".claude.json")
data = json.load(open(path)) if os.path.exists(path) else {{}}
if args[:2] == ["mcp", "add"]:
    cmd = args[args.index("--") + 1:]
    data.setdefault("mcpServers", {{}})[args[4]] = {{"type": "stdio", "command": cmd[0], "args": cmd[1:], "env": {{}}}}
elif args[:2] == ["mcp", "remove"]:
    del data["mcpServers"][args[-1]]
json.dump(data, open(path, "w"), indent=2)
""")
    script.chmod(0o755)
    run(cli, home, "install", "claude", with_claude=fake)
    run(cli, home, "uninstall", "claude", with_claude=fake)
    made = [json.loads(line) for line in calls.read_text().splitlines()]
    assert made[0][:6] == ["mcp", "add", "--scope", "user", "subtask", "--"]
    assert made[0][6] == str(Path(BIN_DIR) / "subtask-mcp")
    assert made[1] == ["mcp", "remove", "--scope", "user", "subtask"]
    assert json.loads((home / ".claude.json").read_text())["mcpServers"] == {}


def test_doctor_checks_each_installed_client_with_a_real_handshake(cli, repo, isolated_git):
    home = isolated_git
    person_files(home, repo)
    run(cli, home, "install", "all", "--scope", "project")
    report = json.loads(cli("doctor", "--json", env=env(home)).stdout)
    check = next(c for c in report["checks"] if c["name"] == "mcp clients")
    assert check["status"] == "ok", check  # a project's entry runs `subtask-mcp` from PATH
    assert "claude (project, " in check["message"] and "codex (project, " in check["message"]
    run(cli, home, "uninstall", "all", "--scope", "project")
    run(cli, home, "install", "all")
    report = json.loads(cli("doctor", "--json", env=env(home)).stdout)
    check = next(c for c in report["checks"] if c["name"] == "mcp clients")
    assert check["status"] == "ok", check
    assert ("claude (user, ~/.claude.json)" in check["message"]
            and "codex (user, ~/.codex/config.toml)" in check["message"])
    # An entry whose command no longer starts the server fails, with the command to fix it.
    config = home / ".claude.json"
    config.write_text(config.read_text().replace(str(Path(BIN_DIR) / "subtask-mcp"), "/bin/true"))
    report = json.loads(cli("doctor", "--json", env=env(home)).stdout)
    check = next(c for c in report["checks"] if c["name"] == "mcp clients")
    assert check["status"] == "fail" and "did not answer as git-subtask's server" in check["message"]
    assert check["remediation"] == [
        "git subtask uninstall claude --scope user && git subtask install claude --scope user"]


def test_the_guide_is_package_data_and_the_servers_instructions(cli):
    from subtask.faces.mcp_calls import INSTRUCTIONS
    from subtask.ops.sharing import client_config

    text = client_config.guide_text()
    assert text.startswith("---\nname: git-subtask\ndescription: ")
    assert INSTRUCTIONS in text and "start_many" in INSTRUCTIONS and "merge" in INSTRUCTIONS
    for words in ("one `wait`", "Never\n   poll", "`diff`", "`show`", "`merge`", "verify passed", "stopped"):
        assert words.replace("\n   ", " ") in text.replace("\n   ", " "), words
    assert "subtask/guide/SKILL.md" in (Path(__file__).parents[1] / "pyproject.toml").read_text().replace(
        '"guide/SKILL.md"', "subtask/guide/SKILL.md")


def test_doctor_says_what_to_do_with_a_bare_repository(tmp_path):
    import subprocess

    bare = tmp_path / "bare.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    proc = subprocess.run(["git", "subtask", "doctor", "--json"], cwd=bare, capture_output=True, text=True)
    check = next(c for c in json.loads(proc.stdout)["checks"] if c["name"] == "repository")
    assert check["status"] == "fail" and "git init" not in check["remediation"]
    assert check["remediation"][0].startswith(f"git clone '{bare}' <folder>")


def test_doctor_labels_stay_in_their_column(cli):
    lines = [line for line in cli("doctor").stdout.splitlines() if not line.startswith(" ")]
    starts = {len(line) - len(line[6:].split("  ", 1)[1].lstrip()) for line in lines if "  " in line[6:]}
    assert len(starts) == 1, lines  # every message starts in the same column ("damaged records" is the longest label)
