"""`git subtask merge`: one finished job merged into the current branch, behind its gate.

Invariants:
- Never take a record's verify at its word in `merge` unless this clone wrote the record or an
  allowed signer signed it (`trust_of`: git's `%G?` = `G` with this clone's
  `gpg.ssh.allowedSignersFile` or keyring), because a record's word is what a gamed job would push:
  any other has its verify run here on the exact commit, which is then what is merged (the record
  tip and the branch re-checked under the merge's locks); `--force` is the only way past a
  failure. A record with no verify command to run is refused, because nothing but its word says
  it works.
- Never merge a job's head pin in place of its missing branch (a teammate's, pulled without it)
  unless the pin is where the record leaves the job, and never past the gate, because a pulled
  pin is a teammate's word too (`provenance::test_a_teammates_job_pulled_without_its_branch_*`);
  a teammate's job that landed is this clone's mark (`where_landed`), never a write to its record.
- Never stash or merge over a dirty worktree; abort a conflict fully (`git merge --abort`, or `git
  reset --merge` for a squash), because the user's work comes first: the worktree is left as it was.
- Never run two git-subtask merges into one worktree at once (`index_lock`, keyed by the
  worktree's own git dir; the job's run-lock held too), because `merge --squash` then `commit` are
  two git runs and another merge between them commits or resets the wrong index; a failed merge
  resets to the HEAD read under that lock, and never when HEAD moved.
- Nothing unmerged is ever deleted; records stay (cleanup.py's invariants hold for what a merge
  cleans up after itself).
- Never let `merge` pretend: a job with no commits beyond its base is refused (exit 1, "nothing to
  merge", not even `--force`) and never recorded as landed, because no work of it is in the target;
  a merge git answered "Already up to date" says so and records where the target already had it.
- Never merge into a detached HEAD, and never treat one as the land target, because no branch keeps
  the result while the job's branch would be deleted as landed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from subtask.git import notes, ownership, records, signing, where_landed
from subtask.git.gitrepo import Repo, git
from subtask.git.records import Job
from subtask.model import lazyre
from subtask.model.dataclass import dataclass
from subtask.model.errors import EXIT_FATAL, SubtaskError
from subtask.model.job import work_base
from subtask.ops.landing import verify_rerun
from subtask.ops.landing.cleanup import finish_landed
from subtask.ops.landing.landed import Target, branch_ref, merge_point, recorded_head
from subtask.state import liveness, paths
from subtask.state.statefiles import LockTimeout, file_lock
from subtask.words import task_title

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    import pygit2


MERGE_MODES = ("merge", "squash", "no-ff", "ff-only")


# ---------------------------------------------------------------- merge

@dataclass
class MergeResult:
    """What `merge` answers for the job it merged."""

    job: Job
    mode: str
    commit: str
    into: str
    lines: list[str]


def merge(repo: Repo, id_or_prefix: str, mode: str = "merge", force: bool = False,
          reverify: bool = False) -> MergeResult:
    """Merge a finished, verified job into the current branch, then clean up after it.

    The verify a record claims is taken only from a record this clone wrote, or one an allowed
    signer signed (`trust_of`); any other (and every one with `reverify`) has its verify run
    again here on the exact commit before anything is merged (`verify_rerun.run`, outside the
    locks), and that commit is what is merged. `force` skips the gate, and nothing else does.
    Serialized per target worktree (`index_lock`) and holding the job's run-lock, so two merges
    never interleave in one index and no reply starts on the job meanwhile.
    """
    if mode not in MERGE_MODES:
        raise SubtaskError("usage", f"unknown merge mode {mode!r} ({', '.join(MERGE_MODES)})")
    job_id = records.resolve(repo, id_or_prefix)
    job = records.read(repo, job_id)
    trust = trust_of(repo, job, reverify)
    head = check_mergeable(repo, job, force, trust.claims)  # refuse at once, not after the locks
    lines = [trust.line] if trust.line else []
    if not force and not trust.claims:
        lines.append(_rerun_gate(repo, job, head, trust.line, trust.vouched))
    workdir = Path(repo.git.workdir)
    with index_lock(repo, workdir), _run_lock_for_merge(repo, job_id):
        fresh = records.read(repo, job_id)
        fresh_head = check_mergeable(repo, fresh, force, trust.claims)
        # What was judged (a re-run on `head`, a signature on that tip) holds for that record only.
        if not trust.owned and fresh.tip != job.tip or not trust.claims and fresh_head != head:
            raise SubtaskError("negative", f"{job.id} changed while it was checked (its branch or record moved): "
                               "not merging what was not checked", hint=f"git subtask merge {job.id}")
        return _merge_locked(repo, fresh, fresh_head, workdir, mode, lines, owned=trust.owned)


@dataclass
class Trust:
    """What `merge` may take from a record: its verify as claimed (`claims`), or only by re-running it."""

    claims: bool
    owned: bool
    line: str  # what merge says about it; "" for this clone's own job taken as recorded
    vouched: bool = False  # this clone's record, or an allowed signer's: its opt-out of the harness holds


def trust_of(repo: Repo, job: Job, reverify: bool = False) -> Trust:
    if ownership.owns(repo, job):
        return Trust(not reverify, True, "", True)
    provenance = signing.check_one(repo, job.tip, job.signed)
    if not provenance.trusted:
        return Trust(False, False, f"{job.id}: another clone's job, and its record is {provenance.words()}: "
                                   "its verify is run here before merging")
    if reverify:
        return Trust(False, False, "", True)
    return Trust(True, False, f"{job.id}: another clone's job; its record is {provenance.words()}: "
                              "its verify is taken as recorded", True)


def _rerun_gate(repo: Repo, job: Job, head: str, why: str, vouched: bool) -> str:
    """Run the job's verify here on `head` (`reverify`); its line, or the refusal (saying `why`
    the record was not taken at its word) when it fails."""
    because = f"\n{why}" if why else ""
    if not job.spec.verify:
        raise SubtaskError("negative", f"{job.id}: its record names no verify command to run here, and nothing "
                           f"else says it works: not merging it{because}",
                           hint=f"git subtask diff {job.id}   (merge anyway: git subtask merge --force {job.id})")
    rerun = verify_rerun.run(repo, job, head, trusted_record=vouched)
    if not rerun.result.passed:
        how = "timed out" if rerun.result.timed_out else f"exit {rerun.result.exit_code}"
        if rerun.result.checks_failed:
            how += f"; check {', '.join(rerun.result.checks_failed)} failed"
        tail = rerun.result.output_tail.strip().splitlines()[-5:]
        raise SubtaskError("negative", f"{job.id}: verify failed when re-run here on {head[:7]} "
                           f"({rerun.result.command} -> {how}): not merging it"
                           + ("".join(f"\n  {line}" for line in tail)) + because,
                           hint=f"git subtask verify {job.id} --run   "
                                f"(merge anyway: git subtask merge --force {job.id})")
    return rerun.line(job.id)


def _merge_locked(repo: Repo, job: Job, head: str, workdir: Path, mode: str, lines: list[str], *,
                  owned: bool) -> MergeResult:
    into = _check_into(repo, job, workdir)
    check_clean(workdir)
    before = _head_of_worktree(workdir)
    message = merge_message(repo, job, head, mode)
    args = {"merge": ["--ff"], "no-ff": ["--no-ff"], "ff-only": ["--ff-only"], "squash": ["--squash"]}[mode]
    proc = git(workdir, "merge", "--no-edit", *args, "-m", message, head, check=False)
    if proc.returncode != 0:
        _abort(workdir, job, mode, into, proc, before)
    if mode == "squash":
        _commit_squash(workdir, job, message, into, before)
    commit = _head_of_worktree(workdir)
    how = merge_kind(mode, before, commit, head)
    landed = head if how == "fast-forward" else commit
    if how == "already":
        # The target already had the job's head (git said "Already up to date"): nothing merged,
        # but the work is in the target, so it has landed where the target first carried it.
        landed = merge_point(repo, head, commit)
        lines = [*lines, f"{job.id}: nothing to merge: {into} already has its commits (landed in {landed[:7]})"]
    else:
        lines = [*lines, f"{job.id}: merged into {into} ({how}) as {commit[:7]}"]
    target = Target(into, commit)
    if owned:
        lines += (finish_landed(repo, job, head, landed, target, held=True) or [""])[1:]
    else:
        lines.append(landed_elsewhere(repo, job, landed))
    return MergeResult(records.read(repo, job.id), mode, commit, into, lines)


def landed_elsewhere(repo: Repo, job: Job, commit: str) -> str:
    """A teammate's job landed here in `commit`: its record is theirs to update, its branch and
    worktree never ours to remove, so the fact is this clone's mark (`where_landed`), and its
    review block is written where the landing put it; the line that says so."""
    where_landed.mark(repo, job.id, commit)
    notes.write_for_job(repo, job)
    return f"{job.id}: its record and branch are left as they are (another clone's job)"


INDEX_LOCK_WAIT = 120.0
MERGE_RUN_LOCK_WAIT = 3.0


@contextmanager
def index_lock(repo: Repo, workdir: Path, git_dir: Path | None = None) -> Iterator[None]:
    """Exclusive right to write one worktree's index and HEAD, among git-subtask commands.

    Keyed by that worktree's own git dir (each worktree has its own index and HEAD; `git_dir`,
    default this repository's), kept in the state dir. git's `index.lock` alone does not
    serialize a merge: `merge --squash` then `commit` are two git runs, and another merge
    between them commits or resets the wrong index.
    """
    key = hashlib.sha1(str(Path(git_dir or repo.git.path).resolve()).encode()).hexdigest()[:16]
    lock = file_lock(paths.index_lock(repo.state_dir, key), timeout=INDEX_LOCK_WAIT)
    try:
        lock.acquire()
    except LockTimeout:
        raise SubtaskError("negative", f"another git-subtask merge into {workdir} has not finished after "
                           f"{INDEX_LOCK_WAIT:.0f} s: not merging now", hint="try again once it is done") from None
    try:
        yield
    finally:
        lock.release()


@contextmanager
def _run_lock_for_merge(repo: Repo, job_id: str) -> Iterator[None]:
    """The job's run-lock for the whole merge; a gc or cleanup holds it only briefly, so wait a little."""
    fd = liveness.acquire_within(repo.state_dir, job_id, MERGE_RUN_LOCK_WAIT)
    try:
        yield
    finally:
        liveness.release(fd)


