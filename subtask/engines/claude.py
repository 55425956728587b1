"""The `claude` engine: one attempt of a job run by Claude Code through `claude-agent-sdk`.

Owns: turning an EngineContext into `ClaudeAgentOptions`, streaming the agent's messages into
events (text, tool uses, Bash commands with their exit status, the result), and mapping how the
run ended (result subtypes, API errors, SDK exceptions, the timeout) onto an `Outcome`.

Invariants:
- `claude_agent_sdk` is imported only inside `run()` (costly import); `probe()` never imports it
  and never spends anything.
- `run()` never raises for an agent failure: every SDK exception becomes `error_kind`.
- Permissions: `acceptEdits` plus an allow-list (never `bypassPermissions`, which the CLI refuses
  as root); a read-only job gets read tools only, Bash and the edit tools disallowed.
- The CLI runs in its own session/process group (reported through `ctx.on_pid`), so a timeout or
  `stop` ends the CLI and every command it started.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from subtask.engines.base import (
    EngineContext,
    Outcome,
    Probe,
    delegation_protocol,
    last_lines,
    parse_status,
)
from subtask.engines.base import totals as session_totals
from subtask.model import lazyre, money
from subtask.model.redact import StreamRedactor
from subtask.proc import isolation

CLI_ENV = "SUBTASK_CLAUDE_CLI"

# Tools a normal job may use without a prompt. Anything else would ask, and with no one to answer
# the SDK denies it.
WRITE_TOOLS = ["Read", "Write", "Edit", "MultiEdit", "NotebookEdit", "Glob", "Grep", "LS",
               "Bash", "BashOutput", "KillShell", "TodoWrite"]
READ_TOOLS = ["Read", "Glob", "Grep", "LS"]
READONLY_DENIED = ["Write", "Edit", "MultiEdit", "NotebookEdit", "Bash", "BashOutput",
                   "KillShell", "WebFetch", "WebSearch"]

KILL_GRACE_SECONDS = 3.0
STDERR_TAIL_LINES = 40
INPUT_REPR_MAX = 200

# Claude Code's Bash tool starts a failed command's result with "Exit code N".
_EXIT_CODE_RE = lazyre.compile(r"^\s*(?:error:\s*)?exit code:?\s*(-?\d+)", re.IGNORECASE)
_AUTH_RE = lazyre.compile(
    r"invalid api key|please run /login|invalid auth token|not logged in|authentication[_ ]"
    r"(?:failed|error|required)|oauth token (?:has )?(?:expired|revoked)|unauthorized",
    re.IGNORECASE)
_USAGE_RE = lazyre.compile(
    r"usage limit|limit reached|hit your (?:\w+ )?limit|credit balance|spend limit", re.IGNORECASE)
_API_RE = lazyre.compile(r"api error|overloaded|internal server error|connection error|econnrefused|"
                     r"rate.?limit|\b(?:http|status)\s*5\d\d\b", re.IGNORECASE)


CREDENTIAL_VARIABLES = ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_AUTH_TOKEN")


class ClaudeEngine:
    name = "claude"
    paid = True
    resumes = True  # a reply or a retry resumes the session (`ctx.session_id`)
    isolation = ("tools limited by permission mode acceptEdits and an allow-list; "
                 "cwd is the worktree (not a sandbox)")
    confinable = True  # on request: the CLI is started through git-subtask's isolation launcher
    default_isolation = "none"

    @staticmethod
    def writable_paths(env: Mapping[str, str]) -> list[Path]:
        """Claude Code's config and session folder (made if missing: a confined CLI could not, and
        `reply` resumes from its sessions there), and its state file in $HOME."""
        config = env.get("CLAUDE_CONFIG_DIR")
        if config:
            folder, files = Path(config), []
        else:
            home = Path(env.get("HOME", str(Path.home())))
            folder, files = home / ".claude", [home / ".claude.json"]
        folder.mkdir(parents=True, exist_ok=True)
        return [folder, *files]

    @staticmethod
    def readable_paths(env: Mapping[str, str]) -> list[Path]:
        """A CLI named outside this package (`SUBTASK_CLAUDE_CLI`): its folder, for a confined view."""
        explicit = env.get(CLI_ENV)
        found = shutil.which(explicit) if explicit else None
        return [Path(os.path.realpath(found)).parent] if found else []

    @staticmethod
    def credential_env(env: Mapping[str, str]) -> list[str]:
        """What the CLI authenticates with: given to it, withheld from every other process of a
        confined job (setup, verify)."""
        return list(CREDENTIAL_VARIABLES)

    def probe(self) -> Probe:
        cli = _find_cli(None)
        if cli is None:
            return Probe(self.name, False, None, None, self.paid, self.isolation,
                         detail="no Claude Code CLI: pip install claude-agent-sdk (bundles it)")
        authenticated, how = _auth_state()
        return Probe(self.name, True, authenticated, _cli_version(cli), self.paid,
                     self.isolation, detail=f"cli: {cli}; auth: {how}")

    def preflight(self) -> str | None:
        """No CLI, or no credentials: told from files and the environment only (no `--version`)."""
        if _find_cli(None) is None:
            return "no Claude Code CLI: pip install claude-agent-sdk (bundles it)"
        authenticated, how = _auth_state()
        if not authenticated:
            return f"not logged in: {how}"
        return None

    def run(self, ctx: EngineContext) -> Outcome:
        try:
            import anyio
            import claude_agent_sdk  # noqa: F401  (the costly import, paid only here)
        except ImportError as exc:
            return Outcome(False, error_kind="not_installed",
                           error=f"claude-agent-sdk is not importable: {exc}")
        return anyio.run(_Attempt(ctx).main)


# --- probe helpers ---------------------------------------------------------------------------


def _bundled_cli() -> str | None:
    """The CLI shipped inside the claude-agent-sdk wheel, found without importing the SDK."""
    spec = importlib.util.find_spec("claude_agent_sdk")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "_bundled" / "claude"
        if path.is_file():
            return str(path)
    return None


def _find_cli(ctx: EngineContext | None) -> str | None:
    """An explicit CLI (env, then git config) or the SDK's own choice: bundled, then PATH."""
    explicit = _explicit_cli(ctx)
    if explicit:
        return explicit if Path(explicit).is_file() or shutil.which(explicit) else None
    return _bundled_cli() or shutil.which("claude")


