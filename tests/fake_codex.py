"""A fake OpenAI Responses API for the *real* `codex` binary (npm's `@openai/codex`), offline.

codex is pointed at it through its own config (`CODEX_HOME/config.toml`: a custom
`model_provider` whose `base_url` is this server and whose `env_key` names a fake key), the
way a user with their own provider runs it. Each POST to `/v1/responses` is one model call;
it is answered with the next scripted turn as a stream of server-sent events, each with the
usage given (input and output tokens per call), so a test knows exactly what one attempt spent.
Nothing here reaches the network: the server listens on 127.0.0.1 only.

`codex_env` makes the CODEX_HOME and the environment for a run; `real_codex()` finds the
binary or None (the tests that need it skip, saying so).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FAKE_KEY_VAR = "SUBTASK_FAKE_CODEX_KEY"


def real_codex() -> str | None:
    """The real codex binary on PATH, or None; never the suite's guard stand-in (conftest), which
    comes first on PATH in every test."""
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        found = shutil.which("codex", path=folder) if folder else None
        if found and b"test stand-in" not in Path(found).read_bytes()[:4096]:
            return found
    return None


def command_turn(cmd: str) -> dict[str, Any]:
    """A turn that runs a shell command through codex's `exec_command` tool."""
    return {"tool": "exec_command", "input": {"cmd": cmd}}


def text_turn(text: str) -> dict[str, Any]:
    return {"text": text}


class FakeResponsesAPI:
    """A local Responses API scripted with a list of turns, one per model call, in order.

    After the script, every call gets a final "STATUS: done" message. `hold` (a threading.Event)
    makes every call wait until it is set before answering: the engine then goes silent.
    """

    def __init__(self, turns: list[dict[str, Any]], hold: threading.Event | None = None,
                 usage: tuple[int, int] = (1000, 50)) -> None:
        self.turns = list(turns)
        self.hold = hold
        self.usage = usage  # (input, output) tokens each call reports
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> FakeResponsesAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.hold is not None:
            self.hold.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _next_turn(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.requests.append(body)
            step = len(self.requests) - 1
        return self.turns[step] if step < len(self.turns) else text_turn("Nothing left to do.\nSTATUS: done")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # model lists and the like
                self._send(200, "application/json", json.dumps({"data": [], "models": []}).encode())

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                if not self.path.split("?")[0].endswith("/responses"):
                    self._send(404, "application/json", b"{}")
                    return
                turn = api._next_turn(body)
                if api.hold is not None:
                    api.hold.wait(timeout=120)
                payload = "".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
                                  for event in _events(turn, api.usage)).encode()
                self._send(200, "text/event-stream", payload)

            def _send(self, status: int, content_type: str, payload: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client went away (a stopped engine)

        return Handler


def _events(turn: dict[str, Any], usage: tuple[int, int]) -> list[dict[str, Any]]:
    """One model response as the Responses API streams it."""
    rid = "resp_" + uuid.uuid4().hex[:12]
    events: list[dict[str, Any]] = [{"type": "response.created", "response": {"id": rid}}]
    if turn.get("tool"):
        events.append({"type": "response.output_item.done",
                       "item": {"type": "function_call", "id": "fc_" + uuid.uuid4().hex[:8],
                                "call_id": "call_" + uuid.uuid4().hex[:8], "name": turn["tool"],
                                "arguments": json.dumps(turn["input"])}})
    if turn.get("text"):
        events.append({"type": "response.output_item.done",
                       "item": {"type": "message", "role": "assistant", "id": "msg_" + uuid.uuid4().hex[:8],
                                "content": [{"type": "output_text", "text": turn["text"]}]}})
    events.append({"type": "response.completed",
                   "response": {"id": rid, "usage": {
                       "input_tokens": usage[0], "input_tokens_details": {"cached_tokens": 0},
                       "output_tokens": usage[1], "output_tokens_details": {"reasoning_tokens": 0},
                       "total_tokens": usage[0] + usage[1]}}})
    return events


def codex_env(home: Path, url: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which the real codex reaches only the fake API: its own CODEX_HOME whose
    config.toml names a custom provider (`env_key` = a fake key, set here), no OpenAI key."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        'model = "gpt-fake"\n'
        'model_provider = "fake"\n\n'
        '[model_providers.fake]\n'
        'name = "fake"\n'
        f'base_url = "{url}"\n'
        f'env_key = "{FAKE_KEY_VAR}"\n'
        'wire_api = "responses"\n'
        'request_max_retries = 0\n'
        'stream_max_retries = 0\n')
    env = {k: v for k, v in (base if base is not None else os.environ).items()
           if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(HOME=str(home), CODEX_HOME=str(codex_home), **{FAKE_KEY_VAR: "sk-fake-codex"})
    return env
