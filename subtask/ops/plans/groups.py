"""Groups of jobs: best-of-N (N ordinary jobs racing at one task, and the pick verify and a rule
make) and maps (`git subtask map`: one job per batch of files, at most `concurrency` running).

A group is a record like a job's: a commit chain at `refs/subtask/groups/<gid>/record` whose tree
holds `group.json` (members, rule, and once decided the pick and the ranking table) and whose
subject is the group's one-line status. Its members are ordinary jobs (`spec.group`,
`spec.member`); once the group is decided each member's record carries its place
(`state.group_place`: rank, pick, superseded), so its note says it and `notes rebuild` keeps it.

Invariants:
- Never decide a group but under `groups/<gid>.lock` with the record re-read there, nor
  overwrite a terminal group state (picked, no_pick, stopped: compare-and-swap on the tip read),
  because the last member's worker, a `wait` and a `list` may all see the last member end: one
  decides, judges run once per passing member, the others read the pick (test:
  `groups::test_settles_racing_at_the_last_member_decide_once_and_judge_once`). Facts (merged,
  superseded) are added to a terminal record; its pick and table never change.
- The pick is a function of the members' final records and the judge's scores only: whoever sees
  every member ended (`conclude`) computes it under `groups/<gid>.lock`, so judges run once per
  group, and a conclusion that dies (kill -9) leaves the group `running` for the next command.
- Never hand a first-pass loser a slot, because its work is no longer wanted: once one member
  has passed, whoever sees it (the winner's worker) stops the rest, queued ones first, before it
  frees its own slot; their reservations close as any stopped job's do. The pick is then the
  passing member that ended first (ties to the earlier member).
- Never write a member's place (`state.group_place`) while its worker holds its run-lock, because
  that worker's note write would then overwrite the note that says it: the place is written after
  the group record (`complete`), never by guessing; the worker completes its own place after its
  note, and `wait`/`merge`/`stop` of a group wait for the workers first.
- A map group (`kind` "map") has no pick: once every member has ended it is `done` when each
  passed (done, and verify passed where it has one), else `failed`; decided once, like a pick.
  Its bound on running members lives in their slot entries (`slots` pools), not here.
- Merging a group lands the pick through `merge.merge` (its gate); the others are superseded:
  their clean worktrees removed under their run-locks, their branches deleted only where the head
  pin keeps the branch tip (or the branch holds no commit), so every member's work stays reachable.
- Never write the group record before its members' records, because a `list` in between would
  see members without records as ended and decide the group while its start is still running; a
  crash between the two leaves ordinary failed jobs and no group.
- Never delete a superseded member's branch unless its head pin keeps the tip (or the branch
  holds no commit beyond its base), because the pin is then all that keeps its work reachable; a
  commit added after the job ended keeps the branch.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

from subtask import words as render
from subtask.git import chains, notes, ownership, records, worktrees
from subtask.git.gitrepo import Repo
from subtask.git.records import Job
from subtask.model import faults, lazyre, money
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.model.job import TERMINAL as TERMINAL_JOB
from subtask.model.job import _Record, job_passed, now, work_base
from subtask.model.redact import redact
from subtask.ops.landing import overlay
from subtask.ops.running import lifecycle
from subtask.proc import isolation, procs
from subtask.state import liveness, paths
from subtask.state.statefiles import file_lock, write_json

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any

GROUP_ID_RE = chains.GROUP.id_re
GROUP_PREFIX_RE = lazyre.compile(r"sg-[0-9a-f]{0,8}")
GROUPS_PREFIX = chains.GROUP.prefix
RULES = ("smallest", "cheapest", "fastest")
MIN_MEMBERS, MAX_MEMBERS = 2, 8
TERMINAL = ("picked", "no_pick", "stopped", "done", "failed")  # done, failed: a map's ends
KINDS = ("best_of", "map")
MAX_MAP_JOBS = 1000
DECIDE_LOCK_WAIT = 3600.0  # a conclusion holds the lock while judges run (each bounded by verifyTimeout)


def new_group_id() -> str:
    return "sg-" + os.urandom(4).hex()


def group_ref(gid: str) -> str:
    return chains.GROUP.record_ref(gid)


@dataclass
class Group(_Record):
    """A group's record (`group.json`): its members, its rule and, once decided, its pick."""

    id: str
    task: str  # redacted, as the members' records hold it
    base: str
    verify: str  # redacted
    created_at: float
    members: list[str]
    engines: list[str]
    models: list[str | None]
    rule: str = "smallest"  # smallest | cheapest | fastest | judge
    judge: str | None = None  # redacted; the command as written is in <state>/run/<gid>.judge.json
    first_pass: bool = False
    kind: str = "best_of"  # best_of | map
    concurrency: int | None = None  # a map: at most this many members run at once
    pattern: str | None = None  # a map: the glob its files matched
    batch: int | None = None  # a map: files per job
    state: str = "running"  # running | picked | no_pick | stopped; a map: running | done | failed | stopped
    pick: str | None = None
    table: list[dict[str, Any]] = field(default_factory=list)
    reason: str | None = None
    decided_at: float | None = None
    merged: dict[str, Any] | None = None  # {"commit", "into", "superseded": [ids]}
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def is_map(self) -> bool:
        return self.kind == "map"

    @property
    def rule_text(self) -> str:
        if self.is_map:
            return f"map, {self.concurrency or 'any'} at once"
        if self.first_pass:
            return "first to pass"
        return f"judge {render.task_title(self.judge or '', 40)}" if self.rule == "judge" else self.rule