def _explicit_cli(ctx: EngineContext | None) -> str | None:
    if ctx is not None and ctx.env.get(CLI_ENV):
        return ctx.env[CLI_ENV]
    if os.environ.get(CLI_ENV):
        return os.environ[CLI_ENV]
    return ctx.config("engine.claude.cliPath") if ctx is not None else None


def _cli_version(cli: str) -> str | None:
    try:
        out = subprocess.run([cli, "--version"], capture_output=True, text=True, timeout=15,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return next(iter(out.stdout.strip().splitlines()), None)


def _auth_state() -> tuple[bool, str]:
    """Whether credentials are present, as far as can be told without calling the service."""
    for var in CREDENTIAL_VARIABLES:
        if os.environ.get(var):
            return True, f"{var} is set"
    for var in ("CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY"):
        if os.environ.get(var) not in (None, "", "0", "false"):
            return True, f"{var} (third-party provider credentials)"
    config_dir = Path(os.environ.get("CLAUDE_CONFIG_DIR") or Path.home() / ".claude")
    credentials = config_dir / ".credentials.json"
    if credentials.is_file():
        return True, f"credentials in {credentials}"
    return False, "no ANTHROPIC_API_KEY, CLAUDE_CODE_OAUTH_TOKEN or .credentials.json (claude /login)"


# --- options ---------------------------------------------------------------------------------


def build_options(ctx: EngineContext, stderr: Any = None, cli_path: str | None = None) -> Any:
    """The ClaudeAgentOptions for one attempt (imports the SDK); `cli_path`: the launcher script
    (`_Launch`), else the explicit CLI, else the SDK's own choice."""
    from claude_agent_sdk import ClaudeAgentOptions

    protocol = delegation_protocol(ctx)
    tools = _tool_policy(ctx.readonly)
    return ClaudeAgentOptions(
        cwd=str(ctx.worktree),
        model=ctx.model,
        max_turns=ctx.max_turns,
        max_budget_usd=float(ctx.max_usd) if ctx.max_usd is not None else None,
        resume=ctx.session_id,
        env=dict(ctx.env),
        # The repo's own .claude/settings*.json and CLAUDE.md apply, as they would interactively.
        setting_sources=["user", "project", "local"],
        system_prompt={"type": "preset", "preset": "claude_code", "append": protocol},
        cli_path=cli_path or _explicit_cli(ctx),
        stderr=stderr,
        **tools,
    )


def _tool_policy(readonly: bool) -> dict[str, Any]:
    if readonly:
        # "default" (not acceptEdits): even an edit that slipped through would have to ask.
        return {"permission_mode": "default", "allowed_tools": list(READ_TOOLS),
                "disallowed_tools": list(READONLY_DENIED)}
    return {"permission_mode": "acceptEdits", "allowed_tools": list(WRITE_TOOLS)}


# --- the process: started by the SDK through `cli_path`, a launcher of ours ---------------------


class _Launch:
    """The CLI as the SDK starts it: `cli_path` names a small script of this attempt's that execs
    `python -m subtask.proc.isolation` with the real CLI, which dies with the worker, gets a session of
    its own (a timeout or `stop` then ends the CLI and every command it started), writes its pid
    to a file (the SDK's public surface does not say it), and enters the job's sandbox when one is
    active (the SDK takes no pre-exec hook and closes every fd, so the launcher rebuilds it from
    `isolation.launch_spec`). Only `ClaudeAgentOptions.cli_path`: no SDK internals."""

    def __init__(self, ctx: EngineContext, cli: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix=f"claude-{ctx.job_id}-", dir=ctx.private_dir))
        self.pid_file = self.folder / "pid"
        self.script = self.folder / "claude"
        words = [sys.executable, "-m", "subtask.proc.isolation", "--parent", str(os.getpid()), "--session",
                 "--pid-file", str(self.pid_file)]
        spec = isolation.launch_spec()
        if spec is not None:
            sandbox = self.folder / "sandbox.json"
            sandbox.write_text(json.dumps(spec))
            words += ["--sandbox", str(sandbox)]
        command = " ".join(shlex.quote(w) for w in [*words, "--", cli])
        self.script.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        self.script.chmod(0o700)

    def pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text())
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _own_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def _signal_tree(pid: int, sig: int) -> None:
    """Signal the CLI's process group when it has its own, else the CLI alone."""
    try:
        if _own_group(pid):
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except OSError:
        pass  # already gone


