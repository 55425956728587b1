"""Reading refs and objects, through pygit2 once it is loaded and through the git binary before.

A command that only reads (`list`, `status`, `show`, `result`, `wait`, `spend`) would spend half
its time importing pygit2 (~60 ms of CPU of its ~120). So `Repo.objects` hands out one of two
backends with the same three questions (the refs under a prefix, one ref, a batch of objects):
`GitObjects` asks `git for-each-ref` and one `git cat-file --batch` per batch; `Pygit2Objects`
asks the already loaded library in-process (the worker, the MCP server, any command that has
written). Everything built on them (the record parser, `list`) is one implementation.

Invariants:
- Both backends answer alike: a missing or unreadable object is None, never an exception, and
  `read` returns one answer per spec in order. tests/test_gitread.py runs every question on both.
- A spec is a full object id, or `<full id>:<path>` (a file in a commit's tree); anything else is
  answered None without reaching git, because a spec is written to git's stdin line by line.
- Never a dangling symbolic ref in `refs`: git's for-each-ref leaves them out, so pygit2 does too.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pygit2

_OID = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


@dataclass(frozen=True)
class Ref:
    name: str
    target: str  # an object id; for a symbolic ref, the name of the ref it points at
    symbolic: bool = False


def valid_spec(spec: str) -> bool:
    oid, _, path = spec.partition(":")
    return bool(_OID.fullmatch(oid)) and "\n" not in path


def commit_message(raw: bytes) -> bytes:
    """The message of a raw commit object (what follows the headers' blank line)."""
    return raw.partition(b"\n\n")[2]


class GitObjects:
    """Refs and objects through the git binary: two small processes instead of a library import."""

    def __init__(self, git_dir: Path):
        self._base = ["git", "--git-dir", str(git_dir)]

    def refs(self, prefix: str) -> list[Ref]:
        return self._for_each_ref(prefix)

    def ref(self, name: str) -> Ref | None:
        return next((ref for ref in self._for_each_ref(name) if ref.name == name), None)

    def _for_each_ref(self, pattern: str) -> list[Ref]:
        proc = subprocess.run([*self._base, "for-each-ref", "--format=%(refname)%00%(objectname)%00%(symref)",
                               pattern], capture_output=True, stdin=subprocess.DEVNULL, check=False)
        found = []
        for line in proc.stdout.decode("utf-8", "surrogateescape").splitlines():
            name, target, symref = (line.split("\0") + ["", ""])[:3]
            found.append(Ref(name, symref, True) if symref else Ref(name, target))
        return found

    def read(self, specs: list[str]) -> list[tuple[str, bytes] | None]:
        asked = [spec for spec in specs if valid_spec(spec)]
        answers: dict[str, tuple[str, bytes] | None] = {}
        if asked:
            proc = subprocess.run([*self._base, "cat-file", "--batch"], input="".join(f"{s}\n" for s in asked).encode(),
                                  capture_output=True, check=False)
            answers = _parse_batch(asked, proc.stdout)
        return [answers.get(spec) for spec in specs]


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

    def __init__(self, git: pygit2.Repository):
        self._git = git

    def refs(self, prefix: str) -> list[Ref]:
        found = []
        for ref in self._git.references.iterator():
            if ref.name.startswith(prefix):
                found.extend(self._ref(ref))
        return found

    def ref(self, name: str) -> Ref | None:
        ref = self._git.references.get(name)
        return next(iter(self._ref(ref)), None) if ref is not None else None

    def _ref(self, ref) -> list[Ref]:
        from pygit2.enums import ReferenceType

        if ref.type == ReferenceType.DIRECT:
            return [Ref(ref.name, str(ref.target))]
        if self._git.references.get(ref.target) is None:
            return []  # dangling: git's for-each-ref leaves it out too
        return [Ref(ref.name, ref.target, True)]

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
