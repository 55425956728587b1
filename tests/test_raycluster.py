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
