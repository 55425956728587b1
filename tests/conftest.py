"""Shared fixtures: real repositories in temporary folders, the real CLI, and the paid-engine guard.

The guard is autouse: every test runs with the network closed to paid services (API base URLs
point at a closed local port, proxies at a black hole) and with `claude`/`codex` executables on
PATH that record any call and fail. A test that reaches a paid engine fails, even in a worker
subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN_DIR = str(Path(sys.executable).parent)

# Every process the tests start writes no bytecode, on any machine: a job or a verify that runs
# Python in its worktree otherwise leaves `__pycache__/` there (the test repositories ignore
# nothing), and the autocommit, "it changed nothing" and cleanup's "untracked files" then saw it.
# CI sets this; a fresh machine (the README's command) may not, and three tests failed there.
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"


def pytest_configure(config):
    """Compile the package once: with PYTHONDONTWRITEBYTECODE set (as on CI), every CLI and worker
    process the tests start would otherwise compile it from source again (~0.1 s each)."""
    import compileall

    import subtask

    compileall.compile_dir(str(Path(subtask.__file__).parent), quiet=1)


def pytest_collection_modifyitems(config, items):
    """The longest tests (`@pytest.mark.early`) are collected first, the rest after them, each in
    the files' order: `-n 4` hands the first tests round to the workers, so each long one starts at
    once on a worker of its own while the others share the rest. Left where its file put it, the
    Ray cluster's minute started two thirds of the way through and the run waited for it alone at
    the end. A stable sort, so every xdist worker collects the same order."""
    items.sort(key=lambda item: item.get_closest_marker("early") is None)



BLACKHOLE = "http://127.0.0.1:9"
GUARD_SCRIPT = """#!/bin/sh
# --version is a probe, not a paid call: engines may ask it.
if [ "$1" = "--version" ]; then echo "guard 0.0.0 (test stand-in)"; exit 0; fi
echo "$0 $*" >> "{marker}"
echo "paid engine called in a test: $0" >&2
exit 97
"""


@pytest.fixture(autouse=True)
def paid_engine_guard(tmp_path_factory, monkeypatch, request):
    guard_dir = tmp_path_factory.mktemp("guard")
    marker = guard_dir / "paid-calls.log"
    for name in ("claude", "codex"):
        exe = guard_dir / name
        exe.write_text(GUARD_SCRIPT.format(marker=marker))
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{guard_dir}{os.pathsep}{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}")
    for var in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN", "OPENAI_API_KEY",
                "CODEX_API_KEY", "SUBTASK_FAULT", "SUBTASK_FAULT_RAISE", "SUBTASK_DEPTH", "SUBTASK_REPO"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", BLACKHOLE)
    monkeypatch.setenv("OPENAI_BASE_URL", BLACKHOLE)
    monkeypatch.setenv("HTTPS_PROXY", BLACKHOLE)
    monkeypatch.setenv("HTTP_PROXY", BLACKHOLE)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    real_connect = socket.socket.connect

    def guarded_connect(sock, address):
        host = address[0] if isinstance(address, tuple) else address
        if sock.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
            pytest.fail(f"test tried to reach the network: {address}")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    yield
    if marker.exists():
        pytest.fail(f"a paid engine was started during the test: {marker.read_text()}")


def claude_code_folder(path: Path) -> str:
    """The name Claude Code gives the folder of a working directory in its temp dir: the path
    with every character but a letter or a digit made a `-`."""
    import re

    return re.sub(r"[^A-Za-z0-9]", "-", str(path))


@pytest.fixture(autouse=True)
def claude_code_temp(tmp_path, monkeypatch):
    """Claude Code (the CLI in claude-agent-sdk, which the real-CLI tests run) keeps a folder per
    working directory in its temp dir (`$CLAUDE_CODE_TMPDIR`, else the system's:
    /tmp/claude-<uid>/<cwd as a name>) and never removes it: each run of the suite left one per
    test there. Its temp dir is this test's (a job's is its private TMPDIR); afterwards, nothing
    named for this test may be in the system's one."""
    import tempfile

    private = tmp_path / "claude-code-tmp"
    private.mkdir(mode=0o700)  # the CLI refuses a temp dir others may write
    monkeypatch.setenv("CLAUDE_CODE_TMPDIR", str(private))
    yield
    shared = Path(tempfile.gettempdir()) / f"claude-{os.getuid()}"
    mine = claude_code_folder(tmp_path)
    found = shared.glob(f"{mine}*") if shared.is_dir() else []
    left = sorted(p.name for p in found if p.name == mine or p.name.startswith(f"{mine}-"))
    assert not left, f"the test left folders in Claude Code's shared temp dir {shared}: {left}"


GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test Author",
    "GIT_AUTHOR_EMAIL": "author@example.com",
    "GIT_COMMITTER_NAME": "Test Author",
    "GIT_COMMITTER_EMAIL": "author@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
}


@pytest.fixture(autouse=True)
def isolated_git(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)
    return home


# The tests of the view itself see exactly what a user's confined job sees.
OWN_VIEW_MODULES = ("test_view", "test_isolation", "test_containment")


