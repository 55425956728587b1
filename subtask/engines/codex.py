"""The `codex` engine: OpenAI's Codex CLI run headless (`codex exec --json`) in the job's worktree.

What it owns: building the `codex exec` argv (sandbox, writable git dirs, model, prompt with the
delegation protocol), reading the JSONL event stream codex prints on stdout, and turning it into
progress events and one `Outcome`. It never touches records, notes or the ledger.

The event stream (one JSON object a line; anything else is ignored and logged):
    thread.started {thread_id}            -> the session id, used by `codex exec resume <id>`
    item.started / item.updated / item.completed {item: {id, type, ...}}
        agent_message {text}              -> text events; the last one is the final message
        reasoning {text}
        command_execution {command, aggregated_output, exit_code, status}
        file_change {changes: [{path, kind}], status}, mcp_tool_call, web_search, todo_list, error
    turn.completed {usage: {input_tokens, cached_input_tokens, output_tokens}}
                                          -> the thread's running token totals (measured, codex
                                             0.171: `exec resume` reports the whole thread's)
    turn.failed {error: {message}} / error {message}
    error {message: "Reconnecting... ..."} -> a retry, not a failure: no progress either (stalls)

Invariants:
- `run` never raises for an agent failure: a missing binary, a bad exit, a failed turn or a
  timeout come back as an Outcome with `error_kind` set.
- codex reports tokens, never dollars: `cost_usd` is None (the worker charges the reservation)
  unless per-million-token prices are configured. Its usage is the thread's running total: an
  attempt's own tokens are that total minus the one the last attempt recorded (`ctx.baseline`).
- Never run codex's own sandbox inside ours, because bubblewrap cannot write its uid map under
  Landlock and every command fails while the job ends `done`: codex with `--isolation` is refused
  at start (and by the engine, for a job recorded before) unless its sandbox is
  `danger-full-access` (tests: `engines_e2e::test_codex_under_isolation_is_refused_at_start_with_the_reason`).
- The sandbox stays on by default: `workspace-write` with the repository's git dir added as a
  writable root so the agent can commit; `read-only` for read-only jobs. Only an explicit
  `subtask.engine.codex.sandbox = danger-full-access` turns it off.
- Never describe an engine's sandbox but from the setting that builds its argv
  (`_sandbox_in_effect`), because `engines` said "writes limited to the worktree" while
  `danger-full-access` had turned it off, and a job wrote in /var/tmp; nothing confining a job
  (its own sandbox off, isolation none) is said at `start` in one line (tests:
  `engines_e2e::test_engines_and_start_say_when_codex_runs_with_its_sandbox_off`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Callable, Mapping
from decimal import Decimal
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
from subtask.model.config import TRUE_WORDS
from subtask.model.redact import StreamRedactor
from subtask.proc import procs
from subtask.proc.isolation import ACTIVE_ENV

ConfigReader = Callable[[str], "str | None"]

REPLY_REMINDER = """

