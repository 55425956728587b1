"""Confinement of engines: what a job's process tree may write, enforced by the kernel (Landlock).

Modes (`JobSpec.isolation`, `--isolation`, `git config subtask.isolation`):
- `none`: the engine runs with the user's permissions (cwd is the worktree, nothing more).
- `worktree`: the engine's process tree may write only its worktree; the parts of the git dir its
  own commits need (`objects/`, its worktree's admin folder `worktrees/<name>/`, the job-branch
  folders `refs/heads/subtask/` and `logs/refs/heads/subtask/`); a private temp dir (`TMPDIR`);
  a few devices (`/dev/null`, ttys, `/dev/shm`); the paths the engine declares it needs; and
  `git config --add subtask.isolation.writable PATH`.
- `readonly`: the same minus everything of the repository (worktree and git dir).

Reading and executing are never restricted, and the network is left as it is.

How: a Landlock ruleset that handles only write-type rights is built in the parent (the worker;
`proc/landlock.py` speaks to the kernel) while `confined(policy)` is active; `procs` asks
`child_hook()` for a pre-exec hook, and the child calls prctl(PR_SET_NO_NEW_PRIVS) and
landlock_restrict_self on that ruleset just before exec.
Landlock is inherited by every descendant and cannot be lifted.

What Landlock cannot express (path hierarchies, no per-name rules inside a folder): any file in
`refs/heads/subtask/` may be written, so a job can move another job's branch, never `main` or
any other branch, tag, remote ref, `packed-refs` or config; inside `objects/` a job can delete
objects as well as add them. See docs/security.md "Confinement".

Invariants:
- Never downgrade an isolation that was asked for (`--isolation`, `subtask.isolation`), because
  the user chose it for a reason: `resolve` refuses at start (exit 128) when this machine or this
  engine cannot provide it. Only an engine's *default* falls back to `none`, and the spec records why.
- Between fork and exec the child makes two syscalls on a ruleset built in the parent, nothing
  that imports, locks or builds paths; a failure there exits 126 with a message on stderr, never
  an unconfined exec.
- Never grant a confined job a folder of the git dir its own commits do not need, because refs
  are files: `refs/heads/` writable means `main` movable. Granted: `objects/`,
  `worktrees/<name>/`, `refs/heads/subtask/`, `logs/refs/heads/subtask/` (docs/security.md).
"""

from __future__ import annotations

import _thread
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence

from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.proc import landlock, namespaces
from subtask.proc.landlock import ALL, DEVICE, OBJECTS, REF_FILES, SCOPED_ABI, IsolationError, Support, support

TYPE_CHECKING = False  # not `typing`'s: `start` imports this module to choose a job's isolation
if TYPE_CHECKING:
    from pathlib import Path

    from subtask.proc import view as views

MODES = ("none", "worktree", "readonly")
NAMESPACES_ENV = namespaces.ENV  # tests: "0" pretends this machine offers no namespaces
ACTIVE_ENV = "SUBTASK_ISOLATION"  # set for confined engines: nested `start` says why it cannot work
WRITABLE_KEY = "isolation.writable"  # subtask.isolation.writable, and so on
READABLE_KEY = "isolation.readable"
SOCKET_KEY = "isolation.socket"
ENV_KEY = "isolation.env"
_PR_SET_PDEATHSIG = 1  # prctl: the signal a launcher gets when its parent dies

# Not /dev/pts or /dev/ptmx: a job could write to your open terminals (grant them if tests need ptys).
DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/random", "/dev/urandom")
DEVICE_DIRS = ("/dev/shm",)


# -- which mode a job gets ------------------------------------------------------------------------


def engine_default(engine) -> str:
    """The mode an engine gets when nobody asked: its own choice (`none` unless it declares one)."""
    return getattr(engine, "default_isolation", "none")


def engine_confinable(engine) -> bool:
    """Whether every process of this engine is started through `procs.run` (so it can be confined)."""
    return bool(getattr(engine, "confinable", False))


@dataclass(frozen=True)
class Choice:
    """The isolation mode a new job runs with, and where it came from (`resolve`)."""

    mode: str
    source: str  # flag | config | default
    note: str = ""  # why a default fell back to none


