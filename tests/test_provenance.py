"""A teammate's record is a claim, not authority (issue 29).

Two real clones and a bare remote in temporary folders (`make_team`: a is the teammate, b is us).
The teammate changes records the only way a teammate can: by writing commits in their own clone
and pushing them. Nothing here asks our clone to trust what arrives.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git, grant_writable, make_team, refs

# Run in the teammate's clone: apply CHANGE (Python, `j` is the job) to a record and write it as a
# new commit on that record's chain (the way any git-subtask writes one), or as a new record.
FORGE = """
import json, sys
from subtask import api; from subtask.git import records
from subtask.model.job import JobSpec
repo = api.repo_at(sys.argv[1])
job_id, change, new_id = sys.argv[2], sys.argv[3], sys.argv[4]
if new_id:
    job = records.read(repo, job_id)
    exec(change, {"j": job, "json": json})
    job.spec.id = new_id
    job.tip = None
    records.create(repo, job)
else:
    records.update(repo, job_id, lambda j: exec(change, {"j": j, "json": json}))
"""


def forge(clone: Path, job_id: str, change: str, new_id: str = "") -> None:
    subprocess.run([sys.executable, "-c", FORGE, str(clone), job_id, change, new_id], check=True)


@pytest.fixture
def team(tmp_path):
    return make_team(tmp_path)


def record_tip(clone: Path, job_id: str) -> str:
    return git(clone, "rev-parse", f"refs/subtask/{job_id}/record")


# ---------------------------------------------------------------- the three attacks

def test_a_teammate_cannot_turn_my_failed_verify_into_a_pass(team):
    remote, ((a, cli_a), (b, cli_b)) = team
    mine = cli_b.start("echo theirs > evil.txt && git add evil.txt && git commit -qm evil", "--verify", "false")
    cli_b("wait", mine)  # exits 1: verify failed
    refused = cli_b("merge", mine)
    assert refused.returncode == 1 and "verify failed" in refused.stderr, refused.stderr
    cli_b.ok("push", "--branches")
    cli_a.ok("pull")
    forge(a, mine, "j.state.current.verify.passed = True; j.state.current.verify.exit_code = 0")
    cli_a.ok("push")
    before = record_tip(b, mine)

    pulled = cli_b("pull")
    assert f"updated refs/subtask/{mine}/record" not in pulled.stdout, pulled.stdout
    assert record_tip(b, mine) == before  # our record was not changed by the pull
    aside = f"refs/subtask-theirs/origin/{mine}/record"
    assert git(b, "rev-parse", aside) == record_tip(a, mine)  # theirs is kept aside, and said so
    assert aside in pulled.stdout and "did not write" in pulled.stdout, pulled.stdout
    shown = cli_b.json("show", mine)
    assert shown["state_detail"]["attempts"][-1]["verify"]["passed"] is False
    assert "verify failed" in git(b, "notes", "--ref=subtask", "show", f"refs/subtask/{mine}/head")
    merged = cli_b("merge", mine)
    assert merged.returncode == 1 and "verify failed" in merged.stderr, merged.stdout + merged.stderr
    assert not (b / "evil.txt").exists() and "evil" not in git(b, "log", "--format=%s", "main")
    doctor = cli_b("doctor")
    assert aside in doctor.stdout, doctor.stdout


def test_a_teammate_cannot_end_my_running_job(team, tmp_path):
    remote, ((a, cli_a), (b, cli_b)) = team
    gate = tmp_path / "gate"
    mine = cli_b.start(f"while [ ! -e '{gate}' ]; do sleep 0.02; done; echo done > d.txt")
    try:
        cli_b.ok("push")
        cli_a.ok("pull")
        forge(a, mine, "j.state.current.state = 'failed'; j.state.current.reason = 'forged by a teammate'; "
                       "j.state.current.ended_at = j.state.current.queued_at + 1")
        cli_a.ok("push")
        pulled = cli_b("pull")
        assert f"refs/subtask-theirs/origin/{mine}/record" in pulled.stdout, pulled.stdout
        assert cli_b.json("show", mine)["state"] in ("queued", "running")
    finally:
        gate.touch()
    waited = cli_b("wait", mine)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    shown = cli_b.json("show", mine)
    assert shown["state"] == "done" and "forged" not in json.dumps(shown)


def test_records_a_teammate_pushes_never_delete_my_branches(team):
    remote, ((a, cli_a), (b, cli_b)) = team
    # In our clone: a release branch, and main not checked out (we work on dev).
    git(b, "branch", "release")
    git(b, "switch", "-q", "-c", "dev")
    git(b, "commit", "-q", "--allow-empty", "-m", "on dev")
    git(b, "merge", "-q", "release")
    release, main = git(b, "rev-parse", "release"), git(b, "rev-parse", "main")
    # The teammate forges records naming our branches, our repository and an old end; one whose
    # branch looks landed (cleanup --merged), two whose branch is "at its base" (gc).
    theirs = cli_a.start("true")
    cli_a.ok("wait", theirs)
    old = "j.state.current.ended_at = 1000.0; j.spec.created_at = 900.0; j.state.current.queued_at = 900.0; "
    names = {"st-0000aaaa": ("release", release), "st-0000bbbb": ("main", main), "st-0000cccc": ("release", main)}
    for new_id, (branch, base) in names.items():
        forge(a, theirs, old + f"j.spec.branch = {branch!r}; j.spec.base = {base!r}; j.spec.repo = {str(b)!r}; "
                              f"j.spec.worktree = {str(b)!r}; j.state.current.head = {release!r}", new_id=new_id)
    # and the teammate's own old job, whose branch (at its base) we fetched to look at
    forge(a, theirs, old)
    cli_a.ok("push", "--branches")
    cli_b.ok("pull")
    git(b, "fetch", "-q", "origin", f"refs/heads/subtask/{theirs}:refs/heads/subtask/{theirs}")

    for command in (("cleanup", "--merged"), ("gc",), ("cleanup", "st-0000aaaa"), ("cleanup", "st-0000bbbb"),
                    ("cleanup", theirs)):
        out = cli_b(*command)
        assert "deleted branch" not in out.stdout, f"{command}: {out.stdout}"
    assert git(b, "rev-parse", "release") == release and git(b, "rev-parse", "main") == main
    assert f"refs/heads/subtask/{theirs}" in refs(b)
    assert (b / "README.md").exists()
    assert "refs/heads/release" in refs(b) and "refs/heads/main" in refs(b)


def test_a_reply_to_a_teammates_record_is_refused_and_moves_none_of_my_branches(team):
    """A forged record naming my `release` branch and the worktree path my clone would use: a
    reply would run my worker on their spec, write their record and commit on `release`."""
    remote, ((a, cli_a), (b, cli_b)) = team
    git(b, "branch", "release")
    release = git(b, "rev-parse", "release")
    theirs = cli_a.start("true")
    cli_a.ok("wait", theirs)
    new_id = "st-0000dddd"
    worktree = b / ".subtask" / "worktrees" / new_id
    forge(a, theirs, f"j.spec.branch = 'release'; j.spec.base = {release!r}; j.spec.worktree = {str(worktree)!r}; "
                     f"j.spec.repo = {str(b)!r}", new_id=new_id)
    cli_a.ok("push")
    cli_b.ok("pull")
    tip = record_tip(b, new_id)
    out = cli_b("reply", new_id, "echo pwned > pwn.txt")
    assert out.returncode == 1 and "another clone's job" in out.stderr, out.stderr
    assert git(b, "rev-parse", "release") == release and record_tip(b, new_id) == tip
    assert not worktree.exists()


def test_a_teammates_commits_on_my_ended_cluster_job_are_kept_aside(team):
    """A job of mine placed on a cluster takes its node's pushed record while it runs; once my
    record says it ended, nobody else writes it: a teammate's commit on it is kept aside."""
    remote, ((a, cli_a), (b, cli_b)) = team
    mine = cli_b.start("true", "--verify", "false")
    cli_b("wait", mine)
    forge(b, mine, "j.spec.extra['executor'] = {'kind': 'ray', 'url': 'x'}")
    cli_b.ok("push")
    cli_a.ok("pull")
    forge(a, mine, "j.state.current.verify.passed = True; j.state.current.verify.exit_code = 0")
    cli_a.ok("push")
    tip = record_tip(b, mine)
    cli_b.ok("pull")
    assert record_tip(b, mine) == tip
    assert cli_b.json("show", mine)["state_detail"]["attempts"][-1]["verify"]["passed"] is False


