"""The engine protocol: what the worker hands an engine, and what it gets back.

An engine runs one attempt of one job inside the job's worktree. It never touches records, notes,
slots or the ledger: the worker owns those. It reports what happened through `ctx.emit(event)`
(progress, observed commands) and returns an `Outcome` that keeps the engine's own words (summary,
claimed status, cost) apart from what the worker later observes in git.

Invariants:
- `run` never raises for a failure of the agent: it returns an Outcome with `error_kind` set.
  Exceptions are reserved for bugs; the worker turns them into `failed` with kind `engine`.
- Every child process runs in its own process group (`subtask.proc.procs.run`) so `stop` and timeouts
  can end the whole tree.
- Never pass a task to a child as one argv element the tool builds (`bash -c TASK`), because the
  kernel caps an element at 128 KiB and the task limit is 1 MiB: engines take it from
  `ctx.task_file()` (`privatetext`, 0600 in `run/`, gone with the attempt).
- Never run a subprocess in `start`'s engine check, because `start` must stay fast: engines answer
  `preflight()` from the environment and files; `probe()` (which runs `--version`) is for `engines`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from decimal import Decimal

from subtask.model import lazyre, money
from subtask.model.dataclass import dataclass, field
from subtask.words import SUMMARY_MAX_LINES

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any, Protocol
else:
    Protocol = object  # `Engine` is documentation and a type, never checked at run time

# Error kinds an engine may report, each with a hint that names a command that exists.
ERROR_HINTS: dict[str, str] = {
    "budget": "raise the budget: git subtask reply <id> --max-usd N '...' (or start again with --max-usd)",
    "max_turns": "continue where it stopped: git subtask reply <id> 'continue'",
    "auth": "log the engine in (for claude: claude /login, or set ANTHROPIC_API_KEY); check: git subtask engines",
    "usage_limit": "the plan's usage limit was reached; wait for it to reset, then: git subtask reply <id> 'continue'",
    "api_error": "the engine's service failed; try again: git subtask reply <id> 'continue'",
    "timeout": "give it more time: git subtask reply <id> --timeout SECONDS 'continue'",
    "exit": "read the log: git subtask show <id>",
    "not_installed": "install the engine, then check: git subtask engines",
    "engine": "read the worker log: git subtask show <id>",
    "setup": "fix the worktree setup (git config subtask.setup), then start again",
    "isolation": "check what this machine can enforce: git subtask doctor; or start again with --isolation none",
    "check": "see what the check found: git subtask show <id>; a change meant to do it starts "
             "again with that check alone dropped (--check none, then --check for each to keep), "
             "and with --harness job when it changes tests on purpose",
    "stopped": "",
}


@dataclass(frozen=True)
class Baseline:
    """What the engine reported for the session being resumed, at the end of the last attempt that
    reported anything: a resumed session counts on from there (Claude Code's cost, Codex's tokens
    are running totals), so an attempt's own share is its figure minus this one.

    A figure below its baseline cannot be a running total (the session was not resumed, or the
    engine reports per run): it is taken as the attempt's own, whole. A session resumed before
    any attempt recorded figures for it counts from zero (`start`): its running total is then
    the share of every attempt of it, the ones killed before they reported included."""

    session_id: str
    cost_usd: Decimal | None = None
    tokens: dict[str, int] | None = None

    @classmethod
    def from_totals(cls, totals: Any) -> Baseline | None:
        if not isinstance(totals, dict) or not isinstance(totals.get("session_id"), str):
            return None
        tokens = totals.get("tokens")
        return cls(totals["session_id"], money.money_or_none(totals.get("cost_usd")),
                   {k: int(v) for k, v in tokens.items() if _is_number(v)} if isinstance(tokens, dict) else None)

    @classmethod
    def start(cls, session_id: str) -> Baseline:
        """The baseline of a session no attempt recorded figures for: nothing yet."""
        return cls(session_id, money.ZERO, {})

    def of(self, session_id: str | None) -> Baseline | None:
        """This baseline when the engine reported for its session; None for another one (the
        engine started a new session instead of resuming this one)."""
        return self if session_id == self.session_id else None

    def cost_since(self, total: Decimal | None) -> tuple[Decimal | None, bool]:
        """(this attempt's own cost, whether the baseline was taken off)."""
        if total is None or self.cost_usd is None or total < self.cost_usd:
            return total, False
        return total - self.cost_usd, True

    def tokens_since(self, tokens: dict[str, int] | None) -> tuple[dict[str, int] | None, bool]:
        """(this attempt's own tokens, whether the baseline was taken off)."""
        if not tokens or self.tokens is None or any(tokens.get(k, 0) < v for k, v in self.tokens.items()):
            return tokens, False
        return {k: v - self.tokens.get(k, 0) for k, v in tokens.items()}, True


def totals(session_id: str | None, cost_usd: Decimal | None = None,
           tokens: dict[str, int] | None = None) -> dict[str, Any] | None:
    """An Outcome's `totals`: the session's running figures as the engine reported them (JSON:
    the cost as its exact JSON number)."""
    if not session_id or (cost_usd is None and not tokens):
        return None
    return {"session_id": session_id, "cost_usd": money.to_json(cost_usd),
            "tokens": dict(tokens) if tokens else None}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")


@dataclass
class EngineContext:
    """Everything an engine may use for one attempt."""

    job_id: str
    attempt: int
    task: str
    worktree: Path
    repo_root: Path
    git_common_dir: Path
    env: dict[str, str]
    emit: Callable[[dict[str, Any]], None]
    session_id: str | None = None  # set on reply: resume this engine session
    # The resumed session's figures at the end of the last attempt that reported them (None: a new
    # session, or nothing reported): the engine reports its own share since then (`Baseline`).
    baseline: Baseline | None = None
    model: str | None = None
    max_usd: Decimal | None = None
    max_turns: int | None = None
    readonly: bool = False
    timeout: float | None = None  # seconds for the engine run
    config: Callable[[str], str | None] = lambda key: None  # git config subtask.* reader
    on_pid: Callable[[int], None] = lambda pid: None  # report a child's process group
    # Report that a process of the engine exists (on_pid says so too): an engine that never got
    # this far (not installed, failed to launch) spent nothing and is charged nothing.
    on_launch: Callable[[int], None] = lambda pid: None
    # Given by the worker, because the state folder is not the engines' to know (they never
    # import `state`): a private folder (0700) for a launcher's files, and the writer of the
    # attempt's private task file (removed when the attempt ends).
    private_dir: Path | None = None
    write_task_file: Callable[[str], str] | None = None

    def task_file(self) -> str:
        """The task in a private file (0600): an argv element holds at most 128 KiB, a task up to
        1 MiB. Without the worker's writer (an engine run on its own), a temporary file in
        `private_dir`, else the system's temp folder."""
        if self.write_task_file is not None:
            return self.write_task_file(self.task)
        import tempfile  # an engine run on its own only: `start` never pays for it (shutil, random)

        fd, name = tempfile.mkstemp(prefix=f"task-{self.job_id}-", dir=self.private_dir)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as out:
            out.write(self.task)
        return name


@dataclass
class Outcome:
    """What an engine says happened. The worker adds what it observes in git."""

    ok: bool
    summary: str = ""
    exit_code: int | None = None
    outcome: str | None = None  # done | partial | blocked, from a final STATUS: line
    session_id: str | None = None
    # This attempt's own, in exact dollars (`money.usd`); None = unknown (a paid engine is then
    # charged its reservation).
    cost_usd: Decimal | None = None
    tokens: dict[str, int] | None = None  # this attempt's own
    # The session's running figures as the engine reported them (`totals()`), for the next attempt's
    # baseline; and whether cost_usd/tokens are shares since `ctx.baseline` (the worker then credits
    # what attempts in between were charged without a figure).
    totals: dict[str, Any] | None = None
    since_baseline: bool = False
    # Whether the model answered at all: False when the engine saw no answer and no usage (an API it
    # could not reach), None when it cannot tell. An attempt whose engine saw no answer and knows no
    # cost is charged nothing, however it ended (a timeout, a stall, an exit).
    billed: bool | None = None
    turns: int | None = None
    model: str | None = None
    commands: list[dict[str, Any]] = field(default_factory=list)  # {"command": str, "exit": int|None}
    error_kind: str | None = None
    error: str | None = None
    error_hint: str | None = None  # the engine's own next step, where the generic one is wrong for it
    launched: bool = True  # set by the worker: False when no process of the engine ever started

    @property
    def hint(self) -> str | None:
        if self.error_hint:
            return self.error_hint
        return ERROR_HINTS.get(self.error_kind) if self.error_kind else None


@dataclass
class Probe:
    """What can be told about an engine without spending anything."""

    name: str
    installed: bool
    authenticated: bool | None  # None = cannot tell without spending
    version: str | None
    paid: bool
    isolation: str
    detail: str = ""
    confinement: str = ""  # what git-subtask's isolation gives it here by default (api.engines fills it)

    @property
    def usable(self) -> bool:
        return self.installed and self.authenticated is not False


class Engine(Protocol):
    """An engine. It may also have `preflight() -> str | None`: why a job on it cannot run here
    (not installed, no credentials), with the fix; None when it may. Cheap: no subprocess, no
    network (`start` asks it every time); `probe` is the full check. Optional: an engine without
    it is never refused (`preflight` below)."""

    name: str
    paid: bool

    @property
    def isolation(self) -> str:  # what the engine enforces, in words
        ...

    def probe(self) -> Probe: ...

    def run(self, ctx: EngineContext) -> Outcome: ...


def resumes(engine: Engine) -> bool:
    """Does a new attempt resume the engine's session (claude, codex, a command engine with a
    resume template)? The shell engine, and command engines without one, run the task again."""
    return bool(getattr(engine, "resumes", False))


def preflight(engine: Engine) -> str | None:
    """The engine's refusal, if it has a preflight and it refuses."""
    check = getattr(engine, "preflight", None)
    return check() if callable(check) else None


DELEGATION_PROTOCOL = """\
You are a background worker on job {job_id}, started by git-subtask; nobody is watching live.
Work only inside this worktree: {worktree}. Do not touch files outside it.
Commit your work with clear messages as you go (git add, git commit). Do not push, and do not
switch branches.
End your final message with a summary of at most 10 lines, then a final line exactly:
STATUS: done|partial|blocked
(done = the task is complete; partial = some is left; blocked = you cannot go on without help)."""

READONLY_PROTOCOL = ("\nThis job is read-only: change no files and make no commits "
                     "(this overrides the commit instruction above).")


def delegation_protocol(ctx: EngineContext) -> str:
    """What every agent engine tells its agent: where to work, to commit, how to end."""
    text = DELEGATION_PROTOCOL.format(job_id=ctx.job_id, worktree=ctx.worktree)
    return text + READONLY_PROTOCOL if ctx.readonly else text


_STATUS_RE = lazyre.compile(r"^\s*\**STATUS\**\s*:\s*\**\s*(done|partial|blocked)\b", re.IGNORECASE)


def parse_status(text: str) -> str | None:
    """The claimed outcome from the last `STATUS: done|partial|blocked` line, if any."""
    for line in reversed(text.strip().splitlines()):
        match = _STATUS_RE.match(line)
        if match:
            return match.group(1).lower()
    return None


def last_lines(text: str, n: int = SUMMARY_MAX_LINES) -> str:
    """The last n non-empty lines: an engine's summary when it gives no better one."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-n:])