def check_mode(value: str | None, where: str) -> str | None:
    if value is None:
        return None
    mode = value.strip().lower()
    if mode not in MODES:
        kind = "usage" if where.startswith("--") else "fatal"
        raise SubtaskError(kind, f"{where} must be one of {', '.join(MODES)}, not {value!r}")
    return mode


def resolve(engine, *, readonly: bool, flag: str | None, configured: str | None,
            landlock: Support | None = None) -> Choice:
    """The mode a new job runs with. Asked for (flag, then config) and not possible: refused.
    `landlock`: what confines writes here, when the caller knows (`support_seen`); else `support()`."""
    landlock = landlock if landlock is not None else support()
    asked = check_mode(flag, "--isolation")
    source = "flag"
    if asked is None:
        asked, source = check_mode(configured, "git config subtask.isolation"), "config"
    if asked is not None:
        if asked != "none":
            _require(engine, asked, source, landlock)
        return Choice(asked, source)
    mode = engine_default(engine)
    if mode == "worktree" and readonly:
        mode = "readonly"
    if mode != "none" and not landlock.available:
        return Choice("none", "default", f"{mode} isolation unavailable here: {landlock.reason}")
    if mode != "none" and not namespaces.support().available:
        return Choice(mode, "default", f"{PARTIAL}: {namespaces.support().reason}")
    return Choice(mode, "default")


PARTIAL = ("writes only (Landlock): the job sees the whole machine (no view of its own), and metadata outside "
           "the worktree and children that outlive the job are not confined here")


def _require(engine, mode: str, source: str, landlock: Support) -> None:
    how = "--isolation" if source == "flag" else "git config subtask.isolation"
    if not engine_confinable(engine):
        raise SubtaskError("fatal", f"the {engine.name} engine cannot be confined by git-subtask ({how} {mode}): "
                           "its processes are not started through git-subtask; it keeps its own sandbox",
                           hint=f"git subtask start --isolation none --engine {engine.name} ...")
    if not landlock.available:
        raise SubtaskError("fatal", f"{how} {mode} cannot be enforced on this machine: {landlock.reason}",
                           hint="git subtask doctor; or run unconfined on purpose: --isolation none")
    refusal = getattr(engine, "confinement_refusal", None)
    reason = refusal(mode) if callable(refusal) else None
    if reason:  # the engine's own sandbox cannot work inside ours: refused, never downgraded
        raise SubtaskError("fatal", f"{how} {mode}: {reason}",
                           hint=(getattr(engine, "CONFINEMENT_HINT", None)
                                 or f"git subtask start --isolation none --engine {engine.name} ..."))
    if not namespaces.support().available:
        raise SubtaskError("fatal", f"{how} {mode} cannot be enforced on this machine: it needs user, mount and pid "
                           f"namespaces (for the metadata of files outside the worktree, and for children that "
                           f"outlive the job): {namespaces.support().reason}",
                           hint="git subtask doctor; or run unconfined on purpose: --isolation none")


NETWORK_MODES = ("allow", "none")


def resolve_network(configured: str | None) -> str:
    """`subtask.isolation.network`: `allow` (default) or `none` (loopback only), refused where it
    cannot be enforced."""
    value = (configured or "allow").strip().lower()
    if value not in NETWORK_MODES:
        raise SubtaskError("fatal", f"git config subtask.isolation.network must be allow or none, not {configured!r}",
                           hint="git config subtask.isolation.network none")
    if value == "none" and not namespaces.support().available:
        raise SubtaskError("fatal", "git config subtask.isolation.network none cannot be enforced on this machine: "
                           f"it needs a network namespace: {namespaces.support().reason}",
                           hint="git config --unset subtask.isolation.network")
    return value


def enforcement(mode: str) -> str:
    """What confines a job of this mode here, in words (`engines`, doctor)."""
    parts = [f"{support().describe()} for writes"] if mode != "none" else []
    ns = namespaces.support()
    if not ns.available:
        parts.append(f"no namespaces: {ns.reason}")
    elif mode != "none":
        parts.append("a view of its own (mount namespace); pid namespace for children")
    else:
        parts.append("children ended by the worker as their subreaper")
    return "; ".join(parts)


