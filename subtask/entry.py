"""The console script `git-subtask`: the CLI, in this process.

A Ctrl-C is exit 130 and never a traceback, wherever it lands from the first line of `main` on:
while the CLI is still being imported (the script's own `from subtask.faces.cli import main` would
print one), while the command runs, while it unwinds, and once it is over. Before that first line
it is Python's own start-up (`site`), which no code of ours can reach. No process is left behind
after a call (a warm command server used to be, on by default: it is gone, docs/architecture.md
says why).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not `typing`'s: importing it costs the console script's start ms
if TYPE_CHECKING:
    from types import ModuleType


def main() -> None:
    code: str | int | None = 0  # what SystemExit carries
    errors: ModuleType | None = None
    try:
        try:
            from subtask.model import errors as loaded
            from subtask.model import faults

            errors = loaded  # the `finally` below knows it was imported
            loaded.interrupt_once()  # a second Ctrl-C (git passes it on again) changes nothing
            faults.point("cli_start")
            from subtask.faces.cli import main as cli_main

            cli_main()
        except SystemExit as done:
            code = done.code
            faults.point("cli_end")
        finally:
            if errors is not None:
                errors.command_over()  # from here to the exit, a Ctrl-C changes nothing
    except KeyboardInterrupt:
        code = 130
    if errors is not None:
        errors.exit_if_interrupted()
    sys.exit(code)
