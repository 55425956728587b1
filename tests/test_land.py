"""Landing: merge, the merge gate, cleanup --merged (ff, --no-ff, squash, rebase), gc, notes, worktree setup."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import git, is_ancestor, make_team, refs, wait_until

COMMIT = "echo {text} > {name} && git add {name} && git commit -qm 'add {name}'"


def done_job(cli, name="f.txt", text="x", *args) -> str:
    job = cli.start(COMMIT.format(name=name, text=text), *args)
    cli("wait", job)  # exit 1 when verify failed; the job has ended either way
    return job


def state(cli, job) -> dict:
    return cli.json("show", job)["state_detail"]


def worktree(repo: Path, job: str) -> Path:
    return repo / ".subtask" / "worktrees" / job


def assert_landed(cli, repo, job, *, branch_gone=True):
    detail = state(cli, job)
    assert detail["landed_in"], detail
    assert not worktree(repo, job).exists()
    assert (f"refs/heads/subtask/{job}" not in refs(repo)) == branch_gone
    assert f"refs/subtask/{job}/head" in refs(repo), "the pins keep the evidence commits"
    assert f"refs/subtask/{job}/record" in refs(repo), "records stay: they are the history"


# ---------------------------------------------------------------- merge

def test_merge_lands_and_review_commands_work_after_the_branch_is_gone(cli, repo):
    job = done_job(cli, "f.txt", "x", "--verify", "test -f f.txt")
    head = git(repo, "rev-parse", f"subtask/{job}")
    out = cli.ok("merge", job)
    assert f"{job}: merged into main" in out and "deleted branch" in out
    assert git(repo, "rev-parse", "HEAD") == head  # a fast-forward
    assert_landed(cli, repo, job)
    assert state(cli, job)["landed_in"] == head
    # the review commands read the pins once the branch is deleted
    assert "add f.txt" in cli.ok("log", job)
    assert "f.txt | 1 +" in cli.ok("diff", job, "--stat")
    assert "+x" in cli.ok("diff", job)
    shown = cli.ok("show", job)
    assert f"landed:    in {head[:7]}" in shown and "(deleted after landing)" in shown
    note = git(repo, "notes", "--ref=subtask", "show", head)
    assert f"subtask {job} · done · verify passed" in note and f"landed:  in {head[:7]}" in note
    assert cli("merge", job).returncode == 1  # already landed


@pytest.mark.parametrize("mode", ["--no-ff", "--squash"])
def test_merge_modes_after_main_moved(cli, repo, mode):
    job = done_job(cli)
    (repo / "other.txt").write_text("other\n")
    git(repo, "add", "other.txt")
    git(repo, "commit", "-qm", "main moves on")
    out = cli.ok("merge", mode, job)
    assert f"({mode[2:]})" in out
    parents = git(repo, "log", "-1", "--format=%P").split()
    assert len(parents) == (2 if mode == "--no-ff" else 1)
    assert f"Subtask-Id: {job}" in git(repo, "log", "-1", "--format=%B")
    assert (repo / "f.txt").read_text() == "x\n"
    assert_landed(cli, repo, job)
    assert state(cli, job)["landed_in"] == git(repo, "rev-parse", "HEAD")


def test_ff_only_refuses_when_main_moved(cli, repo):
    job = done_job(cli)
    git(repo, "commit", "-q", "--allow-empty", "-m", "main moves on")
    proc = cli("merge", "--ff-only", job)
    assert proc.returncode == 1 and "did not happen" in proc.stderr, proc.stderr
    assert f"refs/heads/subtask/{job}" in refs(repo)


def test_merge_refuses_a_job_that_has_not_finished(cli, repo):
    job = cli.start("sleep 600")  # stopped right after the merge it must outlast
    proc = cli("merge", job)
    cli.ok("stop", job)
    assert proc.returncode == 1 and "has not finished" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    stopped = cli("merge", job)
    assert stopped.returncode == 1 and "ended stopped, not done" in stopped.stderr


def test_merge_refuses_failed_verify_unless_forced(cli, repo):
    job = done_job(cli, "f.txt", "x", "--verify", "false")
    proc = cli("merge", job)
    assert proc.returncode == 1 and "verify failed" in proc.stderr, proc.stderr
    assert "--force" in proc.stderr
    assert git(repo, "rev-parse", "HEAD") == git(repo, "rev-parse", f"refs/subtask/{job}/base")
    cli.ok("merge", "--force", job)
    assert (repo / "f.txt").exists()


def test_merge_refuses_a_branch_that_moved_after_verify(cli, repo):
    job = done_job(cli, "f.txt", "x", "--verify", "true")
    wt = worktree(repo, job)
    (wt / "g.txt").write_text("untested\n")
    git(wt, "add", "g.txt")
    git(wt, "commit", "-qm", "an untested change")
    proc = cli("merge", job)
    assert proc.returncode == 1 and "moved" in proc.stderr and "after verify tested" in proc.stderr, proc.stderr
    assert not (repo / "f.txt").exists()


def test_merge_refuses_a_dirty_main_worktree_and_never_stashes(cli, repo):
    job = done_job(cli)
    (repo / "README.md").write_text("my unsaved work\n")
    proc = cli("merge", job)  # git's word for a refusal that changes nothing: fatal, 128 (issue 38)
    assert proc.returncode == 128 and "uncommitted changes" in proc.stderr and "README.md" in proc.stderr
    assert (repo / "README.md").read_text() == "my unsaved work\n"
    assert git(repo, "stash", "list") == ""
    assert f"refs/heads/subtask/{job}" in refs(repo)


@pytest.mark.parametrize("mode", [None, "--squash"])
def test_conflict_aborts_cleanly_and_lists_files(cli, repo, mode):
    job = done_job(cli, "README.md", "theirs")
    (repo / "README.md").write_text("ours\n")
    git(repo, "commit", "-qam", "conflicting change on main")
    before = git(repo, "rev-parse", "HEAD")
    proc = cli("merge", *([mode] if mode else []), job)
    assert proc.returncode == 1, proc.stderr
    assert "conflicts in: README.md" in proc.stderr and "aborted" in proc.stderr
    assert git(repo, "rev-parse", "HEAD") == before
    assert git(repo, "status", "--porcelain") == ""
    assert not (repo / ".git" / "MERGE_HEAD").exists()
    assert (repo / "README.md").read_text() == "ours\n"
    assert state(cli, job)["landed_in"] is None


# ---------------------------------------------------------------- landed by plain git

def _rebase_merge(repo, branch):
    base = git(repo, "merge-base", "HEAD", branch)
    git(repo, "cherry-pick", f"{base}..{branch}")


@pytest.mark.parametrize("how", ["ff", "no-ff", "squash", "rebase"])
def test_plain_git_merges_count_as_landed(cli, repo, how):
    job = cli.start(COMMIT.format(name="a.txt", text="a") + " && " + COMMIT.format(name="b.txt", text="b"))
    cli.ok("wait", job)
    branch = f"subtask/{job}"
    if how != "ff":
        git(repo, "commit", "-q", "--allow-empty", "-m", "main moves on")
    if how == "ff":
        git(repo, "merge", "-q", "--ff-only", branch)
    elif how == "no-ff":
        git(repo, "merge", "-q", "--no-ff", "-m", "merge it", branch)
    elif how == "squash":
        git(repo, "merge", "-q", "--squash", branch)
        git(repo, "commit", "-qm", "squashed")
    else:
        _rebase_merge(repo, branch)
    dry = cli.ok("cleanup", "--merged", "--dry-run")
    assert f"{job}: landed in" in dry and "would remove worktree" in dry and "would delete branch" in dry
    assert worktree(repo, job).exists() and state(cli, job)["landed_in"] is None
    out = cli.ok("cleanup", "--merged")
    assert f"deleted branch {branch}" in out, out
    assert_landed(cli, repo, job)
    expected = {"ff": git(repo, "rev-parse", "HEAD"), "no-ff": git(repo, "rev-parse", "HEAD"),
                "squash": git(repo, "rev-parse", "HEAD"), "rebase": git(repo, "rev-parse", "HEAD")}[how]
    assert state(cli, job)["landed_in"] == expected
    assert cli.ok("cleanup", "--merged") == ""  # idempotent


def test_unmerged_branch_and_partial_rebase_are_kept(cli, repo):
    job = cli.start(COMMIT.format(name="a.txt", text="a") + " && " + COMMIT.format(name="b.txt", text="b"))
    cli.ok("wait", job)
    git(repo, "cherry-pick", f"subtask/{job}~1")  # only the first of two commits upstream
    assert cli.ok("cleanup", "--merged") == ""
    assert f"refs/heads/subtask/{job}" in refs(repo) and worktree(repo, job).exists()
    assert state(cli, job)["landed_in"] is None


def test_dirty_worktree_of_a_landed_job_is_kept(cli, repo):
    job = done_job(cli)
    (worktree(repo, job) / "notes.txt").write_text("a user's scratch file\n")
    git(repo, "merge", "-q", f"subtask/{job}")
    out = cli.ok("cleanup", "--merged")
    assert "kept worktree" in out and "untracked" in out
    assert (worktree(repo, job) / "notes.txt").exists()
    assert f"refs/heads/subtask/{job}" in refs(repo), "git cannot delete a checked-out branch; neither do we"
    assert state(cli, job)["landed_in"]


def test_lazy_sweep_in_list_is_throttled(cli, repo):
    job = done_job(cli)
    git(repo, "config", "subtask.sweepInterval", "0")
    git(repo, "merge", "-q", f"subtask/{job}")  # no hook installed: a plain merge
    assert job not in cli.ok("list"), "a landed job is hidden from list"
    assert state(cli, job)["landed_in"] and not worktree(repo, job).exists()
    git(repo, "config", "subtask.sweepInterval", "3600")
    job2 = done_job(cli, "g.txt")
    git(repo, "merge", "-q", f"subtask/{job2}")
    cli.ok("list")  # swept just now: within the interval nothing runs
    cli.ok("list")
    assert state(cli, job2)["landed_in"] is None
    assert cli.ok("cleanup", "--merged").startswith(f"{job2}: landed")


def test_land_target_config(cli, repo):
    job = done_job(cli)
    git(repo, "branch", "release", f"subtask/{job}")
    git(repo, "config", "subtask.landTarget", "release")
    assert f"{job}: landed in" in cli.ok("cleanup", "--merged")


# ---------------------------------------------------------------- gc

def test_gc_removes_only_clean_old_worktrees_and_keeps_branches(cli, repo):
    clean = done_job(cli, "a.txt")
    dirty = done_job(cli, "b.txt")
    (worktree(repo, dirty) / "b.txt").write_text("edited by hand\n")
    running = cli.start("sleep 600")  # must still run after several commands on a loaded machine; stopped below
    try:
        assert "would remove" in cli.ok("gc", "--dry-run", "--older-than", "0s")
        assert worktree(repo, clean).exists()
        out = cli.ok("gc", "--older-than", "0s")
        assert f"{clean}: removed worktree" in out and f"{dirty}: kept worktree" in out, out
        assert not worktree(repo, clean).exists() and worktree(repo, dirty).exists()
        assert f"refs/heads/subtask/{clean}" in refs(repo), "gc never deletes an unmerged branch"
        assert state(cli, clean)["worktree_removed"]
        assert cli.json("show", running)["state"] == "running"
        assert worktree(repo, running).exists(), "gc never removes the worktree of a running job"
        assert cli.ok("gc").count("removed") == 0  # default 30d: nothing that young
    finally:
        cli.ok("stop", running)
    assert cli("gc", "--older-than", "soon").returncode == 129


# ---------------------------------------------------------------- notes and init

def test_init_sets_merge_strategy_and_display_but_never_rewrite_ref(cli, repo):
    cli.ok("init")
    assert git(repo, "config", "notes.subtask.mergeStrategy") == "union"
    assert git(repo, "config", "--get-all", "notes.displayRef", check=False) == ""
    cli.ok("init", "--display")
    cli.ok("init", "--display")
    assert git(repo, "config", "--get-all", "notes.displayRef") == "refs/notes/subtask"
    assert git(repo, "config", "--get-all", "notes.rewriteRef", check=False) == ""
    job = done_job(cli)
    assert f"subtask {job}" in git(repo, "log", "-1", f"subtask/{job}")  # plain git log shows it
    assert git(repo, "config", "--get-all", "notes.rewriteRef", check=False) == ""


def test_first_start_sets_merge_strategy_and_keeps_a_users_choice(cli, repo, tmp_path):
    done_job(cli)
    assert git(repo, "config", "notes.subtask.mergeStrategy") == "union"
    git(repo, "config", "notes.subtask.mergeStrategy", "ours")
    done_job(cli, "g.txt")
    assert git(repo, "config", "notes.subtask.mergeStrategy") == "ours"


def test_notes_rebuild_regenerates_every_block_and_is_idempotent(cli, repo):
    jobs = [done_job(cli, f"{n}.txt") for n in "ab"]
    noop = cli.start("true")
    cli.ok("wait", noop)
    before = {j: git(repo, "notes", "--ref=subtask", "show", f"refs/subtask/{j}/head") for j in jobs}
    base_note = git(repo, "notes", "--ref=subtask", "show", "HEAD")
    assert f"subtask {noop}" in base_note  # no commit: the block stands on its base
    git(repo, "update-ref", "-d", "refs/notes/subtask")
    assert cli.ok("notes", "rebuild").startswith("3 block")
    assert {j: git(repo, "notes", "--ref=subtask", "show", f"refs/subtask/{j}/head") for j in jobs} == before
    assert git(repo, "notes", "--ref=subtask", "show", "HEAD") == base_note
    tip = git(repo, "rev-parse", "refs/notes/subtask")
    assert cli.ok("notes", "rebuild").startswith("0 block")
    assert git(repo, "rev-parse", "refs/notes/subtask") == tip


# ---------------------------------------------------------------- a worktree that can run

def test_worktreeinclude_copies_ignored_files_only(cli, repo):
    (repo / ".gitignore").write_text(".env\ncache/\n")
    (repo / ".worktreeinclude").write_text(".env\ncache/\nscratch.txt\n")
    git(repo, "add", ".gitignore", ".worktreeinclude")
    git(repo, "commit", "-qm", "ignore")
    (repo / ".env").write_text("TOKEN=local\n")
    (repo / "cache").mkdir()
    (repo / "cache" / "data.bin").write_bytes(b"\x00\x01")
    (repo / "scratch.txt").write_text("untracked, not ignored\n")
    job = cli.start("cat .env > seen.txt && test -f cache/data.bin", "--verify", "test -f seen.txt")
    cli.ok("wait", job)
    wt = worktree(repo, job)
    assert (wt / "seen.txt").read_text() == "TOKEN=local\n"
    assert not (wt / "scratch.txt").exists(), "an untracked, unignored file would be committed by the autocommit"
    files = [f["path"] for f in cli.json("show", job)["evidence"]["files"]]
    assert files == ["seen.txt"], "copied ignored files never reach the branch"


def test_setup_command_runs_before_the_engine_and_its_failure_fails_the_job(cli, repo):
    git(repo, "config", "subtask.setup", "echo ready > .setup-done && echo ready > /dev/null")
    job = cli.start("test -f .setup-done && rm .setup-done && " + COMMIT.format(name="ok.txt", text="ok"))
    cli.ok("wait", job)
    git(repo, "config", "subtask.setup", "echo 'installing with sk-ant-api03-" + "A" * 40 + "'; exit 3")
    bad = cli.start("touch never.txt")
    assert cli("wait", bad).returncode == 1
    attempt = state(cli, bad)["attempts"][0]
    assert attempt["state"] == "failed" and attempt["error_kind"] == "setup"
    assert "exited 3" in attempt["reason"] and "installing" in attempt["reason"]
    assert "A" * 40 not in attempt["reason"], "setup output is redacted"
    assert not (worktree(repo, bad) / "never.txt").exists()


def test_cleanup_keeps_a_worktree_whose_detached_head_holds_commits_no_branch_keeps(cli, repo):
    job = done_job(cli)
    wt = worktree(repo, job)
    git(wt, "checkout", "-q", "--detach")
    git(wt, "commit", "-q", "--allow-empty", "-m", "only here")
    proc = cli("cleanup", job)
    assert proc.returncode == 1 and "no branch keeps" in proc.stderr, proc.stderr
    assert wt.exists()
    git(repo, "merge", "-q", f"subtask/{job}")
    assert "kept worktree" in cli.ok("cleanup", "--merged") and wt.exists()


# ---------------------------------------------------------------- races and hostile records (issues 11, 12)

def _start_all(repo: Path, tasks: list[str], at_once: int = 6) -> list[str]:
    """Start many jobs, a few CLI starts at a time (each start is ~0.3 s of CPU)."""
    ids = []
    for i in range(0, len(tasks), at_once):
        procs = [subprocess.Popen(["git", "subtask", "start", task], cwd=repo, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for task in tasks[i:i + at_once]]
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            ids.append(out.split()[0])
    return ids


def _landed(repo: Path, job: str) -> bool:
    """Read from the record with git alone (a `show --json` costs ~0.3 s of interpreter start-up)."""
    return bool(json.loads(git(repo, "show", f"refs/subtask/{job}/record:state.json")).get("landed_in"))


@pytest.mark.early
@pytest.mark.stress
def test_two_merges_at_once_into_one_worktree_are_serialized(cli, repo):
    """Issue 11.1: `merge --squash A & merge --no-ff B` broke the main worktree in 2 of 15 trials.

    12 trials (4-5 of 20 broke before the fix, so 12 fail at least once in ~95% of runs); the
    20-trial count in the issue was measured with a script, see the CHANGELOG.
    """
    git(repo, "config", "subtask.maxRunning", "8")
    trials = 12
    tasks = [COMMIT.format(name=f"f{side}{n}", text=side) for n in range(trials) for side in "ab"]
    ids = _start_all(repo, tasks)
    cli("wait", *ids, timeout=120)
    broken = []
    for n in range(trials):
        a, b = ids[2 * n], ids[2 * n + 1]
        procs = [subprocess.Popen(["git", "subtask", "merge", mode, job], cwd=repo, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for mode, job in (("--squash", a), ("--no-ff", b))]
        results = [(p.wait(timeout=60), p.stderr.read()) for p in procs]
        status = git(repo, "status", "--porcelain")
        problems = [f"status {status!r}"] if status else []
        for (rc, err), job, name in zip(results, (a, b), (f"fa{n}", f"fb{n}"), strict=True):
            in_head = git(repo, "ls-tree", "--name-only", "HEAD", name) == name
            if "Traceback" in err or "identity" in err:
                problems.append(f"{job}: {err.strip()}")
            if rc == 0 and not (in_head and _landed(repo, job)):
                problems.append(f"{job}: merge said ok but {name} in HEAD={in_head}")
            if rc != 0 and (in_head or (repo / name).exists()):
                problems.append(f"{job}: refused but {name} is there: {err.strip()}")
        if problems:
            broken.append((n, problems))
            git(repo, "reset", "-q", "--hard")  # the next trial starts clean
            git(repo, "clean", "-fq")
    assert not broken, f"{len(broken)} of {trials} trials broke the worktree: {broken}"


def test_a_squash_whose_commit_fails_leaves_the_worktree_as_it_was(cli, repo, monkeypatch):
    job = done_job(cli)
    before = git(repo, "rev-parse", "HEAD")
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.delenv(var)
    git(repo, "config", "user.useConfigOnly", "true")
    proc = cli("merge", "--squash", job)
    assert proc.returncode == 128 and "identity" in proc.stderr, proc.stderr
    assert git(repo, "rev-parse", "HEAD") == before
    assert git(repo, "status", "--porcelain") == "" and not (repo / "f.txt").exists()
    assert not _landed(repo, job) and f"refs/heads/subtask/{job}" in refs(repo)


def _hold_env(gate: Path, point: str = "before_worktree_removal") -> dict:
    return dict(os.environ, SUBTASK_FAULT_HOLD=f"{point}:{gate}")


def _sweep_while_a_reply_starts(cli, repo, tmp_path, job: str, argv: list[str]):
    """Hold `git subtask ARGV` at its removal point, start a reply of `job` (held until `go`
    exists), then let the command go on. Returns (out, err, go); the caller touches `go`."""
    gate, go = tmp_path / "gate", tmp_path / "go"
    sweeper = subprocess.Popen(["git", "subtask", *argv], cwd=repo, env=_hold_env(gate),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=30), sweeper.communicate()
        cli.ok("reply", job, f"until [ -e {go} ]; do sleep 0.05; done; " + COMMIT.format(name="g.txt", text="g"))
        assert wait_until(lambda: state(cli, job)["attempts"][-1].get("engine_started_at"), timeout=30)
        gate.touch()
        out, err = sweeper.communicate(timeout=60)
        assert "Traceback" not in err, err
        return out, err, go
    except BaseException:
        go.touch()
        raise
    finally:
        gate.touch()
        if sweeper.poll() is None:
            sweeper.kill()
        sweeper.wait(timeout=60)


@pytest.mark.parametrize("command", ["gc", "cleanup --merged", "cleanup"])
def test_no_cleanup_removes_the_worktree_of_a_reply_that_started_meanwhile(cli, repo, tmp_path, command):
    """Issue 11.2: gc listed a finished job, a reply started it again, gc removed its worktree."""
    job = done_job(cli)
    if command == "cleanup --merged":
        git(repo, "merge", "-q", f"subtask/{job}")
    argv = {"gc": ["gc", "--older-than", "0s"], "cleanup --merged": ["cleanup", "--merged"],
            "cleanup": ["cleanup", job]}[command]
    out, err, go = _sweep_while_a_reply_starts(cli, repo, tmp_path, job, argv)
    try:
        assert worktree(repo, job).exists(), f"{command} removed the worktree of a running job: {out}{err}"
        assert f"refs/heads/subtask/{job}" in refs(repo)
    finally:
        go.touch()
    cli.ok("wait", job)
    assert "add g.txt" in git(repo, "log", "--format=%s", f"subtask/{job}"), "the reply's commit was made"


@pytest.mark.parametrize("command", ["gc", "cleanup --merged"])
def test_a_reply_cannot_start_while_a_cleanup_holds_the_job(cli, repo, tmp_path, command):
    """The run-lock, not only the re-read record: a reply arriving after the re-check must wait."""
    job = done_job(cli)
    if command == "cleanup --merged":
        git(repo, "merge", "-q", f"subtask/{job}")
    argv = {"gc": ["gc", "--older-than", "0s"], "cleanup --merged": ["cleanup", "--merged"]}[command]
    gate, go = tmp_path / "gate", tmp_path / "go"
    sweeper = subprocess.Popen(["git", "subtask", *argv], cwd=repo, env=_hold_env(gate, "after_removal_recheck"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=30), sweeper.communicate()
        replied = cli("reply", job, f"until [ -e {go} ]; do sleep 0.05; done; " + COMMIT.format(name="g.txt", text="g"))
        if replied.returncode == 0:  # accepted: then its worker must keep its worktree
            assert wait_until(lambda: state(cli, job)["attempts"][-1].get("engine_started_at"), timeout=30)
        else:
            assert "busy" in replied.stderr, replied.stderr
        gate.touch()
        out, err = sweeper.communicate(timeout=60)
        assert "Traceback" not in err, err
        if replied.returncode == 0:
            assert worktree(repo, job).exists(), f"{command} removed the worktree of a running reply: {out}{err}"
    finally:
        gate.touch()
        go.touch()
        sweeper.wait(timeout=60)
    cli("wait", job)


def test_cleanup_merged_leaves_a_job_whose_reply_is_queued(cli, repo, tmp_path):
    """A queued reply has no run-lock holder: only the re-read record shows the job is busy."""
    job = done_job(cli)
    git(repo, "merge", "-q", f"subtask/{job}")
    git(repo, "config", "subtask.maxRunning", "1")
    gate, go = tmp_path / "gate", tmp_path / "go"
    blocker = cli.start(f"until [ -e {go} ]; do sleep 0.05; done")
    sweeper = subprocess.Popen(["git", "subtask", "cleanup", "--merged"], cwd=repo, env=_hold_env(gate),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=30), sweeper.communicate()
        assert "queued" in cli.ok("reply", job, COMMIT.format(name="g.txt", text="g"))
        gate.touch()
        out, err = sweeper.communicate(timeout=60)
        assert not _landed(repo, job) and f"refs/heads/subtask/{job}" in refs(repo), out + err
    finally:
        gate.touch()
        go.touch()
        sweeper.wait(timeout=60)
    cli.ok("wait", job, blocker)
    assert "add g.txt" in git(repo, "log", "--format=%s", f"subtask/{job}")


@pytest.mark.stress
def test_two_gcs_at_once_never_abort(cli, repo):
    """Issue 11.3: one of two concurrent gc aborted with "cannot change to …/worktrees/st-…"."""
    git(repo, "config", "subtask.maxRunning", "8")
    for trial in range(3):  # 3 of 10 such trials failed before the fix
        jobs = _start_all(repo, [COMMIT.format(name=f"g{trial}-{n}", text=n) for n in range(8)])
        cli("wait", *jobs, timeout=120)
        procs = [subprocess.Popen(["git", "subtask", "gc", "--older-than", "0s"], cwd=repo, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        results = [(p.wait(timeout=60), p.stdout.read(), p.stderr.read()) for p in procs]
        for rc, out, err in results:  # the other gc may have taken every job first: nothing left here
            assert rc == 0 and err.strip() in ("", "nothing to collect"), (trial, rc, out, err)
        # A job one gc holds while the other looks is left to a later pass, never half-removed:
        # the next gc finds it quiet and removes it.
        cli.ok("gc", "--older-than", "0s")
        assert not any(worktree(repo, j).exists() for j in jobs)


def test_merge_refuses_a_detached_head_and_names_the_fix(cli, repo):
    """Issue 11.11: a merge into a detached HEAD merged, then deleted the job's branch."""
    job = done_job(cli)
    git(repo, "checkout", "-q", "--detach")
    before = git(repo, "rev-parse", "HEAD")
    proc = cli("merge", job)  # fatal, as git says it (issue 38)
    assert proc.returncode == 128 and "detached" in proc.stderr and "git switch" in proc.stderr, proc.stderr
    assert git(repo, "rev-parse", "HEAD") == before and not (repo / "f.txt").exists()
    assert f"refs/heads/subtask/{job}" in refs(repo) and not _landed(repo, job)
    git(repo, "config", "subtask.landTarget", "main")
    proc = cli("merge", job)
    assert proc.returncode == 128 and "git switch main" in proc.stderr, proc.stderr
    git(repo, "switch", "-q", "main")
    cli.ok("merge", job)
    assert _landed(repo, job)