# ---------------------------------------------------------------- the record

def status_line(group: Group) -> str:
    if group.is_map:
        parts = [f"map {group.id} {group.state}", f"{len(group.members)} jobs", f"{group.concurrency or 'any'} at once"]
    else:
        parts = [f"group {group.id} {group.state}"]
        if group.pick:
            parts.append(f"pick {group.pick}")
        parts.append(f"{len(group.members)} members")
        parts.append(f"rule {group.rule_text}")
    if group.merged:
        parts.append(f"merged as {render.short(group.merged.get('commit'))}")
    parts.append(render.task_title(group.task))
    return render.safe_line(" · ".join(parts))


def _write_commit(repo: Repo, group: Group, parent: str | None) -> str:
    data = (json.dumps(group.to_dict(), indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode()
    return repo.objects.write_commit([("group.json", data)], status_line(group) + "\n", [parent] if parent else [])


def create(repo: Repo, group: Group) -> None:
    """The group's first record commit, with the ref that makes it this clone's (`ownership`)."""
    tip = _write_commit(repo, group, None)
    if repo.objects.update_refs([(group_ref(group.id), None, tip), (ownership.owned_ref(group.id), None, tip)],
                                "git-subtask: group") != "ok":
        raise SubtaskError("fatal", f"a record for group {group.id} already exists")


def delete(repo: Repo, gid: str) -> None:
    """Undo a group's start: its record, its ownership ref and its kept judge go."""
    for name in (group_ref(gid), ownership.owned_ref(gid)):
        ref = repo.objects.ref(name)
        if ref is not None:
            records.cas_ref(repo, ref.name, ref.target, None)
    _judge_file(repo, gid).unlink(missing_ok=True)


def read(repo: Repo, gid: str) -> tuple[Group, str]:
    """(group, record tip); a record that is not one raises (exit 128) naming how to inspect it."""
    ref = repo.objects.ref(group_ref(gid))
    if ref is None:
        raise SubtaskError("not_found", f"no group {gid} in {repo.root}", hint="git subtask list")
    tip = ref.target
    try:
        found = None if ref.symbolic else repo.objects.read([f"{tip}:group.json"])[0]
        if found is None or found[0] != "blob":
            raise ValueError(f"{group_ref(gid)} holds no group.json")
        group = Group.from_dict(json.loads(found[1].decode("utf-8", "replace")))
        if group.id != gid or not isinstance(group.members, list):
            raise ValueError("it names another group")
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise SubtaskError("damaged", f"the record of group {gid} is damaged: {exc}",
                           hint=f"inspect it: git log {group_ref(gid)}") from None
    return group, tip


def update(repo: Repo, gid: str, change) -> Group:
    """Apply `change` (returns False to write nothing) to the latest record (`chains.update`)."""
    group, _ = chains.update(repo, group_ref(gid), owner=gid, what=f"group {gid}", load=lambda: read(repo, gid),
                             change=change, write=lambda group, parent: _write_commit(repo, group, parent))
    return group


def all_ids(repo: Repo) -> list[str]:
    ids = []
    for ref in repo.objects.refs(GROUPS_PREFIX):
        if ref.name.endswith("/record"):
            gid = ref.name[len(GROUPS_PREFIX):-len("/record")]
            if GROUP_ID_RE.fullmatch(gid):
                ids.append(gid)
    return ids


def resolve(repo: Repo, text: str) -> str:
    if not isinstance(text, str) or GROUP_PREFIX_RE.fullmatch(text.lower()) is None:
        raise SubtaskError("usage", f"not a group id: {text!r} (group ids look like sg-1a2b3c4d)")
    matches = sorted(g for g in all_ids(repo) if g.startswith(text.lower()))
    if not matches:
        raise SubtaskError("not_found", f"no group matches '{text}'", hint="git subtask list")
    if len(matches) > 1:
        raise SubtaskError("usage", f"'{text}' is ambiguous: it matches {', '.join(matches[:10])}",
                           hint="give more characters of the id")
    return matches[0]


def keep_judge(repo: Repo, gid: str, command: str | None) -> None:
    """The judge as written, 0600 beside the repository (the record holds it redacted)."""
    if command:
        write_json(_judge_file(repo, gid), {"v": 1, "judge": command})


def _judge_file(repo: Repo, gid: str) -> Path:
    return Path(paths.run_file(repo.state_dir, gid, "judge.json"))


def _judge_as_written(repo: Repo, group: Group) -> str:
    try:
        data = json.loads(_judge_file(repo, group.id).read_text())
        if isinstance(data, dict) and isinstance(data.get("judge"), str):
            return data["judge"]
    except (OSError, ValueError):
        pass
    return group.judge or ""


# ---------------------------------------------------------------- the members and the pick

def members(repo: Repo, group: Group) -> dict[str, Job | None]:
    """Each member's record (None: it has none, e.g. its start crashed before writing it)."""
    found: dict[str, Job | None] = {}
    for job_id in group.members:
        try:
            found[job_id] = records.read(repo, job_id)
        except SubtaskError:
            found[job_id] = None
    return found


def _ended(job: Job | None) -> bool:
    return job is None or job.state.current.terminal


def passed(job: Job | None) -> bool:
    if job is None:
        return False
    attempt = job.state.current
    return attempt.state == "done" and attempt.verify is not None and attempt.verify.passed


def passed_group(group: Group) -> bool:
    """What `wait` exits 0 for, and a job `--after` the group starts on: a pick, or a map done."""
    return group.state == "picked" or (group.is_map and group.state == "done")


def member_row(index: int, job_id: str, job: Job | None) -> dict[str, Any]:
    """What the table says of one member, from its record alone."""
    if job is None:
        return {"member": job_id, "index": index, "state": "missing", "passed": False, "verify": None,
                "engine": None, "model": None, "added": 0, "deleted": 0, "lines": 0, "cost": None,
                "seconds": None, "ended_at": None, "note": "no record (its start did not finish)"}
    attempt = job.state.current
    totals = job.evidence.totals if job.evidence else {}
    added, deleted = int(totals.get("added") or 0), int(totals.get("deleted") or 0)
    seconds = attempt.ended_at - attempt.started_at if attempt.started_at and attempt.ended_at else None
    verify = None if attempt.verify is None else ("passed" if attempt.verify.passed else "failed")
    return {"member": job_id, "index": index, "state": attempt.state, "passed": passed(job), "verify": verify,
            "engine": job.spec.engine, "model": attempt.model or job.spec.model, "added": added,
            "deleted": deleted, "lines": added + deleted, "cost": money.to_json(render.attempt_cost(attempt)),
            "seconds": None if seconds is None else round(seconds, 3), "ended_at": attempt.ended_at,
            "note": attempt.reason if attempt.state != "done" else _verify_note(attempt.verify)}


def _verify_note(verify) -> str | None:
    if verify is None or verify.passed:
        return None
    return "verify timed out" if verify.timed_out else f"verify exited with code {verify.exit_code}"


def rank(rows: list[dict[str, Any]], rule: str, first_pass: bool = False) -> list[dict[str, Any]]:
    """The rows in rank order, each with its `rank`: passing members first, then by the rule
    (the judge's `score`, higher first; a member the judge could not score after every scored
    one), ties to the earlier member; members that did not pass follow in member order."""
    def key(row: dict[str, Any]) -> tuple:
        if not row["passed"]:
            return (1, 0, 0.0, row["index"])
        if first_pass:
            return (0, 0, row["ended_at"] or math.inf, row["index"])
        if rule == "judge":
            score = row.get("score")
            return (0, 1, 0.0, row["index"]) if score is None else (0, 0, -score, row["index"])
        value = {"smallest": row["lines"], "cheapest": row["cost"] or 0.0,
                 "fastest": row["seconds"] if row["seconds"] is not None else math.inf}[rule]
        return (0, 0, float(value), row["index"])

    ordered = sorted(rows, key=key)
    for n, row in enumerate(ordered, 1):
        row["rank"] = n
    return ordered


JUDGE_TAIL_BYTES = 4096


def run_judge(repo: Repo, group: Group, command: str, job: Job) -> tuple[float | None, str | None]:
    """(score, None), or (None, why it has none): the judge's last line must be a number."""
    worktree = Path(job.spec.worktree)
    if not worktree.is_dir():
        return None, "judge: no worktree to run in"
    env = dict(os.environ, SUBTASK_JOB_ID=job.id, SUBTASK_GROUP_ID=group.id,
               SUBTASK_GROUP_MEMBER=str(job.spec.member or 0))
    env.pop("SUBTASK_LOCK_FD", None)
    # The judge runs on what the member wrote (a conftest.py, a Makefile): in its sandbox.
    (worktree.parent / ".tmp").mkdir(mode=0o700, exist_ok=True)
    tmpdir = Path(tempfile.mkdtemp(prefix=f"judge-{job.id}-", dir=worktree.parent / ".tmp"))
    # Its admin folder is the one git made for the member, never what its `.git` names (its verify may write it).
    sandbox = isolation.outside_sandbox(repo, worktree, worktrees.expected_admin(repo, job.id), tmpdir,
                                        job.spec.network)
    env.update(isolation.temp_env(tmpdir))
    env = sandbox.withhold(env) if sandbox is not None else env
    # Scored with the member's base's tests in place of its own, as its verify was (ops/landing/overlay.py).
    from subtask.ops.landing import landed

    head = landed.recorded_head(job)
    judge = overlay.prepare(repo, asked=job.spec.harness, command=command, trusted=work_base(job), source="base",
                            worktree=worktree, head=head, kept=overlay.read_snapshot(repo, job.id), env=env)
    try:
        if judge.error:
            return None, redact(f"judge: {judge.error}")
        if judge.shadows:
            return None, redact(f"judge: check {overlay.SHADOWING} failed: {judge.shadows[0]}")
        with overlay.overlaid(repo, judge, worktree, overlay.stash_of(repo, job.id), tmpdir) as extra:
            result = procs.run(["sh", "-c", command], cwd=worktree, env={**env, **extra},
                               timeout=repo.config.number("verifyTimeout"), tail_bytes=JUDGE_TAIL_BYTES,
                               stdout_grace=2.0, redact=True, sandbox=sandbox)
    finally:
        if sandbox is not None:
            sandbox.close()
        shutil.rmtree(tmpdir, ignore_errors=True)
    if result.timed_out:
        return None, "judge timed out"
    if result.exit_code != 0:
        return None, f"judge exited with code {result.exit_code}"
    lines = [line.strip() for line in result.stdout_tail.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    try:
        score = float(last)
    except ValueError:
        score = math.nan
    if not math.isfinite(score):
        return None, redact(f"judge printed no number (last line {last[:40]!r})")
    return score, None


def decide(repo: Repo, group: Group, jobs: dict[str, Job | None]) -> tuple[list[dict], str | None, str]:
    """(table, pick, reason) for a group whose members have all ended; runs the judge if any."""
    rows = [member_row(n, job_id, jobs.get(job_id)) for n, job_id in enumerate(group.members, 1)]
    if group.is_map:
        for row in rows:
            row["passed"] = (job := jobs.get(row["member"])) is not None and job_passed(job)
        failed = [row["member"] for row in rows if not row["passed"]]
        return rows, None, (f"all {len(rows)} passed" if not failed else
                            f"{len(failed)} of {len(rows)} did not pass: {', '.join(failed[:10])}")
    if group.rule == "judge" and not group.first_pass:
        command = _judge_as_written(repo, group)
        for row in rows:
            if row["passed"] and (job := jobs.get(row["member"])) is not None:  # (a passed row has one)
                row["score"], why = run_judge(repo, group, command, job)
                if why:
                    row["note"] = why
    table = rank(rows, group.rule, group.first_pass)
    if not table or not table[0]["passed"]:
        return table, None, "no member passed verify"
    best = table[0]
    return table, best["member"], f"member {best['index']}, {why_first(group, best)}"


def why_first(group: Group, row: dict[str, Any]) -> str:
    if group.first_pass:
        return "first to pass verify"
    if group.rule == "judge":
        score = row.get("score")
        return f"judge score {score:g}" if isinstance(score, (int, float)) else \
            "no judge score for any member: the first that passed verify"
    if group.rule == "cheapest":
        return f"cheapest: {render.money(row['cost'] or 0.0)}"
    if group.rule == "fastest":
        return f"fastest: {render.duration(row['seconds'])}"
    return f"smallest: +{row['added']} -{row['deleted']}"


# ---------------------------------------------------------------- settling

def conclude(repo: Repo, gid: str, *, wait_for_workers: bool = False) -> Group:
    """Decide the group if every member has ended (exactly once), stop the rest on a first pass,
    and complete the members' places. Cheap when there is nothing to do. Another clone's group is
    only read: its record and its members' are theirs to write (and its members not ours to stop)."""
    group, _tip = read(repo, gid)
    if not ownership.started_here(repo, gid):
        return group
    if not group.terminal:
        jobs = members(repo, group)
        if group.first_pass and any(passed(j) for j in jobs.values()) and not all(map(_ended, jobs.values())):
            stop_rest(repo, group, jobs)
            jobs = members(repo, group)
        if all(map(_ended, jobs.values())):
            faults.point("before_group_decide")
            group = _decide_once(repo, gid)
    if group.terminal:
        complete(repo, group, wait_for_workers=wait_for_workers)
    return group


def _decide_once(repo: Repo, gid: str) -> Group:
    lock = file_lock(Path(paths.groups_dir(repo.state_dir)) / f"{gid}.lock", timeout=DECIDE_LOCK_WAIT)
    with lock:
        group, _tip = read(repo, gid)
        if group.terminal:
            return group  # someone concluded (or stopped) it while we waited for the lock
        jobs = members(repo, group)
        if not all(map(_ended, jobs.values())):
            return group  # a reply started meanwhile
        table, pick, reason = decide(repo, group, jobs)

        state = ("done" if all(row["passed"] for row in table) else "failed") if group.is_map else \
            ("picked" if pick else "no_pick")

        def change(g: Group) -> bool:
            if g.terminal:
                return False  # never overwrite a terminal state (a stop won the race)
            g.state, g.pick, g.table, g.reason, g.decided_at = state, pick, table, reason, now()
            return True

        group = update(repo, gid, change)
    _judge_file(repo, gid).unlink(missing_ok=True)
    return group


def place_of(group: Group, job_id: str) -> dict[str, Any]:
    row = next((r for r in group.table if r.get("member") == job_id), None)
    superseded = job_id in ((group.merged or {}).get("superseded") or [])
    return {"v": 1, "group": group.id, "member": job_id, "state": group.state, "rank": row.get("rank") if row else None,
            "of": len(group.members), "pick": group.pick, "rule": group.rule_text,
            **({"kind": "map", "index": group.members.index(job_id) + 1} if group.is_map else {}),
            "note": row.get("note") if row else None, "superseded": superseded}


def complete(repo: Repo, group: Group, *, wait_for_workers: bool = False) -> None:
    """Write each ended member's place into its record and note, where it is not there yet."""
    for job_id in group.members:
        # A run-lock this process holds (a merge or a land holds the pick's) is nobody's to wait
        # for: waiting on it stalled every landing of a group for the whole 30 s.
        if not liveness.owns(job_id) and liveness.is_held(repo.state_dir, job_id):
            if not wait_for_workers:
                continue  # its worker completes its own place once its note is written
            lifecycle.wait_lock_released(repo.state_dir, job_id, 30.0)
        place = place_of(group, job_id)
        try:
            job = records.read(repo, job_id)
        except SubtaskError:
            continue
        if job.state.group_place == place or not job.state.current.terminal:
            continue

        def change(j: Job, place=place) -> bool:
            if j.state.group_place == place:
                return False
            j.state.group_place = place
            return True

        notes.write_for_job(repo, records.update(repo, job_id, change))


def stop_rest(repo: Repo, group: Group, jobs: dict[str, Job | None]) -> None:
    """First pass: stop every member still going, queued ones first (none is handed a slot meanwhile)."""
    winner = next(job_id for job_id, job in jobs.items() if passed(job))
    going = [j for j in jobs.values() if j is not None and not j.state.current.terminal]
    going.sort(key=lambda j: j.state.current.state != "queued")
    for job in going:
        try:
            lifecycle.stop_job(repo, job.id, reason=f"stopped: {winner} passed verify first (group {group.id})")
        except SubtaskError as exc:
            print(f"git-subtask: could not stop {job.id} of group {group.id}: {exc.message}", file=sys.stderr)


def after_member_ended(repo: Repo, job: Job, *, first_pass_only: bool = False) -> None:
    """A member's worker, once its attempt has ended: stop the rest on a first pass (while it
    still holds its slot: `first_pass_only`), or conclude the group (after it let go of its slot).
    Never raises: the worker's own job is already recorded."""
    gid = job.spec.group
    if not gid:
        return
    try:
        if first_pass_only:
            group, _tip = read(repo, gid)
            if group.first_pass and not group.terminal and passed(job):
                stop_rest(repo, group, members(repo, group))
            return
        conclude(repo, gid)
    except Exception as exc:  # the next command that looks at the group concludes it
        print(f"git-subtask: could not conclude group {gid} yet: {exc}", file=sys.stderr)


def conclude_listed(repo: Repo, entries: list[dict]) -> None:
    """Settle the groups of listed members whose members have all ended (a worker died, or a
    conclusion was killed): `list` is one of the commands that notices."""
    by_group: dict[str, list[dict]] = {}
    for entry in entries:
        if entry.get("group"):
            by_group.setdefault(entry["group"], []).append(entry)
    for gid, listed in by_group.items():
        ended = all(e.get("state") in TERMINAL_JOB for e in listed)
        one_passed = any(e.get("state") == "done" and e.get("verify") == "passed" for e in listed)
        if not (ended or one_passed):
            continue
        try:
            group = read(repo, gid)[0]
            if (ended and (not group.terminal or any(not e.get("placed") for e in listed))) or \
                    (one_passed and group.first_pass and not group.terminal):
                conclude(repo, gid)  # a first pass whose winner's worker died before it stopped the rest
        except SubtaskError:
            continue


# ---------------------------------------------------------------- stop, merge, compare

def stop(repo: Repo, gid: str) -> Group:
    """End the group `stopped` (no pick) and stop every member still going."""
    def change(g: Group) -> bool:
        if g.terminal:
            raise SubtaskError("negative", f"{gid} already ended ({g.state}); nothing to stop")
        g.state, g.reason, g.decided_at = "stopped", "stopped by request", now()
        return True

    group = update(repo, gid, change)
    jobs = members(repo, group)
    going = sorted((j for j in jobs.values() if j is not None and not j.state.current.terminal),
                   key=lambda j: j.state.current.state != "queued")
    for job in going:
        lifecycle.stop_job(repo, job.id, reason=f"stopped with its group {gid}")
    jobs = members(repo, group)
    table = rank([member_row(n, m, jobs.get(m)) for n, m in enumerate(group.members, 1)], group.rule)
    group = update(repo, gid, lambda g: setattr(g, "table", table))
    _judge_file(repo, gid).unlink(missing_ok=True)
    complete(repo, group, wait_for_workers=True)
    return group


def merge(repo: Repo, gid: str, mode: str = "merge", force: bool = False,
          reverify: bool = False) -> tuple[Group, list[str]]:
    """Land the pick through the ordinary merge gate; supersede the others.

    Another clone's group (pulled) is read, never concluded or updated here, and its pick goes
    through the same gate as any job of theirs (its verify re-run unless an allowed signer
    signed the pick's record); its other members are left as they are.
    """
    from subtask.ops.landing import merge

    group, pick = picked_with_pick(repo, gid)
    result = merge.merge(repo, pick, mode=mode, force=force, reverify=reverify)
    group, lines = pick_landed(repo, group, result.commit, result.into)
    return group, list(result.lines) + lines


def picked(repo: Repo, gid: str) -> Group:
    """The concluded group, once it has a pick to land (`merge`, `land`); else why not."""
    group = conclude(repo, gid, wait_for_workers=True)
    if group.is_map:
        raise SubtaskError("usage", f"{gid} is a map: it has no pick to merge; merge its jobs one by one, or start "
                           "one job after the whole map (it starts from all their heads) and merge that",
                           hint=f"git subtask start --after {gid} --verify '...' 'check the whole change'")
    if not group.pick:
        why = "it is still running" if not group.terminal else (group.reason or group.state)
        raise SubtaskError("negative", f"{gid} has no pick to merge: {why}",
                           hint=f"git subtask wait {gid}" if not group.terminal else f"git subtask show {gid}")
    if group.pick not in group.members:
        raise SubtaskError("negative", f"{gid}: its pick {group.pick} is not one of its members: not merging it")
    return group


def picked_with_pick(repo: Repo, gid: str) -> tuple[Group, str]:
    """`picked`, and the id of its pick."""
    group = picked(repo, gid)
    assert group.pick is not None  # `picked` refuses a group without one
    return group, group.pick


def pick_landed(repo: Repo, group: Group, commit: str, into: str) -> tuple[Group, list[str]]:
    """The group's pick landed in `commit` on `into`: supersede the other members, record it."""
    from subtask.ops.landing import landed

    gid = group.id
    if not ownership.started_here(repo, gid):
        return group, [f"{gid}: another clone's group: its record and other members are left as they are"]
    lines: list[str] = []
    target = landed.Target(into, commit)
    superseded = []
    for job_id in group.members:
        if job_id == group.pick:
            continue
        try:
            job = records.read(repo, job_id)
        except SubtaskError:
            continue
        superseded.append(job_id)
        lines += supersede(repo, job, target)

    def change(g: Group) -> bool:
        g.merged = {"commit": commit, "into": into, "superseded": superseded}
        return True

    group = update(repo, gid, change)
    complete(repo, group, wait_for_workers=True)
    return group, lines


def supersede(repo: Repo, job: Job, target) -> list[str]:
    """Remove a superseded member's clean worktree, and its branch where its head pin keeps it."""
    from subtask.ops.landing import cleanup

    with cleanup.quiet_job(repo, job) as fresh:
        if fresh is None:
            return [f"{job.id}: superseded; {cleanup.BUSY}"]
        lines = [f"{job.id}: superseded"]
        path = Path(fresh.spec.worktree)
        if path.exists():
            ok, why, head = cleanup.worktree_removable(repo, fresh, cleanup.keepers(repo, fresh, target))
            if ok and cleanup.remove_worktree(repo, fresh, head):
                lines.append(f"{job.id}: removed worktree {path}")
            else:
                lines.append(f"{job.id}: kept worktree: {why or 'git worktree remove failed'}")
        lines += _delete_kept_branch(repo, fresh)
        return lines


def _delete_kept_branch(repo: Repo, job: Job) -> list[str]:
    from subtask.ops.landing import cleanup, landed

    branch = job.spec.branch
    name = landed.branch_ref(job)
    ref = repo.git.references.get(name) if name else None
    if ref is None:
        return []
    tip = str(ref.target)
    pin = repo.git.references.get(records.pin_ref(job.id, "head"))
    pinned = str(pin.target) if pin is not None else None
    kept = tip == job.spec.base or (pinned is not None and (pinned == tip or repo.git.descendant_of(pinned, tip)))
    if not kept:
        return [f"{job.id}: kept branch {branch}: its tip {tip[:7]} is not kept by its head pin"]
    why = landed.why_not_deletable(repo, job, tip)
    if why:
        return [f"{job.id}: kept branch {branch}: {why}"]

    if f"refs/heads/{branch}" in cleanup.checked_out_branches(repo):
        return [f"{job.id}: kept branch {branch}: it is checked out in a worktree"]
    if not records.cas_ref(repo, ref.name, tip, None, "git-subtask: superseded"):
        return [f"{job.id}: kept branch {branch}: it moved"]
    records.update(repo, job.id, lambda j: setattr(j.state, "branch_deleted", True))
    return [f"{job.id}: deleted branch {branch} (was {tip[:7]}; kept by {records.pin_ref(job.id, 'head')})"
            if pinned else f"{job.id}: deleted branch {branch} (no commits beyond its base)"]


def compare_pairs(repo: Repo, group: Group) -> list[tuple[str, str, str, str]]:
    """(member a, head a, member b, head b) for every pair, the pick (or member 1) first."""
    from subtask.ops.landing import landed

    jobs = {k: v for k, v in members(repo, group).items() if v is not None}
    order = sorted(jobs, key=lambda m: (m != group.pick, group.members.index(m)))
    heads = {m: landed.job_head(repo, jobs[m]) for m in order}
    return [(a, heads[a], b, heads[b]) for i, a in enumerate(order) for b in order[i + 1:]]


def table_rows(repo: Repo, group: Group) -> list[dict[str, Any]]:
    """The decided table, or (while running) the members as they are now, in member order."""
    if group.table:
        return group.table
    jobs = members(repo, group)
    return [member_row(n, m, jobs.get(m)) for n, m in enumerate(group.members, 1)]
