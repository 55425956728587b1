"""Every name in the state folder (`<git-common-dir>/subtask/`, or `subtask.stateDir`), and the
reservation ids of the ledger, spelled once.

```
slots.json, slots.lock          running attempts and the queue (state/slots)
ledger.jsonl, ledger.lock       reservations and closes (state/ledger)
ports.json, ports.lock          each running attempt's ports (state/ports)
notes.lock, worktree.lock, land.lock, clone-id.lock, index-<key>.lock, packed-<repo>.lock
pool-fill.lock                  held by the one process filling the worktree pool (git/pool)
notify.jsonl (.1), notify.lock   the events told to MCP clients (ops/notify)
groups/<gid>.lock               a group's conclusion lock
land-sweep.json, patch-ids.json, main-index/       caches of the sweep, landing and the worker
landlock.json                   this boot's Landlock, as `start` first found it (proc/isolation)
logs/<id>.log                   a worker's stderr
run/<id>.lock                   the run-lock, held (flock) for a worker's life (state/liveness)
run/<id>.pid, .stop, .engine, .events.jsonl, .env.json; run/<gid>.judge.json
run/<id>.<n>.private.json, .task, .verify.txt      an attempt's words as written, 0600
```

Invariant: never build a state-folder path outside this module, because a second spelling of a
name is a file one side writes and the other never reads (a stop marker nobody sees).

Invariants:
- Never build a state-folder path outside `state/paths.py`, because a second spelling of a name is
  a file one side writes and the other never reads
  (`test_layers.py::test_state_folder_names_are_spelled_only_in_state_paths`).
- Never let two processes read-modify-write one pid file, because the starter records the worker it
  forked while that worker may already be recording its engine: the engine's entry was dropped and
  the reaper could not end its group. The worker's pid and the engine's group live in two files.
"""

from __future__ import annotations

import os

from subtask.state.statefiles import ensure_dir

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    from subtask.state.statefiles import StrPath

# hashlib's SHA-1 from CPython's own module where there is one: `hashlib` loads OpenSSL's libcrypto
# (~3 ms, far more on a loaded machine), which `list` and `status` paid for `repo_file`'s names
# alone. The same digest either way, so no file is ever renamed.
try:
    from _sha1 import sha1 as sha1  # type: ignore[import-not-found]  # (loose.py uses it too)
except ImportError:  # another interpreter
    from hashlib import sha1 as sha1

SLOTS_FILE, SLOTS_LOCK = "slots.json", "slots.lock"
LEDGER_FILE, LEDGER_LOCK = "ledger.jsonl", "ledger.lock"
PORTS_FILE, PORTS_LOCK = "ports.json", "ports.lock"
NOTES_LOCK, WORKTREE_LOCK, LAND_LOCK, CLONE_ID_LOCK = "notes.lock", "worktree.lock", "land.lock", "clone-id.lock"
POOL_FILL_LOCK = "pool-fill.lock"
SWEEP_STAMP, PATCH_ID_CACHE, MAIN_INDEX_COPIES = "land-sweep.json", "patch-ids.json", "main-index"
LANDLOCK_SEEN = "landlock.json"


def reservation_id(job_id: str, attempt: int) -> str:
    """The ledger's id of an attempt's reservation: one per attempt, closed exactly once."""
    return f"{job_id}.{int(attempt)}"


def run_dir(state_dir: StrPath) -> str:
    return ensure_dir(os.path.join(state_dir, "run"))


def logs_dir(state_dir: StrPath) -> str:
    return ensure_dir(os.path.join(state_dir, "logs"))


def groups_dir(state_dir: StrPath) -> str:
    return ensure_dir(os.path.join(state_dir, "groups"))


def run_file(state_dir: StrPath, job_id: str, kind: str, *, make: bool = True) -> str:
    """`run/<id>.<kind>`: lock, pid, stop, engine, events.jsonl, env.json. `make=False` for a
    probe that must not create the folder."""
    return os.path.join(run_dir(state_dir) if make else os.path.join(state_dir, "run"), f"{job_id}.{kind}")


def attempt_file(state_dir: StrPath, job_id: str, attempt: int, kind: str) -> str:
    """`run/<id>.<n>.<kind>`: private.json, task, verify.txt."""
    return os.path.join(run_dir(state_dir), f"{job_id}.{int(attempt)}.{kind}")


def index_lock(state_dir: StrPath, key: str) -> str:
    """`index-<key>.lock`: one checkout's index, held while a merge or a landing moves it."""
    return os.path.join(state_dir, f"index-{key}.lock")


def repo_file(state_dir: StrPath, common_dir: StrPath, stem: str, suffix: str) -> str:
    """`<stem>-<repo><suffix>`: a file of one repository's own in a state folder several may share."""
    return os.path.join(state_dir, f"{stem}-{sha1(os.fspath(common_dir).encode()).hexdigest()[:8]}{suffix}")


def notify_feed(state_dir: StrPath, old: bool = False) -> str:
    """`notify.jsonl` (`.1`: the one it replaced): the events an MCP server tells its client (ops/notify)."""
    return os.path.join(state_dir, "notify.jsonl.1" if old else "notify.jsonl")


def notify_lock(state_dir: StrPath) -> str:
    return os.path.join(state_dir, "notify.lock")


def log_file(state_dir: StrPath, job_id: str) -> str:
    return os.path.join(logs_dir(state_dir), f"{job_id}.log")
