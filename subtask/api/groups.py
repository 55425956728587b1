"""Groups of jobs: best-of-N (`start_group`), `map` (`start_map`), and what acts on a group
(stop, merge its pick, compare its members).

Invariants:
- A group's members are admitted and reserved all or none (`_launch_all` in `api/starting.py`),
  and its record is written only once every member's record exists, so nobody ever reads a
  group whose members do not exist yet.
- Members handed to an executor elsewhere are handed over all or none: their money is checked
  against the cap together first, and a member that cannot be handed over stops the ones before it.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

from subtask import executors
from subtask.api.landing import MAX_OUTPUT_LIMIT, OUTPUT_LIMIT, git_output
from subtask.api.read import _groups, _positive
from subtask.api.starting import (
    StartResult,
    _check_task,
    _Launch,
    _launch_all,
    _names,
    _prepare,
    _Prepared,
    default_engine,
    left_out,
)
from subtask.git import ownership
from subtask.git.gitrepo import Repo, git, resolve_commit
from subtask.git.leftout import LeftOut
from subtask.model import money
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.model.redact import redact
from subtask.model.start_options import StartRequest
from subtask.ops.running import spending
from subtask.state import ledger, liveness

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from subtask.ops.plans.groups import Group


@dataclass
class GroupStart:
    """What `start_group` answers: the group's record and each member's start."""

    group: Group
    members: list[StartResult]
    left_out: LeftOut | None = None


def start_group(repo: Repo, request: StartRequest) -> GroupStart:
    """Start a best-of-N group (`request.best_of`): N ordinary jobs at one task and base, admitted
    and reserved all or none, and the group record that names them (the pick is `groups.conclude`'s).
    `request.engine` and `.model` may name several, cycled over the members."""
    groups = _groups()
    how = request
    n = how.best_of
    if isinstance(n, bool) or not isinstance(n, int) or not groups.MIN_MEMBERS <= n <= groups.MAX_MEMBERS:
        raise SubtaskError("usage", f"--best-of must be a whole number from {groups.MIN_MEMBERS} to "
                           f"{groups.MAX_MEMBERS}, not {n!r}")
    if how.pick is not None and how.pick not in groups.RULES:
        raise SubtaskError("usage", f"unknown --pick {how.pick!r} ({', '.join(groups.RULES)})")
    if how.judge is not None and (how.pick is not None or not how.judge.strip()):
        raise SubtaskError("usage", "--judge needs a command, and takes the place of --pick (give one of them)")
    if how.first_pass and (how.pick is not None or how.judge is not None):
        raise SubtaskError("usage", "--first-pass picks the first attempt to pass verify: "
                           "it takes no --pick or --judge")
    if request.readonly:
        raise SubtaskError("usage", "--best-of makes no sense with --readonly: "
                           "read-only jobs change nothing to pick from")
    if request.after:
        raise SubtaskError("usage", "--best-of starts its attempts now: a group cannot wait (--after) yet",
                           hint="start one job --after, and the group once it ended: git subtask wait ID && ...")
    on = executors.choose(repo.config, request.on)
    on.require("best_of")
    if how.judge is not None:
        on.require("judge")
    verify = request.verify if request.verify is not None else repo.config.get("verify")
    if not verify or not verify.strip():
        raise SubtaskError("usage", "--best-of needs --verify (or git config subtask.verify): there is nothing to "
                           "choose by", hint="git subtask start --best-of 3 --verify 'pytest -q' '...'")
    engines = _names(request.engine, "--engine") or [default_engine(repo)]
    named = _names(request.model, "--model")
    models: list[str | None] = [*named] if named else [None]  # None: each engine's default
    base = resolve_commit(repo, request.base or "HEAD")  # one base for every member
    gid = groups.new_group_id()
    member_request = {**request.__dict__, "verify": verify, "base": base, "best_of": None, "pick": None,
                      "judge": None, "first_pass": False}
    prepared = [_prepare(repo, StartRequest(**{**member_request, "engine": engines[k % len(engines)],
                                               "model": models[k % len(models)]}),
                         group=gid, member=k + 1) for k in range(n)]
    if any(p.paid for p in prepared):
        spending.sync_ledger(repo)
    first = prepared[0].job.spec
    group = groups.Group(id=gid, task=first.task, base=base, verify=first.verify or "", created_at=first.created_at,
                         members=[p.job.id for p in prepared], engines=[p.job.spec.engine for p in prepared],
                         models=[p.job.spec.model for p in prepared],
                         rule="judge" if how.judge else how.pick or "smallest",
                         judge=redact(how.judge) if how.judge else None, first_pass=bool(how.first_pass))
    return GroupStart(group, _launch_group(repo, gid, group, prepared, what=f"the {n} attempts of this group",
                                           judge=how.judge))


@dataclass
class MapStart(GroupStart):
    """What `start_map` answers: a group's start, and the files each member was given."""

    batches: list[list[str]] = field(default_factory=list)


def map_files(repo: Repo, pattern: str, base: str) -> list[str]:
    """The files of `base` that git's glob `pattern` matches (from the top of the repository)."""
    if not isinstance(pattern, str) or not pattern.strip() or "\0" in pattern or "\n" in pattern:
        raise SubtaskError("usage", f"not a glob: {pattern!r}")
    with tempfile.TemporaryDirectory(prefix="subtask-map-") as scratch:  # the base's files, not the index's
        env = dict(os.environ, GIT_INDEX_FILE=str(Path(scratch) / "index"))
        git(repo.root, "read-tree", base, env=env)
        out = git(repo.root, "ls-files", "-z", "--full-name", "--", f":(top,glob){pattern}", env=env).stdout
    return [name for name in out.split("\0") if name]


def start_map(repo: Repo, pattern: str, request: StartRequest, *, batch: int = 1,
              concurrency: int | None = None) -> MapStart:
    """One job per batch of the base's files matching `pattern` (`{files}` in the task: the batch,
    shell-quoted), as one group (`groups.Group`, kind "map"): admitted and reserved all or none;
    at most `concurrency` of them run at once (slots pools), within maxRunning."""
    import shlex

    groups = _groups()
    batch = int(_positive(batch, "--batch", allow_none=False, integer=True))
    if concurrency is not None:
        concurrency = int(_positive(concurrency, "--concurrency", integer=True))
    template = _check_task(request.task)
    if "{files}" not in template:
        raise SubtaskError("usage", "the task names no {files}: say where each job's files go",
                           hint="git subtask map 'src/*.py' 'add type hints to {files}'")
    if request.readonly or request.after:
        raise SubtaskError("usage", "map starts writing jobs now: no --readonly or --after")
    on = executors.choose(repo.config, request.on)
    on.require("map")
    if concurrency is not None:
        on.require("concurrency")
    base = resolve_commit(repo, request.base or "HEAD")
    files = map_files(repo, pattern, base)
    if not files:
        raise SubtaskError("usage", f"no tracked file matches {pattern!r} at {base[:12]}",
                           hint="git ls-files ':(glob)PATTERN' shows what a glob matches")
    batches = [files[i:i + batch] for i in range(0, len(files), batch)]
    if len(batches) > groups.MAX_MAP_JOBS:
        raise SubtaskError("usage", f"{len(files)} files by {batch} make {len(batches)} jobs; the limit is "
                           f"{groups.MAX_MAP_JOBS}", hint="give a larger --batch")
    gid = groups.new_group_id()
    prepared = []
    for k, names in enumerate(batches):
        task = template.replace("{files}", " ".join(shlex.quote(n) for n in names))
        member = _prepare(repo, StartRequest(**{**request.__dict__, "task": task, "base": base}),
                          group=gid, member=k + 1)
        member.job.spec.concurrency = concurrency
        prepared.append(member)
    if any(p.paid for p in prepared):
        spending.sync_ledger(repo)
    first = prepared[0].job.spec
    group = groups.Group(id=gid, task=redact(template), base=base, verify=first.verify or "",
                         created_at=first.created_at, members=[p.job.id for p in prepared],
                         engines=[first.engine], models=[first.model],
                         rule="map", kind="map", concurrency=concurrency, pattern=pattern, batch=batch)
    results = _launch_group(repo, gid, group, prepared, what=f"the {len(prepared)} jobs of this map")
    return MapStart(group, results, left_out=left_out(repo, request, base), batches=batches)


def _launch_group(repo: Repo, gid: str, group, prepared: list[_Prepared], *, what: str, judge: str | None = None
                  ) -> list[StartResult]:
    """Admit and start a group's members all or none, then write the group record."""
    groups = _groups()

    def write_group() -> None:
        groups.keep_judge(repo, gid, judge)
        groups.create(repo, group)

    if not prepared[0].on.runs_here:
        return _launch_elsewhere(repo, prepared, what=what, then_record=write_group)
    launches = []
    try:
        for p in prepared:
            lock_fd = liveness.acquire_new(repo.state_dir, p.job.id)
            launches.append(_Launch(p.job, p.paid, p.job.spec.base, lock_fd, p.as_written))
    except BaseException:
        for launch in launches:
            liveness.drop(repo.state_dir, launch.job.id, launch.lock_fd)
        raise
    results = _launch_all(repo, launches, what=what, then_record=write_group,
                          undo_record=lambda: groups.delete(repo, gid))
    for result, p in zip(results, prepared, strict=True):
        result.warnings = p.warnings
    return results


def _launch_elsewhere(repo: Repo, prepared: list[_Prepared], *, what: str, then_record) -> list[StartResult]:
    """A group's members handed to the executor that runs them elsewhere, all or none: their
    money is checked against the cap together first; a member that cannot be handed over stops
    the ones handed over before it (charged nothing: none has run)."""
    on = prepared[0].on
    usd = sum((p.job.state.current.cost.reserved * (1 + (p.job.spec.retries or 0)) for p in prepared if p.paid),
              money.ZERO)
    if usd:
        left = ledger.summary(repo.state_dir, repo.config.number("monthlyCapUsd")).left_usd
        if usd > left:
            raise SubtaskError("budget", f"{what} reserve {money.text(usd)} together, more than this month's cap "
                               f"has left ({money.text(max(left, money.ZERO))})", hint="git subtask spend")
    started: list[StartResult] = []
    try:
        for p in prepared:
            started.append(StartResult(on.backend().submit(repo, p.job, p.paid), 0, on=on.name))
        then_record()
    except BaseException:
        for result in started:
            try:
                on.backend().stop(repo, result.job.id)
            except Exception as exc:  # said, never hidden: that one still runs there
                warnings.warn(f"{result.job.id} could not be stopped: {getattr(exc, 'message', exc)}", stacklevel=2)
        raise
    return started


def stop_group(repo: Repo, gid_or_prefix: str):
    gid = _groups().resolve(repo, gid_or_prefix)
    if not ownership.started_here(repo, gid):
        raise SubtaskError("negative", f"{gid} is another clone's group: only its own workers end its members")
    return _groups().stop(repo, gid)


def merge_group(repo: Repo, gid_or_prefix: str, mode: str = "merge", force: bool = False, reverify: bool = False):
    """Merge the group's pick (the ordinary gate), supersede the rest. Returns (group, lines)."""
    return _groups().merge(repo, _groups().resolve(repo, gid_or_prefix), mode=mode, force=force, reverify=reverify)


def compare_argvs(repo: Repo, gid_or_prefix: str, stat: bool = True) -> list[tuple[str, list[str]]]:
    """(title, git diff argv) for every pair of the group's members: their heads against each other."""
    return [(f"{a} .. {b}", ["git", "-C", str(repo.root), "diff", *(["--stat"] if stat else []), head_a, head_b])
            for a, head_a, b, head_b in _compare_pairs(repo, gid_or_prefix)]


def _compare_pairs(repo: Repo, gid_or_prefix: str) -> list[tuple[str, str, str, str]]:
    groups = _groups()
    group, _tip = groups.read(repo, groups.resolve(repo, gid_or_prefix))
    return groups.compare_pairs(repo, group)


def compare(repo: Repo, gid_or_prefix: str, stat: bool = True, limit: int | None = None) -> dict:
    """The diffs between a group's members, every pair (the pick first), bounded in all by `limit`."""
    left = min(OUTPUT_LIMIT if limit is None else int(_positive(limit, "max_bytes", integer=True)), MAX_OUTPUT_LIMIT)
    gid = _groups().resolve(repo, gid_or_prefix)
    pairs = []
    for a, head_a, b, head_b in _compare_pairs(repo, gid):
        text, truncated, size = git_output(repo, ["diff", "--no-color", "--no-ext-diff",
                                                  *(["--stat"] if stat else []), head_a, head_b], max(left, 1))
        left = max(0, left - len(text.encode()))
        pairs.append({"a": a, "head_a": head_a, "b": b, "head_b": head_b, "text": text, "truncated": truncated,
                      "bytes": size})
    return {"v": 1, "group": gid, "stat": stat, "pairs": pairs}
