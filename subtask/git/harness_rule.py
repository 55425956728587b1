"""What a job's harness is: the files that judge its verify, per ecosystem and per verify command.

A verify's verdict is worth what its judge is, so the harness is named here and read from a tree
the caller trusts (the job's base, the landing target's tip); `git/harness.py` compares the job's
worktree with it there:

- `resolve`: which harness a job asks for, recorded in its spec at start: `default` (the globs of
  each ecosystem found in the trusted tree, below), globs of its own (`subtask.verify.harness`,
  `start --harness GLOB`), or none (`--harness job`: judged by its own tests). `none` and `job`
  drop what was named before them, as `--check none` does.
- `rule_for`: the globs in force for one trusted tree. Python: test files and folders
  (`test_*.py`, `*_test.py`, `tests/`, `test/`), every `conftest.py`, `pytest.ini`,
  `.pytest.ini`, `pytest.toml`, `tox.ini`, `setup.cfg`, `noxfile.py`, and the `tool.pytest` table of
  each `pyproject.toml`. JavaScript: `*.test.*`, `*.spec.*`, `__tests__/`, jest/vitest/mocha
  configuration and the `jest` key and test scripts of each `package.json`. Go: `*_test.go`,
  `testdata/`. Rust: `tests/`. And the verify command's own script when it names a file of the
  trusted tree (`sh scripts/check.sh`; `make` brings the Makefile, `npm` the scripts).

Pure: it reads a tree's paths and a command line, never a file's contents, git objects or the
worktree.

Invariants:
- Never make a file the verify command only reads part of the harness (`grep -q hi out.txt`),
  because a job asked to write it would be judged on the base's copy: only a program the command
  runs, or the script an interpreter is given, is (`command_files`).
- A harness glob is relative to the repository's top: never absolute, never with `..`
  (`resolve` refuses one, as a usage error or, from git config, a fatal one).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Container, Iterable
from pathlib import PurePosixPath

from subtask.model.checknames import split
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError

DEFAULT = "default"
JOB = "job"  # judged by its own tests (the opt-out); `none` says the same
NONE = "none"

_JS = "{js,jsx,ts,tsx,mjs,cjs,mts,cts}"
ECOSYSTEMS: dict[str, tuple[str, ...]] = {
    "python": ("**/test_*.py", "**/*_test.py", "**/tests/**", "**/test/**", "**/conftest.py", "**/pytest.ini",
               "**/.pytest.ini", "**/pytest.toml", "**/.pytest.toml", "**/tox.ini", "**/setup.cfg", "**/noxfile.py"),
    "javascript": (f"**/*.test.{_JS}", f"**/*.spec.{_JS}", "**/__tests__/**", "**/jest.config.*", "**/jest.setup.*",
                   "**/vitest.config.*", "**/vitest.workspace.*", "**/.mocharc*"),
    "go": ("**/*_test.go", "**/testdata/**"),
    "rust": ("**/tests/**",),
}
# Files of which only a part is harness: (file name, the keys of that part). The rest is the
# job's (a dependency added to pyproject.toml is code, its pytest table is not).
SECTIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "python": {"pyproject.toml": ("tool.pytest",)},
    "javascript": {"package.json": ("jest", "mocha", "scripts.test", "scripts.pretest", "scripts.posttest")},
}

# ---------------------------------------------------------------- which harness a job asks for

def resolve(given: Iterable[str] | None, configured: str | None) -> list[str]:
    """The harness a job records: `subtask.verify.harness` (else `default`), then each `--harness`
    value in order; `job` or `none` drops everything named before it. An empty list: judged by
    its own tests."""
    chosen: list[str] = []
    for item in split(configured if configured is not None else DEFAULT):
        try:
            chosen = [] if item in (JOB, NONE) else [*chosen, _checked_glob(item)]
        except SubtaskError as exc:
            raise SubtaskError("fatal", f"git config subtask.verify.harness: {exc.message}",
                               hint="git config subtask.verify.harness default") from None
    for value in given or ():
        if not isinstance(value, str):
            raise SubtaskError("usage", f"a harness must be a glob, default or job, not {value!r}")
        for item in split(value):
            chosen = [] if item in (JOB, NONE) else [*chosen, _checked_glob(item)]
    return list(dict.fromkeys(chosen))


def _checked_glob(item: str) -> str:
    if item == DEFAULT:
        return item
    if item.startswith("/") or "\0" in item or ".." in PurePosixPath(item).parts:
        raise SubtaskError("usage", f"--harness {item!r}: give a glob relative to the repository's top "
                           "(tests/**, ci/*.sh), default, or job (judged by its own tests)")
    return item


def judged_by_job(harness: list[str] | None) -> bool:
    """Does a spec's harness leave the verdict to the job's own tests? (None: a record from before
    the harness existed, judged as `default` is.)"""
    return harness is not None and not harness


# ---------------------------------------------------------------- the rule for one trusted tree

@dataclass(frozen=True)
class Rule:
    """Which paths of one trusted tree are harness, whole or in part (`rule_for`)."""

    globs: tuple[str, ...]  # as shown: the globs, then the verify command's own files
    sections: dict[str, tuple[str, ...]]
    pattern: re.Pattern[str] = field(repr=False)
    files: frozenset[str] = frozenset()  # exact paths: the verify command's own script

    def matches(self, path: str) -> bool:
        return path in self.files or self.pattern.match(path) is not None

    def section_of(self, path: str) -> tuple[str, ...] | None:
        return self.sections.get(path.rsplit("/", 1)[-1])


def ecosystems(paths: Iterable[str]) -> list[str]:
    """The ecosystems a tree holds: Python (any .py, or a Python project file), JavaScript (a
    package.json), Go (go.mod), Rust (Cargo.toml)."""
    found: set[str] = set()
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        if name.endswith(".py") or name in ("pyproject.toml", "setup.cfg", "tox.ini", "pytest.ini"):
            found.add("python")
        elif name == "package.json":
            found.add("javascript")
        elif name == "go.mod":
            found.add("go")
        elif name == "Cargo.toml":
            found.add("rust")
    return [e for e in ECOSYSTEMS if e in found]


def rule_for(asked: list[str] | None, trusted_paths: Iterable[str], command: str | None) -> Rule:
    """The globs in force: `asked` (None: `default`) with `default` spelled out for the
    ecosystems of the trusted tree, plus the verify command's own script."""
    paths = trusted_paths if isinstance(trusted_paths, (set, frozenset, dict)) else set(trusted_paths)
    asked = [DEFAULT] if asked is None else asked
    globs: list[str] = []
    exact: list[str] = []
    sections: dict[str, tuple[str, ...]] = {}
    for item in asked:
        if item != DEFAULT:
            globs.append(item)
            continue
        for eco in ecosystems(paths):
            globs.extend(ECOSYSTEMS[eco])
            sections.update(SECTIONS.get(eco, {}))
        script, extra = command_files(command, paths)
        exact.extend(script)
        for name, keys in extra.items():
            sections[name] = tuple(dict.fromkeys(sections.get(name, ()) + keys))
    globs = list(dict.fromkeys(globs))
    from subtask.git.checks import glob_regex

    pattern = re.compile("|".join(f"(?:{glob_regex(g).pattern})" for g in globs) or r"(?!)")
    return Rule(tuple(globs + [f for f in dict.fromkeys(exact) if f not in globs]), sections, pattern,
                frozenset(exact))


