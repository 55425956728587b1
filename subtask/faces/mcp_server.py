"""The MCP server's process: `subtask-mcp`, `git subtask mcp`, `python -m subtask.faces.mcp_server`.

Owns the stdio pipes and the first second of a session. Clients (Claude Code and others) spawn
the server when a session starts and send `initialize`, `notifications/initialized` and
`tools/list` at once; importing the mcp SDK, pygit2 and building the tools takes ~0.65 s. So this
module answers those from subtask/faces/mcp_cache.json (the SDK's own replies, recorded by
`subtask.faces.mcp_tools.describe`) with the standard library alone, and loads the SDK meanwhile, in
the same process. The server is still `subtask.faces.mcp_tools.server` (MCPServer): every tool call,
progress notification and error comes from the SDK.

Invariants:
- Standard library only until the first `initialize` is answered (or found unanswerable), and
  its public surface only (`json`, never CPython's private `_json`); `threading` and `queue`
  come after the reply (tests/test_mcp.py).
- The front end answers at most: the first line, when it is a plain `initialize` and the cache
  was made with the installed SDK; and, until the SDK reads its first line, list requests
  without params (`tools/list` ...) on a session it initialized. Versions are negotiated as the
  SDK does: the client's version if the SDK handshakes with it, else the SDK's latest.
- The SDK sees every line read, in order, except the list requests the front end answered; so
  its session is initialized by the very `initialize` the client sent. Its own reply to that
  request is dropped (and reported on stderr if it differs from the cached one). JSON-RPC lets
  replies of different ids arrive in any order.
- Anything unexpected (first line not an initialize, cache missing or made with another SDK)
  means the front end answers nothing: the SDK gets every byte read so far, as if it had read
  them itself.
- Nothing but protocol on stdout: while serving, fd 0 reads /dev/null and fd 1 writes to stderr;
  the protocol uses private duplicates (close-on-exec) that no child or stray print can reach.
- A client that closes stdin before the SDK is up, with nothing asked of it but what the front
  end answered, gets a server that exits at once instead of after loading the SDK.
- A line that is not JSON at all gets JSON-RPC's parse error (-32700, id null) from the front
  end, and the SDK never sees it (the SDK would drop it in silence, leaving the client waiting).
- SUBTASK_MCP_FRONT=0 (and any platform without POSIX descriptors) skips all of this: the SDK's
  own `MCPServer.run("stdio")`.
- The workers' fork server (`subtask.worker.zygote`) is forked while the process has only its main
  thread: after the first reply, before the reader thread (or before the SDK, without the front
  end). Its fork costs ~1 ms; it imports the worker's modules only once the SDK is loaded (or at
  the first spawn), so they do not compete with the SDK's import for CPU at start-up.
"""

from __future__ import annotations

# Not `typing` (2-3 ms: annotations stay strings, and `object` serves for Any), nor, before the
# first reply, `threading` and `queue` (~5 ms).
import json
import os
import sys

from subtask.faces.mcp_versions import installed_versions

CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mcp_cache.json")
# Capabilities whose value the SDK validates as an object: anything else could make it refuse an
# initialize the front end had accepted, so such a request is left to the SDK.
OBJECT_CAPABILITIES = ("experimental", "sampling", "elicitation", "roots", "extensions", "tasks")


def __getattr__(name: str) -> object:
    """`from subtask.faces.mcp_server import server` still gives the MCPServer (loading the SDK then)."""
    if name == "server":
        from subtask.faces.mcp_tools import server

        return server
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------- JSON before the SDK

def loads(data: bytes | str) -> object:
    return json.loads(data)


def dumps(value: object, ensure_ascii: bool = True) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=ensure_ascii)


# ---------------------------------------------------------------- the cache

def load_cache() -> dict | None:
    """The cached replies, or None when they may not be what the installed SDK would say."""
    try:
        with open(CACHE, "rb") as f:
            cache = loads(f.read())
        if cache["sdk"] != installed_versions():
            return None
        return cache
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ---------------------------------------------------------------- reading messages

def parse(line: bytes) -> object:
    try:
        return loads(line)
    except ValueError:  # UnicodeDecodeError included
        return None


PARSE_ERROR = -32700


def parse_error_line(line: bytes) -> bytes | None:
    """The parse-error reply a line that is not JSON deserves; None for JSON (or a blank line)."""
    if not line.strip():
        return None
    try:
        loads(line)
        return None
    except ValueError as exc:  # UnicodeDecodeError included
        body = {"jsonrpc": "2.0", "id": None,
                "error": {"code": PARSE_ERROR, "message": f"Parse error: {exc}"[:200]}}
        return (dumps(body) + "\n").encode()