def test_a_detached_head_on_a_jobs_commit_does_not_land_it(cli, repo):
    job = done_job(cli)
    git(repo, "checkout", "-q", "--detach", f"subtask/{job}")  # a look at the job's work
    assert cli.ok("cleanup", "--merged") == ""
    assert f"refs/heads/subtask/{job}" in refs(repo) and not _landed(repo, job)


# ---------------------------------------------------------------- a teammate's records

@pytest.fixture
def team(tmp_path):
    """A bare remote and two clones (a: the teammate, b: ours), shell engine."""
    return make_team(tmp_path)[1]


def _forge(path: Path, job_id: str, **spec) -> None:
    """What a hostile teammate can do: append a record commit with any spec (a fast-forward)."""
    from subtask.git import gitrepo, records

    repo = gitrepo.open_repo(path)
    records.update(repo, job_id, lambda j: [setattr(j.spec, k, v) for k, v in spec.items()] and None)


def _record_tip(path: Path, job_id: str) -> str:
    return git(path, "rev-parse", f"refs/subtask/{job_id}/record")


def test_cleanup_merged_never_lands_a_teammates_pulled_record(team):
    (a, cli_a), (b, cli_b) = team
    theirs = done_job(cli_a)
    cli_a.ok("push", "--branches")
    cli_b.ok("pull")
    git(b, "fetch", "-q", "origin", "refs/heads/subtask/*:refs/heads/subtask/*")
    git(b, "merge", "-q", "--ff-only", f"subtask/{theirs}")  # their work is in our main now
    tip = _record_tip(b, theirs)
    assert cli_b.ok("cleanup", "--merged") == ""
    assert _record_tip(b, theirs) == tip, "a teammate's record is theirs to update"
    assert f"refs/heads/subtask/{theirs}" in refs(b)


