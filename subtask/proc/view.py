"""The confined job's view of the machine, built from an allowlist (issue 40).

A confined job does not get the host's root with holes cut in it: it gets a root of our making,
an empty read-only tmpfs that holds only what the job needs, bound from the host at the same paths:
- read-only: the system folders (`SYSTEM`), the interpreter and prefixes of this Python (its
  venv, its base, the folder of its real executable: pyenv keeps them in HOME), every folder on
  the job's PATH, this package, the paths the engine declares, `subtask.isolation.readable`
  paths, the repository's git dir without the state folder and without other worktrees' admin
  folders, sockets granted by name (`subtask.isolation.socket`);
- writable: the worktree (read-only in mode `readonly`), its admin folder, the objects and
  job-branch folders, `subtask.isolation.writable` paths and the engine's own state;
- private, backed by the attempt's folder (`area`, removed after it): HOME, `/tmp` (TMPDIR),
  XDG_RUNTIME_DIR and `/dev/shm`;
- a minimal `/dev` (null, zero, full, random, urandom, tty), a fresh `/proc` of the job's own
  pid namespace (mounted by its pid 1, `namespaces`).
What is not listed is not there: other checkouts and jobs' worktrees, the main checkout, the state
folder, `/run`, `/var`, `/home`, the user's real HOME, and with them every host socket, agent and
secret file. Nothing can be connected to, read or signalled that is not mounted.

The view's own accounting (what the job tried that the view kept out, observed, never read from
the job's output):
- decoys: a listening socket where a host socket the job may know of would be (the paths its
  starter's environment names, the usual places: `KNOWN_SOCKETS`, the sockets in the secret
  folders of HOME); the job's pid 1's parent accepts each connection, closes it at once, and
  writes a line to `observed` (a file outside the view). A decoy also covers a host socket that
  lies inside a folder the view shows (a bind over it).
- stand-ins: an empty file or folder where a secret of HOME would be (`SECRET_HOME`) or of the
  system (`SECRET_SYSTEM`), watched with inotify by the worker: opening one is recorded.
A job that knows a path no one told us of finds nothing there, and that is not recorded.

Invariants:
- Never show a confined job a folder by carving it out of the host's view, because a hole cut
  in a whole machine loses to the next door: a unix socket is connected to through a read-only
  mount, Landlock does not govern `connect()`, and a network namespace does not scope pathname
  sockets. The view is an allowlist (`plan`): whatever is added here is added by name, and what
  it does not name is absent (`test_view::*`,
  `view::test_a_confined_job_reaches_no_host_socket_and_no_secret[allow|none]`).
- Never bind the user's real HOME, `/run`, `/tmp` or the state folder into a view, because they
  hold the agents, sockets and credentials the view exists to keep out; HOME is a private folder
  holding only what the engine declares it needs.
- Between fork and exec only prepared calls run (`Build`): every path, struct and function is
  made in the parent; a failure writes one line to stderr and exits 126, never an exec with
  less of a view.
- Never give a confined job's setup, verify or teardown the engine's credentials, nor any process
  of it a variable naming a host socket, because the sandbox would hand out what its view keeps
  out: the environment passes `withheld` (granted by name with `subtask.isolation.env`),
  and the engine alone gets the keys it declares (`credential_env`).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import stat
import struct
import sys
from collections.abc import Mapping
from pathlib import Path

from subtask.model import lazyre
from subtask.model.dataclass import dataclass, field
from subtask.proc.syscalls import number as syscall_number

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys")
# Secret files of the system a root-run job could read as their owner: hidden behind stand-ins.
SECRET_SYSTEM = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/ssl/private")
SECRET_SYSTEM_GLOBS = (("/etc/ssh", lazyre.compile(r"ssh_host_.*_key\Z")),)
# Where credentials live in a HOME: each that exists gets an empty stand-in in the private HOME
# (a folder: its entries, one level, as empty files; its sockets as decoys).
SECRET_HOME = (".ssh", ".aws", ".azure", ".config/gcloud", ".kube", ".docker", ".gnupg", ".netrc",
               ".git-credentials", ".config/git/credentials", ".config/gh", ".pypirc", ".npmrc",
               ".yarnrc", ".cargo/credentials", ".cargo/credentials.toml", ".gem/credentials",
               ".terraform.d", ".vault-token", ".password-store", ".local/share/keyrings",
               ".claude", ".claude.json", ".codex", ".config/op", ".pgpass", ".my.cnf")
# Sockets a job could know of without being told: the usual places, relative to HOME or absolute,
# and the folder XDG_RUNTIME_DIR names (its sockets, one level, and these below it).
KNOWN_SOCKETS_HOME = (".cache/git/credential/socket", ".git-credential-cache/socket", ".gnupg/S.gpg-agent",
                      ".gnupg/S.gpg-agent.ssh", ".gnupg/S.gpg-agent.extra", ".gnupg/S.gpg-agent.browser",
                      ".docker/run/docker.sock")
KNOWN_SOCKETS = ("/run/docker.sock", "/var/run/docker.sock", "/run/podman/podman.sock",
                 "/run/containerd/containerd.sock", "/run/dbus/system_bus_socket")
KNOWN_SOCKETS_RUNTIME = ("gnupg/S.gpg-agent", "gnupg/S.gpg-agent.ssh", "podman/podman.sock", "docker.sock", "bus")
# Variables that name a host socket, whatever their value says now.
SOCKET_VARIABLES = ("SSH_AUTH_SOCK", "SSH_AGENT_PID", "DBUS_SESSION_BUS_ADDRESS", "DBUS_SYSTEM_BUS_ADDRESS",
                    "DOCKER_HOST", "GPG_AGENT_INFO", "CONTAINER_HOST", "PODMAN_HOST", "TMUX", "WAYLAND_DISPLAY")
DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
DEVICE_LINKS = (("/dev/fd", "/proc/self/fd"), ("/dev/stdin", "/proc/self/fd/0"),
                ("/dev/stdout", "/proc/self/fd/1"), ("/dev/stderr", "/proc/self/fd/2"))
MAX_DECOYS = 64
MAX_STANDINS = 256
MAX_STANDINS_PER_FOLDER = 32
MAX_OBSERVED = 50  # lines of accounting kept per run (a job that knocks 10,000 times is told once)

# A variable carries a credential when its name says so (the names `redact` treats as secret) or
# its value is a URL with a password in it.
_SECRET_NAME = lazyre.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH(?!OR)|COOKIE", re.IGNORECASE)
_URL_PASSWORD = lazyre.compile(r"://[^/\s:@]+:[^/\s@]+@")
_NOT_SECRET = frozenset({"XAUTHORITY"})


# -- what the view holds ----------------------------------------------------------------------------

RO, RW, OPTIONAL, LINK = "ro", "rw", "ro?", "link"  # OPTIONAL: read-only, left out when the source is missing


@dataclass(frozen=True)
class Mount:
    """One mount of the view: a host path bound where the job sees it, or a link."""

    kind: str  # RO | RW | OPTIONAL | LINK
    target: str  # where the job sees it
    source: str  # the host path bound there (LINK: the link's text)
    why: str = ""

    def to_json(self) -> list[str]:
        return [self.kind, self.target, self.source]


@dataclass(frozen=True)
class Decoy:
    """A listening socket where a host socket the job may know of would be (see the module docstring)."""

    shown: str  # the path the job would connect to
    host: str  # where the listening socket is made (in the private folders, else bound at `shown`)


@dataclass
class View:
    """Everything a child needs to build the view, as data (the claude launcher gets it as JSON)."""

    root: str  # an empty host folder of the attempt's own, where the new root is mounted
    mounts: list[Mount] = field(default_factory=list)
    decoys: list[Decoy] = field(default_factory=list)
    observed: str = ""  # the host file the decoys' accounting goes to (outside the view)
    # Watched by the worker: (host folder, the folder the job sees, the names in it that are
    # stand-ins; None: every name, and the folder itself).
    standins: list[tuple[str, str, tuple[str, ...] | None]] = field(default_factory=list)

    def stand_in(self, host: Path, shown: str, folder: bool) -> None:
        """Watch a stand-in: a folder as itself, a file through its folder (files are links of one)."""
        if folder:
            self.standins.append((str(host), shown, None))
        else:
            self.standins.append((str(host.parent), os.path.dirname(shown), (host.name,)))

    def to_json(self) -> dict:
        return {"root": self.root, "mounts": [m.to_json() for m in self.mounts],
                "decoys": [[d.shown, d.host] for d in self.decoys], "observed": self.observed}

    @classmethod
    def from_json(cls, data: dict) -> View:
        return cls(str(data["root"]), [Mount(str(k), str(t), str(s)) for k, t, s in data["mounts"]],
                   [Decoy(str(a), str(b)) for a, b in data["decoys"]], str(data["observed"]))

    def readable(self) -> list[dict]:
        """What it may read, with why (the system, its tools, the git dir, grants, the engine's)."""
        return [{"path": m.target, "why": m.why} for m in self.mounts if m.kind == RO and m.why and m.why != HIDDEN]


@dataclass(frozen=True)
class Private:
    """The attempt's private folders on the host (under `area`), shown at other paths."""

    area: Path

    @property
    def home(self) -> Path:
        return self.area / "home"

    @property
    def tmp(self) -> Path:
        return self.area / "tmp"

    @property
    def run(self) -> Path:
        return self.area / "run"

    @property
    def shm(self) -> Path:
        return self.area / "shm"

    @property
    def root(self) -> Path:
        return self.area / "root"

    @property
    def spare(self) -> Path:
        return self.area / "spare"  # decoys and stand-ins bound elsewhere, an empty folder

    @property
    def observed(self) -> Path:
        return self.area / "observed.jsonl"

    @property
    def empty_file(self) -> Path:
        return self.spare / "empty-file"

    def make(self) -> None:
        for folder in (self.area, self.home, self.tmp, self.run, self.shm, self.root, self.spare):
            folder.mkdir(mode=0o700, exist_ok=True)
        if not self.empty_file.exists():
            _empty_file(self.empty_file)


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def _python_prefixes() -> list[str]:
    """Where this interpreter and its packages live: its venv, its base (pyenv's live in HOME),
    the folder of its real executable, and this package (an editable install is elsewhere)."""
    real = os.path.realpath(sys.executable)
    found = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.dirname(real)), str(Path(__file__).resolve().parent.parent)]
    return [p for p in dict.fromkeys(os.path.normpath(p) for p in found) if p not in ("/", "")]


