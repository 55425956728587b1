"""Refs and objects, read and written through pygit2 once it is loaded and through git before.

A command that only reads (`list`, `status`, `show`, `result`, `wait`, `spend`) would spend half
its time importing pygit2 (~60 ms of CPU of its ~120), and `start`, which writes a branch, a pin
and a record commit, a third of its time. So `Repo.objects` hands out one of two backends with the
same questions (the refs under a prefix, one ref, a batch of objects, the commit a revision names)
and the same two writes (a commit of a flat tree of files; a compare-and-swap of several refs at
once): `GitObjects` runs `for-each-ref`, `cat-file --batch`, `rev-parse`, `hash-object`, `mktree`,
`commit-tree` and `update-ref --stdin` (writing the objects of a commit itself, `git/loose.py`,
where git would write them alike); `Pygit2Objects` asks the already loaded library in-process
(the worker, the MCP server, any command that has loaded it). Everything built on them (the
record parser and writer, `list`) is one implementation.

Invariants:
- Both backends answer alike: a missing or unreadable object is None, never an exception, and
  `read` returns one answer per spec in order. tests/test_gitread.py runs every question on both.
- Both write alike: the same files, message, parents and time make the same commit id (the tool's
  fixed identity, UTF-8 with no encoding header), and a ref update is all or nothing, made only
  where every ref is at its expected value (tests/test_gitwrite.py). Never wait for a ref lock
  here: the callers decide how long to wait.
- A commit is signed exactly when the backend was made with `sign` (git has a signing key and
  `subtask.sign` is not never), and then by git itself, `git commit-tree -S` (git's own
  gpg-interface: `ssh-keygen -Y sign`, gpg or gpgsm, agent and literal keys as git handles them),
  from both backends: pygit2 writes the blobs and tree, git the signed commit. A signature that
  fails is an error when the caller must sign (`must_sign`: the first record under
  `subtask.sign=always`), else the commit is written unsigned with a warning, because a job's end
  must never be lost to a missing agent.
- A spec is a full object id, or `<full id>:<path>` (a file in a commit's tree); anything else is
  answered None without reaching git, because a spec is written to git's stdin line by line.
- Never a dangling symbolic ref in `refs`: git's for-each-ref leaves them out, so pygit2 does too.
- Never read a ref from its file but a shared one (`refs/heads`, `refs/tags`, `refs/notes`,
  `refs/subtask*`) holding a plain object id in the common git dir, never through a symlink
  (a job writes its branch's folder) (`GitObjects.ref`); anything
  else is git's to answer, because a per-worktree ref lives in the worktree's own git dir, a
  symbolic or packed one is not that file's content, and another ref backend (reftable) keeps no
  such files (`tests/test_gitread.py::test_a_ref_read_from_its_loose_file_is_what_git_says_packed_loose_or_linked`).
- Never list refs from their files (`GitObjects.refs`) but as git's files backend reads them, the
  loose ones first and then packed-refs for the names they lack, because a `pack-refs` meanwhile
  moves refs from one to the other; and only where every listed ref is plain, under a shared
  prefix, and names a loose object (what git lists for a ref to a missing object is git's to say),
  with no reftable folder and no variable that moves refs or objects: anything else is
  `for-each-ref`'s (`tests/test_gitread.py::test_refs_listed_from_their_files_are_what_for_each_ref_lists`).
- Never let a failed signature lose a job's end, because only `start` may refuse, before anything
  is left behind: under `subtask.sign=auto` (and for every write but a job's first record under
  `always`) a commit git cannot sign is written unsigned, with a warning.
"""

from __future__ import annotations

import os
import sys

from subtask.git import loose, pipes
from subtask.model.dataclass import dataclass
from subtask.model.errors import SubtaskError

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Literal

    import pygit2

    from subtask.state.statefiles import StrPath

_HEX = "0123456789abcdef"
_REF_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.+@=,-"
_SHARED_TOPS = ("heads", "tags", "notes", "subtask")


def is_oid(text: str) -> bool:
    """A whole object id as git writes it: 40 (SHA-1) or 64 (SHA-256) lower-case hex digits."""
    return len(text) in (40, 64) and not text.strip(_HEX)


