"""Which SDK versions shaped subtask/faces/mcp_cache.json: shared by the MCP front end (`mcp_server`,
which checks the cache against them) and `mcp_tools.describe` (which records them).

Its own module so that `mcp_tools` never imports `mcp_server` (the front end imports the tools,
lazily, never the other way). Standard library only: the front end imports this before the SDK.
"""

from __future__ import annotations

import os
from importlib.machinery import PathFinder

# Distributions whose versions shape the cached replies (pydantic generates the input schemas).
SHAPED_BY = ("mcp", "mcp_types", "pydantic", "pydantic_core")


def installed_versions() -> dict[str, str] | None:
    """The installed versions of SHAPED_BY, from the dist-info folders beside the `mcp` package.

    No importlib.metadata: it costs ~30 ms, as much as the rest of the front end; nor
    importlib.util (~2 ms here, a tenth of the front end's time to its first reply): the path
    finder alone finds a top-level package as `find_spec` does.
    """
    spec = PathFinder.find_spec("mcp")
    if spec is None or not spec.submodule_search_locations:
        return None
    site = os.path.dirname(next(iter(spec.submodule_search_locations)))
    found = {}
    for entry in os.listdir(site):
        name, _, rest = entry.partition("-")
        if rest.endswith(".dist-info") and name in SHAPED_BY:
            found[name] = rest[: -len(".dist-info")]
    return found if len(found) == len(SHAPED_BY) else None
