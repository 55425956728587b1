"""What a job does not see of the checkout it was started from, for `start` to say (issue 38).

A job runs in its own worktree, checked out from a commit at the top of the repository, without
submodules: the caller's uncommitted changes, the folder they stood in and the base's submodules
are not there. Each is a fact a person would otherwise find out from a job that "ignored" them.

Read-only: git's status never refreshes the caller's index (it refreshes a private copy of the
main worktree's, `index_copy.py`, or reads in place with `--no-optional-locks`), one object read.
Where pygit2 is loaded already (the MCP server), libgit2's status instead: no git process.

Invariants:
- Never look at the caller's checkout after the start's own work, because git's status grows with
  the repository (~0.4 s at 50,000 files): the look (`Look`) begins before the start and is read
  after it, and a look that is not read (the start was refused) is ended and reaped, never left
  running (`test_git_habits::test_a_refused_start_leaves_no_look_at_the_checkout_running`).
- Never report our own folder (`.subtask/`) as the caller's uncommitted change, because the job's
  worktree is being made there while git looks, before `info/exclude` may name it.
"""

from __future__ import annotations

import os
import sys

from subtask.git import index_copy, pipes
from subtask.git.gitrepo import Repo
from subtask.model import lazyre
from subtask.model.dataclass import dataclass, field

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any

OURS = ".subtask/"  # the folder of the jobs' worktrees (excluded, but a look may begin before that)
_PATH_LINE = lazyre.compile(r"^\s*path\s*=\s*(.+?)\s*$")


@dataclass
class LeftOut:
    """What a job does not see of the checkout it was started from (see the module docstring)."""

    uncommitted: list[str] = field(default_factory=list)  # changed, staged or untracked paths
    subfolder: str | None = None  # where in the checkout it was started ("src/"); None: the top
    submodules: list[str] = field(default_factory=list)  # the base's submodule paths
    base: str = ""  # the commit the job starts from

    def to_dict(self) -> dict[str, Any]:
        return {"uncommitted": self.uncommitted, "subfolder": self.subfolder,
                "submodules": self.submodules}


class Look:
    """A look at the checkout `repo` was opened in, begun now (git's status runs meanwhile) and
    read by `found`; `end` stops one that will not be read. `from_checkout`: the job's base will be
    that checkout's HEAD, so its uncommitted changes are what the job misses."""

    def __init__(self, repo: Repo, *, from_checkout: bool):
        self.repo, self.top, self.from_checkout = repo, repo.workdir(), from_checkout
        self.status: pipes.Running | pipes._Popen | None = None
        self.uncommitted: list[str] = []
        if self.top is None or not from_checkout:
            return
        if "pygit2" in sys.modules:  # a server that has it: in-process, no git process
            self.uncommitted = _changed_in_process(self.top)
            return
        # The main worktree's through a private copy of its index that git may refresh (an agent
        # that committed in the same second left every file racily clean: each look re-read them),
        # once a job has run here (a refused first start makes nothing, not even the state folder);
        # another worktree's, or without a copy, read in place.
        here = self.top == self.repo.root_str and os.path.isdir(self.repo.state_dir_str)
        options, env = index_copy.status_args(self.repo) if here else (["--no-optional-locks"], None)
        self.status = pipes.start(
            ["git", *options, "-c", "core.hooksPath=/dev/null", "-C", self.top,
             "status", "--porcelain=v1", "-z", "--untracked-files=normal"], stderr=False, env=env)

    def found(self, base: str | None) -> LeftOut:
        """What a job from `base` leaves out (`base` None: not known yet, `--after`)."""
        found = LeftOut(base=base or "")
        if self.top is None:
            return found
        found.subfolder = _subfolder(self.repo.opened_at_str, self.top)
        if base:
            found.submodules = _submodules(self.repo, base)
        if self.status is not None:
            code, out, _ = self.status.communicate()
            if code == 0:
                self.uncommitted = porcelain_paths(out.decode("utf-8", "surrogateescape"))
            self.status = None
        found.uncommitted = [p for p in self.uncommitted if not p.startswith(OURS)]
        return found

    def end(self) -> None:
        if self.status is not None:
            self.status.kill()
            self.status.communicate()
            self.status = None


def _subfolder(opened_at: str | None, top: str) -> str | None:
    if opened_at is None:
        return None
    top = os.path.realpath(top)
    inside = os.path.realpath(opened_at)
    if inside == top or not inside.startswith(top.rstrip("/") + "/"):
        return None
    return inside[len(top.rstrip("/")) + 1:] + "/"


def _submodules(repo: Repo, base: str) -> list[str]:
    blob = repo.objects.read([f"{base}:.gitmodules"])[0]
    if blob is None:
        return []
    text = blob[1].decode("utf-8", "replace")
    return [m.group(1) for line in text.splitlines() if (m := _PATH_LINE.match(line))]


def porcelain_paths(out: str) -> list[str]:
    """The paths of `git status --porcelain=v1 -z`: `XY path`, a rename's old path after it."""
    paths, fields = [], out.split("\0")
    skip = False
    for entry in fields:
        if skip:
            skip = False
            continue
        if len(entry) < 4:
            continue
        paths.append(entry[3:])
        skip = entry[0] in "RC"
    return paths


def _changed_in_process(top: str) -> list[str]:
    """The paths `git status --untracked-files=normal` names, read by libgit2 (which, unasked,
    writes no index)."""
    import pygit2

    try:
        flags = pygit2.Repository(top).status(untracked_files="normal", ignored=False)
    except (pygit2.GitError, ValueError):
        return []
    return sorted(path for path, flag in flags.items()
                  if flag not in (pygit2.GIT_STATUS_CURRENT, pygit2.GIT_STATUS_IGNORED))