def own_sandbox(engine, readonly: bool = False) -> str | None:
    """The sandbox an engine enforces itself on a job run without ours (codex's `--sandbox`
    mode), or None: it has none, or it is turned off."""
    own = getattr(engine, "own_sandbox", None)
    return own(readonly) if callable(own) else None


def unconfined_warning(engine, mode: str, readonly: bool = False) -> str | None:
    """One line `start` prints when nothing would confine a job: the engine's own sandbox turned
    off, and isolation `mode` none (None when something confines it)."""
    warn = getattr(engine, "unconfined_warning", None)
    return warn(mode, readonly) if callable(warn) else None


def describe(engine, configured: str | None = None) -> str:
    """What an engine gets here when nothing is passed to `start`, in words, for `engines` and `doctor`."""
    try:
        mode = resolve(engine, readonly=False, flag=None, configured=configured)
    except SubtaskError as exc:
        return f"every start refused: {exc.message}"
    if mode.mode == "none" and unconfined_warning(engine, "none"):
        how = "(git config subtask.isolation)" if mode.source == "config" else "by default"
        available = support().available
        extra = f"--isolation worktree on request ({support().describe()})" if available else support().reason
        return f"none {how}, and its own sandbox is off: nothing confines it; {extra}"
    if mode.source == "config":
        return f"{mode.mode} (git config subtask.isolation)" \
            + (f" ({enforcement(mode.mode)})" if mode.mode != "none" else "")
    if mode.mode == "none":
        if mode.note:
            return f"none ({mode.note})"
        if not engine_confinable(engine):
            return "none (not started through git-subtask, so it cannot be confined; its own sandbox applies)"
        extra = (f"--isolation worktree|readonly on request ({support().describe()})" if support().available else
                 support().reason)
        return f"none by default (its own sandbox applies); {extra}"
    return f"{mode.mode} by default ({enforcement(mode.mode)})"


# -- the policy of one run ------------------------------------------------------------------------


@dataclass
class Grant:
    """One path a run's Landlock rules let it use, with the rights given and why."""

    path: str
    why: str
    rights: int = ALL
    shown: str | None = None  # where the job sees it, when elsewhere (the private folders)

    def to_dict(self) -> dict:
        return {"path": self.shown or self.path, "why": self.why}


@dataclass
class Policy:
    """The confinement of one run (`build_policy`): its grants, its view and its namespaces."""

    mode: str
    grants: list[Grant] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # asked-for paths that do not exist (not granted)
    tmpdir: str | None = None  # the attempt's private folder (`area`): TMPDIR where no view shows /tmp
    plan: namespaces.Plan = field(default_factory=namespaces.Plan)  # set by `plan_namespaces`
    children: str = "not confined"  # how no process of the job outlives it, in words
    readable: list[Grant] = field(default_factory=list)  # beyond the system: grants, the engine's
    sockets: list[str] = field(default_factory=list)  # host sockets granted by name
    inputs: views.Inputs | None = None  # what its view is made of (confined modes)

    @property
    def view(self) -> views.View | None:
        return self.plan.view

    def enforced_by(self) -> str | None:
        """What the kernel enforces for this run, or None: nothing of ours confined it."""
        parts = [support().describe()] if self.mode != "none" else []
        kinds = [kind for kind, on in (("mount", self.plan.view is not None), ("pid", self.plan.pid),
                                       ("network", not self.plan.network)) if on]
        if kinds:
            parts.append("+".join(kinds) + (" namespace" if len(kinds) == 1 else " namespaces"))
        return ", ".join(parts) or None

    def _shown(self, grant: Grant) -> bool:
        """Is the grant something the job sees? In a view, the private folder itself is not (only
        the folders of it shown elsewhere: HOME, /tmp, …)."""
        if self.plan.view is None or not self.tmpdir or grant.shown is not None:
            return True
        return not (grant.path == self.tmpdir or grant.path.startswith(self.tmpdir.rstrip("/") + "/"))

    def to_dict(self) -> dict:
        confined = self.mode != "none"
        view = self.plan.view
        return {"mode": self.mode, "enforced_by": self.enforced_by(),
                "view": "allowlist" if view is not None else ("the host's" if confined else "none"),
                "signals": "only inside the sandbox" if confined and support().abi >= SCOPED_ABI else "not scoped",
                "abstract_sockets": ("only inside the sandbox" if confined and support().abi >= SCOPED_ABI
                                     else "network namespace" if not self.plan.network else "not scoped"),
                "metadata": ("read-only outside the writable paths (mount namespace)" if view is not None
                             else "not confined"),
                "children": self.children, "network": "allow" if self.plan.network else "none",
                "writable": [g.to_dict() for g in self.grants if self._shown(g)], "missing": self.missing,
                "readable": view.readable() if view is not None else [g.to_dict() for g in self.readable],
                "sockets": self.sockets}


