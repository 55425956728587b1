"""Loose objects packed before a checkout reads them: one pack instead of thousands of files.

git reads a loose object with two opens, an mmap and a zlib stream of its own; a checkout of
2,000 loose blobs costs ~2.5x one of the same blobs from a pack (docs/benchmarks.md). A base
has its objects loose when it was committed here rather than fetched: a generated or vendored
tree, a fresh `git init` of an existing project. `git gc --auto` packs them only past 6,700,
and never for a checkout. So before a worker writes a new worktree's files, when the repository
holds `subtask.packLooseObjects` (1,024) more loose objects than when it was last packed here,
it packs the loose objects that no pack holds yet into one new pack (`git pack-objects
--incremental`: the worker loads no libgit2), and every checkout from then on reads them from it.

Invariants:
- Never delete or rewrite an object or a pack (or an index) to speed a checkout up (this module
  only adds one pack of the loose objects no pack holds; git gc prunes the loose copies later),
  because a running git may be reading them, and on ext4 without a journal every inode freed makes
  the next minute's file creations walk past it; a failed pack leaves the repository as it was
  and the checkout reads the loose objects (`tests/test_packing.py`).
- Never fail a job: any error skips the pack, with a line in the worker log, and the checkout
  reads the loose objects as before.
- One packer at a time per repository (`packed-<repo>.lock`). A worker that finds the lock held
  waits for it, because the pack is what its own checkout wants, but at most PACK_WAIT; the lock
  guards nothing else.
- Whether to pack is decided from a sample of git's fan-out folders (as `git gc --auto` decides):
  the common case, nothing to pack, costs a few directory reads.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from subtask.git import pipes
from subtask.state.statefiles import LockTimeout, file_lock, write_json

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from subtask.git.gitrepo import Repo

SAMPLE_FOLDERS = 16  # of git's 256 fan-out folders (`git gc --auto` samples one)
MAX_LOOSE = 100_000  # beyond this, packing is `git gc`'s job: it could take minutes
PACK_WAIT = 10.0  # seconds a worker waits for another's pack before checking out without it


def estimate_loose(objects: Path) -> int:
    """How many loose objects `objects` holds, from SAMPLE_FOLDERS of its 256 fan-out folders."""
    found = 0
    for n in range(SAMPLE_FOLDERS):
        try:
            with os.scandir(objects / f"{n:02x}") as entries:
                found += sum(1 for entry in entries if not entry.name.startswith("tmp_"))
        except OSError:
            continue
    return found * 256 // SAMPLE_FOLDERS


def state_file(repo: Repo) -> Path:
    """`packed-<repo>.json`: {"v": 1, "loose": the estimate when this repository was last packed};
    one per repository (several may share a state folder), and so is the lock beside it."""
    return Path(repo.state_file("packed"))


def _last_packed(repo: Repo) -> int:
    try:
        value = json.loads(state_file(repo).read_text()).get("loose", 0)
    except (OSError, ValueError, AttributeError):
        return 0  # never packed here, or a damaged file: estimate from nothing
    return value if isinstance(value, int) and value >= 0 else 0


def _grown(repo: Repo, loose: int) -> int:
    """Loose objects beyond those already packed here (all of them after a `git gc` pruned some)."""
    last = _last_packed(repo)
    return loose - last if loose >= last else loose


def pack_loose_objects(repo: Repo) -> bool:
    """Pack the repository's loose objects into one new pack when enough were added since the
    last pack (module docstring); True if a pack was written."""
    try:
        return _pack_when_grown(repo)
    except LockTimeout:
        return False
    except Exception as exc:  # the checkout reads the loose objects instead: never a failed job
        print(f"git-subtask: not packing the loose objects: {exc}", file=sys.stderr, flush=True)
        return False


def _pack_when_grown(repo: Repo) -> bool:
    threshold = repo.config.integer("packLooseObjects")
    if threshold <= 0 or os.environ.get("GIT_OBJECT_DIRECTORY"):
        return False
    objects = repo.common_dir / "objects"
    loose = estimate_loose(objects)
    if loose > MAX_LOOSE or _grown(repo, loose) < threshold:
        return False
    with file_lock(state_file(repo).with_suffix(".lock"), timeout=PACK_WAIT):
        loose = estimate_loose(objects)  # afresh: another worker may have packed them while we waited
        if _grown(repo, loose) < threshold:
            return False
        written = _write_pack(repo, objects)
        write_json(state_file(repo), {"v": 1, "loose": loose}, durable=False)
        return written


def _write_pack(repo: Repo, objects: Path) -> bool:
    """One pack of the loose objects that no pack holds yet (`git pack-objects --incremental`,
    given every loose object's name, leaves out what a pack has); False when there were none."""
    names = []
    for n in range(256):
        folder = f"{n:02x}"
        try:
            with os.scandir(objects / folder) as entries:
                names += [folder + entry.name for entry in entries if len(entry.name) == 38]  # not tmp_obj_*
        except OSError:
            continue
    if not names:
        return False
    argv = ["git", "--git-dir", str(repo.common_dir), "pack-objects", "--incremental", "--quiet", "--non-empty",
            str(objects / "pack" / "pack")]
    code, out, err = pipes.run(argv, input="".join(f"{name}\n" for name in names).encode())
    if code != 0:
        raise OSError(f"git pack-objects: {err.decode(errors='replace').strip()}")
    return bool(out.strip())
