"""The MCP server and how it handles a call: the SDK's MCPServer (`server`), the `tool` decorator
that turns a tool's `replies.Reply` or `SubtaskError` into the CLI's words, argument errors worded
like the CLI's usage errors, `open_repo`, and `Attention` (the client told its jobs' events).
The tools themselves are declared in `subtask.faces.mcp_tools`, which registers them on `server`
on import: import that module, not this one, for a server with its tools.

Invariants:
- Every text a tool returns, errors included, passes `render.safe` (in `tool`): an agent's user
  reads it too, and a job's text may come from a model or a teammate.
- A `SubtaskError` becomes a tool error (isError) with the CLI's words: `error: ...` and `hint: ...`,
  each CLI flag that is a tool's parameter spelt as the parameter (`mcp_words`).
- Never give an MCP tool's reply words the CLI would not print, nor JSON its `--json` would not,
  because an agent and a person must read the same answer: both come from one `replies.Reply`
  (`tests/test_mcp.py::test_review_tools_answer_the_clis_words_and_json`). The structured content
  carries the words too (`reply`, first), because Claude Code shows a model the structured part
  instead of the text when both are present. Tools declare no output schema
  (`structured_output=False`).
- Never let an MCP argument error reach an agent as pydantic's report, nor drop an argument a tool
  does not take, because a misspelt `verfiy` would start a job nobody checks: a wrong type, a
  missing or unknown argument reads like the CLI's usage errors (`Server.call_tool`), and an
  unknown argument is refused.
- `PARAMETERS` holds every tool's parameters (`tool` adds each): register tools before answering.
- Nothing here prints: stdout is the protocol's. `Attention` sends on the client's session only,
  and a failed send forgets the session, never ends a call.
- Never spell a CLI flag in an MCP tool's words, because an agent calls tools: `--best-of` is
  `best_of` there (`mcp_calls.mcp_words`; a whole `git subtask …` command in a hint stays one)
  (`tests/test_mcp.py::test_argument_errors_name_the_tools_parameters_never_the_clis_flags`).
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import ValidationError

from subtask import __version__, api
from subtask import words as render
from subtask.faces import replies
from subtask.model import lazyre, start_options
from subtask.model.errors import SubtaskError, from_os_error


def _guide_body() -> str:
    """The agent's guide (subtask/guide/SKILL.md, which `git subtask install` puts where a client
    reads skills) without its front matter: the server's instructions are the same words."""
    text = (Path(__file__).parents[1] / "guide" / "SKILL.md").read_text(encoding="utf-8")
    if text.startswith("---\n"):
        text = text[text.index("\n---\n", 4) + 5:]
    return text.strip()


INSTRUCTIONS = _guide_body()


class Server(MCPServer):
    """The SDK's server, whose tool-argument errors read like the CLI's.

    The SDK checks a call's arguments against the tool's signature (pydantic) before the tool
    runs and answers a mistake with pydantic's own report; an agent reads `error: timeout must be
    a number, not 'soon'` and a hint naming the tool's parameters instead, as the CLI says it.
    An argument the tool does not take is refused the same way (the SDK would drop it silently,
    and a misspelt `verfiy` would start a job nobody checks).
    """

    _schemas: dict[str, dict] | None = None

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        if context is not None:
            ATTENTION.listen(context)
        schema = (await self._input_schemas()).get(name)
        if schema is not None:
            unknown = sorted(set(arguments or {}) - set(schema.get("properties", {})))
            if unknown:
                return _tool_error(_error_text(SubtaskError(
                    "usage", f"{name} takes no {', '.join(map(repr, unknown))}", hint=_takes(name, schema))))
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError) and schema is not None:
                return _tool_error(_error_text(_argument_error(name, schema, exc.__cause__)))
            raise

    async def _input_schemas(self) -> dict[str, dict]:
        if self._schemas is None:
            self._schemas = {t.name: t.input_schema for t in await self.list_tools()}
        return self._schemas