def plan_namespaces(policy: Policy, *, network: str, asked: bool) -> None:
    """Decide the namespaces of the job's processes (`policy.plan`, `policy.children`).

    Confined modes get a mount namespace holding the job's view (`view.plan`: an allowlist), and a
    pid namespace. Mode `none` means the user's own permissions: no namespace (but a network one
    when asked), and the worker ends what the job left running as the subreaper of its orphans.
    `asked` (the mode came from a flag or config): where the namespaces are missing, the attempt
    fails rather than running with less than the start promised."""
    ns = namespaces.support()
    if not ns.available:
        if network == "none" or (asked and policy.mode != "none"):
            raise IsolationError(f"namespaces unavailable here: {ns.reason}")
        policy.children = "ended by the worker when the attempt ends (subreaper); not if the worker is killed"
        return
    from subtask.proc import view as views  # the worker's: `start` only chooses

    inputs = policy.inputs if policy.mode != "none" else None
    confined = inputs is not None
    try:
        view = views.plan(inputs) if inputs is not None else None
    except OSError as exc:
        raise IsolationError(f"could not prepare the job's view: {exc}") from exc
    policy.plan = namespaces.Plan(pid=confined, view=view, network=network != "none")
    if view is not None:
        shown = {m.source: m.target for m in view.mounts if m.why.startswith(views.PRIVATE)}
        for grant in policy.grants:
            grant.shown = shown.get(grant.path)
    policy.children = ("pid namespace: ended with the engine, on stop, and with a killed worker" if policy.plan.pid
                       else "ended by the worker when the attempt ends (subreaper); not if the worker is killed")


def configured_paths(config, root: str | os.PathLike[str], key: str) -> list[str]:
    """Every value of `git config subtask.<key>` (`isolation.writable`, `isolation.readable`,
    `isolation.socket`): `~` and `$VARS` expanded, relative to `root`."""
    paths = [os.path.expanduser(os.path.expandvars(v.strip())) for v in config.get_all(key) if v.strip()]
    return [os.path.normpath(os.path.join(root, p)) for p in paths]


def configured_writable(config, root: Path) -> list[str]:
    return configured_paths(config, root, WRITABLE_KEY)


def configured_names(config, key: str = ENV_KEY) -> list[str]:
    """Every value of `git config subtask.<key>` as a plain word (`isolation.env`: variable names)."""
    return [v.strip() for v in config.get_all(key) if v.strip()]


def engine_paths(engine, env: dict, kind: str = "writable") -> list[str]:
    """What the engine declares it needs (`writable_paths`, `readable_paths`, given the env)."""
    declared = getattr(engine, f"{kind}_paths", None)
    return [str(p) for p in (declared(env) if callable(declared) else [])]


def temp_env(tmpdir) -> dict[str, str]:
    """What points a child's temporary files at its private temp dir: TMPDIR and its aliases, and
    CLAUDE_CODE_TMPDIR, which Claude Code reads before TMPDIR (a person's own would send a confined
    job's Claude Code out of its sandbox, and leave its per-folder temp dirs where nobody removes
    them)."""
    return dict.fromkeys(("TMPDIR", "TMP", "TEMP", "CLAUDE_CODE_TMPDIR"), str(tmpdir))


def engine_credentials(engine, env: dict) -> list[str]:
    """The variables the engine process itself needs to authenticate (never its children's)."""
    declared = getattr(engine, "credential_env", None)
    return [str(n) for n in (declared(env) if callable(declared) else [])]


