"""Landing many (issue 32): `git subtask land`, a queue that integrates each job onto the moving
tip in a scratch worktree, verifies the integrated commit, and moves the branch by
compare-and-swap. Real repositories, real workers, the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import git, is_ancestor, refs, wait_until

ADD = "echo {text} > {name} && git add {name} && git commit -qm 'add {name}'"
APPEND = "echo {text} >> {name} && git add {name} && git commit -qm 'append {text} to {name}'"


def finished(cli, task: str, *args: str) -> str:
    job = cli.start(task, *args)
    cli("wait", job)
    return job


def detail(cli, job: str) -> dict:
    return cli.json("show", job)["state_detail"]


def note_of(repo: Path, job: str) -> str:
    head = git(repo, "rev-parse", f"refs/subtask/{job}/head")
    return git(repo, "notes", "--ref=subtask", "show", head)


def land(cli, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return cli("land", *args, **kwargs)


def clean(repo: Path) -> bool:
    return git(repo, "status", "--porcelain", "--untracked-files=no") == ""


def test_three_jobs_on_disjoint_files_land_in_order_each_verified_on_its_integrated_commit(cli, repo):
    jobs = [finished(cli, ADD.format(name=f"{n}.txt", text=n), "--verify", f"test -f {n}.txt") for n in "abc"]
    before = git(repo, "rev-parse", "main")
    proc = land(cli, *jobs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"main: {before[:7]} -> " in proc.stdout and "(3 of 3 landed)" in proc.stdout
    assert proc.stdout.count("  verify: test -f") == 3, "each verify ran confined, as a job's does"
    # In the order given: a, then b, then c on top, first-parent.
    subjects = git(repo, "log", "--first-parent", "--format=%s", f"{before}..main").splitlines()
    assert [s.split(":")[0] for s in reversed(subjects)][-2:] == \
        [f"Merge subtask {jobs[1]}", f"Merge subtask {jobs[2]}"]
    assert all((repo / f"{n}.txt").read_text() == f"{n}\n" for n in "abc") and clean(repo)
    for job in jobs:
        state = detail(cli, job)
        landing = state["landings"][-1]
        assert state["landed_in"] == landing["commit"] and landing["landed"] is True
        assert landing["verify"]["head"] == landing["commit"] and landing["verify"]["passed"]
        assert is_ancestor(repo, landing["commit"], "main")
        assert landing["onto"] == git(repo, "rev-parse", f"{landing['commit']}^1")  # built on the tip of its time
        # Its note names the integrated commit its verify ran on.
        assert f"= {landing['commit'][:7]}" in note_of(repo, job), note_of(repo, job)
        assert "landed" in note_of(repo, job)
        assert f"refs/heads/subtask/{job}" not in refs(repo)  # cleaned up as merge does
        assert not (repo / ".subtask" / "worktrees" / job).exists()
    assert not list((repo / ".subtask" / "worktrees").glob(".land/*")), "no scratch worktree is left"


BOTH_NEVER = "! (test -f a.txt && test -f b.txt)"


@pytest.mark.parametrize("atomic", [False, True])
def test_two_jobs_that_pass_alone_but_fail_together(cli, repo, atomic):
    a = finished(cli, ADD.format(name="a.txt", text="a"), "--verify", BOTH_NEVER)
    b = finished(cli, ADD.format(name="b.txt", text="b"), "--verify", BOTH_NEVER)
    assert all(cli.json("show", j)["state_detail"]["attempts"][-1]["verify"]["passed"] for j in (a, b))
    before = git(repo, "rev-parse", "main")
    proc = land(cli, *(["--atomic"] if atomic else []), a, b)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{b}: failed" in proc.stdout and "exit 1" in proc.stdout
    after = git(repo, "rev-parse", "main")
    if atomic:
        assert after == before and not (repo / "a.txt").exists()
        assert f"{b} broke the queue" in proc.stdout and "nothing landed" in proc.stdout
        assert detail(cli, a)["landed_in"] is None and detail(cli, a)["landings"][-1]["outcome"] == "passed"
        assert f"refs/heads/subtask/{a}" in refs(repo)
    else:
        assert (repo / "a.txt").exists() and not (repo / "b.txt").exists()
        assert detail(cli, a)["landed_in"] == after
    state_b = detail(cli, b)
    assert state_b["landed_in"] is None and state_b["landings"][-1]["outcome"] == "failed"
    assert f"refs/heads/subtask/{b}" in refs(repo), "a job that did not land keeps its branch"
    assert "verify failed" in note_of(repo, b) or "exit 1" in note_of(repo, b)
    assert clean(repo)


def test_a_conflicting_pair_with_reconcile_on_the_shell_engine_ends_with_both_landed(cli, repo):
    (repo / "log.txt").write_text("start\n")
    git(repo, "add", "log.txt")
    git(repo, "commit", "-qm", "a log")
    verify = "grep -q start log.txt"
    a = finished(cli, APPEND.format(name="log.txt", text="A"), "--verify", verify)
    b = finished(cli, APPEND.format(name="log.txt", text="B"), "--verify", verify)
    plain = land(cli, a, b)
    assert plain.returncode == 1 and f"{b}: conflict" in plain.stdout and "log.txt" in plain.stdout, plain.stdout
    assert "append A to log.txt" in plain.stdout  # the target's side of the conflict
    assert (repo / "log.txt").read_text() == "start\nA\n"
    proc = land(cli, "--reconcile", b, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reconciling: its task runs again" in proc.stdout
    assert (repo / "log.txt").read_text() == "start\nA\nB\n" and clean(repo)
    state = detail(cli, b)
    assert state["landed_in"] and len(state["attempts"]) == 2 and state["attempts"][1]["state"] == "done"
    assert detail(cli, a)["landed_in"]
    # Its work is counted from where the reconciliation moved it, not from its first base.
    evidence = cli.json("show", b)["evidence"]
    assert evidence["base"] == state["rebased_onto"] and evidence["totals"]["commits"] == 1
    assert "changes: 1 file, +1 -0" in note_of(repo, b)


def test_a_commit_a_person_makes_on_main_during_the_queue_is_kept(cli, repo, tmp_path):
    a = finished(cli, ADD.format(name="a.txt", text="a"), "--verify", "test -f a.txt")
    b = finished(cli, ADD.format(name="b.txt", text="b"), "--verify", "test -f b.txt")
    gate = tmp_path / "gate"
    env = {"SUBTASK_FAULT_HOLD": f"land_verified:{gate}"}
    queue = subprocess.Popen(["git", "subtask", "land", a, b], cwd=repo, env=dict(os.environ, **env),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists()), "the queue never reached the hold"
        (repo / "mine.txt").write_text("a person's work\n")
        git(repo, "add", "mine.txt")
        git(repo, "commit", "-qm", "a person's commit")
        mine = git(repo, "rev-parse", "HEAD")
        gate.touch()
        out, err = queue.communicate(timeout=120)
    finally:
        queue.kill()
    assert queue.returncode == 0, out + err
    assert "moved while it was built" in out
    assert is_ancestor(repo, mine, "main")
    assert all((repo / f).exists() for f in ("a.txt", "b.txt", "mine.txt")) and clean(repo)
    landing = detail(cli, a)["landings"][-1]
    assert landing["onto"] == mine and landing["landed"], "the landing was built again on the person's commit"


@pytest.mark.parametrize("point", ["land_built", "land_verified", "land_moved"])
@pytest.mark.parametrize("atomic", [False, True])
def test_killing_land_at_any_step_leaves_main_before_or_after_a_whole_landing(cli, repo, point, atomic):
    a = finished(cli, ADD.format(name="a.txt", text="a"), "--verify", "test -f a.txt")
    b = finished(cli, ADD.format(name="b.txt", text="b"), "--verify", "test -f b.txt")
    before = git(repo, "rev-parse", "main")
    proc = land(cli, *(["--atomic"] if atomic else []), a, b, env={"SUBTASK_FAULT": point})
    assert proc.returncode == 99, proc.stdout + proc.stderr
    after = git(repo, "rev-parse", "main")
    files = {f for f in ("a.txt", "b.txt") if (repo / f).exists()}
    if point == "land_moved":
        assert after != before and files == ({"a.txt", "b.txt"} if atomic else {"a.txt"})
    else:
        assert after == before and not files
    assert clean(repo), git(repo, "status", "--porcelain")
    assert git(repo, "ls-files", "--others", "--exclude-standard") == ""
    # The next land finishes the queue and leaves nothing of the killed one behind.
    again = land(cli, a, b)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (repo / "a.txt").exists() and (repo / "b.txt").exists() and clean(repo)
    assert detail(cli, a)["landed_in"] and detail(cli, b)["landed_in"]
    assert not list((repo / ".subtask" / "worktrees").glob(".land/*"))
    assert "/.land/" not in git(repo, "worktree", "list")


@pytest.mark.parametrize("mode", ["--squash", "--rebase", "--no-ff"])
def test_modes_land_and_cleanup_merged_recognises_them(cli, repo, mode):
    a = finished(cli, ADD.format(name="a.txt", text="a"), "--verify", "test -f a.txt")
    git(repo, "commit", "-q", "--allow-empty", "-m", "main moves on")
    proc = land(cli, mode, a)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    parents = git(repo, "log", "-1", "--format=%P").split()
    assert len(parents) == (2 if mode == "--no-ff" else 1)
    assert (repo / "a.txt").read_text() == "a\n"
    state = detail(cli, a)
    assert state["landed_in"] == git(repo, "rev-parse", "main") == state["landings"][-1]["commit"]
    assert state["landings"][-1]["mode"] == mode[2:]


def test_a_job_with_nothing_to_verify_is_refused_unless_forced_or_given_a_verify(cli, repo):
    a = finished(cli, ADD.format(name="a.txt", text="a"))
    before = git(repo, "rev-parse", "main")
    proc = land(cli, a)
    assert proc.returncode == 1 and "nothing to run on the integrated commit" in proc.stdout
    assert git(repo, "rev-parse", "main") == before
    proc = land(cli, "--verify", "test -f a.txt", a)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert detail(cli, a)["landings"][-1]["verify"]["command"] == "test -f a.txt"


def test_a_dirty_checkout_is_refused_and_bad_ids_change_nothing(cli, repo):
    a = finished(cli, ADD.format(name="a.txt", text="a"), "--verify", "test -f a.txt")
    before = git(repo, "rev-parse", "main")
    (repo / "README.md").write_text("my edit\n")
    proc = land(cli, a)  # fatal, as git says it (issue 38)
    assert proc.returncode == 128 and "uncommitted changes" in proc.stderr, proc.stderr
    assert (repo / "README.md").read_text() == "my edit\n" and git(repo, "rev-parse", "main") == before
    git(repo, "checkout", "README.md")
    proc = land(cli, a, "st-00000000")
    assert proc.returncode == 128 and "error:" in proc.stderr and "Traceback" not in proc.stderr
    proc = land(cli, a, a)
    assert proc.returncode == 129 and "twice" in proc.stderr
    assert git(repo, "rev-parse", "main") == before and detail(cli, a)["landings"] == []


def test_land_json_reports_every_job(cli, repo):
    a = finished(cli, ADD.format(name="a.txt", text="a"), "--verify", "test -f a.txt")
    data = json.loads(land(cli, "--json", a).stdout)
    assert data["v"] == 1 and data["ok"] and data["target"] == "main"
    assert data["jobs"][0]["id"] == a and data["jobs"][0]["state"] == "landed"
    assert data["jobs"][0]["verify"]["head"] == data["after"]


def test_dry_run_says_the_order_files_overlap_and_predicted_conflicts_and_changes_nothing(cli, repo):
    (repo / "log.txt").write_text("one\ntwo\nthree\n")
    git(repo, "add", "log.txt")
    git(repo, "commit", "-qm", "a log")
    verify = "test -f log.txt"
    a = finished(cli, "sed -i 's/one/ONE/' log.txt && git commit -qam 'shout one'", "--verify", verify)
    b = finished(cli, "sed -i 's/one/Uno/' log.txt && git commit -qam 'spanish one'", "--verify", verify)
    c = finished(cli, ADD.format(name="c.txt", text="c"), "--verify", verify)
    git(repo, "commit", "-q", "--allow-empty", "-m", "main moves on")

    def everything():
        return (git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
                git(repo, "status", "--porcelain", "--ignored"), git(repo, "worktree", "list"))

    before = everything()
    proc = land(cli, "--dry-run", c, a, b)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one would conflict
    out = proc.stdout
    assert out.index(f"1. {c}") < out.index(f"2. {a}") < out.index(f"3. {b}")
    assert f"{a}: 1 file · base 1 behind main: log.txt" in out
    assert "would integrate (merge), then verify test -f log.txt on the integrated commit" in out
    assert f"{a} and {b} both change log.txt (same lines)" in out
    assert "would conflict in log.txt" in out and "nothing was changed (dry run)" in out
    assert everything() == before
    data = json.loads(land(cli, "--dry-run", "--json", a, c).stdout)
    assert data["ok"] and [j["would"] for j in data["jobs"]] == ["land", "land"] and data["pairs"] == []
    assert everything() == before


def test_a_best_of_group_lands_its_pick_and_supersedes_the_rest(cli, repo):
    work = 'case "$SUBTASK_GROUP_MEMBER" in 1) seq 1 10 > g.txt ;; 2) echo small > g.txt ;; esac; git add g.txt; ' \
           'git commit -qm "add g"'
    lines = cli.ok("start", "--best-of", "2", work, "--verify", "test -f g.txt").splitlines()
    gid, members = lines[0].split()[0], [line.split()[0] for line in lines[1:]]
    cli("wait", gid)
    other = finished(cli, ADD.format(name="o.txt", text="o"), "--verify", "test -f o.txt")
    proc = land(cli, gid, other)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pick = cli.json("show", gid)["pick"]
    assert pick == members[1] and f"{pick} ({gid}): landed" in proc.stdout
    assert (repo / "g.txt").read_text() == "small\n" and (repo / "o.txt").exists()
    assert f"{members[0]}: superseded" in proc.stdout
    assert cli.json("show", gid)["merged"]["commit"] == detail(cli, pick)["landed_in"]


def test_a_teammates_job_is_verified_on_the_integrated_commit_and_its_record_left_alone(tmp_path):
    from conftest import grant_writable, make_team

    remote, ((a, cli_a), (b, cli_b)) = make_team(tmp_path)
    log = grant_writable(tmp_path / "log")
    log.mkdir()
    verify = f"echo ran >> {log / 'ran'}; test -f x.txt"
    theirs = cli_a.start(ADD.format(name="x.txt", text="x"), "--verify", verify)
    cli_a("wait", theirs)
    cli_a.ok("push", "--branches")
    cli_b.ok("pull")
    git(b, "fetch", "-q", "origin", f"refs/heads/subtask/{theirs}:refs/heads/subtask/{theirs}")
    record = git(b, "rev-parse", f"refs/subtask/{theirs}/record")
    proc = cli_b("land", theirs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (log / "ran").read_text().count("ran") == 2  # once by the teammate, once here on the integrated commit
    assert "another clone's job" in proc.stdout and (b / "x.txt").exists()
    assert git(b, "rev-parse", f"refs/subtask/{theirs}/record") == record  # never written here
    assert f"refs/heads/subtask/{theirs}" in refs(b)


def test_atomic_with_reconcile_lands_both_at_once(cli, repo):
    (repo / "log.txt").write_text("start\n")
    git(repo, "add", "log.txt")
    git(repo, "commit", "-qm", "a log")
    verify = "grep -q start log.txt"
    a = finished(cli, APPEND.format(name="log.txt", text="A"), "--verify", verify)
    b = finished(cli, APPEND.format(name="log.txt", text="B"), "--verify", verify)
    before = git(repo, "rev-parse", "main")
    proc = land(cli, "--atomic", "--reconcile", a, b, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (repo / "log.txt").read_text() == "start\nA\nB\n"
    # One move: main's first parent chain went from before straight to the last landing.
    assert git(repo, "rev-parse", "main~2") == before
    assert git(repo, "reflog", "-1", "--format=%gs", "main").startswith("merge")


def conflicting_pair(cli, repo, verify_b: str = "grep -q start log.txt") -> tuple[str, str]:
    """Two finished jobs appending to the same file; the first landed, so the second conflicts."""
    (repo / "log.txt").write_text("start\n")
    git(repo, "add", "log.txt")
    git(repo, "commit", "-qm", "a log")
    a = finished(cli, APPEND.format(name="log.txt", text="A"), "--verify", "grep -q start log.txt")
    b = finished(cli, APPEND.format(name="log.txt", text="B"), "--verify", verify_b)
    assert land(cli, a).returncode == 0
    return a, b


def test_reconcile_moves_no_branch_but_the_jobs_whatever_its_worktrees_head_names(cli, repo):
    """A job's verify runs after the worker's last look at its metadata: it pointed its worktree's
    HEAD at `release` (files to match, so the worktree looked clean), and `land --reconcile` then
    reset `release` onto main's tip."""
    git(repo, "branch", "release")
    release = git(repo, "rev-parse", "release")
    evil = ("grep -q start log.txt && printf 'ref: refs/heads/release\\n' > \"$(git rev-parse --git-dir)/HEAD\""
            " && git read-tree -u --reset release")
    _, b = conflicting_pair(cli, repo, evil)
    head = git(repo, "rev-parse", f"subtask/{b}")
    proc = land(cli, "--reconcile", b, timeout=120)
    assert git(repo, "rev-parse", "release") == release, "land --reconcile moved a branch the job's HEAD named"
    assert git(repo, "rev-parse", f"subtask/{b}") == head
    assert proc.returncode == 1 and "not reconciled" in proc.stdout and "HEAD" in proc.stdout, proc.stdout
    assert len(detail(cli, b)["attempts"]) == 1  # no reply was started


