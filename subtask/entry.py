"""The console script `git-subtask`: the CLI, in this process.

A command of the registry (`faces/commands`: start, wait, list, status, show, result, cleanup)
runs without click when its command line is one the registry's parser is sure of; every other
command line goes to the click CLI. Ctrl-C while the CLI is still being imported exits 130
quietly (a plain import would print a traceback). No process is left behind after a call (a warm
command server used to be, on by default: it is gone, docs/architecture.md says why).
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from subtask.model.errors import interrupt_once

        interrupt_once()  # a second Ctrl-C (git passes the first on again) must not interrupt the exit
        from subtask.faces import commands

        found = commands.find(sys.argv[1:])
        if found is not None or sys.argv[1:] == ["--version"]:
            _man_page()
            if found is None:
                commands.version()
            commands.call(*found)  # exits
        from subtask.faces.cli import main as cli_main
    except KeyboardInterrupt:
        sys.exit(130)
    cli_main()


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
