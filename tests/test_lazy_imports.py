"""Imports inside functions: each one has a reason, and the reasons are data (issue 41).

An import belongs at the top of its module, where a reader sees what the module depends on. It
sits inside a function only where loading it at the top would cost a hot path start-up time that
was measured (`python -X importtime`; the budgets of tests/test_imports.py), and then one of the
rules below or a row of `LAZY` says why:

- heavy: a third-party library that costs tens of ms to import (pygit2 ~60 ms, click ~40 ms, the
  MCP and agent SDKs, Ray, filelock ~30 ms);
- reading path: a module the reading commands load imports, inside a function, a module outside a
  reading command's budget in tests/test_imports.py (`OURS`, `EXTRA`, `DIRECT`);
- standard library only: a module whose docstring promises the standard library only at module
  level (it is imported before anything else, e.g. by the MCP front end or the fork server);
- the MCP front end (`faces/mcp_server`), which answers `initialize` before it imports the SDK;
- a lazy registry, which imports a command, an operation or an engine when it is asked for
  (`entry`, `faces/commands`, `faces/output`, the `engines` package);
- `LAZY`: the rest, one row per (module, imported module) with a one-line reason. "not loaded by
  X" means that `X` (measured) loads the module but not what it imports here.

A new function-level import that no rule or row explains fails here; so does a row that no longer
matches one (stale) or that a rule already explains.
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

from test_imports import DIRECT, DIRECT_EXTRA, EXTRA, OURS
from test_layers import modules

HEAVY = {"pygit2", "mcp", "mcp_types", "claude_agent_sdk", "anyio", "pydantic", "ray", "filelock", "click"}
REGISTRIES = {"subtask.entry", "subtask.faces.output", "subtask.faces.commands", "subtask.engines"}
MCP_FRONT_END = "subtask.faces.mcp_server"

# (module, the module it imports inside a function): why there. Every row is checked against the
# code (stale rows fail). "start" is `git subtask start` of a shell job, "the worker" a shell
# job's worker started with SUBTASK_SPAWN=exec, "a click command" `git subtask diff`.
LAZY: dict[tuple[str, str], str] = {
    ("subtask.api", "subtask.proc.spawn"): "not loaded by the click CLI's import",
    ("subtask.api.admin", "subtask.engines"): "not loaded by cleanup",
    ("subtask.api.admin", "subtask.ops.plans.waiting"): "not loaded by cleanup",
    ("subtask.api.admin", "subtask.ops.running.disk"): "not loaded by cleanup",
    ("subtask.api.admin", "subtask.ops.running.notify"): "not loaded by cleanup",
    ("subtask.api.admin", "subtask.ops.sharing.client_config"): "not loaded by cleanup",
    ("subtask.api.admin", "subtask.ops.sharing.hooks"): "not loaded by cleanup",
    ("subtask.api.admin", "subtask.ops.sharing.sync"): "not loaded by cleanup",
    ("subtask.api.groups", "shlex"): "not loaded by start",
    ("subtask.api.landing", "subtask.api.waiting"): "not loaded by start, a click command",
    ("subtask.api.landing", "subtask.ops.landing.land"): "not loaded by start, a click command",
    ("subtask.api.landing", "subtask.ops.landing.landed"): "not loaded by start",
    ("subtask.api.landing", "subtask.ops.landing.lineup"): "not loaded by start, a click command",
    ("subtask.api.landing", "subtask.ops.landing.merge"): "not loaded by start, a click command",
    ("subtask.api.landing", "subtask.ops.landing.overlap"): "not loaded by start, a click command",
    ("subtask.api.landing", "subtask.ops.landing.record_check"): "not loaded by start, a click command",
    ("subtask.api.landing", "tempfile"): "not loaded by a click command",
    ("subtask.api.launching", "subtask.api.groups"): "one job: groups, landing, replying (~2 ms): --best-of only",
    ("subtask.api.launching", "subtask.worker.remote"): "not loaded by start",
    ("subtask.api.read", "subtask.words"): "not loaded by a click command",
    ("subtask.api.replying", "subtask.engines"): "not loaded by a click command",
    ("subtask.api.replying", "subtask.ops.landing.landed"): "not loaded by start",
    ("subtask.api.replying", "subtask.ops.plans.waiting"): "not loaded by a click command",
    ("subtask.api.starting", "subtask.engines"): "not loaded by a click command, cleanup",
    ("subtask.api.starting", "subtask.engines.base"): "not loaded by a click command, cleanup",
    ("subtask.api.starting", "subtask.git.checks"): "not loaded by start, a click command, cleanup",
    ("subtask.api.starting", "subtask.git.harness_rule"): "not loaded by start, a click command",
    ("subtask.api.starting", "subtask.git.signing"): "not loaded by start, a click command, cleanup",
    ("subtask.api.starting", "subtask.ops.plans.waiting"): "not loaded by a click command, cleanup",
    ("subtask.api.starting", "subtask.ops.running.routing"): "not loaded by start, a click command, cleanup",
    ("subtask.api.starting", "subtask.proc.isolation"): "not loaded by a click command, cleanup",
    ("subtask.api.starting", "subtask.proc.landlock"): "not loaded by a click command, cleanup",
    ("subtask.engines.base", "tempfile"): "not loaded by start, the worker (an engine run on its own only)",
    ("subtask.engines.shell", "shutil"): "not loaded by start (the probe: doctor)",
    ("subtask.engines.shell", "subprocess"): "not loaded by start (the probe: doctor)",
    ("subtask.engines.shell", "subtask.proc.procs"): "not loaded by start",
    ("subtask.faces.cli", "subprocess"): "not loaded by the click CLI's import",
    ("subtask.faces.cli", "subtask.faces.completion"): "not loaded by a click command, the click CLI's import",
    ("subtask.faces.cli", "subtask.faces.manpage"): "not loaded by the click CLI's import",
    ("subtask.faces.cli", "subtask.faces.mcp_server"): "not loaded by a click command, the click CLI's import",
    ("subtask.faces.cli", "subtask.faces.replies"): "not loaded by a click command, the click CLI's import",
    ("subtask.faces.cli", "subtask.model.faults"): "not loaded by the click CLI's import",
    ("subtask.faces.cli", "subtask.model.job"): "not loaded by the click CLI's import",
    ("subtask.faces.cli", "subtask.words"): "not loaded by a click command, the click CLI's import",
    ("subtask.faces.jsonrpc", "json"): "not loaded by the MCP front end until its first reply (json loads re: ~9 ms)",
    ("subtask.faces.manpage", "html"): "not loaded by a click command",
    ("subtask.git.checks", "ast"): "not loaded by the worker of a plain job (no verify: no checks run)",
    ("subtask.git.harness", "hashlib"): "not loaded by the worker (a harness asked for, a blob's id)",
    ("subtask.git.harness", "tomllib"): "not loaded by the worker, cleanup",
    ("subtask.git.harness_rule", "subtask.git.checks"): "not loaded by cleanup",
    ("subtask.git.notes", "subtask.git.signing"): "not loaded by the worker, cleanup",
    ("subtask.git.records", "subtask.words"): "not loaded by a click command",
    ("subtask.git.worktrees", "shutil"): "not loaded by a click command",
    ("subtask.ops.landing.verified", "hashlib"): "not loaded by the worker (a verify's key)",
    ("subtask.ops.landing.verified", "subtask.git.signing"): "not loaded by the worker",
    ("subtask.ops.plans.groups", "subtask.ops.landing.cleanup"): "not loaded by the worker",
    ("subtask.ops.plans.groups", "subtask.ops.landing.landed"): "not loaded by the worker",
    ("subtask.ops.plans.groups", "subtask.ops.landing.merge"): "not loaded by the worker",
    ("subtask.ops.plans.waiting", "subtask.ops.plans.groups"): "not loaded by start",
    ("subtask.ops.running.lifecycle", "subtask.git.notes"): "not loaded by start, a click command",
    ("subtask.ops.running.lifecycle", "subtask.git.notes_store"): "not loaded by start, a click command",
    ("subtask.ops.running.lifecycle", "subtask.ops.landing.overlay"): "not loaded by start, a click command",
    ("subtask.ops.running.lifecycle", "subtask.ops.running.notify"): "not loaded by start, a click command, cleanup",
    ("subtask.ops.running.lifecycle", "subtask.proc.procs"): "not loaded by start, a click command, cleanup",
    ("subtask.ops.running.lifecycle", "subtask.words"): "not loaded by a click command",
    ("subtask.ops.running.notify", "tempfile"): "not loaded by the worker (a notify command's run only)",
    ("subtask.ops.running.spending", "datetime"): "not loaded by start (a paid job's reservation)",
    ("subtask.proc.isolation", "pathlib"): "not loaded by start (~3 ms with urllib.parse: the worker's view of a job)",
    ("subtask.proc.isolation", "ctypes"): "not loaded by start (a launcher's parent-death signal)",
    ("subtask.proc.isolation", "shutil"): "not loaded by start (a sandbox's own folder removed)",
    ("subtask.proc.isolation", "subtask.proc.context"): "not loaded by start",
    ("subtask.proc.isolation", "subtask.proc.view"): "not loaded by start (the worker's view of a job)",
    ("subtask.proc.isolation", "tempfile"): "not loaded by start, the worker (a verify run again, a judge)",
    ("subtask.proc.landlock", "ctypes"): "not loaded by start (a kernel call: the worker's ruleset, a probe)",
    ("subtask.proc.namespaces", "ctypes"): "not loaded by start (the worker's namespaces)",
    ("subtask.proc.namespaces", "subtask.proc.view"): "not loaded by start (the worker's view of a job)",
    ("subtask.state.ledger", "datetime"): "not loaded by start (a charge's or a reservation's time)",
    ("subtask.state.ports", "_socket"): "not loaded by start, a click command, cleanup",
    ("subtask.worker.attempt", "subtask.ops.plans.groups"): "not loaded by the worker (a group member's only)",
    ("subtask.worker.attempt", "traceback"): "not loaded by the worker (a crash's only)",
    ("subtask.worker.engine", "traceback"): "not loaded by the worker (an engine's crash only)",
    ("subtask.worker.zygote", "ctypes"): "runs in the forked zygote, not in the MCP server that imports this",
    ("subtask.worker.zygote", "subprocess"): "the preload itself: loaded in the zygote, for its workers",
    ("subtask.worker.zygote", "traceback"): "only when the zygote or one of its workers fails",
}


def _module_of(base: str, name: str, known: set[str]) -> str:
    return f"{base}.{name}" if f"{base}.{name}" in known else base


@cache
def function_imports() -> frozenset[tuple[str, str]]:
    """Every (module of ours, module it imports) where the import statement sits in a function."""
    found: set[tuple[str, str]] = set()
    mods = modules()
    known = set(mods)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for func in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Import):
                    found.update((name, alias.name) for alias in node.names)
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                        base = ".".join([*anchor, base] if base else anchor)
                    found.update((name, _module_of(base, alias.name, known)) for alias in node.names)
    return frozenset(found)


@cache
def _standard_library_only() -> frozenset[str]:
    docstrings = {name: ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
                  for name, path in modules().items()}
    return frozenset(name for name, text in docstrings.items() if "standard library only" in text.lower())


def _ours(module: str) -> bool:
    return module == "subtask" or module.startswith("subtask.")


def _over_a_reading_budget(module: str, target: str) -> bool:
    for command, extra in EXTRA.items():
        if module in OURS | extra:
            if _ours(target) and target not in OURS | extra:
                return True
            if not _ours(target) and target.split(".")[0] not in DIRECT | DIRECT_EXTRA.get(command, set()) \
                    and target.split(".")[0] not in sys.builtin_module_names:
                return True
    return False


def rule_for(module: str, target: str, stdlib_only: frozenset[str]) -> str | None:
    """The rule that explains a function-level import, or None."""
    if target.split(".")[0] in HEAVY:
        return "heavy"
    if module in stdlib_only and target.split(".")[0] not in sys.stdlib_module_names:
        return "standard library only"
    if module == MCP_FRONT_END:
        return "MCP front end"
    if module in REGISTRIES or module.startswith("subtask.faces.commands."):
        return "registry"
    if _over_a_reading_budget(module, target):
        return "reading path"
    return None


def unexplained(found: frozenset[tuple[str, str]], table: dict[tuple[str, str], str]) -> list[str]:
    stdlib_only = _standard_library_only()
    return [f"{m} imports {t} inside a function" for m, t in sorted(found)
            if (m, t) not in table and rule_for(m, t, stdlib_only) is None]


def stale(found: frozenset[tuple[str, str]], table: dict[tuple[str, str], str]) -> list[str]:
    stdlib_only = _standard_library_only()
    return [f"{m} -> {t}: " + ("no such import inside a function" if (m, t) not in found
                               else f"already explained ({rule_for(m, t, stdlib_only)})")
            for m, t in sorted(table) if (m, t) not in found or rule_for(m, t, stdlib_only) is not None]


def test_every_function_level_import_has_a_reason():
    assert unexplained(function_imports(), LAZY) == [], \
        "move the import to the top of the module, or say why it costs a hot path in LAZY"


def test_every_row_of_the_table_matches_an_import():
    assert stale(function_imports(), LAZY) == []


def test_the_check_finds_a_new_import_and_a_stale_row():
    """The checker itself: an import the rules do not explain is named, a heavy one is not, and a
    row for an import that is gone (or that a rule explains) is stale."""
    found = function_imports() | {("subtask.git.records", "subtask.state.paths"), ("subtask.git.records", "pygit2")}
    assert unexplained(found, LAZY) == ["subtask.git.records imports subtask.state.paths inside a function"]
    assert stale(found, {**LAZY, ("subtask.git.records", "subtask.git.chains"): "gone"}) \
        == ["subtask.git.records -> subtask.git.chains: no such import inside a function"]
    assert stale(found, {**LAZY, ("subtask.git.records", "pygit2"): "twice"}) \
        == ["subtask.git.records -> pygit2: already explained (heavy)"]


def test_the_rules_see_the_package():
    """Guards against a rule that explains nothing because a name moved."""
    assert {"subtask.faces.mcp_versions", "subtask.worker.zygote"} <= _standard_library_only()
    assert MCP_FRONT_END in modules() and REGISTRIES <= set(modules())
    assert Path(modules()["subtask.git.gitrepo"]).exists()
