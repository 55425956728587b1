"""The test cluster's port plan (`tests/raycluster.py`), without Ray.

Ray refuses to start a node whose worker port range holds a port given to another of its
components; in one CI run a kernel-chosen port landed in the head's worker block, the head never
started and the test waited 120 s for it. A worker block outside the kernel's ephemeral range can
hold no port the kernel hands out, to us or to anyone's outgoing connection."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import raycluster  # noqa: E402


def _ephemeral_range() -> range:
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return range(low, high + 1)


def _ports(args: list[str]) -> tuple[set[int], range]:
    named = dict(a.lstrip("-").split("=", 1) for a in args if "=" in a)
    block = range(int(named.pop("min-worker-port")), int(named.pop("max-worker-port")) + 1)
    return {int(v) for k, v in named.items() if k.endswith("port")}, block


def test_a_nodes_worker_block_holds_none_of_its_ports_and_nothing_the_kernel_hands_out(tmp_path):
    ephemeral = _ephemeral_range()
    for _ in range(50):
        singles, block = _ports(raycluster._node_args(tmp_path, {"subtask_slot": 2}))
        assert len(block) == 60
        assert not singles & set(block), (sorted(singles), block)
        assert block.stop <= ephemeral.start or block.start >= ephemeral.stop, (block, ephemeral)
        assert block.start >= 20000, f"{block} overlaps Ray's own worker ports 10002-19999"


FAKE_RAY = r'''#!PYTHON
"""A stand-in for `ray start --block`: a head whose GCS port listens before the head has
registered itself (it registers when the test writes the file `go`, with the time since boot),
and a second node that, like Ray's, gives up with exit 1 when it was started before the head
registered (its own start time, from /proc, so no race of this fake decides it)."""
import http.server, json, os, socket, sys, threading, time
from pathlib import Path

marks = Path(os.environ["FAKE_RAY_MARKS"])
args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[2:] if "=" in a)
registered = lambda: (marks / "go").exists()
if "--head" not in sys.argv:
    with open("/proc/self/stat") as fh:
        started = int(fh.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    ok = registered() and float((marks / "go").read_text()) < started
    (marks / "node2-started").write_text("ok" if ok else "no head")
    if not ok:
        sys.exit("No node info found for head node in GCS.")
    (marks / "node2-alive").touch()
    time.sleep(3600)

class Dashboard(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path.startswith("/api/v0/nodes"):
            (marks / "polled").touch()
            alive = ["head"] * registered() + ["node2"] * (marks / "node2-alive").exists()
            body = {"data": {"result": {"result": [{"state": "ALIVE", "name": n} for n in alive]}}}
        else:
            body = {"version": "fake"}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

gcs = socket.create_server(("127.0.0.1", int(args["port"])))
threading.Thread(target=lambda: [gcs.accept()[0].close() for _ in iter(int, 1)], daemon=True).start()
http.server.HTTPServer(("127.0.0.1", int(args["dashboard-port"])), Dashboard).serve_forever()
'''


def test_the_second_node_starts_only_once_the_head_has_registered(tmp_path):
    """In one CI run the second node's `ray start` gave up ("No node info found for head node in
    GCS"): it was started as soon as the head's GCS port listened, and the head, slow under load,
    had not yet registered itself. The fake head here registers only when the test says so, and
    the test says so only once the keeper has asked which nodes are alive (waiting, as it
    should) or has started the second node (too early)."""
    import os
    import threading
    import time

    marks = tmp_path / "marks"
    marks.mkdir()
    fake = tmp_path / "ray"
    fake.write_text(FAKE_RAY.replace("PYTHON", sys.executable))
    fake.chmod(0o755)

    def register_the_head_when_the_keeper_has_moved() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (marks / "node2-started").exists() or (marks / "polled").exists():
                break
            time.sleep(0.05)
        (marks / "go").write_text(str(time.clock_gettime(time.CLOCK_BOOTTIME)))

    threading.Thread(target=register_the_head_when_the_keeper_has_moved, daemon=True).start()
    cluster = raycluster.Cluster.start(env=dict(os.environ, FAKE_RAY_MARKS=str(marks)), ray=fake)
    try:
        assert (marks / "node2-started").read_text() == "ok"
    finally:
        cluster.stop()


FAKE_LOADED_HEAD = r'''#!PYTHON
"""A stand-in for `ray start --head --block` on a loaded machine: its dashboard's modules take
`FAKE_RAY_TAKES` seconds to come up (said, not slept), and like Ray's dashboard it gives up with
exit 1 when that is beyond its patience: RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT
(Ray's default 30 s) for each module, RAY_DASHBOARD_STARTUP_TIMEOUT_S (60 s) for the whole."""
import os, sys
takes = float(os.environ["FAKE_RAY_TAKES"])
module = float(os.environ.get("RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT", 30))
startup = float(os.environ.get("RAY_DASHBOARD_STARTUP_TIMEOUT_S", 60))
if takes > min(module, startup):
    sys.exit(f"RuntimeError: Module MetricsHead failed to start. Timeout after {module} seconds.")
sys.exit("the fake went as far as it could")
'''


def test_a_slow_head_has_as_long_as_the_keeper_waits_for_it(tmp_path):
    """In one CI run (the oldest releases, -n 4 on 2 cores) the head's `ray start` exited 1:
    "Module MetricsHead failed to start. Timeout after 30.0 seconds". Ray's dashboard starts nine
    module processes and gives each 30 s, the whole 60 s, while the keeper would have waited
    `raycluster.PATIENCE` for it. A head whose modules take most of that patience must not give
    up before the keeper does."""
    import os

    fake = tmp_path / "ray"
    fake.write_text(FAKE_LOADED_HEAD.replace("PYTHON", sys.executable))
    fake.chmod(0o755)
    env = dict(os.environ, FAKE_RAY_TAKES=str(raycluster.PATIENCE - 1))
    try:
        raycluster.Cluster.start(env=env, ray=fake)
    except RuntimeError as exc:
        said = str(exc)
    assert "the fake went as far as it could" in said, said
