"""Regenerate subtask/faces/mcp_cache.json: the SDK's own replies that `subtask-mcp` sends before it loads the SDK.

    PYTHONPATH=. python scripts/mcp_cache.py [--check]

Run it after changing a tool's name, signature, docstring or annotations, the server's
instructions or version, or the mcp/pydantic versions; tests/test_mcp.py fails until you do.
--check exits 1 if the committed file is stale, without writing.
"""

from __future__ import annotations

import argparse
import sys

from subtask.faces import mcp_server
from subtask.faces.mcp_tools import describe


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed cache is stale")
    args = parser.parse_args()
    text = mcp_server.pack(describe())
    if args.check:
        try:
            with open(mcp_server.CACHE, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        print("up to date" if current == text else "stale: run python scripts/mcp_cache.py", file=sys.stderr)
        return 0 if current == text else 1
    with open(mcp_server.CACHE, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {mcp_server.CACHE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
