"""`python -m subtask` runs the CLI."""

from subtask.cli import main

main()