def socket_paths(value: str) -> list[str]:
    """The socket paths a variable's value names: a path, `unix:path=P` (D-Bus, several allowed),
    `unix://P` (Docker), `P:pid:1` (GPG_AGENT_INFO)."""
    found = []
    for part in value.split(";"):
        part = part.strip()
        if part.startswith("unix:"):
            for item in part[5:].split(","):
                if item.startswith("path="):
                    found.append(item[5:])
        elif part.startswith("unix://"):
            found.append(part[7:])
        elif part.startswith("/"):
            found.append(re.split(r"[,:]", part, maxsplit=1)[0])  # GPG_AGENT_INFO P:pid:1, TMUX P,pid,n
    return [os.path.normpath(p) for p in found if p.startswith("/")]


def withheld(env: Mapping[str, str], granted: set[str]) -> list[str]:
    """The variables a confined job is not given: those that name a host socket and those that
    carry a credential, unless granted by name (`subtask.isolation.env`)."""
    names = []
    for name, value in env.items():
        if name in granted or name in _NOT_SECRET:
            continue
        if (name in SOCKET_VARIABLES or _SECRET_NAME.search(name) or _URL_PASSWORD.search(value)
                or any(_is_socket(p) for p in socket_paths(value))):
            names.append(name)
    return sorted(names)


