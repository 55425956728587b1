"""Issue 8: git-subtask side by side with subtask-mcp 0.5 (PyPI), in one run on this machine.

    PYTHONPATH=. python bench/peer.py [--runs 7] [--history 5000] [--peer-venv DIR] [--initialize-only]

Installs `subtask-mcp==0.5.0` into its own temporary virtual environment (python -m venv + pip),
gives it its own HOME (a temp folder: it never sees real user data), and gives both tools the
same engine: a fake `kimi` executable on PATH (bench/peer.py writes it) that runs the first line
of its prompt as a bash script in the job's worktree, prints one stream-json assistant message and
exits 0. The peer drives it through its built-in `kimi` adapter (`kimi --output-format stream-json
-m MODEL -p PROMPT`); we drive the very same file through a `command` engine
(`subtask.engine.kimi.command = ["kimi","--output-format","stream-json","-p","{task}"]`).

Both tools work on the same generated repository (bench/common.make_repo, 2,000 files), copied
once with `cp -a` so each has its own but byte-identical copy (same commit ids). Samples of the
two tools are interleaved (ours, peer, ours, peer, ...) so both see the same machine load. Every
figure is a median; each ratio is ours / peer (lower is better for us).

Figures:
- cli_start: CLI start of a writing job (worktree + branch), process spawn to exit. The peer runs
  `git worktree add` inside start; we create the branch in start and check the worktree out in
  the worker, so our start does less of the job's set-up (e2e_recorded counts all of it).
- e2e_cli: `start` then the tool's own CLI `wait` (returns with the result line), wall clock.
- e2e_recorded: `start` to the terminal state written by the tool itself (its own timestamp:
  our last events-file entry, the peer's `end` event in progress.jsonl): no wait mechanism in it.
- mcp_wait: over MCP on a warm server, from the engine's exit (the job's task writes the time as
  its last act) to `wait`'s reply. The job sleeps 0.5 s + (i + 0.5)/runs s, so the peer's
  1-second poll is met at evenly spread phases rather than always at the same one.
- start_many10: `start_many` with 10 jobs over MCP (the peer has start_many too: it loops over
  its start) and then wait_all10: one `wait` for all 10. Both tools are allowed 10 running jobs
  (the peer refuses jobs beyond its limit, 4 by default; we would queue them).
  start_many10+wait is the sum, per sample: the peer checks worktrees out inside start, we
  check them out in the workers, so only the sum compares the same work.
- cli_start_history: cli_start again after 5,000 finished jobs were added to each tool's history
  (ours: bench/records_scale.fill_history + pack-refs, as the worker does; the peer: 5,000 job
  folders cloned from a real finished job of its own, the format it writes).
- mcp_initialize: spawn of the MCP server to the `initialize` reply (mcp SDK client, stdio).

Writes bench/results/peer.json. Targets: every ratio <= 1.0; mcp_wait <= 0.1; e2e_* <= 0.85 (and
<= 1.5 x the limit: bench/limit.sh, the same job by bare git, in the same interleaved run);
start_many10+wait <= 0.5. `--e2e-only` runs only the e2e figures (ours, peer, limit) and the
per-phase breakdown of our jobs from the worker's own marks (SUBTASK_PHASES, subtask/phases.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
# `import mcp` must find the SDK, not bench/mcp.py: keep bench off sys.path while importing it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
import anyio  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402

sys.path.append(str(BENCH))
from common import (  # noqa: E402
    cpu_loop_s,
    create_cost,
    file_system,
    loadavg,
    make_repo,
    make_wheel_venv,
    median_ms,
    save,
)
from records_scale import fill_history  # noqa: E402

PEER_VERSION = "0.5.0"
FINAL = {"done", "failed", "stopped"}
TEMPLATE = '["kimi","--output-format","stream-json","-p","{task}"]'

FAKE_KIMI = r"""#!/bin/bash
# A fake `kimi` for bench/peer.py: runs the first line of its prompt as a bash script in the
# current directory, prints one stream-json assistant message (its summary) and exits 0.
case "$1" in
  --version) echo "kimi, version 2.1.1 (fake for bench/peer.py)"; exit 0 ;;
  --help) echo "usage: kimi [--output-format FORMAT] [-m MODEL] [-S|--session ID] [-c] [-p|--prompt TEXT]"; exit 0 ;;
