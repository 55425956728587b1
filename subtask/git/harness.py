"""Where a job's worktree differs from a trusted tree in its harness (the files that judge its verify).

A verify's verdict is worth what its judge is: if the job can edit the tests, the test runner's
configuration or the verify command's own script, "verify passed" says only that the job made
its own judge agree. So the harness comes from a tree the caller trusts (the job's base, the
landing target's tip) and the job's worktree is compared with it here. Which files are harness
(`resolve`, `rule_for`: the globs per ecosystem, the verify command's own script) is
`git/harness_rule.py`'s.

- `compare`: the trusted tree against the worktree on disk: harness files the job changed or
  deleted (to be written back from the trusted tree), harness files the job added, committed or
  not, ignored ones included (to be moved aside), and files the job added that would shadow the
  test runner, the standard library or an installed distribution on the verify's import path.
- `digest`: the harness source of a verify, `snapshot`: what a fresh worktree held before the job
  ran, `overlaid_tree`: the tree verify ran on.

Pure: it reads git objects and the worktree's files and writes nothing there (`overlaid_tree`
writes tree objects); applying the comparison and running verify is `ops/judge.py`'s.

Invariants:
- Never decide that a harness file is unchanged from git's index or status, because the job
  writes the index (`update-index --skip-worktree`, forged stat data): the bytes on disk are
  hashed (`harness.compare`; `judge::test_a_job_that_games_the_tests_never_ends_verify_passed[a
  test edited behind skip-worktree]`).
- Never follow a symlink below the worktree: a folder the job replaced by a link is itself a
  difference (`blockers`), so nothing is ever read or written through it.
- Never write or move through a link below the worktree when laying the harness, because a job
  (or a commit checked out in a scratch) can make `tests` a link to any folder: a folder that is a
  link or a file is moved aside first (`_Disk.blocker`;
  `judge::test_a_job_that_replaces_the_tests_folder_by_a_link_*`).
"""

from __future__ import annotations

import copy
import json
import os
import stat
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from subtask.git import gitobjects, pipes
from subtask.git.gitobjects import edit_tree
from subtask.git.gitrepo import tree_of
from subtask.git.harness_rule import JOB, Rule, judged_by_job, rule_for
from subtask.model import lazyre
from subtask.model.dataclass import dataclass, field

TYPE_CHECKING = False  # not `typing`'s: its names are for mypy only, never imported at run time
if TYPE_CHECKING:
    from typing import Any

    from subtask.git.gitrepo import Repo

# Folders of what a runner cached and reads back: Python's bytecode (pytest's rewritten tests
# among it) beside harness files, pytest's --lf/--sw state. Moved aside, never reported.
BYTECODE = "__pycache__"
CACHES = frozenset({".pytest_cache"})
# Folders never walked for files the job added: git's own, and installed or generated trees no
# test runner collects from (a virtualenv is known by its pyvenv.cfg).
PRUNED = frozenset({".git", "node_modules", BYTECODE, *CACHES, ".tox", ".nox", ".mypy_cache", ".ruff_cache", ".hg",
                    ".svn"})
RUNNERS = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "unittest", "nose", "nose2", "doctest",
                     "xdist", "coverage"})
SITE_HOOKS = ("sitecustomize", "usercustomize")
IMPORT_DIRS = ("", "src")  # where `python -m pytest` and a src layout import from, beside PYTHONPATH



# ---------------------------------------------------------------- the trusted tree

Blob = tuple[str, int, int]  # a blob of a tree as `flatten` lists it: (object id, mode, size in bytes)
_FLAT: dict[str, dict[str, Blob]] = {}  # the last trees flattened, by commit id: a worker asks thrice
_FLAT_KEPT = 4


def flatten(repo: Repo, commit: str) -> dict[str, Blob]:
    """Every blob of `commit`'s tree (links too): {path: Blob} (submodules left out), as one
    `git ls-tree -r -l` lists them (no libgit2: a judged job's worker reads its harness through
    git, as a plain one does its end)."""
    found = _FLAT.get(commit)
    if found is not None:
        return found
    code, out, err = pipes.run(["git", "--git-dir", str(repo.git_dir), "ls-tree", "-r", "-l", "-z", "--full-tree",
                                commit])
    if code != 0:
        raise KeyError(f"{commit}: {err.decode(errors='replace').strip()}")
    found = {}
    for entry in out.split(b"\0"):
        meta, tab, path = entry.partition(b"\t")
        fields = meta.split()
        if tab and len(fields) == 4 and fields[1] == b"blob":
            found[path.decode("utf-8", "surrogateescape")] = (fields[2].decode(), int(fields[0], 8), int(fields[3]))
    if gitobjects.is_oid(commit):
        while len(_FLAT) >= _FLAT_KEPT:
            _FLAT.pop(next(iter(_FLAT)))
        _FLAT[commit] = found
    return found