@dataclass
class Inputs:
    """What the view of one run is made from (all host paths)."""

    mode: str  # worktree | readonly
    private: Private
    env: Mapping[str, str]  # the starter's environment (before anything is withheld)
    worktree: str
    admin: str
    common_dir: str
    state_dir: str
    writable: list[tuple[str, str]]  # (path, why), existing
    readable: list[tuple[str, str]]  # (path, why), existing
    optional: list[str] = field(default_factory=list)  # files shown read-only while they exist
    sockets: list[str] = field(default_factory=list)  # granted by name
    engine_home: list[str] = field(default_factory=list)  # paths of HOME the engine's own state needs


def plan(inputs: Inputs) -> View:
    """The view of one run: mounts in the order they are made, decoys and stand-ins. Makes the
    private folders, the stand-ins and the hidden folders' empty stand-ins (on the host, in the
    attempt's `area`), nothing else."""
    private, env = inputs.private, inputs.env
    private.make()
    home = os.path.normpath(env.get("HOME") or "/")
    runtime = os.path.normpath(env["XDG_RUNTIME_DIR"]) if env.get("XDG_RUNTIME_DIR", "").startswith("/") else None
    mounts: list[Mount] = []
    for folder in SYSTEM:
        if os.path.islink(folder):
            mounts.append(Mount(LINK, folder, os.readlink(folder)))
        elif os.path.isdir(folder):
            mounts.append(Mount(RO, folder, folder, "system"))
    mounts.append(Mount(RW, "/proc", "/proc"))  # under the fresh /proc its pid 1 mounts (which needs one shown)
    for path, link in DEVICE_LINKS:
        mounts.append(Mount(LINK, path, link))
    mounts += [Mount(RW, path, path) for path in DEVICE_FILES if os.path.exists(path)]
    mounts.append(Mount(RW, "/dev/shm", str(private.shm), PRIVATE + " /dev/shm"))
    mounts.append(Mount(RW, "/tmp", str(private.tmp), PRIVATE + " /tmp (TMPDIR)"))
    for link, target in (("/var/run", "../run"), ("/var/tmp", "../tmp")):
        mounts.append(Mount(LINK, link, target))
    if home != "/" and not any(_under(s, home) for s in SYSTEM):
        mounts.append(Mount(RW, home, str(private.home), PRIVATE + " HOME"))
    if runtime and runtime != "/":
        mounts.append(Mount(RW, runtime, str(private.run), PRIVATE + " XDG_RUNTIME_DIR"))
    mounts += [Mount(RO, path, path, "tools") for path in _tool_paths(env, home, inputs)]
    repository = RO if inputs.mode == "readonly" else RW
    mounts.append(Mount(RO, inputs.common_dir, inputs.common_dir, "git dir"))
    mounts.append(Mount(repository, inputs.admin, inputs.admin, "git: this worktree's admin folder"))
    mounts.append(Mount(repository, inputs.worktree, inputs.worktree, "worktree"))
    mounts += [Mount(RW, path, path, why) for path, why in inputs.writable]
    mounts += [Mount(RO, path, path, why) for path, why in inputs.readable]
    mounts += [Mount(OPTIONAL, path, path) for path in inputs.optional]
    mounts += [Mount(RO, path, path, "subtask.isolation.socket") for path in inputs.sockets if _is_socket(path)]
    # The state folder, other worktrees' admin folders and the worktree folder, wherever a shown
    # folder holds them: an empty folder of ours instead (the job's own admin folder and
    # worktree, and its task file, are bound back in it).
    hidden = [inputs.state_dir, os.path.join(inputs.common_dir, "worktrees"), os.path.dirname(inputs.worktree)]
    shown = _ordered(mounts)
    for n, folder in enumerate(f for f in dict.fromkeys(hidden) if os.path.isdir(f) and _shown_by_bind(f, shown)):
        spare = private.spare / f"hidden-{n}"
        spare.mkdir(exist_ok=True, mode=0o700)
        mounts.append(Mount(RO, folder, str(spare), HIDDEN))
    view = View(str(private.root), observed=str(private.observed))
    view.mounts = _ordered(mounts)
    _standins(view, inputs, home)
    _decoys(view, inputs, home, runtime)
    view.mounts = _ordered(view.mounts)
    _make_mountpoints_in_hidden(view.mounts)
    return view


