"""Every `subtask.*` setting is a row of one table (`subtask/model/config.py`, `SETTINGS`): the
code reads no key outside it, `start` refuses a bad value (exit 128, the key and the fix named)
before it makes anything, `doctor` checks each value and names keys nobody reads, and the man
page and README show the table itself."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest
from conftest import git, make_repo, refs

from subtask.model import config

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "subtask"


# ---------------------------------------------------------------- the code reads only the table

READERS = {"get", "number", "integer", "size", "flag", "choice", "remember", "config", "_config", "_key"}
KEY_TEXT = re.compile(r"(?<![\w/.-])subtask\.([A-Za-z][\w<>]*(?:\.[\w<>-]+)*)")


def _text(node: ast.expr) -> str | None:
    """A string literal, or an f-string with each `{…}` read as `<name>`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "<name>"
                       for part in node.values)
    return None


def _is_module(dotted: str) -> bool:
    """`subtask.worker.attempt`, `subtask.engines`: a module of ours (or its attribute)."""
    first = dotted.split(".")[0]
    ours = PACKAGE.joinpath(first).with_suffix(".py").exists() or PACKAGE.joinpath(first).is_dir()
    return ours and not config.row(dotted)


def keys_read(path: Path) -> list[tuple[int, str]]:
    """(line, key) for each `subtask.*` key the module names: a literal given to a config reader
    (`repo.config.number("stallAfter")`, `ctx.config(f"engine.{name}.path")`, a command engine's
    `self._key("costPattern")`), and every `subtask.<key>` in its strings (reads by pygit2
    `get_multivar`, hints, messages)."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = (func.attr if isinstance(func, ast.Attribute)
                    else func.id if isinstance(func, ast.Name) else "")
            owner = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
            text = _text(node.args[0])
            if text is None or name not in READERS or text.startswith("subtask."):
                pass
            elif name == "_key":
                found.append((node.lineno, f"engine.<name>.{text}"))
            elif name in ("config", "_config") or owner.endswith("config"):
                found.append((node.lineno, text))
        text = _text(node) if isinstance(node, (ast.Constant, ast.JoinedStr)) else None
        for match in KEY_TEXT.finditer(text or ""):
            key = match.group(1).rstrip(".")
            if not _is_module(key):
                found.append((node.lineno, key))
    return found


def test_every_setting_the_code_names_is_a_row_of_the_table():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "config.py" and path.parent.name == "model":
            continue
        for line, key in keys_read(path):
            if "<name>" in key.split(".")[-1]:
                continue  # the name itself is variable: the runtime check in Config.get covers it
            table_key = config.row(key)
            old_names = config.SETTINGS[table_key].old_names if table_key else ()
            if table_key is None or any(key.lower() == old.lower() for old in old_names):
                missing.append(f"{path.relative_to(ROOT)}:{line}: subtask.{key}")
    assert missing == [], "keys outside subtask/model/config.py SETTINGS:\n" + "\n".join(missing)


def test_the_scan_sees_the_reads_it_must_see():
    """The scan above finds reads written each way the code writes them (a scan that finds nothing
    passes whatever the code reads)."""
    keys = {key for path in PACKAGE.rglob("*.py") for _, key in keys_read(path)}
    for expected in ("stallAfter", "git.checks", "landTarget", "engine.<name>.command",
                     "engine.<name>.costPattern", "engine.codex.sandbox", "engine.claude.cliPath",
                     "isolation.writable", "ray.env", "engine.<name>.exclude", "sign", "cloneId", "pool",
                     "poolMaxBytes"):
        assert expected in keys, expected


def test_reading_a_key_outside_the_table_is_a_programming_error():
    settings = config.Config(config.GitSettings({"subtask.checkz": "none"}))
    with pytest.raises(KeyError, match="subtask.checkz"):
        settings.get("checkz")
    with pytest.raises(KeyError, match="subtask.checks"):  # an old name: read through the new one
        settings.get("checks")
    assert settings.get("engine.aider.costPattern") is None  # a patterned row: any engine's name
    assert settings.get("stallAfter") == "600"


def test_every_default_in_the_table_is_a_value_the_table_accepts():
    for key, setting in config.SETTINGS.items():
        assert setting.meaning and setting.kind in config.KINDS, key
        if setting.default is not None:
            assert config.value_problem(key, setting.default) is None, key


def test_the_table_names_the_words_the_code_accepts():
    from subtask.executors import EXECUTORS
    from subtask.git import checks
    from subtask.proc import isolation

    assert config.SETTINGS["executor"].words == EXECUTORS
    assert config.SETTINGS["isolation"].words == isolation.MODES
    assert config.SETTINGS["git.checks"].default == checks.DEFAULT


# ---------------------------------------------------------------- start refuses a bad value

def leftovers(repo: Path) -> dict:
    """What a start could leave: refs, branches, worktrees, the state folder's files, the config."""
    common = Path(git(repo, "rev-parse", "--git-common-dir"))
    common = common if common.is_absolute() else repo / common
    state = common / "subtask"
    files = sorted(str(p.relative_to(state)) for p in state.rglob("*") if p.is_file())
    return {"refs": refs(repo), "branches": git(repo, "branch", "--list", "--all"),
            "worktrees": git(repo, "worktree", "list", "--porcelain"),
            "state": [f for f in files if not f.endswith(".lock")],
            "slots": (state / "slots.json").read_text() if (state / "slots.json").exists() else "",
            "ledger": (state / "ledger.jsonl").read_text() if (state / "ledger.jsonl").exists()
            else "",
            "config": (common / "config").read_text()}