# --- one attempt -----------------------------------------------------------------------------


class _Attempt:
    """The state of one run: what streamed past, and how it ended."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx
        self.texts: list[str] = []
        self.pending_bash: dict[str, str] = {}  # tool_use_id -> command
        self.commands: list[dict[str, Any]] = []
        self.result: Any = None
        self.assistant_error: str | None = None
        self.session_id: str | None = ctx.session_id
        self.model: str | None = ctx.model
        self.error: BaseException | None = None
        self.timed_out = False
        self.pid: int | None = None
        self.answered = False  # the model sent a message (not a synthetic error turn)
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._stderr_redactor = StreamRedactor()  # free text: a key may span its lines

    async def main(self) -> Outcome:
        import anyio

        cli = _find_cli(self.ctx)
        if cli is None:  # never let the SDK find one of its own: it would run unconfined, in our group
            from claude_agent_sdk import CLINotFoundError

            self.error = CLINotFoundError(
                "no Claude Code CLI found (pip install claude-agent-sdk bundles it; "
                f"or set {CLI_ENV} or git config subtask.engine.claude.cliPath)")
            return self._outcome()
        launch = _Launch(self.ctx, cli)
        try:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    if self.ctx.timeout:
                        tg.start_soon(self._watchdog, self.ctx.timeout, scope)
                    tg.start_soon(self._watch_launch, launch)
                    await self._consume(launch)
                    tg.cancel_scope.cancel()
        finally:
            launch.close()
        return self._outcome()

    async def _consume(self, launch: _Launch) -> None:
        from claude_agent_sdk import query

        try:
            options = build_options(self.ctx, stderr=self._on_stderr, cli_path=str(launch.script))
            async for message in query(prompt=self.ctx.task, options=options):
                self._on_message(message)
        except Exception as exc:  # every SDK failure becomes an error kind, never a raise
            self.error = exc

    async def _watch_launch(self, launch: _Launch) -> None:
        """Report the CLI's pid once the launcher has written it (it waits for nothing else)."""
        import anyio

        while (pid := launch.pid()) is None:
            await anyio.sleep(0.01)
        self._on_spawn(pid)

    def _on_stderr(self, raw: str) -> None:
        line = self._stderr_redactor.line(raw)
        if line is not None:
            self.stderr_tail.append(line)

    def _on_spawn(self, pid: int) -> None:
        self.pid = pid
        self.ctx.on_launch(pid)
        if _own_group(pid):
            self.ctx.on_pid(pid)

    async def _watchdog(self, timeout: float, scope: Any) -> None:
        """End the CLI's process group at the deadline; EOF on its stdout ends the stream."""
        import anyio

        await anyio.sleep(timeout)
        self.timed_out = True
        if self.pid is not None:
            _signal_tree(self.pid, signal.SIGTERM)
            await anyio.sleep(KILL_GRACE_SECONDS)
            _signal_tree(self.pid, signal.SIGKILL)
            await anyio.sleep(KILL_GRACE_SECONDS)
        # Still streaming (no pid known, or a grandchild holds the pipe): cancel; the SDK's
        # shielded close then terminates whatever is left.
        scope.cancel()

    # --- messages ---

    def _on_message(self, message: Any) -> None:
        from claude_agent_sdk import AssistantMessage, ResultMessage, SystemMessage, UserMessage

        if isinstance(message, AssistantMessage):
            self._on_assistant(message)
        elif isinstance(message, UserMessage):
            self._on_user(message)
        elif isinstance(message, ResultMessage):
            self._on_result(message)
        elif isinstance(message, SystemMessage) and message.subtype == "init":
            self.session_id = message.data.get("session_id") or self.session_id
            self.model = message.data.get("model") or self.model

    def _on_assistant(self, message: Any) -> None:
        from claude_agent_sdk import TextBlock, ToolUseBlock

        if message.error:
            self.assistant_error = message.error
        if message.model and not message.model.startswith("<"):  # "<synthetic>" error turns
            self.model = message.model
            self.answered = True
        for block in message.content:
            if isinstance(block, TextBlock) and block.text.strip():
                if message.parent_tool_use_id is None:  # a subagent's words are not the summary
                    self.texts.append(block.text)
                self.ctx.emit({"type": "text", "text": block.text})
            elif isinstance(block, ToolUseBlock):
                self.ctx.emit({"type": "tool", "name": block.name,
                               "input": _short_repr(block.input)})
                if block.name == "Bash":
                    self.pending_bash[block.id] = str(block.input.get("command", ""))

    def _on_user(self, message: Any) -> None:
        from claude_agent_sdk import ToolResultBlock

        if not isinstance(message.content, list):
            return
        for block in message.content:
            if isinstance(block, ToolResultBlock) and block.tool_use_id in self.pending_bash:
                command = self.pending_bash.pop(block.tool_use_id)
                self._record_command(command, _exit_status(block.content, block.is_error))

    def _record_command(self, command: str, exit_status: int | None) -> None:
        entry = {"command": command, "exit": exit_status}
        self.commands.append(entry)
        self.ctx.emit({"type": "command", **entry})

    def _on_result(self, message: Any) -> None:
        self.result = message
        self.session_id = message.session_id or self.session_id
        self.ctx.emit({"type": "result", "subtype": message.subtype,
                       "is_error": message.is_error, "cost_usd": message.total_cost_usd,
                       "turns": message.num_turns, "session_id": message.session_id})

    # --- the outcome ---

    def _outcome(self) -> Outcome:
        for command in self.pending_bash.values():  # started, never answered
            self._record_command(command, None)
        self.pending_bash.clear()
        outcome = self._base_outcome()
        kind, error = self._failure()
        if kind is None:
            text = (self.result.result or "") if self.result is not None else ""
            outcome.ok = True
            outcome.exit_code = 0 if outcome.exit_code is None else outcome.exit_code
            outcome.summary = last_lines(text) if text.strip() else self._text_summary()
            outcome.outcome = parse_status(text) or parse_status("\n".join(self.texts))
            return outcome
        outcome.error_kind, outcome.error = kind, error
        outcome.summary = self._text_summary()
        return outcome

    def _base_outcome(self) -> Outcome:
        result = self.result
        exit_code = getattr(self.error, "exit_code", None)
        # A resumed session's total_cost_usd counts on from the session's earlier runs (measured:
        # Claude Code 2.1.332 restores it from the transcript, also after a run that was killed);
        # its usage and num_turns are this run's alone. A run that started a session of its own
        # (the one asked for could not be resumed) counts from zero.
        total = money.usd(getattr(result, "total_cost_usd", None))
        baseline = self.ctx.baseline.of(self.session_id) if self.ctx.baseline else None
        cost, since = baseline.cost_since(total) if baseline else (total, False)
        return Outcome(
            ok=False,
            exit_code=exit_code if isinstance(exit_code, int) else None,
            session_id=self.session_id,
            cost_usd=cost,
            tokens=_tokens(getattr(result, "usage", None)),
            turns=getattr(result, "num_turns", None),
            model=self.model,
            commands=list(self.commands),
            totals=session_totals(self.session_id, cost_usd=total),
            since_baseline=since,
            billed=self.answered or bool(cost),
        )

    def _text_summary(self) -> str:
        return last_lines("\n".join(self.texts))

    def _failure(self) -> tuple[str | None, str | None]:
        """(error_kind, message), or (None, None) when the run ended well."""
        from claude_agent_sdk import CLINotFoundError, ResultError

        if self.timed_out:
            return "timeout", f"claude ran past its timeout of {self.ctx.timeout:g}s"
        if isinstance(self.error, CLINotFoundError):
            return "not_installed", str(self.error)
        result = self.result
        if result is not None and not result.is_error:
            return None, None  # a clean result wins over a noisy exit afterwards
        if result is not None:
            text = _result_error_text(result)
            return classify(result.subtype, text, result.api_error_status,
                            self.assistant_error), text
        if isinstance(self.error, ResultError):
            text = str(self.error)
            return classify(self.error.subtype or "", text, self.error.api_error_status,
                            self.assistant_error), text
        if self.error is not None:
            text = self._with_stderr(f"{type(self.error).__name__}: {self.error}")
            return classify("", text, None, self.assistant_error), text
        return "engine", self._with_stderr("claude ended without a result")

    def _with_stderr(self, text: str) -> str:
        if not self.stderr_tail:
            return text
        return text + "\n" + "\n".join(list(self.stderr_tail)[-10:])


