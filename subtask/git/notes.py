"""The review view: a block per job in `refs/notes/subtask`, derived from the records.

The block stands on the job's final head commit, or on its base when it made no commit, so
`git log --notes=subtask` shows what was delegated where it landed. When the commit it landed in
does not carry that head (a squash, a rebase, a cherry-pick: a new commit), a copy of the block
stands there too, saying so (`landed:  here, from its head …`), so the target's log shows it
exactly once: a fast-forward or a merge commit carries the head, whose block the log shows
already (a merge commit's is on its second parent: `git log --first-parent` does not show it, the
merge commit's `Subtask-Id:` trailer names the job). Notes are derived data:
`rebuild` regenerates every block from the records and is idempotent, and drops every block no
record explains: a note's block is data, a record is its only authority. The writing itself
(compare-and-swap, fanout, file lock) lives in `notes_store`.

Never set `notes.rewriteRef` for this ref: a "verify passed" must not follow a rebase onto a tree
that was never tested.

Invariants:
- Never put a job's block on a landed commit that carries the commit its block stands on (a
  fast-forward, a merge commit), only on one that does not (a squash, a rebase: `landed_copy`),
  because `git log --notes=subtask main` shows each commit it walks: a copy on a merge commit
  showed the block twice, none on a squash commit showed it nowhere (`land::test_the_review_block_*`).
- Never keep a note block that no record explains (`notes rebuild`), because blocks arrive by
  `pull` and a block is data, not evidence.
- Never use `cat_sort_uniq` for these notes, because it sorts lines and mixes two jobs' blocks;
  `union` keeps blocks whole.
"""

from __future__ import annotations

from subtask.git import notes_store, records, where_landed
from subtask.git.gitrepo import Repo, git
from subtask.git.records import Job
from subtask.state import paths
from subtask.words import note_block

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from pathlib import Path

    from subtask.model.provenance import Provenance


def lock_path(repo: Repo) -> Path:
    return repo.state_dir / paths.NOTES_LOCK


def target_commit(job: Job) -> str:
    """Where the job's block stands: the head it produced, else its base."""
    attempt = job.state.current
    if job.evidence is not None and job.evidence.head:
        return job.evidence.head
    return attempt.head or job.spec.base


def previous_targets(job: Job) -> set[str]:
    """Commits where earlier attempts' blocks may stand (the note shows only the latest)."""
    targets = {job.spec.base}
    for attempt in job.state.attempts[:-1]:
        if attempt.head:
            targets.add(attempt.head)
    return targets


def landed_copy(repo: Repo, job: Job, landed_in: str | None) -> str | None:
    """The commit the job landed in when it does not carry the commit its block stands on (a new
    commit: squash, rebase); None when it does, or the job has not landed."""
    head = target_commit(job)
    if not landed_in or landed_in == head:
        return None
    objects = repo.objects
    if any(found is None or found[0] != "commit" for found in objects.read([landed_in, head])):
        return None  # a commit this clone lacks: no block to put there
    return None if objects.is_ancestor(head, landed_in) else landed_in


def blocks_of(repo: Repo, job: Job, provenance: Provenance | None = None,
              landed_in: str | None = None) -> list[tuple[str, str, str]]:
    """(commit, job id, block) of each block the job's record makes: on its head, and a copy on
    the commit it landed in when that is a new commit (`landed_copy`)."""
    target = target_commit(job)
    landed_in = landed_in or job.state.landed_in
    found = [(target, job.id, note_block(job, provenance, landed_in))]
    copy = landed_copy(repo, job, landed_in)
    if copy is not None:
        found.append((copy, job.id, note_block(job, provenance, landed_in, from_head=target)))
    return found


def write_for_job(repo: Repo, job: Job) -> None:
    provenance = None
    if job.signed:  # only then is there anything to check (and the module to load)
        from subtask.git import signing

        provenance = signing.check_one(repo, job.tip, job.signed)
    items = blocks_of(repo, job, provenance, where_landed.commit_of(repo, job))
    objects = repo.objects
    notes_store.set_blocks_bulk(objects, items, lock_path(repo))
    for old in previous_targets(job) - {commit for commit, _, _ in items}:
        if job.id in notes_store.read_blocks(objects, old):
            notes_store.remove_block(objects, old, job.id, lock_path(repo))


def rebuild(repo: Repo) -> int:
    """Regenerate every job's block from its record, and drop every block no record explains
    (a forged or stale block pulled from a remote, a block left on a commit the job no longer
    stands on). Human text in a note stays. Returns how many blocks changed."""
    ended = []
    places: dict[str, set[str] | None] = {}  # job id -> commits its blocks may stand on (None: any)
    marked = where_landed.marks(repo)
    for job_id in records.all_ids(repo):
        try:
            job = records.read(repo, job_id)
        except Exception:
            places[job_id] = None  # a damaged record: keep its blocks, they may be all that is left
            continue
        copy = landed_copy(repo, job, job.state.landed_in or marked.get(job_id))
        if job.state.attempts and job.state.current.terminal:
            ended.append(job)
            place = {target_commit(job)}
        else:  # running again: its earlier block stays until the worker rewrites it
            place = {target_commit(job)} | previous_targets(job)
        places[job_id] = place | ({copy} if copy else set())

    from subtask.git import signing

    # one git run for them all (a signed record has a tip: it was read from a commit)
    signed = signing.check(repo, [job.tip for job in ended if job.signed and job.tip])
    items = [item for job in ended for item in blocks_of(
        repo, job, signed.get(job.tip) if job.signed and job.tip else None, marked.get(job.id))]

    def explained(commit: str, job_id: str) -> bool:
        if job_id not in places:
            return False
        allowed = places[job_id]
        return allowed is None or commit in allowed

    return notes_store.rewrite_blocks(repo.objects, items, explained, lock_path(repo))


NOTES_MERGE_STRATEGY = "union"


def ensure_notes_config(repo: Repo) -> list[str]:
    """First use: `notes.subtask.mergeStrategy` (a user's own choice is kept). Returns what changed.

    `union`, not `cat_sort_uniq`: a block is several lines in a fixed order, and cat_sort_uniq sorts
    the lines of both notes together, which interleaves two jobs' blocks and moves each header
    away from its lines (measured). `union` keeps every block whole; a block present on both sides
    in two versions is read back as one (the block parser keeps the last per job id) and
    `git subtask notes rebuild` rewrites it from the record. `notes.rewriteRef` is never set: a
    "verify passed" must not follow a rebase onto a tree that was never tested.
    """
    if repo.config.git("notes.subtask.mergestrategy") is not None:
        return []
    # Best effort: many first jobs may finish at once and race for .git/config's lock; one wins.
    written = git(repo.root, "config", "--local", "notes.subtask.mergeStrategy", NOTES_MERGE_STRATEGY, check=False)
    return [f"notes.subtask.mergeStrategy = {NOTES_MERGE_STRATEGY}"] if written.returncode == 0 else []