def test_reconcile_never_resets_away_a_commit_made_on_the_jobs_branch_meanwhile(cli, repo, tmp_path):
    """`land` reads the job's head, builds it, and only then reconciles: a commit made on the
    job's branch in between (one that changes no file, so its worktree stays clean) was reset
    away. The branch moves by compare-and-swap on the head `land` read."""
    _, b = conflicting_pair(cli, repo)
    gate = tmp_path / "gate"
    queue = subprocess.Popen(["git", "subtask", "land", "--reconcile", b], cwd=repo,
                             env=dict(os.environ, SUBTASK_FAULT_HOLD=f"land_built:{gate}"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists()), "the queue never reached the hold"
        old = git(repo, "rev-parse", f"subtask/{b}")
        mine = git(repo, "commit-tree", f"{old}^{{tree}}", "-p", old, "-m", "a person's commit")
        git(repo, "update-ref", f"refs/heads/subtask/{b}", mine, old)
        gate.touch()
        out, err = queue.communicate(timeout=120)
    finally:
        queue.kill()
    assert git(repo, "rev-parse", f"subtask/{b}", check=False) == mine, "the person's commit was reset away"
    assert "not reconciled" in out and "moved" in out, out + err
    assert len(detail(cli, b)["attempts"]) == 1  # no reply was started


AGENT = """#!/bin/sh
# A stand-in agent: asked to resolve conflict markers it keeps both sides; else it appends its task.
case "$1" in
  *"conflict markers"*) sed -i -e '/^<<<<<<< /d' -e '/^=======$/d' -e '/^>>>>>>> /d' log.txt ;;
  *) echo "$1" >> log.txt && git add log.txt && git commit -qm "$1" ;;
esac
"""


def test_reconcile_asks_an_agent_in_words_with_its_changes_applied_on_the_new_tip(cli, repo, tmp_path):
    script = tmp_path / "agent.sh"
    script.write_text(AGENT)
    git(repo, "config", "subtask.engine.agent.command", json.dumps(["sh", str(script), "{task}"]))
    (repo / "log.txt").write_text("start\n")
    git(repo, "add", "log.txt")
    git(repo, "commit", "-qm", "a log")
    verify = "grep -q start log.txt && ! grep -q '^<<<<<<<' log.txt"
    a = finished(cli, APPEND.format(name="log.txt", text="A"), "--verify", verify)
    b = finished(cli, "B", "--engine", "agent", "--verify", verify)
    proc = land(cli, "--reconcile", a, b, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "a reply resolves it on main" in proc.stdout
    assert (repo / "log.txt").read_text() == "start\nA\nB\n"
    message = detail(cli, b)["attempts"][1]["message"]
    assert "conflict markers in: log.txt" in message and "append A to log.txt" in message, message


def test_status_and_list_mark_a_stale_base_and_jobs_that_change_the_same_file(cli, repo, control_dir):
    a = finished(cli, ADD.format(name="same.txt", text="a"), "--verify", "true")
    b = finished(cli, ADD.format(name="other.txt", text="b"), "--verify", "true")
    gate = control_dir / "gate"
    running = cli.start(ADD.format(name="same.txt", text="c") + f" && while [ ! -f {gate} ]; do sleep 0.05; done")
    try:
        assert wait_until(lambda: f"refs/heads/subtask/{running}" in refs(repo) and
                          git(repo, "rev-parse", f"subtask/{running}") != git(repo, "rev-parse", "main"))
        git(repo, "commit", "-q", "--allow-empty", "-m", "main moves on")
        git(repo, "commit", "-q", "--allow-empty", "-m", "and on")
        rows = {line.split()[0]: line for line in cli.ok("list").splitlines()[1:]}
        assert f"(base: 2 behind main · same file as {running}: same.txt)" in rows[a], rows[a]
        assert rows[b].endswith("(base: 2 behind main)"), rows[b]
        assert f"same file as {a}: same.txt" in rows[running] and "behind" not in rows[running]
        status = cli.ok("status")
        assert running in status and f"same file as {a}: same.txt" in status
        assert "base: 2 behind main" in cli.ok("status", a)
        listed = {e["id"]: e for e in cli.json("list")["jobs"]}
        assert listed[a]["marks"] == {"behind": 2, "target": "main", "overlaps": {running: ["same.txt"]}}
        assert "marks" not in listed[b] or "overlaps" not in listed[b]["marks"]
    finally:
        gate.touch()
        cli("wait", running)


def test_a_checkout_made_dirty_during_the_queue_stops_it_and_is_never_touched(cli, repo, tmp_path):
    a = finished(cli, ADD.format(name="a.txt", text="a"), "--verify", "test -f a.txt")
    gate = tmp_path / "gate"
    queue = subprocess.Popen(["git", "subtask", "land", a], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=dict(os.environ, SUBTASK_FAULT_HOLD=f"land_verified:{gate}"))
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists()), "the queue never reached the hold"
        before = git(repo, "rev-parse", "main")
        (repo / "README.md").write_text("my edit, made while the queue ran\n")
        gate.touch()
        out, err = queue.communicate(timeout=120)
    finally:
        queue.kill()
    assert queue.returncode == 1, out + err
    assert f"{a}: stopped: the worktree {repo} has uncommitted changes (README.md)" in out
    assert (repo / "README.md").read_text() == "my edit, made while the queue ran\n"
    assert git(repo, "rev-parse", "main") == before and not (repo / "a.txt").exists()
    assert f"refs/heads/subtask/{a}" in refs(repo)


def test_a_squash_landing_killed_after_the_move_is_found_by_cleanup_merged(cli, repo):
    a = finished(cli, ADD.format(name="a.txt", text="a"), "--verify", "test -f a.txt")
    git(repo, "commit", "-q", "--allow-empty", "-m", "main moves on")  # so the squash is a new commit
    proc = land(cli, "--squash", a, env={"SUBTASK_FAULT": "land_moved"})
    assert proc.returncode == 99 and (repo / "a.txt").exists() and clean(repo)
    assert detail(cli, a)["landed_in"] is None  # killed before it was recorded
    out = cli.ok("cleanup", "--merged")
    assert f"{a}: landed in {git(repo, 'rev-parse', '--short=7', 'main')}" in out
    assert detail(cli, a)["landed_in"] == git(repo, "rev-parse", "main")
    head = git(repo, "rev-parse", f"refs/subtask/{a}/head")
    assert f"landed:  here, from its head {head[:7]}" in git(repo, "notes", "--ref=subtask", "show", "main")


def test_two_modes_at_once_are_a_usage_error_and_completion_knows_land(cli, repo):
    a = finished(cli, ADD.format(name="a.txt", text="a"), "--verify", "test -f a.txt")
    proc = land(cli, "--squash", "--rebase", a)
    assert proc.returncode == 129 and "--squash and --rebase cannot be used together" in proc.stderr
    offered = cli.ok("__complete", "land").split()
    assert {"--atomic", "--reconcile", "--dry-run", "--rebase", a} <= set(offered)


TAMPER = ("printf 'HACKED\\n' > greeting.txt && git update-index --skip-worktree greeting.txt; exit 1")


def test_what_a_failed_verify_left_in_the_scratch_never_reaches_the_next_jobs_verify(cli, repo):
    """A verify that fails may have changed the scratch worktree so that git no longer sees it
    (a tracked file rewritten and marked skip-worktree, which `checkout --force` leaves alone): the
    next job gets a fresh checkout."""
    (repo / "greeting.txt").write_text("hello\n")
    git(repo, "add", "greeting.txt")
    git(repo, "commit", "-qm", "a greeting")
    a = finished(cli, ADD.format(name="a.txt", text="a"), "--verify", "test -f a.txt")
    b = finished(cli, ADD.format(name="b.txt", text="b"), "--verify", "grep -qx hello greeting.txt")
    proc = land(cli, "--verify", f"if test -f a.txt; then {TAMPER}; fi; grep -qx hello greeting.txt", a, b)
    assert f"{a}: failed" in proc.stdout and f"{b}: landed" in proc.stdout, proc.stdout + proc.stderr


# Code a landing's verify runs (a test suite, a conftest.py): in a scratch it writes a smudge filter
# into the scratch's config.worktree, which git reads (extensions.worktreeConfig), and passes.
FILTER_IN_SCRATCH = """case "$PWD" in */.land/*)
  d=$(git rev-parse --git-dir)
  git config -f "$d/config.worktree" filter.x.smudge "sh -c 'touch {marker}; cat'"
  git config -f "$d/config.worktree" core.attributesFile "$d/attrs"
  echo '* filter=x' > "$d/attrs";;
esac
"""


def test_a_passed_verify_that_wrote_a_config_worktree_in_the_scratch_runs_nothing_of_it(cli, repo, tmp_path):
    """A scratch is reused after a verify that passed (`checkout --force` to the next tip): that
    checkout ran a smudge filter the verify had written into the scratch's config.worktree,
    unconfined. Such a scratch is made anew."""
    marker = tmp_path / "escaped"
    git(repo, "config", "core.repositoryformatversion", "1")
    git(repo, "config", "extensions.worktreeConfig", "true")
    (repo / "check.sh").write_text(FILTER_IN_SCRATCH.format(marker=marker))
    git(repo, "add", "check.sh")
    git(repo, "commit", "-qm", "a check script")
    jobs = [finished(cli, ADD.format(name=f"{n}.txt", text=n), "--verify", f"sh check.sh && test -f {n}.txt")
            for n in "abc"]
    proc = land(cli, *jobs, timeout=120)
    assert not marker.exists(), "a filter a verify wrote ran outside its sandbox"
    assert proc.returncode == 0 and all(f"{j}: landed" in proc.stdout for j in jobs), proc.stdout + proc.stderr


@pytest.mark.parametrize("tamper", ["config.worktree", ".git"])
def test_a_scratch_whose_git_metadata_a_verify_changed_is_made_anew(repo, tamper):
    """What a verify left in a scratch's admin folder (a config.worktree, even one git would not
    read now) or its `.git` is never reused: the next landing gets a fresh checkout."""
    from subtask.git.gitrepo import open_repo
    from subtask.ops.landing import integrate

    scratch = integrate.Scratch(open_repo(repo))
    main = git(repo, "rev-parse", "main")
    try:
        first = scratch.at(main)
        assert scratch.at(main) == first  # reused, as long as nothing changed
        if tamper == "config.worktree":
            (scratch.admin / "config.worktree").write_text("[core]\n\tfsmonitor = false\n")
        else:
            (first / ".git").write_text(f"gitdir: {repo / '.git'}\n")
        second = scratch.at(main)
        assert second != first and not first.exists()
    finally:
        scratch.close()


def test_a_job_still_running_is_refused_and_the_rest_land(cli, repo, control_dir):
    gate = control_dir / "gate"
    running = cli.start(f"while [ ! -f {gate} ]; do sleep 0.05; done; echo r > r.txt")
    a = finished(cli, ADD.format(name="a.txt", text="a"), "--verify", "test -f a.txt")
    try:
        proc = land(cli, running, a)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert f"{running}: refused: {running} is running: it has not finished" in proc.stdout
        assert f"{a}: landed" in proc.stdout and (repo / "a.txt").exists()
    finally:
        gate.touch()
        cli("wait", running)


def test_a_job_that_deleted_a_test_is_never_landed_not_even_forced(cli, repo):
    """The job's checks (issue 33) run on its own change beside the verify on the integrated
    commit, as a re-run does: --force skips the gate, never the verify of what lands."""
    (repo / "tests").mkdir()
    (repo / "tests" / "test_x.py").write_text("def test_x():\n    assert True\n")
    git(repo, "add", "tests")
    git(repo, "commit", "-qm", "a test")
    job = finished(cli, "git rm -q tests/test_x.py && git commit -qm 'drop a test'", "--verify", "true")
    before = git(repo, "rev-parse", "main")
    refused = land(cli, job)
    assert refused.returncode == 1 and f"{job}: refused" in refused.stdout, refused.stdout
    forced = land(cli, "--force", job)
    assert forced.returncode == 1 and "check no-test-deletion failed" in forced.stdout, forced.stdout
    assert git(repo, "rev-parse", "main") == before and (repo / "tests" / "test_x.py").exists()


def test_a_branch_switched_to_in_the_target_checkout_during_the_queue_is_never_moved(cli, repo, tmp_path):
    """The checkout's HEAD commit alone does not say main is still what it has checked out: after
    `git switch -c topic` there, `git merge --ff-only` would move topic and the job be recorded
    landed in a commit main never got."""
    a = finished(cli, ADD.format(name="a.txt", text="a"), "--verify", "test -f a.txt")
    gate = tmp_path / "gate"
    queue = subprocess.Popen(["git", "subtask", "land", a], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=dict(os.environ, SUBTASK_FAULT_HOLD=f"land_verified:{gate}"))
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists()), "the queue never reached the hold"
        before = git(repo, "rev-parse", "main")
        git(repo, "switch", "-q", "-c", "topic")
        gate.touch()
        out, err = queue.communicate(timeout=120)
    finally:
        queue.kill()
    assert queue.returncode == 1, out + err
    assert f"{a}: stopped: the worktree {repo} has topic checked out, not main" in out, out
    assert git(repo, "rev-parse", "main") == before and git(repo, "rev-parse", "topic") == before
    assert not (repo / "a.txt").exists() and clean(repo)
    assert detail(cli, a)["landed_in"] is None and f"refs/heads/subtask/{a}" in refs(repo)


