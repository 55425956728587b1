"""Writing without pygit2 (subtask/gitobjects.py's writers): `start` writes its branch, pins and record
through the git binary, byte for byte what the in-process pygit2 writer writes, with the same
compare-and-swap answers."""

from __future__ import annotations

import json
import subprocess

import pygit2
import pytest
from conftest import git

from subtask.git import gitobjects
from subtask.git.gitrepo import open_repo

WHEN = 1_700_000_000  # a fixed time, so that both writers must make the very same commit


def writers(repo):
    return {"git": gitobjects.GitObjects(repo / ".git"),
            "pygit2": gitobjects.Pygit2Objects(pygit2.Repository(str(repo)))}


def test_both_writers_write_the_same_commit(repo):
    # Settings that would change what `git commit-tree` writes, were they not overridden.
    git(repo, "config", "i18n.commitEncoding", "ISO-8859-1")
    git(repo, "config", "commit.gpgSign", "true")
    git(repo, "config", "gpg.program", "false")
    parent = git(repo, "rev-parse", "HEAD").strip()
    files = [("spec.json", b'{"v": 1}\n'), ("summary.md", "r\u00e9sum\u00e9 \u2713\n".encode()), ("empty", b"")]
    message = "st-1 done \u00b7 caf\u00e9\n\nsubtask-list: {}\n"
    made = {name: w.write_commit(files, message, [parent], when=WHEN) for name, w in writers(repo).items()}
    assert made["git"] == made["pygit2"]
    commit = pygit2.Repository(str(repo))[made["git"]]
    assert commit.message == message and [str(p) for p in commit.parent_ids] == [parent]
    assert sorted(e.name for e in commit.tree) == ["empty", "spec.json", "summary.md"]
    assert commit.tree["summary.md"].data == files[1][1]
    assert commit.committer.name == "git-subtask" and commit.committer.time == WHEN
    root = {name: w.write_commit(files[:1], "root\n", [], when=WHEN) for name, w in writers(repo).items()}
    assert root["git"] == root["pygit2"]


@pytest.mark.parametrize("writer", ["git", "pygit2"])
def test_both_writers_swap_refs_only_from_the_expected_value(repo, writer):
    w = writers(repo)[writer]
    head = git(repo, "rev-parse", "HEAD").strip()
    other = w.write_commit([("a", b"a")], "other\n", [head], when=WHEN)
    name, second = "refs/subtask/st-1/record", "refs/subtask/st-1/base"

    def at(ref):
        proc = git(repo, "rev-parse", "-q", "--verify", ref, check=False)
        return proc.strip() or None

    assert w.update_refs([(name, None, head)]) == "ok" and at(name) == head
    assert w.update_refs([(name, None, other)]) == "moved" and at(name) == head  # it exists: not created
    assert w.update_refs([(name, other, head)]) == "moved" and at(name) == head  # not at the old value
    assert w.update_refs([(name, head, other)]) == "ok" and at(name) == other
    # All or nothing: the second update's old value is wrong, so the first is not made either.
    assert w.update_refs([(second, None, head), (name, head, head)]) == "moved"
    assert at(second) is None and at(name) == other
    assert w.update_refs([(second, None, head), (name, other, head)]) == "ok"
    assert at(second) == head and at(name) == head
    lock = repo / ".git" / (name + ".lock")
    lock.write_text("")
    assert w.update_refs([(name, head, other)]) == "locked" and at(name) == head
    lock.unlink()
    assert w.update_refs([(name, head, None), (second, head, None)]) == "ok"
    assert at(name) is None and at(second) is None
    assert w.update_refs([(name, None, None)]) == "ok"  # absent, as expected: nothing to do
    assert w.update_refs([(name, head, None)]) == "moved"


def import_watch(tmp_path):
    """An environment in which the process that starts (not its forked worker) notes any import of
    pygit2 in a file: the CLI's own imports, as a user pays them before `start` returns."""
    site, mark = tmp_path / "watch-pygit2", tmp_path / "pygit2-imported"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys\n"
        "_pid = os.getpid()\n"
        "class _Watch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pygit2' and os.getpid() == _pid:\n"
        f"            open({str(mark)!r}, 'a').write(repr(sys.argv) + '\\n')\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Watch())\n")
    return {"PYTHONPATH": str(site)}, mark


def test_start_never_imports_pygit2_and_its_job_runs_as_before(repo, cli, tmp_path):
    env, mark = import_watch(tmp_path)
    git(repo, "branch", "feature")
    job = cli.start("echo one > one.txt", env=env)
    other = cli.start("echo two > two.txt", "--base", "feature", "--verify", "test -f two.txt", env=env)
    readonly = cli.start("cat README.md", "--readonly", env=env)
    bad = cli("start", "true", "--base", "no-such-branch", env=env)
    assert bad.returncode == 128 and "no-such-branch" in bad.stderr and "Traceback" not in bad.stderr
    assert not mark.exists(), mark.read_text()
    cli.ok("wait", job, other, readonly)
    for j in (job, other, readonly):
        assert json.loads(cli.ok("show", j, "--json"))["state"] == "done"
    assert "one.txt" in cli.ok("diff", job, "--stat") and "two.txt" in cli.ok("diff", other, "--stat")
    branches = git(repo, "branch", "--list", "subtask/*").split()
    assert f"subtask/{job}" in branches and f"subtask/{other}" in branches and f"subtask/{readonly}" not in branches
    r = open_repo(repo)
    assert r.objects.ref(f"refs/subtask/{job}/base").target == git(repo, "rev-parse", "HEAD").strip()
    assert len(git(repo, "for-each-ref", "refs/subtask/").splitlines()) == 3 * 2 + 2  # 3 records, 3 bases, 2 heads


def test_a_sha256_repository_is_refused_at_once_and_left_as_it_was(cli, tmp_path):
    """pygit2's libgit2 reads SHA-1 objects only: a job started there failed only at its end
    ("unknown object format"), its branch and record left behind."""
    repo = tmp_path / "sha256"
    subprocess.run(["git", "init", "-q", "--object-format=sha256", "-b", "main", str(repo)], check=True)
    git(repo, "config", "user.name", "T")
    git(repo, "config", "user.email", "t@example.com")
    (repo / "README.md").write_text("hi\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-qm", "init")
    before = git(repo, "for-each-ref"), sorted(p.name for p in (repo / ".git").iterdir())
    for args in (("start", "--engine", "shell", "echo x > x.txt"), ("list",), ("pool", "fill")):
        proc = cli(*args, cwd=repo)
        assert proc.returncode == 128, (args, proc.stdout, proc.stderr)
        assert "SHA-256" in proc.stderr and "Traceback" not in proc.stderr
    assert (git(repo, "for-each-ref"), sorted(p.name for p in (repo / ".git").iterdir())) == before