def test_a_forged_pulled_record_never_removes_a_local_checkout(team, tmp_path):
    """Issue 12: a record naming another checkout of ours as its worktree made gc remove it."""
    (a, cli_a), (b, cli_b) = team
    victim = tmp_path / "b-feature"
    git(b, "worktree", "add", "-q", str(victim))
    (b / ".git" / "info" / "exclude").write_text(".env\n")
    (victim / ".env").write_text("SECRET=mine\n")
    ours = done_job(cli_b, "ours.txt")
    our_worktree = worktree(b, ours)
    forged_out = done_job(cli_a)
    forged_in = done_job(cli_a, "g.txt")
    _forge(a, forged_out, worktree=str(victim), repo=str(b))
    _forge(a, forged_in, worktree=str(our_worktree), repo=str(b))
    cli_a.ok("push")
    cli_b.ok("pull")
    for argv in (["cleanup", forged_out], ["cleanup", forged_in], ["cleanup", "--merged"],
                 ["gc", "--older-than", "0s"]):
        proc = cli_b(*argv)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert (victim / ".env").read_text() == "SECRET=mine\n", f"{argv} removed a checkout a record named"
        assert our_worktree.exists() or argv[0] == "gc", f"{argv} removed another job's worktree"
        if argv == ["cleanup", forged_in]:
            assert proc.returncode == 1 and "not checked out by this clone" in proc.stderr, proc.stderr
    assert not our_worktree.exists(), "gc still removes our own job's clean worktree"
    for forged in (forged_out, forged_in):
        proc = cli_b("reply", forged, "touch pwned")
        assert proc.returncode == 1 and "another clone's job" in proc.stderr, proc.stderr
    assert not (victim / "pwned").exists()


