"""`python -m subtask` runs the CLI, as the console script does."""

from subtask.entry import main

main()
