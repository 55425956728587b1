"""Sharing with teammates: two clones and a bare remote; push/pull never force, lose no note, overwrite no record."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import git, make_team, refs

from subtask.ops.sharing import sync


@pytest.fixture
def team(tmp_path):
    """A bare remote and two clones of it (a and b), each set up for the shell engine."""
    return make_team(tmp_path)


def job(cli, script="true") -> str:
    job_id = cli.start(script)
    cli.ok("wait", job_id)
    return job_id


def assert_only_fast_forwards(remote):
    """Every update the remote ever took was a fast-forward: each logged new value descends from the old."""
    logs = list((remote / "logs" / "refs").rglob("*"))
    updates = 0
    for log in (p for p in logs if p.is_file()):
        for line in log.read_text().splitlines():
            old, new = line.split()[:2]
            if set(old) == {"0"} or set(new) == {"0"}:
                continue
            updates += 1
            forced = subprocess.run(["git", "-C", str(remote), "merge-base", "--is-ancestor", old, new]).returncode
            assert forced == 0, f"{log.relative_to(remote)}: {old} -> {new} was a forced update"
    return updates


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
    assert assert_only_fast_forwards(remote) >= 1  # b's merged notes went on top of a's
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
            "import sys; from subtask import api; from subtask.git import records\n"
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
    assert git(remote, "rev-parse", f"refs/subtask/{shared}/record") == \
        git(a, "rev-parse", f"refs/subtask/{shared}/record")
    assert_only_fast_forwards(remote)


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


# ---------------------------------------------------------------- races and older copies

UPDATE_RECORD = (
    "import os, sys, time; from subtask import api; from subtask.git import records\n"
    "repo, job_id, until = api.repo_at(sys.argv[1]), sys.argv[2], sys.argv[3]\n"
    "i = 0\n"
    "while True:\n"
    "    i += 1\n"
    "    records.update(repo, job_id, lambda j: j.state.extra.__setitem__('mark', i))\n"
    "    if not until or os.path.exists(until):\n"
    "        break\n"
    "    time.sleep(0.005)\n"
    "print(i)\n"
)


def update_record(path, job_id, until=None):
    """Add a fact to a record (what a reply, a landing or a running worker does to it).

    With `until` (a path), keep adding facts until that file exists, in the background."""
    args = [sys.executable, "-c", UPDATE_RECORD, str(path), job_id, str(until or "")]
    if until:
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    subprocess.run(args, check=True)


def test_an_older_copy_of_a_record_is_not_a_divergence(team):
    remote, ((a, cli_a), (b, cli_b)) = team
    theirs = job(cli_a)
    mine = job(cli_b)
    cli_a.ok("push")
    cli_b.ok("push")
    cli_b.ok("pull")
    update_record(a, theirs)  # a moves its record on (a landing, a reply); b holds the older copy
    update_record(b, mine)  # and b moves its own record on: b is ahead of the remote there
    cli_a.ok("push")
    pushed = cli_b("push")
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    assert "not pushed" not in pushed.stdout and f"pushed refs/subtask/{mine}/record" in pushed.stdout
    assert git(remote, "rev-parse", f"refs/subtask/{theirs}/record") == \
        git(a, "rev-parse", f"refs/subtask/{theirs}/record")
    update_record(b, mine)  # ahead again: a pull must not call that a divergence either
    pulled = cli_b("pull")
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert "kept local" not in pulled.stdout
    assert f"updated refs/subtask/{theirs}/record (fast-forward)" in pulled.stdout, pulled.stdout
    assert git(b, "rev-parse", f"refs/subtask/{theirs}/record") == git(a, "rev-parse", f"refs/subtask/{theirs}/record")
    assert cli_b.json("show", theirs)["state_detail"]["mark"] == 1
    assert_only_fast_forwards(remote)


TEAMMATE = """
n=$1
while [ "$n" -lt "$2" ]; do
  n=$((n+1))
  until git fetch -q origin +refs/notes/subtask:refs/notes/subtask 2>/dev/null &&
        git notes --ref=subtask add -f -m "teammate note $n" HEAD && git push -q origin refs/notes/subtask 2>/dev/null
  do :; done
done
"""
TEAMMATE_PUSHES = 3  # per trial: contention the test bounds, so every push has a round it can win


def teammate_moving_notes(path, trial: int):
    """A teammate who adds a note and pushes it (again until the push lands), TEAMMATE_PUSHES times
    in a row, so every push and pull of the trial has notes to merge. Bounded: against a teammate
    who never stops, no push that is never forced can be sure of a turn (it would report what it
    kept, exit 1, after its patience)."""
    first = trial * TEAMMATE_PUSHES
    return subprocess.Popen(["sh", "-c", TEAMMATE, "teammate", str(first), str(first + TEAMMATE_PUSHES)], cwd=path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


RACE_TRIALS = int(os.environ.get("RACE_TRIALS", "10"))


def finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """Its output once it exits; one still running at `timeout` is killed and says so (with what
    it had printed), instead of the test's traceback hiding what the command was doing."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return out, f"still running after {timeout:.0f}s, killed; it had printed: {err}"


PULL_TRIALS = 4


