"""Speed of the MCP server over real stdio: start-up, warm status/list calls, wait's wake-up.

    PYTHONPATH=. python bench/mcp.py [--calls 50] [--starts 7] [--startup-only] [--plain]

Start-up figures, each from the spawn of the server process (mcp SDK client, stdio):
- initialize_ms: to the `initialize` reply (the client's enter: it also sends notifications/initialized).
- init_closed_ms: initialize, then close stdin and wait for the server to exit: what bench/peer.py
  calls mcp_initialize (the SDK client's `async with Client(...): pass`).
- tools_list_ms: to the `tools/list` reply, sent right after initialize (as Claude Code does).
- first_call_ms: to the reply of a first `tools/call` (status), sent right after tools/list.
Each is measured with the fast front end (the default) and with SUBTASK_MCP_FRONT=0 (the plain
SDK path), samples interleaved; `plain_` figures are the latter. The warm figures (status, list,
wait's wake-up) use one server: the default path, or the plain one with --plain (--starts 0
skips the start-up figures).

Spawn figures (--spawns N rounds, 0 skips them): on a warm server, start_many10_ms is `start_many`
of 10 `true` jobs and all10_ms that plus one `wait` for all 10; `exec_` figures are the same with
SUBTASK_ZYGOTE=0 (every worker a fresh interpreter instead of a fork of the zygote), one server
of each kind, rounds interleaved.

Prints a table and writes JSON to bench/results/mcp-<time>.json. Targets: warm status and list
p50 <= 20 ms; wait returns <= 100 ms after its job ends (the peer subtask-mcp 0.5 polls once a second).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
# This file is named mcp.py: keep its own folder off the path so `import mcp` finds the SDK.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from mcp import Client, StdioServerParameters  # noqa: E402


def make_repo(path: Path) -> Path:
    env = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@x",
               GIT_COMMITTER_NAME="b", GIT_COMMITTER_EMAIL="b@x")
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "init"],
                 ["config", "subtask.engine", "shell"], ["config", "subtask.maxRunning", "10"]):
        subprocess.run(["git", "-C", str(path), *args], check=True, env=env)
    return path


def params(repo: Path, **extra_env: str) -> StdioServerParameters:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra_env)
    return StdioServerParameters(command=sys.executable, args=["-m", "subtask.faces.mcp_server"],
                                 cwd=str(repo), env=env)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def timed(client: Client, name: str, args: dict) -> tuple[float, str]:
    started = time.perf_counter()
    result = await client.call_tool(name, args)
    elapsed = (time.perf_counter() - started) * 1000
    assert not result.is_error, result
    return elapsed, result.content[0].text


STARTUP = ("initialize_ms", "init_closed_ms", "tools_list_ms", "first_call_ms")


async def startup(repo: Path, starts: int) -> dict[str, list[float]]:
    """Start-up figures, fast front end and plain SDK path interleaved; one unmeasured start each."""
    figures: dict[str, list[float]] = {f"{prefix}{name}": [] for prefix in ("", "plain_") for name in STARTUP}
    for n in range(starts + 1):
        for prefix, env in (("", {}), ("plain_", {"SUBTASK_MCP_FRONT": "0"})):
            ms = lambda since: (time.perf_counter() - since) * 1000  # noqa: E731
            started = time.perf_counter()
            async with Client(params(repo, **env), mode="legacy"):
                initialized = ms(started)
            closed = ms(started)
            started = time.perf_counter()
            async with Client(params(repo, **env), mode="legacy") as client:
                await client.list_tools()
                listed = ms(started)
                await timed(client, "status", {})
                called = ms(started)
            if n:  # the first round warms pyc files and the page cache
                for name, value in zip(STARTUP, (initialized, closed, listed, called), strict=True):
                    figures[prefix + name].append(value)
    return figures


async def spawns(repo: Path, rounds: int) -> dict[str, list[float]]:
    """start_many of 10 trivial jobs, then one wait for all: zygote forks vs fresh interpreters."""
    figures: dict[str, list[float]] = {f"{p}{n}": [] for p in ("", "exec_") for n in ("start_many10_ms", "all10_ms")}
    async with Client(params(repo), mode="legacy") as zygote, \
            Client(params(repo, SUBTASK_ZYGOTE="0"), mode="legacy") as plain:
        for n in range(rounds + 1):
            for prefix, client in (("", zygote), ("exec_", plain)):
                started = time.perf_counter()
                ms, text = await timed(client, "start_many", {"tasks": [{"task": "true"}] * 10})
                ids = [line.split()[1] for line in text.splitlines()]
                assert len(ids) == 10, text
                await timed(client, "wait", {"ids": ids, "timeout": 120})
                total = (time.perf_counter() - started) * 1000
                if n:  # the first round warms up
                    figures[prefix + "start_many10_ms"].append(ms)
                    figures[prefix + "all10_ms"].append(total)
    return figures


async def measure(repo: Path, calls: int, starts: int, startup_only: bool, plain: bool, rounds: int = 0) -> dict:
    figures = await startup(repo, starts) if starts else {}
    if startup_only:
        return figures
    if rounds:
        figures.update(await spawns(repo, rounds))
    figures.update({"status_ms": [], "list_ms": [], "wait_wake_ms": []})
    async with Client(params(repo, **({"SUBTASK_MCP_FRONT": "0"} if plain else {})), mode="legacy") as client:
        for _ in range(3):  # a few finished jobs so list has rows
            _, line = await timed(client, "start", {"task": "true"})
            await timed(client, "wait", {"ids": [line.split()[0]]})
        for _ in range(3):  # warm up
            await timed(client, "status", {})
            await timed(client, "list", {})
        for _ in range(calls):
            figures["status_ms"].append((await timed(client, "status", {}))[0])
            figures["list_ms"].append((await timed(client, "list", {}))[0])
        # Outside the worktree, so granted the way a user grants a folder (jobs are confined to theirs).
        marker = repo.parent / "marks" / "bench-ended"
        marker.parent.mkdir(exist_ok=True)
        subprocess.run(["git", "-C", str(repo), "config", "--add", "subtask.isolation.writable", str(marker.parent)],
                       check=True)
        for _ in range(5):
            # The job writes the time it ends as its last act; wait's reply is timed against it.
            _, line = await timed(client, "start",
                                  {"task": f"sleep 0.5; python3 -c 'import time; print(time.time())' > {marker}"})
            await timed(client, "wait", {"ids": [line.split()[0]]})
            figures["wait_wake_ms"].append((time.time() - float(marker.read_text())) * 1000)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--starts", type=int, default=7)
    parser.add_argument("--startup-only", action="store_true", help="only the start-up figures")
    parser.add_argument("--spawns", type=int, default=5, help="rounds of start_many10 + wait, zygote vs exec")
    parser.add_argument("--plain", action="store_true", help="warm figures on the plain SDK path (SUBTASK_MCP_FRONT=0)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures = anyio.run(measure, make_repo(Path(tmp)), args.calls, args.starts, args.startup_only, args.plain,
                            args.spawns)
    rows = {name: {"p50": statistics.median(v), "p90": pct(v, 0.9), "max": max(v), "n": len(v)}
            for name, v in figures.items()}
    targets = {"status_ms": 20, "list_ms": 20, "wait_wake_ms": 100}
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'figure':<20}{'p50':>9}{'p90':>9}{'max':>9}{'n':>5}  target")
    for name, row in rows.items():
        target = targets.get(name)
        verdict = "" if target is None else f"<= {target} ms {'ok' if row['p50'] <= target else 'MISSED'}"
        print(f"{name:<20}{row['p50']:>9.1f}{row['p90']:>9.1f}{row['max']:>9.1f}{row['n']:>5}  {verdict}")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"mcp-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"figures": rows, "raw": figures, "loadavg": os.getloadavg(),
                                "python": sys.version.split()[0]}, indent=2))
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
