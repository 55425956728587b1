"""One attempt's confinement (`Confinement`, made by `confine`): the policy and its sandbox (its
view of the machine), its private temp folder, the environment its processes get (`engine_env`;
the job's namespace: its ports and names; its starter's context), what its view refused and
what its output claimed was refused, whether the main worktree changed while the job ran
(`MainWorktreeStatus`, before and after), and the teardown when the attempt ends.

Invariants:
- Each job runs in its starter's context (`starter_context`: nice value, limits, umask,
  namespaces), never in the worker's own; refused (a setup failure) when it cannot be given.
- Every job gets its own fresh 0700 temp folder, confined or not; it is moved aside when the
  attempt ends and removed after the run-lock goes (`remove_discarded`); a crash leaks at most
  one folder per job, until the next attempt of any job.
- The attempt's ports are given back once, whatever ended it (`close`).
- A confined job is not given host sockets or credentials (`withheld`), but its engine process
  its own credentials.
- Never take the main worktree's status "after" while anything of the job may still run, because
  a change verify makes would go unreported: it is started after verify when there is one, and
  right after the engine otherwise (beside the autocommit, which touches only the job's worktree).
  Never leave the files checkout or a background status running on any way out of an attempt
  (`FilesCheckout.finish`, `MainWorktreeStatus.lines` in `finally`/`close`).
- `close` ends what the job left running, runs the teardown and leaves no git process behind.
- The main worktree's status never writes the user's index: it goes through the private copy
  `git/index_copy.py` keeps, as that module's invariants say.
- Never take a refusal for the evidence from what a job printed, because a job prints anything:
  `evidence.isolation.refused` is what the view observed (decoys, stand-ins), output lines that read like
  refusals are `evidence.isolation.claimed`.
- Never run `subtask.teardown` outside the job's sandbox, because it is a command run on the job's
  files with the job's environment, like setup (`ports::test_teardown_runs_confined_*`).
- Never give an engine's private folder a shared `/tmp` name nor a place under `.git/`, because a
  killed worker must leak at most one folder per job, inside the repository's worktree folder:
  every engine's private folder (confined or not: part of its namespace, issue 34) is
  `<worktreeDir>/.tmp/<id>` (0700), removed after the attempt and replaced by the next one.
  Unconfined, it is `TMPDIR`; confined, it holds the view's private HOME, `/tmp` (`TMPDIR=/tmp`),
  runtime dir and `/dev/shm`. `CLAUDE_CODE_TMPDIR` follows `TMPDIR` (`isolation.temp_env`), because Claude
  Code reads it first: a person's own would send a confined job's Claude Code out of its sandbox,
  and its per-folder temp dirs (never removed) to a shared place. The suite holds the same for its
  own runs of the real CLI (`conftest.claude_code_temp`).
- Never run a command on a job's files outside its sandbox (`subtask.setup`, verify, the verify
  `merge` re-runs, a best-of judge), because the job chose those files: setup may be a script it
  rewrote on its branch (`containment::test_setup_runs_confined_*`,
  `groups::test_a_judge_runs_in_the_members_sandbox`).
- Never run an engine or verify less confined than `spec.isolation`, because the record would
  claim a sandbox that was not there: the ruleset is built before the engine starts (a policy that
  cannot be built ends the attempt, `isolation.IsolationError`, kind `isolation`), and a child whose
  `landlock_restrict_self` fails exits 126 before exec.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from subtask.engines import get_engine
from subtask.engines.base import ERROR_HINTS
from subtask.git import index_copy
from subtask.git.gitrepo import NO_HOOKS, Repo
from subtask.git.records import Job
from subtask.model import lazyre, phases
from subtask.model.errors import SubtaskError
from subtask.model.job import DEPTH_ENV, VerifyResult
from subtask.model.redact import redact
from subtask.ops.running import lifecycle
from subtask.proc import context, isolation, procs
from subtask.proc import view as views
from subtask.state import jobenv, ports, privatetext
from subtask.worker import retries
from subtask.worker.events import EventSink
from subtask.worker.progress import setup_failed

_REFUSED_RE = lazyre.compile(r"permission denied|operation not permitted|read-only file system|EACCES|EPERM|EROFS",
                         re.IGNORECASE)
MAX_REFUSED = 20  # claimed refusals kept per attempt


def looks_refused(text: str) -> bool:
    """An output line that reports a refused access (how a confined write fails)."""
    return bool(_REFUSED_RE.search(text or ""))


def confine(repo: Repo, job: Job, worktree: Path, admin: Path, sink: EventSink,
            main_before: MainWorktreeStatus) -> Confinement | None:
    """The attempt's confinement; None when it cannot be given, and the attempt ended here (failed:
    kind `setup` with no ports left to give it, `isolation` when its sandbox cannot be made)."""
    job_id, attempt_n = job.id, job.state.current.n
    try:
        confinement = Confinement(repo, job, worktree, admin, sink, main_before)
    except BaseException as exc:
        main_before.lines()  # no git process is left behind
        if isinstance(exc, SubtaskError):  # no ports to give it (`namespace_env`)
            setup_failed(repo, job_id, attempt_n, redact(exc.message))
            return None
        if not isinstance(exc, (isolation.IsolationError, OSError)):
            raise
        lifecycle.end_attempt(repo, job_id, attempt_n, "failed",
                              reason=redact(f"isolation {job.spec.isolation}: {exc}"), error_kind="isolation",
                              hint=ERROR_HINTS["isolation"], engine_may_have_spent=False)
        return None
    phases.mark("confinement")
    return confinement


class Confinement:
    """One attempt's isolation: the policy and its sandbox (its view of the machine, its private
    folders), the environment its processes get, what the view refused (observed) and what its
    output claimed was refused, and whether the main worktree changed while the job ran (`git
    status` before and after). Without ours, an engine's own sandbox (codex's) may refuse: what the
    commands it ran printed about refusals is listed as claims too."""

    def __init__(self, repo: Repo, job: Job, worktree: Path, admin: Path, sink: EventSink, before: MainWorktreeStatus):
        self.repo, self.job, self.sink = repo, job, sink
        self.before = before
        self.after: MainWorktreeStatus | None = None
        self.claimed: list[str] = []
        self.tmpdir = private_tmpdir(repo, job.id)  # every job's own, confined or not (its namespace)
        engine = get_engine(job.spec.engine, repo.config)
        confined = job.spec.isolation != "none"
        self.engine_sandbox = None if confined else isolation.own_sandbox(engine, job.spec.readonly)
        self.env = engine_env(job, repo.state_dir)
        if confined:
            self.env[isolation.ACTIVE_ENV] = job.spec.isolation

        self.env[procs.RUN_MARKER_ENV] = self.token = f"{job.id}.{job.state.current.n}.{os.getpid()}"
        self.worktree = worktree
        self.context = None
        try:
            self.context = starter_context(repo, job)
            self.env.update(namespace_env(repo, job))
            n = job.state.current.n
            # The admin folder the checkout made or checked, never the one the job's `.git` names.
            self.policy = isolation.build_policy(
                job.spec.isolation, worktree=worktree, admin=admin,
                common_dir=repo.common_dir, has_branch=bool(job.spec.branch),
                tmpdir=self.tmpdir, extra=isolation.configured_writable(repo.config, repo.root),
                engine_extra=isolation.engine_paths(engine, self.env) if confined else [],
                env=self.env, state_dir=repo.state_dir,
                readable=isolation.configured_paths(repo.config, repo.root, isolation.READABLE_KEY),
                engine_readable=isolation.engine_paths(engine, self.env, "readable") if confined else [],
                sockets=job.spec.sockets or [],
                optional=[str(privatetext.task_file_path(repo.state_dir, job.id, n)),
                          str(privatetext.verify_output_path(repo.state_dir, job.id, n))])
            isolation.plan_namespaces(self.policy, network=job.spec.network,
                                      asked=not job.spec.isolation_source.startswith("default"))
            self.sandbox = isolation.Sandbox(self.policy)
        except BaseException:
            release_namespace(repo, job)
            context.use(None)
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            raise
        temp = "/tmp" if self.policy.view is not None else self.tmpdir
        self.env.update(isolation.temp_env(temp))
        if self.policy.view is not None:
            self.env.update(git_identity(repo, self.env))
        # What a confined job is not given (host sockets, credentials), but for the engine process
        # its own credentials; granted by name with `subtask.isolation.env`.
        self.withheld = views.withheld(self.env, set(isolation.configured_names(repo.config))) if confined else []
        own = set(isolation.engine_credentials(engine, self.env)) if confined else set()
        self.engine_env = {k: v for k, v in self.env.items() if k not in self.withheld or k in own}
        self.env = {k: v for k, v in self.env.items() if k not in self.withheld}

    def watch(self, event: dict) -> None:
        """The engine's sink: every event goes on; an output line reading like a refused access is
        noted as what the job claims (it can print anything)."""
        self.sink(event)
        if self.policy.mode == "none" and not self.engine_sandbox:
            return
        if event.get("type") in ("output", "log") and self.policy.mode != "none":
            self.note_claim(str(event.get("text", "")))
        elif event.get("type") == "command" and isinstance(event.get("output"), str):
            for line in event["output"].splitlines():  # what an agent's command printed (codex)
                self.note_claim(line)

    def note_claim(self, text: str) -> None:
        if not looks_refused(text) or len(self.claimed) >= MAX_REFUSED:
            return
        line = redact(text.strip())[:300]
        self.claimed.append(line)
        self.sink({"type": "isolation", "mode": self.policy.mode, "claimed": line})

    def observe(self) -> None:
        """What the view refused during the last sandboxed run, as the kernel saw it: an event each."""
        for line in self.sandbox.accounting.collect():
            self.sink({"type": "isolation", "mode": self.policy.mode, "refused": redact(line)})

    def look_after(self) -> MainWorktreeStatus:
        """Take the main worktree's status once nothing confined runs any more (the engine, or
        verify), in the background: the autocommit and the evidence need not wait for it."""
        if self.after is None:
            self.after = MainWorktreeStatus(self.repo)
        return self.after

    def evidence(self, verify: VerifyResult | None) -> tuple[dict, dict]:
        if verify is not None and self.policy.mode != "none":
            for line in verify.output_tail.splitlines():
                self.note_claim(line)
        self.observe()
        after = self.look_after()
        changed = sorted(set(self.before.lines()) ^ set(after.lines()))
        main = {"changed": bool(changed), "paths": [entry[3:] for entry in changed][:50]}
        refused = [redact(line) for line in self.sandbox.accounting.seen]
        seen = {"source": self.job.spec.isolation_source, "refused": refused, "claimed": self.claimed,
                "env_withheld": self.withheld}
        if self.engine_sandbox:  # none of ours: the engine's own confined it
            seen["engine_sandbox"] = f"{self.job.spec.engine} {self.engine_sandbox}"
        return self.policy.to_dict() | seen, main

    def end_leftovers(self) -> None:
        """End what the last sandboxed run left running. In a pid namespace the kernel did it as
        its pid 1 exited; else they are orphans this worker (their subreaper) adopted. Then take
        what its view refused."""
        if not self.policy.plan.pid:
            procs.end_adopted(self.token)
        self.observe()

    def close(self) -> None:
        self.end_leftovers()
        try:
            run_teardown(self.repo, self.job, self.worktree, self)
        finally:
            release_namespace(self.repo, self.job)
            context.use(None)
            self.sandbox.close()
            for status in (self.before, self.after):
                if status is not None:
                    status.lines()  # no git process is left behind, whatever ended the attempt
            discard_private(self.tmpdir)


def engine_env(job: Job, state_dir: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SUBTASK_LOCK_FD"}
    env[DEPTH_ENV] = str(job.spec.depth + 1)
    env["SUBTASK_JOB_ID"] = job.id
    env["SUBTASK_WORKER_PID"] = str(os.getpid())  # a pid namespace hides it: $PPID is 0 there
    if job.spec.group:  # a best-of-N member: its task may tell the attempts apart
        env["SUBTASK_GROUP_ID"], env["SUBTASK_GROUP_MEMBER"] = job.spec.group, str(job.spec.member or 0)
    if state_dir is not None and job.state.current.retry:  # the verify loop: which retry, what verify said
        env.update(retries.env_for(state_dir, job))
    return env


def git_identity(repo: Repo, env: dict[str, str]) -> dict[str, str]:
    """The identity git commits with, for a job whose view holds no global git config (it may
    name credential helpers or URLs with tokens): `user.name`/`user.email` as git resolves them
    here, passed as the variables git reads first, unless the environment already sets them."""
    found: dict[str, str] = {}
    for key, names in (("user.name", ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME")),
                       ("user.email", ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"))):
        value = repo.config.git(key)
        if not value:
            continue
        for name in names:
            if name not in env:
                found[name] = value
    return found


def starter_context(repo: Repo, job: Job) -> context.Prepared:
    """The context of the job's starter (nice value, limits, umask, namespaces: `jobenv`), made
    the context of every child this worker starts for the attempt; refused when it cannot be
    given (a setup failure that names why), never replaced by this worker's own."""
    try:
        prepared = context.prepare(jobenv.load_context(repo.state_dir, job.id))
    except context.ContextError as exc:
        raise SubtaskError("fatal", f"cannot run as its starter ran: {exc}") from exc
    context.use(prepared)
    return prepared


