"""What the engine leaves uncommitted is committed by the worker (`worker/evidence.autocommit`), whatever
kind of change it is, also one made in the same second as the checkout, which git 2.39 (seconds
only) can tell from the checkout's own writes only by reading the file again."""

from __future__ import annotations

import pytest
from conftest import Cli, git, make_repo

CHANGES = {
    # the original is "value = 1\n": the same size, written right after the checkout
    "same-size rewrite": ("printf 'value = 9\\n' > pkg/mod.py", "pkg/mod.py"),
    "same-size rewrite, mtime put back": ("touch -r pkg/mod.py .stamp && printf 'value = 9\\n' > pkg/mod.py && "
                                          "touch -r .stamp pkg/mod.py && rm .stamp", "pkg/mod.py"),
    "deletion": ("rm pkg/other.py", "pkg/other.py"),
    "mode change": ("chmod +x pkg/mod.py", "pkg/mod.py"),
    "new file in a new folder": ("mkdir -p new/deep && echo hi > new/deep/file.txt", "new/deep/file.txt"),
    "new symlink": ("ln -s pkg/mod.py link", "link"),
    "staged only": ("echo staged > staged.txt && git add staged.txt", "staged.txt"),
}


@pytest.mark.parametrize("kind", CHANGES)
def test_every_kind_of_change_left_uncommitted_is_committed(tmp_path, kind):
    repo = make_repo(tmp_path / "repo", {"pkg/mod.py": "value = 1\n", "pkg/other.py": "other = 2\n"})
    cli = Cli(repo)
    task, path = CHANGES[kind]
    job = cli.start(task)
    cli.ok("wait", job)
    evidence = cli.json("show", job)["evidence"]
    assert evidence["state"] == "done", evidence
    assert evidence["autocommit"] is not None and path in evidence["autocommit"]["files"], evidence["autocommit"]
    assert path in git(repo, "diff", "--name-only", f"{evidence['base']}..subtask/{job}").splitlines()


def test_an_ignored_file_or_an_empty_folder_is_not_committed(tmp_path):
    repo = make_repo(tmp_path / "repo", {".gitignore": "*.log\n", "a.txt": "a\n"})
    cli = Cli(repo)
    job = cli.start("echo noise > run.log && mkdir empty")
    cli.ok("wait", job)
    evidence = cli.json("show", job)["evidence"]
    assert evidence["state"] == "done" and evidence["autocommit"] is None
    assert evidence["head"] == evidence["base"]


def test_the_engines_own_commit_is_the_head_and_nothing_is_added(tmp_path):
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    cli = Cli(repo)
    job = cli.start("echo b > a.txt && git commit -qam 'engine commit'")
    cli.ok("wait", job)
    evidence = cli.json("show", job)["evidence"]
    assert evidence["autocommit"] is None
    assert git(repo, "log", "-1", "--format=%s", f"subtask/{job}") == "engine commit"


AIDER_LEFTOVERS = ("printf 'hi\\n' > work.txt && printf '# chat\\n' > .aider.chat.history.md && "
                   "mkdir -p .aider.tags.cache.v4 && printf '\\0\\1' > .aider.tags.cache.v4/cache.db")


def test_an_engines_exclude_list_keeps_its_own_files_out_of_the_jobs_commits(tmp_path):
    """aider's recipe (`--no-gitignore`) leaves its chat history and tags cache in the worktree:
    `subtask.engine.<name>.exclude` names them, and the worker never commits them; they stay
    beside the work, untracked."""
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    cli = Cli(repo)
    script = tmp_path / "agent.sh"
    script.write_text(AIDER_LEFTOVERS + "\n")
    git(repo, "config", "subtask.engine.aider.command", f'["sh", "{script}"]')
    git(repo, "config", "--add", "subtask.engine.aider.exclude", ".aider*")
    job = cli.start("add work.txt", "--engine", "aider")
    cli.ok("wait", job)
    evidence = cli.json("show", job)["evidence"]
    assert evidence["autocommit"]["files"] == ["work.txt"]
    assert git(repo, "diff", "--name-only", f"{evidence['base']}..subtask/{job}").split() == ["work.txt"]
    worktree = repo / ".subtask" / "worktrees" / job
    assert (worktree / ".aider.chat.history.md").exists() and (worktree / ".aider.tags.cache.v4" / "cache.db").exists()

    # an engine that left only its own files: nothing to commit, no empty commit
    script.write_text("printf '# more\\n' >> .aider.chat.history.md\n")
    cli.ok("reply", job, "again")
    cli.ok("wait", job)
    assert cli.json("show", job)["evidence"]["autocommit"] is None
    assert git(repo, "rev-list", "--count", f"{evidence['base']}..subtask/{job}") == "1"


def test_without_an_exclude_list_the_engines_files_are_committed(tmp_path):
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    cli = Cli(repo)
    job = cli.start(AIDER_LEFTOVERS)
    cli.ok("wait", job)
    files = cli.json("show", job)["evidence"]["autocommit"]["files"]
    assert ".aider.chat.history.md" in files and "work.txt" in files