def _shared_ref(name: str, folder: bool = False) -> bool:
    """A ref every worktree shares (`refs/heads|tags|notes|subtask|subtask-*/…`), by a name git
    would store as a file of that path: no part empty or starting with `.`, no `..`, no lock
    file, nothing but `[A-Za-z0-9_.+@=,-]` (git-check-ref-format, narrowed); `folder`: the name
    of a folder of them, ending in `/`."""
    if folder:
        if not name.endswith("/"):
            return False
        name = name[:-1]
    parts = name.split("/")
    if len(parts) < (2 if folder else 3) or parts[0] != "refs" or ".." in name or name.endswith(".lock"):
        return False
    top = parts[1]
    if top not in _SHARED_TOPS and not (top.startswith("subtask-") and len(top) > 8
                                        and not top[8:].strip("abcdefghijklmnopqrstuvwxyz-")):
        return False
    return all(part and part[0] != "." and not part.strip(_REF_CHARS) for part in parts[2:])


# The identity of every commit the tool writes for itself (records, notes, groups).
TOOL_NAME, TOOL_EMAIL = "git-subtask", "git-subtask@localhost"

RefUpdate = tuple[str, "str | None", "str | None"]  # (name, expected old id or None: absent, new id or None: delete)
# Words of git's refusals (git 2.3x, LC_ALL=C) that mean "the ref is not where you expected";
# any other failure is a lock another writer holds (or a dead one left), as pygit2 reports it.
_MOVED = ("but expected", "already exists", "is missing", "unable to resolve")


@dataclass(frozen=True)
class Ref:
    """One ref and what it points at, as either backend of `Repo.objects` reads it."""

    name: str
    target: str  # an object id; for a symbolic ref, the name of the ref it points at
    symbolic: bool = False


def valid_spec(spec: str) -> bool:
    oid, _, path = spec.partition(":")
    return is_oid(oid) and "\n" not in path


def commit_signed(raw: bytes) -> bool:
    """Does a raw commit object carry a signature header (what git would check, `signing.check`)?"""
    headers = b"\n" + raw.partition(b"\n\n")[0]
    return b"\ngpgsig " in headers or b"\ngpgsig-sha256 " in headers


def commit_message(raw: bytes) -> bytes:
    """The message of a raw commit object (what follows the headers' blank line)."""
    return raw.partition(b"\n\n")[2]


SIGN_HINT = ("git signs these commits as it signs yours (git config user.signingKey, gpg.format); "
             "try: git commit --allow-empty -S -m test   (or: git config subtask.sign never)")


