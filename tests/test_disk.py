"""`git subtask du`: what each job's worktree costs on disk, and what cleanup and gc would free."""

from __future__ import annotations

import json

from conftest import git

MIB = 1 << 20


def test_du_splits_a_worktree_and_counts_a_1mb_ignored_file_that_cleanup_merged_frees(repo, cli):
    (repo / ".gitignore").write_text("*.bin\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-qm", "ignore binaries")
    big = cli.start(f"head -c {MIB} /dev/urandom > big.bin; echo kept > kept.txt")
    small = cli.start("echo small > small.txt")
    cli("wait", big, small)
    (repo / ".subtask" / "worktrees" / small / "notes.txt").write_text("x" * 20_000)  # a person's file
    git(repo, "merge", "-q", "--no-edit", f"subtask/{big}")

    found = cli.json("du")
    jobs = {j["id"]: j for j in found["jobs"]}
    assert jobs[big]["split"] and jobs[big]["ignored"] >= MIB and jobs[big]["untracked"] == 0
    assert jobs[big]["tracked"] > 0 and jobs[big]["bytes"] >= MIB + jobs[big]["tracked"]
    assert jobs[small]["ignored"] == 0 and jobs[small]["untracked"] >= 20_000
    assert jobs[small]["objects"] > 0  # its commit is kept by its branch and pins alone
    assert found["total"] >= jobs[big]["bytes"] + jobs[small]["bytes"]
    assert found["frees"]["cleanup --merged"] == {"bytes": jobs[big]["bytes"], "jobs": [big]}
    assert big in found["frees"]["gc"]["jobs"] and small not in found["frees"]["gc"]["jobs"]

    text = cli.ok("du")
    assert text.splitlines()[0].split() == ["ID", "STATE", "WORKTREE", "TRACKED", "UNTRACKED", "IGNORED", "OBJECTS"]
    assert f"cleanup --merged would free {jobs[big]['bytes'] / MIB:.1f} MiB ({big})" in text

    cli.ok("cleanup", "--merged")
    after = cli.json("du")
    assert [j["id"] for j in after["jobs"]] == [small]
    assert after["total"] <= found["total"] - MIB
    assert after["frees"]["cleanup --merged"] == {"bytes": 0, "jobs": []}


def test_du_measures_a_running_job_whole_without_running_git_in_it(repo, cli, control_dir):
    gate = control_dir / "gate"
    job = cli.start(f"head -c 100000 /dev/zero > out.txt; while [ ! -e '{gate}' ]; do sleep 0.02; done")
    try:
        worktree = repo / ".subtask" / "worktrees" / job
        from conftest import wait_until

        assert wait_until(lambda: (worktree / "out.txt").exists() and (worktree / "out.txt").stat().st_size == 100000)
        row = next(j for j in cli.json("du")["jobs"] if j["id"] == job)
        assert row["split"] is False and row["tracked"] is None and "running" in row["why"]
        assert row["bytes"] >= 100000
    finally:
        gate.touch()


def test_du_with_no_jobs_says_so_and_its_json_is_valid(repo, cli):
    proc = cli("du")
    assert proc.returncode == 0 and proc.stdout == "" and "no job worktrees on disk" in proc.stderr
    found = json.loads(cli.ok("du", "--json"))
    assert found["jobs"] == [] and found["total"] == 0 and found["frees"]["gc"] == {"bytes": 0, "jobs": []}
