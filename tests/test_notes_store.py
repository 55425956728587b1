"""Tests for subtask.git.notes_store against real repositories and the real git CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pygit2
import pytest

from subtask.git import notes_store
from subtask.git.gitobjects import GitObjects, Pygit2Objects
from subtask.git.notes_store import NOTES_REF
from subtask.model.errors import SubtaskError

MAIN_DIR = Path(__file__).resolve().parents[1]

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test Author",
    "GIT_AUTHOR_EMAIL": "author@example.com",
    "GIT_COMMITTER_NAME": "Test Committer",
    "GIT_COMMITTER_EMAIL": "committer@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo_dir: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    out = subprocess.run(
        ["git", *args], cwd=repo_dir, env=env, check=True, capture_output=True, text=True
    )
    return out.stdout


def job(n: int) -> str:
    return f"st-{n:08x}"


def block(job_id: str, body: str = "verdict: ok") -> str:
    return f"subtask {job_id} · review\n{body}"


@pytest.fixture
def repo_dir(tmp_path: Path) -> Path:
    d = tmp_path / "repo"
    d.mkdir()
    git(d, "init", "-q", "-b", "main")
    for i in range(3):
        (d / f"f{i}.txt").write_text(f"{i}\n")
        git(d, "add", f"f{i}.txt")
        git(d, "commit", "-q", "-m", f"commit {i}")
    return d


BACKENDS = ("pygit2", "git", "loose")


def make_store(backend: str, repo_dir: Path) -> GitObjects | Pygit2Objects:
    """The repository's objects as one backend of `Repo.objects` has them: a loaded pygit2, git's
    processes, or git's processes with objects written here (`git/loose.py`)."""
    if backend == "pygit2":
        return Pygit2Objects(pygit2.Repository(str(repo_dir)))
    git_dir = repo_dir / ".git"
    return GitObjects(git_dir, common_dir=git_dir, loose=backend == "loose")


@pytest.fixture(params=BACKENDS)
def store(request, repo_dir: Path) -> GitObjects | Pygit2Objects:
    """Every test runs on each backend: they write the same notes."""
    return make_store(request.param, repo_dir)


@pytest.fixture
def repo(repo_dir: Path, store) -> pygit2.Repository:
    """The repository as pygit2 reads it, for the tests' own looks; its notes ref made by `store`."""
    notes_store.ensure_ref(store)
    return pygit2.Repository(str(repo_dir))


@pytest.fixture
def lock(tmp_path: Path) -> Path:
    return tmp_path / "state" / "notes.lock"


def head(repo_dir: Path, rev: str = "HEAD") -> str:
    return git(repo_dir, "rev-parse", rev).strip()


def notes_tip(repo: pygit2.Repository) -> pygit2.Oid:
    return repo.references[NOTES_REF].target


def many_commits(repo: pygit2.Repository, n: int) -> list[str]:
    """n commits chained on main, made with pygit2 (fast enough for hundreds)."""
    sig = pygit2.Signature("Test", "test@example.com")
    parent = repo.head.target
    tree = repo[parent].tree.id
    out = []
    for i in range(n):
        parent = repo.create_commit(None, sig, sig, f"c{i}", tree, [parent])
        out.append(str(parent))
    repo.references.create("refs/heads/main", parent, force=True)
    return out


# --------------------------------------------------------------------------- basics


def test_set_block_visible_to_git_cli(store, repo: pygit2.Repository, repo_dir: Path, lock: Path) -> None:
    c = head(repo_dir)
    notes_store.set_block(store, c, job(1), block(job(1)), lock)

    shown = git(repo_dir, "notes", "--ref=subtask", "show", c)
    assert shown == block(job(1)) + "\n"
    log = git(repo_dir, "log", "-1", "--notes=subtask", c)
    assert f"subtask {job(1)} · review" in log
    assert notes_store.read_blocks(store, c) == {job(1): block(job(1))}
    assert notes_store.read_note(store, head(repo_dir, "HEAD~1")) is None


def test_note_commit_signature_and_message(
    store, repo: pygit2.Repository, repo_dir: Path, lock: Path
) -> None:
    notes_store.set_block(store, head(repo_dir), job(1), block(job(1)), lock)
    commit = repo[notes_tip(repo)]
    assert (commit.author.name, commit.author.email) == ("git-subtask", "git-subtask@localhost")
    assert (commit.committer.name, commit.committer.email) == (
        "git-subtask",
        "git-subtask@localhost",
    )
    assert commit.message.startswith("Notes added by git-subtask")
    assert len(commit.parents) == 1