esac
prompt=""
while [ $# -gt 0 ]; do
  case "$1" in -p|--prompt) prompt="$2"; shift 2 ;; *) shift ;; esac
done
bash -c "${prompt%%$'\n'*}" >&2 || exit $?
echo '{"role":"assistant","content":"## Summary\n- fake kimi ran the task"}'
"""


def run(argv: list[str], cwd: Path, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{argv} -> {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


# ------------------------------------------------------------------ the two tools


class Ours:
    name = "ours"

    def __init__(self, repo: Path, fakebin: Path, wheel_venv: Path | None = None) -> None:
        self.repo = repo
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SUBTASK_")}
        self.env.update(PATH=f"{fakebin}{os.pathsep}{os.environ['PATH']}")
        if wheel_venv is None:
            self.env["PYTHONPATH"] = str(ROOT)
        self.python = str(wheel_venv / "bin" / "python") if wheel_venv else sys.executable
        exe = Path(self.python).parent / "git-subtask"
        self.cli = [str(exe)] if exe.exists() else [self.python, "-m", "subtask"]
        # pip compiled the peer's modules at install time; our tree runs from source, and this
        # machine may set PYTHONDONTWRITEBYTECODE. Compile ours too, or every CLI, worker and
        # server process of ours pays ~100 ms of compiling that an installed copy never pays.
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "subtask")], check=True,
                       env={k: v for k, v in self.env.items() if k != "PYTHONDONTWRITEBYTECODE"})
        # The scratch folder (mcp_wait's marker files) may be written by our confined jobs.
        for key, value in (("subtask.engine", "kimi"), ("subtask.engine.kimi.command", TEMPLATE),
                           ("subtask.maxRunning", "10"), ("subtask.isolation.writable", str(repo.parent))):
            run(["git", "config", key, value], repo, self.env)
        self.events = repo / ".git" / "subtask" / "run"
        self.phases = repo.parent / f"phases-{repo.name}.jsonl"  # the worker's own phase marks (subtask/phases.py)
        self.env["SUBTASK_PHASES"] = str(self.phases)

    def start(self, task: str = "true") -> str:
        out = run([*self.cli, "start", "--engine", "kimi", task], self.repo, self.env).stdout
        return out.split()[0]

    def wait_cli(self, job: str) -> str:
        return run([*self.cli, "wait", "--timeout", "120", job], self.repo, self.env, check=False).stdout

    def until_done(self, job: str) -> None:
        self.wait_cli(job)

    def recorded_at(self, job: str) -> float:
        """The tool's own timestamp of the terminal state: the last line of the events file."""
        for line in reversed((self.events / f"{job}.events.jsonl").read_text().splitlines()):
            event = json.loads(line)
            if event.get("type") == "state" and event.get("state") in FINAL:
                return event["t"]
        raise RuntimeError(f"{job}: no terminal event")

    def params(self) -> StdioServerParameters:
        script = Path(self.python).parent / "subtask-mcp"  # the console script, as clients start it
        if self.python != sys.executable and script.exists():
            return StdioServerParameters(command=str(script), args=[], cwd=str(self.repo), env=self.env)
        return StdioServerParameters(command=self.python, args=["-m", "subtask.faces.mcp_server"],
                                     cwd=str(self.repo), env=self.env)

    def start_args(self, task: str) -> dict:
        return {"task": task, "engine": "kimi"}

    def wait_args(self, ids: list[str]) -> dict:
        return {"ids": ids, "timeout": 120}

    def fill(self, count: int) -> None:
        fill_history(self.repo, count)
        run(["git", "pack-refs", "--all"], self.repo, self.env)  # what the worker does past 1,000 loose refs


