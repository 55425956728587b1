"""Issue 16 figures: the Ray executor against the local one, on this machine.

Run: python bench/ray_scale.py [--jobs 20] [--queued 100]
Starts the two-node local cluster of the tests (tests/raycluster.py: head `subtask_slot: 2`, a
second node `subtask_slot: 2`, so 4 jobs at once, like `maxRunning=4` here) and measures:
- the cluster: seconds until both nodes are up, memory (PSS of every process it runs) idle and
  at its peak while jobs run;
- `--jobs` trivial shell jobs (`echo n > f`) started one after the other, local executor vs the
  cluster: each `start`'s latency (the command's wall time) and the total from the first start
  to the last job brought home (`wait`);
- `--queued` jobs started by `--submitters` processes at once, so that most of them wait
  (PENDING in Ray, queued in slots.json here).
On one machine the cluster cannot win: every Ray job starts a supervisor process and a fresh
worker, and the results travel through the remote. The point is the overhead, honestly.
Writes bench/results/ray_scale.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from common import save, sh, subtask_cmd  # noqa: E402
from raycluster import Cluster, _descendants  # noqa: E402

ST = subtask_cmd()


def pss_mb(root: int) -> float:
    total = 0
    for pid in _descendants(root):
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return round(total / 1024, 1)


class PeakMemory:
    """Samples the cluster's memory every half second while jobs run."""

    def __init__(self, root: int):
        self.root, self.peak, self._stop = root, 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, pss_mb(self.root))
            self._stop.wait(0.5)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join()


def team(base: Path) -> tuple[Path, Path]:
    seed = base / "seed"
    seed.mkdir(parents=True)
    sh("git", "init", "-q", "-b", "main", str(seed))
    (seed / "README.md").write_text("bench\n")
    sh("git", "add", "-A", cwd=seed)
    sh("git", "-c", "user.name=bench", "-c", "user.email=bench@example.com", "commit", "-q", "-m", "seed", cwd=seed)
    remote = base / "remote.git"
    sh("git", "clone", "-q", "--bare", str(seed), str(remote))
    clone = base / "clone"
    sh("git", "clone", "-q", str(remote), str(clone))
    for key, value in (("subtask.engine", "shell"), ("user.name", "bench"), ("user.email", "bench@example.com")):
        sh("git", "config", key, value, cwd=clone)
    return remote, clone


def run_jobs(clone: Path, count: int, on: str, submitters: int = 1) -> dict:
    """`count` jobs started by `submitters` threads at once (each `start` a process)."""
    from concurrent.futures import ThreadPoolExecutor

    latencies, ids = [], []

    def one(n: int) -> None:
        t0 = time.perf_counter()
        out = sh(*ST, "start", "--on", on, f"echo {n} > f{n}.txt", cwd=clone).stdout
        latencies.append(time.perf_counter() - t0)
        ids.append(out.split()[0])

    first = time.perf_counter()
    with ThreadPoolExecutor(submitters) as pool:
        list(pool.map(one, range(count)))
    submitted = time.perf_counter() - first
    proc = sh(*ST, "wait", *ids, cwd=clone, check=False)
    total = time.perf_counter() - first
    listed = json.loads(sh(*ST, "list", "--all", "--json", cwd=clone).stdout)
    rows = listed["jobs"] if isinstance(listed, dict) else listed
    done = sum(1 for row in rows if row.get("id") in ids and row.get("state") == "done")
    return {"jobs": count, "submitters": submitters, "done": done, "wait_exit": proc.returncode,
            "start_latency_ms": {"median": round(statistics.median(latencies) * 1000),
                                 "p90": round(sorted(latencies)[int(0.9 * (count - 1))] * 1000),
                                 "max": round(max(latencies) * 1000)},
            "all_submitted_s": round(submitted, 1), "all_home_s": round(total, 1),
            "per_job_s": round(total / count, 2)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--queued", type=int, default=100)
    parser.add_argument("--submitters", type=int, default=8, help="processes starting the queued jobs at once")
    parser.add_argument("--skip-trivial", action="store_true")
    args = parser.parse_args()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    t0 = time.perf_counter()
    cluster = Cluster.start()
    up = time.perf_counter() - t0
    results: dict = {"cluster": {"start_s": round(up, 1)}, "load_before": load_before}
    try:
        time.sleep(3)
        results["cluster"]["idle_pss_mb"] = pss_mb(cluster.proc.pid)
        with tempfile.TemporaryDirectory(prefix="raybench") as tmp:
            remote, clone = team(Path(tmp))
            sh("git", "config", "subtask.maxRunning", "4", cwd=clone)
            sh("git", "config", "subtask.ray.address", cluster.address, cwd=clone)
            for label, count, submitters in (("trivial", 0 if args.skip_trivial else args.jobs, 1),
                                             ("queued", args.queued, args.submitters)):
                if not count:
                    continue
                results[f"{label}_local"] = run_jobs(clone, count, "local", submitters)
                print(label, "local", results[f"{label}_local"], flush=True)
                with PeakMemory(cluster.proc.pid) as memory:
                    results[f"{label}_ray"] = run_jobs(clone, count, "ray", submitters)
                results[f"{label}_ray"]["cluster_peak_pss_mb"] = memory.peak
                print(label, "ray", results[f"{label}_ray"], flush=True)
    finally:
        cluster.stop()
    results["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
    print(save("ray_scale" + ("_queued" if args.skip_trivial else ""), results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
