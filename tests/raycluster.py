"""A local two-node Ray cluster for the tests and the bench, that never outlives its user.

`Cluster.start(base)` runs this file as a *keeper* process (`python tests/raycluster.py`): it
makes itself a child subreaper (PR_SET_CHILD_SUBREAPER), so every process Ray daemonizes (GCS,
raylets, dashboard, workers, job supervisors, entrypoints and their watchers) stays its
descendant; it starts the head (`subtask_slot: 2`) and a second node (`subtask_slot: 2` plus
`subtask_node2`) with `ray start --block`, each with its own temp dir and free ports (outside
Ray's default worker range, so another run on this machine cannot clash), and then reads
commands on stdin:

- `kill-raylet node2`: SIGKILL that node's raylet (a node lost mid-job).
- `stop` or end of input: SIGTERM every descendant, SIGKILL what is left after a grace, exit.

End of input is the safety net: when the test process dies, its end of the pipe closes and the
keeper takes the whole cluster down with it. Never `ray stop`, which would kill every Ray on the
machine (another engineer's run too).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
READY = "ready"
# How long the keeper waits for each step of the cluster coming up (seconds).
PATIENCE = 120


# ---------------------------------------------------------------- the keeper (its own process)

_handed_out: set[int] = set()  # by `_free_port`: the kernel may offer a closed one again


def _free_port() -> int:
    """A port free now that this keeper has not handed out before (two Ray components given the
    same port: the node is refused)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def _worker_port_candidates(size: int) -> range:
    """First ports for a block of `size` worker ports: above Ray's own 10002-19999 and outside the
    kernel's ephemeral range, so no port the kernel hands out (our `_free_port`, or any process's
    outgoing connection) can land in the block; Ray refuses a node whose block holds another of
    its ports."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    below = range(20000, low - size + 1)
    return below if len(below) >= 1000 else range(max(20000, high + 1), 65536 - size)


def _free_block(size: int = 60) -> int:
    """The first port of `size` consecutive ports that all bind now."""
    import random

    candidates = _worker_port_candidates(size)
    for _ in range(200):
        first = random.choice(candidates)
        try:
            for port in range(first, first + size):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
    raise RuntimeError("no free port block")


def _node_args(temp: Path, resources: dict) -> list[str]:
    workers = _free_block()
    return [
        "--node-ip-address=127.0.0.1", f"--temp-dir={temp}", "--num-cpus=2",
        f"--resources={json.dumps(resources)}", f"--node-manager-port={_free_port()}",
        f"--object-manager-port={_free_port()}", f"--min-worker-port={workers}",
        f"--max-worker-port={workers + 59}", f"--metrics-export-port={_free_port()}",
        f"--dashboard-agent-listen-port={_free_port()}", f"--dashboard-agent-grpc-port={_free_port()}",
        f"--runtime-env-agent-port={_free_port()}", "--object-store-memory=80000000",
        "--disable-usage-stats", "--block",
    ]


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _kill_all(grace: float = 5.0) -> None:
    me = os.getpid()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _descendants(me):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 10)
        while time.monotonic() < deadline:
            _reap()
            if not _descendants(me):
                return
            time.sleep(0.1)


def _fail_if_exited(nodes: dict[str, subprocess.Popen]) -> None:
    """`ray start --block` lives as long as its node: once it has exited, nothing will come up."""
    for name, proc in nodes.items():
        if proc.poll() is not None:
            raise RuntimeError(f"`ray start` for the {name} exited with {proc.returncode}")


def _wait_for_dashboard(port: int, timeout: float, nodes: dict[str, subprocess.Popen]) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _fail_if_exited(nodes)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/version", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the Ray dashboard did not answer on {port} within {timeout:g}s")


def _wait_for_nodes(address: str, count: int, timeout: float, nodes: dict[str, subprocess.Popen]) -> None:
    """Poll the dashboard's state API (what `ray list nodes` asks, without a process importing
    Ray each time: ~1 s of CPU a poll)."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _fail_if_exited(nodes)
        try:
            with urllib.request.urlopen(f"{address}/api/v0/nodes?limit=100&timeout=10&detail=false",
                                        timeout=15) as resp:
                listed = json.load(resp)["data"]["result"]["result"]
            alive = [n for n in listed if n.get("state") == "ALIVE"]
        except (OSError, ValueError, KeyError, TypeError):
            alive = []
        if len(alive) >= count:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{count} Ray nodes were not alive within {timeout:g}s")


