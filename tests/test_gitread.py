"""Reading without pygit2 (subtask/gitobjects.py): reading commands go through the git binary, which
answers exactly as the in-process pygit2 reader does, and finds the repository as git does."""

from __future__ import annotations

import json
import re
import subprocess

import pygit2
import pytest
from conftest import git

from subtask.git import gitobjects
from subtask.git.gitrepo import open_repo
from subtask.git.records import record_ref


def hash_object(repo, text: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--stdin"], input=text, capture_output=True,
                          text=True, check=True).stdout.strip()


def test_both_readers_answer_every_question_alike(repo, cli):
    job = cli.start("mkdir -p sub && echo hi > sub/f.txt && git add sub && git commit -qm sub")
    cli.ok("wait", job)
    tip = git(repo, "rev-parse", record_ref(job))
    head = git(repo, "rev-parse", f"refs/heads/subtask/{job}")
    blob = hash_object(repo, "not a commit\n")
    git(repo, "update-ref", "refs/subtask/st-0000000b/record", blob)
    git(repo, "symbolic-ref", "refs/subtask/st-0000000c/record", record_ref(job))
    git(repo, "symbolic-ref", "refs/subtask/st-0000000d/record", "refs/heads/nowhere")  # dangling
    (repo / ".git/refs/subtask/st-0000000e").mkdir()
    (repo / ".git/refs/subtask/st-0000000e/record").write_text("12" * 20 + "\n")  # a missing object
    readers = {"git": gitobjects.GitObjects(repo / ".git"),
               "pygit2": gitobjects.Pygit2Objects(pygit2.Repository(str(repo))),
               "loose": gitobjects.GitObjects(repo / ".git", common_dir=repo / ".git")}
    specs = [tip, f"{tip}:spec.json", f"{tip}:nothere.json", blob, f"{blob}:spec.json", "12" * 20,
             f"{head}:sub", f"{head}:sub/f.txt", "HEAD", f"{tip}:spec.json\n{tip}", ""]
    base = git(repo, "rev-parse", "HEAD")
    pairs = [(base, head), (head, base), (head, head), (base, "12" * 20), (tip, head)]
    answers = {name: (r.refs("refs/subtask/"), [r.ref(n) for n in (record_ref(job), "refs/subtask/st-0000000c/record",
                                                                     "refs/subtask/st-0000000d/record", "refs/nope")],
                      r.read(specs), [r.is_ancestor(a, d) for a, d in pairs])
               for name, r in readers.items()}
    assert answers["git"] == answers["pygit2"] == answers["loose"]
    refs, single, read, ancestry = answers["git"]
    assert ancestry == [True, False, True, False, False]
    by_name = {ref.name: ref for ref in refs}
    assert by_name[record_ref(job)] == gitobjects.Ref(record_ref(job), tip)
    assert by_name["refs/subtask/st-0000000b/record"].target == blob
    assert by_name["refs/subtask/st-0000000c/record"] == \
        gitobjects.Ref("refs/subtask/st-0000000c/record", record_ref(job), True)
    assert "refs/subtask/st-0000000d/record" not in by_name and single[2] is None and single[3] is None
    assert by_name["refs/subtask/st-0000000e/record"].target == "12" * 20
    kinds = [None if answer is None else answer[0] for answer in read]
    assert kinds == ["commit", "blob", None, "blob", None, None, "tree", "blob", None, None, None]
    assert job.encode() in read[1][1] and read[7][1] == b"hi\n" and read[3][1] == b"not a commit\n"