def commit_tree(git_dir: StrPath, tree: str, parents: list[str], message: str, *, when: int | None = None,
                sign: bool = False, must_sign: bool = False) -> str:
    """`git commit-tree` of `tree` with the tool's identity: signed by git when `sign` (see the
    module's invariants for what a failed signature does)."""
    base = ["git", "--git-dir", str(git_dir), "-c", "i18n.commitEncoding=UTF-8", "commit-tree"]
    date = {} if when is None else {"GIT_AUTHOR_DATE": f"@{when} +0000", "GIT_COMMITTER_DATE": f"@{when} +0000"}
    env = dict(os.environ, GIT_AUTHOR_NAME=TOOL_NAME, GIT_AUTHOR_EMAIL=TOOL_EMAIL, GIT_COMMITTER_NAME=TOOL_NAME,
               GIT_COMMITTER_EMAIL=TOOL_EMAIL, **date)
    rest = [tree, *(arg for parent in parents for arg in ("-p", parent))]
    import subprocess  # a writing command's (its environment): the reading ones spawn through `pipes`

    if sign or must_sign:
        proc = subprocess.run([*base, "-S", *rest], input=message, capture_output=True, text=True, env=env, check=False)
        if proc.returncode == 0:
            return proc.stdout.strip()
        words = " ".join(proc.stderr.split())[-300:] or f"git commit-tree -S exited {proc.returncode}"
        if must_sign or not sign:
            raise SubtaskError("fatal", f"could not sign a git-subtask commit, and subtask.sign is always: {words}",
                               hint=SIGN_HINT)
        _warn_unsigned(words)
    proc = subprocess.run([*base, "--no-gpg-sign", *rest], input=message, capture_output=True, text=True, env=env,
                          check=False)
    if proc.returncode != 0:
        raise SubtaskError("fatal", f"git commit-tree failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


_warned = False


def _warn_unsigned(words: str) -> None:
    global _warned
    if not _warned:
        _warned = True

        print(f"git-subtask: warning: could not sign a commit, wrote it unsigned: {words}\nhint: {SIGN_HINT}",
              file=sys.stderr)


class GitObjects:
    """Refs and objects through the git binary: a few small processes instead of a library import.

    One ref is read from its loose file when it has one holding an object id (git's files backend
    keeps shared refs in the common git dir, written by rename, so a loose file is always whole
    and wins over a packed entry); anything else (packed, symbolic, another ref backend, a
    per-worktree ref) is asked of git. A `show` or `cleanup` reads a record's ref several times:
    each read was a `for-each-ref` process."""

    def __init__(self, git_dir: StrPath, sign: bool = False, common_dir: StrPath | None = None, *, loose: bool = False):
        self._git_dir = git_dir
        self._common_dir = common_dir
        self._sign = sign
        self._base = ["git", "--git-dir", str(git_dir)]
        self.loose = loose  # objects written in-process (`git/loose.py`; the caller checked `loose.usable`)

    def refs(self, *prefixes: str, wanted: Callable[[str], bool] | None = None) -> list[Ref]:
        """The refs under any of `prefixes` (each ending in `/`), in one listing: read from their
        files when git's files backend keeps them plainly there (`_listed_from_files`), else
        `git for-each-ref`'s. `wanted`: the names the caller needs; others may be left out (a
        file listing reads none of them, git's lists them all)."""
        listed = self._listed_from_files(prefixes, wanted)
        return listed if listed is not None else self._for_each_ref(*prefixes)

    def _listed_from_files(self, prefixes: tuple[str, ...], wanted: Callable[[str], bool] | None = None,
                           ) -> list[Ref] | None:
        """What `for-each-ref` lists under `prefixes`, read as git's files backend reads it: the
        loose refs first, then packed-refs for the names they do not have (so a `pack-refs`
        meanwhile loses none), sorted by name. None, for git to answer, at anything else: another
        ref backend, a link, a symbolic ref or an unexpected name or content, more than
        `_LISTED_AT_MOST` names, or a ref naming an object that is not a loose file here (what a
        ref to a missing object lists as is git's to say, and a packed object git's to vouch for)."""
        common = self._common_dir
        if common is None or any(os.environ.get(name) for name in _OTHER_REFS_OR_OBJECTS) \
                or os.path.lexists(os.path.join(common, "reftable")) \
                or not all(_shared_ref(p, folder=True) for p in prefixes):
            return None
        found: dict[str, str] = {}
        left = [_LISTED_AT_MOST]
        if not all(_read_loose_refs(common, prefix.rstrip("/"), found, left, wanted) for prefix in prefixes):
            return None
        packed = _read_packed_refs(common, prefixes)
        if packed is None:
            return None
        for name, oid in packed.items():
            if wanted is None or wanted(name):
                found.setdefault(name, oid)
        if not all(os.path.isfile(loose.path_of(common, oid)) for oid in set(found.values())):
            return None
        return [Ref(name, found[name]) for name in sorted(found)]

    def ref(self, name: str) -> Ref | None:
        loose = self._loose_ref(name)
        if loose is not None:
            return loose
        return next((ref for ref in self._for_each_ref(name) if ref.name == name), None)

    def _loose_ref(self, name: str) -> Ref | None:
        if self._common_dir is None or not _shared_ref(name):
            return None
        try:  # a job may write its branch's file: a symlink there is git's to read, not ours
            oid = _ref_file(os.path.join(self._common_dir, name))
        except OSError:  # none (packed, deleted), not a folder there (reftable), a symlink
            return None
        return Ref(name, oid) if is_oid(oid) else None

    def _for_each_ref(self, *patterns: str) -> list[Ref]:
        out = pipes.run([*self._base, "for-each-ref", "--format=%(refname)%00%(objectname)%00%(symref)",
                         *patterns])[1]
        found = []
        for line in out.decode("utf-8", "surrogateescape").splitlines():
            name, target, symref = (line.split("\0") + ["", ""])[:3]
            found.append(Ref(name, symref, True) if symref else Ref(name, target))
        return found

    def read(self, specs: list[str]) -> list[tuple[str, bytes] | None]:
        """What `git cat-file --batch` answers for each spec (`<oid>` or `<oid>:<path>`); a
        record's objects, loose, read here (`loose.read`), the rest by one `cat-file`."""
        asked = [spec for spec in specs if valid_spec(spec)]
        answers: dict[str, tuple[str, bytes] | None] = {}
        if self._common_dir is not None and not os.environ.get("GIT_OBJECT_DIRECTORY"):
            for spec in asked:
                found = self._read_loose(self._common_dir, spec)
                if found is not False:
                    answers[spec] = found
        rest = [spec for spec in asked if spec not in answers]
        if rest:
            out = pipes.run([*self._base, "cat-file", "--batch"], input="".join(f"{s}\n" for s in rest).encode())[1]
            answers.update(_parse_batch(rest, out))
        return [answers.get(spec) for spec in specs]

    @staticmethod
    def _read_loose(common: StrPath, spec: str) -> tuple[str, bytes] | None | Literal[False]:
        """`<oid>`, or `<oid>:<name>` of a name in its tree (no folder), from loose objects: the
        answer (None: no such name in that tree), or False when it is git's to give."""
        oid, colon, name = spec.partition(":")
        found = loose.read(common, oid) if len(oid) == 40 else None
        if found is None or not colon:
            return False if found is None else found
        if not name or "/" in name or name in (".", ".."):
            return False
        if found[0] == "commit":
            tree = loose.tree_of(found[1])
            found = loose.read(common, tree) if tree else None
        if found is None or found[0] != "tree":
            return False
        entry = loose.entry_of(found[1], name.encode())
        if not isinstance(entry, str):
            return entry
        return loose.read(common, entry) or False

    def commit_of(self, rev: str) -> str | None:
        if rev == "HEAD":
            found = self._head_commit_from_files()
            if found is not None:
                return found
        code, out, _ = pipes.run([*self._base, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"])
        commit = out.decode("ascii", "replace").strip()
        return commit if code == 0 and commit else None

    def _head_commit_from_files(self) -> str | None:
        """The commit HEAD names, as git's files backend has it: HEAD's file (a commit's id, or
        a branch whose loose ref holds one) and that commit's loose object; None, for git to
        say, at anything else (a packed branch or commit, an unborn branch, a link, a tag)."""
        common = self._common_dir
        if common is None or any(os.environ.get(name) for name in _OTHER_REFS_OR_OBJECTS):
            return None
        try:
            line = _ref_file(os.path.join(self._git_dir, "HEAD"))
        except OSError:
            return None
        if not is_oid(line):
            branch = self._loose_ref(line.removeprefix("ref: ")) if line.startswith("ref: refs/heads/") else None
            if branch is None:
                return None
            line = branch.target
        found = loose.read(common, line) if len(line) == 40 else None
        return line if found is not None and found[0] == "commit" else None

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        """Does `descendant` carry `ancestor` (itself included)? False when either is unknown."""
        if ancestor == descendant:
            return True
        return pipes.run([*self._base, "merge-base", "--is-ancestor", ancestor, descendant])[0] == 0

    def write_commit(self, files: list[tuple[str, bytes]], message: str, parents: list[str],
                     when: int | None = None, must_sign: bool = False) -> str:
        tree = loose.write_tree(self._common_dir or self._git_dir, files) if self.loose else self._tree_of_files(files)
        return self.commit(tree, parents, message, when, must_sign)

    def commit(self, tree: str, parents: list[str], message: str, when: int | None = None,
               must_sign: bool = False) -> str:
        """A commit of `tree` with the tool's identity, signed as the module's invariants say."""
        if self.loose and not (self._sign or must_sign):
            return loose.write_commit(self._common_dir or self._git_dir, tree, parents, message,
                                      f"{TOOL_NAME} <{TOOL_EMAIL}>", when)
        return commit_tree(self._git_dir, tree, parents, message, when=when, sign=self._sign, must_sign=must_sign)

    def write_object(self, kind: str, data: bytes) -> str:
        """One object of `kind` (blob, tree, commit) holding `data`; its id."""
        if self.loose:
            return loose.write_object(self._common_dir or self._git_dir, kind, data)
        code, out, err = pipes.run([*self._base, "hash-object", "-w", "-t", kind, "--stdin"], input=data)
        if code != 0:
            raise SubtaskError("fatal", f"git hash-object failed: {err.decode(errors='replace').strip()}")
        return out.decode().strip()

    def _tree_of_files(self, files: list[tuple[str, bytes]]) -> str:
        import tempfile  # only a writing command pays its import (shutil, random)

        with tempfile.TemporaryDirectory(prefix="subtask-blobs-") as tmp:
            paths = []
            for i, (_, data) in enumerate(files):
                paths.append(os.path.join(tmp, str(i)))
                with open(paths[-1], "wb") as fh:
                    fh.write(data)
            blobs = self._run("hash-object", "-w", "--no-filters", "--stdin-paths",
                              input="".join(f"{p}\n" for p in paths)).split()
        return self._run("mktree", input="".join(f"100644 blob {oid}\t{name}\n"
                                                 for (name, _), oid in zip(files, blobs, strict=True))).strip()

    def update_refs(self, updates: list[RefUpdate], message: str = "git-subtask") -> str:
        lines = []
        for name, old, new in updates:
            if new is None:
                lines.append(f"delete {name} {old}" if old else f"verify {name}")
            else:
                lines.append(f"update {name} {new} {old}" if old else f"create {name} {new}")
        code, _, err = pipes.run([*self._base, "-c", "core.filesRefLockTimeout=0", "update-ref", "-m", message,
                                  "--stdin"], input="".join(f"{line}\n" for line in lines).encode(),
                                 env=dict(os.environ, LC_ALL="C", LANGUAGE="C"))
        if code == 0:
            return "ok"
        refused = err.decode(errors="replace")
        return "moved" if any(words in refused for words in _MOVED) else "locked"

    def _run(self, *args: str, input: str) -> str:
        code, out, err = pipes.run([*self._base, *args], input=input.encode())
        if code != 0:
            command = next(arg for arg in args if not arg.startswith("-") and "=" not in arg)
            raise SubtaskError("fatal", f"git {command} failed: {err.decode(errors='replace').strip()}")
        return out.decode()


def tree_of_commit(objects: GitObjects | Pygit2Objects, commit: str) -> str | None:
    """The id of the tree the commit `commit` (an object id) holds; None when it is no readable commit."""
    found = objects.read([commit])[0]
    return loose.tree_of(found[1]) if found is not None and found[0] == "commit" else None


def read_tree(objects: GitObjects | Pygit2Objects, tree: str) -> dict[bytes, tuple[bytes, str]] | None:
    """A tree's entries, name -> (mode as git writes it, object id); None when it is not a readable tree."""
    found = objects.read([tree])[0]
    entries = loose.tree_entries(found[1]) if found is not None and found[0] == "tree" else None
    return None if entries is None else {name: (mode, oid) for mode, name, oid in entries}


def edit_tree(objects: GitObjects | Pygit2Objects, tree: str | None,
              changes: Mapping[str, tuple[str, int] | None]) -> str | None:
    """`tree` (None: an empty one) with each path (`a/b/c`) set to (object id, mode) or removed
    (None), by either backend; only the trees on a changed path are written. None when nothing is
    left (a folder emptied goes, as in git)."""
    entries = read_tree(objects, tree) if tree is not None else {}
    if entries is None:
        raise SubtaskError("fatal", f"tree {tree} cannot be read", hint="git fsck")
    below: dict[bytes, dict[str, tuple[str, int] | None]] = {}
    for path, value in changes.items():
        name, _, rest = path.partition("/")
        key = name.encode("utf-8", "surrogateescape")
        if rest:
            below.setdefault(key, {})[rest] = value
        elif value is None:
            entries.pop(key, None)
        else:
            entries[key] = (f"{value[1]:o}".encode(), value[0])
    for key, inner in below.items():
        old = entries.pop(key, None)
        made = edit_tree(objects, old[1] if old is not None and loose.is_folder(old[0]) else None, inner)
        if made is not None:
            entries[key] = (loose.FOLDER_MODE, made)
    if not entries:
        return None
    return objects.write_object("tree", loose.tree_bytes([(mode, name, oid) for name, (mode, oid) in entries.items()]))


_LISTED_AT_MOST = 256  # names under the prefixes seen here; beyond, git's own listing is the faster
# What moves refs or objects away from the files read here: git's to answer under them.
_OTHER_REFS_OR_OBJECTS = ("GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE",
                          "GIT_REF_PARANOIA")


def _read_loose_refs(common: StrPath, top: str, found: dict[str, str], left: list[int],
                     wanted: Callable[[str], bool] | None = None) -> bool:
    """The loose refs in folder `top` and below into `found` (name: object id); False when one is
    git's to read (`GitObjects._listed_from_files`). `left[0]`: how many more names (files and
    folders) may be seen: the names are all found before any file is read, so a repository with
    more refs than that goes to git having read none of them."""
    root = os.fspath(common)  # strings, not `Path` joins (~4 us each, several per ref)
    if os.path.islink(f"{root}/{top}"):
        return False
    folders, files = [top], []
    while folders:
        folder = folders.pop()
        try:
            entries = list(os.scandir(f"{root}/{folder}"))
        except FileNotFoundError:
            continue  # no ref under it (a missing folder, or one deleted meanwhile)
        except OSError:
            return False  # a file where a folder would be (reftable's placeholder), or unreadable
        left[0] -= len(entries)
        if left[0] < 0:
            return False
        for entry in entries:
            name = f"{folder}/{entry.name}"
            if entry.is_symlink():
                return False
            if entry.is_dir(follow_symlinks=False):
                folders.append(name)
            elif not entry.name.endswith(".lock"):  # a ref being written: its own file (or packed-refs) says
                if not _shared_ref(name) or not entry.is_file(follow_symlinks=False):
                    return False
                files.append((name, entry.path))
    for name, path in files:
        if wanted is not None and not wanted(name):
            continue  # the caller does not need it: its file is not read
        try:
            oid = _ref_file(path)
        except FileNotFoundError:
            continue  # deleted meanwhile (packed first, then removed: packed-refs says the rest)
        except OSError:
            return False
        if len(oid) != 40 or not is_oid(oid):
            return False  # symbolic, damaged, or another hash
        found[name] = oid
    return True


def _ref_file(path: StrPath) -> str:
    """A loose ref file's content, stripped; OSError when it is not there or is a link."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as fh:
        return fh.read(100).strip().decode("ascii", "replace")


def _read_packed_refs(common: StrPath, prefixes: tuple[str, ...]) -> dict[str, str] | None:
    """packed-refs' refs under `prefixes` (name: object id), {} without the file; None when it
    is git's to read (a link, too big, a line that is not `<id> <name>`, `^<peeled id>` or a
    comment)."""
    try:
        fd = os.open(os.path.join(common, "packed-refs"), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return {}
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(_PACKED_AT_MOST + 1)
    if len(data) > _PACKED_AT_MOST:
        return None
    packed: dict[str, str] = {}
    for line in data.decode("utf-8", "surrogateescape").splitlines():
        if line.startswith(("#", "^")):
            continue
        oid, space, name = line.partition(" ")
        if not space or len(oid) != 40 or not is_oid(oid):
            return None
        if name.startswith(prefixes):
            if not _shared_ref(name):
                return None
            packed[name] = oid
    return packed


_PACKED_AT_MOST = 4 << 20


def _parse_batch(asked: list[str], out: bytes) -> dict[str, tuple[str, bytes] | None]:
    """`git cat-file --batch` output: per request `<oid> <type> <size>\\n<data>\\n` or `<spec> missing`."""
    answers: dict[str, tuple[str, bytes] | None] = {}
    pos = 0
    for spec in asked:
        end = out.find(b"\n", pos)
        if end < 0:
            break  # git stopped early (a damaged pack): the rest are unreadable
        header = out[pos:end].split()
        pos = end + 1
        if len(header) == 3 and header[2].isdigit():
            size = int(header[2])
            answers[spec] = (header[1].decode(), out[pos:pos + size])
            pos += size + 1
        else:
            answers[spec] = None  # missing, ambiguous or not a file in that tree
    return answers


class Pygit2Objects:
    """The same questions asked of a loaded pygit2 repository (no process)."""

    def __init__(self, git: pygit2.Repository, sign: bool = False):
        self._git = git
        self._sign = sign

    def refs(self, *prefixes: str, wanted: Callable[[str], bool] | None = None) -> list[Ref]:
        found = []  # `wanted` is a file listing's saving: every ref under the prefixes is listed here
        for ref in self._git.references.iterator():
            if ref.name.startswith(prefixes):
                found.extend(self._ref(ref))
        return found

    def ref(self, name: str) -> Ref | None:
        import pygit2

        try:
            ref = self._git.references.get(name)
        except (pygit2.GitError, ValueError):
            return None  # a loose ref file that names no object: git's for-each-ref skips it too
        return next(iter(self._ref(ref)), None) if ref is not None else None

    def _ref(self, ref: pygit2.Reference) -> list[Ref]:
        from pygit2.enums import ReferenceType

        target = ref.target  # an Oid, or the name of the ref a symbolic one points at
        if ref.type == ReferenceType.DIRECT or not isinstance(target, str):
            return [Ref(ref.name, str(target))]
        if self._git.references.get(target) is None:
            return []  # dangling: git's for-each-ref leaves it out too
        return [Ref(ref.name, target, True)]

    def read(self, specs: list[str]) -> list[tuple[str, bytes] | None]:
        return [self._read_one(spec) if valid_spec(spec) else None for spec in specs]

    def _read_one(self, spec: str) -> tuple[str, bytes] | None:
        import pygit2

        oid, _, path = spec.partition(":")
        try:
            obj = self._git.get(oid)
            if obj is not None and path:
                if not isinstance(obj, pygit2.Commit) or path not in obj.tree:
                    return None
                obj = self._git.get(obj.tree[path].id)
            if obj is None:
                return None
            return obj.type_str, obj.read_raw()
        except (ValueError, KeyError, pygit2.GitError):
            return None

    def commit_of(self, rev: str) -> str | None:
        import pygit2

        try:
            return str(self._git.revparse_single(rev).peel(pygit2.Commit).id)
        except (KeyError, ValueError, pygit2.GitError, pygit2.InvalidSpecError):
            return None

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        import pygit2

        if ancestor == descendant:
            return True
        try:
            return self._git.descendant_of(descendant, ancestor)
        except (KeyError, ValueError, pygit2.GitError):
            return False

    def write_commit(self, files: list[tuple[str, bytes]], message: str, parents: list[str],
                     when: int | None = None, must_sign: bool = False) -> str:
        import pygit2

        git = self._git
        builder = git.TreeBuilder()
        for name, data in files:
            builder.insert(name, git.create_blob(data), pygit2.GIT_FILEMODE_BLOB)
        return self.commit(str(builder.write()), parents, message, when, must_sign)

    def commit(self, tree: str, parents: list[str], message: str, when: int | None = None,
               must_sign: bool = False) -> str:
        import pygit2

        if self._sign or must_sign:
            return commit_tree(self._git.path, tree, parents, message, when=when, sign=self._sign,
                               must_sign=must_sign)
        sig = (pygit2.Signature(TOOL_NAME, TOOL_EMAIL) if when is None else
               pygit2.Signature(TOOL_NAME, TOOL_EMAIL, when, 0))
        return str(self._git.create_commit(None, sig, sig, message, pygit2.Oid(hex=tree),
                                           [pygit2.Oid(hex=p) for p in parents]))

    def write_object(self, kind: str, data: bytes) -> str:
        import pygit2

        return str(self._git.write(pygit2.enums.ObjectType[kind.upper()], data))

    def update_refs(self, updates: list[RefUpdate], message: str = "git-subtask") -> str:
        import pygit2

        git = self._git

        class _Moved(Exception):
            pass

        try:
            with git.transaction() as txn:
                for name, _, _ in updates:
                    txn.lock_ref(name)
                for name, old, _ in updates:
                    ref = git.references.get(name)
                    if (str(ref.target) if ref is not None else None) != old:
                        raise _Moved
                for name, _, new in updates:
                    if new is not None:
                        txn.set_target(name, new, message=message)
                    elif git.references.get(name) is not None:
                        txn.remove(name)
        except _Moved:
            return "moved"
        except pygit2.GitError:
            return "locked"  # another writer holds a ref lock (or a dead one left it)
        return "ok"