def _takes(name: str, schema: dict) -> str:
    required = set(schema.get("required", []))
    names = [f"{p} (required)" if p in required else p for p in schema.get("properties", {})]
    return f"{name} takes: {', '.join(names)}"


def _expected(prop: dict) -> str:
    """What a parameter's JSON schema accepts, in words: `a number`, `a string or a list of strings`."""
    if "enum" in prop:
        return "one of " + ", ".join(map(str, prop["enum"]))
    if "anyOf" in prop:
        words = [_expected(p) for p in prop["anyOf"] if p.get("type") != "null"]
        return " or ".join(dict.fromkeys(words))
    kind = prop.get("type")
    if kind == "array":
        return "a list of " + _expected(prop.get("items", {})).removeprefix("a ").removeprefix("an ") + "s"
    if not isinstance(kind, str):
        return "a value"
    return {"number": "a number", "integer": "a whole number", "boolean": "true or false", "string": "a string",
            "object": "an object"}.get(kind, "a value")


def _argument_error(name: str, schema: dict, exc: ValidationError) -> SubtaskError:
    props = schema.get("properties", {})
    messages = []
    for error in exc.errors(include_url=False):
        field = str(error["loc"][0]) if error["loc"] else "?"
        if error["type"] == "missing":
            text = f"{name} needs {field}"
        elif error["type"] == "too_short":
            text = f"{field} must not be empty"
        else:
            text = f"{field} must be {_expected(props.get(field, {}))}, not {error.get('input')!r}"
        if text not in messages:
            messages.append(text)
    return SubtaskError("usage", "; ".join(messages), hint=_takes(name, schema))


server = Server("subtask", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING")


# ---------------------------------------------------------------- plumbing

def _error_text(exc: SubtaskError) -> str:
    """The CLI's `error: ...` and `hint: ...`, its flags spelt as this face's parameters."""
    hint = f"\nhint: {mcp_words(exc.hint)}" if exc.hint else ""
    return f"error: {mcp_words(exc.message)}{hint}"


# Every tool's parameters (`tool` adds each tool's), and a start_many item's fields.
PARAMETERS: set[str] = {option.name for option in start_options.OPTIONS}
_CLI_COMMAND = lazyre.compile(r"git[ -]subtask(?: [^\s;()]+)*")
_CLI_FLAG = lazyre.compile(r"(?<![\w'\"-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)\b(?!-)")


def mcp_words(text: str) -> str:
    """`text` (the CLI's words: `--best-of needs --verify`) with each flag that is a parameter of
    a tool spelt as the parameter (`best_of needs verify`): an agent calls tools, not the CLI.
    A whole `git subtask ...` command line stays as it is: it is a command, and says so."""
    def parameter(flag: re.Match) -> str:
        name = flag[1].replace("-", "_")
        return name if name in PARAMETERS else flag[0]

    def respell(prose: str) -> str:
        return _CLI_FLAG.sub(parameter, prose)

    out, done = [], 0
    for command in _CLI_COMMAND.finditer(text):
        out += [respell(text[done:command.start()]), command[0]]
        done = command.end()
    return "".join([*out, respell(text[done:])])


def _tool_error(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=render.safe(text))], is_error=True)


