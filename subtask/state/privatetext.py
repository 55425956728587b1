"""The exact words of a task or reply (and its verify command), kept beside the repository for
the life of its attempt, because the record only holds them redacted.

The record is pushed to the team, and git objects are world-readable under a 0755 `.git`, so
`start` and `reply` store the task, the reply message and the verify command through `redact`.
The engine and verify must still get what was written: when redaction changed something, the
text as written is kept in `<state>/run/<id>.<attempt>.private.json`, and the worker reads it
from there.

The same folder holds the task file an engine is handed instead of an argv element
(`task_file`, `<state>/run/<id>.<attempt>.task`): one argv element is capped at 128 KiB by the
kernel (MAX_ARG_STRLEN), and the documented task limit is 1 MiB, so the shell engine runs the
task from that file and a command engine's `{task_file}` points at it.

Invariants:
- Never in git, never shown: a 0600 file in the 0700 state folder, written atomically.
- It lives exactly as long as its attempt: written before the attempt can be admitted (so any
  worker handed it finds it), removed when the attempt ends (the worker's final record,
  `lifecycle.end_attempt`, or the undo of a start that failed).
- The task file is the same kind of file with the same life: written by the engine that needs it,
  removed with the attempt (`discard`), and by that engine once its run ends.
- A missing or damaged file means the record's (redacted) text is used: a job never fails for it.
- Never store a task, a reply or a verify command unredacted, because record objects are
  world-readable and pushed; the engine gets the text as written from `privatetext`, which is
  never in git and goes when the attempt ends (tests: `secrets::*`).
"""

from __future__ import annotations

import json

from subtask.state import paths
from subtask.state.statefiles import read_bytes, remove_file, write_atomic, write_json

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any

    from subtask.model.job import Attempt
    from subtask.state.statefiles import StrPath


def path(state_dir: StrPath, job_id: str, attempt: int) -> str:
    return paths.attempt_file(state_dir, job_id, attempt, "private.json")


def keep(state_dir: StrPath, job_id: str, attempt: int, *, message: str, stored_message: str,
         verify: str | None = None, stored_verify: str | None = None) -> bool:
    """Keep the texts as written when the record holds them changed; True if a file was written."""
    texts = {}
    if message != stored_message:
        texts["message"] = message
    if verify is not None and verify != stored_verify:
        texts["verify"] = verify
    if not texts:
        return False
    write_json(path(state_dir, job_id, attempt), {"v": 1, **texts})
    return True


def _load(state_dir: StrPath, job_id: str, attempt: int) -> dict[str, Any]:
    try:
        data = json.loads(read_bytes(path(state_dir, job_id, attempt)))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def message(state_dir: StrPath, job_id: str, attempt: Attempt) -> str:
    """What the engine is given: the attempt's message as written, else as recorded."""
    text = _load(state_dir, job_id, attempt.n).get("message")
    return text if isinstance(text, str) else attempt.message


def verify(state_dir: StrPath, job_id: str, attempt_n: int, recorded: str | None) -> str | None:
    """The verify command this attempt runs: as written for it, else as recorded."""
    text = _load(state_dir, job_id, attempt_n).get("verify") if recorded else None
    return text if isinstance(text, str) else recorded


def task_file_path(state_dir: StrPath, job_id: str, attempt: int) -> str:
    return paths.attempt_file(state_dir, job_id, attempt, "task")


def task_file(state_dir: StrPath, job_id: str, attempt: int, text: str) -> str:
    """The task as given to the engine, in a private file (0600) beside the repository."""
    target = task_file_path(state_dir, job_id, attempt)
    write_atomic(target, text.encode("utf-8", "surrogateescape"), durable=False)
    return target


def verify_output_path(state_dir: StrPath, job_id: str, attempt: int) -> str:
    """A retry's file of what verify said about the attempt before it (`SUBTASK_VERIFY_OUTPUT`,
    docs/verify.md): the same kind of file, with the same life, as the task file."""
    return paths.attempt_file(state_dir, job_id, attempt, "verify.txt")


def keep_verify_output(state_dir: StrPath, job_id: str, attempt: int, text: str) -> str:
    target = verify_output_path(state_dir, job_id, attempt)
    write_atomic(target, text.encode("utf-8", "replace"), durable=False)
    return target


def discard(state_dir: StrPath, job_id: str, attempt: int) -> None:
    for name in (path(state_dir, job_id, attempt), task_file_path(state_dir, job_id, attempt),
                 verify_output_path(state_dir, job_id, attempt)):
        remove_file(name)
