"""`doctor`: what is installed and configured, and what to do about what is not.

Every check returns a `Check` with a status (ok, warn, fail), a message, and remediation steps
that name real commands. Nothing here changes anything or spends anything: engines are probed
without a paid call, slots are read without reconciling them.
"""

from __future__ import annotations

import os
import stat
import subprocess

from subtask import api
from subtask.git import notes_store, ownership, pool, records
from subtask.git.gitrepo import open_repo
from subtask.model import executors
from subtask.model.dataclass import asdict, dataclass, field
from subtask.model.errors import SubtaskError
from subtask.ops.running import lifecycle
from subtask.ops.sharing import client_config, hooks
from subtask.proc import isolation, namespaces
from subtask.state import liveness, slots
from subtask.words import short, size

SCHEMA_VERSION = 1
ORDER = {"ok": 0, "warn": 1, "fail": 2}


@dataclass
class Check:
    """One of `doctor`'s checks as it came out, with the commands that fix what it found."""

    name: str
    status: str  # ok | warn | fail
    message: str
    remediation: list[str] = field(default_factory=list)


@dataclass
class Report:
    """Everything `doctor` found; its status is the worst of its checks'."""

    checks: list[Check]

    @property
    def status(self) -> str:
        return max((c.status for c in self.checks), key=ORDER.__getitem__, default="ok")

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "status": self.status, "checks": [asdict(c) for c in self.checks]}


def doctor(path: str | os.PathLike | None = None) -> Report:
    checks = [check_git(), check_libgit2()]
    try:
        repo = open_repo(path)
    except Exception as exc:
        message = getattr(exc, "message", str(exc))
        steps = ["cd into a git work tree", "git init"]
        if "bare repository" in message:  # a work tree of it is what jobs need, not a new repository
            where = os.path.abspath(path or ".")
            steps = [f"git clone '{where}' <folder>   # then run git subtask in <folder>",
                     f"git -C '{where}' worktree add <folder>   # or a work tree of this repository"]
        checks.append(Check("repository", "fail", message, steps))
        return Report(checks)
    checks.append(Check("repository", "ok", f"{repo.root} (git dir {repo.common_dir})"))
    for check in (check_settings, check_hooks, check_notes_config, check_state_dir, check_damaged_records,
                  check_records, check_slots, check_worktrees, check_pool, check_engines, check_isolation,
                  check_provenance, check_clients):
        try:
            checks.append(check(repo))
        except Exception as exc:  # a broken check must not hide the others
            checks.append(Check(check.__name__.removeprefix("check_"), "warn", f"could not check: {exc}"))
    return Report(checks)