HIDDEN = "hidden"  # an empty read-only folder of ours over one a shown folder holds


def _make_mountpoints_in_hidden(mounts: list[Mount]) -> None:
    """A hidden folder is shown read-only, so what is bound inside it (the job's own admin folder,
    its task file) gets its mount point made here, on the host, in the empty folder."""
    by_target = {m.target: m for m in mounts}
    for mount in mounts:
        above = _nearest(mount.target, by_target, strict=True)
        if above is None or above.why != HIDDEN or mount.kind == LINK:
            continue
        point = Path(above.source) / os.path.relpath(mount.target, above.target)
        point.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if os.path.isdir(mount.source) or mount.kind == RW and not os.path.exists(mount.source):
            point.mkdir(exist_ok=True, mode=0o700)
        elif not point.exists():
            _empty_file(point)


PRIVATE = "private"


def _tool_paths(env: Mapping[str, str], home: str, inputs: Inputs) -> list[str]:
    """This Python's prefixes and the folders of the job's PATH (a venv's bin: the whole venv):
    never HOME itself or a folder holding it, nor the repository's own folders (they are the
    job's, shown as such)."""
    found = []
    for path in [*_python_prefixes(), *(env.get("PATH") or "").split(os.pathsep)]:
        if not path.startswith("/"):
            continue
        path = os.path.normpath(path)
        prefix = os.path.dirname(path)
        if any(os.path.exists(os.path.join(prefix, marker)) for marker in ("pyvenv.cfg", "conda-meta")):
            path = prefix  # a venv's (or conda env's) bin: its interpreter needs the whole env
        if path == "/" or _under(home, path) or _under(path, inputs.state_dir) or _under(path, inputs.worktree):
            continue
        if os.path.isdir(path):
            found.append(path)
    return found


