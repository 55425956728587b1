"""Test doubles for the claude engine: a fake Claude Code CLI and a fake Anthropic Messages API.

`write_fake_cli` writes an executable that speaks the CLI's stream-json protocol to
`claude_agent_sdk` (the initialize control request, then one scripted conversation), so the
engine's mapping of messages and errors is tested without the real CLI. `FakeMessagesAPI` is a
local HTTP server for the *real* bundled CLI (ANTHROPIC_BASE_URL), scripted turn by turn.

Nothing here reaches the network: the fake CLI talks only over pipes, the fake API listens on
127.0.0.1 only.
"""

from __future__ import annotations

import json
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SCENARIOS = ("success", "budget", "max_turns", "auth", "usage_limit", "api_error", "hang",
             "hang_stubborn", "crash", "session")
FAKE_SESSION = "11111111-2222-3333-4444-555555555555"
MAIN_MARKER = "background worker on job"  # from the engine's DELEGATION_PROTOCOL

# The script below runs under the test's interpreter; the scenario and the argv file are
# substituted in. It answers every control request, and after the user message plays the scenario.
_CLI_SCRIPT = r'''
import json, os, signal, subprocess, sys, time, uuid

SCENARIO = __SCENARIO__
RECORD = __RECORD__
SID = __SESSION__

with open(RECORD, "w") as f:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid(),
               "env": {k: v for k, v in os.environ.items()
                       if k.startswith(("ANTHROPIC", "CLAUDE", "SUBTASK", "GIT_"))}}, f)

def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()

def assistant(content, error=None, stop="end_turn"):
    msg = {"type": "assistant", "parent_tool_use_id": None, "session_id": SID,
           "uuid": str(uuid.uuid4()),
           "message": {"id": "msg_" + uuid.uuid4().hex[:8], "model": "claude-fake",
                       "role": "assistant", "content": content, "stop_reason": stop,
                       "usage": {"input_tokens": 10, "output_tokens": 5}}}
    if error:
        msg["error"] = error
    out(msg)

def tool_result(tool_id, content, is_error):
    out({"type": "user", "parent_tool_use_id": None, "session_id": SID,
         "uuid": str(uuid.uuid4()),
         "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id,
                                                  "content": content, "is_error": is_error}]}})

def result(subtype="success", is_error=False, text=None, cost=0.0123, turns=3, **extra):
    msg = {"type": "result", "subtype": subtype, "is_error": is_error, "duration_ms": 1200,
           "duration_api_ms": 900, "num_turns": turns, "session_id": SID,
           "total_cost_usd": cost, "uuid": str(uuid.uuid4()),
           "usage": {"input_tokens": 100, "output_tokens": 50,
                     "cache_read_input_tokens": 10, "cache_creation_input_tokens": 5}}
    if text is not None:
        msg["result"] = text
    msg.update(extra)
    out(msg)

def bash(tool_id, command):
    assistant([{"type": "text", "text": "Running " + command},
               {"type": "tool_use", "id": tool_id, "name": "Bash",
                "input": {"command": command, "description": "run it"}}], stop="tool_use")

def wait_for_eof():
    for _ in sys.stdin:
        pass

def play():
    out({"type": "system", "subtype": "init", "session_id": SID, "model": "claude-fake",
         "cwd": os.getcwd(), "tools": ["Bash", "Read"], "claude_code_version": "2.1.332",
         "permissionMode": "acceptEdits", "uuid": str(uuid.uuid4())})
    if SCENARIO.startswith("hang"):
        if SCENARIO == "hang_stubborn":  # only SIGKILL ends it
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen(["sleep", "300"])
        with open(RECORD + ".child", "w") as f:
            f.write(str(child.pid))
        while True:
            time.sleep(1)
    if SCENARIO == "crash":
        sys.stderr.write("boom: the fake CLI crashed\n")
        sys.exit(3)
    if SCENARIO == "session":
        session()
    bash("toolu_ok", "git status")
    tool_result("toolu_ok", "On branch main\nnothing to commit", False)
    bash("toolu_bad", "make test")
    tool_result("toolu_bad", "Exit code 2\nmake: *** No rule to make target 'test'.", True)
    if SCENARIO == "success":
        final = "Checked the tree.\nNo tests to run.\nSTATUS: done"
        assistant([{"type": "text", "text": final}])
        result(text=final, stop_reason="end_turn", terminal_reason="completed")
        wait_for_eof()
        sys.exit(0)
    if SCENARIO == "budget":
        result("error_max_budget_usd", True, cost=0.51,
               errors=["Reached maximum budget ($0.5)"])
    elif SCENARIO == "max_turns":
        result("error_max_turns", True, errors=["Reached maximum number of turns (3)"],
               terminal_reason="max_turns")
    elif SCENARIO == "auth":
        text = "Invalid API key \u00b7 Please run /login"
        assistant([{"type": "text", "text": text}], error="authentication_failed")
        result(text=text, is_error=True, cost=0, api_error_status=401,
               terminal_reason="api_error")
    elif SCENARIO == "usage_limit":
        text = "You've hit your limit \u00b7 resets 5pm (UTC)"
        assistant([{"type": "text", "text": text}], error="rate_limit")
        result(text=text, is_error=True, cost=0, api_error_status=429,
               terminal_reason="api_error")
    elif SCENARIO == "api_error":
        text = ('API Error: 529 {"type":"error","error":{"type":"overloaded_error",'
                '"message":"Overloaded"}}')
        assistant([{"type": "text", "text": text}], error="server_error")
        result(text=text, is_error=True, api_error_status=529, terminal_reason="api_error")
    # The real CLI exits non-zero on purpose after an error result.
    sys.exit(1)

def session():
    """One run of a session whose cost Claude Code reports as a running total: what this run's
    calls cost (`<record>.run-cost`, dollars as text) on top of the session's earlier runs when
    resumed, kept in `<record>.session-cost` as the transcript keeps it, also for a run that dies
    after its answer without a result (`<record>.die` exists: killed, as far as anyone can tell)."""
    resumed = any(a == "--resume" or a.startswith("--resume=") for a in sys.argv[1:])
    kept = RECORD + ".session-cost"
    earlier = float(open(kept).read()) if resumed and os.path.exists(kept) else 0.0
    total = earlier + float(open(RECORD + ".run-cost").read())
    with open(kept, "w") as f:
        f.write(repr(total))
    assistant([{"type": "text", "text": "Working on it."}])
    if os.path.exists(RECORD + ".die"):
        os.kill(os.getpid(), signal.SIGKILL)
    final = "Did this run's part.\nSTATUS: done"
    assistant([{"type": "text", "text": final}])
    result(text=final, cost=total, stop_reason="end_turn", terminal_reason="completed")
    wait_for_eof()
    sys.exit(0)

for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    msg = json.loads(line)
    if msg.get("type") == "control_request":
        out({"type": "control_response",
             "response": {"subtype": "success", "request_id": msg["request_id"],
                          "response": {"commands": [], "models": [], "account": {},
                                       "output_style": "default"}}})
    elif msg.get("type") == "user":
        play()
sys.exit(0)
'''


