"""The shape of the code: subtask's modules import in one direction, down the layers of
docs/architecture.md ("Layers"), with no import cycle, counting imports inside functions too.

A cycle (e.g. the worker importing `api`, which spawns workers) makes every module in it depend
on every other: the worker would load the operations above it, and no layer could be read, tested
or changed without the rest. Keep LAYERS and the picture in docs/architecture.md the same.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_until

PACKAGE = Path(__file__).resolve().parent.parent / "subtask"

# Top first. A module may import modules of its own layer or of a lower one, never a higher one.
LAYERS: list[tuple[str, set[str]]] = [
    ("entry", {"subtask.__main__", "subtask.entry"}),
    ("faces", {"subtask.cli", "subtask.completion", "subtask.manpage",
               "subtask.mcp_server", "subtask.mcp_tools", "subtask.mcp_versions", "subtask.replies"}),
    ("reports", {"subtask.doctor"}),
    ("api", {"subtask.api"}),
    ("worker", {"subtask.worker", "subtask.zygote", "subtask.retries"}),
    ("operations", {"subtask.landing", "subtask.sync", "subtask.books", "subtask.hooks", "subtask.lifecycle",
                    "subtask.stall", "subtask.reverify", "subtask.recheck", "subtask.integrate", "subtask.landqueue",
                    "subtask.reconcile", "subtask.overlap",
                    "subtask.groups", "subtask.admission", "subtask.plans", "subtask.executors.ray",
                    "subtask.executors.remote", "subtask.clients"}),
    ("executor", {"subtask.spawn", "subtask.procs", "subtask.isolation", "subtask.namespaces", "subtask.engines",
                  "subtask.engines.claude", "subtask.engines.codex", "subtask.engines.command",
                  "subtask.engines.shell"}),
    ("storage", {"subtask.records", "subtask.notes", "subtask.notes_store", "subtask.slots", "subtask.ledger",
                 "subtask.liveness", "subtask.statefiles", "subtask.jobenv", "subtask.privatetext",
                 "subtask.worktrees", "subtask.gitrepo", "subtask.gitobjects", "subtask.packing", "subtask.render",
                 "subtask.ownership", "subtask.signing", "subtask.checks", "subtask.ports",
                 "subtask.engines.base"}),
    ("base", {"subtask", "subtask.model", "subtask.config", "subtask.errors", "subtask.redact", "subtask.faults",
              "subtask.phases", "subtask.executors", "subtask.start_options", "subtask.claims"}),
]


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The subtask modules `name` imports anywhere in its file (module level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_module_graph_has_no_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_has_a_layer():
    placed = [m for _, members in LAYERS for m in members]
    assert len(placed) == len(set(placed)), "a module in two layers"
    assert set(placed) == set(modules()), (
        f"not in LAYERS: {sorted(set(modules()) - set(placed))}; "
        f"gone: {sorted(set(placed) - set(modules()))} (update docs/architecture.md too)")


def test_no_module_imports_a_higher_layer():
    rank = {m: len(LAYERS) - i for i, (_, members) in enumerate(LAYERS) for m in members}
    layer = {m: name for name, members in LAYERS for m in members}
    upward = [f"{a} ({layer[a]}) imports {b} ({layer[b]})"
              for a, deps in sorted(graph().items()) for b in sorted(deps) if rank[b] > rank[a]]
    assert upward == []


def test_the_worker_imports_nothing_of_api_or_the_faces():
    """The worker and its fork server run jobs with the layers below them only."""
    edges = graph()
    for module in ("subtask.worker", "subtask.zygote", "subtask.lifecycle", "subtask.spawn"):
        assert "subtask.api" not in edges[module], module
        assert not {"subtask.cli", "subtask.mcp_server", "subtask.mcp_tools"} & edges[module], module


def test_importing_the_cli_loads_no_sdk_and_no_pygit2():
    code = ("import sys, subtask.cli\n"
            "heavy = ('mcp', 'mcp_types', 'claude_agent_sdk', 'pygit2', 'anyio', 'pydantic', 'ray')\n"
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=str(PACKAGE.parent))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"import subtask.cli loaded: {proc.stdout.strip()}"


@pytest.mark.parametrize("spawn", ["fork", "exec"])
def test_the_cli_still_forks_its_worker_now_that_the_worker_main_is_handed_in(cli, repo, tmp_path, spawn):
    """The CLI hands `spawn` its worker main: a worker it starts is a fork of itself (the CLI's
    argv), not a fresh `python -m subtask.worker`, unless SUBTASK_SPAWN=exec asks for one."""
    from subtask import lifecycle
    from subtask.gitrepo import open_repo

    release = tmp_path / "release"
    env = {"SUBTASK_SPAWN": "exec"} if spawn == "exec" else {}
    job = cli.start(f'while [ ! -e "{release}" ]; do sleep 0.02; done', env=env)
    try:
        sdir = open_repo(repo).state_dir
        assert wait_until(lambda: "engine" in lifecycle.read_pids(sdir, job), timeout=60)
        worker = lifecycle.read_pids(sdir, job)["worker"]
        argv = Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")
        assert (b"subtask.worker" in argv) == (spawn == "exec"), argv
    finally:
        release.touch()
    cli.ok("wait", job, timeout=60)