class Peer:
    name = "peer"

    def __init__(self, repo: Path, venv: Path, home: Path, fakebin: Path) -> None:
        self.repo, self.venv, self.home = repo, venv, home
        # Nothing of ours may leak in: the peer's import package is also called `subtask`.
        drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
        self.env = {k: v for k, v in os.environ.items()
                    if k not in drop and not k.startswith(("SUBTASK_", "KIMI_", "XDG_"))}
        self.env.update(HOME=str(home), PATH=f"{fakebin}{os.pathsep}{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
                        SUBTASK_MAX_RUNNING="10")
        self.cli = [str(venv / "bin" / "subtask")]
        self.jobs = home / ".local" / "share" / "subtask" / "jobs"

    def start(self, task: str = "true") -> str:
        out = run([*self.cli, "start", "--engine", "kimi", "--repo", str(self.repo), task], self.repo, self.env).stdout
        if " started " not in out:
            raise RuntimeError(f"peer start refused: {out}")
        return out.split()[0]

    def wait_cli(self, job: str) -> str:
        return run([*self.cli, "wait", "--timeout", "120", job], self.repo, self.env, check=False).stdout

    def until_done(self, job: str, timeout: float = 120) -> None:
        """Read its status.json every 10 ms (cheaper than its 1 s polling CLI wait, between samples)."""
        path = self.jobs / job / "status.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if json.loads(path.read_text()).get("state") in FINAL:
                    return
            time.sleep(0.01)
        raise RuntimeError(f"peer job {job} did not end")

    def recorded_at(self, job: str) -> float:
        for line in reversed((self.jobs / job / "progress.jsonl").read_text().splitlines()):
            event = json.loads(line)
            if event.get("phase") == "end" and event.get("state") in FINAL:
                return event["ts"]
        raise RuntimeError(f"{job}: no end event")

    def params(self, sdk: bool = False) -> StdioServerParameters:
        exe = self.venv / "bin" / ("subtask-mcp-fastmcp" if sdk else "subtask-mcp")
        return StdioServerParameters(command=str(exe), args=[], cwd=str(self.repo), env=self.env)

    def start_args(self, task: str) -> dict:
        return {"task": task, "engine": "kimi", "repo": str(self.repo)}

    def wait_args(self, ids: list[str]) -> dict:
        return {"ids": ids, "timeout": 120}

    def fill(self, count: int) -> None:
        """`count` finished job folders, cloned file for file from a real finished job of the peer."""
        model_id = self.start("true")
        self.until_done(model_id)
        model = self.jobs / model_id
        files = {p.name: p.read_text() for p in model.iterdir() if p.is_file()}
        now = time.time()
        for n in range(count):
            job_id = "st-" + os.urandom(5).hex()
            folder = self.jobs / job_id
            (folder / "tmp").mkdir(parents=True)
            created = now - 86400 - n
            for name, text in files.items():
                text = text.replace(model_id, job_id)
                if name == "spec.json":
                    spec = json.loads(text)
                    spec.update(created=created, task=spec["task"].replace("true", f"historic task {n}", 1))
                    text = json.dumps(spec, ensure_ascii=False, indent=1)
                elif name == "status.json":
                    status = json.loads(text)
                    status["updated"] = created + 1
                    for attempt in status.get("attempts", []):
                        attempt.update(created=created, started=created, ended=created + 1)
                    text = json.dumps(status, ensure_ascii=False, indent=1)
                (folder / name).write_text(text)
            os.utime(folder, (created, created))


class Limit:
    """The same job by bare git commands (bench/limit.sh): what git-subtask is measured against."""
    name = "limit"

    def __init__(self, repo: Path, fakebin: Path) -> None:
        self.repo = repo
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SUBTASK_")}
        self.env["PATH"] = f"{fakebin}{os.pathsep}{os.environ['PATH']}"
        run(["git", "config", "user.name", "bench"], repo, self.env)
        run(["git", "config", "user.email", "bench@example.com"], repo, self.env)
        self.count = 0
        self.ended: dict[str, float] = {}

    def job(self, task: str = "true") -> str:
        """The whole job; the script prints its own timestamp of the note written."""
        self.count += 1
        job = f"l{self.count:04d}"
        out = run(["bash", str(BENCH / "limit.sh"), str(self.repo), job, task], self.repo, self.env).stdout
        self.ended[job] = float(out.split()[-1])
        return job

    def recorded_at(self, job: str) -> float:
        return self.ended[job]


