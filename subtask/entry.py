"""The console script `git-subtask`: load the CLI so that Ctrl-C while loading exits 130 quietly.

The script's own `from subtask.cli import main` would print a traceback for a Ctrl-C that lands
while click and the commands are still being imported; this module imports nothing heavy itself.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from subtask.cli import main as cli_main
    except KeyboardInterrupt:
        sys.exit(130)
    cli_main()
