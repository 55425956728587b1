"""What git-subtask shares outside this clone: push/pull of records and notes, the MCP server and
guide installed in agent clients, and the post-merge hook. Each module's docstring states what it
owns."""
