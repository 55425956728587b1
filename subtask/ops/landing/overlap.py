"""Predicted overlap: which jobs change the same files (and the same lines), and how far a job's
base is behind the land target. What `land --dry-run` prints before a queue, and what `status`
and `list` mark.

Read from git only: each job's diff from its base (`git diff -U0`: file names and the lines each
hunk replaces), `git rev-list --count base..target`, and for the dry run `git merge-tree
--write-tree` of each job onto the one before (objects only: no ref, no worktree, no record
changes). Hunks are compared only between jobs that share a base, where line numbers mean the
same thing; otherwise a shared file is all that is said.
"""

from __future__ import annotations

import json

from subtask.git import records
from subtask.git.gitrepo import Repo, git
from subtask.model import lazyre
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.model.job import work_base
from subtask.state.statefiles import read_bytes, write_atomic

_HUNK = lazyre.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")
MAX_FILES = 200  # files kept per job for the comparison


def changes(repo: Repo, base: str, head: str) -> dict[str, list[tuple[int, int]]]:
    """The files base..head changes, each with the base's line ranges its hunks replace
    ((start, count); count 0 for lines inserted after `start`). A binary or mode-only change has
    no hunks (an empty list): its name comes from the `diff --git` line, which every change has."""
    out = git(repo.root_str, "diff", "-U0", "--no-color", "--no-ext-diff", "--no-renames", "--src-prefix=a/",
              "--dst-prefix=b/", base, head, check=False).stdout
    files: dict[str, list[tuple[int, int]]] = {}
    current = None
    for line in out.splitlines():
        if line.startswith("diff --git "):
            current = _diff_name(line[len("diff --git "):]) if len(files) < MAX_FILES else None
            if current is not None:
                files[current] = []
        elif current is not None and (match := _HUNK.match(line)):
            files[current].append((int(match.group(1)), int(match.group(2) or 1)))
    return files


def _diff_name(names: str) -> str | None:
    """The path of a `diff --git a/<path> b/<path>` line (`"a/<path>" "b/<path>"` when git quotes
    it): with no renames both halves name the same path, so the line splits in the middle."""
    half = (len(names) - 1) // 2
    old, new = names[:half], names[half + 1:]
    if names[half:half + 1] != " ":
        return None
    if old[:1] == '"' and new[:1] == '"':
        old, new = old[1:-1], new[1:-1]
    if not (old.startswith("a/") and new.startswith("b/") and old[2:] == new[2:]):
        return None
    return old[2:]


