"""Review blocks in git notes at refs/notes/subtask, written without losing anyone's note.

Owns: the ref `refs/notes/subtask`, its notes commits and trees, the text format of a note, and
the file lock whose path the caller passes in (e.g. `<state_dir>/notes.lock`).

Note format: a note on a commit holds optional human text at the top, then one block per job.
A block starts with a line `subtask st-xxxxxxxx · ...` and runs until the next line starting with
`subtask st-` or the end; blocks are separated by one blank line and ordered by job id.

Invariants:
- Every write is a compare-and-swap: a new notes commit whose parent is the tip we read, and the
  ref moves only if it still points at that tip (checked under git's own ref lock, the same
  `refs/notes/subtask.lock` that `git notes` takes). A moved tip or a busy lock means re-read,
  re-apply, retry with backoff. We never overwrite blind, so a note written meanwhile by another
  git-subtask process or by a user's `git notes add` is never lost. (The reverse is not in our
  hands: `git notes add` itself moves the ref without checking the old tip, so a user's run that
  races ours can drop our latest block; `notes rebuild` puts it back.)
- Notes are written with git's 2/38 fanout (`ab/cdef...`); notes are read in any layout (flat,
  2/38, deeper), and every old copy of a commit's note is removed when it is rewritten, so a note
  first written flat by `git notes add` is replaced, never duplicated.
- Writing text that is already there creates no notes commit.
- Note commits carry the fixed identity `git-subtask <git-subtask@localhost>`, and are signed by
  git (`gitobjects.commit_tree`) when the repository's config names a signing key and
  `subtask.sign` is not never (`config.signing_key_of`, read here from libgit2's config).
- Never fast-forward the notes ref to a remote's commit that lacks a block of a job whose record
  we hold, because a teammate's `git notes add -f` makes a descendant of our notes without our
  blocks, and a push (which does not rebuild blocks from records, as pull does) would share the
  loss: such a commit is merged like a diverged one, its own blocks winning (`notes_store.merge_ref`).
- Never update `refs/notes/subtask` without compare-and-swap under `notes.lock`, because concurrent
  note writers lose notes silently.

Lock order: the file lock (outer, held for the whole read-modify-write and its retries), then the
git ref lock (inner, held only for the instant of the swap). The file lock is a leaf: take no other
git-subtask lock while holding it.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from subtask.git.gitobjects import commit_tree
from subtask.model import lazyre
from subtask.model.config import signing_key_of
from subtask.model.errors import fatal
from subtask.model.job import is_job_id
from subtask.state.statefiles import file_lock

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import cast

    import pygit2
else:
    def cast(_type: object, value: object) -> object:
        return value  # what typing.cast does at run time

NOTES_REF = "refs/notes/subtask"
NOTES_MESSAGE = "Notes added by git-subtask"
SIGNATURE_NAME = "git-subtask"
SIGNATURE_EMAIL = "git-subtask@localhost"

_BLOCK_START_RE = lazyre.compile(r"subtask (st-[0-9a-f]{8})(?![0-9a-zA-Z_-])")
_BLOCK_PREFIX = "subtask st-"
_HEX_RE = lazyre.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")

# pygit2.enums.FileMode.BLOB / TREE, as numbers: every function here is handed a pygit2 repository,
# so the library is loaded by whoever calls; importing this module must not load it.
_MODE_BLOB = 0o100644
_MODE_TREE = 0o040000

# Retry budget for the compare-and-swap; the file lock makes contention rare, so these are only
# hit when someone outside git-subtask writes the ref at the same time, or a stale .lock is left.
_CAS_DEADLINE_S = 30.0
_BACKOFF_FIRST_S = 0.002
_BACKOFF_MAX_S = 0.25
_FILE_LOCK_TIMEOUT_S = 120.0

# commit hex -> new note text, or None to delete the note.
Edits = dict[str, "str | None"]


class _TipMoved(Exception):
    """Raised inside a ref transaction to abort it without committing."""


# --------------------------------------------------------------------------- public API


def ensure_ref(repo: pygit2.Repository) -> None:
    """Create refs/notes/subtask as an empty notes commit if missing; safe to race."""
    import pygit2

    if _tip(repo) is not None:
        return
    commit = _commit_tree(repo, repo.TreeBuilder().write(), None)
    # An empty commit on a missing ref: the same CAS as any write, expecting "absent".
    # If someone else created the ref first, the swap fails and there is nothing left to do.
    for delay in _backoff():
        try:
            if _swap(repo, None, commit):
                return
        except pygit2.GitError:
            pass  # ref lock busy: another creator is mid-swap
        if _tip(repo) is not None:
            return
        time.sleep(delay)


def read_note(repo: pygit2.Repository, commit_oid: str) -> str | None:
    """The whole note text on `commit_oid`, or None when it has no note."""
    tip = _tip(repo)
    if tip is None:
        return None
    return _read_text(repo, repo[tip].tree, _hex(repo, commit_oid))


def read_blocks(repo: pygit2.Repository, commit_oid: str) -> dict[str, str]:
    """Job id -> block text (no trailing newline) for the note on `commit_oid`."""
    text = read_note(repo, commit_oid)
    return {} if text is None else parse_note(text)[1]


def set_block(
    repo: pygit2.Repository, commit_oid: str, job_id: str, block: str,
    lock_path: str | os.PathLike[str],
) -> None:
    """Add or replace `job_id`'s block on `commit_oid`; other blocks and human text stay."""
    set_blocks_bulk(repo, [(commit_oid, job_id, block)], lock_path)


