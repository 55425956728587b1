"""The MCP server's process: `subtask-mcp`, `git subtask mcp`, `python -m subtask.faces.mcp_server`.

Owns the stdio pipes and the first second of a session. Clients (Claude Code and others) spawn
the server when a session starts and send `initialize`, `notifications/initialized` and
`tools/list` at once; importing the mcp SDK, pygit2 and building the tools takes ~0.65 s. So this
module answers those from subtask/faces/mcp_cache.json (the SDK's own replies, recorded by
`subtask.faces.mcp_tools.describe`) with the standard library alone, and loads the SDK meanwhile, in
the same process. The server is still `subtask.faces.mcp_tools.server` (MCPServer): every tool call,
progress notification and error comes from the SDK.

Invariants:
- Never import `threading`, `queue`, `json` or the SDK in the MCP front end before its first
  reply, because the first reply is what a client waits for (~5 ms for the first two, `json` ~9 ms:
  it loads `re` and `enum`; the SDK ~0.6 s), and never read messages through a private codec
  (CPython's `_json`), because a private module changes without notice: the first line and the
  cache's head are read by `quickjson` (no import; `json.loads`'s value or a refusal, and a line it
  refuses is read by `json` after all), the cached results are spliced into the reply as their
  JSON text, and the id is written by `id_text`
  (tests/test_mcp.py::test_the_front_end_answers_initialize_without_threading_queue_or_json).
- The front end answers at most: the first line, when it is a plain `initialize` and the cache
  was made with the installed SDK; and, until the SDK reads its first line, list requests
  without params (`tools/list` ...) on a session it initialized. Versions are negotiated as the
  SDK does: the client's version if the SDK handshakes with it, else the SDK's latest.
- The SDK sees every message read, in order, except the list requests the front end answered; so
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
- Never let a line the SDK cannot read reach it unanswered, because its stdio transport drops it
  in silence (the client waits forever) and runs a request with a null or fractional id as a
  notification: every line is checked first (`jsonrpc.check`: not JSON, a batch, an unusable id,
  params that are not an object get -32700, -32600, -32602 from the front end), then by the SDK's
  own stricter reader (`mcp_tools.sdk_refusal`). `check` takes any bytes, however deep or broken
  (`json`'s RecursionError included), so no line ends the reader thread, and the session goes on
  (`tests/test_mcp.py::test_each_bad_line_gets_its_json_rpc_error_and_the_session_goes_on`).
- Never end the SDK's input while it owes an answer, because at its end of input the SDK cancels
  what is under way: the front end ends it once every request it read is answered (one the
  client cancelled excepted) or the client stopped reading, so a call followed by end of input is
  answered (`tests/test_mcp.py::test_a_call_*_end_of_input_*`).
- SUBTASK_MCP_FRONT=0 (and any platform without POSIX descriptors) skips all of this: the SDK's
  own `MCPServer.run("stdio")`.
- The workers' fork server (`subtask.worker.zygote`) is forked while the process has only its main
  thread: after the first reply, before the reader thread (or before the SDK, without the front
  end). Its fork costs ~1 ms; it imports the worker's modules only once the SDK is loaded (or at
  the first spawn), so they do not compete with the SDK's import for CPU at start-up.
- Never load the SDK at Python's default collection pace, nor leave it to later collections,
  because its import makes ~300,000 objects: a collection every 700 new ones was ~400 collections
  while it loaded, one over everything (~25 ms before the first call is served), and every later
  full collection of the long-lived server walked it all again. The server collects every
  `GC_THRESHOLD` and freezes what it loaded (`gc.freeze`)
  (`tests/test_mcp.py::test_the_server_loads_the_sdk_without_walking_it_again_and_again`).
- Never serve an MCP tool call before pygit2 is loaded, because the server is long-lived and
  starts jobs in bulk: through git, each start cost ~10 processes (branch, pins, record: ~20 ms of
  CPU) on two cores that ten workers' checkouts already fill (`start_many10` 500–850 ms, 266–313 with
  pygit2). `mcp_server.load_call_modules` imports it (and filelock) once the SDK is loaded, before the first call; the
  cached `initialize` and `tools/list` replies do not wait for it
  (`tests/test_git_calls.py::test_a_start_over_mcp_costs_the_server_no_git_process_beyond_finding_the_repository`).
"""

from __future__ import annotations

# Not `typing` (2-3 ms: annotations stay strings, and `object` serves for Any), nor, before the
# first reply, `threading` and `queue` (~5 ms).
import gc
import os
import sys

from subtask.faces import jsonrpc, quickjson
from subtask.faces.mcp_versions import installed_versions

