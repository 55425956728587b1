"""Loose objects are packed once before a checkout reads them (subtask/packing.py).

A base committed locally with many files leaves them as loose objects, and every checkout of it
then opens each one. The first worker to check such a base out packs them into one pack; the
loose copies stay (git gc prunes them), and a job never fails because of the pack.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import Cli, git, make_repo

from subtask.git import packing
from subtask.git.gitrepo import open_repo

MANY = 300  # loose blobs: 15 of them in the 16 fan-out folders sampled, an estimate of 240
# The threshold the tests set: 8 sampled objects. A job adds ~15 objects (record, note), about
# one of them sampled, so a second pack would take 8 of those 15 in the sample (~1e-6).
THRESHOLD = "128"


def many_files_repo(path: Path, count: int = MANY) -> Path:
    repo = make_repo(path, {f"pkg{n % 10}/mod{n:04d}.py": f"value = {n}\n" for n in range(count)})
    git(repo, "config", "subtask.packLooseObjects", THRESHOLD)
    return repo


def loose_objects(repo: Path) -> set[str]:
    objects = repo / ".git" / "objects"
    return {folder.name + entry.name for folder in objects.iterdir() if len(folder.name) == 2
            for entry in folder.iterdir()}


def packs(repo: Path) -> list[Path]:
    return sorted((repo / ".git" / "objects" / "pack").glob("pack-*.idx"))


def packed_objects(idx: Path) -> set[str]:
    out = subprocess.run(["git", "show-index"], stdin=idx.open("rb"), capture_output=True, text=True, check=True)
    return {line.split()[1] for line in out.stdout.splitlines()}


def tree_objects(repo: Path, rev: str = "HEAD") -> set[str]:
    listing = git(repo, "rev-list", "--objects", "--no-walk", rev, "--", ".")
    return {line.split()[0] for line in listing.splitlines()} - {git(repo, "rev-parse", rev)}


def run_job(cli, task: str = "true") -> str:
    job = cli.start(task)
    cli.ok("wait", job)
    return job


@pytest.fixture
def big(tmp_path) -> Path:
    return many_files_repo(tmp_path / "big")


def test_a_base_of_many_loose_objects_is_checked_out_from_one_new_pack(big):
    cli = Cli(big)
    before = loose_objects(big)
    job = run_job(cli)
    assert cli.json("result", job)["state"] == "done"
    [idx] = packs(big)
    assert tree_objects(big) <= packed_objects(idx), "the base's trees and blobs are all in the pack"
    assert before <= loose_objects(big), "no loose object was deleted"
    worktree = big / ".subtask" / "worktrees" / job
    assert (worktree / "pkg3" / "mod0123.py").read_text() == "value = 123\n"
    git(big, "fsck", "--no-dangling")


def test_the_next_job_on_the_same_base_makes_no_second_pack(big):
    cli = Cli(big)
    run_job(cli)
    first = packs(big)
    run_job(cli)
    assert packs(big) == first


def test_a_repository_with_few_loose_objects_is_left_as_it_is(repo, cli):
    git(repo, "config", "subtask.packLooseObjects", THRESHOLD)
    run_job(cli)
    assert packs(repo) == []


def test_pack_loose_objects_zero_never_packs(big):
    git(big, "config", "subtask.packLooseObjects", "0")
    run_job(Cli(big))
    assert packs(big) == []


def test_a_pack_that_cannot_be_written_leaves_the_repository_as_it_was(big, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(packing, "_write_pack", broken)
    files_before = sorted(p.name for p in (big / ".git" / "objects" / "pack").iterdir())
    assert packing.pack_loose_objects(open_repo(big)) is False
    assert sorted(p.name for p in (big / ".git" / "objects" / "pack").iterdir()) == files_before
    assert "not packing" in capsys.readouterr().err


def test_a_worker_that_waited_for_anothers_pack_makes_no_second_one(big):
    """Whether the second packer arrives while the first holds the lock or after, one pack is made."""
    import threading

    from subtask.state.statefiles import file_lock

    repo = open_repo(big)
    answers = []
    with file_lock(packing.state_file(repo).with_suffix(".lock")):
        waiter = threading.Thread(target=lambda: answers.append(packing.pack_loose_objects(open_repo(big))))
        waiter.start()
        packing._write_pack(repo, big / ".git" / "objects")
        packing.write_json(packing.state_file(repo),
                           {"v": 1, "loose": packing.estimate_loose(big / ".git" / "objects")}, durable=False)
    waiter.join(timeout=60)
    assert answers == [False]
    assert len(packs(big)) == 1


def test_repositories_that_share_a_state_folder_are_each_packed(tmp_path):
    """`subtask.stateDir` may point several repositories at one folder (a user-wide cap): what was
    packed is kept per repository."""
    shared = tmp_path / "state"
    repos = [many_files_repo(tmp_path / name) for name in ("one", "two")]
    for repo in repos:
        git(repo, "config", "subtask.stateDir", str(shared))
        run_job(Cli(repo))
    assert [len(packs(repo)) for repo in repos] == [1, 1]