_DIGESTS: dict[tuple[str, tuple[str, ...] | None, str | None], str] = {}


def digest(repo: Repo, trusted: str, asked: list[str] | None, command: str | None) -> str:
    """The harness source of a verify judged by the commit `trusted`, as one digest: the rule
    asked for and every trusted file that judges (path, blob, mode; a file of which only a part is
    harness counts whole, so a change to any of it is a new source, never a missed one). `job`
    for a verify judged by its own tests. Two verifies of one tree with the same digest run on the
    same files (`verified.py`). Cached by the trusted tree, which never changes meaning."""
    if judged_by_job(asked):
        return JOB
    tree = tree_of(repo, trusted)
    cache_key = (tree, tuple(asked) if asked is not None else None, command)
    found = _DIGESTS.get(cache_key)
    if found is None:
        files = flatten(repo, trusted)
        rule = rule_for(asked, files, command)
        import hashlib  # a harness's, when one is asked: OpenSSL's ~3 ms are no plain job's

        h = hashlib.sha256(repr(asked).encode())
        for path in sorted(files):
            if rule.matches(path) or rule.section_of(path) is not None:
                oid, mode, _ = files[path]
                h.update(f"\n{path}\0{oid}\0{mode:o}".encode())
        found = _DIGESTS[cache_key] = h.hexdigest()
    return found


# ---------------------------------------------------------------- the comparison

@dataclass
class Put:
    """A harness path written back from the trusted tree (`content`: a composed file, else the blob)."""

    path: str
    oid: str
    mode: int
    why: str  # changed | deleted
    content: bytes | None = None
    section: str | None = None  # the part of the file that is harness (pyproject.toml's tool.pytest)


@dataclass
class Comparison:
    """What `compare` found: where the job's worktree differs from the trusted tree in its harness."""

    trusted: str
    rule: Rule
    puts: list[Put] = field(default_factory=list)
    aside: list[str] = field(default_factory=list)  # harness files the job added: moved aside
    uncommitted: set[str] = field(default_factory=set)  # of those, the ones not in its head
    quiet: list[str] = field(default_factory=list)  # caches (folders) moved aside, never reported
    blockers: list[str] = field(default_factory=list)  # a file or link where a harness folder was
    shadows: list[tuple[str, str, str]] = field(default_factory=list)  # (path, module name, kind)
    hashed: int = 0  # harness files read to compare them
    trusted_files: int = 0  # harness files of the trusted tree: 0 when it holds no tests to judge with

    @property
    def touched(self) -> bool:
        """Did the job change, delete or add any harness path (what a second run of its own tests reports)?"""
        return bool(self.puts or self.aside or self.blockers)

    @property
    def empty(self) -> bool:
        return not (self.touched or self.quiet)

    def unused(self) -> list[str]:
        """The harness paths the job changed and verify did not use, in words (`tests/x.py (added)`)."""
        out = []
        for put in self.puts:
            label = put.path + (f" [{put.section}]" if put.section else "")
            out.append(label if put.why == "changed" else f"{label} (deleted)")
        for path in self.aside:
            out.append(f"{path} (added" + (", not committed)" if path in self.uncommitted else ")"))
        out += [f"{path} (not a folder)" for path in self.blockers]
        return sorted(out)


