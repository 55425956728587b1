"""The engine registry: built-ins, `command` engines from git config, and entry points.

Built-ins are imported only when asked for, so the CLI never pays for `claude_agent_sdk` unless a
claude job runs. Third-party engines register under the entry point group `subtask.engines`
(name -> a class or factory taking no arguments). A name configured as
`git config subtask.engine.<name>.command` is a `command` engine.
"""

from __future__ import annotations

from collections.abc import Callable

from subtask.engines.base import Engine
from subtask.model.errors import SubtaskError

BUILTIN = ("shell", "claude", "codex", "command")
ENTRY_POINT_GROUP = "subtask.engines"

ConfigReader = Callable[[str], "str | None"]


def _builtin(name: str, config: ConfigReader) -> Engine:
    if name == "shell":
        from subtask.engines.shell import ShellEngine

        return ShellEngine()
    if name == "claude":
        from subtask.engines.claude import ClaudeEngine

        return ClaudeEngine()
    if name == "codex":
        from subtask.engines.codex import CodexEngine

        return CodexEngine(config)
    from subtask.engines.command import CommandEngine

    return CommandEngine(name, config)


def _entry_points() -> dict:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def configured_command_engines(config_names: list[str]) -> list[str]:
    """Names with a `subtask.engine.<name>.command` setting, from a list of config keys."""
    names = []
    for key in config_names:
        parts = key.split(".")
        if len(parts) == 4 and parts[0] == "subtask" and parts[1] == "engine" and parts[3] == "command":
            names.append(parts[2])
    return names


def get_engine(name: str, config: ConfigReader, known_commands: list[str] | None = None) -> Engine:
    """The engine called `name`, or a usage error that lists the known ones."""
    if name in BUILTIN:
        return _builtin(name, config)
    if config(f"engine.{name}.command") is not None:
        from subtask.engines.command import CommandEngine

        return CommandEngine(name, config)
    eps = _entry_points()
    if name in eps:
        factory = eps[name].load()
        return factory()
    known = sorted(set(BUILTIN) | set(known_commands or []) | set(eps))
    raise SubtaskError("usage", f"unknown engine '{name}' (known: {', '.join(known)})",
                       hint="git subtask engines")


def plugin_names() -> list[str]:
    """The engines other packages register (`subtask.engines` entry points), ours aside."""
    return [name for name in _entry_points() if name not in BUILTIN]


def settings_reader(engine: Engine, config) -> ConfigReader:
    """How `engine` reads `subtask.*`: ours through the table of settings (a key outside it is a
    bug here); an engine from another package also its own `engine.<name>.*` keys."""
    if type(engine).__module__.startswith("subtask."):
        return config
    return config.for_engine_plugin(engine.name)


def engine_names(known_commands: list[str] | None = None) -> list[str]:
    names = list(BUILTIN) + [n for n in (known_commands or []) if n not in BUILTIN]
    names += [n for n in _entry_points() if n not in names]
    return names