BAD = [
    ("stallAfter", "-1"),
    ("stallAction", "explode"),
    ("sign", "sometimes"),
    ("maxRunning", "0"),
    ("maxRunning", "2.5"),
    ("monthlyCapUsd", "lots"),
    ("verifyTimeout", "0"),
    ("stopGrace", "nan"),
    ("deleteLandedBranches", "maybe"),
    ("packLooseObjects", "-5"),
    ("portBase", "70000"),
    ("git.checks", "no-test-delete"),
    ("git.checks", "paths=/etc/**"),
    ("checks", "no-suppresion"),  # the old name is still read, so still checked
    ("isolation", "jail"),
    ("isolation.network", "sometimes"),
    ("executor", "moon"),
    ("engine", "nosuchengine"),
    ("cloneId", "mine"),
    ("ray.resources", "[1, 2]"),
    ("pool", "-1"),
    ("poolMaxBytes", "2 GB"),
]


@pytest.mark.parametrize("key, value", BAD, ids=[f"{k}={v}" for k, v in BAD])
def test_start_refuses_a_bad_setting_naming_it_and_makes_nothing(cli, repo, key, value):
    cli.ok("list")  # the state folder as any earlier command leaves it
    git(repo, "config", f"subtask.{key}", value)
    before = leftovers(repo)
    proc = cli("start", "--verify", "true", "echo hi > hi.txt")
    assert proc.returncode == 128, proc.stdout + proc.stderr
    assert f"subtask.{key}" in proc.stderr and repr(value) in proc.stderr, proc.stderr
    assert "hint: git config " in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert leftovers(repo) == before


def test_reply_refuses_a_bad_setting_before_its_attempt(cli, repo):
    job = cli.start("echo hi > hi.txt")
    cli.ok("wait", job)
    git(repo, "config", "subtask.stallAfter", "-1")
    before = leftovers(repo)
    proc = cli("reply", job, "echo more >> hi.txt")
    assert proc.returncode == 128 and "subtask.stallAfter" in proc.stderr, proc.stderr
    assert leftovers(repo) == before
    assert len(cli.json("show", job)["state_detail"]["attempts"]) == 1


def test_a_bad_setting_of_the_jobs_engine_is_refused_and_another_engines_is_not(cli, repo):
    argv = json.dumps([sys.executable, "-c", "print('hi')"])
    git(repo, "config", "subtask.engine.agent.command", argv)
    git(repo, "config", "subtask.engine.agent.costPattern", "cost: ([0-9.]+")
    before = leftovers(repo)
    proc = cli("start", "--engine", "agent", "do it")
    assert proc.returncode == 128, proc.stderr
    assert "subtask.engine.agent.costPattern" in proc.stderr and "regular expression" in proc.stderr
    assert leftovers(repo) == before
    cli.ok("wait", cli.start("echo hi > hi.txt"))  # a shell job does not read it


def test_best_of_and_map_refuse_a_bad_setting_too(cli, repo):
    git(repo, "config", "subtask.stallAction", "explode")
    before = leftovers(repo)
    for args in (["start", "--best-of", "2", "--verify", "true", "true"],
                 ["map", "README.md", "cat {files}"]):
        proc = cli(*args)
        assert proc.returncode == 128 and "subtask.stallAction" in proc.stderr, (args, proc.stderr)
    assert leftovers(repo) == before


def test_a_bad_setting_is_refused_over_mcp_in_the_same_words(repo, monkeypatch):
    import anyio
    from mcp import Client

    from subtask.faces.mcp_server import server

    git(repo, "config", "subtask.sign", "sometimes")
    monkeypatch.chdir(repo)
    before = leftovers(repo)

    async def main():
        async with Client(server, mode="legacy") as client:
            return await client.call_tool("start", {"task": "true"})

    result = anyio.run(main)
    assert result.is_error and "subtask.sign" in result.content[0].text
    assert leftovers(repo) == before


# ---------------------------------------------------------------- doctor

def settings_check(cli) -> dict:
    proc = cli("doctor", "--json")
    return next(c for c in json.loads(proc.stdout)["checks"] if c["name"] == "settings")