# --- pure helpers ----------------------------------------------------------------------------


def classify(subtype: str, text: str, status: int | None, assistant_error: str | None) -> str:
    """The error kind for a failed result, from its subtype, HTTP status and prose."""
    if subtype == "error_max_budget_usd" or "maximum budget" in text.lower():
        return "budget"
    if subtype == "error_max_turns" or "maximum number of turns" in text.lower():
        return "max_turns"
    if status in (401, 403) or assistant_error == "authentication_failed" or _AUTH_RE.search(text):
        return "auth"
    if assistant_error == "billing_error" or _USAGE_RE.search(text):
        return "usage_limit"
    if (status is not None and (status == 429 or status >= 500)) \
            or assistant_error in ("server_error", "rate_limit") or _API_RE.search(text):
        return "api_error"
    return "engine"


def _result_error_text(result: Any) -> str:
    errors = [e for e in (result.errors or []) if isinstance(e, str) and e.strip()]
    if errors:
        return "; ".join(errors)
    if result.result and result.result.strip():
        return result.result.strip()
    if result.api_error_status is not None:
        return f"API error (HTTP {result.api_error_status})"
    return result.subtype or "error result"


def _exit_status(content: Any, is_error: bool | None) -> int | None:
    """A Bash result's exit status: 0 unless an error, then its leading `Exit code N` if any."""
    if not is_error:
        return 0
    match = _EXIT_CODE_RE.match(_content_text(content))
    return int(match.group(1)) if match else None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) if isinstance(part, dict) else str(part)
                         for part in content)
    return "" if content is None else str(content)


def _short_repr(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= INPUT_REPR_MAX else text[: INPUT_REPR_MAX - 1] + "…"


def _tokens(usage: Any) -> dict[str, int] | None:
    if not isinstance(usage, dict):
        return None
    names = {"input_tokens": "input", "output_tokens": "output",
             "cache_read_input_tokens": "cache_read",
             "cache_creation_input_tokens": "cache_creation"}
    tokens = {short: int(usage[key]) for key, short in names.items()
              if isinstance(usage.get(key), (int, float))}
    return tokens or None