def test_two_jobs_same_commit_and_replace_one(
    store, repo: pygit2.Repository, repo_dir: Path, lock: Path
) -> None:
    c = head(repo_dir)
    notes_store.set_block(store, c, job(2), block(job(2), "second"), lock)
    notes_store.set_block(store, c, job(1), block(job(1), "first"), lock)
    shown = git(repo_dir, "notes", "--ref=subtask", "show", c)
    # Ordered by job id, one blank line apart.
    assert shown == f"{block(job(1), 'first')}\n\n{block(job(2), 'second')}\n"

    notes_store.set_block(store, c, job(1), block(job(1), "first, again"), lock)
    assert notes_store.read_blocks(store, c) == {
        job(1): block(job(1), "first, again"),
        job(2): block(job(2), "second"),
    }


def test_block_with_blank_lines_round_trips(
    store, repo: pygit2.Repository, repo_dir: Path, lock: Path
) -> None:
    c = head(repo_dir)
    text = block(job(1), "para one\n\npara two")
    notes_store.set_block(store, c, job(1), text + "\n\n", lock)
    notes_store.set_block(store, c, job(2), block(job(2)), lock)
    assert notes_store.read_blocks(store, c)[job(1)] == text


def test_human_note_preserved(store, repo: pygit2.Repository, repo_dir: Path, lock: Path) -> None:
    c = head(repo_dir)
    git(repo_dir, "notes", "--ref=subtask", "add", "-m", "human text", c)
    notes_store.set_block(store, c, job(1), block(job(1)), lock)

    shown = git(repo_dir, "notes", "--ref=subtask", "show", c)
    assert shown == f"human text\n\n{block(job(1))}\n"
    # Replaced, not duplicated: git wrote it flat, we write fanned out; exactly one copy remains.
    tree = repo[notes_tip(repo)].tree
    assert c not in tree
    assert len(tree / c[:2]) == 1

    notes_store.remove_block(store, c, job(1), lock)
    assert git(repo_dir, "notes", "--ref=subtask", "show", c) == "human text\n"


def test_remove_block_deletes_note_when_empty(
    store, repo: pygit2.Repository, repo_dir: Path, lock: Path
) -> None:
    c = head(repo_dir)
    notes_store.set_block(store, c, job(1), block(job(1)), lock)
    notes_store.set_block(store, c, job(2), block(job(2)), lock)
    notes_store.remove_block(store, c, job(1), lock)
    assert notes_store.read_blocks(store, c) == {job(2): block(job(2))}

    notes_store.remove_block(store, c, job(2), lock)
    assert notes_store.read_note(store, c) is None
    assert len(repo[notes_tip(repo)].tree) == 0  # emptied fanout directory is gone too
    assert subprocess.run(
        ["git", "notes", "--ref=subtask", "show", c], cwd=repo_dir, capture_output=True
    ).returncode != 0

    tip = notes_tip(repo)
    notes_store.remove_block(store, c, job(2), lock)  # absent: no-op
    assert notes_tip(repo) == tip


def test_fanout_written_and_readable_by_git(
    store, repo: pygit2.Repository, repo_dir: Path, lock: Path
) -> None:
    c = head(repo_dir)
    notes_store.set_block(store, c, job(1), block(job(1)), lock)
    tree = repo[notes_tip(repo)].tree
    sub = tree / c[:2]
    assert sub.type_str == "tree"
    assert [e.name for e in sub] == [c[2:]]
    assert git(repo_dir, "notes", "--ref=subtask", "show", c) == block(job(1)) + "\n"
    assert git(repo_dir, "notes", "--ref=subtask", "list", c).strip() == str(sub[c[2:]].id)


def test_reads_git_fanout_layout(store, repo: pygit2.Repository, repo_dir: Path, lock: Path) -> None:
    """Past ~256 notes git itself fans out; a note git placed there is found and replaced."""
    commits = many_commits(repo, 300)
    env = {**os.environ, **GIT_ENV}
    # One `git notes add` per commit is slow: add one note, then let git copy it everywhere.
    git(repo_dir, "notes", "--ref=subtask", "add", "-m", "human text", commits[0])
    pairs = "".join(f"{commits[0]} {c}\n" for c in commits[1:])
    subprocess.run(
        ["git", "notes", "--ref=subtask", "copy", "--stdin"],
        cwd=repo_dir, env=env, input=pairs, text=True, check=True,
    )
    target = commits[123]
    tree = repo[notes_tip(repo)].tree
    assert target[:2] in tree and target not in tree  # git fanned out

    notes_store.set_block(store, target, job(1), block(job(1)), lock)
    assert notes_store.read_note(store, target) == f"human text\n\n{block(job(1))}\n"
    shown = git(repo_dir, "notes", "--ref=subtask", "show", target)
    assert shown == f"human text\n\n{block(job(1))}\n"
    assert len(git(repo_dir, "notes", "--ref=subtask", "list").splitlines()) == 300