def hunks_meet(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    """Do two jobs' hunks in one file touch the same or neighbouring lines (what git calls a
    conflict)? Line numbers of the same base."""
    for start_a, count_a in a:
        for start_b, count_b in b:
            if start_a <= start_b + max(count_b, 1) and start_b <= start_a + max(count_a, 1):
                return True
    return not a or not b  # a binary or mode-only change has no hunks: assume it meets


def behind(repo: Repo, base: str, tip: str) -> int | None:
    """How many commits `tip` has that `base` has not (None when git cannot say)."""
    proc = git(repo.root_str, "rev-list", "--count", f"{base}..{tip}", check=False)
    return int(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip().isdigit() else None


@dataclass
class Pair:
    """Two jobs that change files in common (`pairs`), and the files where their lines meet too."""

    a: str
    b: str
    files: list[str]
    same_lines: list[str]  # of `files`, those whose hunks meet (same base only)

    def to_dict(self) -> dict:
        return {"v": 1, "a": self.a, "b": self.b, "files": self.files, "same_lines": self.same_lines}


def pairs(jobs: list[tuple[str, str, dict[str, list[tuple[int, int]]]]]) -> list[Pair]:
    """Every two jobs (id, base, changes) that change a file in common, in the order given."""
    found = []
    for i, (a, base_a, files_a) in enumerate(jobs):
        for b, base_b, files_b in jobs[i + 1:]:
            common = [f for f in files_a if f in files_b]
            if common:
                meet = [f for f in common if base_a == base_b and hunks_meet(files_a[f], files_b[f])]
                found.append(Pair(a, b, common, meet))
    return found


# ---------------------------------------------------------------- marks in status and list

# <state>/behind-<repo>.json: "base..tip" -> commits, and a finished job's record tip -> the files
# its evidence names; neither ever changes its answer (a tip is a commit: its tree is what it is).
BEHIND_CACHE = "behind"
CACHE_KEPT = 2000  # entries of each kind
# Jobs that may still land: a failed or stopped one will not (merge refuses it), so its files
# meeting another's, or its base being behind, is noise on every row it touches (issue 38).
MAY_LAND = ("running", "done")
MAX_COMPARED = 200  # finished jobs whose files `list` compares, newest first


def target_tip(repo: Repo) -> tuple[str, str] | None:
    """The land target's name and tip, through git alone (no pygit2: `list` stays light);
    None when there is none (a detached HEAD)."""
    name = (repo.config.get("landTarget") or "").strip().removeprefix("refs/heads/")
    if not name:
        name = repo.head_branch() or ""
    ref = repo.objects.ref(f"refs/heads/{name}") if name and not name.startswith("subtask/") else None
    return (name, ref.target) if ref is not None else None


def mark(repo: Repo, shown: list[dict], listed: list[dict]) -> None:
    """Add `marks` to the `shown` list entries of jobs that may land (running, or done): a done
    job's base behind the land target (`{"behind": 12, "target": "main"}`), and the other jobs of
    `listed` that may land, not landed, that change a file it changes (`{"overlaps": {"st-…":
    ["a.txt"]}}`). Advisory: anything git cannot answer leaves the mark out."""
    jobs = [e for e in listed
            if e.get("state") in MAY_LAND and not e.get("landed") and not e.get("readonly")]
    if not jobs or not any(e.get("state") in MAY_LAND for e in shown):
        return
    # Bounded: every running job, and the newest finished ones (`listed` is newest first), so a
    # repository with thousands of old unlanded jobs does not read every evidence on each `list`.
    kept = {e["id"] for e in [e for e in jobs if e["state"] != "running"][:MAX_COMPARED]} | {e["id"] for e in shown}
    jobs = [e for e in jobs if e["state"] == "running" or e["id"] in kept]
    counts, files_by_tip, cache_there = _read_cache(repo)
    known = (len(counts), len(files_by_tip))
    files = _files_of(repo, jobs, files_by_tip)
    target = target_tip(repo)
    for entry in shown:
        mine = files.get(entry["id"]) if entry.get("state") in MAY_LAND else None
        if not mine:
            continue
        marks: dict = {}
        base = entry.get("onto") or entry.get("base")
        if target and entry.get("state") != "running" and base and base != target[1]:
            key = f"{base}..{target[1]}"
            count = counts.get(key)
            if count is None:
                count = behind(repo, base, target[1])
                if count is not None:
                    counts[key] = count
            if count:
                marks.update(behind=count, target=target[0])
        overlaps = {other: sorted(mine & theirs)[:5] for other, theirs in files.items()
                    if other != entry["id"] and mine & theirs}
        if overlaps:
            marks["overlaps"] = overlaps
        if marks:
            entry["marks"] = marks
    # A count is a git run; a job's files, its evidence read from its tip: a new file is worth the
    # first at once, the second once there are `records.CACHE_WORTH` of them.
    counted, read = len(counts) - known[0], len(files_by_tip) - known[1]
    if counted or read >= records.CACHE_WORTH or (not cache_there and read):
        _write_cache(repo, counts, files_by_tip)


def _files_of(repo: Repo, jobs: list[dict], files_by_tip: dict[str, list[str]]) -> dict[str, set[str]]:
    """The files each job changed: a finished job's from its evidence (in `files_by_tip` by its
    record's tip, else one batched read, added there), a running one's from its branch's commits
    so far (never its worktree: a job's process may be writing it)."""
    found: dict[str, set[str]] = {}
    ended = [e for e in jobs if e["state"] != "running" and e.get("tip")]
    unread = [e for e in ended if e["tip"] not in files_by_tip]
    for entry, blob in zip(unread, repo.objects.read([f"{e['tip']}:evidence.json" for e in unread]), strict=True):
        try:
            evidence = json.loads(blob[1]) if blob and blob[0] == "blob" else {}
            files_by_tip[entry["tip"]] = sorted({f["path"] for f in evidence.get("files") or []
                                                 if isinstance(f, dict) and isinstance(f.get("path"), str)})
        except (ValueError, AttributeError, TypeError):
            continue
    for entry in ended:
        if files_by_tip.get(entry["tip"]):
            found[entry["id"]] = set(files_by_tip[entry["tip"]])
    running = [e for e in jobs if e["state"] == "running" and (e.get("onto") or e.get("base"))]
    if running:
        tips = {ref.name: ref.target for ref in repo.objects.refs("refs/heads/subtask/")}
        for entry in running:
            tip = tips.get(f"refs/heads/subtask/{entry['id']}")
            base = entry.get("onto") or entry["base"]
            if tip and tip != base:
                out = git(repo.root_str, "diff", "--name-only", "--no-renames", base, tip, check=False).stdout
                if out.strip():
                    found[entry["id"]] = set(out.split("\n")) - {""}
    return found


def _read_cache(repo: Repo) -> tuple[dict[str, int], dict[str, list[str]], bool]:
    """(behind counts, files by record tip, whether a cache was there to read); empty for a
    cache that is missing or damaged."""
    try:
        data = json.loads(read_bytes(repo.state_file(BEHIND_CACHE)))
        if data.get("v") != 1:
            return {}, {}, False
        counts = {k: v for k, v in data.get("counts", {}).items() if isinstance(v, int)}
        files = {k: v for k, v in (data.get("files") or {}).items()
                 if isinstance(v, list) and all(isinstance(n, str) for n in v)}
        return counts, files, True
    except (OSError, ValueError, AttributeError):
        return {}, {}, False


def _write_cache(repo: Repo, counts: dict[str, int], files_by_tip: dict[str, list[str]]) -> None:
    """Best effort, and bounded: a cache that cannot be written only costs the next `list` a git run."""
    data = {"v": 1, "counts": dict(list(counts.items())[-CACHE_KEPT:]),
            "files": dict(list(files_by_tip.items())[-CACHE_KEPT:])}
    try:
        write_atomic(repo.state_file(BEHIND_CACHE), json.dumps(data).encode(), durable=False)
    except OSError:
        pass


# ---------------------------------------------------------------- land --dry-run

@dataclass
class Planned:
    """What `land --dry-run` predicts for one job."""

    job: str
    group: str | None
    files: list[str]
    behind: int | None
    would: str  # land | conflict | already | refused
    how: str = ""  # fast-forward, merge, ...; the refusal; the conflicting files
    verify: str | None = None
    conflicts: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"v": 1, "id": self.job, "group": self.group, "files": self.files, "behind": self.behind,
                "would": self.would, "how": self.how, "verify": self.verify, "conflicts": self.conflicts}


@dataclass
class Plan:
    """What `land --dry-run` predicts for a queue (`plan`), changing nothing."""

    target: str
    tip: str
    mode: str
    atomic: bool
    jobs: list[Planned]
    pairs: list[Pair]

    @property
    def ok(self) -> bool:
        return all(j.would in ("land", "already") for j in self.jobs)

    def to_dict(self) -> dict:
        return {"v": 1, "dry_run": True, "target": self.target, "tip": self.tip, "mode": self.mode,
                "atomic": self.atomic, "ok": self.ok, "jobs": [j.to_dict() for j in self.jobs],
                "pairs": [p.to_dict() for p in self.pairs]}


def plan(repo: Repo, asked: list[str], opts) -> Plan:
    """What `land` would do with these jobs (`opts`: `lineup.Options`), changing nothing: each
    job's files and how stale its base is, the pairs that change the same files or lines, and
    each job merged in turn onto the one before (`git merge-tree`) to predict conflicts."""
    from subtask.ops.landing import lineup

    target = lineup.find_target(repo)
    items = lineup.resolve(repo, asked)
    tip = lineup.tip(repo, target)
    chain, planned, compared = tip, [], []
    for item in items:
        group = item.group.id if item.group else None
        try:
            if item.group is not None:
                from subtask.ops.plans import groups

                item.group, pick = groups.picked_with_pick(repo, item.group.id)
                item.job = records.read(repo, pick)
            lineup.check(repo, item, opts)
        except SubtaskError as exc:
            planned.append(Planned(item.job.id, group, [], None, "refused", exc.message))
            continue
        base = work_base(item.job)
        files = changes(repo, base, item.head)
        compared.append((item.job.id, base, files))
        entry = Planned(item.job.id, group, list(files), behind(repo, base, tip), "land",
                        verify=item.command)
        chain = _predict(repo, entry, item, chain, opts)
        planned.append(entry)
    return Plan(target.name, tip, opts.mode, opts.atomic, planned, pairs(compared))


def _predict(repo: Repo, entry: Planned, item, chain: str, opts) -> str:
    """Merge the job onto `chain` without a worktree; the commit the next job would build on."""
    proc = git(repo.root_str, "merge-tree", "--write-tree", "--name-only", "--no-messages", chain, item.head,
               check=False)
    lines = proc.stdout.splitlines()
    if proc.returncode == 1:
        entry.would, entry.conflicts = "conflict", [f for f in dict.fromkeys(lines[1:]) if f]
        entry.how = "reconcile" if opts.reconcile else ""
        return chain
    if proc.returncode != 0 or not lines:
        entry.would, entry.how = "refused", f"git merge-tree failed: {proc.stderr.strip()}"
        return chain
    tree = lines[0]
    if git(repo.root_str, "merge-base", "--is-ancestor", item.head, chain, check=False).returncode == 0:
        entry.would = "already"
        return chain
    ff = opts.mode == "merge" and git(repo.root_str, "merge-base", "--is-ancestor", chain, item.head,
                                      check=False).returncode == 0
    entry.how = "fast-forward" if ff else opts.mode
    if ff:
        return item.head
    parents = ["-p", chain] + (["-p", item.head] if opts.mode in ("merge", "no-ff") else [])
    made = git(repo.root_str, "commit-tree", "--no-gpg-sign", tree, *parents, "-m", f"land --dry-run: {item.job.id}",
               check=False).stdout.strip()
    return made or chain  # (no identity to write a commit with: the next job is predicted on the tip)
