"""The one commit-chain store: a ref whose commits are an entity's history (a job's record at
`refs/subtask/<id>/record`, a group's at `refs/subtask/groups/<gid>/record`), moved only by
compare-and-swap, as git-bug keeps its entities.

`update` is the read-change-write loop every kind uses: read the entity at the ref's tip, let
`change` mutate it, write a commit on that tip, and move the ref from that tip to it. A lost race
reads again (random back-off); a ref lock is waited for a bounded time and broken only when it is
stale and its owner's worker is gone.

Invariants:
- Never move a chain's ref except from the tip that was read, because a writer that lost a race
  would otherwise drop the winner's commit (a `stopped` overwritten by `done`).
- Never break a ref lock younger than `subtask.refLockStale`, nor one whose owner's worker is
  alive (its run-lock held by another process), because a live writer is inside its update.
- The kinds keep their own serialisation (each file carries a `"v"` format version); this module
  only moves refs, and says which entity a ref belongs to (`KINDS`, `owner_of`): the one place
  a job's refs are told from a group's, so nobody parses ref names.
- Never treat a held record ref lock as a lost race, nor keep one forever, because a kill -9
  inside a ref update leaves a lock file no live process holds: it is waited for, and removed once
  older than `subtask.refLockStale` when the job has no live worker but the caller.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable

from subtask.git.gitrepo import Repo
from subtask.model import lazyre
from subtask.model.dataclass import dataclass
from subtask.model.errors import SubtaskError
from subtask.model.job import JOB_ID_RE
from subtask.state import liveness

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    from typing import TypeVar

    T = TypeVar("T")



@dataclass(frozen=True)
class Kind:
    """One kind of entity kept as a commit chain: where its refs live, what its ids look like and
    which refs besides its record (`parts`) are its own (a job's pins)."""

    name: str
    prefix: str
    id_re: re.Pattern[str]
    parts: re.Pattern[str]

    def record_ref(self, entity_id: str) -> str:
        return f"{self.prefix}{entity_id}/record"


GROUP = Kind("group", "refs/subtask/groups/", lazyre.compile(r"sg-[0-9a-f]{8}"), lazyre.compile(r"record"))
JOB = Kind("job", "refs/subtask/", JOB_ID_RE, lazyre.compile(r"record|base|head|attempts/[0-9]+"))
KINDS = (GROUP, JOB)  # the longer prefix first: a group's refs are under the jobs' prefix too


@dataclass(frozen=True)
class Owner:
    """The entity a ref under `refs/subtask/` belongs to, and which of its refs it is (`owner_of`)."""

    kind: Kind
    id: str
    part: str  # "record", or a job's "base", "head", "attempts/<n>"


def owner_of(ref: str) -> Owner | None:
    """The entity a ref under `refs/subtask/` belongs to, and which of its refs it is; None for
    any other shape (a ref nobody of ours writes)."""
    for kind in KINDS:
        if ref.startswith(kind.prefix):
            entity_id, _, part = ref[len(kind.prefix):].partition("/")
            if kind.id_re.fullmatch(entity_id) and kind.parts.fullmatch(part):
                return Owner(kind, entity_id, part)
    return None


LOCK_WAIT = 2.0  # how long an update waits by default for a young ref lock before it gives up
ATTEMPTS = 200  # lost races before an update gives up ("too much contention")


def cas_ref(repo: Repo, name: str, old: str | None, new: str | None, message: str = "git-subtask") -> bool:
    """Point `name` at `new` (None deletes it) only if it still points at `old` (None: absent)."""
    return cas(repo, name, old, new, message) == "ok"


def cas(repo: Repo, name: str, old: str | None, new: str | None, message: str) -> str:
    """`cas_ref`, saying why it did not write: "ok", "moved" (not at `old`) or "locked"."""
    return repo.objects.update_refs([(name, old, new)], message)


# A ref lock is held for the instant of one update; one older than `subtask.refLockStale` seconds
# was left by a writer that died inside its update (kill -9).

def ref_lock_path(repo: Repo, name: str) -> str:
    return os.path.join(repo.common_dir_str, f"{name}.lock")


def ref_lock_age(repo: Repo, name: str) -> float | None:
    """Seconds since the ref's lock file was made, or None when there is none."""
    try:
        return max(time.time() - os.stat(ref_lock_path(repo, name)).st_mtime, 0.0)
    except OSError:
        return None


def break_stale_lock(repo: Repo, owner: str, name: str) -> bool:
    """Remove the ref lock a dead writer left: older than `subtask.refLockStale`, and no live
    worker of `owner` (a job id; a group has none) other than ourselves."""
    age = ref_lock_age(repo, name)
    if age is None or age < repo.config.number("refLockStale"):
        return False
    if not liveness.owns(owner) and liveness.is_held(repo.state_dir_str, owner):
        return False  # its worker is alive: it breaks the lock itself when it needs to
    try:
        os.unlink(ref_lock_path(repo, name))
    except FileNotFoundError:
        return True
    except OSError:
        return False
    print(f"git-subtask: removed a stale ref lock ({age:.0f}s old, its writer is gone): "
          f"{ref_lock_path(repo, name)}", file=sys.stderr)
    return True


def wait_for_ref_lock(repo: Repo, owner: str, name: str, what: str, until: float) -> None:
    """Return once the ref's lock is gone (or removed as stale); raise at `until`."""
    while ref_lock_age(repo, name) is not None and not break_stale_lock(repo, owner, name):
        if time.monotonic() >= until:
            raise SubtaskError(
                "fatal", f"could not update the record of {what}: {ref_lock_path(repo, name)} is locked",
                hint="it is removed once older than subtask.refLockStale seconds; if no git process "
                     "is running, remove it yourself")
        time.sleep(0.02)


def update(repo: Repo, name: str, *, owner: str, what: str, load: Callable[[], tuple[T, str]],
           change: Callable[[T], bool | None], write: Callable[[T, str], str],
           attempts: int = ATTEMPTS, lock_wait: float = LOCK_WAIT) -> tuple[T, str]:
    """Apply `change` to the entity at the tip of `name` and move the ref to a commit holding the
    result, by compare-and-swap, retrying on a race. Returns (entity, its tip).

    `load()` reads (entity, tip); `change` mutates the entity in place and returns False to write
    nothing (it may run more than once, so it must be a pure function of what it is given);
    `write(entity, parent)` makes the commit. A held ref lock is waited for up to `lock_wait`
    seconds and removed once stale; past that, a `SubtaskError` names the lock file.
    """
    raced = 0
    locked_until = None
    while True:
        entity, tip = load()
        if change(entity) is False:
            return entity, tip
        new_tip = write(entity, tip)
        outcome = cas(repo, name, tip, new_tip, "git-subtask")
        if outcome == "ok":
            return entity, new_tip
        if outcome == "locked" and ref_lock_age(repo, name) is not None:
            locked_until = locked_until or time.monotonic() + lock_wait
            wait_for_ref_lock(repo, owner, name, what, locked_until)
            continue
        raced += 1
        if raced >= attempts:
            raise SubtaskError("fatal", f"could not update the record of {what}: too much contention")
        import random  # only when writers race: never on a reading command's path

        time.sleep(min(0.05, 0.001 * raced) * random.random())
