"""Loose objects of our own (subtask/git/loose.py): a command without pygit2 writes a record's
blobs, tree and commit in-process, byte for byte the objects `git hash-object`, `git mktree` and
`git commit-tree` write, where git keeps them, as git leaves them; where git would write them
otherwise (a shared repository, another object folder) git writes them."""

from __future__ import annotations

import os
import stat
import subprocess
import time

import pygit2
import pytest
from conftest import git

from subtask.git import gitobjects, loose
from subtask.git.gitrepo import open_repo

WHEN = 1_700_000_000


def test_the_loose_writer_writes_the_commit_git_and_pygit2_write(repo):
    git(repo, "config", "i18n.commitEncoding", "ISO-8859-1")  # would change what commit-tree writes
    parent = git(repo, "rev-parse", "HEAD").strip()
    files = [("spec.json", b'{"v": 1}\n'), ("summary.md", "r\u00e9sum\u00e9 \u2713\n".encode()), ("empty", b""),
             ("a b", b"x"), ("B", b"y")]
    message = "st-1 done \u00b7 caf\u00e9\n\nsubtask-list: {}\n"
    writers = {"loose": gitobjects.GitObjects(repo / ".git", loose=True),
               "git": gitobjects.GitObjects(repo / ".git"),
               "pygit2": gitobjects.Pygit2Objects(pygit2.Repository(str(repo)))}
    other = git(repo, "commit-tree", "-m", "other", f"{parent}^{{tree}}").strip()
    for parents in ([parent], [], [parent, other]):
        made = {name: w.write_commit(files, message, parents, when=WHEN) for name, w in writers.items()}
        assert made["loose"] == made["git"] == made["pygit2"], parents


def test_loose_objects_are_written_as_git_writes_them(repo):
    """Read-only files under `objects/xx/`, nothing left beside them, fsck clean; written again, an
    object is freshened (git's protection against a `gc --prune` racing the writer); a commit
    without a time has the current one, at the local offset, as git's."""
    parent = git(repo, "rev-parse", "HEAD").strip()
    writer = gitobjects.GitObjects(repo / ".git", loose=True)
    files = [("record.json", b'{"v": 1}\n'), ("a b", "\u00e9\n".encode())]
    made = writer.write_commit(files, "one\n", [parent])
    commit = pygit2.Repository(str(repo))[made]
    assert abs(commit.commit_time - time.time()) < 600
    offset = time.localtime(commit.commit_time).tm_gmtoff // 60
    zone = f"{'-' if offset < 0 else '+'}{abs(offset) // 60:02d}{abs(offset) % 60:02d}"
    assert git(repo, "cat-file", "-p", made).splitlines()[3] == \
        f"committer git-subtask <git-subtask@localhost> {commit.commit_time} {zone}"
    objects = repo / ".git" / "objects"
    for oid in (made, str(commit.tree_id), *(str(e.id) for e in commit.tree)):
        path = objects / oid[:2] / oid[2:]
        assert stat.S_IMODE(path.stat().st_mode) == 0o444 & ~_umask(), oid
    assert [p for p in objects.glob("??/*") if len(p.name) != 38] == []  # no temporary file left
    fsck = subprocess.run(["git", "-C", str(repo), "fsck", "--strict", "--no-dangling"], capture_output=True,
                          text=True)
    assert fsck.returncode == 0 and not fsck.stderr.strip(), fsck.stderr
    path = objects / made[:2] / made[2:]
    os.utime(path, (1, 1))
    assert writer.write_commit(files, "one\n", [parent], when=commit.commit_time) == made
    assert path.stat().st_mtime > 1


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("setting", [("core.sharedRepository", "group"), ("core.sharedRepository", "0640"),
                                     ("core.fsync", "loose-object"), ("core.fsyncObjectFiles", "true")])
def test_a_shared_repository_has_its_objects_written_by_git(repo, setting):
    """Git gives a shared repository's objects other modes, and flushes them when told to: it
    writes them then."""
    git(repo, "config", *setting)
    assert not loose.usable(open_repo(repo).config.git)
    git(repo, "config", "--unset", setting[0])
    assert loose.usable(open_repo(repo).config.git)


def test_objects_go_through_git_when_the_environment_moves_them(repo, monkeypatch):
    monkeypatch.setenv("GIT_OBJECT_DIRECTORY", str(repo / ".git" / "objects"))
    assert not loose.usable(open_repo(repo).config.git)
    monkeypatch.delenv("GIT_OBJECT_DIRECTORY")
    assert loose.usable(open_repo(repo).config.git)


def test_start_writes_its_record_with_no_hash_object_mktree_or_commit_tree(repo, cli, tmp_path):
    trace = tmp_path / "trace"
    job = cli.start("true", env={"GIT_TRACE": str(trace)})
    cli.ok("wait", job)
    ran = trace.read_text()
    for command in ("hash-object", "mktree", "commit-tree"):
        assert f"built-in: git {command}" not in ran, command
    assert git(repo, "cat-file", "-t", f"refs/subtask/{job}/record").strip() == "commit"


def _read_by(reader: gitobjects.GitObjects, specs: list[str], monkeypatch) -> tuple[list, int]:
    """What `reader.read(specs)` answers, and how many git processes it ran for it."""
    ran = []
    real = gitobjects.pipes.run
    monkeypatch.setattr(gitobjects.pipes, "run", lambda argv, *a, **k: (ran.append(argv), real(argv, *a, **k))[1])
    found = reader.read(specs)
    monkeypatch.setattr(gitobjects.pipes, "run", real)
    return found, len(ran)