def remove_block(
    repo: pygit2.Repository, commit_oid: str, job_id: str, lock_path: str | os.PathLike[str]
) -> None:
    """Drop `job_id`'s block from `commit_oid`; the note goes away when nothing remains."""
    _check_job_id(job_id)
    target = _hex(repo, commit_oid)
    _update(repo, lock_path, lambda tree: _plan(repo, tree, {target: {job_id: None}}))


def set_blocks_bulk(
    repo: pygit2.Repository,
    items: Iterable[tuple[str, str, str]],
    lock_path: str | os.PathLike[str],
) -> int:
    """Write many (commit, job id, block) in one notes commit; returns how many blocks changed."""
    wanted: dict[str, dict[str, str | None]] = {}
    for commit_oid, job_id, block in items:
        wanted.setdefault(_hex(repo, commit_oid), {})[job_id] = normalize_block(job_id, block)
    if not wanted:
        return 0
    return _update(repo, lock_path, lambda tree: _plan(repo, tree, wanted))


def rewrite_blocks(
    repo: pygit2.Repository,
    items: Iterable[tuple[str, str, str]],
    keep: Callable[[str, str], bool],
    lock_path: str | os.PathLike[str],
) -> int:
    """Like `set_blocks_bulk`, and in the same notes commit drop every other block for which
    `keep(commit hex, job id)` is false (human text stays). Returns how many blocks changed."""
    wanted: dict[str, dict[str, str | None]] = {}
    for commit_oid, job_id, block in items:
        wanted.setdefault(_hex(repo, commit_oid), {})[job_id] = normalize_block(job_id, block)

    def plan(tree: pygit2.Tree | None) -> tuple[Edits, int]:
        edits = {commit: dict(jobs) for commit, jobs in wanted.items()}
        if tree is not None:
            for commit_hex in _all_notes(repo, tree):
                for job_id in parse_note(_read_text(repo, tree, commit_hex) or "")[1]:
                    if job_id not in edits.get(commit_hex, {}) and not keep(commit_hex, job_id):
                        edits.setdefault(commit_hex, {})[job_id] = None
        return _plan(repo, tree, edits)

    return _update(repo, lock_path, plan)


# --------------------------------------------------------------------------- note text


def parse_note(text: str) -> tuple[str, dict[str, str]]:
    """Split a note into (human preamble, {job id: block}); a repeated job id keeps the last."""
    preamble: list[str] = []
    blocks: dict[str, list[str]] = {}
    current: list[str] = preamble
    for line in text.splitlines():
        match = _BLOCK_START_RE.match(line) if line.startswith(_BLOCK_PREFIX) else None
        if match:
            current = blocks[match.group(1)] = []
        current.append(line)
    return _strip_lines(preamble), {job: _strip_lines(lines) for job, lines in blocks.items()}


