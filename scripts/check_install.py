"""Check the wheel as a user gets it: build, install into a clean venv, run the CLI and the MCP server.

    python scripts/check_install.py [--keep]

Builds the wheel (`python -m build --wheel`) into a temporary folder, installs it into a fresh
virtual environment (dependencies from the package index), then with that environment's tools
only: `git subtask --version`, a shell job started and waited in a scratch repository, and a real
MCP stdio session with `subtask-mcp` (list tools, start, wait). Exits non-zero with a clear
message on the first failure. PYTHONPATH is cleared so the source tree can never stand in for the
installed package.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CLIENT = r'''
import sys, anyio
from mcp import Client, StdioServerParameters

async def main(server, repo):
    params = StdioServerParameters(command=server, cwd=repo)
    async with Client(params, mode="legacy") as client:
        names = sorted(t.name for t in (await client.list_tools()).tools)
        print("tools:", " ".join(names))
        assert {"start", "start_many", "wait", "result"} <= set(names), names
        started = await client.call_tool("start", {"task": "echo mcp > mcp.txt", "engine": "shell"})
        assert not started.is_error, started
        job = started.content[0].text.split()[0]
        waited = await client.call_tool("wait", {"ids": [job], "timeout": 60})
        assert not waited.is_error and " done " in waited.content[0].text, waited
        print("wait:", waited.content[0].text)

anyio.run(main, sys.argv[1], sys.argv[2])
'''


class CheckFailed(Exception):
    pass


def run(argv: list, *, env: dict, cwd: Path | None = None, what: str) -> str:
    print(f"$ {' '.join(map(str, argv))}", flush=True)
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise CheckFailed(f"{what} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout.strip()


def clean_env(venv: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SUBTASK_REPO")}
    env.update(GIT_AUTHOR_NAME="check", GIT_AUTHOR_EMAIL="check@example.com",
               GIT_COMMITTER_NAME="check", GIT_COMMITTER_EMAIL="check@example.com")
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _processes_under(venv: Path) -> list[int]:
    """Processes whose command line names the venv (a server, a worker still running)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if str(venv).encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def check(tmp: Path) -> None:
    """The wheel's commands, and that a call leaves no process behind."""
    dist, venv, repo = tmp / "dist", tmp / "venv", tmp / "repo"
    run([sys.executable, "-m", "build", "--wheel", "--outdir", dist, ROOT], env=clean_env(), what="building the wheel")
    wheels = list(dist.glob("git_subtask-*.whl"))
    if len(wheels) != 1:
        raise CheckFailed(f"expected one wheel in {dist}, found {[w.name for w in wheels]}")
    run([sys.executable, "-m", "venv", venv], env=clean_env(), what="creating the virtual environment")
    env = clean_env(venv)
    run([venv / "bin" / "pip", "install", "--quiet", wheels[0]], env=env, what="installing the wheel")
    for script in ("git-subtask", "subtask-mcp"):
        if not (venv / "bin" / script).exists():
            raise CheckFailed(f"the wheel installed no {script} console script")
    version = run(["git", "subtask", "--version"], env=env, what="git subtask --version")
    print(version)
    check_manual(venv, env)
    repo.mkdir()
    run(["git", "init", "-q", "-b", "main"], cwd=repo, env=env, what="git init")
    run(["git", "commit", "-q", "--allow-empty", "-m", "init"], cwd=repo, env=env, what="git commit")
    job = run(["git", "subtask", "start", "--engine", "shell", "echo hi > hi.txt"], cwd=repo, env=env,
              what="git subtask start").split()[0]
    print(run(["git", "subtask", "wait", "--timeout", "60", job], cwd=repo, env=env, what="git subtask wait"))
    print(run(["git", "subtask", "show", job], cwd=repo, env=env, what="git subtask show"))
    deadline = time.monotonic() + 30  # the worker lets go of its run-lock a moment before it exits
    while (left := _processes_under(venv)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        raise CheckFailed(f"git subtask left processes running: {left}")
    client = tmp / "client.py"
    client.write_text(CLIENT)
    print(run([venv / "bin" / "python", client, venv / "bin" / "subtask-mcp", repo], cwd=tmp, env=env,
              what="the MCP stdio session with subtask-mcp"))


def check_manual(venv: Path, env: dict) -> None:
    """`git subtask --help` makes git open git-subtask(1): the wheel must put it where man looks."""
    page = venv / "share" / "man" / "man1" / "git-subtask.1"
    if not page.exists():
        raise CheckFailed(f"the wheel installed no manual page at {page}")
    if not (venv / "share" / "doc" / "git-subtask" / "git-subtask.html").exists():
        raise CheckFailed("the wheel installed no HTML manual")
    if shutil.which("man") is None:
        print("man is not installed here: skipping `git subtask --help`")
        return
    shown = run(["git", "subtask", "--help"], env=dict(env, MANPAGER="cat", PAGER="cat", MANWIDTH="100"),
                what="git subtask --help")
    if "git subtask start" not in shown:
        raise CheckFailed(f"git subtask --help did not show the manual page:\n{shown[:500]}")
    print("git subtask --help: the manual page opens")
    usage = run(["git", "subtask", "-h"], env=env, what="git subtask -h")
    if "Usage:" not in usage:
        raise CheckFailed("git subtask -h printed no usage")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder and say where it is")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="subtask-check-install-"))
    try:
        check(tmp)
    except CheckFailed as exc:
        print(f"check_install: FAILED: {exc}", file=sys.stderr)
        return 1
    except subprocess.TimeoutExpired as exc:
        print(f"check_install: FAILED: timed out: {exc.cmd}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("check_install: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
