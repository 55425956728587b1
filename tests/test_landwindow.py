"""The land window (issue 43): integrated states verified at once, batches that bisect, verify
once per tree, the hotfix lane, progress. Real repositories, real workers, the real CLI.

Timed tests use a verify that sleeps 2 s (`$LAND_SLEEP`, set for `land` only: the jobs' own
verifies and the one-by-one checks afterwards do not sleep), so the bounds are in verify times
with the sleep dominating, not CPU, on a loaded machine. Runs are counted by a line each verify
appends to a file in a folder the sandbox lets it write (`control_dir`)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import git, is_ancestor, wait_until

ADD = "echo {text} > {name} && git add {name} && git commit -qm 'add {name}'"
VERIFY_TIME = 2.0


def finished_jobs(cli, names: list[str], verify: str = "true") -> list[str]:
    """One shell job per name, each adding its own file, all ended (their own verify: `verify`)."""
    jobs = [cli.start(ADD.format(name=name, text=name), "--verify", verify) for name in names]
    cli.ok("wait", *jobs, timeout=600)
    return jobs


def counted(control: Path, check: str = "true") -> str:
    """A verify that sleeps `$LAND_SLEEP` seconds, appends a line to the run counter, then runs `check`."""
    return f"echo run >> {control}/runs; sleep ${{LAND_SLEEP:-0}}; {check}"


def runs(control: Path) -> int:
    path = control / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def timed_land(cli, *args: str, sleep: float = VERIFY_TIME) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    proc = cli("land", *args, env={"LAND_SLEEP": str(sleep)}, timeout=600)
    return proc, time.monotonic() - started


def first_parent_commits(repo: Path, before: str) -> list[str]:
    return git(repo, "rev-list", "--first-parent", "--reverse", f"{before}..main").split()


def passes_alone(repo: Path, commit: str, command: str) -> bool:
    """The verify run by hand on one commit, in a worktree of its own."""
    path = repo.parent / f"check-{commit[:12]}"
    git(repo, "worktree", "add", "-q", "--detach", str(path), commit)
    try:
        return subprocess.run(["sh", "-c", command], cwd=path, capture_output=True).returncode == 0
    finally:
        git(repo, "worktree", "remove", "--force", str(path))


@pytest.mark.slow
def test_twelve_good_jobs_land_in_at_most_three_verify_times(cli, repo, control_dir):
    names = [f"f{n:02d}.txt" for n in range(12)]
    jobs = finished_jobs(cli, names)
    before = git(repo, "rev-parse", "main")
    proc, took = timed_land(cli, "--window", "12", "--verify", counted(control_dir), *jobs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(12 of 12 landed)" in proc.stdout
    assert runs(control_dir) == 12, "every landed commit has its own verify"
    assert took <= 3 * VERIFY_TIME, f"twelve 2 s verifies took {took:.1f} s of wall time"
    commits = first_parent_commits(repo, before)
    assert len(commits) == 12 and all((repo / name).exists() for name in names)
    for job, commit in zip(jobs, commits, strict=True):
        landing = cli.json("show", job)["state_detail"]["landings"][-1]
        assert landing["commit"] == commit and landing["landed"] and landing["verify"]["head"] == commit


@pytest.mark.slow
def test_twelve_jobs_with_a_bad_one_in_the_middle_land_the_other_eleven_each_verified(cli, repo, control_dir):
    names = [f"f{n:02d}.txt" for n in range(12)]
    names[6] = "bad.txt"
    jobs = finished_jobs(cli, names)
    verify = counted(control_dir, "! test -f bad.txt")
    before = git(repo, "rev-parse", "main")
    proc, took = timed_land(cli, "--window", "12", "--verify", verify, *jobs)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "(11 of 12 landed)" in proc.stdout and f"{jobs[6]}: failed" in proc.stdout, proc.stdout
    assert took <= 7 * VERIFY_TIME, f"took {took:.1f} s of wall time"
    commits = first_parent_commits(repo, before)
    assert len(commits) == 11 and not (repo / "bad.txt").exists()
    assert all(passes_alone(repo, commit, verify) for commit in commits), "a landed commit fails its verify"
    assert cli.json("show", jobs[6])["state_detail"]["landings"][-1]["outcome"] == "failed"