def _head_of_worktree(workdir: Path) -> str:
    return git(workdir, "rev-parse", "HEAD").stdout.strip()


def merge_kind(mode: str, before: str, after: str, head: str) -> str:
    """What a successful `git merge` did: "fast-forward", "already" (HEAD unmoved), or the mode
    ("merge", "no-ff", "squash") when it made a commit; the words `merge` prints."""
    if after == before:
        return "already"
    if mode in ("merge", "ff-only") and after == head:
        return "fast-forward"
    return mode


def check_mergeable(repo: Repo, job: Job, force: bool, claims: bool = True) -> str:
    """The head to merge, or the refusal; `claims`: the record's verify may be taken as recorded
    (else only its state is, and `merge` runs its verify here)."""
    attempt = job.state.current
    if not job.spec.branch:
        raise SubtaskError("negative", f"{job.id} is a read-only job: it has no branch to merge")
    if branch_ref(job) is None:
        raise SubtaskError("negative", f"{job.id}: its record names the branch {job.spec.branch!r}, not "
                           f"{records.branch_name(job.id)}: never merging a branch a record names")
    if not attempt.terminal:
        raise SubtaskError("not_finished", f"{job.id} is {attempt.state}: it has not finished",
                           hint=f"git subtask wait {job.id}")
    if landed_in := where_landed.commit_of(repo, job):
        raise SubtaskError("negative", f"{job.id} already landed in {landed_in[:7]}")
    head = _head_to_merge(repo, job)
    if not force:
        _check_gate(job, head, claims)
    _check_has_commits(repo, job, head)
    return head