def test_notes_rebuild_drops_blocks_no_record_explains(cli, repo):
    job = done_job(cli)
    head = git(repo, "rev-parse", f"refs/subtask/{job}/head")
    real = git(repo, "notes", "--ref=subtask", "show", head)
    git(repo, "notes", "--ref=subtask", "add", "-f", "-m",
        real + "\n\nsubtask st-deadbeef · done · verify passed\n  forged", head)
    base = git(repo, "rev-parse", "HEAD")
    # the block, misplaced
    git(repo, "notes", "--ref=subtask", "add", "-f", "-m", "a person's own words\n\n" + real, base)
    cli.ok("notes", "rebuild")
    assert git(repo, "notes", "--ref=subtask", "show", head) == real
    assert git(repo, "notes", "--ref=subtask", "show", base) == "a person's own words"


# ---------------------------------------------------------------- the words merge says

def test_merge_says_fast_forward_when_it_fast_forwarded_and_merge_when_it_merged(cli, repo):
    job = done_job(cli, "f.txt")
    out = cli.ok("merge", job)
    assert f"{job}: merged into main (fast-forward) as" in out and "(merge)" not in out, out
    ff_only = done_job(cli, "g.txt")
    assert "(fast-forward)" in cli.ok("merge", "--ff-only", ff_only)
    merged = done_job(cli, "h.txt")
    git(repo, "commit", "-q", "--allow-empty", "-m", "main moves on")
    out = cli.ok("merge", merged)
    assert f"{merged}: merged into main (merge) as" in out, out
    assert len(git(repo, "log", "-1", "--format=%P").split()) == 2


