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


def from_os_error(exc: OSError) -> SubtaskError | None:
    """Words for an OSError a user can act on (a full or read-only disk), or None."""
    import errno
    import os

    where = os.fspath(exc.filename) if exc.filename is not None else None
    folder = os.path.dirname(where) if where else "the disk"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SubtaskError("fatal", f"no space left in {folder}" + (f": {where} was not written" if where else ""),
                            hint=f"free some space there (df -h '{folder}'), then run the command again")
    if exc.errno == errno.EROFS:
        return SubtaskError("fatal", f"{folder} is read-only here" + (f": {where} was not written" if where else ""),
                            hint="a job confined by git-subtask cannot write there; run it from outside the job")
    return None


INTERRUPTED: list[int] = []  # a Ctrl-C arrived: what fails after it is its consequence, not a bug to report


def _interrupted(signum, frame) -> None:
    import _signal

    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    INTERRUPTED.append(signum)
    raise KeyboardInterrupt


def interrupt_once() -> None:
    """SIGINT raises KeyboardInterrupt once; later ones are ignored while the command unwinds.

    A Ctrl-C reaches `git-subtask` twice: from the terminal, and again from `git`, which passes
    the signal on to the command it runs. The second KeyboardInterrupt landed in the unwinding of
    the first (a `with lock:` in `queue.get`, an `Event.set`, the handling of SystemExit) and came
    out as a traceback, a death by SIGINT instead of exit 130, or `RuntimeError: release unlocked
    lock`. Main thread only (the only one that may set handlers); `_signal`, not `signal`: the
    console script calls this before it imports anything.
    """
    import _signal

    try:
        _signal.signal(_signal.SIGINT, _interrupted)
    except ValueError:  # not the main thread: its Ctrl-C is not ours to handle
        pass


def fatal(message: str, hint: str | None = None) -> SubtaskError:
    return SubtaskError("fatal", message, hint)


def undo_uninterrupted(steps: list, then=None) -> None:
    """Undo a half-done operation: run `steps` last first, each one's failure ignored (the rest
    must still run), then `then`. A second Ctrl-C must not interrupt the undo, so SIGINT is held
    off meanwhile, in the main thread only (the only one that may set handlers: the MCP server
    runs operations in other threads)."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    if main:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for step in reversed(steps):
            try:
                step()
            except Exception:
                pass
        if then is not None:
            then()
    finally:
        if main:
            signal.signal(signal.SIGINT, signal.default_int_handler)
