"""A plain job's worker does its git without libgit2: with pygit2 unimportable, every kind of
end a job without a verify has (nothing changed, work left uncommitted, commits of its own with a
rename, a binary file and a deletion, an engine's own files kept out, a note beside a human's)
ends as it does with it, and the review note stands where it should."""

from __future__ import annotations

import json

import pytest
from conftest import git

BLOCKER = """import sys


class _NoPygit2:
    def find_spec(self, name, path=None, target=None):
        if name == "pygit2" or name.startswith("pygit2."):
            raise ImportError("pygit2 is not importable here (tests/test_worker_git.py)")
        return None


sys.meta_path.insert(0, _NoPygit2())
"""


@pytest.fixture
def without_pygit2(tmp_path):
    """An environment in which every import of pygit2 fails (a finder, not `sys.modules[...] =
    None`, which reads as loaded to `"pygit2" in sys.modules`)."""
    site = tmp_path / "without-pygit2"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    return {"PYTHONPATH": str(site)}


def ended(cli, repo, task: str, env: dict, *args: str) -> dict:
    job = cli.start(task, *args, env=env)
    cli("wait", job, env=env)
    shown = cli.json("show", job)
    log = (repo / ".git" / "subtask" / "logs" / f"{job}.log").read_text()
    assert "pygit2 is not importable" not in log, log
    return shown


def evidence(shown: dict) -> dict:
    return shown["evidence"]


def note_on(repo, commit: str) -> str:
    return git(repo, "notes", "--ref=subtask", "show", commit)


def test_a_job_that_changed_nothing_ends_done_with_its_note_on_its_base(repo, cli, without_pygit2):
    base = git(repo, "rev-parse", "HEAD")
    shown = ended(cli, repo, "true", without_pygit2)
    assert shown["state"] == "done", shown
    assert evidence(shown)["files"] == [] and evidence(shown)["totals"]["commits"] == 0
    assert note_on(repo, base).startswith(f"subtask {shown['id']}")


def test_work_left_uncommitted_is_committed_and_counted(repo, cli, without_pygit2):
    shown = ended(cli, repo, "printf 'a\\nb\\n' > new.txt && echo changed >> README.md", without_pygit2)
    assert shown["state"] == "done", shown
    found = evidence(shown)
    files = {f["path"]: (f["status"], f["added"], f["deleted"]) for f in found["files"]}
    assert files == {"new.txt": ("A", 2, 0), "README.md": ("M", 1, 0)}
    assert found["totals"] == {"commits": 1, "files": 2, "added": 3, "deleted": 0}
    head = git(repo, "rev-parse", f"subtask/{shown['id']}")
    assert found["head"] == head and found["autocommit"]["files"]
    assert git(repo, "log", "-1", "--format=%an", head) == "git-subtask worker"  # no user.name: the fallback
    assert note_on(repo, head).startswith(f"subtask {shown['id']}")


def test_a_jobs_own_commits_are_listed_with_renames_binaries_and_deletions(repo, cli, without_pygit2):
    (repo / "old.txt").write_text("".join(f"line {i}\n" for i in range(20)))
    (repo / "gone.txt").write_text("bye\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "more files")
    task = ("git mv old.txt renamed.txt && git rm -q gone.txt && git commit -q -m 'first: rename, delete' "
            "&& printf '\\000\\001\\002' > blob.bin && git add blob.bin && git commit -q -m 'second: binary'")
    shown = ended(cli, repo, task, without_pygit2)
    assert shown["state"] == "done", shown
    found = evidence(shown)
    assert [c["subject"] for c in found["commits"]] == ["second: binary", "first: rename, delete"]
    files = {f["path"]: (f["status"], f["added"], f["deleted"], f.get("old_path")) for f in found["files"]}
    assert files == {"renamed.txt": ("R", 0, 0, "old.txt"), "gone.txt": ("D", 0, 1, None),
                     "blob.bin": ("A", 0, 0, None)}
    assert found["autocommit"] is None


def test_an_engines_own_files_stay_out_of_the_autocommit(repo, cli, without_pygit2):
    git(repo, "config", "--add", "subtask.engine.shell.exclude", "chat.log")
    git(repo, "config", "--add", "subtask.engine.shell.exclude", "*.tmp")
    shown = ended(cli, repo, "echo x > chat.log && echo y > a.tmp && echo z > work.txt", without_pygit2)
    assert [f["path"] for f in evidence(shown)["files"]] == ["work.txt"]


def test_a_human_note_on_the_base_keeps_its_text(repo, cli, without_pygit2):
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "notes", "--ref=subtask", "add", "-m", "reviewed by a person", base)
    first = ended(cli, repo, "true", without_pygit2)
    second = ended(cli, repo, "exit 3", without_pygit2)
    assert second["state"] == "failed"
    note = note_on(repo, base)
    assert note.startswith("reviewed by a person\n\n")
    assert f"subtask {first['id']}" in note and f"subtask {second['id']}" in note
    assert git(repo, "config", "notes.subtask.mergeStrategy") == "union"