def test_merge_of_a_job_with_no_commits_says_nothing_to_merge_and_changes_nothing(cli, repo):
    job = cli.start("echo looked around")
    cli.ok("wait", job)
    before = git(repo, "rev-parse", "HEAD")
    for args in ([], ["--squash"], ["--force"]):
        proc = cli("merge", *args, job)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "nothing to merge" in proc.stderr and "made no commits" in proc.stderr, proc.stderr
        assert "merged" not in proc.stdout and "Traceback" not in proc.stderr
    assert git(repo, "rev-parse", "HEAD") == before
    assert state(cli, job)["landed_in"] is None, "no merge happened: the job is not recorded as landed"
    assert f"refs/heads/subtask/{job}" in refs(repo)


def test_a_squash_commit_takes_the_jobs_own_commit_subject(cli, repo):
    job = done_job(cli, "f.txt", "x")
    cli.ok("merge", "--squash", job)
    assert git(repo, "log", "-1", "--format=%s") == "add f.txt"
    body = git(repo, "log", "-1", "--format=%B")
    assert f"Subtask-Id: {job}" in body and f"Squashed from subtask {job}" in body


def test_a_squash_of_several_commits_lists_their_subjects(cli, repo):
    job = cli.start(COMMIT.format(name="a.txt", text="a") + " && " + COMMIT.format(name="b.txt", text="b")
                    + " && echo 'Added a and b'")
    cli.ok("wait", job)
    cli.ok("merge", "--squash", job)
    assert git(repo, "log", "-1", "--format=%s") == "Added a and b"
    body = git(repo, "log", "-1", "--format=%b")
    assert "- add a.txt\n- add b.txt" in body, body
    assert f"Subtask-Id: {job}" in body