def build_policy(mode: str, *, worktree: Path, admin: Path, common_dir: Path, has_branch: bool, tmpdir: str,
                 extra: list[str], engine_extra: list[str], env: dict | None = None, state_dir: Path | None = None,
                 readable: Sequence[str] = (), engine_readable: Sequence[str] = (),
                 sockets: Sequence[str] = (), optional: Sequence[str] = ()) -> Policy:
    """The grants and the view's makings for one run; raises IsolationError when the repository
    parts cannot be found. `admin`: the worktree's admin folder as its caller knows it
    (`worktrees.expected_admin`, or what git made for a scratch), never read from the worktree's
    `.git`, which the job writes. `tmpdir`: the attempt's private folder (made, and removed by
    whoever made it), holding its private HOME, /tmp, runtime dir and /dev/shm."""
    policy = Policy(mode, tmpdir=tmpdir)
    if mode == "none":
        return policy
    if mode == "worktree":
        if not os.path.isdir(admin) or os.path.islink(admin):
            raise IsolationError(f"the git admin folder of worktree {worktree} is missing: {admin}")
        policy.grants += [Grant(str(worktree), "worktree"), Grant(str(admin), "git: this worktree's admin folder"),
                          Grant(str(common_dir / "objects"), "git: objects (add)", OBJECTS)]
        if has_branch:
            for folder in (common_dir / "refs" / "heads" / "subtask",
                           common_dir / "logs" / "refs" / "heads" / "subtask"):
                folder.mkdir(parents=True, exist_ok=True)  # git could not create it inside the sandbox
                policy.grants.append(Grant(str(folder), "git: job branches and their reflogs", REF_FILES))
        if (common_dir / "reftable").is_dir():
            policy.grants.append(Grant(str(common_dir / "reftable"), "git: reftable (every ref: not protected)"))
    from pathlib import Path

    from subtask.proc import view as views  # the worker's: `start` only chooses

    private = views.Private(Path(tmpdir))
    private.make()
    policy.grants += [Grant(tmpdir, "private temp dir (TMPDIR)"),
                      Grant(str(private.tmp), "private /tmp (TMPDIR), removed after the job"),
                      Grant(str(private.home), "private HOME (only what the engine needs), removed after the job"),
                      Grant(str(private.run), "private XDG_RUNTIME_DIR, removed after the job"),
                      Grant(str(private.shm), "private /dev/shm, removed after the job")]
    for path in DEVICE_FILES + DEVICE_DIRS:
        if os.path.exists(path):
            policy.grants.append(Grant(path, "device", DEVICE if path in DEVICE_FILES else ALL))
    writable: list[tuple[str, str]] = []
    for why, asked_for in (("engine", engine_extra), ("subtask." + WRITABLE_KEY, extra)):
        for path in asked_for:
            if os.path.exists(path):
                policy.grants.append(Grant(path, why))
                writable.append((path, why))
            else:
                policy.missing.append(path)
    shown: list[tuple[str, str]] = []
    for why, asked in (("engine", engine_readable), ("subtask." + READABLE_KEY, readable)):
        for path in asked:
            if os.path.exists(path):
                policy.readable.append(Grant(path, why))
                shown.append((path, why))
            else:
                policy.missing.append(path)
    for path in sockets:
        (policy.sockets.append(path) if os.path.exists(path) else policy.missing.append(path))
    env = dict(os.environ if env is None else env)
    repository = {g.path for g in policy.grants if g.why.startswith("git")}
    policy.inputs = views.Inputs(
        mode=mode, private=private, env=env, worktree=str(worktree), admin=str(admin), common_dir=str(common_dir),
        state_dir=str(state_dir or common_dir / "subtask"),
        writable=[(p, why) for p, why in writable] + [(g.path, g.why) for g in policy.grants
                                                       if g.path in repository and g.path != str(admin)],
        readable=shown, optional=list(optional), sockets=list(policy.sockets),
        engine_home=[*engine_extra, *engine_readable])
    return policy