INTERPRETERS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "python", "python3", "node", "ruby", "perl", "bun",
                          "deno", "tsx", "php", "Rscript"})
WRAPPERS = frozenset({"env", "exec", "time", "nice", "nohup", "command", "xvfb-run"})


def command_files(command: str | None, paths: Container[str]) -> tuple[list[str], dict[str, tuple[str, ...]]]:
    """The files of the trusted tree a verify command runs: each program it names (`./run-tests`,
    `scripts/check.sh`) and the script an interpreter is given (`sh ci/test.sh`, `python
    tools/check.py`); the Makefile for `make`, the justfile for `just`, package.json's scripts
    for npm, yarn and pnpm. A file the command only reads (`grep -q hi greeting.txt`) is not."""
    if not command:
        return [], {}
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words = list(lexer)
    except ValueError:
        words = command.split()
    files: list[str] = []
    sections: dict[str, tuple[str, ...]] = {}
    for simple in _simple_commands(words):
        program, args = simple[0], simple[1:]
        name = program.rsplit("/", 1)[-1]
        if found := _in(program, paths):
            files.append(found)
        elif name == "make":
            files += [n for n in ("Makefile", "makefile", "GNUmakefile") if n in paths]
        elif name == "just":
            files += [n for n in ("justfile", "Justfile", ".justfile") if n in paths]
        elif name in ("npm", "yarn", "pnpm"):
            sections["package.json"] = ("scripts",)
        elif name in INTERPRETERS or re.fullmatch(r"python3(?:\.\d+)?", name):
            script = next((a for a in args if not a.startswith("-")), None)
            if script is not None and "-m" not in args[:args.index(script)] and "-c" not in args[:args.index(script)]:
                if found := _in(script, paths):
                    files.append(found)
    return files, sections


def _in(word: str, paths: Container[str]) -> str | None:
    name = word[2:] if word.startswith("./") else word
    return name if name in paths else None


def _simple_commands(words: list[str]) -> list[list[str]]:
    """The simple commands of a command line, each from its program on (assignments and
    wrappers such as `env` and `timeout 60` left out)."""
    out: list[list[str]] = []
    current: list[str] = []
    for word in [*words, ";"]:
        if word and all(c in "();&|" for c in word):
            while current and ("=" in current[0] and not current[0].startswith("=") or current[0] in WRAPPERS
                               or current[0] == "timeout"):
                dropped = current.pop(0)
                if dropped == "timeout" and current and not current[0].startswith("-"):
                    current.pop(0)  # its duration
            if current:
                out.append(current)
            current = []
        else:
            current.append(word)
    return out