# ---------------------------------------------------------------- branches with no commits

def test_cleanup_and_gc_remove_branches_with_no_commits_beyond_their_base(cli, repo, tmp_path):
    failed = cli.start("echo nothing done && false")
    cli("wait", failed)
    hold = tmp_path / "hold"
    stopped = cli.start(f"while [ ! -e {hold} ]; do sleep 0.05; done")
    cli.ok("stop", stopped)
    kept = done_job(cli, "k.txt")  # commits beyond its base: never removed
    running = cli.start(f"while [ ! -e {hold} ]; do sleep 0.05; done")  # at its base, but a worker holds it
    try:
        out = cli.ok("cleanup", failed)
        assert f"{failed}: removed worktree" in out and f"deleted branch subtask/{failed}" in out, out
        assert f"refs/heads/subtask/{failed}" not in refs(repo)
        assert "would delete branch" in cli.ok("gc", "--dry-run", "--older-than", "0s")
        assert f"refs/heads/subtask/{stopped}" in refs(repo)
        out = cli.ok("gc", "--older-than", "0s")
        assert f"{stopped}: deleted branch subtask/{stopped} (no commits beyond its base)" in out, out
        have = refs(repo)
        assert f"refs/heads/subtask/{stopped}" not in have
        assert f"refs/heads/subtask/{kept}" in have, "a branch with commits is never removed"
        assert f"refs/heads/subtask/{running}" in have, "never while a worker holds the job"
        for job in (failed, stopped):
            assert f"refs/subtask/{job}/record" in have and f"refs/subtask/{job}/base" in have, "record and pins stay"
            assert "no commits beyond its base" in cli.ok("show", job)
        listed = {e["id"]: e["state"] for e in cli.json("list", "--all")["jobs"]}
        assert listed[failed] == "failed" and listed[stopped] == "stopped", listed
        rows = cli.ok("list", "--all")
        assert failed in rows and stopped in rows, rows
        # a reply to such a job gets its branch back, at its base
        again = cli.ok("reply", failed, COMMIT.format(name="r.txt", text="r"))
        assert again.startswith(failed)
        cli.ok("wait", failed)
        assert git(repo, "log", "-1", "--format=%s", f"subtask/{failed}") == "add r.txt"
    finally:
        hold.touch()
        cli("wait", running)