_RANK = {LINK: 4, RW: 3, RO: 2, OPTIONAL: 1}


def _ordered(mounts: list[Mount]) -> list[Mount]:
    """Parents before children; one mount per target (a system link, then writable, wins); a
    read-only bind of what a bind of the same host path above it already shows is left out, and
    so is anything below a link."""
    by_target: dict[str, Mount] = {}
    for mount in mounts:
        kept = by_target.get(mount.target)
        if kept is None or _RANK[mount.kind] > _RANK[kept.kind]:
            by_target[mount.target] = mount
    result: dict[str, Mount] = {}
    for mount in sorted(by_target.values(), key=lambda m: (m.target.count("/"), m.target)):
        above = _nearest(mount.target, result, strict=True)
        if above is not None and above.kind == LINK:
            continue
        if (above is not None and mount.kind in (RO, OPTIONAL) and _identity(above)
                and mount.source == mount.target):
            continue  # the bind above shows it already
        result[mount.target] = mount
    return list(result.values())


def _identity(mount: Mount) -> bool:
    return mount.kind in (RO, RW) and mount.source == mount.target


def _nearest(path: str, mounts: list[Mount] | dict[str, Mount], strict: bool = False) -> Mount | None:
    """The mount that shows `path` (the deepest whose target holds it): its folders looked up, one
    by one, in the mounts by target."""
    by_target = mounts if isinstance(mounts, dict) else {m.target: m for m in mounts}
    here = os.path.dirname(path) if strict else path
    while True:
        if here in by_target and not (strict and here == path):
            return by_target[here]
        if here in ("/", ""):
            return None
        here = os.path.dirname(here)


def _shown_by_bind(path: str, mounts: list[Mount]) -> bool:
    """Would the host's own file at `path` be seen (a bind of a host folder shows it)?"""
    above = _nearest(path, mounts)
    return above is not None and _identity(above)


def _private_host(path: str, mounts: list[Mount]) -> Path | None:
    """Where `path` of the view lies on the host when one of the private folders shows it."""
    above = _nearest(path, mounts)
    if above is None or not above.why.startswith(PRIVATE):
        return None
    rest = os.path.relpath(path, above.target)
    return Path(above.source) if rest == "." else Path(above.source) / rest


def _standins(view: View, inputs: Inputs, home: str) -> None:
    """Empty files and folders where a secret would be; each is watched (`Accounting`)."""
    count = 0
    for name in SECRET_HOME if home != "/" else ():
        shown = os.path.join(home, name)
        if any(_under(shown, p) or _under(p, shown) for p in inputs.engine_home) or not os.path.lexists(shown):
            continue
        host = _private_host(shown, view.mounts)  # None: granted, or shown by something the user chose
        if host is None or count >= MAX_STANDINS:
            continue
        if os.path.isdir(shown) and not os.path.islink(shown):
            host.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:  # its files, one level (sockets get decoys: `_decoys`)
                names = sorted(e.name for e in os.scandir(shown) if e.is_file(follow_symlinks=False))
            except OSError:
                names = []
            for name in names[:MAX_STANDINS_PER_FOLDER]:
                _empty_file(host / name, inputs.private)
            count += len(names)
            view.stand_in(host, shown, folder=True)
        else:
            host.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            _empty_file(host, inputs.private)
            count += 1
            view.stand_in(host, shown, folder=False)
    secrets = [p for p in SECRET_SYSTEM if os.path.exists(p)]
    for folder, pattern in SECRET_SYSTEM_GLOBS:
        try:
            secrets += sorted(e.path for e in os.scandir(folder) if pattern.match(e.name))
        except OSError:
            pass
    for n, path in enumerate(secrets):
        if not _shown_by_bind(path, view.mounts):
            continue
        spare = inputs.private.spare / f"standin-{n}"
        if os.path.isdir(path):
            spare.mkdir(exist_ok=True, mode=0o700)
        else:
            _empty_file(spare, inputs.private)
        view.mounts.append(Mount(RO, path, str(spare)))
        view.stand_in(spare, path, folder=os.path.isdir(path))


