"""One error type for every failure a user can act on.

`SubtaskError` carries a kind, a message, an optional hint naming a real command, and git's exit
code. Code anywhere raises it; the CLI prints it in one place, the MCP server turns it into a tool
error with the same words. Exit codes follow git: 1 a defined negative answer, 128 fatal, 129 usage.
"""

from __future__ import annotations

EXIT_NEGATIVE = 1
EXIT_FATAL = 128
EXIT_USAGE = 129

# kind -> exit code; kinds not listed are fatal.
_EXIT_BY_KIND = {
    "usage": EXIT_USAGE,
    "negative": EXIT_NEGATIVE,
    "conflict": EXIT_NEGATIVE,
    "budget": EXIT_NEGATIVE,
    "recursion": EXIT_NEGATIVE,
    "not_finished": EXIT_NEGATIVE,
    "dirty": EXIT_NEGATIVE,
    "not_found": EXIT_FATAL,
    "fatal": EXIT_FATAL,
    "engine": EXIT_FATAL,
}


class SubtaskError(Exception):
    """A failure with words a user can act on."""

    def __init__(self, kind: str, message: str, hint: str | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.hint = hint
        self.exit_code = exit_code if exit_code is not None else _EXIT_BY_KIND.get(kind, EXIT_FATAL)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "message": self.message, "hint": self.hint, "exit_code": self.exit_code}


def fatal(message: str, hint: str | None = None) -> SubtaskError:
    return SubtaskError("fatal", message, hint)
