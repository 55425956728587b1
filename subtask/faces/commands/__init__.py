"""The commands a person and an agent call most, declared once and run without click.

`COMMANDS` is a lazy registry, as pip keeps one: each command's name, words, arguments and
options, and the module (`subtask.faces.commands.<name>`) whose `run(**values)` does it. A call
of one of them imports the parser below and that module only: never click (~40 ms of a ~70 ms
floor), nor another command's modules. The click CLI (`faces/cli.py`) builds the same commands
from these declarations, so `-h`, the man page, completion and docs/cli.md come from one source.

`run(argv)` parses what it is sure of: known options in their long and short spellings,
`--opt=value`, flags, `--` and positional arguments, the values converted as click converts
them. Anything else (`-h`, an option it does not know, a value that does not convert, a
missing or extra argument) is left to click, which then says what is wrong in its own words
and exits 129, as for any command (`tests/test_commands.py` holds the two parsers to the same
answers).

Standard library only, and nothing else of ours but `faces/output` once a command runs.

Invariants:
- Never let the registry's parser accept a command line click would refuse or read otherwise,
  because the same command would then answer differently depending on whether it ran without
  click: it reads only what it is sure of and leaves the rest (`-h`, an unknown option, a bad
  value, a missing argument) to click, and both are built from one declaration
  (`tests/test_commands.py` compares their answers).
"""

from __future__ import annotations

import sys

NARGS_ANY = -1


class Param:
    """An argument (no flags) or an option of a command."""

    __slots__ = ("name", "flags", "kind", "help", "default", "metavar", "nargs", "required", "multiple",
                 "minimum", "choices", "is_flag", "show_default")

    def __init__(self, name: str, *flags: str, kind: type = str, help: str = "", default=None,
                 metavar: str | None = None, nargs: int = 1, required: bool = False, multiple: bool = False,
                 minimum: int | None = None, choices: tuple[str, ...] | None = None, is_flag: bool = False,
                 show_default: bool = False):
        self.name, self.flags, self.kind, self.help, self.default = name, flags, kind, help, default
        self.metavar, self.nargs, self.required, self.multiple = metavar, nargs, required, multiple
        self.minimum, self.choices, self.is_flag, self.show_default = minimum, choices, is_flag, show_default

    @property
    def is_argument(self) -> bool:
        return not self.flags


class Command:
    __slots__ = ("name", "help", "_params")

    def __init__(self, name: str, help: str, params):
        self.name, self.help, self._params = name, help, params

    @property
    def params(self) -> list[Param]:
        if callable(self._params):  # start's come from the one description of a start
            self._params = self._params()
        return self._params

    @property
    def module(self) -> str:
        return f"subtask.faces.commands.{self.name}"


def _json(help: str = "") -> Param:
    return Param("as_json", "--json", is_flag=True, help=help)


def _start_params() -> list[Param]:
    from subtask.model.start_options import OPTIONS

    params = []
    for option in OPTIONS:
        if option.argument:
            params.append(Param(option.name, metavar=option.name.upper(), required=True))
            continue
        flags = (option.flag, *((option.short,) if option.short else ()))
        if option.kind is bool:
            params.append(Param(option.name, *flags, is_flag=True, help=option.help_for("cli")))
            continue
        params.append(Param(option.name, *flags, kind=option.kind, default=option.default, metavar=option.metavar,
                            multiple=option.multiple or option.repeat, choices=option.choices,
                            show_default=option.show_default, help=option.help_for("cli")))
    params.append(_json("print the job (or the group) as JSON"))
    return params


COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("start",
            "Start a job in its own worktree and branch; print one line at once: its id, state, engine, branch."
            """

    TASK is what the engine should do (for the shell engine: a bash script). Use - to read it from
    standard input. With --best-of N, start a group of N jobs and print the group id (sg-...).
    The job runs in its own worktree, from a commit, at the top of the repository: a note on
    stderr says when your uncommitted changes, the folder you are in or the base's submodules are
    not in it.
    """, _start_params),
    Command("wait", """Block until the jobs end, or one stalls; print one line per job.

    A job whose engine has said nothing for subtask.stallAfter seconds (default 600) is stalled:
    wait returns on it, naming it (it goes on running). A group id (sg-...), alone or beside job
    ids, waits until its members end and says its pick. Exit 0 when every job ended done with
    verify passed (or no verify) and every group has a passing pick; 1 otherwise.

    With --since CURSOR, wait answers as soon as a job has an event after the cursor (a state
    change, a stall mark set or cleared, a line of progress), with every such event, the jobs'
    lines and `cursor: ...`: pass that cursor to the next wait --since and no event is missed or
    told twice. Exit codes as without it (1 while a job still runs).
    """, [Param("ids", nargs=NARGS_ANY, required=True),
          Param("any_", "--any", is_flag=True, help="return when the first job ends"),
          Param("timeout", "--timeout", kind=float, help="give up after this many seconds (exit 1); 0: look once"),
          Param("since", "--since", metavar="CURSOR", help="answer the events after CURSOR (0: from the beginning) "
                "as soon as there is one, and the cursor after them"),
          _json()]),
    Command("list", """One line per job: id, state, verify, age, cost, engine, task (newest first).

    Active jobs always show; finished ones up to the limit; landed ones only with --all.
    """, [Param("state", "--state", help="waiting, queued, running, done, failed, stopped, skipped, active or ended"),
          Param("include_all", "--all", is_flag=True, help="every job, landed ones too, with no limit"),
          Param("limit", "--limit", "-n", kind=int, minimum=1, help="at most this many finished jobs (default 50)"),
          _json()]),
    Command("status", "What a job (default: every active job) is doing now: state, queue position, latest activity.",
            [Param("job_id", metavar="ID"), _json()]),
    Command("show", "The record of a job: spec, state, attempts, evidence, summary.",
            [Param("job_id", metavar="ID", required=True), _json(),
             Param("show_log", "--log", is_flag=True, help="print the worker's log too")]),
    Command("result", "The job's one-line status and summary; exit 1 unless it is done with verify passed.",
            [Param("job_id", metavar="ID", required=True),
             Param("full", "--full", is_flag=True, help="the whole summary, not the first 10 lines"),
             Param("evidence", "--evidence", "--json", is_flag=True, help="print the evidence envelope as JSON")]),
    Command("cleanup",
            "Remove a finished job's worktree if it is clean, or (--merged) clean up after every landed job."
            """

    Nothing unmerged is deleted: a dirty worktree is kept, and a branch is deleted only when its
    work is in the current branch (merged, fast-forwarded, squashed or rebased) and
    subtask.deleteLandedBranches is true (the default). `cleanup ID` also deletes the job's
    branch when it has no commits beyond its base (a job stopped or failed before committing);
    the record and pins stay, and a reply recreates the branch. A clean worktree goes back to
    the pool of ready worktrees when it has room (subtask.pool), for the next job.
    """, [Param("job_id", metavar="[ID]"),
          Param("merged", "--merged", is_flag=True,
                help="every job that landed: record it, remove its clean worktree, delete its branch"),
          Param("dry_run", "--dry-run", "-n", is_flag=True, help="say what would be removed"),
          Param("quiet", "--quiet", "-q", is_flag=True, help="print nothing (for the post-merge hook)"),
          _json()]),
)}


class Unsure(Exception):
    """Not a command line this parser is sure of: click reads it."""


def parse(command: Command, argv: list[str]) -> dict:
    """The values of `command`'s parameters in `argv`, as click would give them; `Unsure` when
    click must read it (help, an unknown option, a bad value, a missing or extra argument)."""
    options = {flag: p for p in command.params if not p.is_argument for flag in p.flags}
    arguments = [p for p in command.params if p.is_argument]
    values: dict = {p.name: ([] if p.multiple else False if p.is_flag else p.default) for p in command.params}
    for p in arguments:
        values[p.name] = [] if p.nargs == NARGS_ANY else None
    positional: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if word == "--":
            positional += argv[i:]
            break
        if not word.startswith("-") or word == "-":
            positional.append(word)
            continue
        name, eq, inline = word.partition("=") if word.startswith("--") else (word, "", "")
        param = options.get(name)
        if param is None:
            raise Unsure(word)  # -h, --help, an unknown or combined option
        if param.is_flag:
            if eq:
                raise Unsure(word)
            values[param.name] = True
            continue
        if eq:
            raw = inline
        elif i < len(argv):
            raw, i = argv[i], i + 1
        else:
            raise Unsure(word)
        value = _convert(param, raw)
        if param.multiple:
            values[param.name].append(value)
        else:
            values[param.name] = value
    for p in arguments:
        if p.nargs == NARGS_ANY:
            values[p.name], positional = tuple(positional), []
            if p.required and not values[p.name]:
                raise Unsure(p.name)
        elif positional:
            values[p.name] = positional.pop(0)
        elif p.required:
            raise Unsure(p.name)
    if positional:
        raise Unsure(positional[0])
    for p in command.params:
        if p.multiple:  # repeatable; none given is the default (None), not ()
            values[p.name] = values[p.name] or None
    return values


def _convert(param: Param, raw: str):
    if param.choices is not None and raw not in param.choices:
        raise Unsure(raw)
    if param.kind is str:
        return raw
    try:
        value = param.kind(raw.strip())
    except ValueError:
        raise Unsure(raw) from None
    if param.kind is float and value != value:  # click refuses nan
        raise Unsure(raw)
    if param.minimum is not None and value < param.minimum:
        raise Unsure(raw)
    return value


def find(argv: list[str]) -> tuple[Command, dict] | None:
    """The command `argv` names and its values, when it is one of `COMMANDS` and parsed without
    doubt; else None (click reads it)."""
    command = COMMANDS.get(argv[0]) if argv else None
    if command is None:
        return None
    try:
        return command, parse(command, argv[1:])
    except Unsure:
        return None


def version() -> None:
    from subtask import __version__

    sys.stdout.write(f"git-subtask {__version__}\n")
    sys.exit(0)


def call(command: Command, values: dict) -> None:
    """Run `command` with its parsed values under the one error path (`output.guarded`); exits."""
    from subtask.faces import output

    output.prepare()
    output.guarded(lambda: call_here(command, values))


def call_here(command: Command, values: dict) -> None:
    """Run `command` in the caller's error path (the click CLI's)."""
    __import__(command.module, fromlist=["run"]).run(**values)