def _head_to_merge(repo: Repo, job: Job) -> str:
    """The job's branch tip; once the branch is gone (a teammate's job pulled without it), its
    head pin, where the record leaves the job: the gate then judges that commit as it would the
    branch's (a record this clone cannot trust has its verify run here on it)."""
    ref = repo.git.references.get(f"refs/heads/{job.spec.branch}")
    if ref is not None:
        return str(ref.target)
    pin = repo.git.references.get(records.pin_ref(job.id, "head"))
    if pin is None:
        raise SubtaskError("fatal", f"the branch {job.spec.branch} of {job.id} is gone, and so is its head pin "
                           f"{records.pin_ref(job.id, 'head')}: nothing says what its work is",
                           hint=f"git subtask verify {job.id}")
    head = str(pin.target)
    if head != recorded_head(job):
        raise SubtaskError("negative", f"{job.id}: its branch is gone and its head pin points at {head[:7]}, not "
                           f"where its record leaves the job ({recorded_head(job)[:7]}): not merging either",
                           hint=f"git subtask verify {job.id}")
    return head


def _check_has_commits(repo: Repo, job: Job, head: str) -> None:
    base = work_base(job)  # a reconciled job's branch holds the target's commits: none of them is its work
    if head == base or repo.git.descendant_of(base, head):
        # Not even --force: merging the base would be "Already up to date" dressed as a merge, and
        # recording it landed would claim work that never existed.
        raise SubtaskError("negative", f"nothing to merge: {job.id} made no commits (its branch is at its base "
                           f"{base[:7]})",
                           hint=f"git subtask show {job.id}   (remove its empty branch: git subtask cleanup {job.id})")