def check_git() -> Check:
    try:
        out = subprocess.run(["git", "--version"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return Check("git", "fail", "git is not on PATH", ["install git (2.25 or newer)"])
    version = tuple(int(p) for p in out.split()[2].split(".")[:2] if p.isdigit())
    if version < (2, 25):
        return Check("git", "warn", f"{out}: older than 2.25; worktree commands may misbehave", ["upgrade git"])
    return Check("git", "ok", out)


def check_libgit2() -> Check:
    import pygit2

    return Check("libgit2", "ok", f"libgit2 {pygit2.LIBGIT2_VERSION} (pygit2 {pygit2.__version__})")


def check_settings(repo) -> Check:
    """Every `subtask.*` key set here against the table of settings (`model/config.py`): a value
    it refuses fails (start refuses it too), a key it lacks or knows by an old name warns."""
    problems = repo.config.problems(engine_plugins=api.engine_plugins())
    if not problems:
        return Check("settings", "ok", "every subtask.* setting is valid")
    status = "fail" if any(p.level == "bad" for p in problems) else "warn"
    return Check("settings", status, "; ".join(p.message for p in problems),
                 [p.fix for p in problems])


def check_hooks(repo) -> Check:
    state = hooks.status(repo)
    if state.installed:
        return Check("hooks", "ok", f"post-merge hook installed at {state.path}")
    return Check("hooks", "warn", "the post-merge hook is not installed: landed jobs are cleaned up lazily only",
                 ["git subtask hooks install"])


def check_notes_config(repo) -> Check:
    cfg = repo.git.config
    rewrite = list(cfg.get_multivar("notes.rewriteRef")) if _has(cfg, "notes.rewriteRef") else []
    if any(r in ("refs/notes/subtask", "refs/notes/*") for r in rewrite):
        return Check("notes", "fail", "notes.rewriteRef copies subtask notes onto rebased commits, so a "
                     "'verify passed' would stand on a tree that was never tested",
                     ["git config --unset-all notes.rewriteRef 'refs/notes/(subtask|\\*)'"])
    if not _has(cfg, "notes.subtask.mergeStrategy"):
        return Check("notes", "warn", "notes.subtask.mergeStrategy is not set: pulling teammates' notes may conflict",
                     ["git subtask init"])
    return Check("notes", "ok", f"notes.subtask.mergeStrategy = {cfg['notes.subtask.mergeStrategy']}")


def _has(cfg, key: str) -> bool:
    try:
        cfg[key]
        return True
    except KeyError:
        return False
    except ValueError:  # a multivar
        return True


def check_state_dir(repo) -> Check:
    state = repo.state_dir
    if not state.exists():
        return Check("state", "ok", f"{state} does not exist yet (made on the first job)")
    loose = []
    for path in [state, *state.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            loose.append(f"{path.relative_to(state.parent)} ({oct(mode)})")
    if loose:
        return Check("state", "warn", f"{len(loose)} state files readable by others: {', '.join(loose[:3])}",
                     [f"chmod -R go-rwx '{state}'"])
    return Check("state", "ok", f"{state} (private)")


def check_damaged_records(repo) -> Check:
    """Every record ref holds a readable job record (reads each one: doctor is rare, so thorough)."""
    ids = records.all_ids(repo)
    damaged = []
    for job_id in sorted(ids):
        try:
            records.read(repo, job_id)
        except records.DamagedRecord as exc:
            damaged.append(exc)
    if not damaged:
        return Check("damaged records", "ok", f"{len(ids)} job records readable")
    shown = "; ".join(f"{exc.job_id}: {exc.why}" for exc in damaged[:5]) + (" …" if len(damaged) > 5 else "")
    steps = [f"git log {records.record_ref(exc.job_id)}   # {exc.job_id}: find a good record commit"
             for exc in damaged[:5]]
    steps.append("git update-ref refs/subtask/<id>/record <good commit>   # or drop the job: git update-ref -d ...")
    return Check("damaged records", "fail", f"{len(damaged)} damaged job records (commands on them exit 128): {shown}",
                 steps)


def check_slots(repo) -> Check:
    current = slots.read(repo.state_dir)
    if current.damaged:
        return Check("slots", "warn", "slots.json is damaged; the next command rebuilds it", ["git subtask list"])
    stale = [e["job"] for e in current.running if not liveness.is_held(repo.state_dir, e["job"])]
    if stale:
        return Check("slots", "warn", f"{len(stale)} slots held by dead workers: {', '.join(stale)}",
                     ["git subtask list   # reclaims them and ends those jobs"])
    return Check("slots", "ok", f"{len(current.running)} running, {len(current.queue)} queued")


def check_records(repo) -> Check:
    """Records a dead process left half-done: a finished job without its head pin or note, a job
    recorded running or queued that no worker, starter or queue holds, a stale ref lock."""
    current = slots.read(repo.state_dir)
    queued = {e["job"] for e in current.queue + current.waiting}  # a waiting entry: `plans` completes it
    incomplete: list[str] = []
    orphaned: list[str] = []
    locked: list[str] = []
    for entry in records.list_entries(repo):
        try:
            _look_for_half_written(repo, entry, queued, incomplete, orphaned, locked)
        except records.DamagedRecord:
            continue  # "damaged records" names it
    problems, steps = [], []
    if incomplete:
        problems.append(f"{len(incomplete)} finished jobs lack their head pin or note (a worker died "
                        f"after its final record): {', '.join(incomplete[:5])}")
        steps += ["git subtask list   # completes a job whose slot its dead worker still holds",
                  "git subtask notes rebuild   # rewrites every note",
                  "git update-ref refs/subtask/<id>/head <head commit from git subtask show <id>>"]
    if orphaned:
        problems.append(f"{len(orphaned)} jobs are recorded running or queued with no live worker: "
                        f"{', '.join(orphaned[:5])}")
        steps.append("git subtask wait <id>   # ends a job whose worker is gone")
    if locked:
        problems.append(f"{len(locked)} records have a stale ref lock (a writer died): {', '.join(locked[:5])}")
        steps.append("git subtask list   # removes a stale lock once no worker of that job lives")
    if problems:
        return Check("records", "warn", "; ".join(problems), steps)
    return Check("records", "ok", "no half-written records")


def _look_for_half_written(repo, entry: dict, queued: set, incomplete: list, orphaned: list, locked: list) -> None:
    job_id = entry["id"]
    age = records.ref_lock_age(repo, records.record_ref(job_id))
    if age is not None and age >= repo.config.number("refLockStale"):
        locked.append(job_id)
    if entry.get("state") in ("queued", "running"):
        if job_id in queued or liveness.is_held(repo.state_dir, job_id) or not executors.of_entry(entry).runs_here:
            return  # a cluster runs it: no local worker (brought home by list/wait from Ray's status)
        job = records.read(repo, job_id)
        if ownership.owns(repo, job) and not job.state.current.terminal:
            orphaned.append(job_id)
    elif _maybe_incomplete(repo, entry):
        job = records.read(repo, job_id)
        if ownership.owns(repo, job) and lifecycle.missing_after_end(repo, job):
            incomplete.append(job_id)


def _maybe_incomplete(repo, entry: dict) -> bool:
    """A cheap first look (refs and one note read, no record read): could this finished job lack
    its pin or note? False only when the pin (or, with none, the base) carries the job's block."""
    pin = repo.git.references.get(records.pin_ref(entry["id"], "head"))
    target = str(pin.target) if pin is not None else entry.get("base")
    if not target:
        return True
    try:
        return entry["id"] not in notes_store.read_blocks(repo.objects, target)
    except Exception:
        return True


def check_worktrees(repo) -> Check:
    root = repo.worktree_dir()
    ids = set(records.all_ids(repo))
    listed = subprocess.run(["git", "-C", str(repo.root), "worktree", "list", "--porcelain"],
                            capture_output=True, text=True, check=False).stdout
    registered = {line.split(" ", 1)[1] for line in listed.splitlines() if line.startswith("worktree ")}
    prunable = listed.count("\nprunable")
    orphans = [p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
               and (p.name not in ids or str(p) not in registered)] \
        if root.exists() else []
    problems, steps = [], []
    if orphans:
        problems.append(f"{len(orphans)} folders in {root} belong to no job or no registered worktree: "
                        f"{', '.join(orphans[:5])}")
        steps.append(f"look at them, then remove what you do not need (rm -r '{root}/<name>')")
    if prunable:
        problems.append(f"{prunable} worktree entries point at missing folders")
        steps.append("git worktree prune")
    if problems:
        return Check("worktrees", "warn", "; ".join(problems), steps)
    jobs = [p for p in registered if p.startswith(str(root) + os.sep) and not p.startswith(str(root / ".pool"))]
    return Check("worktrees", "ok", f"{len(jobs)} job worktrees")


def check_pool(repo) -> Check:
    status = pool.status(repo)
    said = (f"{len(status.entries)} of {status.target} ready worktrees, {size(status.bytes)} of "
            f"{size(status.max_bytes)}" + (f", at {', '.join(sorted({short(e.commit) for e in status.entries}))}"
                                           if status.entries else ""))
    if status.debris:
        return Check("pool", "warn", f"{said}; {status.debris} half-made (a filler was killed)",
                     ["git subtask pool fill   # removes them, then fills", "git subtask gc   # or empties the pool"])
    if status.bytes > status.max_bytes:
        return Check("pool", "warn", f"{said}: more than subtask.poolMaxBytes", ["git subtask gc"])
    return Check("pool", "ok", said + ("" if status.target else " (subtask.pool is 0: jobs check out their own)"))


def check_engines(repo) -> Check:
    probes = api.engines(repo)
    usable = [p.name for p in probes if p.usable]
    default = repo.config.get("engine")
    summary = ", ".join(f"{p.name}{'' if p.usable else ' (unusable)'}" for p in probes)
    if default and default not in usable:
        return Check("engines", "warn", f"the default engine {default} is not usable; engines: {summary}",
                     ["git subtask engines", f"git config subtask.engine {usable[0] if usable else 'shell'}"])
    return Check("engines", "ok", summary)


def check_isolation(repo) -> Check:
    """What confinement each engine gets here, and what `subtask.isolation` asks for."""
    state = isolation.support()
    probes = [p for p in api.engines(repo) if p.confinement]
    per_engine = "; ".join(f"{p.name}: {p.confinement}" for p in probes)
    refused = [p.name for p in probes if p.confinement.startswith("every start refused")]
    asked = repo.config.get("isolation")
    if not state.available:
        steps = ["use a kernel with Landlock (Linux 6.2+, CONFIG_SECURITY_LANDLOCK, landlock in lsm=)"]
        if asked and asked.strip().lower() != "none":
            return Check("isolation", "fail", f"subtask.isolation={asked} cannot be enforced: {state.reason}; "
                         "every start that asks for it is refused", steps + ["git config subtask.isolation none"])
        # A note, not a warning: the default falls back by design, and a kernel is not a setting
        # `doctor --strict` should fail on.
        return Check("isolation", "ok", f"note: engines run unconfined (isolation none): {state.reason}. {per_engine}",
                     steps)
    where = f"subtask.isolation={asked}" if asked else "engine defaults"
    ns = namespaces.support()
    try:
        isolation.resolve_network(repo.config.get("isolation.network"))
    except SubtaskError as exc:
        return Check("isolation", "fail", f"{exc.message}; every start is refused",
                     ["git config --unset subtask.isolation.network"])
    if not ns.available:
        steps = ["allow user namespaces (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone, "
                 "kernel.apparmor_restrict_unprivileged_userns) and install util-linux's unshare"]
        if asked and asked.strip().lower() != "none":
            return Check("isolation", "fail", f"subtask.isolation={asked} cannot be enforced: no namespaces "
                         f"({ns.reason}); every start that asks for it is refused", steps)
        return Check("isolation", "warn", f"{state.describe()} only: no namespaces here ({ns.reason}), so confined "
                     f"jobs can change the metadata of files outside and leave children behind. {per_engine}", steps)
    if refused:
        return Check("isolation", "warn",
                     f"subtask.isolation={asked} refuses every {', '.join(refused)} job. {per_engine}",
                     [f"git subtask start --isolation none --engine {refused[0]} ...  (per job)",
                      "git config --unset subtask.isolation  (engine defaults)"])
    return Check("isolation", "ok", f"{state.describe()}, user/mount/pid/network namespaces ({where}). {per_engine}")


def check_provenance(repo) -> Check:
    """This clone's identity, how its records are signed, whose signatures it can check, and the
    teammates' commits on this clone's jobs that `pull` kept aside."""
    clone = ownership.clone_id(repo)
    parts = [f"clone {clone}" if clone else "no clone id yet (made at the first start)"]
    mode, key = repo.config.sign_mode(), repo.config.signing_key()
    fmt = (repo.config.git("gpg.format") or "openpgp").lower()
    allowed = repo.config.git("gpg.ssh.allowedsignersfile")
    if mode == "always" and key is None:
        return Check("provenance", "fail", "subtask.sign is always but git has no signing key: every start is refused",
                     ["git config user.signingKey ~/.ssh/id_ed25519.pub; git config gpg.format ssh",
                      "git config subtask.sign auto"])
    parts.append(f"records signed ({fmt} key {key}, subtask.sign {mode})" if key else
                 "records not signed (no user.signingKey)" if mode != "never" else
                 "records not signed (subtask.sign never)")
    problems, steps = [], []
    if fmt == "ssh" and not allowed:
        problems.append("gpg.ssh.allowedSignersFile is not set: no signature can be checked here, so merge "
                        "re-runs the verify of every teammate's job")
        steps.append("git config gpg.ssh.allowedSignersFile ~/.config/git/allowed_signers   "
                     "# lines: <email> <key type> <public key>")
    aside = ownership.set_aside(repo)
    if aside:
        shown = ", ".join(aside[:5]) + (" …" if len(aside) > 5 else "")
        problems.append(f"{len(aside)} refs of this clone's jobs had commits on the remote that this clone did not "
                        f"write (kept aside, never read as the job's state): {shown}")
        steps += [f"git log {aside[0]}   # what the teammate wrote",
                  f"git update-ref -d {aside[0]}   # once looked at (it comes back if the remote still has it)"]
    if problems:
        return Check("provenance", "warn", "; ".join(parts + problems), steps)
    return Check("provenance", "ok", "; ".join(parts))


def check_clients(repo) -> Check:
    """Each MCP client `git subtask install` set up: its entry started as the client starts it,
    answering `initialize` and `tools/list` as this server (a real stdio handshake)."""
    found = client_config.installed()
    if not found:
        return Check("mcp clients", "ok", "none set up (git subtask install claude|codex registers the server)")
    good, bad, steps = [], [], []
    for item in found:
        problem = client_config.handshake(item, cwd=repo.root)
        where = f"{item.client} ({item.scope}, {client_config.show_path(item.path)})"
        if problem is None:
            good.append(where)
        else:
            bad.append(f"{where}: {problem}")
            steps.append(f"git subtask uninstall {item.client} --scope {item.scope} && "
                         f"git subtask install {item.client} --scope {item.scope}")
    if bad:
        return Check("mcp clients", "fail", "; ".join(bad) + (f"; answering: {', '.join(good)}" if good else ""), steps)
    return Check("mcp clients", "ok", "the server answers for " + ", ".join(good))