def _empty_file(path: Path, private: Private | None = None) -> None:
    """An empty 0600 file at `path`: a hard link of the attempt's one empty file when there is
    one (cheaper than a new inode, and the folder's watch tells the names apart)."""
    if private is not None:
        try:
            os.link(private.empty_file, path)
            return
        except FileExistsError:
            return
        except OSError:
            pass
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))


def _decoys(view: View, inputs: Inputs, home: str, runtime: str | None) -> None:
    """A listening socket where each host socket the job may know of would be: in the private
    folder that shows its place, else bound there (over the real one, where a shown folder holds it)."""
    candidates = []
    for name, value in inputs.env.items():
        if name in SOCKET_VARIABLES or "/" in value:
            candidates += socket_paths(value)
    if home != "/":
        candidates += [os.path.join(home, p) for p in KNOWN_SOCKETS_HOME]
        candidates += _entries(os.path.join(home, ".ssh")) + _entries(os.path.join(home, ".gnupg"))
    candidates += list(KNOWN_SOCKETS)
    if runtime:
        candidates += [os.path.join(runtime, p) for p in KNOWN_SOCKETS_RUNTIME] + _entries(runtime)
    candidates += _entries(inputs.common_dir)
    granted = {os.path.normpath(p) for p in inputs.sockets}
    for shown in dict.fromkeys(os.path.normpath(p) for p in candidates):
        if len(view.decoys) >= MAX_DECOYS:
            return
        if shown in granted or os.path.realpath(shown) in granted or not _is_socket(shown):
            continue
        above = _nearest(shown, view.mounts)
        if above is not None and (above.kind == LINK or above.target == inputs.worktree):
            continue  # a link's target is a candidate of its own; the worktree is the job's
        host = _private_host(shown, view.mounts)
        if host is None:
            host = inputs.private.spare / f"decoy-{len(view.decoys)}"
            view.mounts.append(Mount(RO, shown, str(host)))
        else:
            host.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        view.decoys.append(Decoy(shown, str(host)))


def _entries(folder: str) -> list[str]:
    try:
        return [e.path for e in os.scandir(folder)]
    except OSError:
        return []


# -- building it, in the child between fork and exec ------------------------------------------------

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 1 << 18
_MNT_DETACH = 2
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_MOUNT_ATTR_RDONLY = 1
_AF_UNIX, _SOCK_STREAM, _SOCK_NONBLOCK, _SOCK_CLOEXEC = 1, 1, 0o4000, 0o2000000
_O_WRONLY, _O_CREAT, _O_APPEND, _O_CLOEXEC, _O_RDONLY = 0o1, 0o100, 0o2000, 0o2000000, 0


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class _SockaddrUn(ctypes.Structure):
    _fields_ = [("sun_family", ctypes.c_ushort), ("sun_path", ctypes.c_char * 108)]


class _PollFd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


