"""The warm command server (subtask/cmdserver.py, subtask/cmdclient.py): a served call behaves as
an in-process one (output, exit codes, environment, signals), and the server refuses what it must."""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import command_server_pids, grant_writable, stop_command_servers, wait_until

from subtask import cmdclient

CONSOLE = str(Path(sys.executable).parent / "git-subtask")


def server_folder() -> Path:
    return Path(os.environ["SUBTASK_SERVER_DIR"])


def warm_server(cli) -> int:
    """This code's server, started by a first call if none runs yet; its pid once it listens."""
    cli.ok("--version")
    folder = server_folder()
    assert wait_until(lambda: command_server_pids(folder) and list(folder.glob("*/*.sock")), timeout=60), \
        "no command server came up"
    return command_server_pids(folder)[0]


@pytest.fixture
def short_folder():
    """A folder for sockets with a short path: pytest's own under xdist are too long for one."""
    folder = Path(tempfile.mkdtemp(prefix="st-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def test_a_served_call_runs_in_the_servers_fork_and_answers_as_an_in_process_one(cli, repo, tmp_path):
    warm_server(cli)
    out = grant_writable(tmp_path / "out")
    out.mkdir()
    job = cli.start(f"tr '\\0' ' ' < /proc/$SUBTASK_WORKER_PID/cmdline > {out}/worker-argv")
    cli.ok("wait", job)
    assert "subtask.cmdserver" in (out / "worker-argv").read_text(), "the worker was not forked by the server"
    cold = {"SUBTASK_SERVER": "0"}
    for argv in (["show", job], ["show", "st-00000000"], ["--bogus"], ["wait"], ["result", job]):
        served, in_process = cli(*argv), cli(*argv, env=cold)
        assert (served.returncode, served.stdout, served.stderr) == \
            (in_process.returncode, in_process.stdout, in_process.stderr), argv
    assert cli("show", "st-00000000").returncode == 128
    assert cli("--bogus").returncode == 129


def test_the_served_command_has_the_callers_environment_home_and_cwd(cli, repo, tmp_path):
    warm_server(cli)
    out = grant_writable(tmp_path / "out")  # in this test's own HOME: the server started in another's
    out.mkdir()
    (repo / "sub").mkdir()
    job = cli.start(f'echo "$PROBE" > {out}/probe', cwd=repo / "sub", env={"PROBE": "from the caller"})
    cli.ok("wait", job)
    assert (out / "probe").read_text() == "from the caller\n"


@contextmanager
def served_wait(cli, repo, tmp_path):
    """A `wait` on a job held by a gate file, served by the warm server: (the caller, the server's pid)."""
    server = warm_server(cli)
    gate = tmp_path / "gate"
    job = cli.start(f'while [ ! -e "{gate}" ]; do sleep 0.02; done')
    waiter = subprocess.Popen([CONSOLE, "wait", job], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_until(lambda: any(children(s) for s in children(server))), "the wait was not served"
        yield waiter, server
    finally:
        waiter.kill()
        waiter.wait(timeout=60)
        gate.touch()
    cli.ok("wait", job)


def test_ctrl_c_reaches_the_served_command_and_it_exits_130(cli, repo, tmp_path):
    with served_wait(cli, repo, tmp_path) as (waiter, server):
        waiter.send_signal(signal.SIGINT)
        assert waiter.wait(timeout=60) == 130
        assert wait_until(lambda: not any(children(s) for s in children(server)))


def test_a_killed_caller_takes_its_served_command_with_it(cli, repo, tmp_path):
    with served_wait(cli, repo, tmp_path) as (waiter, server):
        commands = [c for s in children(server) for c in children(s)]
        waiter.kill()
        waiter.wait(timeout=60)
        assert wait_until(lambda: not any(Path(f"/proc/{c}").exists() for c in commands)), \
            "the served wait outlived its caller"


LEAN_CLIENT = """
import sys
before = set(sys.modules)
from subtask import cmdclient
code = cmdclient.run(["--version"])
print(code, sorted(set(sys.modules) - before), file=sys.stderr)
"""


def test_a_served_call_imports_almost_nothing_before_it_hands_over(cli, repo, short_folder):
    """What every call pays: json, re, enum, socket and signal cost ~10 ms, as much as Python's own start."""
    runs = []
    env = dict(os.environ, SUBTASK_SERVER_DIR=str(short_folder))

    def served():  # `python -c` has an import path of its own, so a server of its own: the first call starts it
        runs.append(subprocess.run([sys.executable, "-c", LEAN_CLIENT], cwd=repo, env=env, capture_output=True,
                                   text=True, timeout=60))
        return not runs[-1].stderr.startswith("None ")

    try:
        assert wait_until(served, timeout=60), "no server came up for the client"
    finally:
        stop_command_servers(short_folder)
    proc = runs[-1]
    code, imported = proc.stderr.split(" ", 1)
    assert (code, proc.stdout) == ("0", "git-subtask 0.1.0\n"), proc.stderr
    assert not {"json", "re", "enum", "socket", "signal", "selectors", "subprocess"} & set(ast.literal_eval(imported)), \
        imported


NO_NEW_PRIVS_CLIENT = """
import ctypes, json, socket, sys
from subtask import cmdclient
ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS, as every confined engine has it
sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
sock.connect(sys.argv[1])
request = {"v": cmdclient.PROTOCOL, "fingerprint": cmdclient.fingerprint(), "argv": ["--version"],
           "cwd": "/", "umask": 18, "env": {}, "stdio": [["utf-8", "strict"]] * 3}
sock.send(json.dumps(request).encode())
print(sock.recv(4096).decode())
"""


def test_a_process_with_no_new_privs_is_refused_as_a_confined_job_would_be(cli, repo):
    server = warm_server(cli)
    [path] = [lock.with_suffix("") for lock in server_folder().glob("*/*.sock.lock")
              if lock.read_text().strip() == str(server)]
    proc = subprocess.run([sys.executable, "-c", NO_NEW_PRIVS_CLIENT, str(path)], capture_output=True, text=True,
                          timeout=60, cwd=str(Path(cmdclient.__file__).parent.parent))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "refused a confined process\n"


def test_a_confined_job_that_hides_its_confinement_still_runs_its_commands_in_its_sandbox(cli, repo, tmp_path):
    warm_server(cli)
    out = grant_writable(tmp_path / "out")
    out.mkdir()
    job = cli.start(f'env -u SUBTASK_ISOLATION git subtask start "echo escaped" > {out}/nested 2>&1; '
                    f'echo $? > {out}/rc', "--isolation", "worktree")
    cli.ok("wait", job)
    assert (out / "rc").read_text().strip() != "0", (out / "nested").read_text()
    assert [j["id"] for j in cli.json("list")["jobs"]] == [job], "the confined job started a job outside its sandbox"


def test_the_fingerprint_changes_with_any_file_of_the_package(tmp_path, monkeypatch):
    package = tmp_path / "subtask"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(cmdclient, "__file__", str(package / "cmdclient.py"))
    before = cmdclient.fingerprint()
    (package / "a.py").write_text("x = 2\n")
    assert cmdclient.fingerprint() != before
    os.utime(package / "a.py", ns=(1, 1))
    touched = cmdclient.fingerprint()
    os.utime(package / "a.py", ns=(2, 2))
    assert cmdclient.fingerprint() != touched


def test_an_idle_server_exits_and_the_next_call_runs_in_process(cli, repo, short_folder):
    folder = short_folder
    env = {"SUBTASK_SERVER_DIR": str(folder), "SUBTASK_SERVER_IDLE": "0.2"}
    assert cli("--version", env=env).returncode == 0
    locks = lambda: [p for p in folder.glob("*/*.sock.lock") if p.read_text().strip()]  # noqa: E731
    assert wait_until(locks, timeout=60), "no server started"
    pid = int(locks()[0].read_text())
    assert wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=60), "the idle server did not exit"
    assert not list(folder.glob("*/*.sock")), "the idle server left its socket behind"
    assert cli("list", env=env).returncode == 0


@pytest.mark.parametrize("value", ["0", "off"])
def test_subtask_server_0_never_starts_a_server(cli, repo, tmp_path, value):
    folder = tmp_path / "own-servers"
    folder.mkdir()
    for _ in range(2):
        cli.ok("list", env={"SUBTASK_SERVER_DIR": str(folder), "SUBTASK_SERVER": value})
    assert not list(folder.rglob("*.sock*"))


def test_a_socket_folder_another_user_could_write_is_not_used(cli, repo, tmp_path):
    folder = tmp_path / "shared"
    (folder / f"git-subtask-{os.getuid()}").mkdir(parents=True, mode=0o777)
    os.chmod(folder / f"git-subtask-{os.getuid()}", 0o777)
    cli.ok("list", env={"SUBTASK_SERVER_DIR": str(folder)})
    assert not list(folder.rglob("*.sock*"))



def test_a_stopped_server_is_given_up_on_and_the_command_runs_once_here(cli, repo):
    server = warm_server(cli)
    os.kill(server, signal.SIGSTOP)
    try:
        job = cli.start("true", env={"SUBTASK_SERVER_TIMEOUT": "0.3"})
    finally:
        os.kill(server, signal.SIGCONT)
    cli.ok("wait", job)  # served: the server has taken the given-up call's connection before this one
    assert wait_until(lambda: len([s for s in children(server) if alive(s)]) == 1), \
        "a session still runs beside the spare"
    assert [j["id"] for j in cli.json("list", env={"SUBTASK_SERVER": "0"})["jobs"]] == [job], \
        "the given-up call ran in the server as well"


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_next_session_is_forked_before_the_call_and_dies_with_its_server(cli, repo, short_folder):
    env = {"SUBTASK_SERVER_DIR": str(short_folder)}  # a server of its own: no other test's sessions beside it
    servers = lambda: command_server_pids(short_folder)  # noqa: E731
    try:
        cli.ok("--version", env=env)
        assert wait_until(lambda: servers() and list(short_folder.glob("*/*.sock"))), "no server came up"
        [server] = servers()
        seen: list[int] = []

        def one_spare_but(old: int | None) -> bool:  # one look at the server's live children per call
            seen[:] = [s for s in children(server) if alive(s)]
            return len(seen) == 1 and seen[0] != old

        assert wait_until(lambda: one_spare_but(None)), f"not one session waiting for the next call: {seen}"
        [spare] = seen
        os.kill(spare, signal.SIGKILL)  # a spare that dies is replaced: calls never queue behind a dead one
        assert wait_until(lambda: one_spare_but(spare)), f"the spare was not replaced: {seen}"
        [spare] = seen
        os.kill(server, signal.SIGKILL)
        assert wait_until(lambda: not alive(spare)), "the spare outlived its server, holding the socket"
        # The next call is not left waiting on the dead server's socket; the server it starts idles out.
        cli.ok("list", env={**env, "SUBTASK_SERVER_IDLE": "1"})
    finally:
        stop_command_servers(short_folder)
