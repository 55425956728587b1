"""Where a job runs, behind one registry as engines are: `local` (a detached worker on this
machine: api's admission and `proc/spawn`) and `ray` (a node of a Ray cluster: `executors/ray.py`
at home, `worker/remote.py` on the node). Data and rules only: a backend module is imported when
a job needs it, so every layer may ask here (`ops` does) without loading one.

`git config subtask.executor local|ray` (and `start --on`) picks it. A job run elsewhere says so in
its record: `spec.executor = {"kind": "ray", "address": ..., "remote": ..., "url": ...}` and, per
attempt, `attempt.ray_job` (the Ray submission id). Everything else about the job is the same.

An executor that runs jobs elsewhere (`Executor.backend` names its module) provides the
`Elsewhere` protocol: the core asks the registry, never compares executor names. What a job may
ask of its executor beyond one attempt (`--after`, `--retries`, `--best-of`, `map`, `reply`) is
the executor's `can`; everything else is refused at start with the executor named.

Standard library only until a backend is used: `api` asks here which executor a job uses before
anything heavy is imported (the CLI's hot path never imports Ray).
"""

from __future__ import annotations

import importlib

from subtask.model.dataclass import dataclass
from subtask.model.errors import SubtaskError
from subtask.model.job import JobLike, placement, ray_job_id, runs_remotely

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    import threading
    from typing import Any, Protocol

    from subtask.model.config import Config
else:
    Protocol = object  # the protocol below is documentation and a type, never a base at run time

FEATURES = {"after": "--after", "retries": "--retries", "best_of": "--best-of", "map": "map", "reply": "reply",
            "concurrency": "map --concurrency", "judge": "--judge"}


class Elsewhere(Protocol):
    """What an executor that runs jobs away from this machine does, at home. (`repo`, `job` and
    the Job returned are `git.gitrepo.Repo` and `git.records.Job`, layers above this one: Any.)"""

    def submit(self, repo: Any, job: Any, paid: bool) -> Any:
        """Check the job can run there, then branch, pin, record, reservation, hand-over; the Job."""

    def place(self, repo: Any, job: Any) -> None:
        """Check the job can run there and say so in its (not yet written) record: a job that
        waits (`--after`) is recorded placed, and handed over once it may start."""

    def hand_over(self, repo: Any, job: Any, paid: bool) -> None:
        """A placed job whose record says queued (a waiting job moved on, `ops/plans`): its
        reservation, its refs where the executor reads them, the hand-over. Raises, undone."""

    def reply(self, repo: Any, job: Any, attempt: Any, paid: bool) -> Any:
        """Attempt n+1 of a job that ran there, run there too; the Job. The caller holds the run-lock."""

    def watch(self, repo: Any, job_id: str, cancel: threading.Event) -> None:
        """Block (bounded) until the job may have ended there; `wait` calls it in a loop."""

    def stop(self, repo: Any, job_id: str) -> Any:
        """Ask it to stop the job there; the Job as recorded after."""

    def collect(self, repo: Any, job_id: str, *, advance: bool = True) -> bool:
        """Bring the job home once it ended there; True when its attempt is now ended here
        (`advance` False: the caller moves on the jobs that wait for it)."""

    def collect_active(self, repo: Any, entries: list[dict[str, Any]]) -> list[str]:
        """Bring home the listed active jobs it says ended; their ids."""

    def bring_home(self, repo: Any, job: Any) -> None:
        """A finished job whose final record a pull brought: its branch, reservation, note here."""


@dataclass(frozen=True)
class Executor:
    """One executor of the registry: where it runs jobs and what a job run by it may ask for."""

    name: str
    backend_module: str | None  # None: runs here (api's admission and spawn); else an `Elsewhere` module
    can: frozenset[str]  # the FEATURES a job run by it may ask for
    missing: tuple[tuple[str, str], ...] = ()  # (feature, why it cannot) for the FEATURES it lacks

    @property
    def runs_here(self) -> bool:
        return self.backend_module is None

    def backend(self) -> Elsewhere:
        if self.backend_module is None:
            raise SubtaskError("fatal", f"the {self.name} executor runs jobs here: it has no backend")
        return importlib.import_module(self.backend_module)

    def require(self, feature: str) -> None:
        """Refuse (exit 129) what this executor cannot do for a job, saying what is missing."""
        if feature not in self.can:
            why = dict(self.missing).get(feature, "it runs here only")
            raise SubtaskError("usage", f"{FEATURES[feature]} is not supported for a job on {self.name}: {why}",
                               hint=f"git subtask start --on local {FEATURES[feature]} ...")


REGISTRY: dict[str, Executor] = {
    "local": Executor("local", None, frozenset(FEATURES)),
    "ray": Executor("ray", "subtask.executors.ray", frozenset(FEATURES) - {"concurrency", "judge"}, (
        ("concurrency", "it bounds a map's jobs by this machine's slots, and a job on Ray holds none: the "
                        "cluster's subtask_slot resources bound how many run (a resource of the map's own: "
                        "git config subtask.ray.resources)"),
        ("judge", "a judge runs in each attempt's worktree, which is on the node that ran it, and only until "
                  "its results are pushed: pick by a rule (--pick smallest|cheapest|fastest, --first-pass)"))),
}
EXECUTORS = tuple(REGISTRY)


def choose(config: Config, flag: str | None) -> Executor:
    """The executor for a new job: `--on`, else `git config subtask.executor`, else local."""
    value = (flag or config.get("executor") or "local").strip().lower()
    if value not in REGISTRY:
        source = "--on" if flag else "git config subtask.executor"
        raise SubtaskError("usage" if flag else "fatal",
                           f"{source} is {value!r}; it must be {' or '.join(EXECUTORS)}",
                           hint="git config subtask.executor local")
    return REGISTRY[value]


def of(job: JobLike) -> Executor:
    """The executor a job's record says runs it (an unknown kind: refused, never run here)."""
    where = placement(job.spec)
    if where is None:
        return REGISTRY["local"]
    found = REGISTRY.get(where["kind"])  # (`placement`: a name)
    if found is None:
        raise SubtaskError("fatal", f"{job.spec.id} runs on {where.get('kind')!r}, an executor this "
                           "git-subtask does not know", hint="upgrade git-subtask")
    return found


def of_entry(entry: dict[str, Any]) -> Executor:
    """The executor of a `list` entry (its `on`; none: local)."""
    return REGISTRY.get(entry.get("on") or "local", REGISTRY["local"])


def elsewhere() -> list[Executor]:
    return [e for e in REGISTRY.values() if not e.runs_here]


__all__ = ["EXECUTORS", "Elsewhere", "Executor", "REGISTRY", "choose", "elsewhere", "of", "of_entry",
           "placement", "ray_job_id", "runs_remotely"]