def render_note(preamble: str, blocks: dict[str, str]) -> str | None:
    """Preamble, then blocks by job id, one blank line apart; None when there is nothing."""
    parts = ([preamble] if preamble else []) + [blocks[job] for job in sorted(blocks)]
    return "\n\n".join(parts) + "\n" if parts else None


def normalize_block(job_id: str, block: str) -> str:
    """Check a block can be read back as exactly one block for `job_id`; strip trailing space."""
    _check_job_id(job_id)
    text = _strip_lines(block.splitlines())
    match = _BLOCK_START_RE.match(text)
    if not match or match.group(1) != job_id:
        raise ValueError(f"block must start with 'subtask {job_id}', got {text[:60]!r}")
    # A second block header inside would split the block on the next read.
    if any(line.startswith(_BLOCK_PREFIX) for line in text.splitlines()[1:]):
        raise ValueError(f"block for {job_id} contains another 'subtask st-' line")
    return text


def _strip_lines(lines: list[str]) -> str:
    return "\n".join(line.rstrip() for line in lines).strip("\n")


def _check_job_id(job_id: str) -> None:
    if not is_job_id(job_id):
        raise ValueError(f"bad job id {job_id!r}: expected st- and 8 hex digits")


# --------------------------------------------------------------------------- planning edits


def _plan(
    repo: pygit2.Repository, tree: pygit2.Tree | None, wanted: dict[str, dict[str, str | None]]
) -> tuple[Edits, int]:
    """From the notes tree at the tip, the new note texts and the number of blocks changed."""
    edits: Edits = {}
    changed = 0
    for commit_hex, jobs in wanted.items():
        old_text = _read_text(repo, tree, commit_hex) if tree is not None else None
        preamble, blocks = parse_note(old_text or "")
        n = _apply_jobs(blocks, jobs)
        if n:
            changed += n
            edits[commit_hex] = render_note(preamble, blocks)
    return edits, changed


def _apply_jobs(blocks: dict[str, str], jobs: dict[str, str | None]) -> int:
    """Set (or delete, for None) each job's block in place; count real changes."""
    changed = 0
    for job_id, block in jobs.items():
        if blocks.get(job_id) == block:
            continue  # same text, or deleting what is absent: idempotent
        changed += 1
        if block is None:
            del blocks[job_id]
        else:
            blocks[job_id] = block
    return changed


# --------------------------------------------------------------------------- read-modify-write


def _update(
    repo: pygit2.Repository,
    lock_path: str | os.PathLike[str],
    plan: Callable[[pygit2.Tree | None], tuple[Edits, int]],
) -> int:
    """Under the file lock, CAS-loop: read tip, plan edits on it, commit, swap; return count."""
    import pygit2

    with file_lock(Path(lock_path), timeout=_FILE_LOCK_TIMEOUT_S):
        for delay in _backoff():
            tip = _tip(repo)
            tree = repo[tip].tree if tip is not None else None
            edits, changed = plan(tree)
            if not edits:
                return 0
            new_tree = _edit_notes_tree(repo, tree, edits)
            commit = _commit_tree(repo, new_tree, tip)
            try:
                if _swap(repo, tip, commit):
                    return changed
            except pygit2.GitError:
                pass  # ref lock busy (a `git notes` run, or a stale .lock): retry
            time.sleep(delay)
    raise AssertionError("unreachable: _backoff raises when the deadline passes")


def _backoff() -> Iterable[float]:
    """Jittered exponential delays until the deadline, then a fatal error naming the lock."""
    deadline = time.monotonic() + _CAS_DEADLINE_S
    delay = _BACKOFF_FIRST_S
    while time.monotonic() < deadline:
        yield delay * random.uniform(0.5, 1.5)  # jitter so racing writers spread out
        delay = min(delay * 2, _BACKOFF_MAX_S)
    raise fatal(
        f"could not update {NOTES_REF}: it kept moving or stayed locked for {_CAS_DEADLINE_S:.0f}s",
        hint=f"if no git process is running, remove the stale lock: rm .git/{NOTES_REF}.lock",
    )


