"""The names of the checks on a job's diff (`git/checks.py` runs them), and how a list of them is
written: in `start --check`, in `git config subtask.git.checks`, in a job's spec.

`no-test-deletion`, `no-suppression`, `paths=GLOB` (relative to the repository's top), `none`
(drops every check named before it); a list is separated by commas, commas inside braces stay
(`paths=src/{a,b}/**`). The grammar lives here, below `git/`, because the table of settings
(`model/config.py`) checks `subtask.git.checks` with it.
"""

from __future__ import annotations

from subtask.model.errors import SubtaskError

NO_TEST_DELETION = "no-test-deletion"
NO_SUPPRESSION = "no-suppression"
NAMED = (NO_TEST_DELETION, NO_SUPPRESSION)
DEFAULT = f"{NO_TEST_DELETION},{NO_SUPPRESSION}"
PATHS = "paths="
NONE = "none"


def split(value: str) -> list[str]:
    """`a,b,paths=src/{x,y}/**` -> [a, b, paths=src/{x,y}/**]: commas inside braces stay."""
    items, depth, current = [], 0, ""
    for char in value:
        if char == "{":
            depth += 1
        elif char == "}":
            depth = max(0, depth - 1)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    return [item.strip() for item in items if item.strip()]


def check_name(item: str, given_as: str = "--check ") -> str:
    """`item` if it names a check (or `none`); a usage error that lists the checks otherwise."""
    if item == NONE or item in NAMED:
        return item
    if item.startswith(PATHS):
        glob = item[len(PATHS):].strip()
        if not glob or glob.startswith("/") or "\0" in glob or ".." in glob.split("/"):
            raise SubtaskError("usage", f"{given_as}{item!r}: give a glob relative to the "
                               "repository's top, e.g. paths=src/** or paths=**/*.md")
        return PATHS + glob
    raise SubtaskError("usage", f"unknown check {item!r}; checks: {', '.join(NAMED)}, "
                       "paths=GLOB, none",
                       hint="git subtask start --check no-test-deletion --check 'paths=src/**'")


def problem(value: str) -> str | None:
    """What is wrong with a list of checks, or None."""
    try:
        for item in split(value):
            check_name(item, given_as="")
    except SubtaskError as exc:
        return exc.message
    return None