def test_the_autocommit_is_by_the_user_git_knows(repo, cli, without_pygit2):
    git(repo, "config", "user.name", "Ada Lovelace")
    git(repo, "config", "user.email", "ada@example.com")
    shown = ended(cli, repo, "echo hi > hi.txt", without_pygit2)
    head = evidence(shown)["head"]
    assert git(repo, "log", "-1", "--format=%an <%ae>|%cn <%ce>", head) == \
        "Ada Lovelace <ada@example.com>|Ada Lovelace <ada@example.com>"
    assert json.loads(cli.ok("show", shown["id"], "--json"))["state"] == "done"


def libgit2_diff_stats(path, base: str, head: str):
    """What the worker's evidence said while it read the diff with libgit2 (a teammate's record
    written then is checked against `diff_stats` by `land`)."""
    import pygit2

    repository = pygit2.Repository(str(path))
    walker = repository.walk(head, pygit2.enums.SortMode.TOPOLOGICAL)
    walker.hide(base)
    commits = [{"sha": str(c.id), "subject": c.message.splitlines()[0] if c.message else ""} for c in walker]
    diff = repository.diff(repository[base].peel(pygit2.Commit), repository[head].peel(pygit2.Commit))
    diff.find_similar()
    files = []
    for patch in diff:
        delta = patch.delta
        _, plus, minus = patch.line_stats
        entry = {"path": delta.new_file.path, "status": delta.status_char(), "added": plus, "deleted": minus}
        if delta.old_file.path != delta.new_file.path:
            entry["old_path"] = delta.old_file.path
        files.append(entry)
    return commits, files


