"""Finding a job's worktree registration does not grow with the worktrees git keeps.

Every start asks whether its job's worktree was removed by hand and left registered
(`worktrees.stale_admin`), then which admin folder git made for it (`worktrees.admin_dir`).
Resolving each registered worktree's path for that is an `lstat` per component of each: ~10 ms
of a start at 59 worktrees, and users keep dozens."""

from __future__ import annotations

import os
import subprocess

import pytest

from subtask.git import worktrees
from subtask.git.gitrepo import open_repo


@pytest.fixture
def crowded(repo):
    """The repository with 40 other worktrees registered, as git registers them (`gitdir`, the
    only file read here) and one real job-like worktree checked out by git."""
    handle = open_repo(repo)
    folder = handle.worktree_dir()
    for n in range(40):
        admin = handle.common_dir / "worktrees" / f"other-{n}"
        admin.mkdir(parents=True)
        (admin / "gitdir").write_text(f"{folder / f'other-{n}'}/.git\n")
    path = folder / "st-0000abcd"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(path)], cwd=repo, check=True)
    return handle, path


@pytest.fixture
def resolved(monkeypatch):
    """The paths resolved (os.path.realpath: what Path.resolve calls) while the test runs."""
    seen: list[str] = []
    real = os.path.realpath

    def counting(path, *args, **kwargs):
        seen.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os.path, "realpath", counting)
    return seen


def test_a_new_jobs_start_resolves_no_other_worktree(crowded, resolved):
    handle, _ = crowded
    fresh = handle.worktree_dir() / "st-0000ffff"
    assert worktrees.stale_admin(handle, "st-0000ffff", fresh) is None
    assert len(resolved) <= 4, resolved


def test_a_worktree_is_found_among_many_without_resolving_them(crowded, resolved):
    handle, path = crowded
    assert worktrees.admin_dir(handle, path) == handle.common_dir / "worktrees" / "st-0000abcd"
    assert len(resolved) <= 4, resolved


def test_a_registration_through_a_symlink_is_still_found(crowded, tmp_path):
    """git wrote the path as it was given; the lookup by text misses it, the resolved one not."""
    handle, path = crowded
    link = tmp_path / "link"
    link.symlink_to(handle.worktree_dir())
    (handle.common_dir / "worktrees" / "st-0000abcd" / "gitdir").write_text(f"{link / 'st-0000abcd'}/.git\n")
    assert worktrees.admin_dir(handle, path) == handle.common_dir / "worktrees" / "st-0000abcd"
    assert worktrees.admin_dir(handle, link / "st-0000abcd") == handle.common_dir / "worktrees" / "st-0000abcd"


def test_a_jobs_worktree_removed_by_hand_is_found_stale_and_no_other(crowded, resolved):
    import shutil

    handle, path = crowded
    admin = handle.common_dir / "worktrees" / "st-0000abcd"
    worktrees.mark(handle, "st-0000abcd", path)
    shutil.rmtree(path)
    assert worktrees.stale_admin(handle, "st-0000abcd", path) == admin
    assert worktrees.stale_admin(handle, "st-0000abce", handle.worktree_dir() / "st-0000abce") is None
    (admin / "gitdir").write_text(f"{handle.worktree_dir() / 'elsewhere'}/.git\n")  # registered for another folder
    assert worktrees.stale_admin(handle, "st-0000abcd", path) is None
    assert len(resolved) <= 12, resolved


def test_a_worktree_registered_under_its_own_name_is_found_without_reading_the_others(crowded, monkeypatch):
    """git names a worktree's admin folder after its folder: that one is read first (`mark`,
    `created_here`, the pool's checks), the others only when it is not the one."""
    handle, path = crowded
    read = []
    real = worktrees._registered_at
    monkeypatch.setattr(worktrees, "_registered_at", lambda admin: (read.append(admin.name), real(admin))[1])
    worktrees.mark(handle, "st-0000abcd", path)
    assert worktrees.created_here(handle, "st-0000abcd", path)
    assert read == ["st-0000abcd", "st-0000abcd"]
    moved = handle.worktree_dir() / "renamed"
    subprocess.run(["git", "worktree", "move", str(path), str(moved)], cwd=handle.root, check=True)
    read.clear()
    assert worktrees.admin_dir(handle, moved) == handle.common_dir / "worktrees" / "st-0000abcd"  # found by the scan
    assert len(read) > 40
