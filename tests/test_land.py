"""Landing: merge, the merge gate, cleanup --merged (ff, --no-ff, squash, rebase), gc, notes, worktree setup."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import git, refs

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
    job = cli.start("sleep 20")
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
    proc = cli("merge", job)
    assert proc.returncode == 1 and "uncommitted changes" in proc.stderr and "README.md" in proc.stderr
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
    running = cli.start("sleep 20")
    try:
        assert "would remove" in cli.ok("gc", "--dry-run", "--older-than", "0s")
        assert worktree(repo, clean).exists()
        out = cli.ok("gc", "--older-than", "0s")
        assert f"{clean}: removed worktree" in out and f"{dirty}: kept worktree" in out, out
        assert not worktree(repo, clean).exists() and worktree(repo, dirty).exists()
        assert f"refs/heads/subtask/{clean}" in refs(repo), "gc never deletes an unmerged branch"
        assert state(cli, clean)["worktree_removed"]
        assert cli.json("show", running)["state"] == "running"
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
