"""`git subtask install | uninstall`: the MCP server and the agent's guide in Claude Code and Codex.

What goes where, per client and scope (`user`: every project of this user; `project`: the
repository, shared through git):

| client | scope | the server's entry | the guide (subtask/guide/SKILL.md) |
|---|---|---|---|
| claude | user | `claude mcp add -s user` (1) | `~/.claude/skills/git-subtask/SKILL.md` |
| claude | project | `<root>/.mcp.json` `mcpServers.subtask` | `<root>/.claude/skills/git-subtask/SKILL.md` |
| codex | user | `~/.codex/config.toml` (2) `[mcp_servers.subtask]` | `~/.agents/skills/git-subtask/SKILL.md` |
| codex | project | `<root>/.codex/config.toml` `[mcp_servers.subtask]` | `<root>/.agents/skills/git-subtask/SKILL.md` |

(1) when `claude` is on PATH, else `~/.claude.json` (`$CLAUDE_CONFIG_DIR/.claude.json`)
`mcpServers.subtask`. (2) `$CODEX_HOME/config.toml` when `$CODEX_HOME` is set.

An install is planned first (nothing changed), shown, then applied; each step records what it
added in `installs.json` (`$XDG_STATE_HOME/git-subtask`, default `~/.local/state/git-subtask`),
and `uninstall` takes out exactly that.

Invariants:
- Never change a person's text: an install only adds (a JSON member, a marked TOML table, a new
  file), and uninstall removes only what the record says was added, when it is still there as
  written; so install then uninstall leaves a file byte for byte as it was. A JSON file already
  in the canonical two-space layout Claude Code writes stays in it (the member is added and
  removed as data, the file dumped the same way); any other layout gets the member inserted as
  one line of text. When neither is found as written, uninstall says what to remove by hand.
- Never take over an entry a person wrote: a `subtask` entry (or a guide file) that no install
  recorded is left alone, and install says so.
- Back up every file before changing it (`backups/`, 0600), and write it atomically (a temp file
  in the same folder, then rename), keeping its mode.
- A TOML file is edited as text and checked with `tomllib` (the standard library reads TOML but
  cannot write it): the result must parse to the old data plus our table, or nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from subtask.model.dataclass import asdict, dataclass, field
from subtask.model.errors import SubtaskError
from subtask.state.statefiles import ensure_dir, write_json

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any

CLIENTS = ("claude", "codex")
SCOPES = ("user", "project")
NAME = "subtask"  # the server's name in every client's config
SKILL = "git-subtask"  # the guide's folder name
GUIDE = Path(__file__).parents[2] / "guide" / "SKILL.md"  # subtask/guide/SKILL.md
# Codex gives an MCP server only a few of its variables (HOME, PATH, ...): the engines' credentials
# and settings must be named, or jobs on those engines cannot authenticate.
CODEX_ENV_VARS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "CLAUDE_CODE_OAUTH_TOKEN",
                  "CLAUDE_CONFIG_DIR", "OPENAI_API_KEY", "OPENAI_BASE_URL", "CODEX_API_KEY", "CODEX_HOME",
                  "SUBTASK_REPO")
CODEX_TOOL_TIMEOUT = 900  # seconds: a wait runs up to its timeout (300 s by default); Codex's own default is 60
TOML_BEGIN = "# git-subtask install: begin (git subtask uninstall codex removes this table)"
TOML_END = "# git-subtask install: end"


# ---------------------------------------------------------------- where things are

def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "git-subtask"


def record_path() -> Path:
    return state_dir() / "installs.json"


def claude_json() -> Path:
    folder = os.environ.get("CLAUDE_CONFIG_DIR")
    return Path(folder) / ".claude.json" if folder else Path.home() / ".claude.json"


def codex_home() -> Path:
    return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")


def server_config(client: str, scope: str, root: Path | None) -> Path:
    if client == "claude":
        return claude_json() if scope == "user" else _project_root(root) / ".mcp.json"
    return (codex_home() if scope == "user" else _project_root(root) / ".codex") / "config.toml"


def guide_path(client: str, scope: str, root: Path | None) -> Path:
    if client == "claude":
        base = (Path(os.environ["CLAUDE_CONFIG_DIR"]) if os.environ.get("CLAUDE_CONFIG_DIR")
                else Path.home() / ".claude") \
            if scope == "user" else _project_root(root) / ".claude"
    else:
        base = (Path.home() if scope == "user" else _project_root(root)) / ".agents"
    return base / "skills" / SKILL / "SKILL.md"


def server_command(scope: str) -> tuple[str, list[str]]:
    """The command a client runs: for a project (shared with teammates), `subtask-mcp` from PATH;
    for this user, this installation's own, by absolute path (a client's PATH may lack it)."""
    if scope == "project":
        return "subtask-mcp", []
    script = Path(sys.executable).parent / "subtask-mcp"
    if script.is_file() and os.access(script, os.X_OK):
        return str(script), []
    found = shutil.which("subtask-mcp")
    return (found, []) if found else (sys.executable, ["-m", "subtask.faces.mcp_server"])


def entry(client: str, scope: str) -> dict[str, Any]:
    command, args = server_command(scope)
    if client == "claude":
        return {"type": "stdio", "command": command, "args": args, "env": {}}
    return {"command": command, "args": args, "tool_timeout_sec": CODEX_TOOL_TIMEOUT, "env_vars": list(CODEX_ENV_VARS)}


def claude_cli() -> str | None:
    return shutil.which("claude")


# ---------------------------------------------------------------- the record

def read_record() -> list[dict]:
    try:
        data = json.loads(record_path().read_text())
        return [r for r in data.get("installs", []) if isinstance(r, dict)]
    except (OSError, ValueError, AttributeError):
        return []


def write_record(installs: list[dict]) -> None:
    write_json(record_path(), {"v": 1, "installs": installs})


def _same_target(record: dict, client: str, scope: str, path: Path) -> bool:
    return record.get("client") == client and record.get("scope") == scope and record.get("path") == str(path)


# ---------------------------------------------------------------- steps

@dataclass
class Step:
    """One change of one file (or one `claude mcp` call), planned before anything changes."""

    client: str
    scope: str
    kind: str  # json | toml | file | claude-cli
    path: str
    words: str  # the plan, for a person
    new: str | None = None  # the file's whole new text (None: remove the file)
    old: str | None = None  # the file's text now (None: it does not exist)
    record: dict | None = None  # what install records (None: nothing to record, or uninstall)
    argv: list[str] | None = None
    dirs: list[str] = field(default_factory=list)  # folders this step creates (install) or removes (uninstall)


@dataclass
class Plan:
    """The steps of an install or uninstall, planned before anything changes, and what is left alone."""

    steps: list[Step]
    notes: list[str]  # what is left alone, and why

    @property
    def lines(self) -> list[str]:
        return [s.words for s in self.steps] + self.notes

    @property
    def backups(self) -> str:
        """Where the files it changes are backed up, as a person would type it (`~/…`)."""
        return show_path(state_dir() / "backups")

    def to_dict(self) -> dict:
        return {"v": 1, "steps": [{k: v for k, v in asdict(s).items() if k not in ("new", "old", "argv")}
                                  for s in self.steps], "notes": self.notes, "lines": self.lines}


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def _missing_dirs(path: Path) -> list[str]:
    """The folders above `path` that do not exist yet, outermost first."""
    missing = []
    for parent in path.parents:
        if parent.exists():
            break
        missing.append(str(parent))
    return list(reversed(missing))


def show_path(path: Path | str) -> str:
    text, home = str(path), str(Path.home())
    return "~" + text[len(home):] if text == home or text.startswith(home + os.sep) else text


# ---------------------------------------------------------------- JSON (Claude Code)

def _canonical(obj: Any) -> str:
    """The layout Claude Code writes its files in (JSON.stringify with two spaces)."""
    return json.dumps(obj, indent=2, ensure_ascii=False)


def _is_canonical(text: str, obj: Any) -> str | None:
    """The trailing text after the canonical dump when `text` is in that layout, else None."""
    dumped = _canonical(obj)
    if text.startswith(dumped) and text[len(dumped):] in ("", "\n"):
        return text[len(dumped):]
    return None


def _members(text: str, start: int) -> tuple[int, list[tuple[str, int, int, int]]]:
    """The object at `start` ('{'): (its closing brace, [(key, key start, value start, value end)])."""
    decoder = json.JSONDecoder()
    ws = " \t\n\r"
    assert text[start] == "{"
    i = start + 1
    found: list[tuple[str, int, int, int]] = []
    while True:
        while text[i] in ws:
            i += 1
        if text[i] == "}":
            return i, found
        key, end = decoder.raw_decode(text, i)
        j = end
        while text[j] in ws:
            j += 1
        assert text[j] == ":"
        j += 1
        while text[j] in ws:
            j += 1
        _value, value_end = decoder.raw_decode(text, j)
        found.append((key, i, j, value_end))
        i = value_end
        while text[i] in ws:
            i += 1
        if text[i] == ",":
            i += 1


def _insert_member(text: str, brace: int, member: str) -> tuple[str, str]:
    """`text` with `member` ('"key": value') first in the object whose '{' is at `brace`; and the
    exact text inserted (so uninstall can take it out again)."""
    closing, members = _members(text, brace)
    if members:
        lead = text[brace + 1:members[0][1]]  # the whitespace the person put before their first member
        added = f"{lead}{member},"
    else:
        added = member
    return text[:brace + 1] + added + text[brace + 1:], added


def _json_install(client: str, scope: str, path: Path, value: dict) -> tuple[Step | None, str | None]:
    old = _read(path)
    where = f"{show_path(path)}: mcpServers.{NAME}"
    if old is None:
        new = _canonical({"mcpServers": {NAME: value}}) + "\n"
        return Step(client, scope, "json", str(path), f"add {where} (a new file)", new, None,
                    {"created": True, "value": value}, dirs=_missing_dirs(path)), None
    try:
        data = json.loads(old)
    except ValueError as exc:
        raise SubtaskError("fatal", f"{show_path(path)} is not valid JSON ({exc}): not changing it",
                           hint=f"fix it, then: git subtask install {client}") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(data, dict) or ("mcpServers" in data and not isinstance(servers, dict)):
        raise SubtaskError("fatal", f"{show_path(path)} does not hold an object with an mcpServers object: "
                           "not changing it")
    if servers is not None and NAME in servers:
        return None, f"{where} is already there, not written by git subtask install: left as it is"
    made_parent = servers is None
    after = json.loads(old)
    after.setdefault("mcpServers", {})[NAME] = value
    tail = _is_canonical(old, data)
    if tail is not None:
        new, added = _canonical(after) + tail, None
    elif made_parent:
        new, added = _insert_member(old, _first_brace(old), f'"mcpServers": {{"{NAME}": {json.dumps(value)}}}')
    else:
        servers_at = next(v for k, _, v, _ in _members(old, _first_brace(old))[1] if k == "mcpServers")
        new, added = _insert_member(old, servers_at, f'"{NAME}": {json.dumps(value)}')
    if json.loads(new) != after:  # a key given twice, or anything else we did not foresee
        raise SubtaskError("fatal", f"{show_path(path)}: could not add mcpServers.{NAME} without changing its other "
                           "entries: not changing it", hint=f"add it by hand: {json.dumps({NAME: value})}")
    return Step(client, scope, "json", str(path), f"add {where}", new, old,
                {"created": False, "value": value, "added": added, "made_parent": made_parent}), None


def _first_brace(text: str) -> int:
    return len(text) - len(text.lstrip(" \t\n\r\ufeff"))


def _json_uninstall(record: dict, path: Path) -> tuple[Step | None, str | None]:
    old = _read(path)
    where = f"{show_path(path)}: mcpServers.{NAME}"
    if old is None:
        return None, f"{show_path(path)} is gone: nothing to remove"
    try:
        data = json.loads(old)
    except ValueError:
        return None, f"{show_path(path)} is not valid JSON now: remove mcpServers.{NAME} by hand"
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict) or NAME not in servers:
        return Step(record["client"], record["scope"], "json", str(path), f"{where} is gone already", old, old), None
    if servers[NAME] != record.get("value"):
        return None, f"{where} was changed since it was installed: left as it is (remove it by hand)"
    if record.get("created") and data == {"mcpServers": {NAME: record["value"]}} and old == _canonical(data) + "\n":
        return Step(record["client"], record["scope"], "json", str(path), f"remove {show_path(path)} (made by install)",
                    None, old, dirs=record.get("dirs", [])), None
    added = record.get("added")
    if added and old.count(added) == 1:
        new = old.replace(added, "", 1)
    else:
        tail = _is_canonical(old, data)
        if tail is None:
            return None, f"{where} is no longer as it was written: remove it by hand"
        del servers[NAME]
        if record.get("made_parent") and not servers:
            del data["mcpServers"]
        new = _canonical(data) + tail
    check = json.loads(new)
    if NAME in (check.get("mcpServers") or {}):
        return None, f"{where}: could not remove it cleanly: remove it by hand"
    return Step(record["client"], record["scope"], "json", str(path), f"remove {where}", new, old), None


# ---------------------------------------------------------------- TOML (Codex)

def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)  # a TOML basic string takes JSON's escapes


def _toml_block(value: dict) -> str:
    lines = [TOML_BEGIN, f"[mcp_servers.{NAME}]", *(f"{k} = {_toml_value(v)}" for k, v in value.items()), TOML_END]
    return "\n".join(lines) + "\n"


def _toml_install(client: str, scope: str, path: Path, value: dict) -> tuple[Step | None, str | None]:
    old = _read(path)
    where = f"{show_path(path)}: [mcp_servers.{NAME}]"
    before: dict = {}
    if old is not None:
        try:
            before = tomllib.loads(old)
        except tomllib.TOMLDecodeError as exc:
            raise SubtaskError("fatal", f"{show_path(path)} is not valid TOML ({exc}): not changing it",
                               hint=f"fix it, then: git subtask install {client}") from None
        servers = before.get("mcp_servers")
        if isinstance(servers, dict) and NAME in servers:
            return None, f"{where} is already there, not written by git subtask install: left as it is"
    text = old or ""
    lead = "" if not text else "\n" if text.endswith("\n") else "\n\n"
    added = lead + _toml_block(value)
    new = text + added
    try:
        after = tomllib.loads(new)
    except tomllib.TOMLDecodeError:
        after = None
    expected = json.loads(json.dumps(before))
    expected.setdefault("mcp_servers", {})
    if isinstance(expected["mcp_servers"], dict):
        expected["mcp_servers"][NAME] = value
    if after != expected:  # e.g. mcp_servers written as an inline table, which a table cannot extend
        raise SubtaskError("fatal", f"{show_path(path)}: a [mcp_servers.{NAME}] table cannot be added to it as it is "
                           "written: not changing it", hint=f"add it by hand:\n{_toml_block(value)}")
    return Step(client, scope, "toml", str(path), f"add {where}" + (" (a new file)" if old is None else ""), new, old,
                {"created": old is None, "value": value, "added": added},
                dirs=_missing_dirs(path) if old is None else []), None


def _toml_uninstall(record: dict, path: Path) -> tuple[Step | None, str | None]:
    old = _read(path)
    where = f"{show_path(path)}: [mcp_servers.{NAME}]"
    if old is None:
        return None, f"{show_path(path)} is gone: nothing to remove"
    added = record.get("added") or ""
    if not added or old.count(added) != 1:
        if TOML_BEGIN not in old:
            return Step(record["client"], record["scope"], "toml", str(path), f"{where} is gone already",
                        old, old), None
        return None, f"{where} was changed since it was installed: left as it is (remove it by hand)"
    new = old.replace(added, "", 1)
    if record.get("created") and not new.strip():
        return Step(record["client"], record["scope"], "toml", str(path), f"remove {show_path(path)} (made by install)",
                    None, old, dirs=record.get("dirs", [])), None
    return Step(record["client"], record["scope"], "toml", str(path), f"remove {where}", new, old), None


# ---------------------------------------------------------------- the guide (a skill)

def guide_text() -> str:
    return GUIDE.read_text(encoding="utf-8")


def _guide_install(client: str, scope: str, path: Path) -> tuple[Step | None, str | None]:
    text, old = guide_text(), _read(path)
    if old is not None:
        if old == text:
            return None, f"{show_path(path)} is already there: left as it is"
        return None, f"{show_path(path)} exists and is not this version's guide: left as it is"
    return Step(client, scope, "file", str(path), f"add the agent's guide {show_path(path)}", text, None,
                {"created": True, "sha256": hashlib.sha256(text.encode()).hexdigest()},
                dirs=_missing_dirs(path)), None


def _guide_uninstall(record: dict, path: Path) -> tuple[Step | None, str | None]:
    old = _read(path)
    if old is None:
        return None, f"{show_path(path)} is gone: nothing to remove"
    if hashlib.sha256(old.encode()).hexdigest() != record.get("sha256"):
        return None, f"{show_path(path)} was changed since it was installed: left as it is"
    return Step(record["client"], record["scope"], "file", str(path), f"remove {show_path(path)}", None, old,
                dirs=record.get("dirs", [])), None


# ---------------------------------------------------------------- claude mcp add (Claude Code's own writer)

def _claude_cli_install(scope: str, value: dict, cli: str) -> tuple[Step | None, str | None]:
    path = claude_json()
    current = _read(path)
    try:
        servers = (json.loads(current) or {}).get("mcpServers") or {} if current else {}
    except (ValueError, AttributeError):
        servers = {}
    if NAME in servers:
        return None, (f"{show_path(path)}: mcpServers.{NAME} is already there, "
                      "not written by git subtask install: left as it is")
    argv = [cli, "mcp", "add", "--scope", scope, NAME, "--", value["command"], *value["args"]]
    return Step("claude", scope, "claude-cli", str(path), f"run: claude mcp add --scope {scope} {NAME} -- "
                f"{' '.join([value['command'], *value['args']])}", argv=argv,
                record={"value": value, "via": "claude"}), None


def _claude_cli_uninstall(record: dict, cli: str | None) -> tuple[Step | None, str | None]:
    path = claude_json()
    try:
        servers = json.loads(_read(path) or "{}").get("mcpServers") or {}
    except (ValueError, AttributeError):
        servers = {}
    if NAME not in servers:
        return Step("claude", record["scope"], "claude-cli", str(path),
                    f"{show_path(path)}: mcpServers.{NAME} is gone already", argv=[]), None
    value = record.get("value") or {}
    if servers[NAME].get("command") != value.get("command") or servers[NAME].get("args") != value.get("args"):
        return None, f"{show_path(path)}: mcpServers.{NAME} was changed since it was installed: left as it is"
    if cli is None:
        return _json_uninstall(record | {"added": None}, path)
    return Step("claude", record["scope"], "claude-cli", str(path), f"run: claude mcp remove --scope user {NAME}",
                argv=[cli, "mcp", "remove", "--scope", "user", NAME]), None


# ---------------------------------------------------------------- plans

def _clients(which: str) -> tuple[str, ...]:
    if which == "all":
        return CLIENTS
    if which not in CLIENTS:
        raise SubtaskError("usage", f"unknown client {which!r} (claude, codex or all)")
    return (which,)


def _check_scope(scope: str, root: Path | None) -> None:
    if scope not in SCOPES:
        raise SubtaskError("usage", f"unknown scope {scope!r} (user or project)")
    if scope == "project":
        _project_root(root)


def _project_root(root: Path | None) -> Path:
    """The repository a project-scope install goes into; a fatal error outside one."""
    if root is None:
        raise SubtaskError("fatal", "--scope project installs into a repository: run it in one",
                           hint="cd into the project, then: git subtask install --scope project ...")
    return root


def plan_install(which: str, scope: str, root: Path | None) -> Plan:
    _check_scope(scope, root)
    steps, notes = [], []
    installs = read_record()
    for client in _clients(which):
        value = entry(client, scope)
        path = server_config(client, scope, root)
        if any(_same_target(r, client, scope, path) for r in installs):
            notes.append(f"{client}: the server is already installed in {show_path(path)}")
            step, note = None, None
        elif client == "claude" and scope == "user" and (cli := claude_cli()):
            step, note = _claude_cli_install(scope, value, cli)
        elif client == "claude":
            step, note = _json_install(client, scope, path, value)
        else:
            step, note = _toml_install(client, scope, path, value)
        steps += [step] if step else []
        notes += [f"{client}: {note}"] if note else []
        guide = guide_path(client, scope, root)
        if any(_same_target(r, client, scope, guide) for r in installs):
            notes.append(f"{client}: the guide is already installed in {show_path(guide)}")
            continue
        step, note = _guide_install(client, scope, guide)
        steps += [step] if step else []
        notes += [f"{client}: {note}"] if note else []
    return Plan(steps, notes)


def plan_uninstall(which: str, scope: str, root: Path | None) -> Plan:
    _check_scope(scope, root)
    steps, notes = [], []
    clients = _clients(which)
    mine = [r for r in read_record() if r.get("client") in clients and r.get("scope") == scope
            and (scope == "user" or r.get("root") == str(root))]
    for record in mine:
        path = Path(record["path"])
        if record.get("kind") == "claude-cli":
            step, note = _claude_cli_uninstall(record, claude_cli())
        elif record.get("kind") == "json":
            step, note = _json_uninstall(record, path)
        elif record.get("kind") == "toml":
            step, note = _toml_uninstall(record, path)
        else:
            step, note = _guide_uninstall(record, path)
        if step is not None:
            step.record = record
            steps.append(step)
        notes += [f"{record['client']}: {note}"] if note else []
    if not mine:
        notes.append(f"nothing installed by git subtask install for {' and '.join(clients)} ({scope} scope)")
    return Plan(steps, notes)


# ---------------------------------------------------------------- applying

def _backup(path: Path) -> str | None:
    if not path.exists():
        return None

    folder = ensure_dir(state_dir() / "backups")
    target = folder / f"{path.name}.{time.strftime('%Y%m%d-%H%M%S')}.{os.getpid()}.bak"
    shutil.copyfile(path, target)
    os.chmod(target, 0o600)
    return str(target)


def _write(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically, keeping its mode (a new file: 0644, as editors make them)."""
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o644
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _apply(step: Step) -> str | None:
    """Carry out one step; its backup's path, if it changed a file."""
    path = Path(step.path)
    if step.kind == "claude-cli":
        if step.argv:
            proc = subprocess.run(step.argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
            if proc.returncode != 0:
                raise SubtaskError("fatal", f"claude mcp failed (exit {proc.returncode}): "
                                   f"{(proc.stderr or proc.stdout).strip()[:500]}")
        return None
    if step.new == step.old:
        return None
    if _read(path) != step.old:
        raise SubtaskError("negative", f"{show_path(path)} changed while this ran: not changing it",
                           hint="run the command again")
    backup = _backup(path)
    if step.new is None:
        path.unlink()
        for folder in reversed(step.dirs):
            try:
                os.rmdir(folder)
            except OSError:
                break  # not empty (someone's files) or gone: keep it
    else:
        _write(path, step.new)
    return backup


def install(which: str, scope: str, root: Path | None, dry_run: bool = False, on_plan=None) -> Plan:
    """Plan, show (`on_plan(lines)`), then apply and record each step."""
    plan = plan_install(which, scope, root)
    if on_plan is not None:
        on_plan(plan.lines)
    if dry_run:
        return plan
    for step in plan.steps:
        backup = _apply(step)
        record = {"v": 1, "client": step.client, "scope": step.scope, "kind": step.kind, "path": step.path,
                  "root": str(root) if root else None, "at": time.time(), "backup": backup, "dirs": step.dirs,
                  **(step.record or {})}
        write_record([*read_record(), record])
    return plan


def uninstall(which: str, scope: str, root: Path | None, dry_run: bool = False, on_plan=None) -> Plan:
    plan = plan_uninstall(which, scope, root)
    if on_plan is not None:
        on_plan(plan.lines)
    if dry_run:
        return plan
    for step in plan.steps:
        _apply(step)
        done = step.record
        write_record([r for r in read_record() if r != done])
    return plan


# ---------------------------------------------------------------- checking (doctor)

@dataclass
class Installed:
    """One server entry `install` recorded, as the client's config holds it now (`installed`)."""

    client: str
    scope: str
    path: str
    command: str
    args: list[str]
    env: dict[str, str]


def installed() -> list[Installed]:
    """The server entries install recorded, as each client's config holds them now."""
    found = []
    for record in read_record():
        if record.get("kind") not in ("json", "toml", "claude-cli"):
            continue
        path = Path(record["path"])
        value = _entry_now(record["kind"], path)
        if value is None:
            found.append(Installed(record["client"], record["scope"], str(path), "", [], {}))
            continue
        found.append(Installed(record["client"], record["scope"], str(path), str(value.get("command", "")),
                               [str(a) for a in value.get("args") or []], dict(value.get("env") or {})))
    return found


def _entry_now(kind: str, path: Path) -> dict | None:
    text = _read(path)
    if text is None:
        return None
    try:
        if kind == "toml":
            data = tomllib.loads(text).get("mcp_servers") or {}
        else:
            data = json.loads(text).get("mcpServers") or {}
    except (ValueError, AttributeError):
        return None
    value = data.get(NAME)
    return value if isinstance(value, dict) else None


def handshake(item: Installed, cwd: Path | None = None, timeout: float = 30.0) -> str | None:
    """Start the entry's server as the client would and say initialize; None when it answers as
    git-subtask's server with its tools, else what went wrong."""
    if not item.command:
        return f"no mcpServers.{NAME} entry in {show_path(item.path)} any more"
    command = item.command if os.sep in item.command else shutil.which(item.command)
    if command is None:
        return f"{item.command} is not on PATH"
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "git-subtask-doctor", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]
    data = "".join(json.dumps(m) + "\n" for m in messages)
    try:
        proc = subprocess.run([command, *item.args], input=data, capture_output=True, text=True, timeout=timeout,
                              cwd=str(cwd) if cwd else None, env=dict(os.environ, **item.env))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{item.command} did not answer: {exc}"
    replies = {}
    for line in proc.stdout.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            return f"{item.command} wrote something that is not JSON-RPC on stdout: {line[:80]!r}"
        if isinstance(message, dict) and "id" in message:
            replies[message["id"]] = message
    name = ((replies.get(1) or {}).get("result") or {}).get("serverInfo", {}).get("name")
    tools = {t.get("name") for t in ((replies.get(2) or {}).get("result") or {}).get("tools", [])}
    if name != NAME or "merge" not in tools:
        return f"{item.command} did not answer as git-subtask's server (exit {proc.returncode}): " \
               f"{proc.stderr.strip()[-200:] or 'no reply'}"
    return None