def write_fake_cli(path: Path | str, scenario: str) -> Path:
    """Write an executable fake Claude Code CLI for `scenario`; its argv lands in `<path>.json`.

    The record (`read_record(path)`) holds argv, cwd, pid and the ANTHROPIC/CLAUDE/GIT env. The
    "hang" scenarios start a `sleep` child (pid in `<path>.json.child`) and never answer;
    "hang_stubborn" also ignores SIGTERM. "session" reports a running total over resumed runs
    (see its `session()`: `<path>.json.run-cost` says what one run costs).
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
    path = Path(path)
    source = (_CLI_SCRIPT.replace("__SCENARIO__", repr(scenario))
              .replace("__RECORD__", repr(str(record_path(path))))
              .replace("__SESSION__", repr(FAKE_SESSION)))
    path.write_text(f"#!{sys.executable}\n{source}")
    path.chmod(0o755)
    return path


def record_path(cli: Path | str) -> Path:
    return Path(f"{cli}.json")


def read_record(cli: Path | str) -> dict[str, Any]:
    return json.loads(record_path(cli).read_text())


# --- the fake Messages API -------------------------------------------------------------------


def api_error(status: int, kind: str, message: str) -> tuple[int, dict[str, Any]]:
    """A Messages API error response, for `FakeMessagesAPI(fail_main=...)`."""
    return status, {"type": "error", "error": {"type": kind, "message": message}}


def text_turn(text: str) -> dict[str, Any]:
    return {"text": text}


def tool_turn(name: str, tool_input: dict[str, Any], text: str = "") -> dict[str, Any]:
    return {"tool": name, "input": tool_input, "text": text}


def cli_options(argv: list[str]) -> dict[str, str | bool]:
    """The options an argv gives Claude Code, read as its own parser (commander) reads them.

    `--flag value` and `--flag=value` mean the same to the CLI; SDK releases have used both, so
    tests ask what reached the CLI, never how the SDK spelled it. A flag followed by another flag
    (or nothing) is a switch (True). The last occurrence wins, as in commander.
    """
    options: dict[str, str | bool] = {}
    index = 0
    while index < len(argv):
        item = argv[index]
        index += 1
        if not item.startswith("--"):
            continue
        name, eq, value = item.partition("=")
        if eq:
            options[name] = value
        elif index < len(argv) and not argv[index].startswith("--"):
            options[name] = argv[index]
            index += 1
        else:
            options[name] = True
    return options


class FakeMessagesAPI:
    """A local Anthropic Messages API for the real CLI, scripted with a list of turns.

    A turn is a dict (`text_turn`, `tool_turn`) or a callable taking the request body and
    returning one, for answers that depend on earlier tool results.

    A request belongs to the main conversation when it carries tools and its system prompt holds
    the delegation protocol; its step is the number of assistant messages already in its history,
    so retries and side calls never shift the script. Side calls (titles, quota, token counts,
    small-model helpers) get a short text answer. `fail_main` answers every main request with an
    API error instead. Use as a context manager; `.url`, `.requests`.
    """

    def __init__(self, turns: list[Any], marker: str = MAIN_MARKER,
                 fail_main: tuple[int, dict[str, Any]] | None = None,
                 usage: tuple[int, int] = (120, 20)) -> None:
        self.turns = turns
        self.usage = usage  # (input, output) tokens each main call reports
        self.marker = marker
        self.fail_main = fail_main  # (HTTP status, error body) for every main request
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeMessagesAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def main_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if self.is_main(r)]

    def is_main(self, body: dict[str, Any]) -> bool:
        """Carries tools, and the marker is in its system prompt or names one of its tools."""
        tools = body.get("tools") or []
        return bool(tools) and (self.marker in _system_text(body.get("system"))
                                or any(t.get("name") == self.marker for t in tools))

    def _record(self, path: str, body: dict[str, Any] | None) -> None:
        with self._lock:
            self.paths.append(path)
            if body is not None:
                self.requests.append(body)

    def reply_for(self, body: dict[str, Any]) -> dict[str, Any]:
        """The scripted turn for a main-conversation request, or a short side answer."""
        if not self.is_main(body):
            return text_turn("ok")
        step = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        if step < len(self.turns):
            turn = self.turns[step]
            # A callable turn reads the request (e.g. an id from the last tool_result) to answer.
            return turn(body) if callable(turn) else turn
        return text_turn("Nothing left to do.\nSTATUS: done")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                api._record(self.path, None)
                self._send_json(200, {"data": [], "has_more": False})

            def do_HEAD(self) -> None:
                api._record(self.path, None)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                api._record(self.path, body)
                path = self.path.split("?")[0]
                if path.endswith("/count_tokens"):
                    self._send_json(200, {"input_tokens": 42})
                elif path.endswith("/v1/messages"):
                    self._answer_messages(body)
                else:
                    self._send_json(200, {})

            def _answer_messages(self, body: dict[str, Any]) -> None:
                if api.fail_main and api.is_main(body):
                    self._send_json(*api.fail_main)
                    return
                turn = api.reply_for(body)
                model = str(body.get("model") or "claude-sonnet-4-5")
                usage = api.usage if api.is_main(body) else (120, 20)
                if body.get("stream"):
                    payload = _sse(turn, model, usage).encode()
                    self._send(200, "text/event-stream", payload)
                else:
                    self._send_json(200, _message(turn, model, usage))

            def _send_json(self, status: int, obj: Any) -> None:
                self._send(status, "application/json", json.dumps(obj).encode())

            def _send(self, status: int, content_type: str, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.send_header("request-id", "req_fake_" + uuid.uuid4().hex[:8])
                self.end_headers()
                self.wfile.write(payload)

        return Handler


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    return ""


def _blocks(turn: dict[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if turn.get("text"):
        blocks.append({"type": "text", "text": turn["text"]})
    if turn.get("tool"):
        blocks.append({"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:12],
                       "name": turn["tool"], "input": turn.get("input", {})})
    return blocks


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def _message(turn: dict[str, Any], model: str, usage: tuple[int, int] = (120, 20)) -> dict[str, Any]:
    blocks = _blocks(turn)
    return {"id": "msg_" + uuid.uuid4().hex[:12], "type": "message", "role": "assistant",
            "model": model, "content": blocks, "stop_sequence": None,
            "stop_reason": "tool_use" if turn.get("tool") else "end_turn", "usage": _usage(*usage)}


def _sse(turn: dict[str, Any], model: str, usage: tuple[int, int] = (120, 20)) -> str:
    """The turn as the streaming events of one Messages API response."""
    message = _message(turn, model, usage)
    start = dict(message, content=[], stop_reason=None, usage=_usage(usage[0], 1))
    events: list[tuple[str, dict[str, Any]]] = [("message_start",
                                                  {"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        events += _block_events(index, block)
    events.append(("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": message["stop_reason"],
                                               "stop_sequence": None},
                                     "usage": {"output_tokens": usage[1]}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)


def _block_events(index: int, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    if block["type"] == "text":
        first = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": block["text"]}
    else:
        first = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    return [("content_block_start", {"type": "content_block_start", "index": index,
                                     "content_block": first}),
            ("content_block_delta", {"type": "content_block_delta", "index": index,
                                     "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": index})]