def _swap(repo: pygit2.Repository, expected: pygit2.Oid | None, new: pygit2.Oid) -> bool:
    """Point the ref at `new` iff it still points at `expected`; GitError if the lock is busy."""
    try:
        with repo.transaction() as txn:
            txn.lock_ref(NOTES_REF)
            # Re-read under git's ref lock: nobody (git-subtask or git) can move it now.
            if _tip(repo) != expected:
                raise _TipMoved
            _set_target(txn, new)
    except _TipMoved:
        return False
    return True


def _set_target(txn: pygit2.transaction.ReferenceTransaction, new: pygit2.Oid) -> None:
    reflog_message = f"notes: {NOTES_MESSAGE}"
    try:
        txn.set_target(NOTES_REF, new, _signature(), reflog_message)
    except TypeError:
        # pygit2 1.21 hands Signature._pointer (bytes) to cffi and fails before touching the ref;
        # fall back to the repository identity (or libgit2's "unknown") for the reflog line only.
        txn.set_target(NOTES_REF, new, None, reflog_message)


def _tip(repo: pygit2.Repository) -> pygit2.Oid | None:
    ref = repo.references.get(NOTES_REF)
    # (a direct ref: only `_set_target` writes it, with a commit id)
    return None if ref is None else cast("pygit2.Oid", ref.target)


def _commit_tree(
    repo: pygit2.Repository, tree: pygit2.Oid, parent: pygit2.Oid | None
) -> pygit2.Oid:
    """A notes commit on `tree`; no ref is touched here (the swap does that)."""
    return _commit(repo, tree, [] if parent is None else [parent], NOTES_MESSAGE + "\n")


def _commit(repo: pygit2.Repository, tree: pygit2.Oid, parents: list[pygit2.Oid], message: str) -> pygit2.Oid:
    """A notes commit, signed by git when a signing key is configured (see the invariants)."""
    import pygit2

    config = repo.config

    def read(key: str) -> str | None:
        try:
            return config[key]
        except (KeyError, ValueError):
            return None

    if signing_key_of(read):
        return pygit2.Oid(hex=commit_tree(repo.path, str(tree), [str(p) for p in parents], message, sign=True))
    sig = _signature()
    return repo.create_commit(None, sig, sig, message, tree, parents)


def _signature() -> pygit2.Signature:
    import pygit2

    # Fixed identity so notes work on machines without user.name; stamped with the current time.
    return pygit2.Signature(SIGNATURE_NAME, SIGNATURE_EMAIL)


def _hex(repo: pygit2.Repository, commit_oid: str | pygit2.Oid) -> str:
    """Full lowercase hex of a commit; abbreviations and revisions are resolved."""
    import pygit2

    text = str(commit_oid).strip().lower()
    if _HEX_RE.fullmatch(text):
        return text
    return str(repo.revparse_single(str(commit_oid)).peel(pygit2.Commit).id)


# --------------------------------------------------------------------------- notes tree


def _note_paths(
    tree: pygit2.Tree, commit_hex: str, prefix: tuple[str, ...] = ()
) -> list[tuple[str, ...]]:
    """Every path holding a note for `commit_hex`, in any fanout (git concatenates duplicates)."""
    done = sum(len(part) for part in prefix)
    rest = commit_hex[done:]
    found: list[tuple[str, ...]] = []
    if rest in tree and tree[rest].type_str == "blob":
        found.append(prefix + (rest,))
    fan = rest[:2]
    if len(rest) > 2 and fan in tree and tree[fan].type_str == "tree":
        found += _note_paths(cast("pygit2.Tree", tree / fan), commit_hex, prefix + (fan,))
    return found