@pytest.mark.parametrize("command", ["gc", "cleanup"])
def test_no_cleanup_deletes_the_empty_branch_of_a_reply_that_started_meanwhile(cli, repo, tmp_path, command):
    """The empty branch a gc listed is the one a reply just started on: the run-lock keeps it."""
    job = cli.start("echo nothing yet")
    cli.ok("wait", job)
    argv = {"gc": ["gc", "--older-than", "0s"], "cleanup": ["cleanup", job]}[command]
    out, err, go = _sweep_while_a_reply_starts(cli, repo, tmp_path, job, argv)
    try:
        assert f"refs/heads/subtask/{job}" in refs(repo), f"{command} deleted the branch of a running job: {out}{err}"
    finally:
        go.touch()
    cli.ok("wait", job)
    assert "add g.txt" in git(repo, "log", "--format=%s", f"subtask/{job}"), "the reply's commit was made"


def test_an_empty_branch_that_gets_a_commit_while_gc_decides_is_kept(cli, repo, tmp_path):
    """Deleted by compare-and-swap on the empty tip gc saw: a commit made meanwhile keeps the branch."""
    job = cli.start("echo nothing yet")
    cli.ok("wait", job)
    gate = tmp_path / "gate"
    sweeper = subprocess.Popen(["git", "subtask", "gc", "--older-than", "0s"], cwd=repo,
                               env=_hold_env(gate, "before_empty_branch_delete"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=30), sweeper.communicate()
        base = git(repo, "rev-parse", f"subtask/{job}")
        work = git(repo, "commit-tree", f"{base}^{{tree}}", "-p", base, "-m", "work made meanwhile")
        git(repo, "update-ref", f"refs/heads/subtask/{job}", work, base)
        gate.touch()
        out, err = sweeper.communicate(timeout=60)
        assert "Traceback" not in err, err
        assert f"kept branch subtask/{job}: it moved" in out, out + err
        assert git(repo, "rev-parse", f"subtask/{job}") == work
    finally:
        gate.touch()
        sweeper.wait(timeout=60)


# ---------------------------------------------------------------- the review block on main (issue 38)

LANDINGS = [  # (command, its options, main moves on first) -> every way a job can land
    ("merge", [], False), ("merge", [], True), ("merge", ["--no-ff"], False), ("merge", ["--ff-only"], False),
    ("merge", ["--squash"], False), ("merge", ["--squash"], True),
    ("land", [], False), ("land", [], True), ("land", ["--no-ff"], False),
    ("land", ["--squash"], True), ("land", ["--rebase"], True), ("land", ["--rebase"], False),
]


def blocks_on_main(repo: Path, job: str) -> list[str]:
    """The commits of main's log whose notes hold the job's review block."""
    out = git(repo, "log", "--notes=subtask", "--format=%H%n%N%x00", "main")
    return [entry.strip().split("\n", 1)[0] for entry in out.split("\0") if f"subtask {job} ·" in entry]


@pytest.mark.parametrize("command,options,moved", LANDINGS,
                         ids=[f"{c}{''.join(o)}{'-moved' if m else ''}" for c, o, m in LANDINGS])
def test_the_review_block_shows_once_in_mains_log_whatever_the_landing(cli, repo, command, options, moved):
    # Left uncommitted: the worker's commit carries the Subtask-Id trailer a squash must not repeat.
    job = cli.start("echo x > f.txt", "--verify", "test -f f.txt")
    cli.ok("wait", job)
    head = git(repo, "rev-parse", f"subtask/{job}")
    if moved:
        (repo / "other.txt").write_text("other\n")
        git(repo, "add", "other.txt")
        git(repo, "commit", "-qm", "main moves on")
    cli.ok(command, *options, job)
    landed = state(cli, job)["landed_in"]
    assert landed and is_ancestor(repo, landed, "main")
    reaches_head = is_ancestor(repo, head, "main")
    for _ in range(2):  # as written by the landing, and as `notes rebuild` writes it again
        found = blocks_on_main(repo, job)
        assert found == [head if reaches_head else landed], found
        note = git(repo, "notes", "--ref=subtask", "show", found[0])
        if reaches_head:
            assert "landed:  here" not in note, note
        else:  # a new commit (squash, rebase): the block there says where it came from
            assert f"landed:  here, from its head {head[:7]}" in note, note
            assert f"subtask {job} ·" in git(repo, "notes", "--ref=subtask", "show", head), "the head keeps its own"
        cli.ok("notes", "rebuild")
    assert git(repo, "log", "-1", "--format=%B", landed).count("Subtask-Id:") == 1