def _check_gate(job: Job, head: str, claims: bool = True) -> None:
    """Done, verify passed on this exact head (what --force skips); without `claims`, done only."""
    attempt = job.state.current
    if attempt.state != "done":
        raise SubtaskError("not_finished", f"{job.id} ended {attempt.state}, not done: not merging it",
                           hint=f"git subtask show {job.id}   (merge anyway: git subtask merge --force {job.id})")
    if not claims:
        return
    verify = attempt.verify
    if verify is not None and not verify.passed:
        raise SubtaskError("negative", f"{job.id}: verify failed ({verify.command} -> exit {verify.exit_code}): "
                           "not merging it",
                           hint=f"git subtask result {job.id}   (merge anyway: git subtask merge --force {job.id})")
    if verify is not None and head != verify.head:
        raise SubtaskError("negative", f"{job.id}: its branch moved to {head[:7]} after verify tested "
                           f"{verify.head[:7]}: the merged tree would be untested",
                           hint=f"git subtask diff {job.id}   (merge anyway: git subtask merge --force {job.id})")


def _check_into(repo: Repo, job: Job, workdir: Path) -> str:
    if repo.git.head_is_unborn:
        raise SubtaskError("fatal", "the current branch has no commits yet")
    if repo.git.head_is_detached:
        # A merge into a detached HEAD is kept by no branch, yet the job's branch would be deleted
        # as landed: after `git switch main` the work would hang on the pin alone.
        configured = repo.config.get("landTarget")
        fix = f"git switch {configured}" if configured else "git switch <branch>  (e.g. git switch main)"
        raise SubtaskError("fatal", f"HEAD is detached at {str(repo.git.head.target)[:7]}: "
                           f"not merging {job.id} into a commit no branch keeps",
                           hint=f"{fix}, then: git subtask merge {job.id}")
    name = repo.git.head.shorthand
    if name == job.spec.branch:
        raise SubtaskError("usage", f"the current branch is the job's own branch {name}",
                           hint="check out the branch to merge into, e.g. git switch main")
    return name


def check_clean(workdir: Path) -> None:
    # Tracked changes only: git itself refuses (changing nothing) when an untracked file would be overwritten.
    status = git(workdir, "status", "--porcelain", "--untracked-files=no").stdout
    if status.strip():
        files = [line[3:] for line in status.splitlines()][:10]
        raise SubtaskError("dirty", f"the worktree {workdir} has uncommitted changes ({', '.join(files)}): "
                           "not merging into it (your work is never stashed)",
                           hint="commit or stash them yourself, then merge again",
                           exit_code=EXIT_FATAL)


SUBTASK_ID = "Subtask-Id: "  # the trailer that names the job in a landing's commit message


def merge_message(repo: Repo, job: Job, head: str, mode: str) -> str:
    if mode == "squash":
        return _squash_message(repo, job, head)
    return f"Merge subtask {job.id}: {task_title(job.spec.task, 60)}\n\n{SUBTASK_ID}{job.id}\n"


