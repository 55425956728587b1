"""Loose objects written as git writes them: the blobs, flat tree and commit of a record, in this
process, for a command that has not loaded pygit2 (`GitObjects.write_commit`): three git
processes fewer for every record a `start`, `cleanup` or `stop` writes. And read back the same
way (`read`, `GitObjects.read`): a `show`, `result`, `wait` or `cleanup`, and the worker, read a
record without a `cat-file` process.

An object is `<kind> <size>\\0<content>`, named by its SHA-1 and kept zlib-compressed in
`objects/<first 2 hex>/<other 38>` of the common git dir. A tree of files lists `100644 <name>\\0`
and the 20 raw bytes of each blob's id, sorted by name; a commit is `tree`, `parent` lines, then
`author` and `committer` (`name <email> <unix time> <+hhmm>`), a blank line and the message as
given: what `git commit-tree` writes with `i18n.commitEncoding=UTF-8` (no encoding header).

Invariants:
- Never write an object where or how git would not: only in a SHA-1 repository (`open_repo`
  refuses another), into `<common dir>/objects` (no `GIT_OBJECT_DIRECTORY`), with git's modes
  (no `core.sharedRepository`) and git's default durability (no `core.fsync` or
  `core.fsyncObjectFiles`), and never a signed commit; anything else is git's to write
  (`usable` says so), because the next git must find the object as it would have written it
  (`tests/test_loose.py::test_a_shared_repository_has_its_objects_written_by_git`).
- An object is whole under its name or absent: its bytes go to a temporary file in its folder,
  linked to its name (renamed where links are refused), the temporary file then removed; one
  that exists is freshened (its mtime), as git does, so a `git gc --prune` racing the writer
  does not take it for old and unreferenced.
- The same files, message, parents and time make the commit id `git commit-tree` and pygit2
  make (`tests/test_loose.py::test_the_loose_writer_writes_the_commit_git_and_pygit2_write`).
- Never believe a loose object file whose content is not its name's, because a job may write into
  `objects/`: `read` hashes what it read and answers None (git's to read) when it differs, is
  not a regular file, is damaged or is bigger than `MAX_READ`
  (`tests/test_loose.py::test_a_damaged_or_packed_loose_object_is_read_by_git`).
"""

from __future__ import annotations

import os
import stat
import time
import zlib  # the reading commands read records with it (`read`)
from collections.abc import Callable

from subtask.state.paths import sha1  # CPython's own SHA-1: hashlib would load OpenSSL
from subtask.state.statefiles import remove_file

TYPE_CHECKING = False  # not `typing`'s: the reading commands load this module
if TYPE_CHECKING:
    from typing import Literal

    from subtask.state.statefiles import StrPath

# Set, git flushes loose objects as they are written: git writes them then (`SETTINGS_ARGS` reads them).
_FLUSHED = ("core.fsync", "core.fsyncobjectfiles")
# core.sharedRepository's values for a repository that is not shared (git's modes, the umask's).
_NOT_SHARED = ("", "false", "umask", "no", "off", "0")


MAX_READ = 64 << 20  # a record's files are small: a bigger object is git's to read
KINDS = (b"blob", b"tree", b"commit", b"tag")


def path_of(common_dir: StrPath, oid: str) -> str:
    """Where git keeps the loose object `oid`: `objects/<first 2 hex>/<other 38>` (a string: a
    listing checks one per ref, and a `Path` join costs ~4 us each)."""
    return f"{os.fspath(common_dir)}/objects/{oid[:2]}/{oid[2:]}"