# ---------------------------------------------------------------- the merge gate

def ran_verify(log: Path) -> int:
    """How many times a verify that appends to `log` has run (anywhere: a's worker, b's re-run)."""
    return len(log.read_text().splitlines()) if log.exists() else 0


def writable_folder(path: Path) -> Path:
    """A folder confined verify commands may write (HOME's git config, as a user grants it)."""
    path.mkdir()
    return grant_writable(path)


@pytest.fixture
def shared_log(tmp_path):
    """A folder both clones' confined verify commands may write."""
    return writable_folder(tmp_path / "log")


def teammate_job(cli_a, b, script: str, verify: str) -> str:
    """A job the teammate ran and pushed with its branch; we pull it and fetch its branch."""
    job_id = cli_a.start(script, "--verify", verify)
    cli_a("wait", job_id)
    cli_a.ok("push", "--branches")
    return job_id


def take(cli_b, b, job_id: str) -> None:
    cli_b.ok("pull")
    git(b, "fetch", "-q", "origin", f"refs/heads/subtask/{job_id}:refs/heads/subtask/{job_id}")


MAKES_X = "echo x > x.txt && git add x.txt && git commit -qm 'add x'"


def test_merge_re_runs_the_verify_of_an_unsigned_teammates_job_on_the_exact_commit(team, shared_log):
    remote, ((a, cli_a), (b, cli_b)) = team
    log = shared_log / "ran"
    theirs = teammate_job(cli_a, b, MAKES_X, f"echo ran >> {log}; test -f x.txt")
    take(cli_b, b, theirs)
    assert ran_verify(log) == 1
    merged = cli_b("merge", theirs)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert f"{theirs}: re-ran verify here on {git(b, 'rev-parse', '--short=7', f'subtask/{theirs}')}" in merged.stdout
    assert ran_verify(log) == 2 and (b / "x.txt").exists()
    # nothing of the teammate's is changed or deleted here: record, branch
    assert record_tip(b, theirs) == record_tip(a, theirs)
    assert f"refs/heads/subtask/{theirs}" in refs(b)
    assert not list((b / ".subtask" / "worktrees" / ".verify").iterdir())  # the scratch checkout is gone


