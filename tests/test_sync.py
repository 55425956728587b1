"""Sharing with teammates: two clones and a bare remote; push/pull never force, lose no note, overwrite no record."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import Cli, git, make_repo, refs


@pytest.fixture
def team(tmp_path):
    """A bare remote and two clones of it (a and b), each set up for the shell engine."""
    seed = make_repo(tmp_path / "seed")
    remote = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(remote))
    clones = []
    for name in ("a", "b"):
        path = tmp_path / name
        git(tmp_path, "clone", "-q", str(remote), str(path))
        git(path, "config", "subtask.engine", "shell")
        clones.append((path, Cli(path)))
    return remote, clones


def job(cli, script="true") -> str:
    job_id = cli.start(script)
    cli.ok("wait", job_id)
    return job_id


def record_ids(path) -> set[str]:
    return {r.split("/")[2] for r in refs(path, "refs/subtask/") if r.endswith("/record")}


def test_jobs_from_both_clones_appear_in_both_and_no_note_is_lost(team):
    remote, ((a, cli_a), (b, cli_b)) = team
    # jobs that make no commit put their blocks on the same commit (the base) in both clones
    ja = job(cli_a)
    jb = job(cli_b)
    ja2 = job(cli_a, "echo a > a.txt && git add a.txt && git commit -qm a")
    assert "pushed refs/subtask/" in cli_a.ok("push")
    out = cli_b.ok("push")  # b's notes ref is not a fast-forward of a's: fetched, merged, pushed again
    assert "notes: the remote had notes we lacked: merged" in out, out
    pulled_a = cli_a.ok("pull")
    assert f"new job {jb}" in pulled_a
    pulled_b = cli_b.ok("pull")
    assert f"new job {ja}" in pulled_b and f"new job {ja2}" in pulled_b
    for path in (a, b):
        assert record_ids(path) == {ja, jb, ja2}
        base_note = git(path, "notes", "--ref=subtask", "show", "HEAD")
        assert f"subtask {ja} ·" in base_note and f"subtask {jb} ·" in base_note
        assert f"subtask {ja2} ·" in git(path, "notes", "--ref=subtask", "show", f"refs/subtask/{ja2}/head")
    # the remote holds both blocks too, and every push was a fast-forward (no forced update)
    remote_note = git(remote, "notes", "--ref=subtask", "show", git(a, "rev-parse", "HEAD"))
    assert f"subtask {ja} ·" in remote_note and f"subtask {jb} ·" in remote_note
    assert "forced" not in git(remote, "reflog", "show", "refs/notes/subtask", check=False)
    # pulled jobs read like our own
    assert cli_b.json("show", ja2)["evidence"]["totals"]["commits"] == 1
    assert "a.txt" in cli_b.ok("diff", ja2, "--stat")
    assert cli_a.ok("push").strip()  # idempotent: nothing rejected
    assert cli_a.ok("pull")


def test_a_record_that_differs_locally_is_never_overwritten(team):
    remote, ((a, cli_a), (b, cli_b)) = team
    shared = job(cli_a)
    cli_a.ok("push")
    cli_b.ok("pull")
    # both clones add a fact to the same record: the histories diverge
    for path, word in ((a, "from-a"), (b, "from-b")):
        subprocess.run([sys.executable, "-c", (
            "import sys; from subtask import api, records\n"
            "repo = api.repo_at(sys.argv[1])\n"
            "records.update(repo, sys.argv[2], lambda j: j.state.extra.__setitem__('mark', sys.argv[3]))\n"
        ), str(path), shared, word], check=True)
    mine = git(b, "rev-parse", f"refs/subtask/{shared}/record")
    cli_a.ok("push")
    pulled = cli_b("pull")
    assert pulled.returncode == 1 and f"kept local: refs/subtask/{shared}/record" in pulled.stdout, pulled.stdout
    assert git(b, "rev-parse", f"refs/subtask/{shared}/record") == mine
    pushed = cli_b("push")
    assert pushed.returncode == 1 and f"not pushed: refs/subtask/{shared}/record" in pushed.stdout
    assert git(remote, "rev-parse", f"refs/subtask/{shared}/record") == git(a, "rev-parse", f"refs/subtask/{shared}/record")


def test_a_merge_made_in_another_clone_is_noticed_after_a_pull(team):
    remote, ((a, cli_a), (b, cli_b)) = team
    landed = job(cli_a, "echo x > x.txt && git add x.txt && git commit -qm x")
    cli_a.ok("push", "--branches")
    git(b, "fetch", "-q", "origin")
    git(b, "merge", "-q", "--no-ff", "-m", "merge the job", f"origin/subtask/{landed}")
    git(b, "push", "-q", "origin", "main")
    git(a, "pull", "-q", "--no-rebase", "origin", "main")
    out = cli_a.ok("cleanup", "--merged")
    assert f"{landed}: landed in {git(a, 'rev-parse', 'HEAD')[:7]}" in out
    assert f"refs/heads/subtask/{landed}" not in refs(a)
    assert cli_a.json("show", landed)["state_detail"]["landed_in"]


def test_push_and_pull_need_a_real_remote(team):
    remote, ((a, cli_a), _) = team
    proc = cli_a("push", "nowhere")
    assert proc.returncode == 129 and "no remote named 'nowhere'" in proc.stderr
    assert cli_a("pull", "--upload-pack=evil").returncode == 129