def make_peer_venv(where: Path) -> tuple[Path, float]:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    subprocess.run([str(where / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    f"subtask-mcp=={PEER_VERSION}"], check=True, stderr=subprocess.DEVNULL)
    return where, time.perf_counter() - t0


# ------------------------------------------------------------------ measurements (interleaved)


def cli_start(tools, runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {t.name: [] for t in tools}
    for _ in range(runs):
        for tool in tools:
            t0 = time.perf_counter()
            job = tool.start("true")
            out[tool.name].append(time.perf_counter() - t0)
            tool.until_done(job)
    return out


def end_to_end(tools, runs: int, started: dict | None = None) -> tuple[dict, dict]:
    """e2e_cli and e2e_recorded, interleaved; `started` collects (job, wall time of its start) of ours."""
    cli: dict[str, list[float]] = {t.name: [] for t in tools}
    recorded: dict[str, list[float]] = {t.name: [] for t in tools}
    for _ in range(runs):
        for tool in tools:
            wall0, t0 = time.time(), time.perf_counter()
            if isinstance(tool, Limit):
                job = tool.job("true")
            else:
                job = tool.start("true")
                tool.wait_cli(job)
            cli[tool.name].append(time.perf_counter() - t0)
            recorded[tool.name].append(tool.recorded_at(job) - wall0)
            if started is not None and isinstance(tool, Ours):
                started[job] = wall0
    return cli, recorded


def phase_breakdown(phases_file: Path, started: dict[str, float]) -> dict[str, float]:
    """Median ms of each phase of ours over the e2e jobs, from the worker's own marks: a phase is
    the time from the previous mark to its own (`spawn`: the CLI's start to the worker taking the job)."""
    per_phase: dict[str, list[float]] = {}
    lines = phases_file.read_text().splitlines() if phases_file.exists() else []  # none before issue 14
    for line in lines:
        entry = json.loads(line)
        if entry["job"] not in started:
            continue
        previous = started[entry["job"]]
        for name, at in [["spawn", entry["marks"][0][1]], *entry["marks"][1:]]:
            per_phase.setdefault(name, []).append(at - previous)
            previous = at
        per_phase.setdefault("total", []).append(entry["marks"][-1][1] - started[entry["job"]])
        if "cpu" in entry:  # the worker's own CPU, and its children's (git, the engine)
            per_phase.setdefault("cpu: the worker", []).append(entry["cpu"][0] + entry["cpu"][1])
            per_phase.setdefault("cpu: its children", []).append(entry["cpu"][2] + entry["cpu"][3])
    return {name: median_ms(values) for name, values in per_phase.items()}


def print_phases(breakdown: dict[str, float], before: dict[str, float] | None = None) -> None:
    print("\nphases of one job (median ms of the e2e jobs, from the worker's marks):")
    print(f"  {'':<22}{'ours':>8}" + (f"{'before':>8}" if before is not None else ""))
    for name, ms in breakdown.items():
        print(f"  {name:<22}{ms:>8}" + (f"{before.get(name, ''):>8}" if before is not None else ""))


def e2e_only(ours: Ours, peer: Peer | None, limit: Limit, runs: int, before: Ours | None = None) -> None:
    tools = [t for t in (ours, before, peer, limit) if t is not None]
    for tool in tools:  # warm up: pyc, page cache
        limit.job("true") if tool is limit else tool.until_done(tool.start("true"))
    load0 = loadavg()
    started: dict[str, float] = {}
    e2e_cli, e2e_recorded = end_to_end(tools, runs, started)
    print(f"load {load0} -> {loadavg()}")
    for key, by_tool in (("e2e_cli", e2e_cli), ("e2e_recorded", e2e_recorded)):
        cells = "  ".join(f"{t.name} {median_ms(by_tool[t.name])}" for t in tools)
        ratios = f"ours/limit {median_ms(by_tool['ours']) / median_ms(by_tool['limit']):.2f}"
        if peer is not None:
            ratios += f"  ours/peer {median_ms(by_tool['ours']) / median_ms(by_tool['peer']):.2f}"
        print(f"{key:<14}{cells}   {ratios}")
    print_phases(phase_breakdown(ours.phases, started),
                 phase_breakdown(before.phases, started) if before is not None else None)


async def call(client: Client, name: str, args: dict) -> str:
    result = await client.call_tool(name, args)
    text = "\n".join(block.text for block in result.content if block.type == "text")
    if result.is_error:
        raise RuntimeError(f"{name}({args}) -> {text}")
    return text


def ids_in(text: str) -> list[str]:
    return [word for word in text.replace(".", " ").split() if word.startswith("st-")]


async def mcp_figures(tools, runs: int, scratch: Path) -> dict[str, dict[str, list[float]]]:
    figures = {key: {t.name: [] for t in tools} for key in ("mcp_wait", "start_many10", "wait_all10")}
    async with contextlib.AsyncExitStack() as stack:
        clients = {t.name: await stack.enter_async_context(Client(t.params(), mode="legacy")) for t in tools}
        for tool in tools:  # warm up: one job each, so the first sample pays no first-call costs
            ids = ids_in(await call(clients[tool.name], "start", tool.start_args("true")))
            await call(clients[tool.name], "wait", tool.wait_args(ids[:1]))
        for n in range(runs):
            sleep = 0.5 + (n + 0.5) / runs
            for tool in tools:
                marker = scratch / f"{tool.name}-ended"
                marker.unlink(missing_ok=True)
                task = f"sleep {sleep:.3f}; date +%s.%N > {marker}"
                ids = ids_in(await call(clients[tool.name], "start", tool.start_args(task)))
                await call(clients[tool.name], "wait", tool.wait_args(ids[:1]))
                figures["mcp_wait"][tool.name].append(time.time() - float(marker.read_text()))
        for _ in range(runs):
            for tool in tools:
                t0 = time.perf_counter()
                text = await call(clients[tool.name], "start_many", {"tasks": [tool.start_args("true")] * 10})
                t1 = time.perf_counter()
                ids = ids_in(text)
                if len(ids) != 10:
                    raise RuntimeError(f"{tool.name} start_many started {len(ids)} of 10:\n{text}")
                await call(clients[tool.name], "wait", tool.wait_args(ids))
                t2 = time.perf_counter()
                figures["start_many10"][tool.name].append(t1 - t0)
                figures["wait_all10"][tool.name].append(t2 - t1)
    return figures


async def initialize(params: dict[str, StdioServerParameters], runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in params}
    for p in params.values():  # one unmeasured start each: pyc files and page cache warm
        async with Client(p, mode="legacy"):
            pass
    for _ in range(runs):
        for name, p in params.items():
            t0 = time.perf_counter()
            async with Client(p, mode="legacy"):
                out[name].append(time.perf_counter() - t0)
    return out


def initialize_only(ours: Ours, peer: Peer, runs: int) -> None:
    plain = ours.params()
    plain = StdioServerParameters(command=plain.command, args=plain.args, cwd=plain.cwd,
                                  env={**plain.env, "SUBTASK_MCP_FRONT": "0"})
    init = anyio.run(initialize, {"ours": ours.params(), "peer": peer.params(), "peer_sdk": peer.params(sdk=True),
                                  "ours_plain": plain}, runs)
    for name, values in init.items():
        print(f"mcp_initialize {name:<11}{median_ms(values):>8} ms")
    print(f"ratio ours/peer {median_ms(init['ours']) / median_ms(init['peer']):.2f}; load {loadavg()}")


# ------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--history", type=int, default=5000)
    parser.add_argument("--peer-venv", type=Path, help="reuse a venv that has subtask-mcp==0.5.0 (else a temp one)")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (printed)")
    parser.add_argument("--initialize-only", action="store_true",
                        help="only mcp_initialize (plus ours with SUBTASK_MCP_FRONT=0); prints, saves nothing")
    parser.add_argument("--e2e-only", action="store_true",
                        help="only e2e_cli and e2e_recorded (ours, peer, limit) and ours' phases; "
                             "prints, saves nothing")
    parser.add_argument("--no-peer", action="store_true", help="with --e2e-only: ours and the limit only")
    parser.add_argument("--wheel", action="store_true",
                        help="run ours from a wheel of this checkout in a temp venv (as users install it)")
    parser.add_argument("--files", type=int, default=2000, help="files in the generated repository")
    parser.add_argument("--packed", action="store_true",
                        help="the generated repository's objects in one pack, as a clone has them (a --no-local "
                             "clone of it); by default they are loose, as a commit made here leaves them")
    parser.add_argument("--before", type=Path, help="with --e2e-only: another tree of git-subtask (e.g. `git archive`"
                                                    " of main) run as a fourth tool, `before`, in the same rounds")
    parser.add_argument("--settle", type=float, default=0.0, metavar="SECONDS",
                        help="sync, then wait this long before measuring: on ext4 without a journal, inodes "
                             "freed in the last minute (six, while unwritten) make every checkout dearer")
    args = parser.parse_args()
    if args.runs < 5:
        parser.error("--runs must be at least 5")
    tmp = Path(tempfile.mkdtemp(prefix="subtask-peer-bench-"))
    load_before = loadavg()
    # Checkout-bound figures follow the cost of creating a file, which a recent large delete on
    # this file system can multiply (bench/common.create_cost): read it before and after.
    create_us = {"before": create_cost(tmp)}
    cpu_loop = {"before": cpu_loop_s()}
    print(f"file system {file_system(tmp)}; creating a file {create_us['before']} us; "
          f"a loop of 10^7 additions {cpu_loop['before']} s", flush=True)
    if args.settle:
        os.sync()
        time.sleep(args.settle)
        create_us["settled"] = create_cost(tmp)
        print(f"after {args.settle:g} s: creating a file {create_us['settled']} us", flush=True)
    try:
        if args.e2e_only and args.no_peer:
            venv, install_s = None, 0.0
        elif args.peer_venv:
            venv, install_s = args.peer_venv, 0.0
        else:
            venv, install_s = make_peer_venv(tmp / "peer-venv")
        if venv is not None:
            version = subprocess.run([str(venv / "bin" / "python"), "-c",
                                      "import importlib.metadata as m; print(m.version('subtask-mcp'))"],
                                     capture_output=True, text=True, env={"PATH": os.environ["PATH"]}).stdout.strip()
            assert version == PEER_VERSION, f"peer venv has subtask-mcp {version!r}, not {PEER_VERSION}"
        fakebin = tmp / "bin"
        fakebin.mkdir()
        (fakebin / "kimi").write_text(FAKE_KIMI)
        (fakebin / "kimi").chmod(0o755)
        (tmp / "peer-home").mkdir()
        repo_ours = make_repo(tmp / "repo-ours", files=50 if args.initialize_only else args.files, packed=args.packed)
        subprocess.run(["cp", "-a", str(repo_ours), str(tmp / "repo-peer")], check=True)
        subprocess.run(["cp", "-a", str(repo_ours), str(tmp / "repo-limit")], check=True)
        ours = Ours(repo_ours, fakebin, make_wheel_venv(tmp / "ours-venv") if args.wheel else None)
        peer = Peer(tmp / "repo-peer", venv, tmp / "peer-home", fakebin) if venv is not None else None
        limit = Limit(tmp / "repo-limit", fakebin)
        if args.initialize_only:
            initialize_only(ours, peer, args.runs)
            return
        if args.e2e_only:
            before = None
            if args.before:
                subprocess.run(["cp", "-a", str(repo_ours), str(tmp / "repo-before")], check=True)
                before = Ours(tmp / "repo-before", fakebin, make_wheel_venv(tmp / "before-venv", args.before.resolve()))
                before.name = "before"
            e2e_only(ours, peer, limit, args.runs, before)
            return
        tools = [ours, peer]
        for tool in tools:  # warm up the CLI of each (pyc, page cache) before any sample
            tool.until_done(tool.start("true"))

        samples: dict[str, dict[str, list[float]]] = {}
        print("cli start ...", flush=True)
        samples["cli_start"] = cli_start(tools, args.runs)
        print("end to end ...", flush=True)
        limit.job("true")  # warm up
        started: dict[str, float] = {}
        samples["e2e_cli"], samples["e2e_recorded"] = end_to_end([*tools, limit], args.runs, started)
        breakdown = phase_breakdown(ours.phases, started)
        print("mcp wait, start_many ...", flush=True)
        samples.update(anyio.run(mcp_figures, tools, args.runs, tmp))
        print("mcp initialize ...", flush=True)
        init = anyio.run(initialize, {"ours": ours.params(), "peer": peer.params(),
                                      "peer_sdk": peer.params(sdk=True)}, args.runs)
        samples["mcp_initialize"] = {"ours": init["ours"], "peer": init["peer"]}
        samples["start_many10+wait"] = {
            t: [a + b for a, b in zip(samples["start_many10"][t], samples["wait_all10"][t], strict=True)]
            for t in ("ours", "peer")}
        print(f"filling {args.history} finished jobs into each history ...", flush=True)
        t0 = time.perf_counter()
        ours.fill(args.history)
        fill_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        peer.fill(args.history)
        fill_peer = time.perf_counter() - t0
        samples["cli_start_history"] = cli_start(tools, args.runs)
        create_us["after"] = create_cost(tmp)
        cpu_loop["after"] = cpu_loop_s()
    finally:
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    targets = {"mcp_wait": 0.1, "e2e_cli": 0.85, "e2e_recorded": 0.85, "start_many10+wait": 0.5}
    rows = {}
    for key, by_tool in samples.items():
        a, b = median_ms(by_tool["ours"]), median_ms(by_tool["peer"])
        rows[key] = {"ours_ms": a, "peer_ms": b, "ratio": round(a / b, 2), "target": targets.get(key, 1.0)}
        if "limit" in by_tool:
            rows[key]["limit_ms"] = median_ms(by_tool["limit"])
            rows[key]["ours_per_limit"] = round(a / rows[key]["limit_ms"], 2)
    info = {
        "peer_sdk_server_initialize_ms": median_ms(init["peer_sdk"]),
        "history_growth_ours": round(rows["cli_start_history"]["ours_ms"] / rows["cli_start"]["ours_ms"], 2),
        "history_growth_peer": round(rows["cli_start_history"]["peer_ms"] / rows["cli_start"]["peer_ms"], 2),
        "fill_history_s": {"ours": round(fill_ours, 1), "peer": round(fill_peer, 1)},
        "peer_install_s": round(install_s, 1),
        "load_before": load_before, "load_after": loadavg(),
        "file_system": file_system(Path(tempfile.gettempdir())), "create_file_us": create_us,
        "cpu_loop_s": cpu_loop, "objects": "packed" if args.packed else "loose",
    }
    print(f"\n{'figure':<20}{'ours ms':>10}{'peer ms':>10}{'ratio':>8}  target")
    for key, row in rows.items():
        verdict = "ok" if row["ratio"] <= row["target"] else "MISSED"
        limit_cell = f"   limit {row['limit_ms']} ms, ours/limit {row['ours_per_limit']}" if "limit_ms" in row else ""
        print(f"{key:<20}{row['ours_ms']:>10}{row['peer_ms']:>10}{row['ratio']:>8}  "
              f"<= {row['target']} {verdict}{limit_cell}")
    print_phases(breakdown)
    for key, value in info.items():
        print(f"{key}: {value}")
    path = save("peer_packed" if args.packed else "peer",
                {"peer": f"subtask-mcp=={PEER_VERSION}", "runs": args.runs, "history": args.history,
                 "figures": rows, "info": info, "phases_ms": breakdown,
                 "raw_ms": {k: {t: [round(s * 1000, 1) for s in v] for t, v in d.items()}
                            for k, d in samples.items()}})
    print("saved", path)


if __name__ == "__main__":
    main()