def test_the_diff_is_what_libgit2_said_of_it(repo):
    """Renames (changed a little), a binary file, a deletion, a mode change, folders, a path that is
    not ASCII, a merge inside the range, and settings that would change git's porcelain diff."""
    from subtask.git.gitrepo import diff_stats, open_repo

    (repo / "src").mkdir()
    (repo / "src" / "long.py").write_text("".join(f"value_{i} = {i}\n" for i in range(40)))
    (repo / "doomed.txt").write_text("a\nb\nc\n")
    (repo / "run.sh").write_text("echo hi\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "before")
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "side")
    (repo / "side.txt").write_text("from the side\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "side work\n\nwith a body")
    git(repo, "checkout", "-q", "main")
    git(repo, "mv", "src/long.py", "src/moved.py")
    (repo / "src" / "moved.py").write_text((repo / "src" / "moved.py").read_text().replace("value_3 =", "v3 ="))
    git(repo, "rm", "-q", "doomed.txt")
    (repo / "run.sh").chmod(0o755)
    (repo / "blob.bin").write_bytes(bytes(range(256)))
    (repo / "caf\u00e9 menu.txt").write_text("cr\u00e8me\n")
    (repo / "README.md").write_text("hello\nmore\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "main work")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    head = git(repo, "rev-parse", "HEAD")
    for key, value in (("diff.algorithm", "histogram"), ("diff.orderFile", str(repo / "order")),
                       ("diff.external", "false"), ("color.diff", "always"), ("diff.relative", "true")):
        git(repo, "config", key, value)
    (repo / "order").write_text("*.txt\n")

    commits, files, totals = diff_stats(open_repo(repo), base, head)
    want_commits, want_files = libgit2_diff_stats(repo, base, head)
    assert commits == want_commits
    assert files == want_files
    assert totals == {"commits": 3, "files": len(want_files), "added": sum(f["added"] for f in want_files),
                      "deleted": sum(f["deleted"] for f in want_files)}
    assert {f["path"]: f["status"] for f in files}["src/moved.py"] == "R"


def test_a_judged_jobs_worker_needs_no_libgit2_either(tmp_path, without_pygit2):
    """The judge (the base's harness over the job's code, the overlaid tree verify ran on) and the
    text checks read and write git's objects without libgit2: a job that games its tests still
    fails its verify, one that deletes a test fails its check, an honest fix passes."""
    from conftest import Cli
    from test_judge import FIX, TRICKS, VERIFY, calc_repo

    calc = calc_repo(tmp_path / "calc")
    cli = Cli(calc)
    gamed = ended(cli, calc, TRICKS["conftest drops the test"], without_pygit2, "--verify", VERIFY, "--check", "none")
    verify = gamed["state_detail"]["attempts"][-1]["verify"]
    assert verify["passed"] is False
    ran_on, base = verify["harness"]["tree"], verify["harness"]["commit"]  # the base's conftest over the job's
    assert git(calc, "rev-parse", f"{ran_on}:conftest.py") == git(calc, "rev-parse", f"{base}:conftest.py")
    theirs = git(calc, "rev-parse", f"subtask/{gamed['id']}:conftest.py")
    assert git(calc, "rev-parse", f"{ran_on}:conftest.py") != theirs
    deleted = ended(cli, calc, f"{FIX}; sed -i '/def test_zero/,$d' tests/test_calc.py", without_pygit2,
                    "--verify", VERIFY)
    checked = deleted["state_detail"]["attempts"][-1]
    assert checked["verify"]["passed"] is False, checked
    assert [c["check"] for c in checked["checks"] if not c["passed"]] == ["no-test-deletion"], checked["checks"]
    honest = ended(cli, calc, f"{FIX}; printf 'from calc import add\\n\\n\\ndef test_one():\\n"
                              "    assert add(1, 1) == 2\\n' > tests/test_more.py", without_pygit2, "--verify", VERIFY)
    assert honest["state"] == "done" and honest["state_detail"]["attempts"][-1]["verify"]["passed"] is True


def libgit2_change(path, base: str, head: str) -> list[tuple]:
    """What the checks read of base..head while they read it with libgit2: each file's paths, the
    lines it added and removed, and its blobs."""
    import pygit2

    repository = pygit2.Repository(str(path))
    diff = repository.diff(repository[base].peel(pygit2.Commit), repository[head].peel(pygit2.Commit))
    diff.find_similar()
    files = []
    for patch in diff:
        delta = patch.delta
        status = delta.status_char()
        old, new = (None if status == "A" else delta.old_file.path), (None if status == "D" else delta.new_file.path)
        added, removed, old_data, new_data = [], [], None, None
        if not delta.is_binary:
            for hunk in patch.hunks:
                for line in hunk.lines:
                    (added if line.origin == "+" else removed if line.origin == "-" else []).append(line.content)
            old_data = repository[delta.old_file.id].data if old is not None else None
            new_data = repository[delta.new_file.id].data if new is not None else None
        files.append((old, new, added, removed, old_data, new_data))
    return files


def test_the_checks_read_the_change_libgit2_read(repo):
    """Added, changed (a last line without its newline), renamed and changed, deleted, binary, a
    file turned into a link, a mode change, a path that is not ASCII or holds a tab and a newline,
    CRLF lines."""
    from subtask.git.checks import Change
    from subtask.git.gitrepo import open_repo

    (repo / "tests").mkdir()
    (repo / "tests" / "test_a.py").write_text("".join(f"def test_{i}():\n    assert {i}\n" for i in range(30)))
    (repo / "gone.py").write_text("x = 1\n")
    (repo / "link_me").write_text("was a file\n")
    (repo / "tool.sh").write_text("echo\n")
    (repo / "dos.txt").write_bytes(b"one\r\ntwo\r\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "before")
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "mv", "tests/test_a.py", "tests/test_b.py")
    text = (repo / "tests" / "test_b.py").read_text().replace("    assert 3\n", "    pass  # noqa\n")
    (repo / "tests" / "test_b.py").write_text(text + "def test_last():\n    assert True")
    git(repo, "rm", "-q", "gone.py")
    (repo / "link_me").unlink()
    (repo / "link_me").symlink_to("tool.sh")
    (repo / "tool.sh").chmod(0o755)
    (repo / "blob.bin").write_bytes(bytes(range(256)))
    (repo / "caf\u00e9.py").write_text("import pytest\n\n@pytest.mark.skip\ndef test_x():\n    pass\n")
    (repo / "dos.txt").write_bytes(b"one\r\nTWO\r\n")
    (repo / "a\ttab and\na newline.py").write_text("def test_odd():\n    pass\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "after")
    head = git(repo, "rev-parse", "HEAD")

    change = Change(open_repo(repo), base, head)
    ours = [(f.old_path, f.new_path, f.added, f.removed, f.old, f.new) for f in change.files]
    assert ours == libgit2_change(repo, base, head)
    assert change.unread == 0 and ("tests/test_a.py", "tests/test_b.py") in [f[:2] for f in ours]


def test_a_worker_packs_loose_objects_without_libgit2(tmp_path, without_pygit2):
    """The packer of a base's many loose objects (before its checkout reads them) is git's too."""
    from conftest import Cli
    from test_packing import many_files_repo, packed_objects, packs, tree_objects

    big = many_files_repo(tmp_path / "big")
    cli = Cli(big)
    shown = ended(cli, big, "true", without_pygit2)
    assert shown["state"] == "done"
    assert len(packs(big)) == 1 and tree_objects(big) <= packed_objects(packs(big)[0])


def test_a_file_named_with_a_tab_or_a_newline_is_counted_as_any_other(repo, cli, without_pygit2):
    """git's -z output is split at NULs; a name the job chose may hold any other byte."""
    task = "printf 'x\\n' > \"$(printf 'tab\\there.txt')\" && printf 'y\\n' > \"$(printf 'new\\nline.txt')\""
    shown = ended(cli, repo, task, without_pygit2)
    assert shown["state"] == "done", shown
    files = {f["path"]: (f["status"], f["added"]) for f in evidence(shown)["files"]}
    assert files == {"tab\there.txt": ("A", 1), "new\nline.txt": ("A", 1)}
    assert sorted(evidence(shown)["autocommit"]["files"]) == ["new\nline.txt", "tab\there.txt"]