def outside_sandbox(repo, worktree: Path, admin: Path, tmpdir: Path, network: str) -> Sandbox | None:
    """The sandbox for a command run on a job's files after the job ended (a verify `merge` runs
    again, a best-of judge): its worktree and its admin folder `admin` (its caller's to know)
    writable, as a job's verify has them, `tmpdir` too (its caller's TMPDIR), in a view of its own
    (whose private folders the sandbox removes when closed); its environment through
    `Sandbox.withhold`. Handed to `procs.run(sandbox=...)`, never made active (other threads'
    children would get it). None only where the machine has no Landlock."""
    if not support().available:
        return None
    import shutil  # a verify run again, a judge: never a `start` (bz2, lzma, random)
    import tempfile
    from pathlib import Path

    area = Path(tempfile.mkdtemp(prefix=f"{tmpdir.name}.view-", dir=tmpdir.parent))
    try:
        policy = build_policy("worktree", worktree=worktree, admin=admin, common_dir=repo.common_dir, has_branch=False,
                              tmpdir=str(area), extra=[str(tmpdir), *configured_writable(repo.config, repo.root)],
                              engine_extra=[], state_dir=repo.state_dir,
                              readable=configured_paths(repo.config, repo.root, READABLE_KEY))
        plan_namespaces(policy, network=network, asked=False)
        return Sandbox(policy, owns=area, granted=configured_names(repo.config))
    except BaseException:
        shutil.rmtree(area, ignore_errors=True)
        raise


# -- applying it ----------------------------------------------------------------------------------


# Process-wide, not per thread: a worker runs one engine at a time, and an engine that starts its
# children from another thread must not escape.
_active: Sandbox | None = None
_active_lock = _thread.allocate_lock()  # threading.Lock, without importing `threading` (~0.5 ms of a start)


class Sandbox:
    """A policy made into a kernel ruleset and a namespace plan, once, before any engine runs (so
    a failure stops the job). Mode `none` may still have a plan: a pid namespace, no network."""

    def __init__(self, policy: Policy, owns: Path | None = None, granted: Sequence[str] = ()):
        self.mode = policy.mode
        self.granted = set(granted)  # variables `subtask.isolation.env` lets through
        self.policy = policy
        self.plan = policy.plan
        self._owns = owns  # a private folder this sandbox removes when closed
        self.fd: int | None = landlock.ruleset(policy.mode, policy.grants) if policy.mode != "none" else None
        from subtask.proc import view as views  # the worker's: `start` only chooses

        self.accounting = views.Accounting(policy.view if owns is None else None)

    @property
    def active(self) -> bool:
        return self.fd is not None or self.plan.active

    def withhold(self, env: dict) -> dict:
        """`env` without what a confined process is not given (host sockets, credentials)."""
        if self.mode == "none":
            return env
        from subtask.proc import view as views

        withheld = set(views.withheld(env, self.granted))
        return {k: v for k, v in env.items() if k not in withheld}

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.accounting.close()
        if self._owns is not None:
            import shutil  # only a sandbox that owns a folder (a verify's, a judge's)

            shutil.rmtree(self._owns, ignore_errors=True)
            self._owns = None


class confined:  # noqa: N801  (a phrase: `with confined(sandbox):`; a class: `start` needs no contextlib)
    """While active, every child `procs` starts in this process runs in the sandbox."""

    def __init__(self, sandbox: Sandbox):
        self.sandbox, self.entered, self.previous = sandbox, False, _active

    def __enter__(self) -> None:
        global _active
        if self.sandbox.active:
            with _active_lock:
                self.previous, _active = _active, self.sandbox
            self.entered = True

    def __exit__(self, *exc: object) -> None:
        global _active
        if self.entered:
            with _active_lock:
                _active = self.previous


def child_hook(sandbox: Sandbox | None = None) -> Callable[[], None] | None:
    """The pre-exec hook for a child started now in `sandbox` (else the active one), or None when
    nothing is to be confined."""
    sandbox = sandbox if sandbox is not None else _active
    if sandbox is None or not sandbox.active:
        return None
    # Everything the child needs is made here, in the parent: between fork and exec it only calls.
    enter = sandbox.plan.prepare() if sandbox.plan.active else None
    restrict = landlock.restrict_self_call(sandbox.fd) if sandbox.fd is not None else None
    write, exit_ = os.write, os._exit
    message = b"git-subtask: could not confine this process (Landlock); it was not started\n"

    def confine_self() -> None:
        if enter is not None:
            enter()  # namespaces first: a Landlock-confined process may not mount
        if restrict is not None and not restrict():
            write(2, message)
            exit_(126)

    return confine_self