def compare(repo: Repo, trusted: str, worktree: Path, asked: list[str] | None, command: str | None, *,
            head: str | None = None, kept: Mapping[str, object] | None = None,
            import_dirs: Iterable[str] = IMPORT_DIRS) -> Comparison:
    """The worktree on disk against the trusted commit `trusted` (see the module docstring);
    `head`: the job's commit (says which added files it committed); `kept`: untracked harness
    files that were there before the job ran (`snapshot`), left alone while unchanged."""
    files = flatten(repo, trusted)
    rule = rule_for(asked, files, command)
    found = Comparison(trusted, rule)
    disk = _Disk(worktree)
    committed = flatten(repo, head) if head else None
    harness_dirs: set[str] = set()  # folders holding harness files: their bytecode is looked at
    for path, (oid, mode, size) in files.items():
        if rule.matches(path):
            found.trusted_files += 1
            harness_dirs.add(path.rpartition("/")[0])
            _compare_file(repo, disk, path, oid, mode, size, found)
        elif (section := rule.section_of(path)) is not None:
            found.trusted_files += 1
            _compare_section(repo, disk, path, oid, mode, section, found)
    kept = kept or {}
    for path in disk.files():
        if path in files:
            continue
        harness = rule.matches(path) or (rule.section_of(path) is not None and _has_section(disk, path, rule))
        if not harness or _unchanged_since(disk, path, kept):
            continue
        found.aside.append(path)
        harness_dirs.add(path.rpartition("/")[0])
        if committed is None or path not in committed:
            found.uncommitted.add(path)
    found.quiet = _caches_aside(disk, harness_dirs)
    # a harness file the job added is out of the verdict's way already (moved aside)
    found.shadows = [(shown, name, kind) for path, shown, name, kind in _shadows(disk, files, kept, import_dirs)
                     if not rule.matches(path)]
    return found