def test_idempotent_set_makes_no_commit(
    store, repo: pygit2.Repository, repo_dir: Path, lock: Path
) -> None:
    c = head(repo_dir)
    notes_store.set_block(store, c, job(1), block(job(1)), lock)
    tip = notes_tip(repo)
    notes_store.set_block(store, c, job(1), block(job(1)), lock)
    notes_store.set_block(store, c, job(1), block(job(1)) + "\n", lock)  # trailing newline ignored
    assert notes_tip(repo) == tip
    assert notes_store.set_blocks_bulk(store, [(c, job(1), block(job(1)))], lock) == 0
    assert notes_tip(repo) == tip


def test_bulk_one_commit_for_many(store, repo: pygit2.Repository, repo_dir: Path, lock: Path) -> None:
    commits = many_commits(repo, 20)
    items = [(c, job(i), block(job(i))) for i, c in enumerate(commits)]
    items.append((commits[0], job(99), block(job(99))))
    tip = notes_tip(repo)
    assert notes_store.set_blocks_bulk(store, items, lock) == 21
    new = repo[notes_tip(repo)]
    assert new.parents[0].id == tip  # exactly one notes commit
    assert set(notes_store.read_blocks(store, commits[0])) == {job(0), job(99)}
    assert notes_store.set_blocks_bulk(store, items, lock) == 0
    assert notes_store.set_blocks_bulk(store, [], lock) == 0


def test_revisions_resolved(store, repo: pygit2.Repository, repo_dir: Path, lock: Path) -> None:
    notes_store.set_block(store, "HEAD~1", job(1), block(job(1)), lock)
    assert notes_store.read_blocks(store, head(repo_dir, "HEAD~1")) == {job(1): block(job(1))}
    assert notes_store.read_blocks(store, head(repo_dir, "HEAD~1")[:10]) == {job(1): block(job(1))}


@pytest.mark.parametrize(
    "job_id, text",
    [
        ("st-1234", "subtask st-1234 · x"),  # bad id
        (job(1), "subtask st-00000002 · other job"),  # header names another job
        (job(1), "no header"),
        (job(1), f"{block(job(1))}\nsubtask st-00000002 · smuggled"),  # would split on read
    ],
)
def test_bad_blocks_rejected(
    store, repo: pygit2.Repository, repo_dir: Path, lock: Path, job_id: str, text: str
) -> None:
    with pytest.raises(ValueError):
        notes_store.set_block(store, head(repo_dir), job_id, text, lock)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ensure_ref_creates_empty_notes_commit(repo_dir: Path, backend: str) -> None:
    r = pygit2.Repository(str(repo_dir))
    assert r.references.get(NOTES_REF) is None
    notes_store.ensure_ref(make_store(backend, repo_dir))
    commit = r[r.references[NOTES_REF].target]
    assert len(commit.tree) == 0 and commit.parents == []
    tip = commit.id
    notes_store.ensure_ref(make_store(backend, repo_dir))
    assert r.references[NOTES_REF].target == tip
    assert git(repo_dir, "notes", "--ref=subtask", "list") == ""


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_block_without_ensure_ref(repo_dir: Path, lock: Path, backend: str) -> None:
    r = pygit2.Repository(str(repo_dir))
    notes_store.set_block(make_store(backend, repo_dir), head(repo_dir), job(1), block(job(1)), lock)
    assert r[r.references[NOTES_REF].target].parents == []


# --------------------------------------------------------------------------- races