TYPE_CHECKING = False  # not `typing`'s (see above)
if TYPE_CHECKING:
    import queue
    import threading

# SUBTASK_MCP_CACHE: another file of the same shape (the tests make one for whatever SDK release
# is installed, so the early path is tested with every release the dependency range allows).
CACHE = os.environ.get("SUBTASK_MCP_CACHE") \
    or os.path.join(os.path.dirname(os.path.abspath(__file__)), "mcp_cache.json")
# Capabilities whose value the SDK validates as an object: anything else could make it refuse an
# initialize the front end had accepted, so such a request is left to the SDK.
OBJECT_CAPABILITIES = ("experimental", "sampling", "elicitation", "roots", "extensions", "tasks")
CACHE_FORMAT = 2  # `pack`'s: each distinct reply once (1: a copy per protocol version, indented)


def __getattr__(name: str) -> object:
    """`from subtask.faces.mcp_server import server` still gives the MCPServer (loading the SDK then)."""
    if name == "server":
        from subtask.faces.mcp_tools import server

        return server
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------- the cache

def load_cache() -> dict | None:
    """The cached replies, or None when they may not be what the installed SDK would say."""
    try:
        with open(CACHE, "rb") as f:
            cache = unpack(f.read())
        return cache if cache["sdk"] == installed_versions() else None
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def pack(cache: dict) -> str:
    """The file's text for `mcp_tools.describe()`'s replies: each distinct result once (the protocol
    versions mostly share them), compact, one per line, after a head line that numbers them. The
    front end reads the head before its first reply and takes the results as text, unparsed."""
    numbers: dict[str, int] = {}  # each distinct body, numbered in the order first met
    results = {version: {method: numbers.setdefault(jsonrpc.dumps(result, ensure_ascii=False), len(numbers))
                         for method, result in replies.items()}
               for version, replies in cache["results"].items()}
    head = {"v": CACHE_FORMAT, "sdk": cache["sdk"], "latest": cache["latest"], "results": results}
    return jsonrpc.dumps(head, ensure_ascii=False)[:-1] + ',"bodies":[\n' + ",\n".join(numbers) + "\n]}\n"


def unpack(data: bytes) -> dict:
    """`pack`'s text read back as `describe()` returned it, each result as its JSON text, spliced
    into replies unparsed (ValueError, KeyError, TypeError or IndexError when it is not such a
    text). Without `json` (see `quickjson`): the head is one line, and each body one more."""
    lines = data.split(b"\n")
    head, suffix = lines[0], b',"bodies":['
    if not head.endswith(suffix) or lines[-2:] != [b"]}", b""]:
        raise ValueError("not a cache of this format")
    packed = quickjson.loads(head[: -len(suffix)] + b"}")
    if not isinstance(packed, dict) or packed.get("v") != CACHE_FORMAT:
        raise ValueError("not a cache of this format")
    bodies = [line.removesuffix(b",").decode() for line in lines[1:-2]]
    results = {version: {method: bodies[n] for method, n in replies.items()}
               for version, replies in packed["results"].items()}
    return {"sdk": packed["sdk"], "latest": packed["latest"], "results": results}


# ---------------------------------------------------------------- reading messages

def _quick_initialize(line: bytes) -> dict | None:
    """The plain initialize `line` holds, read without `json`; None for anything else."""
    try:
        message = quickjson.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) and is_plain_initialize(message) else None


def answerable_id(ident: object) -> bool:
    """An id the front end can write a reply for: an integer, or a string with no lone surrogate
    (JSON's `"\\ud800"`), which no UTF-8 reply can carry."""
    if isinstance(ident, str):
        try:
            ident.encode()
        except UnicodeEncodeError:
            return False
        return True
    return isinstance(ident, int) and not isinstance(ident, bool)


def is_plain_initialize(message: object) -> bool:
    """An initialize the SDK is sure to accept: the front end may answer it for the SDK."""
    if not (isinstance(message, dict) and message.get("jsonrpc") == "2.0" and message.get("method") == "initialize"):
        return False
    ident, params = message.get("id"), message.get("params")
    if not answerable_id(ident) or not isinstance(params, dict):
        return False
    client, capabilities = params.get("clientInfo"), params.get("capabilities")
    return (isinstance(params.get("protocolVersion"), str) and isinstance(capabilities, dict)
            and all(isinstance(capabilities.get(k, {}), dict) for k in OBJECT_CAPABILITIES)
            and isinstance(client, dict) and isinstance(client.get("name"), str)
            and isinstance(client.get("version"), str)
            and all(isinstance(client.get(k, ""), str) for k in ("title", "description", "websiteUrl"))
            and isinstance(client.get("icons", []), list))


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def id_text(ident: int | str) -> str:
    """An id as `json.dumps(ident, ensure_ascii=False)` writes it (`json` costs ~9 ms to import)."""
    if isinstance(ident, int):
        return str(ident)
    return '"' + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if c < " " else c) for c in ident) + '"'


