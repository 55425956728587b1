"""The environment a job runs with: the one of the command that started it, whoever runs it.

A queued job is often run by a process its starter never saw: the worker of the job that frees
the slot (in-process, for the same repository), a worker that worker spawns for another
repository, or a worker forked by the MCP server's zygote. Each of those has its own environment
(another job's `AWS_PROFILE`, another shell's `PATH`). So `start` and `reply` keep the starter's
environment in `<state>/run/<id>.env.json`, and the worker adopts it as its whole `os.environ`
before it runs the job: the engine, setup, verify and the worker's own git calls all see it.

The rest of what a process inherits is kept beside it (`Context`): the nice value, the resource
limits, the umask and the namespaces (by inode) of the command that started the job, applied to
the job's processes by `proc/context` (issue 40): whoever hands it a slot does not lend it theirs.
With them, the starter's lineage (itself and its ancestors, each by pid and start time): the only
processes a namespace is ever taken from, because the kernel gives a torn-down namespace's
number to the next one made (another job's sandbox, at once).

Invariants:
- Never put a job's environment in git or leave it readable by others, because it holds secrets:
  0600 in the state directory, removed when the attempt ends (by the worker before it lets go of
  the run-lock, or by `end_attempt`).
- One file per job, for its current attempt: written right after the admission saved the slot
  entry, while the starter still holds the run-lock (so no one can be handed the job before the
  file exists, and a crash from there on is cleaned up by whoever ends it, who drops it); removed when the
  attempt ends (by the worker before it lets go of the run-lock, or by whoever ends an attempt no
  worker will finish), so a later reply writes its own.
- A job without a file (written by an older version) runs with the environment of whoever runs
  it, as before; a file without a context, with the context of whoever runs it.
- Never run a job with the environment of whoever hands it its slot, because that is another
  job's (`AWS_PROFILE=prod` for a job started with `dev`): `start`/`reply` keep the starter's
  environment in `run/<id>.env.json` once admitted (still holding the job's run-lock, so before
  anyone can be handed it), and the worker adopts it as its whole
  `os.environ` before it runs the job, on every path (in-process hand-off, exec, fork, zygote).
- Never keep a job's private files (`run/<id>.env.json`, `run/<id>.<n>.private.json`) before its
  slot entry is saved, because a crash before that point leaves nothing that would drop them;
  from then on whoever ends the attempt drops both (test:
  `queue_money::test_a_crash_at_any_step_leaves_no_kept_environment`).
"""

from __future__ import annotations

import json
import os
import resource
import sys
from collections.abc import Mapping

from subtask.model.dataclass import dataclass, field
from subtask.state import paths
from subtask.state.statefiles import read_bytes, remove_file, write_json

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any

    from subtask.state.statefiles import StrPath

# Per-process plumbing, never part of a job's environment: the run-lock fd a worker is handed, and
# the run mark of the attempt whose engine the starter runs in (`procs.RUN_MARKER_ENV`: a nested
# `start`): the worker gives each attempt's processes their own, and one of the parent's would have
# this job's setup, verify and git calls ended with the parent's leftovers.
_NOT_KEPT = ("SUBTASK_LOCK_FD", "SUBTASK_RUN")


# Every limit `ulimit -a` shows that this platform's `resource` names.
RLIMITS = tuple(name for name in ("RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE",
                                  "RLIMIT_LOCKS", "RLIMIT_MEMLOCK", "RLIMIT_MSGQUEUE", "RLIMIT_NICE",
                                  "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_RSS", "RLIMIT_RTPRIO",
                                  "RLIMIT_RTTIME", "RLIMIT_SIGPENDING", "RLIMIT_STACK")
                if hasattr(resource, name))
NAMESPACES = ("user", "mnt", "pid", "net", "uts", "ipc", "cgroup", "time")
# How many of the starter's ancestors may hold its namespaces for it: a shell in a container, the
# agent that runs it, the terminal's; a namespace none of them is left in is gone for the job.
LINEAGE_DEPTH = 8


