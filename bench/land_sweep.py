"""Cost of the landed-job sweep (`cleanup --merged`, and the lazy sweep inside `list`) with 200 jobs.

Worst case for the sweep: 200 finished jobs, each a branch with one commit that has not landed, so
every job takes the patch-id path; main has 50 commits since their base. Measured: the cold sweep
(empty patch-id cache), the warm sweep, the throttled no-op inside `list`, and `list` end to end.

Run: PYTHONPATH=. python bench/land_sweep.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pygit2

from bench.common import make_repo, median_ms, save, sh, timed
from subtask.git import records
from subtask.git.gitrepo import open_repo
from subtask.model.job import Attempt, Cost, Evidence, JobSpec, JobState, new_job_id
from subtask.ops.landing import cleanup, landed

JOBS = 200
UPSTREAM = 50


def make_jobs(path: Path) -> None:
    repo = open_repo(path)
    git = repo.git
    base = git.head.target
    sig = pygit2.Signature("bench", "bench@example.com")
    now = time.time()
    for n in range(JOBS):
        job_id = new_job_id()
        blob = git.create_blob(f"job {n}\n".encode())
        builder = git.TreeBuilder(git[base].tree)
        builder.insert(f"job{n:03d}.txt", blob, pygit2.GIT_FILEMODE_BLOB)
        head = git.create_commit(f"refs/heads/subtask/{job_id}", sig, sig, f"job {n}", builder.write(), [base])
        spec = JobSpec(id=job_id, task=f"task {n}", engine="shell", base_ref="HEAD", base=str(base),
                       branch=f"subtask/{job_id}", worktree=str(repo.worktree_dir() / job_id), repo=str(repo.root),
                       created_at=now - n)
        attempt = Attempt(n=1, state="done", message=spec.task, queued_at=now, started_at=now, ended_at=now + 1,
                          cost=Cost(), head=str(head))
        evidence = Evidence(id=job_id, attempt=1, engine="shell", state="done", base=str(base), head=str(head),
                            branch=spec.branch)
        records.create(repo, records.Job(spec, JobState(attempts=[attempt]), evidence, "", "", None))
        records.set_pin(repo, job_id, "head", str(head))
    for n in range(UPSTREAM):
        (path / f"up{n}.txt").write_text(f"{n}\n")
        sh("git", "add", "-A", cwd=path)
        sh("git", "commit", "-q", "-m", f"upstream {n}", cwd=path)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = make_repo(Path(tmp) / "repo", files=200, folders=10)
        make_jobs(path)
        repo = open_repo(path)
        cache = repo.state_dir / landed.PATCH_ID_CACHE
        t0 = time.perf_counter()
        assert cleanup.cleanup_merged(repo).landed == []
        cold = round((time.perf_counter() - t0) * 1000, 1)
        warm = median_ms(timed(lambda: cleanup.cleanup_merged(repo), runs=5))
        cleanup.maybe_sweep(repo)
        throttled = median_ms(timed(lambda: cleanup.maybe_sweep(repo), runs=20))
        list_cmd = median_ms(timed(lambda: sh("git", "subtask", "list", cwd=path), runs=5))
        sh("git", "config", "subtask.sweepInterval", "0", cwd=path)
        list_sweeping = median_ms(timed(lambda: sh("git", "subtask", "list", cwd=path), runs=5))
        result = {"jobs": JOBS, "upstream_commits": UPSTREAM, "cold_sweep_ms": cold, "warm_sweep_ms": warm,
                  "throttled_noop_ms": throttled, "list_throttled_ms": list_cmd,
                  "list_sweeping_every_time_ms": list_sweeping, "patch_id_cache_bytes": cache.stat().st_size}
        print(result)
        save("land_sweep", result)


if __name__ == "__main__":
    main()
