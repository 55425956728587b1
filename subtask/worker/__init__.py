"""The detached worker: one attempt from checkout to final record (`attempt`), the MCP server's fork
server (`zygote`), and the node side of a remote executor (`remote`)."""