def test_a_ref_read_from_its_loose_file_is_what_git_says_packed_loose_or_linked(repo, tmp_path):
    """`GitObjects.ref` reads a loose ref file itself (one process less per read): what it answers
    is git's answer, from the main worktree and a linked one, for a packed ref, a loose ref that
    moved after the packing, a deleted one, and names git stores otherwise."""
    git(repo, "worktree", "add", "-q", str(tmp_path / "linked"))
    first = git(repo, "rev-parse", "HEAD")
    git(repo, "commit", "-q", "--allow-empty", "-m", "second")
    second = git(repo, "rev-parse", "HEAD")
    for name in ("refs/subtask/st-0000000a/record", "refs/heads/subtask/st-0000000a", "refs/notes/subtask"):
        git(repo, "update-ref", name, first)
    git(repo, "pack-refs", "--all")
    git(repo, "update-ref", "refs/heads/subtask/st-0000000a", second)  # loose now, packed still first
    git(repo, "update-ref", "-d", "refs/notes/subtask")
    git(tmp_path / "linked", "update-ref", "refs/worktree/mine", second)  # that worktree's own
    (tmp_path / "elsewhere").write_text(first + "\n")  # a file a job wrote, its branch a link to it
    (repo / ".git/refs/heads/subtask/st-0000000b").symlink_to(tmp_path / "elsewhere")
    names = ["refs/subtask/st-0000000a/record", "refs/heads/subtask/st-0000000a", "refs/notes/subtask",
             "refs/worktree/mine", "refs/heads/x.lock", "refs/heads/../HEAD", "refs/heads/subtask/st-0000000b"]
    for where in (repo, tmp_path / "linked"):
        found = open_repo(where)
        objects = gitobjects.GitObjects(found.git_dir, common_dir=found.common_dir)  # as `Repo.objects` makes it
        asked = {name: next((r.target for r in gitobjects.GitObjects(found.git_dir).refs(name) if r.name == name), None)
                 for name in names}
        assert {name: (ref.target if (ref := objects.ref(name)) else None) for name in names} == asked
    assert asked["refs/subtask/st-0000000a/record"] == first and asked["refs/heads/subtask/st-0000000a"] == second
    assert asked["refs/notes/subtask"] is None and asked["refs/worktree/mine"] == second


def ages(text: str) -> str:
    """Output with its durations blanked (a job's age moves between two runs), and its padding."""
    return " ".join(re.sub(r"\b\d+(\.\d+)?(ms|s|m|h|d)\b|\d+m\d+s|\d+\.\d+", "T", text).split())


@pytest.fixture
def no_pygit2(tmp_path):
    """An environment in which importing pygit2 fails, as a guard on what a command loads."""
    site = tmp_path / "no-pygit2"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['pygit2'] = None  # import pygit2 -> ImportError\n")
    return {"PYTHONPATH": str(site)}


def test_reading_commands_never_import_pygit2(repo, cli, no_pygit2):
    """Half of a reading command's time was pygit2's import: list, status, show, result, wait and
    spend read through git, and say the same as they do with it."""
    job = cli.start("echo one > one.txt")
    cli.ok("wait", job)
    cli.ok("list")  # the first list of a repository sweeps for landed jobs, which may use pygit2
    for args in (("list",), ("list", "--all"), ("status",), ("status", job), ("show", job), ("show", job[:6]),
                 ("show", job, "--json"), ("result", job), ("wait", job), ("spend",), ("cleanup", job, "--dry-run")):
        guarded = cli(*args, env=no_pygit2)
        assert guarded.returncode == 0 and "Traceback" not in guarded.stderr, (args, guarded.stderr)
        plain = cli(*args)
        assert ages(guarded.stdout) == ages(plain.stdout), args
    assert job in cli.ok("show", job, env=no_pygit2) and "done" in cli.ok("list", env=no_pygit2)
    missing = cli("show", "st-00000000", env=no_pygit2)
    assert missing.returncode == 128 and "no job" in missing.stderr and "Traceback" not in missing.stderr


def test_waiting_on_a_group_and_a_job_never_imports_pygit2(repo, cli, no_pygit2):
    """`wait` is a reading command with a group beside a job too: its members are read through
    git, and it answers as it does with pygit2."""
    job = cli.start("echo one > one.txt")
    gid = cli.ok("start", "--best-of", "2", "echo $SUBTASK_GROUP_MEMBER > m.txt", "--verify", "true").split()[0]
    cli.ok("wait", job, gid)
    for args in (("wait", gid), ("wait", job, gid), ("wait", "--any", job, gid)):
        guarded = cli(*args, env=no_pygit2)
        assert guarded.returncode == 0 and "Traceback" not in guarded.stderr, (args, guarded.stderr)
        assert ages(guarded.stdout) == ages(cli.ok(*args)), args


