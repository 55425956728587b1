"""The options of a start, declared once.

`StartRequest` is the one description of what a start takes: each field says its kind, its help
text and how the CLI spells it. `git subtask start` builds its click options from it
(`cli.start_options`), the MCP `start` tool its parameters and `start_many` its item schema
(`mcp_tools`), `api.request_from_dict` its checks of a `start_many` item, and `api.launch` turns
the request into the job's record (`JobSpec`) and, through it, into what the engine gets. A new
option is one field here plus its use in `api._prepare`; `tests/test_start_options.py` fails
until every face takes it and the record keeps it.

Help texts name other options as `{best_of}`: each face spells them its own way (`--best-of` on
the command line, `best_of` over MCP).

Standard library only: the CLI imports this on its hot path.

Invariants:
- Never declare a start option in a face, because the CLI, the MCP tool and `start_many` drifted
  apart (MCP `start` lacked `verify_timeout` and `on`): a field of `StartRequest` is the option
  everywhere (`tests/test_start_options.py`).
"""

from __future__ import annotations

from subtask.model.dataclass import dataclass, field, fields

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any

PICK_RULES = ("smallest", "cheapest", "fastest")
ON_FAIL = ("skip", "run")  # model.ON_FAIL (this module imports nothing of ours: the CLI's hot path)


@dataclass(frozen=True)
class Option:
    """One option of a start: its field name (MCP and start_many spell it so), kind and words."""

    name: str
    kind: type  # str, int, float or bool
    help: str
    default: Any = None
    short: str | None = None  # the CLI's one-letter flag
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    names: bool = False  # a list (or comma-separated names): with best_of, cycled over the attempts
    multiple: bool = False  # repeatable on the CLI, a list (or one string) over MCP
    argument: bool = False  # the CLI takes it as its positional argument
    repeat: bool = False  # the CLI takes the flag more than once (a list of values)
    show_default: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def help_for(self, face: str) -> str:
        """The help text with other options named as `face` ("cli" or "mcp") spells them."""
        return self.help.format(**{o.name: (o.flag if face == "cli" else o.name) for o in OPTIONS})


def _option(kind: type, help: str, default: Any = None, **how: Any) -> Any:
    return field(default=default, metadata={"option": (kind, help, how)})