def _squash_message(repo: Repo, job: Job, head: str) -> str:
    """One commit's message stays its own; several are named by the job's summary (else its task)
    and listed, oldest first, so the squash says what it holds."""
    commits = _commits_since_base(repo, work_base(job), head)
    trailer = f"Squashed from subtask {job.id}.\n\n{SUBTASK_ID}{job.id}\n"
    if len(commits) == 1:
        subject, _, body = commits[0].message.strip().partition("\n")
        # The worker's own commit carries the trailer already: said once, in the trailer above.
        body = "\n".join(line for line in body.splitlines() if line.strip() != f"{SUBTASK_ID}{job.id}").strip()
        return f"{subject.strip()}\n\n" + (f"{body}\n\n" if body else "") + trailer
    summary = (job.summary or "").strip()
    title = task_title(summary, 72) if summary else task_title(job.spec.task, 60)
    listed = "\n".join(f"- {c.message.strip().splitlines()[0] if c.message.strip() else str(c.id)[:7]}"
                        for c in commits)
    return f"{title}\n\n" + (f"{listed}\n\n" if listed else "") + trailer


def _commits_since_base(repo: Repo, base: str, head: str) -> list[pygit2.Commit]:
    import pygit2

    walker = repo.git.walk(head, pygit2.enums.SortMode.TOPOLOGICAL | pygit2.enums.SortMode.REVERSE)
    walker.hide(base)
    return [c for c in walker if len(c.parents) <= 1]  # merges inside the job say nothing of their own


def _abort(workdir: Path, job: Job, mode: str, into: str, proc, before: str) -> None:
    conflicts = git(workdir, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split("\n")
    conflicts = [c for c in conflicts if c]
    _restore(workdir, before)
    if conflicts:
        raise SubtaskError("conflict", f"merging {job.id} into {into} conflicts in: {', '.join(conflicts)}; "
                           "the merge was aborted and nothing changed", hint=_conflict_hint(job, into))
    words = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    reason = " ".join(words[-3:]) if words else f"git merge exited {proc.returncode}"
    hint = "use --no-ff or plain merge, or rebase the job" if mode == "ff-only" else None
    raise SubtaskError("negative", f"git merge of {job.id} into {into} did not happen: {reason}", hint=hint)


def _conflict_hint(job: Job, into: str) -> str:
    """What to type after a conflict. An agent can be asked to rebase in words; a shell job's reply
    is a script, and words would run as one (and fail): it gets the commands to run by hand."""
    by_hand = f"git merge {job.spec.branch}   # then resolve, git add, git commit"
    if job.spec.engine == "shell":
        where = (f"git -C '{job.spec.worktree}' rebase {into}" if Path(job.spec.worktree).is_dir()
                 else f"git switch {job.spec.branch} && git rebase {into}")
        return f"rebase the job's branch by hand: {where}   (or merge by hand: {by_hand})"
    return (f"ask the job to rebase: git subtask reply {job.id} 'rebase onto {into} and resolve the conflicts'"
            f"   (or merge by hand: {by_hand})")


def _restore(workdir: Path, before: str) -> None:
    """Put the worktree back as it was before our merge: its tracked files were clean, so index
    and files equal `before`. Never when HEAD moved (someone else committed: keep their work)."""
    if git(workdir, "rev-parse", "HEAD", check=False).stdout.strip() == before:
        git(workdir, "reset", "--quiet", "--merge", before, check=False)


IDENTITY_RE = lazyre.compile(r"who you are|ident|auto-detect|no (?:name|email) was given", re.IGNORECASE)


def _commit_squash(workdir: Path, job: Job, message: str, into: str, before: str) -> None:
    staged = git(workdir, "diff", "--cached", "--quiet", check=False).returncode
    if staged == 0:
        _restore(workdir, before)
        raise SubtaskError("negative", f"{job.id}: its changes are already in {into}; nothing to squash")
    proc = git(workdir, "commit", "--quiet", "--no-verify", "-F", "-", input=message, check=False)
    if proc.returncode != 0:
        _restore(workdir, before)
        words = proc.stderr.strip() or proc.stdout.strip()
        hint = ("set your identity: git config user.name ...; git config user.email ..." if IDENTITY_RE.search(words)
                else None)
        raise SubtaskError("fatal", f"could not commit the squash of {job.id} (nothing changed): {words}", hint=hint)
