"""The console script `git-subtask`: the CLI, in this process.

A command of the registry (`faces/commands`: start, wait, list, status, show, result, cleanup)
runs without click when its command line is one the registry's parser is sure of; every other
command line goes to the click CLI. A Ctrl-C is exit 130 and never a traceback, wherever it lands
from the first line of `main` on: while the CLI is still being imported (the script's own
`from subtask.faces.cli import main` would print one), while the command runs, while it unwinds,
and once it is over. Before that first line it is Python's own start-up (`site`), which no code
of ours can reach. No process is left behind after a call (a warm command server used to be, on
by default: it is gone, docs/architecture.md says why).

Invariants:
- Never register exit work (`atexit`, a non-daemon thread) in a command of the registry,
  because it exits without the interpreter's teardown (`errors.exit_at_once`: ~6 ms of a 45 ms
  `list`) and that work would never run (tests/test_imports.py holds it for each command).
- Never let the CLI collect garbage at Python's default pace (every 700 new containers), because
  a reading command's imports alone then ran 16 collections, ~2 ms of ~27: it collects every
  `GC_THRESHOLD` (a command's whole run is fewer; a worker it forks, or a long `land`, still
  collects, and never holds more than that many uncollected).
- Never let a click command's exit collect the objects its imports made, because the
  interpreter's teardown ends with a full collection that walked every one of them (7-10 ms of a
  45 ms `merge --help`, 20-50 ms on a loaded machine): `main` freezes them first (`gc.freeze`).
  Cyclic garbage left at the exit is then not finalized; nothing may rely on that (files are
  closed by `with`, locks by the process's end)
  (`test_imports::test_a_click_command_exits_without_a_last_collection_of_every_import`).
"""

from __future__ import annotations

import gc
import sys

GC_THRESHOLD = 50_000  # new containers between two collections (Python's default: 700)

TYPE_CHECKING = False  # not `typing`'s: importing it costs the console script's start ms
if TYPE_CHECKING:
    from types import ModuleType


def main() -> None:
    gc.set_threshold(GC_THRESHOLD)  # the imports that follow make ~25,000 containers
    code: str | int | None = 0  # what SystemExit carries
    errors: ModuleType | None = None
    registry = False  # a command of the registry ran: it exits without the interpreter's teardown
    try:
        try:
            from subtask.model import errors as loaded
            from subtask.model import faults

            errors = loaded  # the `finally` below knows it was imported
            loaded.interrupt_once()  # a second Ctrl-C (git passes it on again) changes nothing
            faults.point("cli_start")
            from subtask.faces import commands

            found = commands.find(sys.argv[1:])
            if found is not None or sys.argv[1:] == ["--version"]:
                registry = True
                _man_page()
                faults.point("cli_dispatch")  # as the click CLI's: loaded, the command not yet run
                if found is None:
                    commands.version()  # exits
                else:
                    commands.call(*found)  # exits
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
        if registry:
            errors.exit_at_once(code)
    gc.freeze()  # the teardown's last collection would walk every object the imports made
    sys.exit(code)


def _man_page() -> None:
    """The man page beside the console script, written when missing (`manpage.ensure_installed`;
    the click CLI does it on each of its calls): one stat when it is there."""
    import os

    script = sys.argv[0] if sys.argv else ""
    page = os.path.join(sys.prefix, "share", "man", "man1", "git-subtask.1")
    if os.path.isabs(script) and os.path.dirname(script) == os.path.join(sys.prefix, "bin") \
            and not os.path.exists(page):
        from subtask.faces import cli, manpage

        manpage.ensure_installed(cli.cli)