def test_a_forged_pass_on_a_teammates_job_fails_when_re_run_and_only_force_merges_it(team, shared_log):
    remote, ((a, cli_a), (b, cli_b)) = team
    log = shared_log / "ran"
    theirs = teammate_job(cli_a, b, MAKES_X, f"echo ran >> {log}; test -f y.txt")
    forge(a, theirs, "j.state.current.verify.passed = True; j.state.current.verify.exit_code = 0")
    cli_a.ok("push")
    take(cli_b, b, theirs)
    assert cli_b.json("show", theirs)["state_detail"]["attempts"][-1]["verify"]["passed"] is True  # the claim
    main = git(b, "rev-parse", "main")
    refused = cli_b("merge", theirs)
    assert refused.returncode == 1 and "verify failed when re-run here" in refused.stderr, \
        refused.stdout + refused.stderr
    assert "merge --force" in refused.stderr and git(b, "rev-parse", "main") == main
    assert cli_b("merge", "--force", theirs).returncode == 0 and (b / "x.txt").exists()


def test_a_teammates_job_without_a_verify_command_is_not_merged_on_its_claim(team):
    remote, ((a, cli_a), (b, cli_b)) = team
    theirs = cli_a.start(MAKES_X)
    cli_a.ok("wait", theirs)
    cli_a.ok("push", "--branches")
    take(cli_b, b, theirs)
    refused = cli_b("merge", theirs)
    assert refused.returncode == 1 and "no verify command" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_teammates_job_pulled_without_its_branch_merges_from_its_head_pin_through_the_gate(team, shared_log):
    """`pull` brings records, pins and notes, not branches: `merge` takes the head pin, runs the
    unsigned record's verify here on it first (a forged pass is refused), and `list` then says
    the job landed, while its record stays the teammate's."""
    remote, ((a, cli_a), (b, cli_b)) = team
    log = shared_log / "ran"
    forged = cli_a.start(MAKES_X, "--verify", f"echo ran >> {log}; test -f y.txt")
    honest = cli_a.start("echo z > z.txt && git add z.txt && git commit -qm 'add z'", "--verify",
                         f"echo ran >> {log}; test -f z.txt")
    pinned = cli_a.start(MAKES_X, "--verify", "test -f x.txt")
    cli_a("wait", forged, honest, pinned)
    forge(a, forged, "j.state.current.verify.passed = True; j.state.current.verify.exit_code = 0")
    old = git(a, "rev-parse", f"refs/subtask/{pinned}/head")  # its pin moved on to a commit no record names
    git(a, "update-ref", f"refs/subtask/{pinned}/head", git(a, "commit-tree", f"{old}^{{tree}}", "-p", old, "-m", "x"))
    cli_a.ok("push")
    cli_b.ok("pull")
    assert not refs(b, "refs/heads/subtask/")
    main, ran = git(b, "rev-parse", "main"), ran_verify(log)
    refused = cli_b("merge", forged)
    assert refused.returncode == 1 and "verify failed when re-run here" in refused.stderr, \
        refused.stdout + refused.stderr
    assert git(b, "rev-parse", "main") == main and ran_verify(log) == ran + 1
    refused = cli_b("merge", "--force", pinned)
    assert refused.returncode == 1 and f"not where its record leaves the job ({old[:7]})" in refused.stderr, \
        refused.stdout + refused.stderr
    assert git(b, "rev-parse", "main") == main
    head, record = git(b, "rev-parse", f"refs/subtask/{honest}/head"), record_tip(b, honest)
    merged = cli_b("merge", "--squash", honest)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert f"{honest}: re-ran verify here on {head[:7]}" in merged.stdout and ran_verify(log) == ran + 2
    assert (b / "z.txt").read_text() == "z\n" and record_tip(b, honest) == record
    landed = git(b, "rev-parse", "main")
    listed = {e["id"]: e for e in cli_b.json("list", "--all")["jobs"]}
    assert listed[honest]["landed"] == landed and not listed[forged]["landed"]
    assert honest not in cli_b.ok("list") and forged in cli_b.ok("list")  # landed jobs are left out
    again = cli_b("merge", honest)
    assert again.returncode == 1 and f"already landed in {landed[:7]}" in again.stderr, again.stderr
    assert f"landed:  here, from its head {head[:7]}" in git(b, "notes", "--ref=subtask", "show", landed)
    cli_a.ok("pull")  # the mark is this clone's alone: it never travels
    assert not refs(a, "refs/subtask-landed/") and record_tip(a, honest) == record