@dataclass(frozen=True)
class Context:
    """What a process inherits besides its environment, as its starter had it."""

    nice: int
    umask: int
    rlimits: dict[str, tuple[int, int]] = field(default_factory=dict)  # RLIMIT_X -> (soft, hard)
    namespaces: dict[str, int] = field(default_factory=dict)  # kind -> inode of /proc/self/ns/<kind>
    # The starter and its ancestors, (pid, start time in clock ticks): who may still hold its namespaces.
    lineage: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def capture(cls) -> Context:
        """This process's (a few syscalls and reads of /proc: no process is started)."""
        mask = os.umask(0o022)
        os.umask(mask)
        rlimits = {name: resource.getrlimit(getattr(resource, name)) for name in RLIMITS}
        return cls(os.getpriority(os.PRIO_PROCESS, 0), mask, rlimits, own_namespaces(), _lineage())

    def to_json(self) -> dict[str, Any]:
        return {"nice": self.nice, "umask": self.umask, "rlimits": {k: list(v) for k, v in self.rlimits.items()},
                "namespaces": self.namespaces, "lineage": [list(each) for each in self.lineage]}

    @classmethod
    def from_json(cls, data: Any) -> Context | None:  # read from a file: anything
        """The kept context, or None when it is missing or damaged (the worker's own then applies).
        One kept without a lineage (an older version's) has no process left to take a namespace from."""
        try:
            rlimits = {str(k): (int(v[0]), int(v[1])) for k, v in data["rlimits"].items()}
            spaces = {str(k): int(v) for k, v in data["namespaces"].items()}
            lineage = [(int(pid), int(started)) for pid, started in data.get("lineage", [])]
            return cls(int(data["nice"]), int(data["umask"]), rlimits, spaces, lineage)
        except (TypeError, KeyError, ValueError, IndexError, AttributeError):
            return None


def own_namespaces() -> dict[str, int]:
    """This process's namespaces: kind -> inode."""
    spaces = {}
    for kind in NAMESPACES:
        try:
            spaces[kind] = os.stat(f"/proc/self/ns/{kind}").st_ino
        except OSError:
            pass  # not on this kernel (time: 5.6+), or no /proc
    return spaces


def process_identity(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, or None: a pid is reused, a pid
    with its start time never is."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()  # the name before it may hold anything
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _lineage() -> list[tuple[int, int]]:
    lineage: list[tuple[int, int]] = []
    pid = os.getpid()
    while pid > 1 and len(lineage) < LINEAGE_DEPTH:
        identity = process_identity(pid)
        if identity is None:
            break
        lineage.append((pid, identity[1]))
        pid = identity[0]
    return lineage


def env_file(state_dir: StrPath, job_id: str) -> str:
    return paths.run_file(state_dir, job_id, "env.json")


def save(state_dir: StrPath, job_id: str, environ: Mapping[str, str] | None = None,
         context: Context | None = None) -> None:
    """Keep the starter's environment and context (default: this process's) for the worker that
    runs the job."""
    env = {k: v for k, v in (os.environ if environ is None else environ).items() if k not in _NOT_KEPT}
    context = context if context is not None else Context.capture()
    write_json(env_file(state_dir, job_id), {"v": 1, "env": env, "context": context.to_json()})


def _read(state_dir: StrPath, job_id: str) -> dict[str, Any] | None:
    path = env_file(state_dir, job_id)
    try:
        data = json.loads(read_bytes(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        print(f"git-subtask: {path} is damaged ({exc}); {job_id} runs with the worker's environment",
              file=sys.stderr)
        return None
    return data if isinstance(data, dict) and data.get("v") == 1 else None


def load(state_dir: StrPath, job_id: str) -> dict[str, str] | None:
    """The kept environment, or None when there is none (or it is damaged: warned)."""
    data = _read(state_dir, job_id)
    env = data.get("env") if data is not None else None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return None
    return env


def load_context(state_dir: StrPath, job_id: str) -> Context | None:
    """The kept context of the job's starter, or None (none kept: the worker's own applies)."""
    data = _read(state_dir, job_id)
    return Context.from_json(data.get("context")) if data is not None else None


def adopt(state_dir: StrPath, job_id: str) -> bool:
    """Make the job's kept environment this process's whole environment, and its starter's umask
    this process's (the checkout's files get the modes they would have). False if none was kept."""
    data = _read(state_dir, job_id)
    env = data.get("env") if data is not None else None
    if data is None or not isinstance(env, dict) \
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return False
    os.environ.clear()
    os.environ.update(env)
    context = Context.from_json(data.get("context"))
    if context is not None:
        os.umask(context.umask)
    return True


def drop(state_dir: StrPath, job_id: str) -> None:
    remove_file(env_file(state_dir, job_id))