def _read_text(repo: pygit2.Repository, tree: pygit2.Tree, commit_hex: str) -> str | None:
    paths = _note_paths(tree, commit_hex)
    if not paths:
        return None
    # Blob bytes, not Note.message: surrogateescape keeps non-UTF-8 notes byte-exact on rewrite.
    blobs = [cast("pygit2.Blob", repo[_entry(tree, path).id]) for path in paths]  # (found so)
    texts = [blob.data.decode("utf-8", "surrogateescape") for blob in blobs]
    return "\n".join(texts)


def _entry(tree: pygit2.Tree, path: tuple[str, ...]) -> pygit2.Object:
    for part in path[:-1]:
        tree = cast("pygit2.Tree", tree / part)  # (`_note_paths` found trees there)
    return tree / path[-1]


def _edit_notes_tree(repo: pygit2.Repository, tree: pygit2.Tree | None, edits: Edits) -> pygit2.Oid:
    """Root tree after `edits`; old copies of each note are removed, new ones go to ab/cdef..."""
    changes: dict[tuple[str, ...], pygit2.Oid | None] = {}
    for commit_hex, text in edits.items():
        for path in _note_paths(tree, commit_hex) if tree is not None else []:
            changes[path] = None
        if text is not None:
            blob = repo.create_blob(text.encode("utf-8", "surrogateescape"))
            changes[(commit_hex[:2], commit_hex[2:])] = blob
    root = _edit_tree(repo, tree, changes)
    return root if root is not None else repo.TreeBuilder().write()


def _edit_tree(
    repo: pygit2.Repository,
    tree: pygit2.Tree | None,
    changes: dict[tuple[str, ...], pygit2.Oid | None],
) -> pygit2.Oid | None:
    """Apply path -> blob (None deletes) below `tree`; only touched subtrees are rewritten.

    Returns None for a tree left empty, so emptied fanout directories disappear as in git.
    """
    builder = repo.TreeBuilder(tree) if tree is not None else repo.TreeBuilder()
    nested: dict[str, dict[tuple[str, ...], pygit2.Oid | None]] = {}
    for path, blob in changes.items():
        if len(path) > 1:
            nested.setdefault(path[0], {})[path[1:]] = blob
        elif blob is None:
            _remove(builder, path[0])
        else:
            builder.insert(path[0], blob, _MODE_BLOB)
    for name, sub_changes in nested.items():
        old = builder.get(name)
        is_tree = old is not None and old.type_str == "tree"
        sub_tree = cast("pygit2.Tree", repo[old.id]) if old is not None and is_tree else None
        sub = _edit_tree(repo, sub_tree, sub_changes)
        _remove(builder, name)
        if sub is not None:
            builder.insert(name, sub, _MODE_TREE)
    return builder.write() if len(builder) else None


def _remove(builder: pygit2.TreeBuilder, name: str) -> None:
    if builder.get(name) is not None:
        builder.remove(name)


# --------------------------------------------------------------------------- merging a remote's notes


def merge_ref(
    repo: pygit2.Repository,
    other: str | pygit2.Oid,
    lock_path: str | os.PathLike[str],
    prefer_local: Callable[[str], bool] = lambda job_id: True,
) -> str:
    """Merge the notes commit `other` (e.g. a fetched remote's) into refs/notes/subtask, block by block.

    No note and no block is dropped: notes on different commits are united; on the same commit the
    blocks are united by job id, a job present on both sides in two versions keeps the local one
    when `prefer_local(job_id)` (we hold its record and can rebuild it) else the other's, and
    differing human text is kept from both. The result is a merge commit with both tips as parents,
    so pushing it afterwards is a fast-forward. `other` descending from ours is taken as it is
    (a fast-forward) unless it lacks a block of a job `prefer_local` names (a teammate's
    `git notes add -f` replaced the note): then it is merged too, its version of a block winning.
    Returns "up to date", "fast-forward" or "merged".
    """
    import pygit2

    other_oid = pygit2.Oid(hex=str(other))
    with file_lock(Path(lock_path), timeout=_FILE_LOCK_TIMEOUT_S):
        for delay in _backoff():
            tip = _tip(repo)
            if tip == other_oid or (tip is not None and repo.descendant_of(tip, other_oid)):
                return "up to date"
            if tip is None:
                new, how = other_oid, "fast-forward"
            elif not repo.descendant_of(other_oid, tip):
                new, how = _merge_commit(repo, tip, other_oid, prefer_local), "merged"
            elif _drops_blocks(repo, tip, other_oid, prefer_local):
                # Newer than ours, but rewritten there (`git notes add -f`) without blocks of jobs
                # we hold: those come back; where both sides have a block, the newer one's stays.
                new, how = _merge_commit(repo, tip, other_oid, lambda job_id: False), "merged"
            else:
                new, how = other_oid, "fast-forward"
            try:
                if _swap(repo, tip, new):
                    return how
            except pygit2.GitError:
                pass
            time.sleep(delay)
    raise AssertionError("unreachable: _backoff raises when the deadline passes")


