"""One error type for every failure a user can act on.

`SubtaskError` carries a kind, a message, an optional hint naming a real command, and git's exit
code. Code anywhere raises it; the CLI prints it in one place, the MCP server turns it into a tool
error with the same words. Exit codes follow git: 1 a defined negative answer, 128 fatal, 129 usage.

Invariants:
- Never set a signal handler outside the main thread (Python refuses it), because the MCP server
  runs operations in worker threads; a half-done start is undone by `errors.undo_uninterrupted`,
  which holds Ctrl-C off (blocked, so the git it runs inherits it blocked) only when it runs in the
  main thread.
- Never let a second SIGINT interrupt the unwinding of the first, because `git` passes the
  terminal's Ctrl-C on to its child: it came out as `RuntimeError: release unlocked lock` or a
  traceback (`interrupt_once`, set first thing by the console script and the CLI).
- Never set SIGINT to `SIG_IGN` or `SIG_DFL` while a command runs (hold it off by blocking it in
  the main thread, and by a handler that does nothing), because a SIGINT caught while the
  disposition changes is reported by Python as `OSError: Signal 2 ignored due to race condition`
  with a traceback (issue 38); and never let Python's finalization end an interrupted command
  (`errors.exit_if_interrupted`: `os._exit(130)` once it has unwound), because it puts SIGINT back
  to its default while it tears the modules down and git's copy of the Ctrl-C, caught there by one
  of `wait`'s threads, killed the process. A KeyboardInterrupt Python swallows (raised in a weakref
  callback: importlib's module locks) interrupts the main thread again, or `wait` waited on with
  every later Ctrl-C ignored (`tests/test_git_habits.py::test_ctrl_c_*`).
"""

from __future__ import annotations

import _signal
import _thread
import errno
import os
import sys

TYPE_CHECKING = False  # not `typing`'s: the console script imports this first, and typing costs ms
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType
    from typing import Any

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

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "hint": self.hint, "exit_code": self.exit_code}


def from_os_error(exc: OSError) -> SubtaskError | None:
    """Words for an OSError a user can act on (a full or read-only disk), or None."""
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
_IGNORING: list[str] = []  # why a Ctrl-C now changes nothing: an undo under way, the command over
_AGAIN: list[bool] = []  # the first one's KeyboardInterrupt was swallowed: raise it again
_HOOK: dict[str, Any] = {}  # the unraisable hook `_swallowed` replaced, and the main thread's id


def _interrupted(signum: int, frame: FrameType | None) -> None:
    if _IGNORING or (INTERRUPTED and not _AGAIN):
        return
    if frame is not None and frame.f_code in (_swallowed.__code__, _interrupt_main_soon.__code__):
        _interrupt_main_soon()  # not inside the hook, which would swallow it: once out of it
        return
    _AGAIN.clear()
    INTERRUPTED.append(signum)
    _block_sigint()  # the children we start while unwinding ignore the second one, as we do
    raise KeyboardInterrupt


def _block_sigint() -> set[int]:
    """Block SIGINT in this thread and return the mask it had. Blocked, never SIG_IGN: a SIGINT
    caught while the disposition changes is reported by Python as `OSError: Signal 2 ignored due
    to race condition`, a traceback (issue 38). A blocked one waits, and is dropped at exit."""
    previous: set[int] = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT})
    return previous


def interrupt_once() -> None:
    """SIGINT raises KeyboardInterrupt once; later ones change nothing while the command unwinds.

    A Ctrl-C reaches `git-subtask` twice: from the terminal, and again from `git`, which passes
    the signal on to the command it runs. The second KeyboardInterrupt landed in the unwinding of
    the first (a `with lock:` in `queue.get`, an `Event.set`, the handling of SystemExit) and came
    out as a traceback, a death by SIGINT instead of exit 130, or `RuntimeError: release unlocked
    lock`. The handler stays installed until the process ends (see `_block_sigint` for why it never
    switches to SIG_IGN). Main thread only (the only one that may set handlers); `_signal`, not
    `signal`: the console script calls this before it imports anything.
    """
    try:
        _signal.signal(_signal.SIGINT, _interrupted)
    except ValueError:  # not the main thread: its Ctrl-C is not ours to handle
        return
    if sys.unraisablehook is not _swallowed:
        _HOOK.update(previous=sys.unraisablehook, main=_thread.get_ident())
        sys.unraisablehook = _swallowed


def _swallowed(unraisable: Any) -> None:
    """Python swallows an exception raised where nothing can catch it (a weakref callback, a
    `__del__`) and prints "Exception ignored in": our KeyboardInterrupt landed there (importlib's
    module-lock callback, measured), so the command went on waiting and ignored every later
    Ctrl-C. Say nothing, and interrupt the main thread again where it can unwind."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and INTERRUPTED and not _IGNORING:
        _AGAIN.append(True)
        _interrupt_main_soon()
        return
    _HOOK["previous"](unraisable)


def _interrupt_main_soon() -> None:
    """A SIGINT to the main thread (this one), sent from another thread: it is handled once the
    hook has returned (else sent again), and it wakes a main thread blocked in a lock or a system
    call, which `_thread.interrupt_main` would not."""
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGINT})
    _thread.start_new_thread(_signal.pthread_kill, (_HOOK["main"], _signal.SIGINT))


def command_over() -> None:
    """The command has ended (or was interrupted): a Ctrl-C from here to the process's exit
    changes nothing, in the main thread or any other one that receives it."""
    _IGNORING.append("over")
    _block_sigint()


def exit_at_once(code: object) -> None:
    """Exit with `code` now, without Python's teardown, which frees every module's objects one by
    one (~6 ms of a 45 ms reading command), once the standard streams are flushed. Returns (and
    the caller exits the usual way) for an exit that carries a message, or when a stream cannot
    be flushed: Python's own exit then says what it says."""
    if code is not None and not isinstance(code, int):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code or 0)


def exit_if_interrupted() -> None:
    """End an interrupted command here (exit 130), its unwinding done, without Python's
    finalization: that puts SIGINT back to its default while it tears the modules down, so git's
    copy of the Ctrl-C, caught there by another thread (`wait`'s watchers), killed the process
    instead of letting it exit 130."""
    if not INTERRUPTED:
        return

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(130)


def fatal(message: str, hint: str | None = None) -> SubtaskError:
    return SubtaskError("fatal", message, hint)


def undo_uninterrupted(
    steps: list[Callable[[], object]], then: Callable[[], object] | None = None
) -> None:
    """Undo a half-done operation: run `steps` last first, each one's failure ignored (the rest
    must still run), then `then`. A Ctrl-C must not interrupt the undo, nor the git it runs (a
    terminal's Ctrl-C reaches the whole process group): in the main thread (the only one signals
    are handled in: the MCP server runs operations in other threads) SIGINT is blocked meanwhile,
    so the children inherit it blocked, and one that arrives meanwhile is dropped, as it was when
    this was SIG_IGN."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    if main:
        _IGNORING.append("undo")  # one caught before the block: our handler must not raise here
        mask = _block_sigint()
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
            if signal.SIGINT not in mask:
                signal.sigtimedwait({signal.SIGINT}, 0)  # drop the one that came meanwhile
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            _IGNORING.remove("undo")