def reply_line(ident: int | str, result: str) -> bytes:
    """A JSON-RPC reply laid out as the SDK writes it (pydantic's compact JSON, UTF-8), around a
    cached result's JSON text."""
    return f'{{"jsonrpc":"2.0","id":{id_text(ident)},"result":{result}}}\n'.encode()


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
        """Raises BrokenPipeError once the client stopped reading."""
        with self.lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self.out, view):]


# ---------------------------------------------------------------- the front end

class Front:
    """Answers what it can (a line that is not a message, a list from the cache), queues every
    other line for the SDK, and keeps the SDK's input open until it answered what it was asked."""

    def __init__(self, wire: Wire, cache: dict | None) -> None:
        self.wire = wire
        self.cache = cache
        # Made by `open`, after the first reply: (line, its message) for the SDK, None at end of
        # input. The message is None for the initialize answered here (the SDK's reply to it is
        # dropped).
        self.lines: queue.Queue[tuple[bytes, dict | None] | None]
        self.replies: dict[str, str] | None = None  # cached results (JSON texts) for the session's version
        self.drop: tuple[int | str, bytes] | None = None  # (id, our reply) of the initialize we answered
        self.sdk_reading = False
        self.owed = True  # a queued line may need an answer from the SDK
        self.asked: threading.Condition  # over `unanswered`, made by `open`
        self.opened = False  # `open` made `lines` and `asked`
        # request id -> how many such requests the SDK read and has not answered
        self.unanswered: dict[int | str, int] = {}
        self.client_gone = False  # it stopped reading: nothing more can reach it

    def open(self, first: bytes) -> None:
        """Handle the first line: answer it if it is a plain initialize, and queue it for the SDK
        (a line that is not a message gets its error instead). The queue comes after the reply."""
        queued = self._answer_first(first)
        import queue
        import threading

        self.lines = queue.Queue()
        self.asked = threading.Condition()
        self.opened = True
        for item in queued:
            self.lines.put(item)

    def _answer_first(self, first: bytes) -> list[tuple[bytes, dict | None] | None]:
        """Answer the first line if it is a plain initialize (or not a message); what it leaves
        for the SDK to read."""
        if not first:
            return [None]
        # The usual first line is read without `json`; any other, `jsonrpc` checks with it.
        message = (_quick_initialize(first) if self.cache is not None else None) or self._checked(first)
        if message is None:
            return []
        if self.cache is None or not is_plain_initialize(message):
            return [(first, message)]
        version = message["params"]["protocolVersion"]
        results = self.cache["results"]
        self.replies = results.get(version) or results[self.cache["latest"]]
        answer = reply_line(message["id"], self.replies["initialize"])
        self.drop = (message["id"], answer)
        self.owed = False
        self.write(answer)
        return [(first, None)]

    def read_rest(self) -> None:
        """The reader thread: every further line, until end of input."""
        while line := self.wire.read_line():
            message = self._checked(line)
            if message is None or (not self.sdk_reading and self._answered(message)):
                continue
            if jsonrpc.is_request(message):
                self.owed = True
            self.lines.put((line, message))
        self.lines.put(None)
        if not self.sdk_reading and not self.owed:
            # The client is gone and asked nothing the SDK must answer: don't make it wait for
            # the SDK's import. No tool ran, so nothing is left half done.
            sys.stderr.flush()
            os._exit(0)

    def _checked(self, line: bytes) -> dict | None:
        """The message `line` holds; None when it holds none (it was answered with its error)."""
        message, refusal = jsonrpc.check(line)
        if refusal is not None:
            self.write(refusal)
        return message

    def _answered(self, message: dict) -> bool:
        """Answer a list request from the cache, if it is one."""
        if self.replies is None:
            return False
        method = message.get("method")
        result = self.replies.get(method) if isinstance(method, str) and method != "initialize" else None
        # Only params-less lists: a cursor, or a `_meta` (a 2026 envelope), is the SDK's to judge.
        if result is None or message.get("params") not in (None, {}) or not answerable_id(message.get("id")):
            return False
        self.write(reply_line(message["id"], result))
        return True

    def write(self, data: bytes) -> None:
        """Write to the client; once it stopped reading, drop what is left for it."""
        if self.client_gone:
            return
        try:
            self.wire.write(data)
        except BrokenPipeError:
            self.client_gone = True
            if self.opened:  # `asked` is made after the first reply
                with self.asked:
                    self.asked.notify_all()

    def handed_to_sdk(self, message: dict) -> None:
        """The SDK is about to read `message`: count the answers it owes (a cancel settles one)."""
        params = message.get("params")
        with self.asked:
            if jsonrpc.is_request(message):
                self.unanswered[message["id"]] = self.unanswered.get(message["id"], 0) + 1
            elif message.get("method") == "notifications/cancelled" and isinstance(params, dict):
                self._count_answer(params.get("requestId"))

    def _count_answer(self, ident: object) -> None:
        if isinstance(ident, int | str) and self.unanswered.get(ident):
            self.unanswered[ident] -= 1
            if not self.unanswered[ident]:
                del self.unanswered[ident]
            self.asked.notify_all()

    def wait_answered(self) -> None:
        """Block until the SDK answered every request it read (or the client stopped reading)."""
        with self.asked:
            while self.unanswered and not self.client_gone:
                self.asked.wait()

    def from_sdk(self, text: str) -> None:
        """Write one of the SDK's lines to the client, except its reply to our initialize."""
        try:
            message = jsonrpc.loads(text)
        except ValueError:
            message = None
        reply = message if isinstance(message, dict) and "method" not in message else None
        if reply is not None and self.drop is not None and reply.get("id") == self.drop[0]:
            ours = jsonrpc.loads(self.drop[1])
            self.drop = None
            if reply != ours:
                # stderr only: stdout is the protocol channel
                sys.stderr.write(
                    "subtask-mcp: the SDK's initialize reply differs from the one sent from "
                    "subtask/faces/mcp_cache.json (regenerate it: python scripts/mcp_cache.py)\n"
                    f"  sent: {jsonrpc.dumps(ours)}\n  sdk:  {text.strip()}\n")
            return
        self.write(text.encode())
        if reply is not None:
            with self.asked:
                self._count_answer(reply.get("id"))