TMP_FOLDER = ".tmp"  # under the worktree folder: beside the job worktrees, outside .git and /tmp


GONE = ".gone-"  # a private folder moved aside at its attempt's end, removed once nothing waits for it
_gone: list[Path] = []


def discard_private(folder: str) -> None:
    """Take the attempt's private folder away now (one rename: nothing of it is where it was), and
    remove it after the run-lock is released (`remove_discarded`): deleting its few dozen
    folders costs ~60 ms on a file system mounted with `discard`, which `wait` need not wait for."""
    path = Path(folder)
    aside = path.with_name(f"{GONE}{path.name}.{os.getpid()}")
    try:
        os.rename(path, aside)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        return
    _gone.append(aside)


def _alive(pid: str) -> bool:
    """Is the worker that moved a folder aside alive (it removes its own)? A reused pid keeps a
    dead one's folder until that process ends: garbage, never anyone's work."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (ValueError, OSError):
        return True
    return True


def remove_discarded() -> None:
    while _gone:
        shutil.rmtree(_gone.pop(), ignore_errors=True)


def private_tmpdir(repo: Repo, job_id: str) -> str:
    """A fresh 0700 temp dir for the job's engine (`<worktreeDir>/.tmp/<id>`). One a killed worker
    left behind is replaced here, and the folders killed workers had moved aside are removed, so
    a crash leaks at most one folder per job, in the repo, until the next attempt of any job."""
    path = repo.worktree_dir() / TMP_FOLDER / job_id
    shutil.rmtree(path, ignore_errors=True)
    try:
        for entry in os.scandir(path.parent):
            if entry.name.startswith(GONE) and not _alive(entry.name.rpartition(".")[2]):
                shutil.rmtree(entry.path, ignore_errors=True)
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.mkdir(mode=0o700)
    return str(path)


# ---------------------------------------------------------------- the job's namespace (issue 34)

def namespace_env(repo: Repo, job: Job) -> dict[str, str]:
    """What keeps parallel jobs apart at run time: its own ports (`ports.allocate`: the first of
    `subtask.portsPerJob` consecutive ports no other running job holds and nothing has bound),
    and its id as the name of whatever it starts (compose project, test database)."""
    count = repo.config.integer("portsPerJob")
    first = ports.allocate(repo.state_dir, job.id, job.state.current.n, repo.config.integer("portBase"), count)
    return {"SUBTASK_PORT": str(first), "SUBTASK_PORTS": str(count), "SUBTASK_NAMESPACE": job.id,
            "COMPOSE_PROJECT_NAME": job.id}


def release_namespace(repo: Repo, job: Job) -> None:
    """Give the attempt's ports back (once: a second release finds nothing)."""
    try:
        ports.release(repo.state_dir, job.id, job.state.current.n)
    except Exception as exc:  # ending a dead worker releases them otherwise
        print(f"git-subtask: could not release the ports of {job.id}: {exc}", file=sys.stderr)


