"""Make N finished job records quickly (through records.create), for scale benchmarks."""

from __future__ import annotations

import time
from pathlib import Path

from subtask.git import records
from subtask.git.gitrepo import open_repo
from subtask.model.job import Attempt, Cost, JobSpec, JobState, new_job_id


def fill_history(repo_path: Path, count: int) -> None:
    repo = open_repo(repo_path)
    base = str(repo.git.head.target)
    now = time.time()
    for n in range(count):
        job_id = new_job_id()
        spec = JobSpec(id=job_id, task=f"historic task {n}", engine="shell", base_ref="HEAD", base=base,
                       branch=None, worktree=str(repo.worktree_dir() / job_id), repo=str(repo.root),
                       created_at=now - 86400 - n)
        attempt = Attempt(n=1, state="done", message=spec.task, queued_at=spec.created_at,
                          started_at=spec.created_at, ended_at=spec.created_at + 1, cost=Cost())
        records.create(repo, records.Job(spec, JobState(attempts=[attempt]), None, "", "", None))
