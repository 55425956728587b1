"""The git processes a job costs (issue 14): what the starting process has found out about the
repository is not asked of git again by a worker it forked, nor per item of one start_many."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import grant_writable

from subtask import api

FIND_REPO = ("rev-parse", "--path-format=absolute")
READ_SETTINGS = ("config", "-z", "--get-regexp")


@pytest.fixture
def git_log(tmp_path, monkeypatch) -> Path:
    """Every git process from here on appends `<its parent's pid> <its arguments>` to the log."""
    shim = tmp_path / "shim"
    shim.mkdir()
    log = tmp_path / "git.log"
    (shim / "git").write_text(f'#!/bin/sh\necho "$PPID $*" >> {log}\nexec {shutil.which("git")} "$@"\n')
    (shim / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    return log


def calls(log: Path, what: tuple[str, ...], by: int | None = None) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in lines if " ".join(what) in line and (by is None or line.split()[0] == str(by))]


def test_a_forked_worker_asks_git_nothing_its_starter_knew(cli, repo, tmp_path, git_log):
    out = grant_writable(tmp_path / "out")
    out.mkdir()
    # The console script itself: `git subtask` would put git's exec-path, and its git, before the shim.
    console = [str(Path(sys.executable).parent / "git-subtask")]
    job = subprocess.run([*console, "start", f"echo $SUBTASK_WORKER_PID > {out}/worker"], cwd=repo, check=True,
                         capture_output=True, text=True, timeout=60).stdout.split()[0]
    cli.ok("wait", job)
    worker = int((out / "worker").read_text())
    assert calls(git_log, FIND_REPO), "the shim saw no git call: the test measures nothing"
    assert calls(git_log, FIND_REPO, by=worker) == []
    assert calls(git_log, READ_SETTINGS, by=worker) == []


def test_start_many_opens_each_repository_once(repo, tmp_path, monkeypatch):
    other = repo.parent / "other"
    shutil.copytree(repo, other)
    opened = []

    def repo_for(path):
        opened.append(path)
        return api.repo_at(path)

    results = api.start_many([{"task": "true", "engine": "shell", "repo": str(p)} for p in (repo, other, repo, other)],
                             repo_for=repo_for)
    assert all(isinstance(r, api.StartResult) for r in results), results
    assert sorted(opened) == sorted([str(repo), str(other)])
    for result in results:
        api.wait(api.repo_at(result.job.spec.repo), [result.job.id], timeout=60)


def run_over_mcp(repo: Path, tasks: list[str]) -> None:
    """Start `tasks` (shell jobs) with one MCP `start_many` on a real server, and wait for them."""
    import anyio
    from mcp import Client, StdioServerParameters
    from test_mcp import server_env

    async def main() -> None:
        params = StdioServerParameters(command=sys.executable, args=["-m", "subtask.faces.mcp_server"], cwd=str(repo),
                                       env=server_env())
        async with Client(params, mode="legacy") as client:
            started = await client.call_tool("start_many", {"tasks": [{"task": t, "engine": "shell"} for t in tasks]})
            jobs = [word for word in started.content[0].text.replace(".", " ").split() if word.startswith("st-")]
            assert len(jobs) == len(tasks), started.content[0].text
            await client.call_tool("wait", {"ids": jobs, "timeout": 60})

    anyio.run(main)


def test_a_worker_the_mcp_servers_zygote_forks_asks_git_nothing_its_starter_knew(repo, tmp_path, git_log):
    out = grant_writable(tmp_path / "out")
    out.mkdir()
    run_over_mcp(repo, [f"echo $SUBTASK_WORKER_PID > {out}/worker"])
    worker = int((out / "worker").read_text())
    assert calls(git_log, FIND_REPO), "the shim saw no git call: the test measures nothing"
    assert calls(git_log, FIND_REPO, by=worker) == []
    assert calls(git_log, READ_SETTINGS, by=worker) == []


def test_a_start_over_mcp_costs_the_server_no_git_process_beyond_finding_the_repository(repo, tmp_path, git_log):
    """The MCP server has pygit2 loaded before it serves a call: the branch, pins and record of a
    start are written in-process, not by ~10 git processes per job (issue 14: start_many10)."""
    out = grant_writable(tmp_path / "out")
    out.mkdir()
    run_over_mcp(repo, [f"echo $SUBTASK_WORKER_PID > {out}/worker{n}" for n in range(2)])
    workers = {(out / f"worker{n}").read_text().strip() for n in range(2)}
    servers = {line.split()[0] for line in calls(git_log, FIND_REPO)} - workers
    assert servers, "the shim saw no git call of the server: the test measures nothing"
    by_server = [line for line in git_log.read_text().splitlines() if line.split()[0] in servers]
    assert [line for line in by_server if " ".join(FIND_REPO) not in line and " ".join(READ_SETTINGS) not in line] == []