(As before: commit your work, end with a summary of at most 10 lines and a final
`STATUS: done|partial|blocked` line.)
"""

ISOLATION = ("codex sandbox workspace-write: writes limited to the worktree and the repository's"
             " git dir")
# What each `subtask.engine.codex.sandbox` setting means for a job that may write, in words.
SANDBOX_WORDS = {
    "workspace-write": ISOLATION,
    "read-only": "codex sandbox read-only: it writes nothing (not even its commits)",
    "danger-full-access": ("none: its sandbox is off (subtask.engine.codex.sandbox "
                           "danger-full-access); it may write anywhere this user can unless "
                           "git-subtask's isolation confines it (--isolation worktree)"),
}
UNCONFINED = ("codex runs with its own sandbox off (git config subtask.engine.codex.sandbox "
              "danger-full-access) and --isolation none: it may write anywhere this user can; "
              "--isolation worktree confines it")
NOT_FOUND = ("codex not found: install it (npm i -g @openai/codex) or set"
             " git config subtask.engine.codex.path")

_USAGE_LIMIT_RE = lazyre.compile(
    r"usage limit|rate limit|rate_limit|too many requests|\b429\b|quota|insufficient_quota", re.I)
_AUTH_RE = lazyre.compile(
    r"\b40[13]\b|unauthori[sz]ed|authenticat|\bauth\b|\blog ?in\b|api[ _]key|credential", re.I)


def classify_error(message: str) -> str:
    """An error kind from a codex error message: usage_limit, auth or api_error."""
    if _USAGE_LIMIT_RE.search(message):
        return "usage_limit"
    if _AUTH_RE.search(message):
        return "auth"
    return "api_error"


NOT_LOGGED_IN = "not logged in: run `codex login`, or set OPENAI_API_KEY / CODEX_API_KEY"
LOCAL_PROVIDERS = ("oss", "ollama", "lmstudio")  # codex's built-in providers that need no key
COMMAND_OUTPUT_TAIL = 2000  # characters of a command's output kept in its event (refusals are read there)
_RETRY_RE = lazyre.compile(r"^\s*(reconnecting|retrying)\b", re.I)


def _has_credentials(env: Mapping[str, str]) -> bool:
    """An API key in the environment, codex's own login file, or the key its configured model
    provider names (`model_provider` and `[model_providers.X] env_key` in config.toml). No call."""
    if env.get("OPENAI_API_KEY") or env.get("CODEX_API_KEY") or (_codex_home(env) / "auth.json").is_file():
        return True
    provider = _provider(env)
    if provider is None:
        return False
    env_key = provider.get("env_key")  # codex's local built-ins (oss, ollama, lmstudio) name none
    # A provider that names no key (a local server) needs none; one that names a key needs it set.
    return not env_key or bool(isinstance(env_key, str) and env.get(env_key))


def _provider(env: Mapping[str, str]) -> dict[str, Any] | None:
    """The custom model provider codex's config.toml selects, or None (the built-in OpenAI one,
    or no readable config)."""
    try:
        with open(_codex_home(env) / "config.toml", "rb") as fh:
            codex_toml = tomllib.load(fh)
    except (OSError, ValueError):
        return None
    name = codex_toml.get("model_provider")
    providers = codex_toml.get("model_providers")
    if not isinstance(name, str) or name == "openai":
        return None
    provider = providers.get(name) if isinstance(providers, dict) else None
    if isinstance(provider, dict):
        return provider
    return {} if name in LOCAL_PROVIDERS else None


def _not_logged_in(env: Mapping[str, str]) -> str:
    provider = _provider(env)
    if provider is not None and isinstance(provider.get("env_key"), str):
        return (f"not logged in: codex's model provider in {_codex_home(env) / 'config.toml'} "
                f"reads its key from {provider['env_key']}, which is not set")
    return NOT_LOGGED_IN


def _codex_home(env: Mapping[str, str]) -> Path:
    home = env.get("CODEX_HOME")
    return Path(home) if home else Path(env.get("HOME", str(Path.home()))) / ".codex"


class _Stream:
    """The state read from codex's JSONL stream, plus the progress events it emits."""

    def __init__(self, emit: Callable[[dict[str, Any]], None]) -> None:
        self.emit = emit
        self.session_id: str | None = None
        self.final_message = ""
        self.commands: list[dict[str, Any]] = []
        self.tokens: dict[str, int] | None = None
        self.turn_failed: str | None = None
        self.error: str | None = None
        self.retrying: str | None = None  # the last "Reconnecting..." while no answer came since
        self.turn_completed = False
        self.answered = False  # the model produced an item or reported usage

    def line(self, line: str) -> None:
        text = line.strip()
        if not text:
            return
        try:
            event = json.loads(text)
        except ValueError:
            event = None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            # codex keeps stdout JSONL-only, but a wrapper script or a warning may not.
            self.emit({"type": "log", "stream": "stdout", "text": line})
            return
        self.event(event)

    def event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind in ("thread.started", "thread.resumed"):
            self.session_id = str(event.get("thread_id") or self.session_id or "") or None
            self.emit({"type": "session", "session_id": self.session_id})
        elif kind == "turn.started":
            self.emit({"type": "turn"})
        elif kind in ("item.started", "item.updated", "item.completed"):
            item = event.get("item")
            if isinstance(item, dict):
                self.item(kind, item)
        elif kind == "turn.completed":
            self.turn_completed = True
            self.usage(event.get("usage"))
        elif kind == "turn.failed":
            self.turn_failed = _message(event.get("error")) or "the turn failed"
            self.emit({"type": "error", "message": self.turn_failed})
        elif kind == "error" and _RETRY_RE.match(_message(event)):
            # codex retries an unreachable API for as long as it takes: no failure, and no progress
            self.retrying = _message(event)
            self.emit({"type": "retry", "message": self.retrying})
        elif kind == "error":
            self.error = _message(event) or "codex reported an error"
            self.emit({"type": "error", "message": self.error})
        else:
            self.emit({"type": "event", "event": kind})

    def item(self, kind: str, item: dict[str, Any]) -> None:
        item_type = item.get("type") or item.get("item_type")
        done = kind == "item.completed"
        if item_type != "error":
            self.answered, self.retrying = True, None
        if item_type == "agent_message":
            if done:
                self.final_message = str(item.get("text") or "")
                self.emit({"type": "text", "text": self.final_message})
        elif item_type == "reasoning":
            if done:
                self.emit({"type": "reasoning", "text": str(item.get("text") or "")})
        elif item_type == "command_execution":
            self.command(item, done)
        elif item_type == "file_change":
            if done:
                changes = [f"{c.get('kind', '?')} {c.get('path', '?')}"
                           for c in item.get("changes") or [] if isinstance(c, dict)]
                self.emit({"type": "tool", "name": "file_change", "changes": changes,
                           "status": item.get("status")})
        elif item_type == "mcp_tool_call":
            if kind == "item.started":
                self.emit({"type": "tool", "name": f"mcp:{item.get('server')}/{item.get('tool')}"})
        elif item_type == "web_search":
            if kind == "item.started":
                self.emit({"type": "tool", "name": "web_search", "query": item.get("query")})
        elif item_type == "todo_list":
            self.emit({"type": "plan", "items": item.get("items") or []})
        elif item_type == "error":
            # A non-fatal error item: worth showing, not a failure of the attempt.
            self.emit({"type": "warning", "text": str(item.get("message") or "")})

    def command(self, item: dict[str, Any], done: bool) -> None:
        command = str(item.get("command") or "")
        if not done:
            if item.get("status") in (None, "in_progress"):
                self.emit({"type": "tool", "name": "command", "command": command})
            return
        exit_code = item.get("exit_code")
        exit_code = exit_code if isinstance(exit_code, int) else None
        record = {"command": command, "exit": exit_code}
        self.commands.append(record)
        output = str(item.get("aggregated_output") or "")[-COMMAND_OUTPUT_TAIL:]
        # The output's tail goes with the event: the worker reads refusals of its sandbox there.
        self.emit({"type": "command", **record, "status": item.get("status"),
                   **({"output": output} if output.strip() else {})})

    def usage(self, usage: Any) -> None:
        """The thread's running totals: each report replaces the last (codex 0.171 reports the
        whole thread's usage, also on `exec resume`; a run has one turn)."""
        if not isinstance(usage, dict):
            return
        tokens = {ours: usage[theirs] for ours, theirs in (("input", "input_tokens"),
                                                          ("cached_input", "cached_input_tokens"),
                                                          ("output", "output_tokens"))
                  if isinstance(usage.get(theirs), int) and not isinstance(usage.get(theirs), bool)}
        if not tokens:
            return
        self.tokens, self.answered = tokens, True
        self.emit({"type": "usage", "tokens": dict(tokens)})


