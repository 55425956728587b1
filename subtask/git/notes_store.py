"""Review blocks in git notes at refs/notes/subtask, written without losing anyone's note.

Owns: the ref `refs/notes/subtask`, its notes commits and trees, the text format of a note, and
the file lock whose path the caller passes in (e.g. `<state_dir>/notes.lock`). It reads and writes
through a repository's `objects` (`gitobjects`: git's processes and loose objects written here, or
a loaded pygit2), so a worker writes its job's note without importing libgit2; the trees are read
and edited in git's format by `gitobjects.read_tree` and `gitobjects.edit_tree`.

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
  `subtask.sign` is not never (`config.signing_key_of`: the `objects` were made to sign).
- Both backends of `objects` write the same notes commits and trees
  (`tests/test_notes_store.py` runs every test on each).
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

from subtask.git import loose
from subtask.git.gitobjects import edit_tree, read_tree, tree_of_commit
from subtask.model import lazyre
from subtask.model.errors import fatal
from subtask.model.job import is_job_id
from subtask.state.statefiles import file_lock

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from subtask.git.gitobjects import GitObjects, Pygit2Objects

    Objects = GitObjects | Pygit2Objects

NOTES_REF = "refs/notes/subtask"
NOTES_MESSAGE = "Notes added by git-subtask"

_BLOCK_START_RE = lazyre.compile(r"subtask (st-[0-9a-f]{8})(?![0-9a-zA-Z_-])")
_BLOCK_PREFIX = "subtask st-"
_HEX_RE = lazyre.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")

_MODE_BLOB = 0o100644

# Retry budget for the compare-and-swap; the file lock makes contention rare, so these are only
# hit when someone outside git-subtask writes the ref at the same time, or a stale .lock is left.
_CAS_DEADLINE_S = 30.0
_BACKOFF_FIRST_S = 0.002
_BACKOFF_MAX_S = 0.25
_FILE_LOCK_TIMEOUT_S = 120.0

# commit hex -> new note text, or None to delete the note.
Edits = dict[str, "str | None"]
# A notes tree as read: entry name -> (mode, object id).
Tree = dict[bytes, tuple[bytes, str]]


# --------------------------------------------------------------------------- public API


def ensure_ref(objects: Objects) -> None:
    """Create refs/notes/subtask as an empty notes commit if missing; safe to race."""
    if _tip(objects) is not None:
        return
    commit = _commit_tree(objects, objects.write_object("tree", b""), None)
    # An empty commit on a missing ref: the same CAS as any write, expecting "absent".
    # If someone else created the ref first, the swap fails and there is nothing left to do.
    for delay in _backoff():
        if _swap(objects, None, commit) == "ok" or _tip(objects) is not None:
            return
        time.sleep(delay)


def read_note(objects: Objects, commit_oid: str) -> str | None:
    """The whole note text on `commit_oid`, or None when it has no note."""
    tip = _tip(objects)
    if tip is None:
        return None
    return _read_text(objects, _root(objects, tip)[1], _hex(objects, commit_oid))


def read_blocks(objects: Objects, commit_oid: str) -> dict[str, str]:
    """Job id -> block text (no trailing newline) for the note on `commit_oid`."""
    text = read_note(objects, commit_oid)
    return {} if text is None else parse_note(text)[1]


def set_block(
    objects: Objects, commit_oid: str, job_id: str, block: str,
    lock_path: str | os.PathLike[str],
) -> None:
    """Add or replace `job_id`'s block on `commit_oid`; other blocks and human text stay."""
    set_blocks_bulk(objects, [(commit_oid, job_id, block)], lock_path)


def remove_block(
    objects: Objects, commit_oid: str, job_id: str, lock_path: str | os.PathLike[str]
) -> None:
    """Drop `job_id`'s block from `commit_oid`; the note goes away when nothing remains."""
    _check_job_id(job_id)
    target = _hex(objects, commit_oid)
    _update(objects, lock_path, lambda tree: _plan(objects, tree, {target: {job_id: None}}))


def set_blocks_bulk(
    objects: Objects,
    items: Iterable[tuple[str, str, str]],
    lock_path: str | os.PathLike[str],
) -> int:
    """Write many (commit, job id, block) in one notes commit; returns how many blocks changed."""
    wanted = _wanted(objects, items)
    if not wanted:
        return 0
    return _update(objects, lock_path, lambda tree: _plan(objects, tree, wanted))