def test_merge_reverify_re_runs_even_my_own_jobs_verify(cli, repo, tmp_path):
    log = writable_folder(tmp_path / "log")
    job = cli.start(MAKES_X, "--verify", f"echo ran >> {log / 'ran'}; test -f x.txt")
    cli.ok("wait", job)
    out = cli.ok("merge", "--reverify", job)
    assert f"{job}: re-ran verify here" in out and ran_verify(log / "ran") == 2


def test_a_teammates_group_pick_is_re_verified_and_their_group_record_is_left_alone(team, shared_log):
    remote, ((a, cli_a), (b, cli_b)) = team
    log = shared_log / "ran"
    gid = cli_a.ok("start", "--best-of", "2", MAKES_X, "--verify", f"echo ran >> {log}; test -f x.txt").split()[0]
    cli_a.ok("wait", gid)
    cli_a.ok("push", "--branches")
    cli_b.ok("pull")
    git(b, "fetch", "-q", "origin", "refs/heads/subtask/*:refs/heads/subtask/*")
    group_ref = f"refs/subtask/groups/{gid}/record"
    before = git(b, "rev-parse", group_ref)
    ran = ran_verify(log)
    merged = cli_b("merge", gid)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "re-ran verify here" in merged.stdout and ran_verify(log) == ran + 1
    assert git(b, "rev-parse", group_ref) == before
    assert all(record_tip(b, m) == record_tip(a, m) for m in cli_a.json("show", gid)["members"])


# ---------------------------------------------------------------- git subtask verify

def test_verify_says_that_an_honest_record_matches_git(cli, repo):
    job = cli.start(MAKES_X, "--verify", "test -f x.txt")
    cli.ok("wait", job)
    out = cli.ok("verify", job, "--run", "--no-reuse")  # run here, not the worker's result reused (issue 43)
    for line in ("ok       base pin", "ok       head pin", "ok       evidence: 1 file, +1 -0, 1 commit",
                 "ok       verify: recorded passed", "ok       verify --run: test -f x.txt passed here",
                 "-        signature: the record", "-        clone: started in this clone",
                 f"{job}: what its record claims matches git"):
        assert line in out, out
    assert cli.json("verify", job)["ok"] is True


