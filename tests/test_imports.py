"""Every call pays for what it uses, and no more: each reading command's imports have a budget.

A reading command (`list`, `status`, `show`, `result`, `wait`) runs under `python -X importtime`
(the modules the interpreter reports loading, in the order and nesting it loaded them), and:
- nothing of click, pygit2, the MCP SDK, the agent SDKs, Ray, filelock, `dataclasses` or
  `inspect` (~7 ms together; subtask/model/dataclass.py makes our records), nor `subprocess`
  or `signal` (~4 ms with `threading`, `selectors` and `locale`: git runs through
  subtask/git/pipes.py) loads, nor any module of ours that starts, runs or lands a job, or
  signs (`FORBIDDEN`);
- every module of ours it loads is in its budget (`OURS`, shared, plus `EXTRA` per command);
- every module outside the package that a module of ours is the first to import is in
  `DIRECT`: a new `import x` on a reading path, in a module or inside a function it calls,
  fails here, not in a user's prompt (docs/benchmarks.md says what each costs).

A module that leaves a budget lowers it: update the sets here in the same commit.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git

from subtask.proc import isolation

FORBIDDEN = ("click", "pygit2", "mcp", "mcp_types", "claude_agent_sdk", "anyio", "pydantic", "ray", "filelock",
             "dataclasses", "inspect", "subprocess", "signal",
             "subtask.engines", "subtask.worker", "subtask.api.starting", "subtask.api.groups", "subtask.api.launching",
             "subtask.api.replying", "subtask.api.landing", "subtask.api.admin", "subtask.faces.cli",
             "subtask.faces.mcp_server", "subtask.faces.mcp_calls",
             "subtask.faces.mcp_tools", "subtask.faces.manpage", "subtask.git.signing", "subtask.git.notes_store",
             "subtask.executors.ray", "subtask.ops.landing.landed", "subtask.ops.landing.cleanup",
             "subtask.ops.landing.merge", "subtask.ops.landing.land", "subtask.ops.landing.queue",
             "subtask.ops.landing.lineup", "subtask.ops.plans", "subtask.ops.running", "subtask.state.ledger",
             "subtask.proc.isolation")

OURS = {
    "subtask", "subtask.entry", "subtask.api", "subtask.api.read",
    "subtask.faces", "subtask.faces.commands", "subtask.faces.output", "subtask.faces.replies",
    "subtask.git", "subtask.git.chains", "subtask.git.gitobjects", "subtask.git.gitrepo", "subtask.git.loose",
    "subtask.git.pipes",
    "subtask.git.ownership", "subtask.git.records", "subtask.git.where_landed",
    "subtask.model", "subtask.model.checknames", "subtask.model.config", "subtask.model.dataclass",
    "subtask.model.errors", "subtask.model.faults", "subtask.model.job",
    "subtask.model.lazyre", "subtask.model.money",
    "subtask.proc", "subtask.proc.spawn",
    "subtask.state", "subtask.state.liveness", "subtask.state.paths", "subtask.state.slots", "subtask.state.stamps",
    "subtask.state.statefiles", "subtask.words", "subtask.words.fields", "subtask.words.group_pages",
    "subtask.words.formats", "subtask.words.lines", "subtask.words.pages", "subtask.words.terminal",
}
EXTRA = {
    "list": {"subtask.faces.commands.list", "subtask.ops", "subtask.ops.landing", "subtask.ops.landing.overlap"},
    "status": {"subtask.faces.commands.status", "subtask.ops", "subtask.ops.landing", "subtask.ops.landing.overlap"},
    "show": {"subtask.faces.commands.show", "subtask.model.provenance"},
    "result": {"subtask.faces.commands.result"},
    "wait": {"subtask.faces.commands.wait", "subtask.api.waiting"},
}
DIRECT = {"__future__", "_sha1", "collections", "decimal", "fcntl", "gc", "json", "math", "select", "zlib"}
DIRECT_EXTRA: dict[str, set[str]] = {}
RUN_TIME = "subtask (a function's import, at run time)"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def import_tree(argv: list[str], cwd) -> dict[str, str | None]:
    """{module: the module that first imported it (None: the interpreter or the script)} of
    `python -m subtask <argv>`, from `-X importtime` (a module is printed after its imports, each
    indented one level deeper than the module that imported it)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "subtask", *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    rows = []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            name = line.split("|")[2]
            rows.append(((len(name) - len(name.lstrip())) // 2, name.strip()))
    parents: dict[str, str | None] = {}
    ours_began = False
    for i, (depth, name) in enumerate(rows):
        parents[name] = next((rows[j][1] for j in range(i + 1, len(rows)) if rows[j][0] == depth - 1), None)
        if parents[name] is None and ours_began:  # imported at depth 0 once ours run: by a function of ours
            parents[name] = RUN_TIME
        ours_began = ours_began or name.startswith("subtask")
    return parents


def over_budget(command: str, parents: dict[str, str | None]) -> list[str]:
    """What `command` imported beyond its budget, in words (empty: within it)."""
    found = []
    for module, parent in parents.items():
        if any(module == f or module.startswith(f + ".") for f in FORBIDDEN):
            found.append(f"{module} (imported by {parent}) is never a reading command's")
        elif module.startswith("subtask") and module not in OURS | EXTRA[command]:
            found.append(f"{module} (imported by {parent}) is not in {command}'s budget")
        elif not module.startswith("subtask") and (parent or "").startswith("subtask") \
                and module.split(".")[0] not in DIRECT | DIRECT_EXTRA.get(command, set()):
            found.append(f"{module} (imported by {parent}) is not in {command}'s budget")
    return found


@pytest.fixture
def finished(repo, cli):
    """A repository with one finished job; the landed sweep (which imports what lands jobs, once
    every subtask.sweepInterval) done already, as on any repository between two sweeps."""
    git(repo, "config", "subtask.sweepInterval", "3600")
    job = cli.start("echo hi > hi.txt")
    cli.ok("wait", job)
    cli.ok("list")
    cli.ok("wait", cli.start("true"))  # ended since that look
    for cache in (repo / ".git" / "subtask").glob("*-*.json"):  # the listing's, the overlap marks'
        if cache.name.startswith(("list-cache-", "behind-")):
            cache.unlink()  # so the next `list` or `status` writes them
    return repo, job


@pytest.mark.parametrize("command", sorted(EXTRA))
def test_a_reading_command_imports_only_its_budget(finished, command):
    repo, job = finished
    argv = [command] if command in ("list", "status") else [command, job]
    parents = import_tree(argv, repo)
    assert f"subtask.faces.commands.{command}" in parents  # the registry ran it, without click
    assert over_budget(command, parents) == []


def spied(argv: list[str], cwd, spy: str, bare: bool = False) -> tuple[str, str]:
    """Run `git-subtask ARGV` in a Python process that first runs `spy` (code that defines
    `report()`, returning text): its stdout, and what `report()` said when the command exited
    (its own process, not a fork's; a registry command's `os._exit` as well as a return).
    `bare`: without `site` (`-S`), so nothing but the command loads a module (an editable
    install's finder loads `contextlib`), the package found from this checkout."""
    code = ("import os, sys\n"
            f"{spy}\n"
            "pid, real_exit = os.getpid(), os._exit\n"
            "def said():\n"
            "    if os.getpid() == pid:\n"
            "        os.write(2, ('\\nSPIED ' + report()).encode())\n"
            "os._exit = lambda status: (said(), real_exit(status))  # a registry command's exit (no atexit)\n"
            f"sys.argv = ['git-subtask', *{argv!r}]\n"
            "from subtask.entry import main\n"
            "try:\n"
            "    main()\n"
            "finally:\n"
            "    said()\n")
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT)) if bare else None
    proc = subprocess.run([sys.executable, *(["-S"] if bare else []), "-c", code], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr.rpartition("SPIED ")[2]


# What a reading command's process must not have loaded by its exit, whoever imported it (the
# budget above sees only the modules ours were the first to import, and `-m subtask` loads
# `contextlib` for `runpy`): a writer's temp files (`tempfile` with `shutil` and `random`, ~3 ms),
# `subprocess` with `threading` and `signal` (~4 ms), `contextlib` (~0.3 ms), `pathlib` (~3 ms with
# `urllib.parse`, `ipaddress` and `fnmatch`: a reading command joins its paths as text).
NOT_ON_A_READ = ("contextlib", "subprocess", "tempfile", "shutil", "random", "threading", "signal", "pathlib",
                 "urllib")

# Counted in a reading command's process: the regular expressions code of ours compiled (every
# compile of a pattern not cached yet goes through `re._compile`; said of the first caller
# outside `re` and `lazyre`), the garbage collections of each generation, the data classes whose
# `__init__` was compiled, and the modules loaded by its exit.
COSTS_SPY = """
import gc, re
import subtask.model.dataclass as made
patterns, real_compile = [], re._compile
def compile_spy(pattern, flags):
    if (type(pattern), pattern, flags) not in re._cache:
        frame = sys._getframe(1)
        while frame.f_globals.get('__name__') in ('re', 'subtask.model.lazyre'):
            frame = frame.f_back
        name = frame.f_globals.get('__name__', '')
        if name.startswith('subtask'):
            patterns.append(f'{name}:{frame.f_lineno} {pattern!r}')
    return real_compile(pattern, flags)
re._compile = compile_spy
collections = [0, 0, 0]
gc.callbacks.append(lambda phase, info: phase == 'start' and collections.__setitem__(
    info['generation'], collections[info['generation']] + 1))
inits, real_init = [], made._compile_init
made._compile_init = lambda cls, frozen: inits.append(cls.__qualname__) or real_init(cls, frozen)
report = lambda: repr({'patterns': patterns, 'collections': collections, 'inits': inits,
                       'modules': sorted(sys.modules)})
"""


@pytest.mark.parametrize("command", sorted(EXTRA))
def test_a_reading_command_pays_for_no_work_it_does_not_do(finished, command):
    """What a reading command costs beyond its imports, each seen red before it was mended:
    - no regular expression of ours compiled (0.05-0.3 ms each: the ~20 its modules held were
      ~1.4 ms of ~25): compiled on first use (`lazyre`), and what a read checks on every call
      (object ids, ref names, job ids, text for a terminal) is checked without one;
    - no garbage collection (Python's default, every 700 new containers, ran 16 while its ~100
      modules were imported, ~2 ms): the CLI collects every `entry.GC_THRESHOLD`, so a process
      that runs long still collects;
    - no data class `__init__` compiled (~0.1 ms each, 7 in `list`): a class's first calls are
      bound by a shared function (`model/dataclass.py`); only the settings' class, made 69
      times at import, is compiled;
    - none of what writers use (`NOT_ON_A_READ`), in a process without `site` (an editable
      install's finder loads `contextlib`), also by the `list` or `status` that writes the
      listing's cache (the `finished` fixture removes it after a job ended since the last look)."""
    repo, job = finished
    argv = [command] if command in ("list", "status") else [command, job]
    costs = ast.literal_eval(spied(argv, repo, COSTS_SPY, bare=True)[1])
    assert f"subtask.faces.commands.{command}" in costs["modules"]
    assert costs["patterns"] == []
    assert costs["collections"] == [0, 0, 0]
    assert costs["inits"] == ["Setting"]
    assert loaded_of(costs["modules"], NOT_ON_A_READ) == []


def test_list_reads_the_record_refs_and_no_pin(finished, cli):
    """`list` needs each job's record (and the landed marks), not its pins (`base`, `head`,
    `attempts/<n>`): reading them was three ref files (and three object checks) of every four."""
    repo, _ = finished
    spy = ("import subtask.git.gitobjects as objects\n"
           "read, real = [], objects._ref_file\n"
           "objects._ref_file = lambda path: read.append(str(path)) or real(path)\n"
           "report = lambda: ' '.join(read)\n")
    out, said = spied(["list"], repo, spy)
    assert out.count(" done ") >= 2
    read = said.split()
    assert [p for p in read if p.endswith("/record")], read
    assert [p for p in read if p.endswith(("/base", "/head")) or "/attempts/" in p] == []


def test_listing_a_repository_where_no_job_ever_started_imports_no_landing_code(repo):
    """The landed sweep is due there (never stamped), but there is nothing to sweep: `list` and
    `status` keep to their budget rather than load what lands jobs to find that out."""
    for command in ("list", "status"):
        parents = import_tree([command], repo)
        assert f"subtask.faces.commands.{command}" in parents
        assert over_budget(command, parents) == []
    assert not (repo / ".git" / "subtask").exists(), "a read makes nothing"


def test_the_budget_fails_a_heavy_import_on_the_reading_path():
    """The check itself: a module of ours that imports click, or pygit2 inside a function `list`
    calls, or one more of our modules or the standard library's, is named."""
    base = {m: "subtask.api.read" for m in OURS}
    assert over_budget("list", base | {"click": "subtask.faces.commands.list"})
    assert over_budget("list", base | {"pygit2": "subtask.git.records"})
    assert over_budget("list", base | {"subtask.ops.landing.cleanup": "subtask.api.read"})
    assert over_budget("list", base | {"tempfile": "subtask.state.statefiles"})
    assert over_budget("list", base | {"tempfile": "shutil"}) == []  # the standard library's own
    assert over_budget("list", base) == []


# What `start` of a shell job (the CLI's own process: its worker is a fork that goes on) must not
# import: what only groups, landing or another command use, what a call out of the standard
# library answers as well (`platform`: ~1.5 ms and nine regular expressions, for os.uname()), what
# only the worker it forks runs (`subprocess`, ~2 ms with `threading`, `selectors`, `locale`: its
# git goes through subtask/git/pipes.py), what `tempfile` does without its `shutil` and `random`
# (~2 ms), `shutil` itself (~1.4 ms with `bz2` and `lzma`: a sandbox's folder removed, the worker's
# copies), `datetime` (~0.7 ms: a paid job's reservation), `threading` (~0.5 ms: two locks), and
# what only a type checker needs (`typing`, ~3 ms; `dataclasses` with `inspect`, ~7 ms).
# (`contextlib`, ~0.3 ms, left too; an editable install's finder loads it at the interpreter's start.)
NOT_AT_START = ("click", "pygit2", "mcp", "claude_agent_sdk", "ray", "filelock", "platform", "logging", "dataclasses",
                "inspect", "typing", "subprocess", "tempfile", "shutil", "datetime", "threading",
                "subtask.api.groups", "subtask.api.landing", "subtask.api.replying", "subtask.faces.cli",
                "subtask.ops.plans", "pathlib", "urllib")

# What only the worker's confinement uses (~2.4 ms): `ctypes` for the kernel's calls and the view
# it builds. `start` only chooses a job's isolation: Landlock's presence, as this boot's first
# probe found it (proc/isolation.py `support_seen`), and the namespaces' (a few files read).
KERNEL_INTERFACES = ("ctypes", "subtask.proc.view")


def modules_loaded_by(argv: list[str], cwd) -> tuple[list[str], str]:
    """The modules `git-subtask ARGV` had loaded when it exited (its own process, not a fork's), and
    its stdout; without `site`, whose editable install's finder loads `pathlib` and `contextlib`."""
    out, said = spied(argv, cwd, "report = lambda: ' '.join(sys.modules)", bare=True)
    return said.split(), out


def loaded_of(loaded: list[str], names: tuple[str, ...]) -> list[str]:
    return [m for m in loaded if any(m == n or m.startswith(n + ".") for n in names)]


def test_start_imports_nothing_it_does_not_use(repo, cli):
    """A start in a repository that ran a job before (the first start writes the clone's id and
    the notes' merge setting once, through `git config`)."""
    cli.ok("wait", cli.start("true"))
    loaded, out = modules_loaded_by(["start", "--engine", "shell", "true"], repo)
    cli.ok("wait", out.split()[0])
    assert "subtask.api.starting" in loaded
    assert loaded_of(loaded, NOT_AT_START) == []
    if isolation.support().available:  # a start here trusts this boot's earlier probe of Landlock
        assert loaded_of(loaded, KERNEL_INTERFACES) == []


def test_the_first_start_in_a_clone_builds_no_path_either(repo, cli):
    """The first start also makes the clone's id (the state folder, a lock): as text too."""
    loaded, out = modules_loaded_by(["start", "--engine", "shell", "true"], repo)
    cli.ok("wait", out.split()[0])
    assert "subtask.api.starting" in loaded
    assert loaded_of(loaded, ("pathlib", "urllib")) == []


def test_a_start_beside_a_running_job_imports_nothing_more(repo, cli, tmp_path):
    """An agent starts jobs while others run: `start` then asks whether it runs inside one of them
    (its ancestry), which must not load the process-management module and its `logging`."""
    held = tmp_path / "held"
    running = cli.start(f"until [ -e {held} ]; do sleep 0.05; done")
    try:
        loaded, out = modules_loaded_by(["start", "--engine", "shell", "true"], repo)
    finally:
        held.touch()
    cli.ok("wait", out.split()[0], running)
    assert loaded_of(loaded, (*NOT_AT_START, "subtask.proc.procs")) == []


# What the worker of a plain job (no group, no verify, no harness; it changed no Python test
# file) must not import after its fork from `start`: each is on its way to the engine, and on the
# CPU of every job. A group's coordination (~11 ms), `logging` (~4 ms with `traceback`), OpenSSL's
# `hashlib` (~3.5 ms: a verify's key, a harness), `tempfile` (~1.5 ms with `random`: a notify
# command's output), `platform` (~1.4 ms: `os.uname` says the same), pygit2 (~50 ms of CPU, with
# `ast`, `inspect` and `typing`: its end's git is a few small processes and objects written here),
# `socket` (~2.6 ms of enums: its ports are checked through `_socket`), `ast` alone (~0.8 ms: the
# checks read Python tests with it, and a plain job runs none).
NOT_IN_A_PLAIN_WORKER = ("subtask.ops.plans.groups", "logging", "traceback", "hashlib", "_hashlib", "platform",
                         "tempfile", "pygit2", "socket", "ast")


def test_a_plain_jobs_worker_imports_nothing_it_does_not_use(repo, cli):
    """What the forked worker imports is what Python reports under PYTHONPROFILEIMPORTTIME in its
    log (its stderr): the modules `start` had not loaded."""
    cli.ok("wait", cli.start("true"))  # the clone's first start writes its id and settings
    job = cli.start("echo hi > hi.txt", env={"PYTHONPROFILEIMPORTTIME": "1"})
    cli.ok("wait", job)
    log = (repo / ".git" / "subtask" / "logs" / f"{job}.log").read_text()
    imported = [line.split("|")[2].strip() for line in log.splitlines() if line.startswith("import time:")]
    assert "subtask.worker.attempt" in imported  # its fork's imports are there
    assert [m for m in imported if m in NOT_IN_A_PLAIN_WORKER] == []


# What `cleanup` of a finished job must not import: what starts a job (its admission, engines,
# confinement), lands one, or another command uses.
NOT_AT_CLEANUP = ("click", "pygit2", "mcp", "claude_agent_sdk", "ray", "filelock", "dataclasses", "inspect", "typing",
                  "subtask.api.starting",
                  "subtask.api.launching", "subtask.api.groups", "subtask.api.replying", "subtask.api.landing",
                  "subtask.engines", "subtask.worker", "subtask.proc.isolation", "subtask.ops.running.admission")


def test_cleanup_imports_nothing_it_does_not_use(finished):
    repo, job = finished
    loaded, out = modules_loaded_by(["cleanup", job], repo)
    assert out.startswith(f"{job}: removed worktree")
    assert "subtask.ops.landing.cleanup" in loaded
    assert loaded_of(loaded, NOT_AT_CLEANUP) == []



def exit_of(argv: list[str], cwd) -> tuple[str, str, int]:
    """How `git-subtask ARGV` ended: "fast" (os._exit, the interpreter not torn down) with the
    number of exit callbacks registered by then, or "normal"; what it wrote and its exit code."""
    code = ("import atexit, os, sys\n"
            "pid = os.getpid()\n"
            "real_exit = os._exit\n"
            "def spy(status):\n"
            "    if os.getpid() == pid:\n"
            "        os.write(2, f'FAST {atexit._ncallbacks()}'.encode())\n"
            "    real_exit(status)\n"
            "os._exit = spy\n"
            f"sys.argv = ['git-subtask', *{argv!r}]\n"
            "from subtask.entry import main\n"
            "main()\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # its output buffered, as a user's is
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    said, fast, callbacks = proc.stderr.rpartition("FAST ")
    if not fast:
        return "normal", proc.stdout + proc.stderr, proc.returncode
    return f"fast {callbacks.strip()}", proc.stdout + said, proc.returncode


def test_a_registry_command_exits_without_tearing_the_interpreter_down(finished):
    """Python's teardown (every module's objects freed one by one) is ~6 ms of a 45 ms `list`.
    A command the registry ran exits at once, its streams flushed, which is safe only while it
    registered no exit work (atexit) that this would skip: none of them may."""
    repo, job = finished
    for argv in (["list"], ["status"], ["show", job], ["result", job], ["wait", job], ["--version"],
                 ["start", "--engine", "shell", "true"]):
        how, out, code = exit_of(argv, repo)
        assert (how, code) == ("fast 0", 0), argv
        assert out.strip(), argv  # its output was flushed before the exit
    started = out.split()[0]
    assert exit_of(["wait", started], repo)[::2] == ("fast 0", 0)
    assert exit_of(["cleanup", started], repo)[::2] == ("fast 0", 0)
    assert exit_of(["show", "st-00000000"], repo)[::2] == ("fast 0", 128)  # an unknown job is fatal, as before


def test_a_click_command_exits_without_a_last_collection_of_every_import(finished):
    """A command the click CLI runs exits through the interpreter's teardown, whose last garbage
    collection walked every object its imports made (click's, the command's: 7-10 ms of a 45 ms
    `merge --help`, 20-50 ms on a loaded machine). `main` freezes them first (`gc.freeze`): that
    collection then walks nothing the command did not make."""
    repo, job = finished
    code = ("import atexit, gc, os, sys\n"
            "atexit.register(lambda: os.write(2, f'FROZEN {gc.get_freeze_count()}'.encode()))\n"
            "sys.argv = ['git-subtask', *sys.argv[1:]]\n"
            "from subtask.entry import main\n"
            "main()\n")
    for argv in (["merge", "--help"], ["spend"], ["notes", "--help"]):
        proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=repo, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        frozen = int(proc.stderr.rpartition("FROZEN ")[2])
        assert frozen > 20_000, (argv, frozen)  # the imports' objects (click alone makes ~25,000)