def test_the_repository_is_found_as_git_finds_it(tmp_path):
    main = tmp_path / "work"
    git(tmp_path, "init", "-q", "--separate-git-dir", str(tmp_path / "store.git"), str(main))
    git(main, "commit", "-q", "--allow-empty", "-m", "x")
    (main / "deep" / "er").mkdir(parents=True)
    found = open_repo(main / "deep" / "er")
    assert (found.root, found.common_dir) == (main.resolve(), (tmp_path / "store.git").resolve())
    plain = tmp_path / "plain"
    git(tmp_path, "init", "-q", str(plain))
    git(plain, "commit", "-q", "--allow-empty", "-m", "x")
    git(plain, "worktree", "add", "-q", str(tmp_path / "linked"))
    git(plain, "config", "subtask.maxRunning", "3")
    git(main, "config", "subtask.Ray.Address", "auto")
    linked = open_repo(tmp_path / "linked")  # the settings are read as it is found
    assert linked.root == plain.resolve() and linked.git_dir != linked.common_dir
    assert linked.config.get("maxRunning") == "3" and linked.config.get("maxrunning") == "3"
    # git folds the case of the section and the name, never of a subsection
    config = open_repo(main).config
    assert config.git("subtask.Ray.ADDRESS") == "auto" and config.get("ray.address") is None


def test_a_job_looked_up_by_anything_but_an_id_is_a_usage_error(repo, cli):
    from subtask import api
    from subtask.model.errors import SubtaskError

    job = cli.start("true")
    cli.ok("wait", job)
    found = open_repo(repo)
    assert api.get(found, job).id == job and api.get(found, job[:5]).id == job
    for bad in (5, None, "st-zz", "st-00000000"):
        with pytest.raises(SubtaskError) as caught:
            api.get(found, bad)
        assert caught.value.kind in ("usage", "not_found"), (bad, caught.value.kind)


def git_processes(cli, tmp_path, *args: str) -> list[str]:
    """The git commands one `git subtask ARGS` ran (GIT_TRACE: one `built-in` line per git process)."""
    trace = tmp_path / f"trace-{'-'.join(args)}"
    trace.unlink(missing_ok=True)
    cli.ok(*args, env={"GIT_TRACE": str(trace)})
    return [line.split("built-in: ", 1)[1] for line in trace.read_text().splitlines() if "built-in: git" in line]


# A reading command's git processes: each costs 2-4 ms, a third of what `list` does beside its imports.
READ_BUDGET = {("list",): 3, ("status",): 3, ("show",): 2, ("result",): 2, ("wait",): 2}


def test_reading_commands_run_few_git_processes(repo, cli, tmp_path):
    """`list` reads the records and the landed marks in one listing, and HEAD's branch from its file."""
    git(repo, "config", "subtask.sweepInterval", "3600")  # the landed sweep, due once, not again mid-test
    jobs = [cli.start(f"echo {n} > f{n}.txt") for n in range(2)]
    cli.ok("wait", *jobs)
    cli.ok("list")  # the list cache and the sweep's stamp, once
    ran = {args: git_processes(cli, tmp_path, *args, *([] if args in (("list",), ("status",)) else [jobs[0]]))
           for args in READ_BUDGET}
    over = {args: found for args, found in ran.items() if len(found) > READ_BUDGET[args]}
    assert not over, over