def test_doctor_checks_every_setting_and_says_each_fix(cli, repo):
    assert settings_check(cli)["status"] == "ok"
    for key, value in BAD:
        if key not in ("checks", "engine"):
            git(repo, "config", f"subtask.{key}", value)
    found = settings_check(cli)
    assert found["status"] == "fail"
    for key, _ in BAD:
        if key not in ("checks", "engine"):
            assert re.search(rf"subtask\.{re.escape(key)}[ :]", found["message"]), key
            assert any(step.startswith(f"git config subtask.{key} ") or f"subtask.{key}" in step
                       for step in found["remediation"]), key


def test_doctor_names_a_key_nobody_reads_and_the_nearest_known_one(cli, repo):
    git(repo, "config", "subtask.stalAfter", "5")
    git(repo, "config", "subtask.engine.aider.costpatern", "x")
    found = settings_check(cli)
    assert found["status"] == "warn", found
    # git prints a key's name in lower case: the name as typed is lost before we see it
    assert "subtask.stalafter" in found["message"] and "subtask.stallAfter" in found["message"]
    assert "subtask.engine.aider.costPattern" in found["message"]
    cli.ok("wait", cli.start("true"))  # unknown keys are named, not refused (git does the same)


def test_doctor_says_subtask_checks_is_the_old_name(cli, repo):
    git(repo, "config", "subtask.checks", "no-suppression")
    found = settings_check(cli)
    assert found["status"] == "warn" and "subtask.git.checks" in found["message"], found
    assert any("subtask.git.checks" in step for step in found["remediation"])


# ---------------------------------------------------------------- subtask.git.checks

def test_a_paths_check_in_subtask_git_checks_is_run(cli, repo):
    git(repo, "config", "subtask.git.checks", "no-test-deletion,paths=docs/**")
    job = cli.start("echo x > outside.txt", "--verify", "true")
    cli("wait", job)
    shown = cli.json("show", job)
    assert shown["spec"]["checks"] == ["no-test-deletion", "paths=docs/**"]
    attempt = shown["state_detail"]["attempts"][0]
    assert attempt["state"] == "failed" and attempt["error_kind"] == "check", attempt


def test_the_old_name_subtask_checks_is_still_read_and_the_new_one_wins(cli, repo):
    git(repo, "config", "subtask.checks", "no-suppression")
    old = cli.start("true", "--verify", "true")
    assert cli.json("show", old)["spec"]["checks"] == ["no-suppression"]
    git(repo, "config", "subtask.git.checks", "none")
    new = cli.start("true", "--verify", "true")
    assert cli.json("show", new)["spec"]["checks"] == []
    cli.ok("wait", old, new)


# ---------------------------------------------------------------- a failed check's hint

def test_a_failed_paths_check_hints_the_paths_it_needed_and_keeps_the_other_checks(cli, repo):
    job = cli.start("echo x > outside.txt", "--verify", "true", "--check", "paths=docs/**")
    cli("wait", job)
    attempt = cli.json("show", job)["state_detail"]["attempts"][0]
    assert attempt["error_kind"] == "check"
    hint = attempt["hint"]
    assert "--check none" not in hint, hint
    assert "--check 'paths=docs/**'" in hint and "--check paths=outside.txt" in hint, hint


def test_a_failed_test_deletion_check_hints_dropping_only_that_check(tmp_path, cli):
    repo = make_repo(tmp_path / "tests-repo", {"test_a.py": "def test_a():\n    assert True\n"})
    from conftest import Cli

    run = Cli(repo)
    job = run.start("git rm -q test_a.py && git commit -qm drop", "--verify", "true")
    run("wait", job)
    attempt = run.json("show", job)["state_detail"]["attempts"][0]
    assert attempt["error_kind"] == "check", attempt
    assert "--check none --check no-suppression" in attempt["hint"], attempt["hint"]


# ---------------------------------------------------------------- an engine from another package

GREETER = '''
from subtask.engines.base import Outcome, Probe


class Greeter:
    """An engine another package registers: it reads a setting of its own and one of ours."""
    name = "greeter"
    paid = False
    isolation = "none of its own"

    def probe(self):
        return Probe(self.name, True, True, "1.0", False, self.isolation)

    def run(self, ctx):
        words = f"{ctx.config('engine.greeter.greeting')} {ctx.config('stallAfter')}"
        (ctx.worktree / "greeting.txt").write_text(words + "\\n")
        return Outcome(True, summary=words)
'''


def test_an_engine_from_another_package_reads_its_own_keys_and_doctor_leaves_them_to_it(
        cli, repo, tmp_path, monkeypatch):
    site = tmp_path / "site"
    info = site / "greeter-1.0.dist-info"
    info.mkdir(parents=True)
    (site / "greeter.py").write_text(GREETER)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: greeter\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[subtask.engines]\ngreeter = greeter:Greeter\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    git(repo, "config", "subtask.engine.greeter.greeting", "hello")
    job = cli.start("greet", "--engine", "greeter")
    cli("wait", job)
    shown = cli.json("show", job)
    assert shown["state"] == "done", shown["state_detail"]
    assert git(repo, "show", f"subtask/{job}:greeting.txt") == "hello 600"
    assert settings_check(cli)["status"] == "ok"
