"""The workers' fork server (subtask.worker.zygote): real MCP servers, real zygotes, real workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import git, wait_until
from test_mcp import JsonRpc, job_id_in, server_env

from subtask.git.gitrepo import open_repo
from subtask.ops.running.lifecycle import read_pids
from subtask.state import liveness


def ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if ppid(int(name)) == pid and alive(int(name)):
                    found.append(int(name))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


class Server:
    def __init__(self, repo: Path, **env: str) -> None:
        self.repo = repo
        self.proc = subprocess.Popen([sys.executable, "-m", "subtask.faces.mcp_server"], cwd=str(repo),
                                     env=dict(server_env(), **env), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.rpc = JsonRpc(self.proc)
        self.rpc.initialize()
        assert wait_until(lambda: len(children(self.proc.pid)) == 1), "no zygote"
        [self.zygote] = children(self.proc.pid)

    def start(self, task: str) -> tuple[str, int]:
        job = job_id_in(self.rpc.call_tool("start", {"task": task}))
        return job, read_pids(open_repo(self.repo).state_dir, job)["worker"]

    def wait(self, job: str) -> str:
        return self.rpc.call_tool("wait", {"ids": [job], "timeout": 60})

    def close(self) -> str:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        return self.proc.stderr.read().decode()


def held(gate: Path, then: str) -> str:
    """A shell task that runs `then` once the test creates `gate` (its worker is alive till then)."""
    return f"while [ ! -e '{gate}' ]; do sleep 0.02; done; {then}"


def test_the_server_starts_workers_through_its_zygote(repo, tmp_path):
    server = Server(repo)
    gate = tmp_path / "gate"
    try:
        jobs = []
        for n in range(3):
            job, worker = server.start(held(gate, f"echo {n} > out.txt"))
            assert ppid(worker) == server.zygote, "the worker was not forked by the zygote"
            jobs.append(job)
        gate.touch()
        for n, job in enumerate(jobs):
            assert server.wait(job).startswith(f"{job} done")
            assert git(repo, "show", f"subtask/{job}:out.txt") == str(n)
        assert wait_until(lambda: children(server.zygote) == []), "the zygote did not reap its workers"
    finally:
        gate.touch()
        stderr = server.close()
    assert "fork server failed" not in stderr, stderr


def test_a_worker_forked_by_the_zygote_imports_nothing(repo, tmp_path):
    """The zygote preloads what a worker runs (issue 14): a module left to the worker is imported
    again by every one of them (filelock alone took ~30 ms of each worker's CPU)."""
    marks_file = tmp_path / "phases.jsonl"
    server = Server(repo, SUBTASK_PHASES=str(marks_file))
    try:
        job, worker = server.start("echo x > x.txt")
        assert ppid(worker) == server.zygote
        assert server.wait(job).startswith(f"{job} done")
    finally:
        server.close()
    # The worker writes its marks after letting go of the run-lock, which is what `wait` waits for.
    assert wait_until(lambda: marks_file.exists() and marks_file.read_text().endswith("\n"), timeout=30)
    [entry] = [json.loads(line) for line in marks_file.read_text().splitlines()]
    assert entry["imported"] == [], " ".join(entry["imported"])


def test_the_worker_holds_the_run_lock_alone(repo, tmp_path):
    """The server and the zygote close their copies without unlocking; wait wakes when the worker ends."""
    server = Server(repo)
    gate = tmp_path / "gate"
    try:
        job, worker = server.start(held(gate, "echo x > out.txt"))
        state_dir = open_repo(repo).state_dir
        lock = str(liveness.lock_path(state_dir, job))
        assert liveness.is_held(state_dir, job)
        for pid in (server.proc.pid, server.zygote):
            fds = os.listdir(f"/proc/{pid}/fd")
            assert lock not in {os.path.realpath(f"/proc/{pid}/fd/{fd}") for fd in fds}, pid
        gate.touch()
        began = time.monotonic()
        assert server.wait(job).startswith(f"{job} done")
        assert time.monotonic() - began < 30  # a leaked lock copy would hold wait to its 60 s timeout
        assert not liveness.is_held(state_dir, job)
    finally:
        gate.touch()
        server.close()


def test_a_dead_zygote_means_fresh_interpreters(repo):
    server = Server(repo)
    try:
        os.kill(server.zygote, signal.SIGKILL)
        assert wait_until(lambda: not alive(server.zygote))
        job, worker = server.start("echo late > out.txt")
        assert ppid(worker) == server.proc.pid  # exec'd by the server itself
        assert server.wait(job).startswith(f"{job} done")
        job, worker = server.start("echo later > out.txt")  # and on, without asking the zygote again
        assert server.wait(job).startswith(f"{job} done")
    finally:
        stderr = server.close()
    assert stderr.count("fork server failed") <= 1, stderr  # 0 when the preload found it gone


def test_the_zygote_dies_with_its_server(repo, tmp_path):
    server = Server(repo)
    server.close()
    assert wait_until(lambda: not alive(server.zygote), timeout=60)
    server = Server(repo)
    gate = tmp_path / "gate"  # the worker's job runs until the test has seen it outlive both
    try:
        job, worker = server.start(held(gate, "echo x > out.txt"))
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=20)
        assert wait_until(lambda: not alive(server.zygote), timeout=60)
        assert alive(worker), "the worker must outlive the server and its zygote"
    finally:
        gate.touch()
    liveness.wait_released(open_repo(repo).state_dir, job)
    assert git(repo, "show", f"subtask/{job}:out.txt") == "x"