def _message(obj: Any) -> str:
    if isinstance(obj, dict):
        return str(obj.get("message") or obj.get("error") or "")
    return str(obj or "")


class CodexEngine:
    name = "codex"
    paid = True
    resumes = True  # `codex exec resume <session>`
    confinable = True  # runs through procs.run; default stays none: its own sandbox applies
    default_isolation = "none"

    @staticmethod
    def writable_paths(env: Mapping[str, str]) -> list[Path]:
        """Codex keeps sessions and logs in its home; under --isolation it must stay writable."""
        return [_codex_home(env)]

    def readable_paths(self, env: Mapping[str, str]) -> list[Path]:
        """Where the codex binary really lives (an npm package, with its native part beside it),
        for a confined view: the `node_modules` folder holding it, else its package folder."""
        found = self._which(self._binary_name(self._config, env), env)
        if found is None:
            return []
        real = Path(os.path.realpath(found))
        for parent in real.parents:
            if parent.name == "node_modules":
                return [parent]
        return [real.parent.parent if real.parent.name == "bin" else real.parent]

    def credential_env(self, env: Mapping[str, str]) -> list[str]:
        """What codex authenticates with (its API keys, its provider's `env_key`): given to it,
        withheld from every other process of a confined job."""
        names = ["OPENAI_API_KEY", "CODEX_API_KEY"]
        provider = _provider(env)
        if provider is not None and isinstance(provider.get("env_key"), str):
            names.append(provider["env_key"])
        return names

    def __init__(self, config: ConfigReader | None = None) -> None:
        self._config: ConfigReader = config or (lambda key: None)

    @property
    def isolation(self) -> str:
        """What codex's own sandbox enforces for a job that may write, as configured."""
        return SANDBOX_WORDS[_sandbox_in_effect(self._config)]

    def own_sandbox(self, readonly: bool = False) -> str | None:
        """The sandbox codex itself enforces on a job run without git-subtask's isolation (its
        `--sandbox` mode), or None when it is off (danger-full-access)."""
        if readonly:
            return "read-only"
        setting = _sandbox_in_effect(self._config)
        return None if setting == "danger-full-access" else setting

    def unconfined_warning(self, mode: str, readonly: bool = False) -> str | None:
        """One line for `start` when nothing confines the job: sandbox off, isolation none."""
        return UNCONFINED if mode == "none" and self.own_sandbox(readonly) is None else None

    # -- finding the binary -------------------------------------------------------------------

    def _binary_name(self, config: ConfigReader, env: Mapping[str, str]) -> str:
        return config("engine.codex.path") or env.get("SUBTASK_CODEX_BIN") or "codex"

    @staticmethod
    def _which(name: str, env: Mapping[str, str]) -> str | None:
        if os.sep in name:
            return name if os.access(name, os.X_OK) and Path(name).is_file() else None
        return shutil.which(name, path=env.get("PATH"))

    # -- probe --------------------------------------------------------------------------------

    def probe(self) -> Probe:
        env = os.environ
        binary = self._which(self._binary_name(self._config, env), env)
        version = self._version(binary) if binary else None
        authenticated = _has_credentials(env)
        detail = "" if binary else NOT_FOUND
        if binary and not authenticated:
            detail = _not_logged_in(env)
        return Probe(self.name, binary is not None, authenticated, version, self.paid,
                     self.isolation, detail)

    def preflight(self) -> str | None:
        """The probe without `codex --version`: the binary on PATH and credentials present."""
        env = os.environ
        if self._which(self._binary_name(self._config, env), env) is None:
            return NOT_FOUND
        return None if _has_credentials(env) else _not_logged_in(env)

    @staticmethod
    def _version(binary: str) -> str | None:
        try:
            out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                 timeout=5, check=False, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return (out.stdout.strip().splitlines() or [""])[0] or None

    # -- the argv -----------------------------------------------------------------------------

    def build_argv(self, ctx: EngineContext, binary: str) -> list[str]:
        """`codex exec --json <options> [resume <session>] -- -`: the prompt (`prompt`) on stdin.

        Options go before `resume`: codex's resume subcommand inherits the root options
        (sandbox, -C, --add-dir, -m), as its TypeScript SDK relies on. `-` reads the prompt
        from stdin (both `exec` and `exec resume` take it), because one argument may hold at
        most 128 KiB and a task may be up to 1 MiB.
        """
        argv = [binary, "exec", "--json", "--skip-git-repo-check", "-C", str(ctx.worktree)]
        argv += self._sandbox_args(ctx)
        if ctx.model:
            argv += ["-m", ctx.model]
        if ctx.session_id:
            argv += ["resume", ctx.session_id]
        return argv + ["--", "-"]

    @staticmethod
    def prompt(ctx: EngineContext) -> str:
        if ctx.session_id:
            return ctx.task + REPLY_REMINDER
        return ctx.task + "\n\n---\n" + delegation_protocol(ctx)

    def confinement_refusal(self, mode: str, config: ConfigReader | None = None) -> str | None:
        """Why codex cannot run under git-subtask's isolation `mode` as configured, or None.

        Its own sandbox is bubblewrap, which must write /proc/self/uid_map to set up its user
        namespace: Landlock refuses that write, and every command codex runs then fails
        ("bwrap: setting up uid map: Permission denied", measured with codex 0.171). Only with
        its own sandbox off (`danger-full-access`, the user's explicit choice) does git-subtask's
        sandbox alone confine it."""
        if mode == "none" or _sandbox_setting(config or self._config) == "danger-full-access":
            return None
        return (f"codex's own sandbox cannot start inside git-subtask's isolation {mode}: bubblewrap must "
                "write /proc/self/uid_map, which Landlock refuses, so every command codex ran would fail")

    CONFINEMENT_HINT = ("run it in codex's own sandbox: --isolation none; or in git-subtask's alone: "
                        "git config subtask.engine.codex.sandbox danger-full-access")

    def _sandbox_args(self, ctx: EngineContext) -> list[str]:
        mode = _sandbox_setting(ctx.config)
        if mode == "danger-full-access" and _confined(ctx):
            return ["--dangerously-bypass-approvals-and-sandbox"]  # git-subtask's sandbox confines it
        if ctx.readonly:
            return ["--sandbox", "read-only"]
        if mode == "danger-full-access":
            return ["--dangerously-bypass-approvals-and-sandbox"]
        if mode == "read-only":
            return ["--sandbox", "read-only"]
        args = ["--sandbox", "workspace-write"]
        # A linked worktree's index, HEAD and logs live under <common>/worktrees/<id>, objects and
        # refs under <common>: both must be writable or `git commit` fails on index.lock.
        # The admin folder git made for the job's worktree, never the one its `.git` names: the job
        # writes that file, and a reply's sandbox would take in whatever folder it named.
        roots = [Path(ctx.git_common_dir)]
        admin = Path(ctx.git_common_dir) / "worktrees" / ctx.job_id
        if admin.is_dir():
            roots.append(admin)
        for root in roots:
            args += ["--add-dir", str(root)]
        if (ctx.config("engine.codex.network") or "").strip().lower() in TRUE_WORDS:
            args += ["-c", "sandbox_workspace_write.network_access=true"]
        return args

    # -- run ----------------------------------------------------------------------------------

    def run(self, ctx: EngineContext) -> Outcome:
        name = self._binary_name(ctx.config, ctx.env)
        binary = self._which(name, ctx.env)
        if binary is None:
            return Outcome(False, error_kind="not_installed", session_id=ctx.session_id,
                           error=f"{NOT_FOUND} (looked for {name})")
        refusal = self.confinement_refusal(ctx.env.get(ACTIVE_ENV) or "none", ctx.config)
        if refusal:  # a job started before this was refused at start, or a setting changed since
            return Outcome(False, error_kind="isolation", session_id=ctx.session_id, error=refusal,
                           error_hint=self.CONFINEMENT_HINT, launched=False)
        stream = _Stream(ctx.emit)
        stderr: list[str] = []
        # stdout is JSON events, each whole: redacted one by one where they are stored. stderr
        # is free text, where a key may span lines.
        stderr_redactor = StreamRedactor()

        def on_stderr(raw: str) -> None:
            line = stderr_redactor.line(raw)
            if line is None:
                return
            stderr.append(line)
            del stderr[:-50]  # keep only the tail: it explains a bad exit
            ctx.emit({"type": "log", "stream": "stderr", "text": line})

        result = procs.run(self.build_argv(ctx, binary), cwd=ctx.worktree, env=ctx.env,
                           stdin_data=self.prompt(ctx).encode(),
                           timeout=ctx.timeout, on_stdout_line=stream.line,
                           on_stderr_line=on_stderr, on_start=ctx.on_pid)
        return self._outcome(ctx, stream, result, stderr)

    def _outcome(self, ctx: EngineContext, stream: _Stream, result: Any,
                 stderr: list[str]) -> Outcome:
        session = stream.session_id or ctx.session_id
        baseline = ctx.baseline.of(session) if ctx.baseline else None  # None: a thread of its own
        tokens, since = baseline.tokens_since(stream.tokens) if baseline else (stream.tokens, False)
        outcome = Outcome(
            ok=True,
            summary=last_lines(stream.final_message),
            exit_code=result.exit_code,
            outcome=parse_status(stream.final_message),
            session_id=session,
            cost_usd=self._cost(ctx, tokens),
            tokens=tokens,
            model=ctx.model,
            commands=stream.commands,
            totals=session_totals(session, tokens=stream.tokens),
            since_baseline=since,
            billed=stream.answered,
        )
        kind, error = self._failure(ctx, stream, result, stderr)
        if kind:
            outcome.ok, outcome.error_kind, outcome.error = False, kind, error
        return outcome

    @staticmethod
    def _failure(ctx: EngineContext, stream: _Stream, result: Any,
                 stderr: list[str]) -> tuple[str | None, str | None]:
        if result.timed_out:
            return "timeout", f"codex ran past its timeout of {ctx.timeout:g}s"
        if stream.turn_failed:
            return classify_error(stream.turn_failed), stream.turn_failed
        # exit_code None without a timeout means the run was interrupted (stop).
        unfinished = result.exit_code is None and not stream.turn_completed
        if result.exit_code not in (0, None) or unfinished:
            if stream.error:
                return classify_error(stream.error), stream.error
            if stream.retrying:  # ended while it was still trying to reach its API
                return "api_error", f"codex could not reach its API: {stream.retrying}"
            tail = last_lines("\n".join(stderr), 3)
            detail = f": {tail}" if tail else ""
            return "exit", f"codex exited with code {result.exit_code}{detail}"
        if stream.error and not stream.turn_completed:
            # A fatal stream error that still exited 0: the turn never finished.
            return classify_error(stream.error), stream.error
        return None, None

    @staticmethod
    def _cost(ctx: EngineContext, tokens: dict[str, int] | None) -> Decimal | None:
        """Exact dollars from configured prices (to the micro-dollar); None (charge the
        reservation) when unpriced."""
        price_in = _price(ctx.config("engine.codex.costPerMTokIn"))
        price_out = _price(ctx.config("engine.codex.costPerMTokOut"))
        if tokens is None or price_in is None or price_out is None:
            return None
        # cached_input_tokens is a subset of input_tokens (OpenAI usage semantics).
        price_cached = _price(ctx.config("engine.codex.costPerMTokCachedIn"))
        cached = tokens.get("cached_input", 0) if price_cached is not None else 0
        per_million = ((tokens.get("input", 0) - cached) * price_in + cached * (price_cached or 0)
                       + tokens.get("output", 0) * price_out)
        return money.usd(per_million / 1_000_000)


def _sandbox_setting(config: ConfigReader) -> str:
    return (config("engine.codex.sandbox") or "workspace-write").strip().lower()


def _sandbox_in_effect(config: ConfigReader) -> str:
    """The setting as `_sandbox_args` applies it: anything it does not know runs workspace-write."""
    setting = _sandbox_setting(config)
    return setting if setting in SANDBOX_WORDS else "workspace-write"


def _confined(ctx: EngineContext) -> bool:
    """Does this run go under git-subtask's isolation (the worker sets the variable for it)?"""
    return (ctx.env.get(ACTIVE_ENV) or "none") != "none"


def _price(value: str | None) -> Decimal | None:
    """A configured price in dollars per million tokens, exact as written ("0.075"); None when
    unset or not a finite amount >= 0."""
    price = money.usd(value) if isinstance(value, str) else None
    return price if price is not None and price >= 0 else None