def test_a_records_loose_objects_are_read_without_git_and_answer_as_git_does(repo, monkeypatch):
    """A record's commit and its files (`<commit>`, `<commit>:<name>`) are read from their loose
    files, each checked against its name: what `git cat-file --batch` answers, with no process.
    Anything else (a path in a folder, a name that is not there, an abbreviation) is git's."""
    parent = git(repo, "rev-parse", "HEAD").strip()
    writer = gitobjects.GitObjects(repo / ".git", loose=True)
    made = writer.write_commit([("state.json", b'{"v": 1}\n'), ("a b", "\u00e9\n".encode()), ("empty", b"")],
                               "one\n", [parent])
    reader = gitobjects.GitObjects(repo / ".git", common_dir=repo / ".git")
    by_git = gitobjects.GitObjects(repo / ".git")  # no common dir: every read is git's
    loose_specs = [made, f"{made}:state.json", f"{made}:a b", f"{made}:empty"]
    found, processes = _read_by(reader, loose_specs, monkeypatch)
    assert processes == 0
    assert found == by_git.read(loose_specs) and all(found)
    others = [f"{made}:nope", f"{made}:a", f"{parent}:README.md", made[:12], "HEAD", f"{made}:state.json/x"]
    found, processes = _read_by(reader, [*loose_specs, *others], monkeypatch)
    assert found == by_git.read([*loose_specs, *others]) and processes == 1


def test_a_damaged_or_packed_loose_object_is_read_by_git(repo, monkeypatch):
    """A job may write into `objects/`: a loose file whose content is not its name's is never
    believed (git reads the spec and says what it says); an object packed away is git's."""
    parent = git(repo, "rev-parse", "HEAD").strip()
    writer = gitobjects.GitObjects(repo / ".git", loose=True)
    made = writer.write_commit([("state.json", b'{"v": 1}\n')], "one\n", [parent])
    reader = gitobjects.GitObjects(repo / ".git", common_dir=repo / ".git")
    by_git = gitobjects.GitObjects(repo / ".git")
    blob = git(repo, "rev-parse", f"{made}:state.json").strip()
    path = repo / ".git" / "objects" / blob[:2] / blob[2:]
    import zlib

    path.chmod(0o644)
    path.write_bytes(zlib.compress(b'blob 9\0{"v": 2}\n'))  # the same size, other content
    found, processes = _read_by(reader, [f"{made}:state.json"], monkeypatch)
    assert processes == 1 and found == by_git.read([f"{made}:state.json"])  # git's answer, whatever it is
    path.write_bytes(b"not zlib at all")
    assert _read_by(reader, [f"{made}:state.json"], monkeypatch)[1] == 1
    path.unlink()
    assert writer.write_commit([("state.json", b'{"v": 1}\n')], "one\n", [parent], when=None) != ""  # whole again
    git(repo, "update-ref", "refs/subtask/keep", made)
    git(repo, "gc", "-q", "--prune=now")  # everything packed
    assert not path.exists()
    found, processes = _read_by(reader, [made, f"{made}:state.json"], monkeypatch)
    assert found == by_git.read([made, f"{made}:state.json"]) and found[1] == ("blob", b'{"v": 1}\n')
    assert processes == 1


def test_a_tree_written_here_is_the_one_git_mktree_writes(repo):
    """Folders sort as their name and `/` (after `a.b`, before `a0`), and every backend's
    `write_object` names the tree git's `mktree` names, which reads back entry for entry."""
    blob = subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--stdin"], input=b"x\n",
                          capture_output=True, check=True).stdout.decode().strip()
    inner = subprocess.run(["git", "-C", str(repo), "mktree"], input=f"100644 blob {blob}\tf\n".encode(),
                           capture_output=True, check=True).stdout.decode().strip()
    entries = [(b"100644", b"a.b", blob), (loose.FOLDER_MODE, b"a", inner), (b"100755", b"a0", blob),
               (b"100644", b"a-b", blob), (loose.FOLDER_MODE, b"Z", inner), (b"120000", b"link", blob)]
    kind = {loose.FOLDER_MODE: "tree"}
    listing = "".join(f"{mode.decode().zfill(6)} {kind.get(mode, 'blob')} {oid}\t{name.decode()}\n"
                      for mode, name, oid in entries)
    want = subprocess.run(["git", "-C", str(repo), "mktree"], input=listing.encode(), capture_output=True,
                          check=True).stdout.decode().strip()
    writers = {"loose": gitobjects.GitObjects(repo / ".git", common_dir=repo / ".git", loose=True),
               "git": gitobjects.GitObjects(repo / ".git"),
               "pygit2": gitobjects.Pygit2Objects(pygit2.Repository(str(repo)))}
    for name, writer in writers.items():
        assert writer.write_object("tree", loose.tree_bytes(entries)) == want, name
    read = loose.read(repo / ".git", want)
    assert read is not None and sorted(loose.tree_entries(read[1])) == sorted(entries)
    assert [name for _, name, _ in loose.tree_entries(read[1])] == [b"Z", b"a-b", b"a.b", b"a", b"a0", b"link"]