class Build:
    """The calls that build one view, prepared in the parent (`prepare`); `build()` runs them in
    the child after its namespaces are made; `account()` runs in pid 1's parent."""

    def __init__(self, view: View) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        self._libc = libc
        self._errno = ctypes.get_errno
        self._write, self._exit = os.write, os._exit
        self._root = os.fsencode(view.root)
        self._steps: list[tuple] = []
        for mount in view.mounts:
            target = self._root + os.fsencode(mount.target)
            parents = []
            parent = os.path.dirname(mount.target)
            while parent not in ("/", ""):
                parents.append(self._root + os.fsencode(parent))
                parent = os.path.dirname(parent)
            parents.reverse()
            source = os.fsencode(mount.source)
            is_dir = mount.kind != LINK and (os.path.isdir(mount.source) or mount.kind == RW and not
                                             os.path.exists(mount.source))
            self._steps.append((mount.kind, target, source, parents, is_dir))
        self._decoys = []
        for n, decoy in enumerate(view.decoys):
            folder, name = os.path.split(decoy.host)
            address = _SockaddrUn(_AF_UNIX, os.fsencode(name)[:107])
            line = (json.dumps({"connect": decoy.shown}) + "\n").encode()
            self._decoys.append((os.fsencode(folder), os.fsencode(name), address, line, n))
            # a decoy bound elsewhere must exist before its bind: the mount below waits for it
        self._observed = os.fsencode(view.observed)
        self._setattr_nr = ctypes.c_long(syscall_number("mount_setattr") or -1)
        self._pivot_nr = ctypes.c_long(syscall_number("pivot_root") or -1)
        self._pidfd_nr = ctypes.c_long(syscall_number("pidfd_open") or -1)
        self._read_only = _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0)
        self._attr_size = ctypes.c_size_t(ctypes.sizeof(_MountAttr))
        self._cwd = ctypes.create_string_buffer(4096)
        libc.getcwd.restype = ctypes.c_void_p
        self._polls = (_PollFd * (len(self._decoys) + 1))()
        self._status = ctypes.c_int(0)
        self._obs_fd = -1
        self._stat_buf = ctypes.create_string_buffer(256)

    def fail(self, what: bytes, errno: int | None = None) -> None:
        self._write(2, b"git-subtask: could not build the job's view (" + what + b": errno %d); "
                    b"it was not started\n" % (self._errno() if errno is None else errno))
        self._exit(126)

    def build(self) -> None:
        """Make the decoys, mount the view on its root, move into it (pivot_root)."""
        libc, root = self._libc, self._root
        if not libc.getcwd(self._cwd, len(self._cwd)):
            self.fail(b"working directory")
        self._obs_fd = libc.open(self._observed, _O_WRONLY | _O_CREAT | _O_APPEND | _O_CLOEXEC, 0o600)
        for n, (folder, name, address, _line, _i) in enumerate(self._decoys):
            fd = libc.socket(_AF_UNIX, _SOCK_STREAM | _SOCK_NONBLOCK | _SOCK_CLOEXEC, 0)
            if fd < 0 or libc.chdir(folder) != 0:
                self.fail(b"decoy " + folder + b"/" + name)
            libc.unlink(name)
            if libc.bind(fd, ctypes.byref(address), ctypes.sizeof(address)) != 0 or libc.listen(fd, 64) != 0:
                self.fail(b"decoy " + folder + b"/" + name)
            self._polls[n + 1].fd, self._polls[n + 1].events = fd, 1  # POLLIN
        if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
            self.fail(b"private mounts")
        if libc.mount(b"tmpfs", root, b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755") != 0:
            self.fail(b"root " + root)
        for kind, target, source, parents, is_dir in self._steps:
            for parent in parents:
                libc.mkdir(parent, 0o755)  # there already, or inside a shown folder: the mount says
            if kind == LINK:
                if libc.symlink(source, target) != 0:
                    self.fail(b"link " + target)
                continue
            if kind == OPTIONAL and libc.access(source, 0) != 0:
                continue
            if is_dir:
                libc.mkdir(target, 0o755)
            else:
                fd = libc.open(target, _O_WRONLY | _O_CREAT | _O_CLOEXEC, 0o600)
                if fd >= 0:
                    libc.close(fd)
            if libc.mount(source, target, None, _MS_BIND | _MS_REC, None) != 0:
                self.fail(b"bind " + source + b" at " + target[len(root):])
            if kind != RW and libc.syscall(self._setattr_nr, _AT_FDCWD, target, _AT_RECURSIVE,
                                           ctypes.byref(self._read_only), self._attr_size) != 0:
                self.fail(b"read-only " + target[len(root):])
        if libc.chdir(root) != 0 or libc.syscall(self._pivot_nr, b".", b".") != 0:
            self.fail(b"pivot_root")
        if libc.umount2(b".", _MNT_DETACH) != 0 or libc.chdir(b"/") != 0:
            self.fail(b"the host's root")
        if libc.syscall(self._setattr_nr, _AT_FDCWD, b"/", 0, ctypes.byref(self._read_only), self._attr_size) != 0:
            self.fail(b"read-only root")
        if libc.chdir(self._cwd) != 0:
            self.fail(b"working directory " + self._cwd.value + b" is not in the view")

    def fds(self) -> list[int]:
        """The fds pid 1's parent keeps: the accounting file and the decoys."""
        return [self._obs_fd] + [self._polls[n].fd for n in range(1, len(self._polls))]

    def in_pid1(self) -> None:
        """In the view's pid 1: a fresh /proc of its own pid namespace; our fds closed."""
        libc = self._libc
        for n in range(1, len(self._polls)):
            libc.close(self._polls[n].fd)
        if self._obs_fd >= 0:
            libc.close(self._obs_fd)
        if libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) != 0:
            errno = self._errno()
            self.fail(b"/proc" if libc.access(b"/proc", 0) == 0 else b"/proc, not in the view", errno)

    def account(self, pid: int) -> None:
        """In pid 1's parent, while pid 1 lives: answer every decoy's caller by hanging up, and
        write down that it called (at most `MAX_OBSERVED` lines a run)."""
        libc, polls = self._libc, self._polls
        if not self._decoys or self._obs_fd < 0:
            return
        pidfd = libc.syscall(self._pidfd_nr, ctypes.c_long(pid), ctypes.c_long(0))
        if pidfd < 0:
            return
        polls[0].fd, polls[0].events = pidfd, 1
        lines = [d[3] for d in self._decoys]
        written, count = 0, len(polls)
        while True:
            if libc.poll(polls, count, -1) < 0:
                continue
            if polls[0].revents:
                break
            for n in range(1, count):
                if not polls[n].revents:
                    continue
                conn = libc.accept4(polls[n].fd, None, None, _SOCK_CLOEXEC)
                if conn >= 0:
                    libc.close(conn)
                    if written < MAX_OBSERVED:
                        self._write(self._obs_fd, lines[n - 1])
                        written += 1
        libc.close(pidfd)


