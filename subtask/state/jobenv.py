"""The environment a job runs with: the one of the command that started it, whoever runs it.

A queued job is often run by a process its starter never saw: the worker of the job that frees
the slot (in-process, for the same repository), a worker that worker spawns for another
repository, or a worker forked by the MCP server's zygote. Each of those has its own environment
(another job's `AWS_PROFILE`, another shell's `PATH`). So `start` and `reply` keep the starter's
environment in `<state>/run/<id>.env.json`, and the worker adopts it as its whole `os.environ`
before it runs the job: the engine, setup, verify and the worker's own git calls all see it.

Invariants:
- Never in git and never readable by others: the file may hold secrets (API keys, tokens); it is
  written atomically, 0600, in the 0700 state directory.
- One file per job, for its current attempt: written right after the admission saved the slot
  entry, while the starter still holds the run-lock (so no one can be handed the job before the
  file exists, and a crash from there on is settled by someone who drops it); removed when the
  attempt ends (by the worker before it lets go of the run-lock, or by whoever ends an attempt no
  worker will finish), so a later reply writes its own.
- A job without a file (written by an older version) runs with the environment of whoever runs
  it, as before.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from subtask.state import paths
from subtask.state.statefiles import write_json

# Per-process plumbing, never part of a job's environment: the run-lock fd a worker is handed, and
# the run mark of the attempt whose engine the starter runs in (`procs.RUN_MARKER_ENV`: a nested
# `start`): the worker gives each attempt's processes their own, and one of the parent's would have
# this job's setup, verify and git calls ended with the parent's leftovers.
_NOT_KEPT = ("SUBTASK_LOCK_FD", "SUBTASK_RUN")


def env_file(state_dir: Path, job_id: str) -> Path:
    return paths.run_file(state_dir, job_id, "env.json")


def save(state_dir: Path, job_id: str, environ: Mapping[str, str] | None = None) -> None:
    """Keep the starter's environment (default: this process's) for the worker that runs the job."""
    env = {k: v for k, v in (os.environ if environ is None else environ).items() if k not in _NOT_KEPT}
    write_json(env_file(state_dir, job_id), {"v": 1, "env": env})


def load(state_dir: Path, job_id: str) -> dict[str, str] | None:
    """The kept environment, or None when there is none (or it is damaged: warned)."""
    path = env_file(state_dir, job_id)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        print(f"git-subtask: {path} is damaged ({exc}); {job_id} runs with the worker's environment",
              file=sys.stderr)
        return None
    env = data.get("env") if isinstance(data, dict) and data.get("v") == 1 else None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return None
    return env


def adopt(state_dir: Path, job_id: str) -> bool:
    """Make the job's kept environment this process's whole environment. False if none was kept."""
    env = load(state_dir, job_id)
    if env is None:
        return False
    os.environ.clear()
    os.environ.update(env)
    return True


def drop(state_dir: Path, job_id: str) -> None:
    env_file(state_dir, job_id).unlink(missing_ok=True)