class _Disk:
    """The worktree as it is, read without following a link below its top."""

    def __init__(self, root: Path):
        self.root = root
        self._top = os.fspath(root) + os.sep  # paths built as strings: pathlib cost ~7 ms a comparison
        self._kinds: dict[str, str] = {"": "dir"}
        self._stats: dict[str, os.stat_result | None] = {}
        self._files: list[str] | None = None
        self.caches: list[str] = []  # the bytecode and pytest cache folders seen by `files`

    def kind(self, rel: str) -> str:
        """dir | file | link | other | missing, for a path whose folders are all real folders;
        `blocked` when one of them is not."""
        if rel in self._kinds:
            return self._kinds[rel]
        parent = rel.rpartition("/")[0]
        if self.kind(parent) != "dir":
            kind = "blocked" if self.kind(parent) != "missing" else "missing"
        else:
            info = self.stat(rel)
            if info is None:
                kind = "missing"
            else:
                mode = info.st_mode
                kind = ("dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode)
                        else "link" if stat.S_ISLNK(mode) else "other")
        self._kinds[rel] = kind
        return kind

    def blocker(self, rel: str) -> str | None:
        """The first folder of `rel` that is a file or a link on disk."""
        parts = rel.split("/")[:-1]
        for n in range(1, len(parts) + 1):
            folder = "/".join(parts[:n])
            kind = self.kind(folder)
            if kind == "missing":
                return None
            if kind != "dir":
                return folder
        return None

    def files(self) -> list[str]:
        """Every file and link below the top (pruned folders left out), walked once."""
        if self._files is None:
            self._files = []
            stack = [""]
            while stack:
                folder = stack.pop()
                try:
                    entries = os.scandir(self._top + folder if folder else self._top)
                except OSError:
                    continue
                with entries:
                    for entry in entries:
                        rel = f"{folder}/{entry.name}" if folder else entry.name
                        if entry.is_dir(follow_symlinks=False):
                            self._kinds[rel] = "dir"
                            if entry.name == BYTECODE or entry.name in CACHES:
                                self.caches.append(rel)
                            elif entry.name not in PRUNED \
                                    and not os.path.exists(os.path.join(entry.path, "pyvenv.cfg")):
                                stack.append(rel)
                        else:
                            link = entry.is_symlink()
                            self._kinds[rel] = ("link" if link else
                                                "file" if entry.is_file(follow_symlinks=False) else "other")
                            self._files.append(rel)
        return self._files

    def read(self, rel: str) -> bytes | None:
        try:
            fd = os.open(self._top + rel, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as fh:
            return fh.read()

    def stat(self, rel: str) -> os.stat_result | None:
        if rel not in self._stats:
            try:
                self._stats[rel] = os.lstat(self._top + rel)
            except OSError:
                self._stats[rel] = None
        return self._stats[rel]


def blob_id(data: bytes, hex_length: int = 40) -> str:
    """The object id git gives `data` as a blob (sha1, or sha256 in a repository that uses it)."""
    import hashlib  # as above

    digest = hashlib.sha1() if hex_length == 40 else hashlib.sha256()
    digest.update(b"blob %d\0" % len(data))
    digest.update(data)
    return digest.hexdigest()


def _compare_file(repo: Repo, disk: _Disk, path: str, oid: str, mode: int, size: int,
                  found: Comparison) -> None:
    blocker = disk.blocker(path)
    if blocker is not None:
        if blocker not in found.blockers:
            found.blockers.append(blocker)
        found.puts.append(Put(path, oid, mode, "deleted"))
        return
    kind = disk.kind(path)
    if kind == "missing":
        found.puts.append(Put(path, oid, mode, "deleted"))
        return
    if mode == 0o120000:  # a link in the trusted tree: the same link, pointing at the same name
        try:
            same = kind == "link" and os.fsencode(os.readlink(disk.root / path)) == _read(repo, oid)
        except OSError:
            same = False
        if not same:
            found.puts.append(Put(path, oid, mode, "changed"))
        return
    info = disk.stat(path) if kind == "file" else None
    if info is None or bool(info.st_mode & 0o100) != (mode == 0o100755):
        found.puts.append(Put(path, oid, mode, "changed"))
        return
    if info.st_size != size:
        found.puts.append(Put(path, oid, mode, "changed"))
        return
    data = disk.read(path)
    found.hashed += 1
    if data is None or blob_id(data, len(oid)) != oid:
        found.puts.append(Put(path, oid, mode, "changed"))


CHECKED_HASH = b"\x03\x00\x00\x00"  # a pyc's flags: built from a hash of its source's bytes, checked on load


def _caches_aside(disk: _Disk, harness_dirs: set[str]) -> list[str]:
    """What of the caches the job left a runner would read: pytest's cache folder, and beside
    harness files every bytecode file but those checked against a hash of their source's bytes
    (pytest's rewritten tests and conftest.py are; the bytes are the trusted ones, compared
    above). A timestamp pyc is taken on its source's size and time, which the job can copy (`touch
    -r`), an unchecked one on nothing: those go aside. Recompiling every test instead cost as much
    as the tests' run (bench/harness.py)."""
    out = []
    for folder in disk.caches:
        parent, _, name = folder.rpartition("/")
        if name in CACHES:
            out.append(folder)
        elif parent in harness_dirs:
            try:
                entries = list(os.scandir(disk.root / folder))
            except OSError:
                out.append(folder)
                continue
            for entry in entries:
                if not (entry.name.endswith(".pyc") and entry.is_file(follow_symlinks=False)
                        and _pyc_flags(entry.path) == CHECKED_HASH):
                    out.append(f"{folder}/{entry.name}")
    return out


def _pyc_flags(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read(8)[4:8]


def _unchanged_since(disk: _Disk, path: str, kept: Mapping[str, object]) -> bool:
    """Was this untracked file there before the job ran, and is it the same file still? (Its
    inode's change time moves with every write, rename and chmod, and cannot be set back.)"""
    was = kept.get(path)
    info = disk.stat(path)
    return isinstance(was, list) and info is not None and was == [info.st_ino, info.st_ctime_ns, info.st_size]


def snapshot(repo: Repo, trusted: str, worktree: Path, asked: list[str] | None,
             command: str | None) -> dict[str, list[int]]:
    """The untracked harness files (and files on the import path) a fresh worktree holds before the
    job runs (copied by `.worktreeinclude`, made by `subtask.setup`): {path: [ino, ctime_ns, size]}."""
    files = flatten(repo, trusted)
    rule = rule_for(asked, files, command)
    disk = _Disk(worktree)
    kept: dict[str, list[int]] = {}
    for path in disk.files():
        if path in files:
            continue
        if rule.matches(path) or rule.section_of(path) is not None or _on_import_path(path, IMPORT_DIRS):
            info = disk.stat(path)
            if info is not None:
                kept[path] = [info.st_ino, info.st_ctime_ns, info.st_size]
    return kept


# ---------------------------------------------------------------- files of which a part is harness

def _compare_section(repo: Repo, disk: _Disk, path: str, oid: str, mode: int, keys: tuple[str, ...],
                     found: Comparison) -> None:
    blocker = disk.blocker(path)
    kind = disk.kind(path) if blocker is None else "blocked"
    if kind in ("missing", "blocked"):
        if blocker is not None and blocker not in found.blockers:
            found.blockers.append(blocker)
        if _section(path, _read(repo, oid), keys) is not None:
            found.puts.append(Put(path, oid, mode, "deleted", section=_section_name(keys)))
        return
    data = disk.read(path) if kind == "file" else None
    trusted = _read(repo, oid)
    if data is not None and blob_id(data, len(oid)) == oid:
        return
    ours = _section(path, trusted, keys)
    theirs = _section(path, data, keys) if data is not None else _BROKEN
    if ours == theirs:
        return
    content = _composed(path, data, trusted, keys) if data is not None else None
    if content is not None and blob_id(content, len(oid)) == oid:
        content = None
    found.puts.append(Put(path, oid, mode, "changed", content=content, section=_section_name(keys)))


def _has_section(disk: _Disk, path: str, rule: Rule) -> bool:
    data = disk.read(path)
    keys = rule.section_of(path) or ()
    return data is None or _section(path, data, keys) not in (None, {})


_BROKEN = object()


def _section_name(keys: tuple[str, ...]) -> str:
    return ", ".join(keys)


def _section(path: str, data: bytes | None, keys: tuple[str, ...]) -> object:
    """The harness part of a file: {key: value} of the keys present (None: none; `_BROKEN`: unreadable)."""
    loaded = _load(path, data)
    if loaded is None:
        return _BROKEN
    part = {}
    for key in keys:
        value = _dig(loaded, key)
        if value is not _MISSING:
            part[key] = value
    return part or None


_MISSING = object()


def _dig(obj: object, dotted: str) -> object:
    for name in dotted.split("."):
        if not isinstance(obj, dict) or name not in obj:
            return _MISSING
        obj = obj[name]
    return obj


def _load(path: str, data: bytes | None) -> dict[str, Any] | None:
    """The file's data as a table; None when it cannot be read as one."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
        if path.endswith(".toml"):
            import tomllib

            return tomllib.loads(text)

        loaded = json.loads(text)
        return loaded if isinstance(loaded, dict) else None
    except (ValueError, UnicodeDecodeError):
        return None


def _composed(path: str, data: bytes, trusted: bytes, keys: tuple[str, ...]) -> bytes | None:
    """The job's file with the trusted tree's harness part in place of its own; None when that
    cannot be done so that every other part stays the job's (the trusted file is then used whole)."""
    mine, ours = _load(path, data), _load(path, trusted)
    if mine is None or ours is None:
        return None
    if path.endswith(".json"):
        composed = json.loads(json.dumps(mine))
        for key in keys:
            _put(composed, key, _dig(ours, key))
        return (json.dumps(composed, indent=2, ensure_ascii=False) + "\n").encode()
    text = _toml_without(data.decode("utf-8"), keys)
    block = _toml_only(trusted.decode("utf-8"), keys)
    candidate = (text.rstrip("\n") + "\n\n" + block if block else text).encode()
    check = _load(path, candidate)
    if check is None or any(_dig(check, key) != _dig(ours, key) for key in keys):
        return None
    return candidate if _without(check, keys) == _without(mine, keys) else None


def _without(obj: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """`obj` less `keys`, and less the tables that only held them."""
    out = copy.deepcopy(obj)
    for key in keys:
        _put(out, key, _MISSING)
        parts = key.split(".")
        for n in range(len(parts) - 1, 0, -1):
            parent = _dig(out, ".".join(parts[:n]))
            if parent == {}:
                _put(out, ".".join(parts[:n]), _MISSING)
    return out


def _put(obj: dict[str, Any], dotted: str, value: object) -> None:
    *parents, last = dotted.split(".")
    for name in parents:
        if not isinstance(obj.get(name), dict):
            if value is _MISSING:
                return
            obj[name] = {}
        obj = obj[name]
    if value is _MISSING:
        obj.pop(last, None)
    else:
        obj[last] = value


_TABLE = lazyre.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")


def _toml_blocks(text: str) -> list[tuple[str | None, list[str]]]:
    """The text's tables in order: (header key, its lines); None for what precedes the first."""
    blocks: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in text.splitlines(keepends=True):
        match = _TABLE.match(line)
        if match:
            key = ".".join(part.strip().strip('"').strip("'") for part in match.group(1).split("."))
            blocks.append((key, [line]))
        else:
            blocks[-1][1].append(line)
    return blocks


def _in_keys(header: str | None, keys: tuple[str, ...]) -> bool:
    return header is not None and any(header == k or header.startswith(k + ".") for k in keys)


def _toml_without(text: str, keys: tuple[str, ...]) -> str:
    return "".join("".join(lines) for header, lines in _toml_blocks(text) if not _in_keys(header, keys))


def _toml_only(text: str, keys: tuple[str, ...]) -> str:
    return "".join("".join(lines) for header, lines in _toml_blocks(text) if _in_keys(header, keys))


# ---------------------------------------------------------------- shadowing

def _on_import_path(path: str, import_dirs: Iterable[str]) -> bool:
    folder, _, name = path.rpartition("/")
    if folder in import_dirs:
        return True
    parent, _, _ = folder.rpartition("/")
    return name == "__init__.py" and parent in import_dirs


def _shadows(disk: _Disk, files: Mapping[str, object], kept: Mapping[str, object],
             import_dirs: Iterable[str]) -> list[tuple[str, str, str, str]]:
    """Files the job added (committed or not) directly in a folder on the verify's import path that
    Python would import by a name: (the file, as shown, module name, kind: module | package | pth | hook)."""
    dirs = tuple(dict.fromkeys(import_dirs))
    out = []
    for path in disk.files():
        if path in files or not _on_import_path(path, dirs) or _unchanged_since(disk, path, kept):
            continue
        folder, _, name = path.rpartition("/")
        if name == "__init__.py" and folder.rpartition("/")[0] in dirs and folder not in dirs:
            out.append((path, folder + "/", folder.rpartition("/")[2], "package"))
            continue
        if folder not in dirs or name == "__init__.py":
            continue
        if name.endswith(".pth"):
            out.append((path, path, name, "pth"))
            continue
        stem, dot, suffix = name.partition(".")
        if not dot or not stem.isidentifier():
            continue
        if suffix == "py" or suffix.endswith(("so", "pyd")) or suffix == "pyc":
            out.append((path, path, stem, "hook" if stem in SITE_HOOKS else "module"))
    return out


def shadow_findings(shadows: list[tuple[str, str, str]], installed: set[str]) -> list[str]:
    """The shadows that matter, in words: a .pth, sitecustomize/usercustomize, or a module or
    package named as the test runner, a standard-library module or an installed distribution's."""
    out = []
    for path, name, kind in shadows:
        if kind == "pth":
            out.append(f"{path}: a .pth file on the import path")
        elif kind == "hook":
            out.append(f"{path}: {name} runs at every interpreter start")
        elif name in RUNNERS:
            out.append(f"{path} shadows the test runner's {name}")
        elif name in sys.stdlib_module_names:
            out.append(f"{path} shadows the standard library's {name}")
        elif name in installed:
            out.append(f"{path} shadows the installed {name}")
    return out


def names_to_probe(shadows: list[tuple[str, str, str]]) -> list[str]:
    """The module names only an interpreter can say are installed (the others decide alone)."""
    return sorted({name for _, name, kind in shadows if kind in ("module", "package")
                   and name not in RUNNERS and name not in sys.stdlib_module_names})


# ---------------------------------------------------------------- the tree verify ran on

def overlaid_tree(repo: Repo, head: str, found: Comparison) -> str:
    """The tree of `head` with the trusted harness in place of the job's: the trusted blobs
    written back, the harness files it added taken out (what verify ran on, as far as git
    tracks it). Writes the tree objects; the head's own tree when nothing differs."""
    objects = repo.objects
    tree = tree_of(repo, head)
    committed = flatten(repo, head)
    changes: dict[str, tuple[str, int] | None] = {}
    for put in found.puts:
        oid = objects.write_object("blob", put.content) if put.content is not None else put.oid
        changes[put.path] = (oid, put.mode)
    for path in found.aside:
        if path not in found.uncommitted:
            changes[path] = None
    for path in found.blockers:
        if path in committed:
            changes[path] = None
    if not changes:
        return tree
    return edit_tree(objects, tree, changes) or objects.write_object("tree", b"")


def _read(repo: Repo, oid: str) -> bytes:
    """A blob's bytes (b"" when it cannot be read: what differs from anything on disk)."""
    found = repo.objects.read([oid])[0]
    return found[1] if found is not None else b""