def read(common_dir: StrPath, oid: str) -> tuple[str, bytes] | None:
    """The object named `oid` (kind, content) from its loose file in `common_dir`, or None: not
    loose here (packed, absent), or not to be believed (see the module's invariants)."""
    try:
        fd = os.open(path_of(common_dir, oid), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # a fifo or a device there would hang or flood the reader
        packed = fh.read(MAX_READ)
    unpacker = zlib.decompressobj()
    try:
        data = unpacker.decompress(packed, MAX_READ + 64)
    except zlib.error:
        return None
    header, nul, content = data.partition(b"\0")
    kind, _, size = header.partition(b" ")
    if not nul or unpacker.unconsumed_tail or not unpacker.eof or kind not in KINDS \
            or size != str(len(content)).encode() or sha1(data).hexdigest() != oid:
        return None
    return kind.decode(), content


def tree_of(commit: bytes) -> str | None:
    """The tree a raw commit names (its first line), or None."""
    first = commit[:46]
    return first[5:45].decode() if first.startswith(b"tree ") and first.endswith(b"\n") else None


def entry_of(tree: bytes, name: bytes) -> str | None | Literal[False]:
    """The id of `name` in a raw tree, None when the tree has no such entry, or False when the
    tree cannot be read here (damaged, or the entry is a submodule's commit): git's to answer."""
    pos = 0
    while pos < len(tree):
        space = tree.find(b" ", pos)
        nul = tree.find(b"\0", space + 1)
        if space < 0 or nul < 0 or nul + 21 > len(tree):
            return False
        if tree[space + 1:nul] == name:
            return False if tree[pos:space] == b"160000" else tree[nul + 1:nul + 21].hex()
        pos = nul + 21
    return None


FOLDER_MODE = b"40000"  # a tree's entry for a folder, as git writes it (no leading zero)


def is_folder(mode: bytes) -> bool:
    """Does a tree entry's mode name a folder (as git writes it, or zero-padded, as a tool may)?"""
    return mode.lstrip(b"0") == FOLDER_MODE


def tree_entries(tree: bytes) -> list[tuple[bytes, bytes, str]] | None:
    """Each entry of a raw tree as (mode, name, id), in its order; None when it is damaged."""
    entries, pos = [], 0
    while pos < len(tree):
        space = tree.find(b" ", pos)
        nul = tree.find(b"\0", space + 1)
        if space < 0 or nul < 0 or nul + 21 > len(tree):
            return None
        entries.append((tree[pos:space], tree[space + 1:nul], tree[nul + 1:nul + 21].hex()))
        pos = nul + 21
    return entries


def tree_bytes(entries: list[tuple[bytes, bytes, str]]) -> bytes:
    """A raw tree of (mode, name, id) entries in git's order, where a folder sorts as its name
    followed by `/` (git's fsck calls any other order a broken tree)."""
    def key(entry: tuple[bytes, bytes, str]) -> bytes:
        mode, name, _ = entry
        return name + b"/" if is_folder(mode) else name

    return b"".join(mode + b" " + name + b"\0" + bytes.fromhex(oid) for mode, name, oid in sorted(entries, key=key))


def usable(read: Callable[[str], str | None]) -> bool:
    """May this process write the repository's objects itself? (`read`: the git settings.)"""
    if os.environ.get("GIT_OBJECT_DIRECTORY"):
        return False
    if (read("core.sharedrepository") or "").strip().lower() not in _NOT_SHARED:
        return False
    return not any(read(key) for key in _FLUSHED)


def write_tree(common_dir: StrPath, files: list[tuple[str, bytes]]) -> str:
    """The blobs of `files` and a tree of them (mode 100644 each); the tree's id."""
    objects = os.path.join(common_dir, "objects")
    entries = sorted((name.encode(), bytes.fromhex(_write(objects, b"blob", data))) for name, data in files)
    return _write(objects, b"tree", b"".join(b"100644 " + name + b"\0" + oid for name, oid in entries))


def write_commit(common_dir: StrPath, tree: str, parents: list[str], message: str, who: str,
                 when: int | None = None) -> str:
    """A commit of `tree` by `who` (`Name <email>`, as author and committer) at `when` (+0000), or
    now at the local offset, as git dates one; its id."""
    if when is None:
        now = int(time.time())
        minutes = time.localtime(now).tm_gmtoff // 60
        stamp = f"{now} {'-' if minutes < 0 else '+'}{abs(minutes) // 60:02d}{abs(minutes) % 60:02d}"
    else:
        stamp = f"{when} +0000"
    head = "".join([f"tree {tree}\n", *(f"parent {p}\n" for p in parents),
                    f"author {who} {stamp}\n", f"committer {who} {stamp}\n\n"])
    return _write(os.path.join(common_dir, "objects"), b"commit", (head + message).encode())


def write_object(common_dir: StrPath, kind: str, content: bytes) -> str:
    """One object of `kind` (blob, tree, commit) holding `content`; its id."""
    return _write(os.path.join(common_dir, "objects"), kind.encode(), content)


def _write(objects: StrPath, kind: bytes, content: bytes) -> str:
    data = kind + b" " + str(len(content)).encode() + b"\0" + content
    oid: str = sha1(data).hexdigest()
    folder = os.path.join(objects, oid[:2])
    path = os.path.join(folder, oid[2:])
    try:
        os.utime(path)
        return oid  # there already: freshened
    except OSError:
        pass
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f"tmp_obj_{os.urandom(6).hex()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(zlib.compress(data, 1))  # core.looseCompression's default: best speed
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass  # another writer's, the same bytes
        except OSError:
            os.replace(temporary, path)  # a file system without hard links
    finally:
        remove_file(temporary)
    return oid