@pytest.fixture(autouse=True)
def scratch_visible_to_jobs(request, isolated_git):
    """Most tests hold a confined job on a gate file in their scratch folder, or hand it a script
    from there, as a user grants a folder: `subtask.isolation.readable` of the test's tmp_path, in
    this test's own global git config (a confined job's view holds nothing of the machine it is not
    given). The tests of the view itself (`OWN_VIEW_MODULES`) grant nothing."""
    if request.module.__name__.rpartition(".")[2] in OWN_VIEW_MODULES or "tmp_path" not in request.fixturenames:
        return
    scratch = request.getfixturevalue("tmp_path")
    with open(isolated_git / ".gitconfig", "a", encoding="utf-8") as fh:
        fh.write(f'[subtask "isolation"]\n\treadable = {scratch}\n')


def git(cwd, *args, check=True) -> str:
    proc = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout.strip()


def is_ancestor(repo, commit: str, of: str) -> bool:
    """Does `of` carry `commit` (git merge-base --is-ancestor: its exit code, not its empty output)?"""
    return subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", commit, of],
                          capture_output=True, check=False).returncode == 0


def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in (files or {"README.md": "hello\n"}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial commit")
    shell_engine_and_no_pool(path)
    return path


def shell_engine_and_no_pool(path: Path) -> None:
    """The shell engine by default, and no worktree pool: jobs check out their own, as before it
    existed. Tests compare what git lists before and after a job, and a pool refill beside the job
    adds a worktree (or, ended at the job's end, debris); tests/test_pool.py tests the pool, on by
    default. Written as `git config` writes them, without two more git processes per repository
    (the suite makes a thousand)."""
    with open(path / ".git" / "config", "a", encoding="utf-8") as config:
        config.write("[subtask]\n\tengine = shell\n\tpool = 0\n")


def make_team(tmp_path: Path) -> tuple[Path, list[tuple[Path, Cli]]]:
    """A bare remote and two clones of it (a: the teammate, b: ours), each set up for the shell
    engine. The remote keeps a reflog (a bare repository does not by default), so a test can see
    how each of its refs moved."""
    seed = make_repo(tmp_path / "seed")
    remote = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(remote))
    git(remote, "config", "core.logAllRefUpdates", "always")
    clones = []
    for name in ("a", "b"):
        path = tmp_path / name
        git(tmp_path, "clone", "-q", str(remote), str(path))
        shell_engine_and_no_pool(path)
        clones.append((path, Cli(path)))
    return remote, clones


@pytest.fixture
def repo(tmp_path) -> Path:
    """A real git repository with one commit; the default engine is shell."""
    return make_repo(tmp_path / "repo")


def ray_node_env(tmp_path_factory, home: Path, **extra: str) -> dict[str, str]:
    """The environment of a test Ray cluster's nodes: their own HOME, and a global git config that
    shows a confined job on a node this worker's scratch folders, read-only, as
    `scratch_visible_to_jobs` does here (the gates and scripts the tests hand their jobs)."""
    config = home / ".gitconfig"
    config.write_text(f'[subtask "isolation"]\n\treadable = {tmp_path_factory.getbasetemp()}\n')
    return dict(os.environ, HOME=str(home), **GIT_ENV, GIT_CONFIG_GLOBAL=str(config),
                PATH=f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}", **extra)


def gate_folder(repo: Path) -> Path:
    """A folder outside the repository that confined jobs see (read-only), for the gates a test
    opens while a job waits: a confined job's view holds nothing of the machine it is not given
    (`subtask.isolation.readable`)."""
    path = repo.parent / "gates"
    if not path.exists():
        path.mkdir()
        git(repo, "config", "--add", "subtask.isolation.readable", str(path))
    return path


def host_pid(token: str, timeout: float = 30.0) -> int:
    """The pid, as this machine numbers it, of the process whose command line holds `token` (a
    job's process runs in a pid namespace with a /proc of its own: it cannot say its pid here).
    Give it as an argument of the process, e.g. `sh -c '...' TOKEN` (its `$0`): only a process
    with the whole token as one argument is it, never one whose task merely holds the token (the
    sandbox's launcher of the job's shell, which execs on into another program)."""
    found: list[int] = []
    assert wait_until(lambda: found.extend(processes_with(token, whole=True)) or found, timeout=timeout), \
        f"no process holds {token}"
    return min(found)


def grant_writable(path: Path) -> Path:
    """Let confined jobs write `path` (a folder outside their worktree that a test reads), in this
    test's own global git config (HOME is a fresh folder per test), for every repository."""
    subprocess.run(["git", "config", "--global", "--add", "subtask.isolation.writable", str(path)], check=True)
    return path


@pytest.fixture
def control_dir(repo, tmp_path) -> Path:
    """A folder outside the repository that jobs may write, for markers and logs a test reads.

    Shell and command jobs run confined to their worktree by default (subtask/isolation.py); this
    grants the folder the way a user grants ~/.cache: `git config --add subtask.isolation.writable`.
    """
    path = tmp_path / "control"
    path.mkdir()
    git(repo, "config", "--add", "subtask.isolation.writable", str(path))
    return path