def _drops_blocks(repo: pygit2.Repository, tip: pygit2.Oid, other: pygit2.Oid,
                  ours_to_keep: Callable[[str], bool]) -> bool:
    """Does some note of `tip` hold a block of a job `ours_to_keep` names that the same commit's
    note in `other` lacks?"""
    local_tree, other_tree = repo[tip].tree, repo[other].tree
    other_notes = _all_notes(repo, other_tree)
    for commit_hex, local_blob in _all_notes(repo, local_tree).items():
        if other_notes.get(commit_hex) == local_blob:
            continue
        ours = parse_note(_read_text(repo, local_tree, commit_hex) or "")[1]
        theirs = parse_note(_read_text(repo, other_tree, commit_hex) or "")[1] if commit_hex in other_notes else {}
        if any(ours_to_keep(job_id) for job_id in set(ours) - set(theirs)):
            return True
    return False


def _merge_commit(repo: pygit2.Repository, tip: pygit2.Oid, other: pygit2.Oid,
                  prefer_local: Callable[[str], bool]) -> pygit2.Oid:
    local_tree, other_tree = repo[tip].tree, repo[other].tree
    local_notes, other_notes = _all_notes(repo, local_tree), _all_notes(repo, other_tree)
    edits: Edits = {}
    for commit_hex, other_blob in other_notes.items():
        local_blob = local_notes.get(commit_hex)
        if local_blob == other_blob:
            continue
        other_text = _read_text(repo, other_tree, commit_hex) or ""
        if local_blob is None:
            edits[commit_hex] = other_text
            continue
        local_text = _read_text(repo, local_tree, commit_hex) or ""
        merged = _merge_text(local_text, other_text, prefer_local)
        if merged != local_text:
            edits[commit_hex] = merged
    tree = _edit_notes_tree(repo, local_tree, edits) if edits else local_tree.id
    return _commit(repo, tree, [tip, other], "Notes merged by git-subtask\n")


def _merge_text(local: str, other: str, prefer_local: Callable[[str], bool]) -> str | None:
    local_pre, local_blocks = parse_note(local)
    other_pre, other_blocks = parse_note(other)
    blocks = dict(local_blocks)
    for job_id, block in other_blocks.items():
        if job_id not in blocks or (blocks[job_id] != block and not prefer_local(job_id)):
            blocks[job_id] = block
    pre_lines = local_pre.splitlines()
    pre_lines += [line for line in other_pre.splitlines() if line not in pre_lines]
    return render_note("\n".join(pre_lines).strip("\n"), blocks)


def _all_notes(repo: pygit2.Repository, tree: pygit2.Tree, prefix: str = "") -> dict[str, pygit2.Oid]:
    """commit hex -> note blob id, over any fanout."""
    found: dict[str, pygit2.Oid] = {}
    for entry in tree:
        name = prefix + str(entry.name)  # (an entry of a tree has one)
        if entry.type_str == "tree":
            found.update(_all_notes(repo, cast("pygit2.Tree", repo[entry.id]), name))
        elif _HEX_RE.fullmatch(name):
            found[name] = entry.id
    return found