@dataclass
class StartRequest:
    """What a start asks for. Every field is an option of `git subtask start`, of the MCP `start`
    tool and of a `start_many` item; None means "the default" (git config, then the engine's)."""

    task: str = _option(str, "what the engine should do (for the shell engine: a bash script)", "", argument=True)
    engine: str | list[str] | None = _option(
        str, "shell, claude, codex, a configured command engine, or auto: the best one here by its record "
        "(git subtask routing explain) (default: git config subtask.engine, else claude); with {best_of}: several, "
        "cycled over the attempts", short="-e", names=True)
    base: str = _option(str, "commit or branch the job starts from", "HEAD", short="-b", show_default=True)
    verify: str | None = _option(str, "command run with sh -c (POSIX sh, not bash) in the worktree on the job's "
                                 "final commit; exit 0 = passed")
    verify_timeout: float | None = _option(float, "seconds verify may run (default: subtask.verifyTimeout = 600)")
    timeout: float | None = _option(float, "seconds the engine may run before it is killed")
    max_usd: float | None = _option(float, "budget reserved for a paid engine (default: subtask.defaultMaxUsd = 2)")
    max_turns: int | None = _option(int, "turn cap for agent engines")
    model: str | list[str] | None = _option(str, "model for agent engines; with {best_of}: several, cycled over "
                                            "the attempts", names=True)
    readonly: bool = _option(bool, "no branch: the engine reads a clean checkout of the base and cannot write", False)
    isolation: str | None = _option(str, "none, worktree or readonly: what the engine may write, kernel-enforced "
                                    "(default: git config subtask.isolation, else the engine's: worktree for "
                                    "shell and command engines)", metavar="MODE")
    on: str | None = _option(str, "local or ray: where the job runs (default: git config subtask.executor, else "
                             "local; ray: a node of the cluster at subtask.ray.address, results back through "
                             "subtask.remote)", metavar="EXECUTOR")
    retries: int | None = _option(int, "while {verify} fails, the worker starts up to N more attempts (0-5) of the "
                                  "job in its worktree, each told what verify said; each reserves money as a "
                                  "reply does", metavar="N")
    check: list[str] | None = _option(str, "a check on the diff from the base, run before {verify} (repeatable): "
                                      "no-test-deletion, no-suppression, paths=GLOB; added to git config "
                                      "subtask.git.checks (default no-test-deletion,no-suppression when there is a "
                                      "verify); none drops the checks named before it", metavar="CHECK",
                                      multiple=True)
    harness: list[str] | None = _option(str, "what judges {verify} (repeatable): the tests, test configuration and "
                                        "verify script are taken from the base when verify runs, never from the "
                                        "job (git config subtask.verify.harness, default: each ecosystem's test "
                                        "files); a GLOB adds files to it; job: judged by its own tests (a task that "
                                        "changes tests), and drops what was named before it", metavar="GLOB",
                                        multiple=True)
    best_of: int | None = _option(int, "start a group of N attempts (2-8) at the task and pick the best by "
                                  "{verify}; answers the group id (sg-...)", metavar="N")
    pick: str | None = _option(str, "with {best_of}: how passing attempts rank (default smallest: fewest changed "
                               "lines)", choices=PICK_RULES)
    judge: str | None = _option(str, "with {best_of}: a command run in each passing attempt's worktree; its last "
                                "line is a number, higher is better", metavar="CMD")
    first_pass: bool = _option(bool, "with {best_of}: the first attempt to pass verify wins; the rest are stopped",
                               False)
    after: str | list[str] | None = _option(
        str, "job or group ids (sg-...) to wait for: the job is recorded waiting, holding no slot and no money, and "
        "starts once they ended, from their head (several: their heads merged); several ids: repeat it, or "
        "separate them with commas", names=True, repeat=True, metavar="ID")
    on_fail: str | None = _option(str, "with {after}: skip (default) ends the job skipped when one it waits for "
                                  "did not end done with verify passed; run starts it anyway", choices=ON_FAIL)


GROUP_ONLY = ("pick", "judge", "first_pass")  # meaningful with best_of alone
# What `map` passes to each of its jobs: a start's options but the task (its template is map's own),
# grouping (a map is its own group), waiting and read-only (a map's jobs start now and write).
NOT_FOR_MAP = ("task", "best_of", *GROUP_ONLY, "after", "on_fail", "readonly")


def _options() -> tuple[Option, ...]:
    found = []
    for f in fields(StartRequest):
        kind, help_text, how = f.metadata["option"]
        found.append(Option(f.name, kind, help_text, f.default, **how))
    return tuple(found)


OPTIONS: tuple[Option, ...] = _options()
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
MAP_OPTIONS: tuple[Option, ...] = tuple(o for o in OPTIONS if o.name not in NOT_FOR_MAP)


def item_schema() -> dict[str, Any]:
    """The JSON schema of one start_many item: the fields of a start, plus `repo`."""
    props: dict[str, Any] = {}
    for o in OPTIONS:
        base: dict[str, Any] = {str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"},
                bool: {"type": "boolean"}}[o.kind]
        if o.choices:
            base = {**base, "enum": list(o.choices)}
        if o.names or o.multiple:
            base = {"anyOf": [base, {"type": "array", "items": base}]}
        props[o.name] = {**base, "description": o.help_for("mcp")}
    props["repo"] = {"type": "string", "description": "absolute path to a git work tree (default: the server's)"}
    props["id"] = {"type": "string", "description": "a name for this item, that another item's after may give "
                   "(it then waits for this one)"}
    return {"type": "object", "properties": props, "required": ["task"], "additionalProperties": False}
