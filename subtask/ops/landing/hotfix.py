"""The hotfix lane: `land --first ID` while another `land` runs hands the job to that queue, which
puts it at its head.

One queue runs per repository (`land.lock`). A second `land --first ID` does not wait behind it:
it leaves a request, `<state>/land-first-<repo>/<id>.json`, and the running queue takes it at its
next step (renamed to `<id>.taken`: taken once, whoever else looks), puts the job ahead of every
job it has not landed yet (their states are built again on it), and when that job's outcome is
final writes it beside the request (`<id>.done.json`: the outcome, the target before and after).
The requester prints that outcome. A queue that ends without taking a request (it ended first,
or it is `--atomic`, all or nothing) leaves it: the requester, once the lock is free, takes its
request back and lands the job itself; so does it for a request taken by a queue that was killed
before it answered (a landing is whole or absent whatever the kill, so landing it again is safe).

Invariants:
- Never let a job handed by `land --first` be landed both by the running queue and by its
  requester, because it would be integrated twice: the queue takes a request by one rename
  (`take`), and the requester lands only a request it took back under the land lock, or one whose
  queue is gone (the lock is free and no answer came)
  (`landwindow::test_land_first_puts_a_job_at_the_head_of_a_queue_that_is_already_running`).
- Files are written atomically (temp + rename) and read as input: a request names a job id and
  nothing else is taken from it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from subtask.git.gitrepo import Repo
from subtask.model.job import is_job_id
from subtask.state.statefiles import ensure_dir, write_json

FOLDER = "land-first"
REQUEST, TAKEN, DONE = ".json", ".taken", ".done.json"


def folder(repo: Repo) -> Path:
    return Path(repo.state_file(FOLDER, ""))


def ask(repo: Repo, job_id: str) -> None:
    """Leave a request for the running queue to land `job_id` first."""
    place = ensure_dir(folder(repo))
    for stale in (place / f"{job_id}{TAKEN}", place / f"{job_id}{DONE}"):
        stale.unlink(missing_ok=True)  # an earlier request's leftovers answer nothing now
    write_json(place / f"{job_id}{REQUEST}", {"v": 1, "id": job_id, "pid": os.getpid()}, durable=False)


def take(repo: Repo) -> list[str]:
    """The requests waiting, oldest first, each taken (renamed) by this queue; ids only."""
    place = folder(repo)
    if not place.is_dir():
        return []
    found = []
    for path in sorted(place.glob(f"*{REQUEST}"), key=_age):
        if path.name.endswith(DONE):
            continue
        job_id = path.name[:-len(REQUEST)]
        if not is_job_id(job_id):
            continue
        try:
            os.rename(path, place / f"{job_id}{TAKEN}")
        except OSError:
            continue  # taken back by its requester meanwhile
        found.append(job_id)
    return found


def answer(repo: Repo, job_id: str, answered: dict) -> None:
    """The outcome of a job the queue took, for its requester."""
    write_json(folder(repo) / f"{job_id}{DONE}", {"v": 1, **answered}, durable=False)


def answered(repo: Repo, job_id: str) -> dict | None:
    """The queue's answer for `job_id`, once it is there (its files then removed)."""
    place = folder(repo)
    try:
        data = json.loads((place / f"{job_id}{DONE}").read_text())
    except (OSError, ValueError):
        return None
    for name in (f"{job_id}{DONE}", f"{job_id}{TAKEN}"):
        (place / name).unlink(missing_ok=True)
    return data if isinstance(data, dict) else None


def take_back(repo: Repo, job_id: str) -> None:
    """Withdraw a request (whether or not a queue took it: called under the land lock, when no
    queue runs, or when the requester is interrupted and no queue took it)."""
    place = folder(repo)
    for name in (f"{job_id}{REQUEST}", f"{job_id}{TAKEN}"):
        (place / name).unlink(missing_ok=True)


def pending(repo: Repo, job_id: str) -> bool:
    """Is the request still waiting for a queue to take it?"""
    return (folder(repo) / f"{job_id}{REQUEST}").exists()


def _age(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
