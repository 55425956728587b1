"""The shape of the code: subtask's modules import in one direction, down the layers of
docs/architecture.md ("Layout: the folders are the layers"), with no import cycle, counting imports
inside functions too.

A cycle (e.g. the worker importing `api`, which spawns workers) makes every module in it depend
on every other: the worker would load the operations above it, and no layer could be read, tested
or changed without the rest. Keep LAYERS and the picture in docs/architecture.md the same.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_until

PACKAGE = Path(__file__).resolve().parent.parent / "subtask"

# Top first: the folders of the package, which are its layers. A module may import its own
# layer or a lower one, never a higher one (tests below); `subtask` itself is the bottom.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("entry", ("subtask.__main__", "subtask.entry")),
    ("faces", ("subtask.faces",)),
    ("api", ("subtask.api",)),
    ("worker", ("subtask.worker",)),
    ("operations", ("subtask.ops", "subtask.executors")),
    ("engines", ("subtask.engines",)),
    ("proc", ("subtask.proc",)),
    ("git", ("subtask.git",)),
    ("state", ("subtask.state",)),
    ("words", ("subtask.words",)),
    ("model", ("subtask.model", "subtask")),
]


def layer_of(module: str) -> str | None:
    """The layer a module's folder puts it in (the longest prefix that names one)."""
    best = None
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[1])):
                best = (name, prefix)
    return best[0] if best else None


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
    """Each module's imports (a fresh copy: a test may add edges to its own)."""
    return {name: set(deps) for name, deps in _graph(_stamp()).items()}


def _stamp() -> tuple:
    """What the package's files are now: the graph is parsed again only when one changed."""
    return tuple(sorted((str(path), seen.st_mtime_ns, seen.st_size)
                        for path in modules().values() for seen in [path.stat()]))


@functools.cache
def _graph(stamp: tuple) -> dict[str, set[str]]:
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
    """Every module sits in a folder that is a layer, but the console entry and `api`."""
    top = sorted(m for m, path in modules().items()
                 if m.count(".") == 1 and path.name != "__init__.py" and layer_of(m) not in ("entry", "api"))
    assert top == [], f"a module outside every layer's folder: {top}"


def test_no_module_imports_a_higher_layer():
    rank = {name: len(LAYERS) - i for i, (name, _) in enumerate(LAYERS)}
    upward = [f"{a} ({layer_of(a)}) imports {b} ({layer_of(b)})"
              for a, deps in sorted(graph().items()) for b in sorted(deps) if rank[layer_of(b)] > rank[layer_of(a)]]
    assert upward == []


# The whiteboard's rules as data: the folders each folder may import besides its own. The order
# of LAYERS says up from down; this says which lower folders one may reach at all (engines run
# with what the worker hands them and never touch the state folder; the faces talk to the api).
FOLDER = {"entry": ("subtask.__main__", "subtask.entry"), "model": ("subtask",)}
ALLOWED: dict[str, set[str]] = {
    "entry": {"faces", "model"},
    "faces": {"api", "words", "model"},
    "api": {"worker", "ops", "executors", "engines", "proc", "git", "state", "words", "model"},
    "worker": {"ops", "executors", "engines", "proc", "git", "state", "words", "model"},
    "executors": {"ops", "engines", "proc", "git", "state", "model"},
    "ops": {"engines", "proc", "git", "state", "words", "model"},
    "engines": {"proc", "words", "model"},
    "proc": {"state", "model"},
    "git": {"state", "words", "model"},
    "state": {"model"},
    "words": {"model"},
    "model": set(),
}
def folder_of(module: str) -> str:
    """The folder a module sits in: `subtask.<folder>.…`; the console entry; `subtask` is model's."""
    for name, modules_ in FOLDER.items():
        if module in modules_:
            return name
    return module.split(".")[1]


def forbidden_imports(edges: dict[str, set[str]]) -> list[str]:
    """Every import from one folder into another that ALLOWED does not list."""
    return [f"{a} imports {b}" for a, deps in sorted(edges.items()) for b in sorted(deps)
            if folder_of(b) != folder_of(a) and folder_of(b) not in ALLOWED[folder_of(a)]]