def wrap_argv(argv: list[str], sandbox: Sandbox | None = None) -> list[str]:
    """The argv a child started now execs: through `unshare --fork` when it gets a pid namespace."""
    sandbox = sandbox if sandbox is not None else _active
    return sandbox.plan.wrap(argv) if sandbox is not None else argv


def launch_spec() -> dict | None:
    """The active sandbox, as `launch` rebuilds it in its own process: for a spawner that takes no
    pre-exec hook and closes every fd (the claude SDK), so no ruleset fd can cross it. None when
    nothing is confined."""
    from subtask.proc import context

    sandbox, starter = _active, context.spec()
    if sandbox is None and starter is None:
        return None
    spec: dict = {"v": 1, "context": starter}
    if sandbox is not None:
        spec.update(mode=sandbox.mode, grants=[[g.path, g.rights] for g in sandbox.policy.grants],
                    plan=sandbox.plan.to_json())
    return spec


LAUNCH_USAGE = ("usage: python -m subtask.proc.isolation [--parent PID] [--session] [--pid-file FILE] "
                "[--sandbox FILE] -- PROGRAM [ARG...]")


def launch(args: list[str]) -> int:
    """`python -m subtask.proc.isolation ... -- PROGRAM ARG...`: become what a child `procs.run` starts
    would be, then exec PROGRAM. `--parent PID`: die with it (PR_SET_PDEATHSIG), and not start when
    it is already gone; `--session`: a session and process group of its own; `--pid-file FILE`:
    say its pid there (the spawner cannot); `--sandbox FILE`: a `launch_spec`, entered as the
    pre-exec hook would (namespaces, then Landlock). A failure exits 126 before any exec."""
    options: dict[str, str | bool] = {}
    while args and args[0] != "--":
        flag = args.pop(0)
        if flag == "--session":
            options["session"] = True
        elif flag in ("--parent", "--pid-file", "--sandbox") and args:
            options[flag[2:]] = args.pop(0)
        else:
            print(LAUNCH_USAGE, file=sys.stderr)
            return 129
    if len(args) < 2:
        print(LAUNCH_USAGE, file=sys.stderr)
        return 129
    argv = args[1:]
    if "parent" in options:
        import ctypes

        landlock.linux_libc().prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                            ctypes.c_ulong(0), ctypes.c_ulong(0))
        if str(os.getppid()) != options["parent"]:
            return 126  # the parent died before the signal was armed
    if options.get("session"):
        os.setsid()
    if "pid-file" in options:
        tmp = f"{options['pid-file']}.{os.getpid()}"
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write(f"{os.getpid()}\n")
        os.replace(tmp, str(options["pid-file"]))
    if "sandbox" in options:
        try:
            with open(options["sandbox"], encoding="utf-8") as fh:
                spec = json.load(fh)
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"git-subtask: could not confine this process ({exc}); it was not started\n")
            return 126
        if isinstance(spec, dict) and spec.get("context") is not None:
            from subtask.proc import context

            context.apply_spec(spec["context"])  # exits 126 when it cannot
    if "sandbox" in options and isinstance(spec, dict) and "mode" in spec:
        try:
            policy = Policy(spec["mode"], [Grant(path, "", rights) for path, rights in spec["grants"]],
                            plan=namespaces.Plan.from_json(spec["plan"]))
            fd = landlock.ruleset(policy.mode, policy.grants) if policy.mode != "none" else None
        except (OSError, ValueError, KeyError, TypeError, IsolationError) as exc:
            sys.stderr.write(f"git-subtask: could not confine this process ({exc}); it was not started\n")
            return 126
        if policy.plan.active:
            policy.plan.prepare()()  # exits 126 with a message when it cannot
        if fd is not None:
            if not landlock.restrict_self_call(fd)():
                sys.stderr.write("git-subtask: could not confine this process (Landlock); it was not started\n")
                return 126
            os.close(fd)
        argv = policy.plan.wrap(argv)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"{argv[0]}: {exc.strerror}\n")
        return 127 if isinstance(exc, FileNotFoundError) else 126


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
