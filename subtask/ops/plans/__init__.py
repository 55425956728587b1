"""Jobs that relate to other jobs: best-of groups and maps, and jobs that wait for jobs
(`start --after`). Each module's docstring states what it owns."""