def rewrite_blocks(
    objects: Objects,
    items: Iterable[tuple[str, str, str]],
    keep: Callable[[str, str], bool],
    lock_path: str | os.PathLike[str],
) -> int:
    """Like `set_blocks_bulk`, and in the same notes commit drop every other block for which
    `keep(commit hex, job id)` is false (human text stays). Returns how many blocks changed."""
    wanted = _wanted(objects, items)

    def plan(tree: Tree | None) -> tuple[Edits, int]:
        edits = {commit: dict(jobs) for commit, jobs in wanted.items()}
        if tree is not None:
            for commit_hex in _all_notes(objects, tree):
                for job_id in parse_note(_read_text(objects, tree, commit_hex) or "")[1]:
                    if job_id not in edits.get(commit_hex, {}) and not keep(commit_hex, job_id):
                        edits.setdefault(commit_hex, {})[job_id] = None
        return _plan(objects, tree, edits)

    return _update(objects, lock_path, plan)


def _wanted(objects: Objects, items: Iterable[tuple[str, str, str]]) -> dict[str, dict[str, str | None]]:
    wanted: dict[str, dict[str, str | None]] = {}
    for commit_oid, job_id, block in items:
        wanted.setdefault(_hex(objects, commit_oid), {})[job_id] = normalize_block(job_id, block)
    return wanted


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


def _plan(objects: Objects, tree: Tree | None, wanted: dict[str, dict[str, str | None]]) -> tuple[Edits, int]:
    """From the notes tree at the tip, the new note texts and the number of blocks changed."""
    edits: Edits = {}
    changed = 0
    for commit_hex, jobs in wanted.items():
        old_text = _read_text(objects, tree, commit_hex) if tree is not None else None
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


def _update(objects: Objects, lock_path: str | os.PathLike[str],
            plan: Callable[[Tree | None], tuple[Edits, int]]) -> int:
    """Under the file lock, CAS-loop: read tip, plan edits on it, commit, swap; return count."""
    with file_lock(Path(lock_path), timeout=_FILE_LOCK_TIMEOUT_S):
        for delay in _backoff():
            tip = _tip(objects)
            root, tree = _root(objects, tip) if tip is not None else (None, None)
            edits, changed = plan(tree)
            if not edits:
                return 0
            commit = _commit_tree(objects, _edit_notes_tree(objects, root, tree, edits), tip)
            if _swap(objects, tip, commit) == "ok":
                return changed
            time.sleep(delay)  # moved (re-read, re-apply), or the ref lock is busy (a `git notes` run, a stale .lock)
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


def _swap(objects: Objects, expected: str | None, new: str) -> str:
    """Point the ref at `new` iff it still points at `expected`, checked under git's ref lock:
    "ok", "moved" or "locked" (another writer holds it)."""
    return objects.update_refs([(NOTES_REF, expected, new)], message=f"notes: {NOTES_MESSAGE}")


def _tip(objects: Objects) -> str | None:
    ref = objects.ref(NOTES_REF)
    return None if ref is None or ref.symbolic else ref.target  # (only `_swap` writes it, with a commit id)


def _root(objects: Objects, commit: str) -> tuple[str, Tree]:
    """The notes tree of a notes commit: its id, and its entries."""
    tree = _tree_id(objects, commit)
    read = read_tree(objects, tree)
    if read is None:
        raise _unreadable(commit)
    return tree, read


def _tree_id(objects: Objects, commit: str) -> str:
    tree = tree_of_commit(objects, commit)
    if tree is None:
        raise _unreadable(commit)
    return tree


def _unreadable(commit: str) -> Exception:
    return fatal(f"{NOTES_REF} names {commit[:12]}, which is not a readable notes commit",
                 hint=f"git log -1 {NOTES_REF}; git fsck")


def _commit_tree(objects: Objects, tree: str, parent: str | None) -> str:
    """A notes commit on `tree`; no ref is touched here (the swap does that)."""
    return objects.commit(tree, [] if parent is None else [parent], NOTES_MESSAGE + "\n")


def _hex(objects: Objects, commit_oid: str) -> str:
    """Full lowercase hex of a commit; abbreviations and revisions are resolved (KeyError: none)."""
    text = str(commit_oid).strip().lower()
    if _HEX_RE.fullmatch(text):
        return text
    found = objects.commit_of(str(commit_oid))
    if found is None:
        raise KeyError(commit_oid)
    return found


# --------------------------------------------------------------------------- notes tree


def _note_paths(objects: Objects, tree: Tree, commit_hex: str, prefix: str = "") -> list[tuple[str, str]]:
    """(path, blob id) of every note for `commit_hex`, in any fanout (git concatenates duplicates)."""
    rest = commit_hex[len(prefix.replace("/", "")):]  # the hex its folders have not taken
    found: list[tuple[str, str]] = []
    entry = tree.get(rest.encode())
    if entry is not None and not loose.is_folder(entry[0]):
        found.append((prefix + rest, entry[1]))
    fan = tree.get(rest[:2].encode())
    if len(rest) > 2 and fan is not None and loose.is_folder(fan[0]):
        below = read_tree(objects, fan[1])
        if below is not None:
            found += _note_paths(objects, below, commit_hex, f"{prefix}{rest[:2]}/")
    return found


