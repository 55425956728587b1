"""The console script `git-subtask`: the CLI, in this process.

Ctrl-C while the CLI is still being imported exits 130 quietly (the script's own
`from subtask.faces.cli import main` would print a traceback). No process is left behind after a call
(a warm command server used to be, on by default: it is gone, docs/architecture.md says why).
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from subtask.model.errors import interrupt_once

        interrupt_once()  # a second Ctrl-C (git passes the first on again) must not interrupt the exit
        from subtask.faces.cli import main as cli_main
    except KeyboardInterrupt:
        sys.exit(130)
    cli_main()