def test_heads_branch_read_from_its_file_is_what_git_says(repo, tmp_path):
    """`Repo.head_ref` answers as `git symbolic-ref -q HEAD` for a branch, an unborn one, a detached
    HEAD, a linked worktree's own HEAD, and a symlinked HEAD (git's to answer)."""
    def says(git_dir) -> str | None:
        proc = subprocess.run(["git", "--git-dir", str(git_dir), "symbolic-ref", "-q", "HEAD"],
                              capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else None

    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", "-b", "side", str(linked))
    main_git, linked_git = repo / ".git", repo / ".git" / "worktrees" / "linked"
    shapes = {
        "branch": lambda: None,
        "detached": lambda: git(repo, "checkout", "-q", "--detach"),
        "linked detached": lambda: git(linked, "checkout", "-q", "--detach"),
        "unborn": lambda: git(repo, "symbolic-ref", "HEAD", "refs/heads/not-yet"),
        "symlinked": lambda: (main_git / "HEAD").unlink() or (main_git / "HEAD").symlink_to("refs/heads/main"),
    }
    for shape, make in shapes.items():
        make()
        for opened in (repo, linked):
            found = open_repo(opened)
            assert found.head_ref() == says(found.git_dir), (shape, opened)
            assert found.head_ref(main=True) == says(main_git), (shape, opened)
    assert says(main_git) == "refs/heads/main" and says(linked_git) is None


def test_lists_overlap_marks_survive_a_damaged_cache(repo, cli):
    """`list` keeps each finished job's files by its record's tip (a commit: its answer never
    changes) beside the behind counts, so a repeated `list` reads no evidence; a cache that is
    damaged, or of the wrong shape, is read past: the marks are the same."""
    jobs = [cli.start(f"echo {n} > same.txt") for n in range(2)]
    cli.ok("wait", *jobs)

    def marks() -> dict:
        return {e["id"]: e.get("marks") for e in cli.json("list")["jobs"]}

    first = marks()
    assert first[jobs[0]]["overlaps"] == {jobs[1]: ["same.txt"]}, first
    cache = next((repo / ".git" / "subtask").glob("behind-*.json"))
    tips = list(json.loads(cache.read_text())["files"])
    assert len(tips) == 2
    assert marks() == first  # from the cache
    for damaged in ("{not json", json.dumps({"v": 1, "counts": [], "files": {t: "same.txt" for t in tips}}),
                    json.dumps({"v": 1, "files": {t: [7] for t in tips}}), json.dumps({"v": 2, "files": []})):
        cache.write_text(damaged)
        assert marks() == first, damaged


def test_cleanup_reads_the_worktrees_head_once(repo, cli, tmp_path):
    """`cleanup` checks the worktree holds no commit that no branch keeps, then gives it back to
    the pool from that same commit: one `rev-parse` of its HEAD, not one for each."""
    git(repo, "config", "subtask.pool", "2")
    cli.ok("pool", "fill")  # one is taken, one left: a job this short refills nothing, so one has room
    job = cli.start("true")
    cli.ok("wait", job)
    ran = git_processes(cli, tmp_path, "cleanup", job)
    assert any("read-tree" in line for line in ran), ran  # given back to the pool, not removed
    assert len([line for line in ran if line.startswith("git rev-parse") and "HEAD" in line]) == 1, ran


def _listed(objects, prefixes, monkeypatch) -> tuple[list, int]:
    """`objects.refs(*prefixes)` as (name, target, symbolic) rows, and how many git processes it ran."""
    ran = []
    real = gitobjects.pipes.run
    monkeypatch.setattr(gitobjects.pipes, "run", lambda argv, *a, **k: (ran.append(argv), real(argv, *a, **k))[1])
    try:
        rows = [(r.name, r.target, r.symbolic) for r in objects.refs(*prefixes)]
    finally:
        monkeypatch.setattr(gitobjects.pipes, "run", real)
    return rows, len(ran)


def test_refs_listed_from_their_files_are_what_for_each_ref_lists(repo, tmp_path, monkeypatch):
    """`GitObjects.refs` reads the loose ref files and packed-refs itself (`list` and `status`: one
    git process less), and answers what `git for-each-ref` answers, or asks git: a ref packed,
    loose over its packed value, deleted, being written (a `.lock` beside it), symbolic, a link,
    naming a missing or a packed object, another ref backend."""
    first = git(repo, "rev-parse", "HEAD")
    git(repo, "commit", "-q", "--allow-empty", "-m", "second")
    second = git(repo, "rev-parse", "HEAD")
    prefixes = ("refs/subtask/", "refs/subtask-landed/")
    found = open_repo(repo)
    ours = gitobjects.GitObjects(found.git_dir, common_dir=found.common_dir)  # as `Repo.objects` makes it
    by_git = gitobjects.GitObjects(found.git_dir)  # no common dir: every listing is git's

    def same(expect_processes: int) -> list:
        rows, processes = _listed(ours, prefixes, monkeypatch)
        assert rows == _listed(by_git, prefixes, monkeypatch)[0]
        assert processes == expect_processes, rows
        return rows

    assert same(0) == []
    for name in ("refs/subtask/st-0000000a/record", "refs/subtask/st-0000000a/base", "refs/subtask-landed/st-0000000a",
                 "refs/subtask/st-0000000b/record"):
        git(repo, "update-ref", name, first)
    git(repo, "pack-refs", "--all")
    git(repo, "update-ref", "refs/subtask/st-0000000a/record", second)  # loose now, packed still `first`
    git(repo, "update-ref", "-d", "refs/subtask/st-0000000b/record")  # gone from packed-refs
    git(repo, "update-ref", "refs/subtask/st-0000000c/record", second)
    (repo / ".git/refs/subtask/st-0000000c/base.lock").write_text(first + "\n")  # a ref being made
    rows = same(0)
    assert [(n, t) for n, t, _ in rows] == [("refs/subtask-landed/st-0000000a", first),
                                            ("refs/subtask/st-0000000a/base", first),
                                            ("refs/subtask/st-0000000a/record", second),
                                            ("refs/subtask/st-0000000c/record", second)]
    # Git's to answer from here on, and answered alike:
    git(repo, "symbolic-ref", "refs/subtask/st-0000000d/record", "refs/subtask/st-0000000a/record")
    same(1)
    (repo / ".git/refs/subtask/st-0000000d/record").unlink()
    (tmp_path / "elsewhere").write_text(first + "\n")  # a file a job wrote, a record a link to it
    (repo / ".git/refs/subtask/st-0000000d/record").symlink_to(tmp_path / "elsewhere")
    same(1)
    (repo / ".git/refs/subtask/st-0000000d/record").unlink()
    (repo / ".git/refs/subtask/st-0000000d/record").write_text("0" * 39 + "1\n")  # no such object: git's to say
    same(1)
    (repo / ".git/refs/subtask/st-0000000d/record").unlink()
    same(0)
    (repo / ".git/reftable").mkdir()  # another ref backend's folder: its refs are not these files
    assert _listed(ours, prefixes, monkeypatch)[1] == 1
    (repo / ".git/reftable").rmdir()
    git(repo, "gc", "-q")  # every object packed: only git vouches for them
    same(1)


def test_a_repository_with_many_refs_has_them_listed_by_git_having_read_none_itself(repo, monkeypatch):
    """Past `_LISTED_AT_MOST` names git's own listing is the faster: it lists them, and no ref file
    was opened here first."""
    head = git(repo, "rev-parse", "HEAD")
    many = gitobjects._LISTED_AT_MOST + 1
    subprocess.run(["git", "update-ref", "--stdin"], cwd=repo, check=True, text=True,
                   input="".join(f"create refs/subtask/st-{n:08x}/record {head}\n" for n in range(many)))
    found = open_repo(repo)
    ours = gitobjects.GitObjects(found.git_dir, common_dir=found.common_dir)
    opened = []
    real_open = gitobjects.os.open
    monkeypatch.setattr(gitobjects.os, "open", lambda path, *a, **k: (opened.append(path), real_open(path, *a, **k))[1])
    rows, processes = _listed(ours, ("refs/subtask/",), monkeypatch)
    monkeypatch.setattr(gitobjects.os, "open", real_open)
    assert processes == 1 and len(rows) == many and not [path for path in opened if "refs/" in str(path)]


def test_head_resolved_from_its_files_is_what_rev_parse_says(repo, tmp_path, monkeypatch):
    """`commit_of("HEAD")` (a start's base) reads HEAD's file, its branch's loose ref and the
    commit's loose object, as git does, with no git process; anything else (a packed branch, a
    packed commit, an unborn branch, a symlinked HEAD, a branch at a tag object) is git's."""
    from subtask.git import pipes

    def says(git_dir) -> str | None:
        proc = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "--verify", "--quiet", "HEAD^{commit}"],
                              capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else None

    ran: list[list[str]] = []
    real_run = pipes.run
    monkeypatch.setattr(pipes, "run", lambda argv, **kw: ran.append(argv) or real_run(argv, **kw))
    main_git = repo / ".git"

    def commit_of_head():
        found = open_repo(repo)  # through git, as a CLI command reads (pygit2 is loaded in this process)
        return gitobjects.GitObjects(found.git_dir, False, found.common_dir).commit_of("HEAD")

    assert commit_of_head() == says(main_git)
    ran.clear()
    assert commit_of_head() == says(main_git)  # a branch, loose, at a loose commit
    git(repo, "checkout", "-q", "--detach")
    assert commit_of_head() == says(main_git)
    assert [argv for argv in ran if "rev-parse" in argv and "--verify" in argv] == []
    git(repo, "checkout", "-q", "main")
    git(repo, "tag", "-a", "-m", "t", "v1")
    shapes = {
        "packed branch": lambda: git(repo, "pack-refs", "--all"),
        "packed objects": lambda: git(repo, "gc", "-q"),
        "unborn": lambda: git(repo, "symbolic-ref", "HEAD", "refs/heads/not-yet"),
        "tag object": lambda: git(repo, "symbolic-ref", "HEAD", "refs/tags/v1"),
        "symlinked": lambda: (main_git / "HEAD").unlink() or (main_git / "HEAD").symlink_to("refs/heads/main"),
    }
    for shape, make in shapes.items():
        make()
        assert commit_of_head() == says(main_git), shape
