"""The verify step: the job's checks on its diff, then its verify command on that exact commit,
judged by the trusted harness of its base laid over the worktree (docs/verify.md "The judge",
`ops/landing/overlay.py`), in the job's confinement (`verify_work`); a failed check fails verify.

Invariants:
- Verify gets its command as written (`privatetext`), while the record only ever holds it
  redacted; its output is redacted before it is kept.
- Never ignore a stop while verify runs, because `stop` then SIGKILLed the worker and the
  attempt lost its evidence, head pin and note: a stop ends verify (its group is killed) and the
  attempt is recorded `stopped` with what the work is; a stopped attempt has no verdict on its work.
- A job that changed the harness is judged by the trusted one; its own tests run again, apart,
  and are recorded apart.
"""

from __future__ import annotations

import signal
from pathlib import Path

from subtask.engines.base import Outcome
from subtask.git import checks
from subtask.git.gitrepo import Repo, tree_of
from subtask.git.records import Job
from subtask.model import claims, faults, phases
from subtask.model.dataclass import dataclass
from subtask.model.job import VerifyResult, work_base
from subtask.model.redact import redact
from subtask.ops.landing import overlay, verified
from subtask.ops.running import lifecycle
from subtask.proc import isolation, procs
from subtask.state import privatetext
from subtask.worker.confinement import Confinement
from subtask.worker.events import EventSink
from subtask.worker.stop import StopRequested, on_sigterm

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from subtask.proc.procs import ProcResult

VERIFY_TAIL_BYTES = 4096


@dataclass
class Verdict:
    """What the verify step decided about the attempt."""

    outcome: Outcome  # judged: a failed check fails it
    state: str  # done, failed or stopped
    verify: VerifyResult | None
    found: list[dict] | None  # what the checks found


def verify_work(repo: Repo, job: Job, worktree: Path, sink: EventSink, confinement: Confinement,
                outcome: Outcome, stopped: bool, head: str) -> Verdict:
    """Run the checks and verify on `head`, unless the attempt was stopped or failed; judge it."""
    state_dir, job_id = repo.state_dir, job.id
    verify = found = None
    if not stopped and outcome.ok:
        found = run_checks(repo, job, head, sink)
        judged_by = None
        if job.spec.verify:
            judged_by = judge_of(repo, job, worktree, head, confinement.env)
            if (shadowing := judged_by.check()) is not None:
                found = [*(found or []), shadowing]
        sink({"type": "state", "state": "verifying", "command": job.spec.verify} if job.spec.verify else
             {"type": "state", "state": "finishing"})
        # A stop ends verify too (its group is killed), and the attempt still records what the
        # work is: evidence, head pin, note. Ignoring it here left `stop` to SIGKILL the worker.
        signal.signal(signal.SIGTERM, on_sigterm)
        try:
            with isolation.confined(confinement.sandbox):
                verify = run_verify(repo, job, worktree, head, confinement.env, judged_by, confinement.tmpdir)
        except StopRequested:
            stopped = True
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            confinement.end_leftovers()
        if lifecycle.stop_asked(state_dir, job_id):
            stopped, verify = True, None  # ended by the stop: no verdict on the work
        faults.point("after_verify")
    phases.mark("verify")
    outcome = judge(verify, found, outcome, job.spec.checks)
    state = "stopped" if stopped else ("done" if outcome.ok else "failed")
    return Verdict(outcome, state, verify, found)


def verify_command(repo: Repo, job: Job) -> str | None:
    """The verify command as written (the record holds it redacted); None for a job without one."""
    return privatetext.verify(repo.state_dir, job.id, job.state.current.n, job.spec.verify)


def judge_of(repo: Repo, job: Job, worktree: Path, head: str, env: dict) -> overlay.Judge:
    """What judges the attempt's verify: the job's base's harness over its worktree (docs/verify.md
    "The judge"), or its own tests (`--harness job`)."""
    return overlay.prepare(repo, asked=job.spec.harness, command=verify_command(repo, job), trusted=work_base(job),
                           source="base", worktree=worktree, head=head, kept=overlay.read_snapshot(repo, job.id),
                           env=env)


