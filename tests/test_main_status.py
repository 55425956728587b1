"""The main worktree's status, taken before and after each job (its evidence of changes outside
the worktree), through a private copy of the main index that git may refresh (subtask/worker/confinement.py).

`git status --no-optional-locks` never writes the index, so while the user's index has racily
clean entries (files written in the same second as the index: a scripted commit, a checkout)
every status re-reads all of those files, twice per job. Through the copy, git keeps its refresh
there; the user's index is never written, and git judges the copy as it would the original."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from conftest import git

from subtask import api
from subtask.worker.confinement import MainWorktreeStatus


def status(repo: Path) -> list[str]:
    return sorted(MainWorktreeStatus(api.repo_at(str(repo))).lines())


def plain_status(repo: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "--no-optional-locks", "status", "--porcelain"],
                         capture_output=True, text=True, check=True).stdout
    return sorted(line for line in out.splitlines() if line.strip())


def copies(repo: Path) -> list[Path]:
    folder = repo / ".git" / "subtask" / "main-index"
    return sorted(folder.iterdir()) if folder.exists() else []


def racy_repo(repo: Path, files: int = 50) -> int:
    """Files committed with the index's own mtime, ten seconds ago (set before `git add`, so the
    index records them as they are): all racily clean, which a copy stamped now would not be.
    Returns that mtime."""
    at = time.time_ns() - 10 * 10**9
    for n in range(files):
        (repo / f"f{n}.txt").write_text(f"{n:04d}\n")
        os.utime(repo / f"f{n}.txt", ns=(at, at))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "files")
    os.utime(repo / ".git" / "index", ns=(at, at))
    return at


def test_git_keeps_its_refresh_in_a_private_copy_and_the_users_index_is_never_written(repo):
    at = racy_repo(repo)
    index = repo / ".git" / "index"
    before = index.read_bytes()
    assert status(repo) == plain_status(repo) == []
    assert status(repo) == []
    assert index.read_bytes() == before and index.stat().st_mtime_ns == at
    [copy] = copies(repo)
    assert copy.stat().st_mtime_ns > at, "git did not keep its refresh: every status re-reads the racy files"
    assert copy.stat().st_mode & 0o777 == 0o600, "git's rewrite of the copy (the user's paths) is not private"


def test_a_same_size_change_in_the_index_s_own_second_is_seen(repo):
    """The copy keeps the original's mtime: with a later one, git would trust the racy entries'
    stat data and miss a change of the same size and mtime (made, as here, within the second git
    recorded the file's ctime in; past that second the ctime alone shows the change)."""
    at = racy_repo(repo)
    (repo / "f1.txt").write_text("9999\n")
    os.utime(repo / "f1.txt", ns=(at, at))
    assert status(repo) == plain_status(repo) == [" M f1.txt"]


def test_what_the_user_stages_or_changes_between_two_statuses_is_seen(repo):
    racy_repo(repo)
    assert status(repo) == []
    (repo / "new.txt").write_text("new\n")
    assert status(repo) == plain_status(repo) == ["?? new.txt"]
    git(repo, "add", "new.txt")
    assert status(repo) == plain_status(repo) == ["A  new.txt"]
    (repo / "f1.txt").write_text("changed\n")
    (repo / "f2.txt").unlink()
    assert status(repo) == plain_status(repo) == [" D f2.txt", " M f1.txt", "A  new.txt"]
    git(repo, "commit", "-q", "-am", "more")
    assert status(repo) == plain_status(repo) == []
    assert len(copies(repo)) == 1, "copies of earlier versions of the index are left behind"


def test_a_split_index_or_submodules_are_read_in_place(repo, tmp_path):
    """A split index would make git write a shared index of ours into .git, and a submodule's
    status would refresh the submodule's own index: neither is ours to write."""
    git(repo, "config", "core.splitIndex", "true")
    racy_repo(repo)
    (repo / "f3.txt").write_text("changed\n")
    assert list((repo / ".git").glob("sharedindex.*")), "the set-up made no split index"
    assert status(repo) == plain_status(repo) == [" M f3.txt"]
    assert copies(repo) == []
    git(repo, "config", "core.splitIndex", "false")
    git(repo, "update-index", "--no-split-index")
    for shared in (repo / ".git").glob("sharedindex.*"):
        shared.unlink()
    (repo / ".gitmodules").write_text('[submodule "lib"]\n\tpath = lib\n\turl = ./lib\n')
    assert status(repo) == plain_status(repo) == [" M f3.txt", "?? .gitmodules"]
    assert copies(repo) == []


def test_starts_look_at_the_checkout_keeps_its_refresh_in_the_copy_and_misses_no_change(repo, monkeypatch):
    """`start` looks at the caller's checkout for what the job will not see (subtask/git/leftout.py)
    through the same private copy: an agent that commits and starts a job in the same second left
    every committed file racily clean, and each start's look re-read them all (5-10 ms of a start
    at 2,000 files). A change of the same size in that second is still seen. (Through git, as the
    CLI's `start` looks: a process that loaded pygit2 asks libgit2 in-process.)"""
    import sys

    from subtask.git import leftout

    monkeypatch.delitem(sys.modules, "pygit2", raising=False)
    at = racy_repo(repo)
    (repo / ".git" / "subtask").mkdir()  # as a job run here before left it
    index = repo / ".git" / "index"
    before = index.read_bytes()
    (repo / "f3.txt").write_text("XXXX\n")  # as long as "0003\n", and as old: only its content differs
    os.utime(repo / "f3.txt", ns=(at, at))
    assert leftout.Look(api.repo_at(str(repo)), from_checkout=True).found(None).uncommitted == ["f3.txt"]
    assert index.read_bytes() == before and index.stat().st_mtime_ns == at
    [copy] = copies(repo)
    assert copy.stat().st_mtime_ns > at, "git did not keep its refresh: every start re-reads the racy files"
    assert leftout.Look(api.repo_at(str(repo)), from_checkout=True).found(None).uncommitted == ["f3.txt"]