def keeper(base: Path, ray: str) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    signal.signal(signal.SIGTERM, lambda *_: (_kill_all(), os._exit(0)))
    gcs, dashboard = _free_port(), _free_port()
    head_temp, node2_temp = base / "h", base / "n2"
    # Each node works in its own cache folder (SUBTASK_RAY_CACHE); the console scripts of this
    # interpreter come first on PATH, as on a node where git-subtask is installed.
    # Ray's dashboard gives its nine module processes 30 s each and itself 60 s, then exits 1: on
    # a loaded machine (CI: -n 4 on 2 cores) that is too short, so Ray waits as long as we do.
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0",
               RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT=str(PATIENCE),
               RAY_DASHBOARD_STARTUP_TIMEOUT_S=str(PATIENCE),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    logs = open(base / "cluster.log", "ab")
    try:
        nodes: dict[str, subprocess.Popen] = {}

        def start_node(name: str, cache: str, args: list[str]) -> None:
            nodes[name] = subprocess.Popen([ray, "start", *args], stdin=subprocess.DEVNULL,
                                           stdout=logs, stderr=logs,
                                           env=dict(env, SUBTASK_RAY_CACHE=str(base / cache)))

        start_node("head", "cache-head", [
            "--head", f"--port={gcs}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
            "--include-dashboard=true", f"--ray-client-server-port={_free_port()}",
            *_node_args(head_temp, {"subtask_slot": 2})])
        address = f"http://127.0.0.1:{dashboard}"
        # The second node joins only once the head is listed alive: GCS listens before the head
        # has registered itself, and a node that finds no head there gives up (under load, CI).
        _wait_for_dashboard(dashboard, PATIENCE, nodes)
        _wait_for_nodes(address, 1, PATIENCE, nodes)
        start_node("second node", "cache-node2", [
            f"--address=127.0.0.1:{gcs}",
            *_node_args(node2_temp, {"subtask_slot": 2, "subtask_node2": 2})])
        _wait_for_nodes(address, 2, PATIENCE, nodes)
        print(json.dumps({"status": READY, "address": address,
                          "gcs": f"127.0.0.1:{gcs}", "node2_temp": str(node2_temp)}), flush=True)
        for line in sys.stdin:
            word = line.split()
            if word[:1] == ["kill-raylet"]:
                temp = str(node2_temp if word[1:] == ["node2"] else head_temp)
                killed = [pid for pid in _descendants(os.getpid())
                          if "raylet" in _cmdline(pid).split(" ")[0] and temp in _cmdline(pid)]
                for pid in killed:
                    os.kill(pid, signal.SIGKILL)
                print(json.dumps({"killed": killed}), flush=True)
            elif word[:1] == ["stop"]:
                break
            _reap()
    except Exception as exc:  # say why on stdout, for the test to show
        print(json.dumps({"status": "error", "error": str(exc)}), flush=True)
    finally:
        _kill_all()
    return 0


# ---------------------------------------------------------------- the client (the test's side)

class Cluster:
    """The test's handle on a keeper: its address, kill a node's raylet, stop."""

    def __init__(self, proc: subprocess.Popen, base: Path, info: dict):
        self.proc, self.base, self.info = proc, base, info
        self.address: str = info["address"]

    @classmethod
    def start(cls, env: dict | None = None, ray: Path | None = None) -> Cluster:
        """Start a keeper and its two nodes (`env`: the nodes' environment, default this one's;
        `ray`: the `ray` command, default this interpreter's)."""
        ray = ray or Path(sys.executable).parent / "ray"
        base = Path(tempfile.mkdtemp(prefix="strt", dir="/tmp"))  # short: Ray's unix socket paths
        proc = subprocess.Popen([sys.executable, __file__, str(base), str(ray)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, start_new_session=True, env=env)
        line = proc.stdout.readline()
        info = json.loads(line) if line.strip() else {"status": "error", "error": "the keeper exited"}
        if info.get("status") != READY:
            cluster = cls(proc, base, {"address": ""})
            log = (base / "cluster.log").read_text(errors="replace")[-3000:] if (base / "cluster.log").exists() else ""
            cluster.stop()
            raise RuntimeError(f"the Ray cluster did not start: {info.get('error')}\n{log}")
        return cls(proc, base, info)

    def kill_raylet(self, node: str = "node2") -> list[int]:
        self.proc.stdin.write(f"kill-raylet {node}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["killed"]

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self.proc.stdin.write("stop\n")
                    self.proc.stdin.close()
                except (BrokenPipeError, ValueError):
                    pass
                try:
                    self.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(keeper(Path(sys.argv[1]), sys.argv[2]))
