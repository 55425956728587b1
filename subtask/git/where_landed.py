"""Where a job landed: its record's `landed_in`, or for a teammate's job, a local ref.

A pulled record is its writer's to update (`ownership`): `merge` and `land` of a teammate's job
write nothing in it. The commit that landed it here is kept in a local ref instead,
`refs/subtask-landed/<id>`, which `push` and `pull` never move (they move `refs/subtask/*`
only), so no teammate can mark a job landed in this clone. `list`, `merge`'s gate and the review
block read it beside the record.

Invariants:
- Never write a landed mark for a job this clone owns, because its record says where it landed.
- A mark is made once (compare-and-swap from absent) and never moved: a job lands once.
- Never record that a teammate's job landed in its record, nor in a ref that travels, because the
  record is theirs and a pulled mark would let a teammate call a job landed here: the fact is the
  local `refs/subtask-landed/<id>` (`where_landed`), read by `list`, `merge`'s gate and the notes.
"""

from __future__ import annotations

from subtask.git.chains import cas_ref
from subtask.git.gitrepo import Repo
from subtask.git.records import Job
from subtask.model.job import is_job_id

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    from typing import Any

    from subtask.git.gitobjects import Ref

PREFIX = "refs/subtask-landed/"


def ref(job_id: str) -> str:
    if not is_job_id(job_id):
        raise ValueError(f"not a job id: {job_id!r}")
    return PREFIX + job_id


def mark(repo: Repo, job_id: str, commit: str) -> None:
    """Say here that another clone's job landed in `commit` (kept when a mark is already there)."""
    cas_ref(repo, ref(job_id), None, commit, "git-subtask: a teammate's job landed here")


def commit_of(repo: Repo, job: Job) -> str | None:
    """The commit the job landed in: its record's word, else this clone's mark."""
    if job.state.landed_in:
        return job.state.landed_in
    found = repo.objects.ref(ref(job.id))
    return found.target if found is not None and not found.symbolic else None


def marks(repo: Repo, listed: list[Ref] | None = None) -> dict[str, str]:
    """Job id -> the commit it landed in here, for every marked job (one listing; of `listed`,
    the refs already listed under `PREFIX` and maybe others, when given)."""
    refs = repo.objects.refs(PREFIX) if listed is None else listed
    return {r.name[len(PREFIX):]: r.target for r in refs if r.name.startswith(PREFIX) and not r.symbolic}


def add_to_entries(repo: Repo, entries: list[dict[str, Any]], listed: list[Ref] | None = None) -> None:
    """Set `landed` on the `list` entries of jobs marked landed here whose record does not say so."""
    if not any(not e.get("landed") for e in entries):
        return
    found = marks(repo, listed)
    for entry in entries:
        if not entry.get("landed") and entry.get("id") in found:
            entry["landed"] = found[entry["id"]]