class SdkInput:
    """The SDK's stdin: the queued lines, as an async iterator of str. Its end comes once the SDK
    answered every request it read: the SDK cancels what is under way when its input ends."""

    def __init__(self, front: Front) -> None:
        self.front = front

    def __aiter__(self) -> SdkInput:
        return self

    async def __anext__(self) -> str:
        import anyio.to_thread

        from subtask.faces.mcp_tools import sdk_refusal

        self.front.sdk_reading = True  # from here on the SDK answers everything
        while True:
            item = await self._next()
            if item is None:
                self.front.lines.put(None)  # end of input stays the end
                await anyio.to_thread.run_sync(self.front.wait_answered, abandon_on_cancel=True)
                raise StopAsyncIteration
            line, message = item
            text = line.decode("utf-8", errors="replace")
            refusal = sdk_refusal(text, message)
            if refusal is not None:  # what the SDK would drop unanswered
                self.front.write(refusal)
                continue
            if message is not None:
                self.front.handed_to_sdk(message)
            return text

    async def _next(self) -> tuple[bytes, dict | None] | None:
        import queue

        import anyio.to_thread

        try:
            return self.front.lines.get_nowait()
        except queue.Empty:
            return await anyio.to_thread.run_sync(self.front.lines.get)


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

GC_THRESHOLD = 50_000  # new containers between two collections, as the CLI's (subtask/entry.py)


def serve_sdk(front: Front) -> None:
    """Load the SDK and the tools, then serve every queued and further line with them."""
    from subtask.model import faults

    faults.point("mcp_before_sdk")  # a test holds the SDK back here: the front end alone serves
    import anyio

    from subtask.faces.mcp_tools import serve

    preload_zygote()
    load_call_modules()
    gc.freeze()  # loaded for the server's life: no later collection walks it again
    anyio.run(serve, SdkInput(front), SdkOutput(front))


def serve_plain() -> None:
    """The SDK's own stdio path, untouched."""
    from subtask.faces.mcp_tools import server

    preload_zygote()
    load_call_modules()
    gc.freeze()
    server.run("stdio")


def start_zygote() -> None:
    """Fork the workers' fork server while this process has one thread (see subtask.worker.zygote)."""
    from subtask import api

    try:
        api.start_fork_server()
    except OSError as exc:  # workers start as fresh interpreters then
        sys.stderr.write(f"subtask-mcp: no worker fork server: {exc}\n")


def preload_zygote() -> None:
    """The SDK is loaded: now the zygote may import the worker's modules without delaying it."""
    from subtask import api

    api.preload_fork_server()


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

    gc.set_threshold(GC_THRESHOLD)
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