def test_a_reconciled_job_is_checked_and_rechecked_from_where_it_was_moved(cli, repo):
    """After `land --reconcile` its branch holds the target's commits too: its checks, `verify`'s
    evidence and `verify --run`'s checks count its work from `rebased_onto`, so a test the
    target deleted is not the job's deletion, and its evidence is no mismatch."""
    (repo / "log.txt").write_text("start\n")
    (repo / "test_x.py").write_text("def test_one():\n    assert True\n")
    git(repo, "add", "log.txt", "test_x.py")
    git(repo, "commit", "-qm", "a log and a test")
    verify = "grep -q start log.txt"
    a = finished(cli, APPEND.format(name="log.txt", text="A") + " && git rm -q test_x.py && git commit -qm 'drop test'",
                 "--verify", verify, "--check", "none")
    b = finished(cli, APPEND.format(name="log.txt", text="B"), "--verify", verify)
    assert land(cli, a).returncode == 0
    proc = land(cli, "--reconcile", b, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = detail(cli, b)
    assert state["landed_in"] and state["attempts"][1]["state"] == "done", state["attempts"][1]
    assert not state["attempts"][1]["verify"].get("checks_failed")
    checked = cli("verify", b)
    assert checked.returncode == 0 and "MISMATCH" not in checked.stdout, checked.stdout + checked.stderr
    assert f"since {state['rebased_onto'][:7]}, as recorded" in checked.stdout, checked.stdout
    rerun = cli("verify", "--run", b)
    assert rerun.returncode == 0 and "MISMATCH" not in rerun.stdout, rerun.stdout + rerun.stderr
    assert "check no-test-deletion failed" not in rerun.stdout


def test_a_reconciliation_that_leaves_no_commit_of_its_own_is_nothing_to_land(cli, repo):
    """Its branch at the tip it was moved onto holds commits beyond its first base (the target's),
    none of its own: it is never recorded as landed."""
    (repo / "log.txt").write_text("start\n")
    git(repo, "add", "log.txt")
    git(repo, "commit", "-qm", "a log")
    verify = "grep -q start log.txt"
    a = finished(cli, APPEND.format(name="log.txt", text="A"), "--verify", verify)
    b = finished(cli, "grep -q A log.txt || { " + APPEND.format(name="log.txt", text="B") + "; }", "--verify", verify)
    assert land(cli, a).returncode == 0
    main = git(repo, "rev-parse", "main")
    proc = land(cli, "--reconcile", "--json", b, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    outcome = json.loads(proc.stdout)["jobs"][0]
    assert outcome["state"] == "conflict" and f"nothing to merge: {b} made no commits" in outcome["why"], outcome
    assert git(repo, "rev-parse", "main") == main
    state = detail(cli, b)
    assert state["rebased_onto"] == main and state["landed_in"] is None
    assert not any(x.get("landed") for x in state["landings"]), state["landings"]


def test_a_failed_reconciliation_leaves_the_verified_head_pinned(cli, repo):
    """The reconciliation moves the branch and its reply's worker the head pin: the head that
    passed its verify before is pinned as its attempt's (`refs/subtask/<id>/attempts/<n>`), so
    more than the reflog keeps it when the reply fails."""
    (repo / "log.txt").write_text("start\n")
    git(repo, "add", "log.txt")
    git(repo, "commit", "-qm", "a log")
    a = finished(cli, APPEND.format(name="log.txt", text="A"), "--verify", "grep -q start log.txt")
    b = finished(cli, APPEND.format(name="log.txt", text="B"), "--verify",
                 "grep -q start log.txt && ! grep -q A log.txt")
    old = git(repo, "rev-parse", f"subtask/{b}")
    assert land(cli, a).returncode == 0
    proc = land(cli, "--reconcile", b, timeout=120)
    assert proc.returncode == 1 and "reconciliation (attempt 2) ended done, verify failed" in proc.stdout, proc.stdout
    assert git(repo, "rev-parse", f"subtask/{b}") != old and git(repo, "rev-parse", f"refs/subtask/{b}/head") != old
    assert git(repo, "rev-parse", f"refs/subtask/{b}/attempts/1") == old
    assert detail(cli, b)["attempts"][0]["head"] == old


def test_a_forced_landing_of_a_job_with_no_verify_command_still_runs_its_checks(cli, repo):
    """Nothing to run on the integrated commit (--force) is not nothing to check: the job's checks
    run on its own change all the same, so a deleted test fails it, --force or not."""
    (repo / "test_x.py").write_text("def test_one():\n    assert True\n")
    git(repo, "add", "test_x.py")
    git(repo, "commit", "-qm", "a test")
    job = finished(cli, "git rm -q test_x.py && git commit -qm 'drop the test'", "--check", "no-test-deletion")
    before = git(repo, "rev-parse", "main")
    forced = land(cli, "--force", job)
    assert forced.returncode == 1, forced.stdout + forced.stderr
    assert f"{job}: failed: check no-test-deletion failed" in forced.stdout, forced.stdout
    assert git(repo, "rev-parse", "main") == before and (repo / "test_x.py").exists()
    state = detail(cli, job)
    assert state["landed_in"] is None and state["landings"][-1]["outcome"] == "failed"
    assert f"refs/heads/subtask/{job}" in refs(repo)
    # A job whose checks pass lands forced as before, unverified.
    ok = finished(cli, ADD.format(name="a.txt", text="a"), "--check", "no-test-deletion")
    landed = land(cli, "--force", ok)
    assert landed.returncode == 0 and f"{ok}: landed" in landed.stdout, landed.stdout + landed.stderr
    assert detail(cli, ok)["landings"][-1]["outcome"] == "unverified"


def test_an_atomic_queue_whose_reconciliation_fails_records_the_conflict_once(cli, repo):
    """`--atomic --reconcile` answers a conflict as the pipeline does: judged and recorded once,
    its reply started; a reply that fails leaves that one conflict (with both sides as they were
    when it conflicted), not a second judgement of the moved branch."""
    (repo / "log.txt").write_text("start\n")
    git(repo, "add", "log.txt")
    git(repo, "commit", "-qm", "a log")
    a = finished(cli, APPEND.format(name="log.txt", text="A"), "--verify", "grep -q start log.txt")
    b = finished(cli, APPEND.format(name="log.txt", text="B"), "--verify",
                 "grep -q start log.txt && ! grep -q A log.txt")
    before = git(repo, "rev-parse", "main")
    proc = land(cli, "--atomic", "--reconcile", a, b, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "reconciliation (attempt 2) ended done, verify failed" in proc.stdout, proc.stdout
    assert f"{b} broke the queue (conflict): nothing landed (--atomic)" in proc.stdout, proc.stdout
    sides = [line for line in proc.stdout.splitlines() if line.startswith("  main: ")]
    assert len(sides) == 1 and sides[0].endswith(" append A to log.txt"), proc.stdout  # the side it conflicted with
    assert git(repo, "rev-parse", "main") == before
    landings = detail(cli, b)["landings"]
    assert [x["outcome"] for x in landings] == ["conflict"], landings
    assert detail(cli, a)["landings"][-1]["outcome"] == "passed" and detail(cli, a)["landed_in"] is None


# ---------------------------------------------------------------- what a one-line bug would break (issue 38)

def test_a_commit_made_on_a_target_nobody_has_checked_out_during_the_queue_is_kept(cli, repo, tmp_path):
    """With the target checked out nowhere, the move is one compare-and-swap of the ref: from the
    tip the landing was built on, never from the tip as it is now (that would drop a commit made
    in between: the landing was built without it)."""
    git(repo, "branch", "release")
    git(repo, "config", "subtask.landTarget", "release")
    a = finished(cli, ADD.format(name="a.txt", text="a"), "--verify", "test -f a.txt")
    gate = tmp_path / "gate"
    queue = subprocess.Popen(["git", "subtask", "land", a], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=dict(os.environ, SUBTASK_FAULT_HOLD=f"land_verified:{gate}"))
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists()), "the queue never reached the hold"
        old = git(repo, "rev-parse", "release")
        mine = git(repo, "commit-tree", f"{old}^{{tree}}", "-p", old, "-m", "a person's commit on release")
        git(repo, "update-ref", "refs/heads/release", mine, old)
        gate.touch()
        out, err = queue.communicate(timeout=120)
    finally:
        queue.kill()
    assert queue.returncode == 0, out + err
    assert "moved while it was built" in out, out
    assert is_ancestor(repo, mine, "release"), "the person's commit was lost"
    assert git(repo, "show", "release:a.txt") == "a"
    assert detail(cli, a)["landings"][-1]["onto"] == mine


def test_a_secret_in_lands_verify_command_is_recorded_redacted(cli, repo):
    token = "ghp_" + "Zx8Yw7Vu6Ts5Rq4Po3Nm2Lk1Jh0Gf9EdCbAz12"
    a = finished(cli, ADD.format(name="a.txt", text="a"))
    proc = land(cli, "--verify", f"test '{token}' = '{token}' && test -f a.txt", a)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # it ran as written
    verify = detail(cli, a)["landings"][-1]["verify"]
    assert verify["passed"] and verify["command"].count("[REDACTED]") == 2, verify
    record = git(repo, "log", "-p", f"refs/subtask/{a}/record")
    assert token not in record and token not in note_of(repo, a) and token not in proc.stdout


def teammates_job(tmp_path, script: str, verify: str, setup: str = ""):
    """A job the teammate (a) ran and pushed with its branch, pulled here (b): (b, cli_b, job)."""
    from conftest import make_team

    remote, ((a, cli_a), (b, cli_b)) = make_team(tmp_path)
    if setup:
        subprocess.run(setup, shell=True, cwd=a, check=True)
        git(a, "push", "-q", "origin", "main")
        git(b, "pull", "-q", "--ff-only")
    theirs = cli_a.start(script, "--verify", verify)
    cli_a("wait", theirs)
    cli_a.ok("push", "--branches")
    cli_b.ok("pull")
    git(b, "fetch", "-q", "origin", f"refs/heads/subtask/{theirs}:refs/heads/subtask/{theirs}")
    return b, cli_b, theirs


def test_a_failed_landing_of_a_teammates_job_is_never_written_on_its_record(tmp_path):
    b, cli_b, theirs = teammates_job(tmp_path, ADD.format(name="x.txt", text="x"), "test -f x.txt")
    record = git(b, "rev-parse", f"refs/subtask/{theirs}/record")
    main = git(b, "rev-parse", "main")
    proc = cli_b("land", "--verify", "false", theirs)
    assert proc.returncode == 1 and f"{theirs}: failed" in proc.stdout, proc.stdout + proc.stderr
    assert git(b, "rev-parse", f"refs/subtask/{theirs}/record") == record, "a teammate's record is theirs to write"
    assert git(b, "rev-parse", "main") == main


GREETING = ("echo hello > greeting.txt && git add greeting.txt && "
            "git -c user.name=t -c user.email=t@t commit -qm 'a greeting'")
# A teammate's verify that passes, and in a land scratch (not in its own worktree) leaves a
# tracked file rewritten where `checkout --force` does not look (skip-worktree).
TAMPER_AND_PASS = ('case "$PWD" in */.land/*) printf "HACKED\\n" > greeting.txt && '
                   'git update-index --skip-worktree greeting.txt;; esac; test -f x.txt')


def test_a_scratch_a_teammates_verify_command_passed_in_is_made_anew(tmp_path):
    """The command a teammate's unsigned record names ran in the scratch and passed: what it left
    there must not be in the next job's checkout (that job's tree does not carry the command)."""
    b, cli_b, theirs = teammates_job(tmp_path, ADD.format(name="x.txt", text="x"), TAMPER_AND_PASS, setup=GREETING)
    ours = [finished(cli_b, ADD.format(name=f"{n}.txt", text=n), "--verify", "grep -qx hello greeting.txt")
            for n in "cd"]
    proc = cli_b("land", theirs, *ours, timeout=120)
    assert f"{theirs}: landed" in proc.stdout, proc.stdout + proc.stderr
    assert all(f"{job}: landed" in proc.stdout for job in ours), proc.stdout + proc.stderr
    assert proc.returncode == 0


def test_a_build_that_stopped_half_way_leaves_no_scratch_the_next_job_is_built_in(cli, repo):
    """A rebase that conflicts stops half-way in the scratch (git's rebase state in its admin
    folder): the next job is built in a fresh scratch, not on top of that state."""
    (repo / "log.txt").write_text("start\n")
    git(repo, "add", "log.txt")
    git(repo, "commit", "-qm", "a log")
    a = finished(cli, APPEND.format(name="log.txt", text="A"), "--verify", "grep -q start log.txt")
    b = finished(cli, ADD.format(name="b.txt", text="b"), "--verify", "test -f b.txt")
    (repo / "log.txt").write_text("start\nmain\n")
    git(repo, "commit", "-qam", "main appends too")
    proc = land(cli, "--rebase", a, b)
    assert f"{a}: conflict" in proc.stdout, proc.stdout + proc.stderr
    assert f"{b}: landed" in proc.stdout, proc.stdout + proc.stderr
    assert (repo / "b.txt").exists() and clean(repo)


def test_reconcile_never_resets_over_uncommitted_work_in_the_jobs_worktree(cli, repo):
    _, b = conflicting_pair(cli, repo)
    work = repo / ".subtask" / "worktrees" / b
    (work / "log.txt").write_text("start\nB\nsomeone's unsaved edit\n")
    head = git(repo, "rev-parse", f"subtask/{b}")
    proc = land(cli, "--reconcile", b, timeout=120)
    assert proc.returncode == 1 and "not reconciled" in proc.stdout and "uncommitted changes" in proc.stdout, \
        proc.stdout + proc.stderr
    assert (work / "log.txt").read_text() == "start\nB\nsomeone's unsaved edit\n"
    assert git(repo, "rev-parse", f"subtask/{b}") == head and len(detail(cli, b)["attempts"]) == 1


BINARY = "printf '{text}\\000' > x.bin && git add x.bin && git commit -qm 'binary {text}'"


def test_dry_run_says_two_jobs_that_change_one_binary_file_meet(cli, repo):
    """A binary (or mode-only) change has no hunks to compare: it meets any other change of the
    same file, and the dry run says so beside the conflict it predicts."""
    (repo / "x.bin").write_bytes(b"start\0")
    git(repo, "add", "x.bin")
    git(repo, "commit", "-qm", "a binary file")
    a = finished(cli, BINARY.format(text="a"), "--verify", "test -f x.bin")
    b = finished(cli, BINARY.format(text="b"), "--verify", "test -f x.bin")
    proc = land(cli, "--dry-run", a, b)
    assert f"{a}: 1 file" in proc.stdout and f"{a} and {b} both change x.bin (same lines)" in proc.stdout, proc.stdout
    assert "would conflict in x.bin" in proc.stdout
    data = json.loads(land(cli, "--dry-run", "--json", a, b).stdout)
    assert data["pairs"] == [{"v": 1, "a": a, "b": b, "files": ["x.bin"], "same_lines": ["x.bin"]}]