def run_verify(repo: Repo, job: Job, worktree: Path, head: str, env: dict, judge: overlay.Judge | None = None,
               tmpdir: str | None = None) -> VerifyResult | None:
    """Verify on the job's commit, judged by the trusted harness (`judge`); when the job changed
    that harness, run again on its tree as it wrote it: its own tests, recorded apart."""
    command = verify_command(repo, job)
    if not job.spec.verify or command is None:  # (None only for a job without a verify command)
        return None
    tree = tree_of(repo, head)
    if judge is None:
        judge = overlay.Judge("job")
    if judge.error:
        return VerifyResult(command=job.spec.verify, exit_code=None, seconds=0.0, head=head, tree=tree, passed=False,
                            output_tail=redact(f"not run: {judge.error}"), harness=judge.facts())
    with overlay.overlaid(repo, judge, worktree, overlay.stash_of(repo, job.id), tmpdir or worktree.parent) as extra:
        result = _verify_once(repo, job, command, worktree, {**env, **extra})
    # A timeout is reported as the limit it hit: the run also took the kill and the pipes' grace.
    seconds = min(result.seconds, job.spec.verify_timeout) if result.timed_out else result.seconds
    verify = VerifyResult(command=job.spec.verify, exit_code=result.exit_code, seconds=round(seconds, 3),
                          head=head, tree=tree, passed=(result.exit_code == 0 and not result.timed_out),
                          timed_out=result.timed_out, output_tail=_verify_output(result))
    own = None
    if judge.touched:
        mine = _verify_once(repo, job, command, worktree, env)
        counts = claims.test_counts(_verify_output(mine))
        own = {"passed": mine.exit_code == 0 and not mine.timed_out, "exit_code": mine.exit_code,
               "timed_out": mine.timed_out, "seconds": round(mine.seconds, 3),
               "tests": {"passed": counts.passed, "failed": counts.failed} if counts else None}
    verify.harness = judge.facts(own)
    # What it answers, so a landing of this very tree judged the same way runs nothing (verified.py).
    verify.key = verified.key_of(repo, tree=tree, command=job.spec.verify,
                                 trusted=None if judge.own else work_base(job), asked=job.spec.harness,
                                 confined=job.spec.isolation != "none", network=job.spec.network)
    return verify


def _verify_once(repo: Repo, job: Job, command: str, worktree: Path, env: dict) -> ProcResult:
    # recorded as the attempt's child group, as the engine was: a dead worker's reaper ends it too
    return procs.run(["sh", "-c", command], cwd=worktree, env=env, timeout=job.spec.verify_timeout,
                     tail_bytes=VERIFY_TAIL_BYTES, stdout_grace=2.0, redact=True,
                     on_start=lambda pid: lifecycle.record_engine(repo.state_dir, job.id, pid))


def _verify_output(result: ProcResult) -> str:
    output = result.stdout_tail + ("\n" if result.stdout_tail and result.stderr_tail else "") + result.stderr_tail
    return redact(output)[-VERIFY_TAIL_BYTES:]


def run_checks(repo: Repo, job: Job, head: str, sink) -> list[dict] | None:
    """The job's checks on its work (`work_base`..head), read from git objects (never git in its
    worktree); None for a job with none."""
    if not job.spec.checks or job.spec.readonly:
        return None
    sink({"type": "state", "state": "checking", "checks": job.spec.checks})
    return checks.run(repo, work_base(job), head, job.spec.checks)


def judge(verify: VerifyResult | None, found: list[dict] | None, outcome: Outcome,
          recorded: list[str] | None = None) -> Outcome:
    """A failed check fails verify, whatever it exited, and the attempt (kind `check`, its hint
    keeping the other checks, `recorded`: the job's); verify's test counts are read from its
    output."""
    failed = checks.failed(found)
    if verify is not None:
        counts = claims.test_counts(verify.output_tail)
        verify.tests = {"passed": counts.passed, "failed": counts.failed} if counts else None
        if failed:
            verify.checks_failed, verify.passed = failed, False
    if failed and outcome.ok:
        outcome.ok, outcome.error_kind, outcome.error = False, "check", redact(checks.failure_text(found))
        outcome.error_hint = redact(checks.retry_hint(found, recorded or []))
    return outcome