def test_verify_names_every_claim_of_a_forged_record_that_git_does_not_bear_out(team):
    remote, ((a, cli_a), (b, cli_b)) = team
    theirs = teammate_job(cli_a, b, MAKES_X, "test -f y.txt")  # its verify failed
    forge(a, theirs, "j.state.current.verify.passed = True; j.state.current.verify.exit_code = 0; "
                     "j.evidence.totals['added'] = 40; j.evidence.files[0]['path'] = 'other.txt'")
    cli_a.ok("push")
    take(cli_b, b, theirs)
    proc = cli_b("verify", theirs)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "MISMATCH evidence" in proc.stdout and "other.txt" in proc.stdout and "x.txt" in proc.stdout
    assert "the record says 1 file, +40 -0" in proc.stdout and "MISMATCH verify:" not in proc.stdout
    assert "started in clone c-" in proc.stdout and "1 mismatch between its record and git" in proc.stdout
    run = cli_b("verify", theirs, "--run")
    assert run.returncode == 1 and "MISMATCH verify --run: test -f y.txt failed (exit 1) here" in run.stdout
    assert "the record says passed" in run.stdout
    git(b, "update-ref", f"refs/subtask/{theirs}/head", git(b, "rev-parse", "HEAD"))
    assert "MISMATCH head pin" in cli_b("verify", theirs).stdout
    assert cli_b("verify", "st-00000000").returncode == 128  # no such job: git's "fatal"


def test_verify_over_mcp_reports_the_same_findings(cli, repo, monkeypatch):
    import anyio
    from test_mcp import call, connect

    job = cli.start(MAKES_X, "--verify", "test -f x.txt")
    cli.ok("wait", job)
    monkeypatch.chdir(repo)

    async def main():
        async with connect("inproc", repo) as client:
            return await call(client, "verify", {"id": job})

    out = anyio.run(main)
    assert "ok       evidence" in out and f"{job}: what its record claims matches git" in out


def test_a_teammates_record_naming_my_repository_is_never_charged_to_my_cap(team):
    import shutil

    from test_admission import state_dir, use_paid_engine

    remote, ((a, cli_a), (b, cli_b)) = team
    use_paid_engine(a)
    use_paid_engine(b)
    theirs = cli_a.start("cost=2.5 file=a", "--max-usd", "3")
    cli_a.ok("wait", theirs, timeout=60)
    forge(a, theirs, f"j.spec.repo = {str(b)!r}")
    cli_a.ok("push")
    cli_b.ok("pull")
    mine = cli_b.start("cost=0.5 file=b", "--max-usd", "1")
    cli_b.ok("wait", mine, timeout=60)
    shutil.rmtree(state_dir(b))  # the ledger is rebuilt from this clone's records
    assert cli_b.json("spend")["committed_usd"] == pytest.approx(0.5)


def test_push_says_a_teammates_commits_on_my_job_are_not_mine_and_never_forces(team):
    remote, ((a, cli_a), (b, cli_b)) = team
    mine = cli_b.start("true")
    cli_b.ok("wait", mine)
    cli_b.ok("push")
    cli_a.ok("pull")
    forge(a, mine, "j.state.extra['teammate'] = 1")
    cli_a.ok("push")
    forge(b, mine, "j.state.extra['mine'] = 1")  # ours moves on too: the two have diverged
    pushed = cli_b("push")
    assert pushed.returncode == 1, pushed.stdout + pushed.stderr
    assert f"not pushed: refs/subtask/{mine}/record: origin has commits on this clone's job" in pushed.stdout
    assert git(remote, "rev-parse", f"refs/subtask/{mine}/record") == record_tip(a, mine)


def test_a_teammates_running_job_is_not_mine_to_stop(team, tmp_path):
    remote, ((a, cli_a), (b, cli_b)) = team
    gate = tmp_path / "gate"
    theirs = cli_a.start(f"while [ ! -e '{gate}' ]; do sleep 0.02; done")
    try:
        cli_a.ok("push")
        cli_b.ok("pull")
        before = record_tip(b, theirs)
        stopped = cli_b("stop", theirs)
        assert stopped.returncode == 1 and "another clone's job" in stopped.stderr, stopped.stdout + stopped.stderr
        assert record_tip(b, theirs) == before
    finally:
        gate.touch()
    cli_a.ok("wait", theirs)