# -- the accounting, read by the worker --------------------------------------------------------------

_IN_OPEN, _IN_NONBLOCK, _IN_CLOEXEC = 0x20, 0o4000, 0o2000000
_EVENT = struct.Struct("iIII")


_inotify = -1  # one per process: closing one costs the kernel a grace period (~10 ms); watches are cheap


def _watcher() -> int:
    global _inotify
    if _inotify < 0:
        libc = ctypes.CDLL(None, use_errno=True)
        _inotify = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    return _inotify


class Accounting:
    """What the view kept out, as the kernel saw it: the decoys' file, and inotify on the stand-ins."""

    def __init__(self, view: View | None) -> None:
        self.view = view
        self.fd = -1
        self._watches: dict[int, tuple[str, tuple[str, ...] | None]] = {}
        self.seen: list[str] = []
        self._offset = 0
        if view is None or not view.standins:
            return
        self.fd = _watcher()
        if self.fd < 0:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        for host, shown, names in view.standins:
            wd = libc.inotify_add_watch(self.fd, os.fsencode(host), _IN_OPEN)
            if wd < 0:
                continue
            kept = self._watches.get(wd)
            if kept is not None and kept[1] is not None and names is not None:
                names = kept[1] + names  # files of one folder: one watch
            self._watches[wd] = (shown, names)

    def _events(self) -> list[str]:
        found = []
        while self.fd >= 0:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                break
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                name = os.fsdecode(data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0"))
                offset += _EVENT.size + length
                watch = self._watches.get(wd)
                if watch is None or not mask & _IN_OPEN:
                    continue
                shown, names = watch
                if names is None or name in names:
                    found.append(os.path.join(shown, name) if name else shown)
        return found

    def collect(self) -> list[str]:
        """What was refused since the last call (also kept in `seen`), in words."""
        new = [f"open {path} (a secret not in the view: an empty stand-in was read)" for path in self._events()]
        if self.view is not None and self.view.observed:
            try:
                with open(self.view.observed, "rb") as fh:
                    fh.seek(self._offset)
                    data = fh.read(1 << 20)
                    self._offset += len(data)
            except OSError:
                data = b""
            for raw in data.splitlines():
                try:
                    item = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(item, dict) and isinstance(item.get("connect"), str):
                    new.append(f"connect {item['connect']} (a host socket not in the view: a decoy hung up)")
        for line in new:
            if line not in self.seen and len(self.seen) < MAX_OBSERVED:
                self.seen.append(line)
        return new

    def close(self) -> None:
        """Stop watching (the process's inotify stays for the next attempt); what is queued for
        these watches is read and dropped."""
        if self.fd >= 0:
            self._events()
            libc = ctypes.CDLL(None, use_errno=True)
            for wd in self._watches:
                libc.inotify_rm_watch(self.fd, wd)
            self._watches = {}
            self.fd = -1
