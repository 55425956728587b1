"""What the command line prints, and its one error path, without click.

Both the commands that run without click (`faces/commands`) and the click CLI (`faces/cli.py`)
print through here: text for a person through `echo` (control characters made visible,
`words.safe`), JSON through `emit_json` (exact values, escaped). One error path, `guarded`:
`SubtaskError` becomes `error: <message>` (plus `hint:`) on stderr and git's exit code;
Ctrl-C exits 130, a closed pipe 0; anything unexpected is one line (SUBTASK_DEBUG=1 for the
traceback), never a bare traceback.

Standard library (and `model`) only: every command imports this first.

Invariants:
- Never print a "nothing here" line or a sweep report on stdout off a terminal (`on_terminal`,
  `SUBTASK_TTY=1` forces it for tests), because scripts read these commands' output and must see
  what they always saw; off a terminal they go to stderr (issue 31: a harness or an agent must
  still learn that there was nothing, and what a read command's sweep removed).
"""

from __future__ import annotations

import os
import sys

from subtask.model.errors import EXIT_FATAL, SubtaskError, from_os_error

TTY_ENV = "SUBTASK_TTY"  # "1": treat stdout and stderr as a terminal (tests cannot easily give one)


def echo(text: str = "", err: bool = False, nl: bool = True) -> None:
    """Print text for a person: control characters made visible (`words.safe`), since jobs carry
    text from models and teammates; the faces print nothing any other way (JSON: `emit_json`)."""
    from subtask.words import safe

    write(safe(str(text)) + ("\n" if nl else ""), err)


def write(text: str, err: bool = False) -> None:
    """`text` as it is (a redraw's escapes), flushed at once so stdout and stderr keep their order;
    what the stream's encoding cannot say is replaced, never an error."""
    stream = sys.stderr if err else sys.stdout
    try:
        stream.write(text)
    except UnicodeEncodeError:
        stream.flush()
        stream.buffer.write(text.encode(stream.encoding or "utf-8", "replace"))
    stream.flush()


def emit_json(obj) -> None:
    from subtask.words import json_text

    write(json_text(obj, indent=2, sort_keys=False) + "\n")  # amounts as numbers, the rest as text


def repo():
    from subtask import api

    return api.repo_at(os.environ.get("SUBTASK_REPO") or None)


def on_terminal(stream=None) -> bool:
    """Whether a person reads `stream` (default stdout). Words only a person needs ("no jobs",
    what a sweep removed) go to a terminal only: a script piping the output sees what it always saw."""
    if os.environ.get(TTY_ENV) == "1":
        return True
    stream = stream or sys.stdout
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def say_nothing(text: str) -> None:
    """The one line a command says when it has nothing to show: on stdout for a person at a
    terminal, else on stderr, so a script reading stdout sees what it always saw (nothing) and
    whoever reads the rest (a harness, an agent) still learns that there was nothing."""
    echo(text, err=not on_terminal())


def emit(reply, as_json: bool = False) -> None:
    """Print a `replies.Reply`: its JSON, or its text (its `nothing` on a terminal when it has
    none) and its notes on stderr; then exit with its code when that is not 0."""
    if as_json:
        emit_json(reply.data)
    else:
        if reply.text:
            echo(reply.text)
        elif reply.nothing:
            say_nothing(reply.nothing)
        for note in reply.notes:
            echo(note, err=True)
    if reply.exit_code:
        sys.exit(reply.exit_code)


def emit_lines(lines: list[str], as_json: bool, nothing: str | None = None, **facts) -> None:
    """Text commands that report what they did: one line each, or `{"v": 1, "lines": [...], ...}`;
    `nothing` is said on a terminal when there is no line."""
    from subtask.faces import replies

    emit(replies.report(lines, nothing, **facts), as_json)


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings (a damaged record skipped) read like git's: `warning: ...`, no file and line."""
    echo(f"warning: {message}", err=True)


def exit_with(exc: SubtaskError) -> None:
    echo(f"error: {exc.message}", err=True)
    if exc.hint:
        echo(f"hint: {exc.hint}", err=True)
    sys.exit(exc.exit_code)


def prepare() -> None:
    """What every command sets first: workers it starts are forks of it (it is single-threaded),
    warnings in git's words."""
    import warnings

    from subtask import api

    api.use_forked_workers()
    warnings.showwarning = show_warning


def guarded(work) -> None:
    """Run `work()` under the one error path (module docstring); exit 0 after it."""
    from subtask.model.errors import INTERRUPTED

    try:
        work()
    except SubtaskError as exc:
        exit_with(exc)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        _quiet_stdout()
        sys.exit(0)
    except Exception as exc:
        if INTERRUPTED:  # raised while a Ctrl-C unwound the command (a lock it left released)
            sys.exit(130)
        if os.environ.get("SUBTASK_DEBUG"):
            raise
        said = from_os_error(exc) if isinstance(exc, OSError) else None
        if said is not None:
            exit_with(said)
        echo(f"error: unexpected {type(exc).__name__}: {exc} (run again with SUBTASK_DEBUG=1 for details)",
             err=True)
        sys.exit(EXIT_FATAL)
    sys.exit(0)


def _quiet_stdout() -> None:
    """After a closed pipe, the interpreter's own flush of stdout at exit must not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
