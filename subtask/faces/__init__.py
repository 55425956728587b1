"""The faces: the click CLI, the MCP server and its tools, completion, the man page, doctor, install
into clients, and the words and data each command answers (`replies`). They parse, call `api`,
render; no operation lives here."""