def _read_text(objects: Objects, tree: Tree, commit_hex: str) -> str | None:
    notes = _note_paths(objects, tree, commit_hex)
    if not notes:
        return None
    # Blob bytes, decoded with surrogateescape: a non-UTF-8 note stays byte-exact on rewrite.
    blobs = objects.read([blob for _, blob in notes])
    return "\n".join(blob[1].decode("utf-8", "surrogateescape") for blob in blobs if blob is not None)


def _edit_notes_tree(objects: Objects, root: str | None, tree: Tree | None, edits: Edits) -> str:
    """Root tree (`root`, read as `tree`) after `edits`; old copies of each note are removed, new
    ones go to ab/cdef..."""
    changes: dict[str, tuple[str, int] | None] = {}
    for commit_hex, text in edits.items():
        for path, _ in _note_paths(objects, tree, commit_hex) if tree is not None else []:
            changes[path] = None
        if text is not None:
            blob = objects.write_object("blob", text.encode("utf-8", "surrogateescape"))
            changes[f"{commit_hex[:2]}/{commit_hex[2:]}"] = (blob, _MODE_BLOB)
    made = edit_tree(objects, root, changes)
    return made if made is not None else objects.write_object("tree", b"")


# --------------------------------------------------------------------------- merging a remote's notes


def merge_ref(
    objects: Objects,
    other: str,
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
    other = str(other)
    with file_lock(Path(lock_path), timeout=_FILE_LOCK_TIMEOUT_S):
        for delay in _backoff():
            tip = _tip(objects)
            if tip is not None and objects.is_ancestor(other, tip):
                return "up to date"
            if tip is None:
                new, how = other, "fast-forward"
            elif not objects.is_ancestor(tip, other):
                new, how = _merge_commit(objects, tip, other, prefer_local), "merged"
            elif _drops_blocks(objects, tip, other, prefer_local):
                # Newer than ours, but rewritten there (`git notes add -f`) without blocks of jobs
                # we hold: those come back; where both sides have a block, the newer one's stays.
                new, how = _merge_commit(objects, tip, other, lambda job_id: False), "merged"
            else:
                new, how = other, "fast-forward"
            if _swap(objects, tip, new) == "ok":
                return how
            time.sleep(delay)
    raise AssertionError("unreachable: _backoff raises when the deadline passes")


def _drops_blocks(objects: Objects, tip: str, other: str, ours_to_keep: Callable[[str], bool]) -> bool:
    """Does some note of `tip` hold a block of a job `ours_to_keep` names that the same commit's
    note in `other` lacks?"""
    local_tree, other_tree = _root(objects, tip)[1], _root(objects, other)[1]
    other_notes = _all_notes(objects, other_tree)
    for commit_hex, local_blob in _all_notes(objects, local_tree).items():
        if other_notes.get(commit_hex) == local_blob:
            continue
        ours = parse_note(_read_text(objects, local_tree, commit_hex) or "")[1]
        theirs = parse_note(_read_text(objects, other_tree, commit_hex) or "")[1] if commit_hex in other_notes else {}
        if any(ours_to_keep(job_id) for job_id in set(ours) - set(theirs)):
            return True
    return False


def _merge_commit(objects: Objects, tip: str, other: str, prefer_local: Callable[[str], bool]) -> str:
    (root, local_tree), other_tree = _root(objects, tip), _root(objects, other)[1]
    local_notes, other_notes = _all_notes(objects, local_tree), _all_notes(objects, other_tree)
    edits: Edits = {}
    for commit_hex, other_blob in other_notes.items():
        local_blob = local_notes.get(commit_hex)
        if local_blob == other_blob:
            continue
        other_text = _read_text(objects, other_tree, commit_hex) or ""
        if local_blob is None:
            edits[commit_hex] = other_text
            continue
        local_text = _read_text(objects, local_tree, commit_hex) or ""
        merged = _merge_text(local_text, other_text, prefer_local)
        if merged != local_text:
            edits[commit_hex] = merged
    tree = _edit_notes_tree(objects, root, local_tree, edits) if edits else root
    return objects.commit(tree, [tip, other], "Notes merged by git-subtask\n")


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


def _all_notes(objects: Objects, tree: Tree, prefix: str = "") -> dict[str, str]:
    """commit hex -> note blob id, over any fanout."""
    found: dict[str, str] = {}
    for name, (mode, oid) in tree.items():
        text = prefix + name.decode("utf-8", "surrogateescape")
        if loose.is_folder(mode):
            below = read_tree(objects, oid)
            if below is not None:
                found.update(_all_notes(objects, below, text))
        elif _HEX_RE.fullmatch(text):
            found[text] = oid
    return found