def test_cas_retries_when_external_writer_moves_ref(
    store, repo: pygit2.Repository, repo_dir: Path, lock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain `git notes add` lands between our read and our swap: we retry and keep both."""
    ours, theirs = head(repo_dir), head(repo_dir, "HEAD~1")
    real_commit_tree = notes_store._commit_tree
    calls = []

    def racing_commit_tree(*args, **kwargs):
        if not calls:
            git(repo_dir, "notes", "--ref=subtask", "add", "-m", "external", theirs)
        calls.append(1)
        return real_commit_tree(*args, **kwargs)

    monkeypatch.setattr(notes_store, "_commit_tree", racing_commit_tree)
    notes_store.set_block(store, ours, job(1), block(job(1)), lock)

    assert len(calls) == 2  # first swap refused, second built on the external tip
    assert git(repo_dir, "notes", "--ref=subtask", "show", theirs) == "external\n"
    assert git(repo_dir, "notes", "--ref=subtask", "show", ours) == block(job(1)) + "\n"


def test_cas_same_commit_race_merges_blocks(
    store, repo: pygit2.Repository, repo_dir: Path, lock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The external writer touches the very note we are rewriting; both texts survive."""
    c = head(repo_dir)
    real_commit_tree = notes_store._commit_tree
    calls = []

    def racing_commit_tree(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # counted first: the racing write below re-enters this function
            other = make_store("git", repo_dir)
            notes_store.set_block(other, c, job(2), block(job(2)), lock.with_name("other.lock"))
        return real_commit_tree(*args, **kwargs)

    monkeypatch.setattr(notes_store, "_commit_tree", racing_commit_tree)
    notes_store.set_block(store, c, job(1), block(job(1)), lock)
    assert len(calls) == 3  # ours, the racer's, ours again on the racer's tip
    assert set(notes_store.read_blocks(store, c)) == {job(1), job(2)}


def test_waits_for_busy_ref_lock(store, repo: pygit2.Repository, repo_dir: Path, lock: Path) -> None:
    """A held refs/notes/subtask.lock (git mid-write) delays the swap instead of failing it."""
    ref_lock = repo_dir / ".git" / "refs" / "notes" / "subtask.lock"
    ref_lock.write_text("")
    threading.Timer(0.3, ref_lock.unlink).start()
    start = time.monotonic()
    notes_store.set_block(store, head(repo_dir), job(1), block(job(1)), lock)
    assert time.monotonic() - start >= 0.25
    assert notes_store.read_blocks(store, head(repo_dir)) == {job(1): block(job(1))}


def test_stale_ref_lock_gives_fatal_error(
    store, repo: pygit2.Repository, repo_dir: Path, lock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notes_store, "_CAS_DEADLINE_S", 0.2)
    (repo_dir / ".git" / "refs" / "notes" / "subtask.lock").write_text("")
    with pytest.raises(SubtaskError) as info:
        notes_store.set_block(store, head(repo_dir), job(1), block(job(1)), lock)
    assert "subtask.lock" in (info.value.hint or "")


_WORKER = """
import json, sys, time
from pathlib import Path
from subtask.git import notes_store
from test_notes_store import make_store
args = json.loads(sys.argv[1])
store = make_store(args["backend"], Path(args["repo"]))
if args["ensure"]:
    notes_store.ensure_ref(store)
while time.time() < args["start_at"]:
    time.sleep(0.001)
for commit, job_id in args["items"]:
    text = f"subtask {job_id} · stress\\non {commit}"
    notes_store.set_block(store, commit, job_id, text, args["lock"])
"""


def _run_workers(repo_dir: Path, per_worker: list[dict]) -> None:
    env = {**os.environ, **GIT_ENV, "PYTHONPATH": os.pathsep.join([str(MAIN_DIR), str(MAIN_DIR / "tests")])}
    start_at = time.time() + 1.0  # every interpreter is up before anyone writes
    shared = {"repo": str(repo_dir), "start_at": start_at}
    procs = [  # writers of every backend at once: they write alike, and none loses another's
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, json.dumps({**w, **shared, "backend": BACKENDS[n % len(BACKENDS)]})],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for n, w in enumerate(per_worker)
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err


@pytest.mark.stress
@pytest.mark.parametrize("shared_lock", [True, False], ids=["filelock+cas", "cas-only"])
def test_concurrent_writers_lose_nothing(repo_dir: Path, tmp_path: Path, shared_lock: bool) -> None:
    """4 processes x 50 blocks; each commit is written by two processes; all 200 survive.

    The cas-only run gives every process its own lock file, so only the ref CAS protects.
    """
    repo = pygit2.Repository(str(repo_dir))
    notes_store.ensure_ref(make_store("git", repo_dir))
    commits = many_commits(repo, 100)
    workers = []
    for p in range(4):
        # Worker p covers commits [25p, 25p+50) mod 100: each commit is shared with a neighbour.
        items = [(commits[(25 * p + i) % 100], job(p * 1000 + i)) for i in range(50)]
        lock_file = tmp_path / ("notes.lock" if shared_lock else f"notes-{p}.lock")
        workers.append({"items": items, "lock": str(lock_file), "ensure": False})

    start = time.monotonic()
    _run_workers(repo_dir, workers)
    assert time.monotonic() - start < 20

    found = {(c, j) for c in commits for j in notes_store.read_blocks(make_store("git", repo_dir), c)}
    expected = {tuple(item) for w in workers for item in w["items"]}
    assert len(expected) == 200
    assert found == expected
    assert len(git(repo_dir, "notes", "--ref=subtask", "list").splitlines()) == 100


@pytest.mark.stress
def test_concurrent_ensure_ref(repo_dir: Path, tmp_path: Path) -> None:
    c = head(repo_dir)
    workers = [
        {"items": [(c, job(p))], "lock": str(tmp_path / f"l{p}.lock"), "ensure": True}
        for p in range(4)
    ]
    _run_workers(repo_dir, workers)
    r = pygit2.Repository(str(repo_dir))
    assert set(notes_store.read_blocks(make_store("git", repo_dir), c)) == {job(p) for p in range(4)}
    # Exactly one root notes commit: every writer built on the one ensure_ref that won.
    walker = r.walk(r.references[NOTES_REF].target)
    roots = [commit for commit in walker if not commit.parents]
    assert len(roots) == 1


# --------------------------------------------------------------------------- merging a remote's notes


def test_a_newer_remote_note_that_dropped_our_block_does_not_drop_it_here(
    store, repo: pygit2.Repository, repo_dir: Path, lock: Path
) -> None:
    """A teammate fetched our notes and replaced the note with `git notes add -f`: their tip descends
    from ours, yet a fast-forward to it would lose our block. Theirs wins where both have a block."""
    target = head(repo_dir)
    notes_store.set_block(store, target, job(1), block(job(1)), lock)
    notes_store.set_block(store, target, job(2), block(job(2), "verdict: old"), lock)
    ours = notes_tip(repo)
    theirs_text = f"teammate note\n\n{block(job(2), 'verdict: new')}"
    git(repo_dir, "notes", "--ref=subtask", "add", "-f", "-m", theirs_text, target)
    theirs = notes_tip(repo)
    repo.references.create(NOTES_REF, ours, force=True)  # back to ours: theirs arrives as a fetched tip

    assert notes_store.merge_ref(store, theirs, lock) == "merged"
    note = git(repo_dir, "notes", "--ref=subtask", "show", target)
    assert block(job(1)) in note, note  # ours, which their note had dropped
    assert block(job(2), "verdict: new") in note and "verdict: old" not in note, note
    assert "teammate note" in note
    assert repo.descendant_of(notes_tip(repo), theirs)  # pushing it is a fast-forward


def test_a_newer_remote_note_that_keeps_our_blocks_is_a_fast_forward(
    store, repo: pygit2.Repository, repo_dir: Path, lock: Path
) -> None:
    target = head(repo_dir)
    notes_store.set_block(store, target, job(1), block(job(1)), lock)
    ours = notes_tip(repo)
    notes_store.set_block(store, target, job(2), block(job(2)), lock)
    theirs = notes_tip(repo)
    repo.references.create(NOTES_REF, ours, force=True)
    assert notes_store.merge_ref(store, theirs, lock) == "fast-forward"
    assert notes_tip(repo) == theirs


def test_a_notes_folder_written_with_a_zero_padded_mode_is_still_a_folder(
    store, repo: pygit2.Repository, repo_dir: Path, lock: Path
) -> None:
    """A notes tree from another tool may write a folder's mode `040000` (git's fsck warns, git reads
    it): the note below it is read, kept and rewritten, never dropped with its folder."""
    target = head(repo_dir)
    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repo_dir, input=block(job(1)).encode(),
                          capture_output=True, check=True).stdout.decode().strip()
    inner = subprocess.run(["git", "mktree"], cwd=repo_dir, input=f"100644 blob {blob}\t{target[2:]}\n".encode(),
                           capture_output=True, check=True).stdout.decode().strip()
    padded = b"040000 " + target[:2].encode() + b"\0" + bytes.fromhex(inner)
    root = subprocess.run(["git", "hash-object", "-w", "--literally", "-t", "tree", "--stdin"], cwd=repo_dir,
                          input=padded, capture_output=True, check=True).stdout.decode().strip()
    commit = git(repo_dir, "commit-tree", root, "-m", "notes by another tool").strip()
    git(repo_dir, "update-ref", NOTES_REF, commit)
    assert notes_store.read_blocks(store, target) == {job(1): block(job(1))}
    notes_store.set_block(store, target, job(2), block(job(2)), lock)
    assert notes_store.read_blocks(store, target) == {job(1): block(job(1)), job(2): block(job(2))}
    assert git(repo_dir, "notes", "--ref=subtask", "show", target) == f"{block(job(1))}\n\n{block(job(2))}\n"