TEARDOWN_TAIL_BYTES = 2048


def run_teardown(repo: Repo, job: Job, worktree: Path, confinement: Confinement) -> None:
    """Run `git config subtask.teardown` when the attempt ends (whatever ended it), in the job's
    sandbox with the job's environment (its ports and names), to stop what the job started
    outside its process tree (containers, databases). Its end is said in the events and the
    worker log; it changes nothing in the job's record."""
    command = repo.config.get("teardown")
    if not command or not command.strip() or not worktree.is_dir():
        return

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the attempt is ending: a stop must not cut it short
    try:
        with isolation.confined(confinement.sandbox):
            result = procs.run(["sh", "-c", command], cwd=worktree, env=confinement.env,
                               timeout=repo.config.number("setupTimeout"), tail_bytes=TEARDOWN_TAIL_BYTES, redact=True)
        confinement.end_leftovers()
    except Exception as exc:
        print(redact(f"git-subtask: {job.id}: teardown ({command}) could not run: {exc}"), file=sys.stderr)
        return
    ended = "timed out" if result.timed_out else f"exited {result.exit_code}"
    confinement.sink({"type": "teardown", "command": redact(command), "exit_code": result.exit_code,
                      "timed_out": result.timed_out})
    if result.exit_code != 0 or result.timed_out:
        output = (result.stdout_tail + "\n" + result.stderr_tail).strip()
        print(redact(f"git-subtask: {job.id}: teardown ({command}) {ended}" + (f": {output}" if output else "")),
              file=sys.stderr)


class MainWorktreeStatus:
    """`git status --porcelain` of the main worktree, never writing its index, run in the
    background from its start until `lines` is first asked (the worker's own work overlaps it).
    Lines, not -z: git quotes odd paths (control characters too), and a rename stays one entry.

    Through a private copy of the main index when there is one (`git/index_copy.py`), which git
    may refresh and keep; else with `--no-optional-locks`, which refreshes nothing: while the
    user's index has racily clean entries, every such status re-reads all of their files."""

    def __init__(self, repo: Repo):
        self._lines: list[str] | None = None
        options, env = index_copy.status_args(repo)
        self._proc = subprocess.Popen(["git", *NO_HOOKS, "-C", str(repo.root), *options, "status", "--porcelain"],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True, env=env)

    def lines(self) -> list[str]:
        if self._lines is None:
            out, _ = self._proc.communicate()
            self._lines = [line for line in out.splitlines() if line.strip()]
        return self._lines


