"""JSON-RPC 2.0 as MCP speaks it on stdio: which lines are messages, and what every other line gets.

The SDK's stdio transport drops a line it cannot read as an MCP message without a word, so the
client waits for an answer that never comes; a request whose id it cannot use (a fraction, null)
it even runs as a notification, unanswered. `subtask.faces.mcp_server` asks `check` about every
line before the SDK sees it and answers what is not a message, as JSON-RPC 2.0 requires:

- not JSON (or nested deeper than `json` reads; NaN and Infinity are not JSON): -32700 Parse
  error, id null;
- JSON that is not a message: -32600 Invalid Request, with the id of a request that has one
  (strings and numbers are ids); a response's id is never echoed, because ids are their
  sender's: the client would take the error for the answer to its own request of that id;
- a request whose params are not an object: -32602 Invalid params;
- a batch (a JSON array): MCP dropped batches in 2025-06-18 and the SDK reads none. It is
  answered as a batch: an array with an Invalid Request for each request in it (an empty one,
  or one of notifications only, gets a single Invalid Request).

A notification is never answered (JSON-RPC forbids it): a bad one is dropped, as the SDK would.

Standard library only: the front end checks lines before it loads anything.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not `typing`'s: the front end checks lines before it loads anything
if TYPE_CHECKING:
    from typing import TypeGuard

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602

_TITLES = {
    PARSE_ERROR: "Parse error",
    INVALID_REQUEST: "Invalid Request",
    INVALID_PARAMS: "Invalid params",
}
NO_BATCHES = (
    "batches are not read here (MCP has none since 2025-06-18): send each message on its own line"
)


def _not_json(constant: str) -> object:
    raise ValueError(f"{constant} is not JSON")


def loads(data: bytes | str) -> object:
    """`json.loads`, strict: NaN and Infinity refused; too deep a nesting is a ValueError too."""
    import json  # not at the top: the MCP front end's first reply is read without it (~9 ms)

    try:
        return json.loads(data, parse_constant=_not_json)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def dumps(value: object, ensure_ascii: bool = True) -> str:
    import json  # see `loads`

    return json.dumps(value, separators=(",", ":"), ensure_ascii=ensure_ascii)


def error(code: int, ident: object, why: str) -> dict:
    return {
        "jsonrpc": "2.0",
        "id": ident,
        "error": {"code": code, "message": f"{_TITLES[code]}: {why}"[:300]},
    }


def line_of(value: object) -> bytes:
    return (dumps(value) + "\n").encode()


def is_request(message: object) -> TypeGuard[dict]:
    return isinstance(message, dict) and "method" in message and "id" in message


def is_notification(message: object) -> bool:
    return isinstance(message, dict) and "method" in message and "id" not in message


def _usable_id(ident: object) -> bool:
    """An id MCP takes: a string or an integer (JSON-RPC also allows null and fractions)."""
    return isinstance(ident, str) or (isinstance(ident, int) and not isinstance(ident, bool))


def reply_id(message: object) -> object:
    """The id an error about `message` carries: a request's string or number id, else null."""
    if not isinstance(message, dict):
        return None
    ident = message.get("id")
    is_number = isinstance(ident, int | float) and not isinstance(ident, bool)
    claims_request = "method" in message or not ("result" in message or "error" in message)
    return ident if claims_request and (isinstance(ident, str) or is_number) else None


def problem(message: object) -> tuple[int, str] | None:
    """(code, why) when `message` (parsed JSON, not an array) is not an MCP message, else None."""
    if not isinstance(message, dict):
        return INVALID_REQUEST, f"a message is a JSON object, not {type(message).__name__}"
    if message.get("jsonrpc") != "2.0":
        return INVALID_REQUEST, 'a message says "jsonrpc": "2.0"'
    if "method" in message:
        if not isinstance(message["method"], str):
            return INVALID_REQUEST, "method is a string"
        if "id" in message and not _usable_id(message["id"]):
            return (
                INVALID_REQUEST,
                f"an id is a string or an integer, not {dumps(message['id'])[:40]}",
            )
        if message.get("params") is not None and not isinstance(message["params"], dict):
            return INVALID_PARAMS, "params is an object (MCP passes parameters by name)"
        return None
    if "result" in message or "error" in message:
        return _response_problem(message)
    return (
        INVALID_REQUEST,
        "a request has a method" if "id" in message else "neither a request nor a response",
    )


def _response_problem(message: dict) -> tuple[int, str] | None:
    ident = message.get("id")
    if "error" in message:
        failure = message["error"]
        if (
            isinstance(failure, dict)
            and isinstance(failure.get("code"), int)
            and isinstance(failure.get("message"), str)
            and (ident is None or _usable_id(ident))
        ):
            return None
        return INVALID_REQUEST, "an error response has an id and an error with a code and a message"
    if isinstance(message["result"], dict) and _usable_id(ident):
        return None
    return INVALID_REQUEST, "a response has a string or integer id and an object result"


def check(line: bytes) -> tuple[dict | None, bytes | None]:
    """(the message a line holds, None) for the SDK; (None, the reply it gets) when it is not
    one; (None, None) for a blank line or a bad notification, which get nothing."""
    if not line.strip():
        return None, None
    try:
        message = loads(line)
    except ValueError as exc:  # UnicodeDecodeError included
        return None, line_of(error(PARSE_ERROR, None, str(exc)))
    if isinstance(message, list):
        return None, _batch_reply(message)
    found = problem(message)
    if found is None:
        assert isinstance(message, dict)  # `problem` finds none only in an object
        return message, None
    if is_notification(message):
        return None, None  # never answered
    code, why = found
    return None, line_of(error(code, reply_id(message), why))


def _batch_reply(batch: list) -> bytes:
    requests = [m for m in batch if not is_notification(m)]
    answers = [error(INVALID_REQUEST, reply_id(m), NO_BATCHES) for m in requests]
    why = NO_BATCHES if batch else "an empty batch"
    return line_of(answers or error(INVALID_REQUEST, None, why))