@pytest.mark.early
@pytest.mark.stress
def test_syncs_at_once_in_one_clone_all_succeed(team):
    """Every pair at once (push/pull, pull/pull, push/push) while a teammate moves the notes."""
    remote, ((a, cli_a), (b, cli_b)) = team
    first = job(cli_a)
    cli_a.ok("push")
    commands = [("push",), ("pull",), ("push",), ("pull",)]
    failures = []
    for trial in range(RACE_TRIALS):
        teammate = teammate_moving_notes(b, trial)
        procs = [subprocess.Popen(["git", "subtask", *args], cwd=a, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for args in commands]
        for args, proc in zip(commands, procs, strict=True):
            out, err = finish(proc, timeout=sync.PUSH_PATIENCE_S + 60)  # past push's own patience
            if proc.returncode != 0:
                failures.append(f"trial {trial}: {' '.join(args)} exited {proc.returncode}: "
                                f"{err.strip()} {out.strip()}")
        finish(teammate, timeout=60)
    assert not failures, f"{len(failures)} of {len(commands) * RACE_TRIALS} commands failed:\n" + "\n".join(failures)
    # Then one more note of theirs and a new block of ours on the same commit: a real merge, and
    # nothing of either side lost (the teammate's `notes add -f` had dropped our blocks from theirs).
    finish(teammate_moving_notes(b, RACE_TRIALS), timeout=60)
    second = job(cli_a)
    cli_a.ok("push")
    note = git(remote, "notes", "--ref=subtask", "show", "HEAD")
    assert f"teammate note {(RACE_TRIALS + 1) * TEAMMATE_PUSHES}" in note, note
    assert f"subtask {first}" in note and f"subtask {second}" in note, note
    assert git(remote, "rev-parse", "refs/notes/subtask") == git(a, "rev-parse", "refs/notes/subtask")
    assert_only_fast_forwards(remote)


@pytest.mark.stress
def test_a_pull_racing_a_running_jobs_record_updates_succeeds_and_loses_no_update(team):
    remote, ((a, cli_a), (b, cli_b)) = team
    mine = job(cli_a)
    theirs = job(cli_b)
    cli_a.ok("push")
    cli_b.ok("push")
    stop = a.parent / "stop-writing"
    writer = update_record(a, mine, until=stop)  # a "running" job writing its record, fast
    failures = []
    try:
        for trial in range(PULL_TRIALS):
            update_record(b, theirs)
            cli_b.ok("push")
            pulled = cli_a("pull")
            if pulled.returncode != 0:
                failures.append(f"trial {trial}: pull exited {pulled.returncode}: "
                                f"{pulled.stderr.strip()} {pulled.stdout.strip()}")
    finally:
        stop.touch()
        out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert not failures, f"{len(failures)} of {PULL_TRIALS} pulls failed:\n" + "\n".join(failures)
    assert cli_a.json("show", mine)["state_detail"]["mark"] == int(out)  # the pulls lost no update
    assert git(a, "rev-parse", f"refs/subtask/{theirs}/record") == git(b, "rev-parse", f"refs/subtask/{theirs}/record")


def test_a_push_the_remote_declines_is_reported_at_once_not_retried(team):
    """A hook that declines is not a race: reported once, with git's reason, and nothing retried
    (retries, with patience, are only for refusals that pass: a moved ref, a busy ref lock)."""
    remote, ((a, cli_a), _) = team
    job(cli_a)
    hook = remote / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho pushed >> \"$(dirname \"$0\")/../attempts\"\necho 'no pushes today' >&2\nexit 1\n")
    hook.chmod(0o755)
    proc = cli_a("push")
    assert proc.returncode == 1 and "not pushed" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert (remote / "attempts").read_text().count("pushed") == 1, "a declined push was retried"
    assert git(remote, "for-each-ref", "refs/subtask/", "refs/notes/") == ""


def test_a_pulled_group_arrives_as_a_group_and_shows_in_the_other_clone(team):
    _, ((a, cli_a), (b, cli_b)) = team
    gid = cli_a.ok("start", "--best-of", "2", "true", "--verify", "true").split()[0]
    cli_a.ok("wait", gid)
    cli_a.ok("push")
    pulled = cli_b.ok("pull")
    assert f"new group {gid}" in pulled and "new job groups/" not in pulled, pulled
    assert cli_b.json("show", gid)["pick"], "the pulled group has no pick in the other clone"


def test_the_chain_store_tells_whose_ref_it_is():
    """One definition per kind of record (`chains.KINDS`): a group's refs are not a job's, a job's
    pins are its own, and a ref of another shape is nobody's (sync parses no ref names itself)."""
    from subtask.git import chains

    def owner(ref):
        found = chains.owner_of(ref)
        return (found.kind.name, found.id, found.part) if found else None

    assert owner("refs/subtask/st-0123abcd/record") == ("job", "st-0123abcd", "record")
    assert owner("refs/subtask/st-0123abcd/attempts/3") == ("job", "st-0123abcd", "attempts/3")
    assert owner("refs/subtask/groups/sg-0123abcd/record") == ("group", "sg-0123abcd", "record")
    assert owner("refs/subtask/groups/sg-0123abcd/base") is None  # a group has no pins
    assert owner("refs/subtask/groups/record") is None
    assert owner("refs/subtask/st-0123abcd/attempts/x") is None
    assert owner("refs/subtask/../st-0123abcd/record") is None
    assert owner("refs/heads/subtask/st-0123abcd") is None