def tool(name: str, *, read_only: bool = False, destructive: bool = False, title: str | None = None):
    """Register `fn` as a tool: its `Reply` becomes the text (the CLI's words) and the structured
    content (the CLI's `--json`); a SubtaskError becomes a tool error with the CLI's words."""

    def decorate(fn: Callable[..., Awaitable[replies.Reply]]) -> Callable[..., Awaitable[replies.Reply]]:
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> CallToolResult:
            try:
                reply = await fn(*args, **kwargs)
            except SubtaskError as exc:
                return _tool_error(_error_text(exc))
            except Exception as exc:  # same one-line report as the CLI; the traceback goes to stderr
                said = from_os_error(exc) if isinstance(exc, OSError) else None
                if said is not None:
                    return _tool_error(_error_text(said))
                if os.environ.get("SUBTASK_DEBUG"):
                    traceback.print_exc(file=sys.stderr)
                return _tool_error(f"error: unexpected {type(exc).__name__}: {exc}")
            words = render.safe(reply.full_text())
            if reply.failed:  # it did none of what it was asked: an error, as a refused merge is
                return _tool_error(mcp_words(f"error: {reply.failed}\n{words}"))
            # Claude Code shows a model the structured content instead of the text: the words go first in it (`reply`).
            return CallToolResult(content=[TextContent(type="text", text=words)],
                                  structured_content={"reply": words, **reply.data})

        PARAMETERS.update(inspect.signature(fn).parameters)
        annotations = ToolAnnotations(title=title, read_only_hint=read_only, destructive_hint=destructive,
                                      idempotent_hint=read_only or None, open_world_hint=False)
        server.add_tool(wrapper, name=name, annotations=annotations, structured_output=False)
        return fn

    return decorate


def open_repo(path: str | None) -> api.Repo:
    """The repository a tool works on: an absolute path to a work tree, or the server's directory.
    From then on the client is told its jobs' events (`ATTENTION`)."""
    if path is None or path == "":
        where = api.repo_at(os.environ.get("SUBTASK_REPO") or os.getcwd())
    elif not os.path.isabs(path):
        raise SubtaskError("usage", f"repo must be an absolute path to a git work tree, not {path!r}",
                           hint="give the full path, e.g. /home/me/project, or leave repo out for "
                                f"the server's directory ({os.getcwd()})")
    else:
        where = api.repo_at(path)
    ATTENTION.watch(where.state_dir)
    return where


class Attention:
    """A log notification to the connected client for each job event `ops/notify` tells (a job
    ended, failed verify, waits for a reply, stalled), while it is connected: the state folders
    of the repositories its calls named are watched (their `notify.jsonl`, from the end it had
    when first named), every `LOOK` seconds, by one thread that sends on the client's session."""

    LOOK = 0.5

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._feeds: dict[Path, tuple[int, int]] = {}  # state folder -> (inode, offset) of notify.jsonl
        # The latest call's session (a per-request proxy the SDK makes; a handshake-era session
        # sends on its connection) and its event loop's token: a stdio server has one client.
        self._session: tuple[Any, Any] | None = None
        self._thread: threading.Thread | None = None

    def listen(self, context: Context) -> None:
        """Called in the event loop with a call's context: its client is told from now on."""
        try:
            session, token = context.session, anyio.lowlevel.current_token()
        except Exception:
            return
        with self._lock:
            self._session = (session, token)

    def watch(self, state_dir: Path) -> None:
        with self._lock:
            if state_dir not in self._feeds:
                self._feeds[state_dir] = api.notify_feed_end(state_dir)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="subtask-attention", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.LOOK)
            with self._lock:
                feeds = dict(self._feeds)
            for state_dir, seen in feeds.items():
                lines, now = api.notify_feed_since(state_dir, seen)
                with self._lock:
                    self._feeds[state_dir] = now
                for line in lines:
                    self._tell(line)

    def _tell(self, event: dict) -> None:
        level = "info" if event.get("event") == "ended" and event.get("state") == "done" else "warning"
        data = {"message": render.safe_line(f"{event.get('event')}: {event.get('summary')}"),
                **{k: event.get(k) for k in ("job", "event", "state", "reason", "attempt", "repo")}}
        with self._lock:
            listening = self._session
        if listening is None:
            return
        session, token = listening
        try:
            with warnings.catch_warnings():  # the SDK marks logging deprecated (SEP-2577): still sent
                warnings.simplefilter("ignore")
                anyio.from_thread.run(functools.partial(session.send_log_message, level=level, data=data,
                                                        logger="subtask"), token=token)
        except Exception:  # gone: its connection closed
            with self._lock:
                if self._session is listening:
                    self._session = None


ATTENTION = Attention()
