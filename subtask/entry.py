"""The console script `git-subtask`: the warm command server if there is one, else the CLI here.

`subtask.cmdclient` hands the call to this user's command server (its imports already done) and
relays its exit status; with no server it starts one for the next call and returns None, and the
CLI runs in this process. Ctrl-C while the CLI is still being imported exits 130 quietly (the
script's own `from subtask.cli import main` would print a traceback); this module imports
nothing heavy itself.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from subtask.errors import interrupt_once

        interrupt_once()  # a second Ctrl-C (git passes the first on again) must not interrupt the exit
        from subtask import cmdclient

        code = cmdclient.run(sys.argv[1:])
        if code is not None:
            cmdclient.exit_now(code)
        from subtask.cli import main as cli_main
    except KeyboardInterrupt:
        sys.exit(130)
    cli_main()
