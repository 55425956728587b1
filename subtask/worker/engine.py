"""The engine step: the record says the engine starts, then the job's engine runs in the
attempt's confinement, watched for stalls, with its events to the events file; it ends with
nothing of the job left running (`run_engine_confined`).

Invariants:
- The engine gets the task as written (`privatetext`), while the record only ever holds it
  redacted; that private copy goes when the attempt ends (`finish.finish_attempt`).
- Never start the engine before the main worktree's "before" status has ended, because a status
  still running into the engine's first writes sees them before as well as after, and the change
  goes unseen: the worker joins it after `record_engine_started` (it runs beside the checkout, so
  this costs nothing but on a tiny repository).
- An engine counts as started (and may be charged) once `on_pid`/`on_launch` reports a process.
- Never import pygit2 in a worker, because its import (~50 ms of CPU) was most of a short job's
  end and came before a judged job's engine (its harness), and a preload on a thread shared the
  GIL with the engine's start and held every fork: the worker's git (the harness, the checks'
  diff, the autocommit, the evidence, the record, the note) is git's processes and objects written
  in this process (`tests/test_worker_git.py`, with pygit2 unimportable;
  `tests/test_imports.py::test_a_plain_jobs_worker_imports_nothing_it_does_not_use`). A worker
  the MCP server's zygote forks has it loaded already, and `Repo.objects` then asks it in-process.
- A crash in the engine's own code is the attempt failed (kind `engine`), never a dead worker;
  a stop is `StopRequested`.
- Nothing of the job runs when the step returns (`Confinement.end_leftovers`): the worker's git
  then reads what the job wrote.
"""

from __future__ import annotations

import functools
import signal
from pathlib import Path

from subtask.engines import get_engine, settings_reader
from subtask.engines.base import EngineContext, Outcome
from subtask.git.gitrepo import Repo
from subtask.git.records import Job
from subtask.model import claims, faults, phases
from subtask.model.dataclass import dataclass
from subtask.ops.running import lifecycle
from subtask.ops.running.stall import StallWatch
from subtask.ops.running.stall import action_of as stall_action
from subtask.proc import isolation
from subtask.state import paths, privatetext
from subtask.worker.charge import resume_point
from subtask.worker.confinement import Confinement, engine_env
from subtask.worker.events import EventSink
from subtask.worker.evidence import current_head
from subtask.worker.progress import mark_engine_started
from subtask.worker.stop import StopRequested


def run_engine(repo: Repo, job: Job, worktree: Path, sink, env: dict | None = None) -> Outcome:
    attempt = job.state.current
    session, baseline, _ = resume_point(job)
    engine = get_engine(job.spec.engine, repo.config)
    launched: list[int] = []  # a process of the engine started: from here it may have spent

    def on_pid(pid: int) -> None:
        launched.append(pid)
        lifecycle.record_engine(repo.state_dir, job.id, pid)

    ctx = EngineContext(
        job_id=job.id, attempt=attempt.n, task=privatetext.message(repo.state_dir, job.id, attempt),
        worktree=worktree, repo_root=repo.root,
        git_common_dir=repo.common_dir, env=env if env is not None else engine_env(job, repo.state_dir), emit=sink,
        session_id=session, baseline=baseline, model=job.spec.model,
        max_usd=attempt.max_usd if attempt.max_usd is not None else job.spec.max_usd,
        max_turns=job.spec.max_turns, readonly=job.spec.readonly,
        timeout=attempt.timeout if attempt.timeout is not None else job.spec.timeout,
        config=settings_reader(engine, repo.config),
        on_pid=on_pid,
        on_launch=launched.append,
        private_dir=Path(paths.run_dir(repo.state_dir)),
        write_task_file=functools.partial(privatetext.task_file, repo.state_dir, job.id, attempt.n),
    )
    try:
        outcome = engine.run(ctx)
    except StopRequested:
        raise
    except Exception as exc:
        import traceback  # a crash's only

        traceback.print_exc()
        outcome = Outcome(False, error_kind="engine", error=f"the {job.spec.engine} engine crashed: {exc}")
    outcome.launched = bool(launched)
    return outcome


def _seen_by(watch: claims.Watch, sink):
    """The engine's sink: each event is seen by `watch` (the order of edits and test runs), then goes on."""
    def see(event: dict) -> None:
        watch.see(event)
        sink(event)

    return see


@dataclass
class EngineRun:
    """What the engine step leaves to the steps after it."""

    job: Job  # as recorded with the engine's start
    outcome: Outcome
    stopped: bool
    started_from: str  # the head before the engine
    watch: claims.Watch  # the order of the engine's edits and test runs
    stall: StallWatch


def run_engine_confined(repo: Repo, job: Job, worktree: Path, sink: EventSink,
                        confinement: Confinement) -> EngineRun | None:
    """Record that the engine starts, run it under `confinement` and the stall watch, and end what
    it left running; None when the attempt ended before (stopped meanwhile)."""
    state_dir = repo.state_dir
    job_id, attempt_n = job.id, job.state.current.n
    started = mark_engine_started(repo, job_id, attempt_n, job.state.current.started_at)
    if started is None:
        return None
    job = started
    # The main worktree as it was before the engine, whole: a status still running into the
    # engine's first writes would see them "before" as well, and their change would go unseen.
    confinement.before.lines()
    phases.mark("record_engine_started")
    if confinement.policy.mode != "none":
        sink({"type": "isolation", "mode": confinement.policy.mode,
              "writable": [g.to_dict()["path"] for g in confinement.policy.grants]})
    started_from = current_head(repo, job)  # an attempt that leaves it here changed nothing
    watch = claims.Watch()  # the order of the engine's edits and test runs, for its claims
    stopped = False
    stall = StallWatch(repo, job_id, attempt_n, sink, after=repo.config.number("stallAfter"),
                       action=stall_action(repo), grace=repo.config.number("stopGrace"))
    try:
        with isolation.confined(confinement.sandbox), stall:
            outcome = run_engine(repo, job, worktree, stall.emitter(_seen_by(watch, confinement.watch)),
                                 confinement.engine_env)
    except StopRequested:
        stopped = True
        outcome = Outcome(False, error_kind="stopped", error="stopped by request")
    finally:
        confinement.end_leftovers()  # nothing of the job runs while our git reads what it wrote
        sink.flush()  # the output's tail, before the record takes its events tail
    phases.mark("engine")
    faults.point("after_engine")
    stopped = stopped or stall.stopped or lifecycle.stop_asked(state_dir, job_id)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the rest is quick bookkeeping; let it finish
    if stopped or not outcome.ok or not job.spec.verify:
        confinement.look_after()  # nothing confined runs any more
    return EngineRun(job, outcome, stopped, started_from, watch, stall)
