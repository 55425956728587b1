"""Regular expressions compiled the first time they are used, not when their module is imported.

Compiling a pattern costs ~0.05-0.3 ms (the bidi classes of `words.terminal` ~0.3 ms each), and
a command imports modules for far more patterns than it matches: ~20 of them cost every reading
command ~1.5 ms (of a ~25 ms budget, tests/test_imports.py) before it read anything.

Invariants:
- Never compile a module's pattern at import, because every command that imports the module
  pays for it whether it matches the pattern or not: module-level patterns are
  `lazyre.compile(...)`, compiled on first use (the first call of any method or attribute of
  `re.Pattern`), the same compiled object afterwards.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any


class _Deferred:
    """A `re.Pattern` compiled on first use: its source and flags until then."""

    __slots__ = ("_source", "_flags", "_compiled")

    def __init__(self, source: str, flags: int):
        self._source, self._flags = source, flags
        self._compiled: re.Pattern[str] | None = None

    def __getattr__(self, name: str) -> Any:  # fullmatch, sub, search, finditer, pattern, groups…
        if self._compiled is None:
            self._compiled = re.compile(self._source, self._flags)
        return getattr(self._compiled, name)


def compile(source: str, flags: int = 0) -> re.Pattern[str]:  # noqa: A001  (re.compile, deferred)
    """`re.compile(source, flags)`, deferred to the pattern's first use."""
    return _Deferred(source, flags)  # type: ignore[return-value]