def test_no_zygote_when_spawns_must_exec(repo):
    proc = subprocess.Popen([sys.executable, "-m", "subtask.faces.mcp_server"], cwd=str(repo),
                            env=dict(server_env(), SUBTASK_SPAWN="exec"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    JsonRpc(proc).initialize()
    time.sleep(0.3)
    assert children(proc.pid) == []
    proc.stdin.close()
    proc.wait(timeout=30)


def test_the_worker_runs_with_the_callers_environment_at_request_time(repo, cli):
    """The zygote's environment is the one its parent had at fork time; the request's wins."""
    script = textwrap.dedent("""
        import os, sys, threading, time
        from subtask.worker import zygote
        z = zygote.start()
        assert z is not None
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # no fork from here
        os.environ["SUBTASK_FAULT"] = "worker_start"  # set after the zygote was forked
        from subtask import api
        from subtask.git.gitrepo import open_repo
        from subtask.ops.running.lifecycle import read_pids
        repo = open_repo(".")
        job = api.start(repo, api.StartRequest(task="echo x > out.txt")).job.id
        worker = read_pids(repo.state_dir, job)["worker"]
        print(job, worker, z.pid)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=str(repo), env=server_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job, worker, zygote_pid = proc.stdout.split()
    liveness.wait_released(open_repo(repo).state_dir, job)
    assert "fork server failed" not in proc.stderr, proc.stderr
    cli("list")  # settles the dead worker
    detail = cli.json("show", job)["state_detail"]["attempts"][0]
    assert detail["reason"] == "worker died"  # SUBTASK_FAULT=worker_start reached the worker


def test_a_zygote_whose_server_left_while_it_preloaded_exits_quietly(repo):
    """The server asked for the preload and went away before the zygote said "ready" (a client
    that closed it at once): the zygote's reply finds no one there, and it exits 0 without a
    traceback on the server's stderr."""
    script = textwrap.dedent("""
        import os
        from subtask.worker import zygote
        z = zygote.start()
        z.preload()   # the zygote starts importing what a worker needs
        z.retire()    # and its server closes the socket before the zygote can say ready
        _, status = os.waitpid(z.pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=str(repo), env=server_env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "0", (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
