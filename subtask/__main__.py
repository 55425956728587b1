"""`python -m subtask` runs the CLI."""

from subtask.faces.cli import main

main()
