"""Issue 4 figures: admission throughput and hand-off latency under a full queue.

Run: python bench/admission.py [--jobs 50] [--procs 10] [--max-running 4] [--seconds 0.2]
Starts `--jobs` shell jobs of `--seconds` each from `--procs` processes at once against
subtask.maxRunning, waits for them all, and prints:
- wall time from the first start to the last job's end, against the ideal jobs*seconds/maxRunning;
- hand-off latency: a worker's previous job's last event -> its next job's `running` event (the
  worker runs the next queued job of its repository in-process; events carry the worker's pid);
- the peak number of jobs running at once (from the events), which must not pass maxRunning.
Then a drain run without competing starts: one job holds the only slot while 8 more queue, and the
hand-offs between them are measured alone (what a worker costs between two queued jobs).
Writes bench/results/admission.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import make_repo, save, sh, subtask_cmd  # noqa: E402

ST = subtask_cmd()


def start_all(repo: Path, jobs: int, procs: int, seconds: float) -> tuple[float, list[str]]:
    per_proc = [jobs // procs + (1 if n < jobs % procs else 0) for n in range(procs)]
    script = 'for n in $(seq 1 "$0"); do "$@"; done'
    t0 = time.time()
    children = [subprocess.Popen(["sh", "-c", script, str(k), *ST, "start", f"sleep {seconds}"], cwd=repo,
                                 stdout=subprocess.PIPE, text=True) for k in per_proc]
    ids = [line.split()[0] for child in children for line in child.communicate()[0].splitlines()
           if line.startswith("st-")]
    return t0, ids


def events(state: Path, job: str) -> list[dict]:
    path = state / "run" / f"{job}.events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def analyse(state: Path, ids: list[str]) -> dict:
    spans = []  # (running t, end t, worker pid)
    for job in ids:
        evs = [e for e in events(state, job) if e.get("type") == "state"]
        run = next(e for e in evs if e["state"] == "running")
        spans.append((run["t"], evs[-1]["t"], run.get("worker")))
    latencies = []
    by_worker: dict = {}
    for span in sorted(spans):
        by_worker.setdefault(span[2], []).append(span)
    for runs in by_worker.values():
        latencies += [nxt[0] - prev[1] for prev, nxt in zip(runs, runs[1:], strict=False)]
    points = sorted([(s[0], 1) for s in spans] + [(s[1], -1) for s in spans])
    level = peak = 0
    for _, step in points:
        level += step
        peak = max(peak, level)
    return {"spans": spans, "latencies": latencies, "peak": peak, "workers": len(by_worker)}


def drain(tmp: Path, queued: int = 8) -> list[float]:
    """Hand-off latency with the queue already full: maxRunning=1, one holder, `queued` behind it."""
    repo = make_repo(tmp / "drain", files=200, folders=10)
    sh("git", "config", "subtask.maxRunning", "1", cwd=repo)
    ids = [sh(*ST, "start", "sleep 3", cwd=repo).stdout.split()[0]]
    ids += [sh(*ST, "start", "sleep 0.2", cwd=repo).stdout.split()[0] for _ in range(queued)]
    sh(*ST, "wait", "--timeout", "120", *ids, cwd=repo)
    state = Path(sh("git", "rev-parse", "--absolute-git-dir", cwd=repo).stdout.strip()) / "subtask"
    return sorted(analyse(state, ids)["latencies"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--procs", type=int, default=10)
    parser.add_argument("--max-running", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=0.2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = make_repo(Path(tmp) / "repo", files=200, folders=10)
        sh("git", "config", "subtask.maxRunning", str(args.max_running), cwd=repo)
        t0, ids = start_all(repo, args.jobs, args.procs, args.seconds)
        starts_done = time.time() - t0
        sh(*ST, "wait", "--timeout", "600", *ids, cwd=repo)
        state = Path(sh("git", "rev-parse", "--absolute-git-dir", cwd=repo).stdout.strip()) / "subtask"
        result = analyse(state, ids)
        wall = max(s[1] for s in result["spans"]) - t0
        quiet = drain(Path(tmp))
    ideal = args.jobs * args.seconds / args.max_running
    lat = sorted(result["latencies"])
    figures = {
        "jobs": len(ids), "procs": args.procs, "max_running": args.max_running, "job_seconds": args.seconds,
        "wall_s": round(wall, 2), "ideal_s": round(ideal, 2), "wall_over_ideal": round(wall / ideal, 2),
        "all_started_s": round(starts_done, 2), "peak_running": result["peak"], "workers": result["workers"],
        "handoffs": len(lat),
        "handoff_ms": {"median": round(statistics.median(lat) * 1000, 1) if lat else None,
                       "p90": round(lat[int(0.9 * (len(lat) - 1))] * 1000, 1) if lat else None,
                       "max": round(lat[-1] * 1000, 1) if lat else None},
    }
    figures["drain_handoff_ms"] = {"handoffs": len(quiet), "median": round(statistics.median(quiet) * 1000, 1),
                                   "max": round(quiet[-1] * 1000, 1)}
    print(f"{figures['jobs']} jobs of {args.seconds}s from {args.procs} processes, maxRunning={args.max_running}")
    print(f"  wall {figures['wall_s']}s vs ideal {figures['ideal_s']}s ({figures['wall_over_ideal']}x); "
          f"all starts returned after {figures['all_started_s']}s")
    print(f"  hand-off latency over {len(lat)} hand-offs: median {figures['handoff_ms']['median']} ms, "
          f"p90 {figures['handoff_ms']['p90']} ms, max {figures['handoff_ms']['max']} ms")
    print(f"  peak running {figures['peak_running']} (limit {args.max_running}), {figures['workers']} worker processes")
    print(f"  drain (no competing starts): hand-off median {figures['drain_handoff_ms']['median']} ms, "
          f"max {figures['drain_handoff_ms']['max']} ms over {len(quiet)} hand-offs")
    print(f"  saved {save('admission', figures)}")


if __name__ == "__main__":
    main()