def run_or_dump(argv: list[str], *, cwd: str, env: dict, input=None, timeout: float) -> subprocess.CompletedProcess:
    """`subprocess.run` with captured text output, except that a command still running at
    `timeout` is not only killed: every Python process under it first prints each thread's stack
    (faulthandler, on SIGABRT), and the TimeoutExpired raised carries those stacks, so a hang on
    a loaded CI machine says where it hung."""
    __tracebackhide__ = True
    env = dict(env, PYTHONFAULTHANDLER="1")
    with subprocess.Popen(argv, cwd=cwd, env=env, text=True, stdin=subprocess.PIPE if input is not None else
                          subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in descendants(proc.pid):
                try:
                    os.kill(pid, signal.SIGABRT)
                except OSError:
                    pass
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            print(f"{' '.join(argv)} still ran after {timeout} s; its output, then each thread's stack:\n"
                  f"{out}\n{err}", file=sys.stderr)  # shown under the failed test's captured stderr
            raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def descendants(pid: int) -> list[int]:
    """`pid`'s living descendants (from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        todo.extend(kids := children.get(todo.pop(0), []))
        found.extend(kids)
    return found


class Cli:
    """Runs the real `git subtask` command in a repository."""

    def __init__(self, cwd: Path):
        self.cwd = cwd

    def __call__(self, *args: str, cwd=None, env=None, input=None, timeout=60) -> subprocess.CompletedProcess:
        full_env = dict(os.environ, **(env or {}))
        return run_or_dump(["git", "subtask", *args], cwd=str(cwd or self.cwd), env=full_env, input=input,
                           timeout=timeout)

    def ok(self, *args: str, **kwargs) -> str:
        proc = self(*args, **kwargs)
        assert proc.returncode == 0, \
            f"git subtask {' '.join(args)} exited {proc.returncode}: {proc.stderr}{proc.stdout}"
        return proc.stdout

    def json(self, *args: str, **kwargs):
        return json.loads(self.ok(*args, "--json", **kwargs))

    def start(self, task: str, *args: str, **kwargs) -> str:
        """Start a job; returns its id."""
        out = self.ok("start", *args, task, **kwargs)
        return out.split()[0]


@pytest.fixture
def cli(repo) -> Cli:
    return Cli(repo)


def refs(repo: Path, prefix: str = "") -> list[str]:
    out = git(repo, "for-each-ref", "--format=%(refname)", *([prefix] if prefix else []))
    return [line for line in out.splitlines() if line]


def running_pids(repo: Path, job: str, timeout: float = 60.0) -> dict:
    """The running job's worker pid and engine group, once both are recorded."""
    from subtask.git.gitrepo import open_repo
    from subtask.ops.running import lifecycle

    sdir = open_repo(repo).state_dir
    assert wait_until(lambda: {"worker", "engine"} <= lifecycle.read_pids(sdir, job).keys(), timeout=timeout), \
        f"{job}'s worker and engine were never both recorded: {lifecycle.read_pids(sdir, job)}"
    return lifecycle.read_pids(sdir, job)


def kill_worker_and_engine(repo: Path, job: str) -> None:
    """SIGKILL a running job's worker and its engine group, and return once the kernel has
    released the worker's run-lock (kill returns before the process is gone)."""

    pids = running_pids(repo, job)
    os.kill(pids["worker"], 9)
    os.killpg(pids["engine"], 9)
    wait_for_run_lock_release(repo, job)


def wait_for_run_lock_release(repo: Path, job: str) -> None:
    """Return once nobody holds the job's run-lock (the kernel drops a killed holder's lock a
    moment after the kill returns)."""
    from subtask.git.gitrepo import open_repo
    from subtask.state import liveness

    sdir = open_repo(repo).state_dir
    assert wait_until(lambda: not liveness.is_held(sdir, job), timeout=60), f"{job}'s run-lock outlived its worker"


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.02) -> bool:
    """True once `predicate()` is; False after `timeout` (generous: a loaded machine is slow, and a
    passing test waits no longer for it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def processes_with(token: str, *, whole: bool = False) -> list[int]:
    """The pids whose command line holds `token` (a gate path a test's job waits on, say; `whole`:
    as one whole argument), but git-subtask's own: the worker is forked from `start` and keeps its
    argv, the job's task included, while it finishes its bookkeeping after the job ended."""
    found, wanted = [], token.encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            ours = any(os.path.basename(word) == b"git-subtask" for word in argv[:2])
            if not ours and any(word == wanted if whole else wanted in word for word in argv):
                found.append(int(entry))
    return found


def blocked_on_run_lock(repo: Path, job_id: str) -> bool:
    """Is some process blocked on a shared flock of the job's run-lock (a watcher of `wait`)?"""
    inode = (repo / ".git" / "subtask" / "run" / f"{job_id}.lock").stat().st_ino
    with open("/proc/locks") as fh:
        return any("->" in line and "FLOCK" in line and line.split()[-3].endswith(f":{inode}") for line in fh)