def two_way_pairs(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    pairs = {(folder_of(a), folder_of(b)) for a, deps in edges.items() for b in deps}
    return sorted((a, b) for a, b in pairs if a < b and (b, a) in pairs)


def test_every_folder_is_in_the_rules():
    assert {folder_of(m) for m in modules()} <= set(ALLOWED)


def test_each_folder_imports_only_what_the_rules_allow():
    assert forbidden_imports(graph()) == []


def test_no_two_folders_import_each_other():
    assert two_way_pairs(graph()) == []


def test_the_rules_catch_an_engine_reading_the_state_folder():
    """The checker itself: an injected `engines -> state` import is reported, as is a face that
    reaches the git layer, and a pair of folders importing each other."""
    edges = {**graph(), "subtask.engines.shell": {"subtask.state.paths"}}
    assert forbidden_imports(edges) == ["subtask.engines.shell imports subtask.state.paths"]
    edges = {"subtask.faces.replies": {"subtask.git.records"}, "subtask.git.records": set()}
    assert forbidden_imports(edges) == ["subtask.faces.replies imports subtask.git.records"]
    assert two_way_pairs({"subtask.ops.a": {"subtask.executors.b"}, "subtask.executors.b": {"subtask.ops.a"}}) \
        == [("executors", "ops")]


def test_the_worker_imports_nothing_of_api_or_the_faces():
    """The worker and its fork server run jobs with the layers below them only."""
    edges = graph()
    worker = sorted(m for m in edges if m.startswith("subtask.worker."))
    assert "subtask.worker.attempt" in worker
    for module in (*worker, "subtask.ops.running.lifecycle", "subtask.proc.spawn"):
        assert "subtask.api" not in edges[module], module
        assert not {"subtask.faces.cli", "subtask.faces.mcp_server", "subtask.faces.mcp_calls",
                     "subtask.faces.mcp_tools"} & edges[module], module


def test_importing_the_cli_loads_no_sdk_and_no_pygit2():
    code = ("import sys, subtask.faces.cli\n"
            "heavy = ('mcp', 'mcp_types', 'claude_agent_sdk', 'pygit2', 'anyio', 'pydantic', 'ray')\n"
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=str(PACKAGE.parent))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"import subtask.faces.cli loaded: {proc.stdout.strip()}"


@pytest.mark.parametrize("spawn", ["fork", "exec"])
def test_the_cli_still_forks_its_worker_now_that_the_worker_main_is_handed_in(cli, repo, tmp_path, spawn):
    """The CLI hands `spawn` its worker main: a worker it starts is a fork of itself (the CLI's
    argv), not a fresh `python -m subtask.worker.attempt`, unless SUBTASK_SPAWN=exec asks for one."""
    from subtask.git.gitrepo import open_repo
    from subtask.ops.running import lifecycle

    release = tmp_path / "release"
    env = {"SUBTASK_SPAWN": "exec"} if spawn == "exec" else {}
    job = cli.start(f'while [ ! -e "{release}" ]; do sleep 0.02; done', env=env)
    try:
        sdir = open_repo(repo).state_dir
        assert wait_until(lambda: "engine" in lifecycle.read_pids(sdir, job), timeout=60)
        worker = lifecycle.read_pids(sdir, job)["worker"]
        argv = Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")
        assert (b"subtask.worker.attempt" in argv) == (spawn == "exec"), argv
    finally:
        release.touch()
    cli.ok("wait", job, timeout=60)


def test_state_folder_names_are_spelled_only_in_state_paths():
    """`<state>/x` built from a literal anywhere but `state/paths.py` is a second spelling of a name
    one side writes and another reads (docs/architecture.md, state/)."""
    spelled = []
    for name, path in modules().items():
        if name == "subtask.state.paths":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) \
                    and isinstance(node.right, (ast.Constant, ast.JoinedStr)):
                left = node.left
                named = left.attr if isinstance(left, ast.Attribute) else getattr(left, "id", "")
                if named == "state_dir":
                    spelled.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not spelled, f"state-folder paths spelled outside subtask/state/paths.py: {spelled}"


MAX_MODULE_LINES = 800


def test_no_module_is_over_800_lines():
    """A module a newcomer can read in one sitting: past 800 lines, split it by subject (issue 41)."""
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"split these by subject: {long}"