def is_plain_initialize(message: object) -> bool:
    """An initialize the SDK is sure to accept: the front end may answer it for the SDK."""
    if not (isinstance(message, dict) and message.get("jsonrpc") == "2.0" and message.get("method") == "initialize"):
        return False
    ident, params = message.get("id"), message.get("params")
    if isinstance(ident, bool) or not isinstance(ident, int | str) or not isinstance(params, dict):
        return False
    client, capabilities = params.get("clientInfo"), params.get("capabilities")
    return (isinstance(params.get("protocolVersion"), str) and isinstance(capabilities, dict)
            and all(isinstance(capabilities.get(k, {}), dict) for k in OBJECT_CAPABILITIES)
            and isinstance(client, dict) and isinstance(client.get("name"), str)
            and isinstance(client.get("version"), str)
            and all(isinstance(client.get(k, ""), str) for k in ("title", "description", "websiteUrl"))
            and isinstance(client.get("icons", []), list))


def is_notification(message: object) -> bool:
    return isinstance(message, dict) and "method" in message and "id" not in message


def reply_line(ident: int | str, result: dict) -> bytes:
    """A JSON-RPC reply laid out as the SDK writes it (pydantic's compact JSON, UTF-8)."""
    body = {"jsonrpc": "2.0", "id": ident, "result": result}
    return (dumps(body, ensure_ascii=False) + "\n").encode()


# ---------------------------------------------------------------- the pipes

def _private_dup(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)


class Wire:
    """The client's pipes, moved off fd 0 and 1 so that only the protocol can use them."""

    def __init__(self) -> None:
        self.reader = os.fdopen(_private_dup(0), "rb")
        self.out = _private_dup(1)
        import _thread

        self.lock = _thread.allocate_lock()  # the front end and the SDK's writer share the pipe
        # Divert the standard descriptors as the SDK's stdio transport does: children read EOF,
        # and a stray print lands on stderr, not in the middle of a JSON-RPC frame.
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)

    def read_line(self) -> bytes:
        """One line from the client, b"" at end of input."""
        return self.reader.readline()

    def write(self, data: bytes) -> None:
        with self.lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self.out, view):]


# ---------------------------------------------------------------- the front end

class Front:
    """Answers what it can from the cache and queues every other line for the SDK."""

    def __init__(self, wire: Wire, cache: dict | None) -> None:
        self.wire = wire
        self.cache = cache
        self.lines = None  # a queue.Queue of the lines for the SDK (None: end of input), made by `open`
        self.replies: dict[str, dict] | None = None  # cached results for the session's version
        self.drop: tuple[int | str, bytes] | None = None  # (id, our reply) of the initialize we answered
        self.sdk_reading = False
        self.owed = True  # a queued line may need an answer from the SDK

    def open(self, first: bytes) -> None:
        """Handle the first line: answer it if it is a plain initialize, and queue it for the SDK
        (a line that is not JSON gets its parse error instead). The queue comes after the reply."""
        forward = self._answer_first(first)
        import queue

        self.lines = queue.Queue()
        if forward:
            self.lines.put(first or None)

    def _answer_first(self, first: bytes) -> bool:
        if self._malformed(first):
            return False
        message = parse(first) if self.cache else None
        if first and is_plain_initialize(message):
            version = message["params"]["protocolVersion"]
            results = self.cache["results"]
            self.replies = results.get(version) or results[self.cache["latest"]]
            answer = reply_line(message["id"], self.replies["initialize"])
            self.drop = (message["id"], answer)
            self.owed = False
            self.wire.write(answer)
        return True

    def read_rest(self) -> None:
        """The reader thread: every further line, until end of input."""
        while line := self.wire.read_line():
            if self._malformed(line) or (not self.sdk_reading and self._answered(line)):
                continue
            self.lines.put(line)
        self.lines.put(None)
        if not self.sdk_reading and not self.owed:
            # The client is gone and asked nothing the SDK must answer: don't make it wait for
            # the SDK's import. No tool ran, so nothing is left half done.
            sys.stderr.flush()
            os._exit(0)

    def _malformed(self, line: bytes) -> bool:
        """Answer a line that is not JSON with a parse error; True if it was one."""
        error = parse_error_line(line)
        if error is not None:
            self.wire.write(error)
        return error is not None

    def _answered(self, line: bytes) -> bool:
        """Answer a list request from the cache; note whether the SDK will owe a reply otherwise."""
        message = parse(line)
        if self.replies is not None and isinstance(message, dict) and message.get("jsonrpc") == "2.0":
            method, ident = message.get("method"), message.get("id")
            result = self.replies.get(method) if isinstance(method, str) and method != "initialize" else None
            # Only params-less lists: a cursor, or a 2026 `_meta` envelope, is the SDK's to judge.
            if (result is not None and message.get("params") in (None, {})
                    and not isinstance(ident, bool) and isinstance(ident, int | str)):
                self.wire.write(reply_line(ident, result))
                return True
        if not is_notification(message):
            self.owed = True
        return False

    def from_sdk(self, text: str) -> None:
        """Write one of the SDK's lines to the client, except its reply to our initialize."""
        if self.drop is not None:
            message = parse(text.encode())
            if isinstance(message, dict) and "method" not in message and message.get("id") == self.drop[0]:
                ours = loads(self.drop[1])
                self.drop = None
                if message != ours:
                    # stderr only: stdout is the protocol channel
                    sys.stderr.write("subtask-mcp: the SDK's initialize reply differs from the one sent from "
                                     "subtask/faces/mcp_cache.json (regenerate it: python scripts/mcp_cache.py)\n"
                                     f"  sent: {dumps(ours)}\n  sdk:  {text.strip()}\n")
                return
        self.wire.write(text.encode())


