"""The main worktree's status without writing the user's index: the options and environment of
such a git status (`status_args`), through a private copy of the index (`main_index_copy`) that
git may refresh. `start`'s look at the caller's checkout and the worker's status before and after
a job both take it so.

`git status --no-optional-locks` never writes the index, so while the user's index has racily
clean entries (files written in the same second as the index: an agent's commit just before its
`start`, a checkout) every such status re-reads all of those files. Through the copy git keeps
its refresh there, and judges the copy as it would the original.

Invariants:
- Never write the user's index to take the main worktree's status, because the user's own git
  commands may hold its lock at that moment (a status that refreshes takes it). The status goes
  through the copy (`<state>/main-index/<ino>-<size>-<mtime_ns>`), written 0600 by git too
  (`core.sharedRepository`); without it (a split index, submodules, a failed copy),
  `--no-optional-locks` reads in place and re-reads every racily clean file each time.
- Never give the copy a new mtime, because git trusts the stat data of entries older than the
  index file, and a copy stamped later would hide a same-size change made in the second the
  user's index was written (`tests/test_main_status.py`).
"""

from __future__ import annotations

import os

from subtask.state import paths
from subtask.state.statefiles import open_private

TYPE_CHECKING = False  # not `typing`'s: `start` imports this module
if TYPE_CHECKING:
    from subtask.git.gitrepo import Repo


def status_args(repo: Repo) -> tuple[list[str], dict[str, str] | None]:
    """(git's options, its environment or None: ours) for a status of the main worktree that
    writes only the private copy, else nothing."""
    copy = main_index_copy(repo)
    if copy is None:
        return ["--no-optional-locks"], None
    # git rewrites the copy with the umask's mode; the state folder's files are the owner's alone
    return ["-c", "core.sharedRepository=0600"], dict(os.environ, GIT_INDEX_FILE=str(copy))


def main_index_copy(repo: Repo) -> str | None:
    """A private copy of the main worktree's index for its status to refresh, or None (read it in
    place). Each copy is of one version of the index (named by its inode, size and mtime) and
    keeps that version's mtime, so git judges its racily clean entries as it would the
    original's, until git itself rewrites the copy. None unless the main worktree's index is
    `<root>/.git/index` (a separate git dir may have other worktrees' roots here), for a split
    index (git would write a shared index of ours into .git), with submodules (their status would
    refresh their own index), and whenever copying fails."""
    common, root = repo.common_dir_str, repo.root_str
    if common != os.path.join(root, ".git") or os.path.exists(os.path.join(root, ".gitmodules")) \
            or _split_index(common):
        return None
    folder = os.path.join(repo.state_dir_str, paths.MAIN_INDEX_COPIES)
    try:
        with open(os.path.join(common, "index"), "rb") as source:
            info = os.fstat(source.fileno())
            name = f"{info.st_ino}-{info.st_size}-{info.st_mtime_ns}"
            copy = os.path.join(folder, name)
            if os.path.exists(copy):
                return copy
            tmp = os.path.join(folder, f".{name}.{os.getpid()}")
            with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC), "wb") as out:
                out.write(source.read())  # not `shutil` (~1.4 ms of a start with `bz2`, `lzma`)
            os.utime(tmp, ns=(info.st_atime_ns, info.st_mtime_ns))
            os.replace(tmp, copy)
    except OSError:
        return None
    for other in os.listdir(folder):  # earlier versions, and their lock files
        if other != name and not other.startswith(f".{name}."):
            try:
                os.unlink(os.path.join(folder, other))
            except OSError:
                pass  # another process removed it first
    return copy


def _split_index(common: str) -> bool:
    try:
        with os.scandir(common) as entries:  # not Path.glob: ~2 ms a call in a busy worker
            return any(entry.name.startswith("sharedindex.") for entry in entries)
    except OSError:
        return True