class SdkInput:
    """The SDK's stdin: the queued lines, as an async iterator of str."""

    def __init__(self, front: Front) -> None:
        self.front = front

    def __aiter__(self) -> SdkInput:
        return self

    async def __anext__(self) -> str:
        import queue

        import anyio.to_thread

        self.front.sdk_reading = True  # from here on the SDK answers everything
        try:
            line = self.front.lines.get_nowait()
        except queue.Empty:
            line = await anyio.to_thread.run_sync(self.front.lines.get)
        if line is None:
            self.front.lines.put(None)  # end of input stays the end
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


class SdkOutput:
    """The SDK's stdout: each line through `Front.from_sdk`, in a worker thread as the SDK's own
    stdout does (a client that stops reading must not stall the event loop)."""

    def __init__(self, front: Front) -> None:
        self.front = front

    async def write(self, text: str) -> None:
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.front.from_sdk, text)

    async def flush(self) -> None:
        pass


# ---------------------------------------------------------------- entry point

def serve_sdk(front: Front) -> None:
    """Load the SDK and the tools, then serve every queued and further line with them."""
    import anyio

    from subtask.faces.mcp_tools import serve

    preload_zygote()
    load_call_modules()
    anyio.run(serve, SdkInput(front), SdkOutput(front))


def serve_plain() -> None:
    """The SDK's own stdio path, untouched."""
    from subtask.faces.mcp_tools import server

    preload_zygote()
    load_call_modules()
    server.run("stdio")


def start_zygote() -> None:
    """Fork the workers' fork server while this process has one thread (see subtask.worker.zygote)."""
    from subtask.worker import zygote

    try:
        zygote.start()
    except OSError as exc:  # workers start as fresh interpreters then
        sys.stderr.write(f"subtask-mcp: no worker fork server: {exc}\n")


def preload_zygote() -> None:
    """The SDK is loaded: now the zygote may import the worker's modules without delaying it."""
    from subtask.worker import zygote

    if (z := zygote.current()) is not None:
        z.preload()


def load_call_modules() -> None:
    """pygit2 before the first tool call, so that every call reads and writes refs and objects
    in-process (`Repo.objects`): a start through git costs ~10 processes (~20 ms of CPU) for its
    branch, pins and record. ~60 ms once, while the client is still reading `tools/list`. And
    filelock (~30 ms), which a paid start's reservation (the ledger's lock) would otherwise import."""
    import filelock  # noqa: F401

    try:
        import pygit2  # noqa: F401
    except ImportError:
        pass  # the calls that need it say so; the rest ask git


def claim_wire() -> Wire | None:
    if os.environ.get("SUBTASK_MCP_FRONT") == "0" or os.name != "posix":
        return None
    try:
        return Wire()
    except OSError:  # no usable fd 0 or 1 to move: the SDK's transport copes with that
        return None


def main() -> None:
    """Serve on stdio until the client closes the pipe, or a Ctrl-C ends it (130, quietly)."""
    from subtask.model import errors

    errors.interrupt_once()
    try:
        wire = claim_wire()
        if wire is None:
            start_zygote()
            serve_plain()
            return
        front = Front(wire, load_cache())
        front.open(wire.read_line())
        start_zygote()  # after the first reply, before the reader thread: still single-threaded
        import threading

        threading.Thread(target=front.read_rest, name="subtask-mcp-reader", daemon=True).start()
        try:
            serve_sdk(front)
        finally:
            front.lines.put(None)  # frees a worker thread still waiting for a line, so the process can exit
    except KeyboardInterrupt:
        pass
    errors.exit_if_interrupted()


if __name__ == "__main__":
    main()
