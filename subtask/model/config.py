"""Settings from `git config subtask.*`: the one table of every key (`SETTINGS`), and their reading.

`SETTINGS` is every `subtask.*` key the code reads: its kind, range or words, default and meaning.
`start` refuses a bad value of any of them before it makes anything (`Config.require_valid`),
`doctor` reports each bad value and every key the table lacks (`Config.problems`), and the man
page's SETTINGS and README's settings table are made from it (`scripts/gen_docs.py`). A key read
outside the table is a programming error (`Config.get` raises `KeyError`; tests/test_settings.py
also scans the code for keys it names). A row's key may hold `<name>`, an engine's name
(`engine.<name>.command`).

Keys are given without the `subtask.` prefix (`config.get("maxRunning")`). The repository's
`subtask.*` settings are read once, by one `git config` process, when the first is asked for (git's
own reading: includes, conditional includes, worktree config, GIT_CONFIG_* in the environment).
The same process reads the settings git signs and verifies commits with (`user.signingKey`,
`gpg.*`: `config.git("gpg.format")`), so knowing that no key is configured costs nothing.

Invariants:
- Never read a `subtask.*` setting that is not a row of `SETTINGS`, nor start before
  `Config.require_valid` has checked every set one (start, best-of, map, reply), because a key
  read elsewhere is one nobody checks or documents: `subtask.git.checks` was documented while the
  code read `subtask.checks`, and `stallAfter -1` made a job that failed 0.2 s after `start` said
  running (`Config.get` raises on a key outside the table; `tests/test_settings.py` scans the code
  and starts with each bad value).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection

from subtask.model import checknames, lazyre
from subtask.model.dataclass import dataclass
from subtask.model.errors import SubtaskError

KINDS = ("int", "number", "flag", "words", "text", "path", "argv", "regex", "pattern", "checks",
         "amounts", "clone-id", "bytes")
FLAG_WORDS = ("1", "true", "yes", "on", "0", "false", "no", "off")
TRUE_WORDS = FLAG_WORDS[:4]
NAME = "<name>"  # in a row's key: any engine's name


@dataclass(frozen=True)
class Setting:
    """One `subtask.*` key: what it holds, what values make sense, what it means."""

    kind: str  # one of KINDS
    meaning: str
    # The value read when unset; None: unset means none (or what `shown` says).
    default: str | None = None
    shown: str = ""  # the default as a person reads it, where `default` is None or computed
    minimum: float | None = None
    maximum: float | None = None
    words: tuple[str, ...] = ()  # kind "words": the allowed ones
    multi: bool = False  # repeatable (git config --add)
    example: str = ""  # a value the fix suggests when there is no default
    old_names: tuple[str, ...] = ()  # read too when this key is unset (doctor names them as old)
    # A key only that engine reads; NAME: any engine's (the one the key names).
    engine: str | None = None

    @property
    def expect(self) -> str:
        """What a value must be, in words: the table's "type" column and every refusal."""
        if self.kind in ("int", "number"):
            what = "a whole number" if self.kind == "int" else "a number"
            if self.minimum is not None:
                what += f" >= {self.minimum:g}"
            if self.maximum is not None:
                what += f" and <= {self.maximum:g}"
            return what
        if self.kind == "words":
            if len(self.words) == 2:
                return " or ".join(self.words)
            return f"one of {', '.join(self.words)}"
        return {
            "flag": "true or false",
            "text": "text",
            "path": "a path",
            "argv": "a JSON list of strings, the program first",
            "regex": "a regular expression with one group",
            "pattern": "a regular expression",
            "checks": "checks separated by commas: no-test-deletion, no-suppression, paths=GLOB, "
                      "none",
            "amounts": "a JSON object of amounts >= 0",
            "clone-id": "c- and 16 hex digits",
            "bytes": "a size in bytes (k, m, g: KiB, MiB, GiB, as git reads sizes)",
        }[self.kind]


SETTINGS: dict[str, Setting] = {
    "engine": Setting("text",
        "the engine a job runs with when `start` names none (`auto`: chosen per job, see "
        "`subtask.routing.*` and docs/engines.md)",
        shown="claude if usable", example="shell"),
    "routing.engines": Setting("text",
        "the engines `--engine auto` chooses from, in order of preference on a tie",
        shown="every agent engine here (not shell)", example="'claude codex aider'"),
    "routing.weightPass": Setting("number",
        "`--engine auto`: points per unit of an engine's pass rate in this repository's records",
        default="1", minimum=0),
    "routing.weightCost": Setting("number",
        "`--engine auto`: points taken per dollar of an engine's mean cost here",
        default="0.2", minimum=0),
    "routing.weightTime": Setting("number",
        "`--engine auto`: points taken per minute of an engine's mean time here",
        default="0.01", minimum=0),
    "routing.weightRoom": Setting("number",
        "`--engine auto`: points per unit of the share of an engine's `routing.<name>.maxRunning` "
        "left",
        default="0.1", minimum=0),
    "routing.<name>.maxRunning": Setting("int",
        "`--engine auto` passes over this engine while this many of its jobs run here",
        minimum=1, example="2"),
    "maxRunning": Setting("int",
        "workers running at once (across all processes); more jobs queue",
        default="4", minimum=1),
    "maxDepth": Setting("int", "how deep jobs may start jobs", default="2", minimum=1),
    "monthlyCapUsd": Setting("number",
        "monthly spend cap for paid engines, in USD",
        default="100", minimum=0),
    "defaultMaxUsd": Setting("number",
        "a paid job's budget in USD when `start` has no `--max-usd`",
        default="2", minimum=0),
    "maxJobUsd": Setting("number",
        "the largest budget one job may reserve, in USD",
        default="20", minimum=0),
    "worktreeDir": Setting("path",
        "where job worktrees go (never under `.git/`)",
        shown="`<repo>/.subtask/worktrees`", example=".subtask/worktrees"),
    "stateDir": Setting("path",
        "the bookkeeping folder; share one across repositories for a user-wide cap",
        shown="`<git-common-dir>/subtask`", example="~/.local/state/subtask"),
    "verify": Setting("text",
        "the verify command of a best-of group when `start` has no `--verify`",
        example="'pytest -q'"),
    "verifyTimeout": Setting("number", "seconds verify may run", default="600", minimum=1),
    "verify.harness": Setting("text",
        "what judges a verify, taken from a trusted tree (the base; the target's tip in `land`): "
        "`default` (each ecosystem's tests and test configuration, the verify command's own "
        "script), globs added to it (`default,ci/**`), or `none` (judged by its own tests). See "
        "docs/verify.md",
        default="default"),
    "verify.reuse": Setting("flag",
        "reuse a verify result already recorded for the same tree, command, harness and "
        "environment (by this clone, or in a record an allowed signer signed) instead of running "
        "it again (`land --no-reuse`, `verify --run --no-reuse` force a run). See docs/review.md",
        default="true"),
    "verify.fingerprint": Setting("text",
        "a command (`sh -c`, run once per command here) whose output joins the environment "
        "fingerprint of a verify result, so a result is reused only where it prints the same "
        "(`python3 -VV; pip freeze`). See docs/review.md",
        example="'python3 -VV; pip freeze'"),
    "land.window": Setting("int",
        "integrated states `land` verifies at once (`--window`; `0`: the cores, at most the free "
        "worker slots)",
        default="0", minimum=0, maximum=64),
    "land.batch": Setting("int",
        "jobs per batch of `land --batch` when it names no size (`0`: the whole queue)",
        default="0", minimum=0),
    "git.checks": Setting("checks",
        "the checks on the diff every job with a verify runs before it (`none`: none); `start "
        "--check` adds to them. See docs/verify.md",
        default="no-test-deletion,no-suppression", old_names=("checks",)),
    "defaultTimeout": Setting("number",
        "seconds a paid engine may run when `start` has no `--timeout` (`0`: no limit)",
        default="3600", minimum=0),
    "stallAfter": Setting("number",
        "seconds an engine may be silent before its job is marked stalled (`wait` returns on "
        "it; `0`: never). See docs/engines.md",
        default="600", minimum=0),
    "stallAction": Setting("words",
        "what follows a stall: `mark` the job, or `stop` its engine",
        default="mark", words=("mark", "stop")),
    "stopGrace": Setting("number",
        "seconds between SIGTERM and SIGKILL when a job is stopped",
        default="5", minimum=0),
    "landTarget": Setting("text",
        "the branch a job has landed in when its work is there, and the one `land` moves",
        shown="the current branch", example="main"),
    "deleteLandedBranches": Setting("flag",
        "delete a job's branch once it has landed",
        default="true"),
    "sweepInterval": Setting("number",
        "seconds between the lazy landed-job sweeps inside other commands",
        default="30", minimum=0),
    "notify": Setting("text",
        "a command run (`sh -c`, unconfined: your own hook) once when a job ends, fails verify, "
        "stalls or waits for a reply; `$SUBTASK_JOB_ID`, `$SUBTASK_EVENT`, `$SUBTASK_STATE`, "
        "`$SUBTASK_REASON`, `$SUBTASK_SUMMARY` in its environment. See docs/engines.md",
        example='\'notify-send "$SUBTASK_SUMMARY"\''),
    "setup": Setting("text",
        "a command run (`sh -c`, confined as the job) in each new worktree before the engine",
        example="'make deps'"),
    "setupTimeout": Setting("number",
        "seconds `subtask.setup` (and `subtask.teardown`) may run",
        default="600", minimum=1),
    "teardown": Setting("text",
        "a command run (`sh -c`, confined as the job) when each attempt ends, to stop what the "
        "job started (`docker compose down`)",
        example="'docker compose down'"),
    "portBase": Setting("int",
        "the first port handed to running jobs (`$SUBTASK_PORT`); ports are never shared by two "
        "running jobs nor bound by anything else at a job's start (docs/orchestration.md)",
        default="20000", minimum=1, maximum=65535),
    "portsPerJob": Setting("int",
        "consecutive ports each running job gets from `$SUBTASK_PORT`",
        default="10", minimum=1, maximum=65535),
    "refLockStale": Setting("number",
        "seconds after which a job record's ref lock is a dead writer's leftover, removed",
        default="10", minimum=1),
    "packLooseObjects": Setting("int",
        "loose objects added since the last pack that make a worker pack them (one new pack, "
        "nothing deleted) before its checkout (`0`: never). See docs/benchmarks.md",
        default="1024", minimum=0),
    "pool": Setting("int",
        "ready worktrees kept for the next jobs: a job's worker takes one (the files that differ "
        "from its base rewritten) and refills it in the background of that job; a landed or "
        "cleaned-up job's clean worktree goes back (`0`: none). See docs/pool.md",
        default="2", minimum=0),
    "poolMaxBytes": Setting("bytes",
        "the most disk the pool's worktrees may take; beyond it none is made or kept",
        default="2g"),
    "executor": Setting("words",
        "where jobs run (`start --on` per job): `ray` submits them to a Ray cluster, results "
        "back through the remote. See docs/scale-out.md",
        default="local", words=("local", "ray")),
    "remote": Setting("text",
        "the remote Ray nodes fetch a job from and push it to",
        default="origin"),
    "ray.address": Setting("text",
        "the Ray job server (its dashboard), `http://<head>:8265`",
        shown="`$RAY_ADDRESS`", example="http://127.0.0.1:8265"),
    "ray.resources": Setting("amounts",
        "extra Ray resources each job asks for, beside one `subtask_slot`",
        example='\'{"gpu_box": 1}\''),
    "ray.env": Setting("text",
        "names of more environment variables to send with a Ray job",
        multi=True, example="MY_TOKEN"),
    "ray.command": Setting("text",
        "the command Ray nodes run (`<command> run-remote <id> ...`)",
        default="git-subtask"),
    "sign": Setting("words",
        "sign every record and notes commit when git has a signing key (`user.signingKey`, "
        "`gpg.format`); `always` refuses to start without one; `never`. A teammate's record "
        "merges on its verify only when an allowed signer (`gpg.ssh.allowedSignersFile`) signed "
        "it. See docs/review.md",
        default="auto", words=("auto", "always", "never")),
    "cloneId": Setting("clone-id",
        "this clone's identity, recorded in each job it starts (made at the first start; never "
        "copy it to another clone)",
        shown="made at the first start"),
    "isolation": Setting("words",
        "what the engine may see and write, kernel-enforced (a view of its own built from an "
        "allowlist, Landlock for writes, a pid namespace so no child outlives the job). See "
        "docs/security.md",
        shown="the engine's (`worktree` for shell and command)",
        words=("none", "worktree", "readonly")),
    "isolation.writable": Setting("path",
        "a path confined jobs may write too (`~` and `$VARS` expanded)",
        multi=True, example="~/.cache"),
    "isolation.readable": Setting("path",
        "a path a confined job's view shows read-only (`~` and `$VARS` expanded)",
        multi=True, example="~/.config/pip"),
    "isolation.socket": Setting("path",
        "a host socket a confined job may connect to (recorded in the job's spec, shown in its "
        "evidence); no other host socket is in its view",
        multi=True, example="$SSH_AUTH_SOCK"),
    "isolation.env": Setting("text",
        "a variable passed to a confined job although it looks like a credential or names a host "
        "socket",
        multi=True, example="GITHUB_TOKEN"),
    "isolation.network": Setting("words",
        "`none`: a job's processes get a network namespace with only their own loopback "
        "(refused where it cannot be enforced)",
        default="allow", words=("allow", "none")),
    "engine.<name>.command": Setting("argv",
        "a command engine's argv template: `{task}`, `{task_file}`, `{worktree}`, `{model}`, "
        "`{session}`. See docs/engines.md",
        example='\'["aider", "--message-file", "{task_file}"]\'', engine=NAME),
    "engine.<name>.resumeCommand": Setting("argv",
        "a command engine's argv template for a reply to a known session",
        example='\'["agent", "--resume", "{session}"]\'', engine=NAME),
    "engine.<name>.paid": Setting("flag",
        "a command engine that costs money: a budget is reserved for it",
        default="false", engine=NAME),
    "engine.<name>.costPattern": Setting("regex",
        "finds a paid command engine's cost in its output (group 1, dollars; the last match "
        "counts)",
        example="'cost: \\$([0-9.]+)'", engine=NAME),
    "engine.<name>.costSum": Setting("flag",
        "add up every `costPattern` match instead of taking the last (an agent that prints each "
        "step's cost: OpenCode)",
        default="false", engine=NAME),
    "engine.<name>.textPattern": Setting("regex",
        "finds the agent's own words in its output (group 1, JSON escapes decoded): the summary "
        "and the STATUS line are read from them (an agent that prints JSON lines)",
        example=r"""'"text": *"((?:[^"\\]|\\.)*)"'""", engine=NAME),
    "engine.<name>.sessionPattern": Setting("regex",
        "finds a command engine's session id in its output (group 1)",
        example="'session: (\\S+)'", engine=NAME),
    "engine.<name>.answerPattern": Setting("pattern",
        "a line a command engine prints for every model answer: a run that printed none, and no "
        "cost, is charged $0",
        example="'^Tokens: '", engine=NAME),
    "engine.<name>.exclude": Setting("text",
        "a pathspec kept out of what the worker commits for this engine",
        multi=True, example="'.aider*'", engine=NAME),
    "engine.claude.cliPath": Setting("path",
        "the Claude Code CLI the claude engine runs (else `$SUBTASK_CLAUDE_CLI`, else the SDK's "
        "own)",
        shown="the SDK's", example="/usr/local/bin/claude", engine="claude"),
    "engine.codex.path": Setting("path",
        "the codex binary (else `$SUBTASK_CODEX_BIN`, else `codex` on PATH)",
        shown="`codex` on PATH", example="codex", engine="codex"),
    "engine.codex.sandbox": Setting("words",
        "codex's own sandbox; `danger-full-access` leaves confinement to git-subtask alone",
        default="workspace-write", words=("read-only", "workspace-write", "danger-full-access"),
        engine="codex"),
    "engine.codex.network": Setting("flag",
        "let codex's sandbox reach the network",
        default="false", engine="codex"),
    "engine.codex.costPerMTokIn": Setting("number",
        "USD per million input tokens (with `costPerMTokOut`: codex jobs are charged their "
        "tokens, not their whole reservation)",
        minimum=0, example="1.25", engine="codex"),
    "engine.codex.costPerMTokOut": Setting("number",
        "USD per million output tokens",
        minimum=0, example="10", engine="codex"),
    "engine.codex.costPerMTokCachedIn": Setting("number",
        "USD per million cached input tokens",
        shown="the input price", minimum=0, example="0.125", engine="codex"),
}


def documented() -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) of every row, as the man page and README show them."""
    rows = []
    for key, setting in SETTINGS.items():
        kind = setting.expect + (" (repeatable)" if setting.multi else "")
        default = f"`{setting.default}`" if setting.default is not None else setting.shown or "none"
        old = "".join(f" (old name: `subtask.{name}`)" for name in setting.old_names)
        rows.append((f"subtask.{key}", kind, default, setting.meaning + old))
    return rows


def _parts(key: str) -> tuple[str, str]:
    """(subsection, name) of a key without `subtask.`: the name compared as git does (any case),
    the subsection as written."""
    sub, _, name = key.rpartition(".")
    return sub, name.lower()


_EXACT: dict[tuple[str, str], str] = {}
_PATTERNS: list[tuple[re.Pattern[str], str, str]] = []
for _key, _setting in SETTINGS.items():
    for _spelling in (_key, *_setting.old_names):
        _sub, _name = _parts(_spelling)
        if NAME in _sub:
            _sub_re = lazyre.compile(re.escape(_sub).replace(re.escape(NAME), r"[^.]+"))
            _PATTERNS.append((_sub_re, _name, _key))
        else:
            _EXACT[(_sub, _name)] = _key
_ROWS: dict[str, str | None] = {}


def row(key: str) -> str | None:
    """The table's key for `key` (with or without `subtask.`, as git prints it or as code spells
    it: `stallafter`, `engine.aider.costPattern`), or None when the table lacks it."""
    if key in _ROWS:
        return _ROWS[key]
    bare = key[len("subtask."):] if key[:8].lower() == "subtask." else key
    sub, name = _parts(bare)
    found = _EXACT.get((sub, name))
    if found is None:
        found = next((k for pattern, n, k in _PATTERNS if n == name and pattern.fullmatch(sub)),
                     None)
    _ROWS[key] = found
    return found


def spelled(key: str) -> str:
    """`key` without `subtask.`, its name as the table spells it (git prints names lower-cased):
    `stallafter` -> `stallAfter`, `engine.aider.costpattern` -> `engine.aider.costPattern`."""
    bare = key[len("subtask."):] if key[:8].lower() == "subtask." else key
    table_key = row(bare)
    if table_key is None:
        return bare
    sub, name = _parts(bare)
    for candidate in (table_key, *SETTINGS[table_key].old_names):
        written = candidate.rpartition(".")[2]
        if written.lower() == name:
            return f"{sub}.{written}" if sub else written
    return bare


def engine_name(key: str) -> str | None:
    """The engine a patterned key is about (`engine.aider.paid` -> aider)."""
    bare = key[len("subtask."):] if key[:8].lower() == "subtask." else key
    parts = bare.split(".")
    return parts[1] if len(parts) == 3 and parts[0].lower() == "engine" else None


def value_problem(key: str, raw: str) -> str | None:
    """What is wrong with `raw` as the value of `key` (a key of the table), or None. Words and flags
    are read as git reads them: any case, surrounding blanks ignored."""
    setting = SETTINGS[row(key) or key]
    value = raw.strip()
    kind = setting.kind
    if kind in ("int", "number"):
        try:
            number = float(value)
        except ValueError:
            return ""
        if not math.isfinite(number) or (setting.minimum is not None and number < setting.minimum) \
                or (setting.maximum is not None and number > setting.maximum) \
                or (kind == "int" and number != int(number)):
            return ""
        return None
    if kind == "flag":
        return None if value.lower() in FLAG_WORDS else ""
    if kind == "words":
        return None if value.lower() in setting.words else ""
    if kind == "argv":
        return None if parse_argv(raw) is not None else ""
    if kind == "regex":
        try:
            if re.compile(raw).groups >= 1:
                return None
            return "has no group (the part in parentheses is read)"
        except re.error as exc:
            return f"is not a regular expression ({exc})"
    if kind == "pattern":
        try:
            re.compile(raw)
            return None
        except re.error as exc:
            return f"is not a regular expression ({exc})"
    if kind == "checks":
        return checknames.problem(raw)
    if kind == "amounts":
        return None if amounts(raw) is not None else ""
    if kind == "clone-id":
        return None if re.fullmatch(r"c-[0-9a-f]{16}", value) else ""
    if kind == "bytes":
        return None if parse_bytes(value) is not None else ""
    return None  # text, path: any value


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_bytes(raw: str) -> int | None:
    """A size as git reads one (`512`, `64k`, `2g`, any case), or None."""
    value = raw.strip().lower()
    unit = value[-1:] if value[-1:] in _UNITS else ""
    number = value[:len(value) - len(unit)]
    if not number.isdigit():
        return None
    return int(number) * _UNITS[unit]


def parse_argv(raw: str | None) -> list[str] | None:
    """An argv template from its JSON text, or None when missing or not a list of strings."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        return None
    return value if value[0].strip() else None


def amounts(raw: str) -> dict[str, float] | None:
    """A JSON object of amounts >= 0 (`{"gpu_box": 1}`), or None."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
            for v in value.values()):
        return None
    return {str(k): float(v) for k, v in value.items()}


def refusal(key: str, raw: str) -> str | None:
    """`git config subtask.stallAfter must be a number >= 0, not '-1'`, or None for a good value."""
    found = value_problem(key, raw)
    if found is None:
        return None
    key = spelled(key)
    setting = SETTINGS[row(key) or key]
    if setting.kind == "checks":  # the grammar's own words name the item that is wrong
        return f"git config subtask.{key}: {found}"
    why = f": it {found}" if found else ""
    return f"git config subtask.{key} must be {setting.expect}, not {raw!r}{why}"


def fix_hint(key: str) -> str:
    """A command that sets `key` to a good value: its default, else an example."""
    key = spelled(key)
    setting = SETTINGS[row(key) or key]
    value = setting.default if setting.default is not None else setting.example
    if not value:
        return f"git config --unset subtask.{key}"
    if setting.default is not None:
        import shlex

        value = shlex.quote(value)
    return f"git config subtask.{key} {value}"


@dataclass(frozen=True)
class Problem:
    """A `subtask.*` key set to a value the table refuses (`bad`), a key the table lacks
    (`unknown`), or an old name of a key (`old`)."""

    key: str  # as git spells it, without `subtask.`
    level: str  # bad | unknown | old
    message: str
    fix: str


def unknown_key_problem(key: str) -> Problem:
    """A key nobody reads, and the nearest one the table has (a typo, most likely)."""
    near = nearest(key)
    said = f"; did you mean subtask.{near}?" if near else ""
    fix = _move(key, near) if near else f"git config --unset subtask.{key}"
    return Problem(key, "unknown", f"git-subtask reads no subtask.{key}{said}", fix)


def _move(old: str, new: str) -> str:
    """The commands that give `new` the value of `old`, and unset `old`."""
    return (f"git config subtask.{new} \"$(git config subtask.{old})\" && "
            f"git config --unset subtask.{old}")


def nearest(key: str) -> str | None:
    """The table's key closest to `key`, spelled with `key`'s engine name where the row has one (an
    old name suggests the new one)."""
    import difflib  # doctor's, not every command's

    name = engine_name(key)
    suggest = {}
    for k, setting in SETTINGS.items():
        spelled = k.replace(NAME, name) if name and NAME in k else k
        suggest[spelled.lower()] = spelled
        suggest.update({old.lower(): k for old in setting.old_names})
    close = difflib.get_close_matches(key.lower(), list(suggest), n=1, cutoff=0.75)
    return suggest[close[0]] if close else None


class Config:
    def __init__(self, reader: Callable[[str], str | None]):
        self._read = reader

    def get(self, key: str, default: str | None = None) -> str | None:
        """The value of `key`, else of its old names, else `default`, else the table's default.
        `key` must be in the table: reading one outside it raises KeyError (a bug here)."""
        setting = SETTINGS[_readable(key)]
        value = self._read("subtask." + key)
        for old in setting.old_names if value is None else ():
            value = self._read("subtask." + old)
            if value is not None:
                break
        if value is None:
            return default if default is not None else setting.default
        return value

    def __call__(self, key: str) -> str | None:
        return self.get(key)

    def get_all(self, key: str) -> list[str]:
        """Every value of `subtask.<key>` (one of `MULTI_VALUED`), e.g. `isolation.socket`."""
        return self._read.every("subtask." + key) if isinstance(self._read, GitSettings) else (
            [v for v in [self._read("subtask." + key)] if v is not None])

    def git(self, key: str) -> str | None:
        """A setting outside `subtask.*` that `SETTINGS_ARGS` reads (`user.signingKey`, `user.name`,
        `user.email`, `gpg.*`, `core.sharedRepository`, `core.fsync`, `core.fsyncObjectFiles`,
        `extensions.objectFormat`, `notes.subtask.mergeStrategy`), by its lower-case name."""
        return self._read(key)

    def remember(self, key: str, value: str) -> None:
        """A `subtask.*` value this process just wrote with `git config`, read back from now on."""
        _readable(key)
        if isinstance(self._read, GitSettings):
            self._read.set(_canonical("subtask." + key), value)

    def sign_mode(self) -> str:
        """`subtask.sign` (auto, always, never); a value that is none of them reads as auto (start
        refuses it, doctor names it)."""
        return sign_mode_of(self.get("sign"))

    def signing_key(self) -> str | None:
        """The key git signs with (`user.signingKey`), unless `subtask.sign` is never."""
        return signing_key_of(self._read)

    def for_engine_plugin(self, name: str) -> Callable[[str], str | None]:
        """The reader an engine from another package (`subtask.engines` entry point) gets: the
        table's keys as `get` reads them, and its own `engine.<name>.*` keys, which the table
        cannot list, as git gave them."""
        own = f"engine.{name}."

        def read(key: str) -> str | None:
            if key.startswith(own) and row(key) is None:
                return self._read("subtask." + key)
            return self.get(key)

        return read

    def settings(self) -> dict[str, str] | None:
        """Every setting as git gave them (None when they do not come from git)."""
        return self._read.all() if isinstance(self._read, GitSettings) else None

    def number(self, key: str) -> float:
        raw = self.get(key) or ""
        problem = refusal(key, raw)
        if problem:
            raise SubtaskError("fatal", problem, hint=fix_hint(key))
        return float(raw)

    def integer(self, key: str) -> int:
        return int(self.number(key))

    def size(self, key: str) -> int:
        """A `bytes` setting (`2g`) in bytes."""
        raw = self.get(key) or ""
        problem = refusal(key, raw)
        if problem:
            raise SubtaskError("fatal", problem, hint=fix_hint(key))
        return parse_bytes(raw) or 0

    def choice(self, key: str) -> str:
        """One of the key's words; the default for anything else (start refuses it)."""
        setting = SETTINGS[_readable(key)]
        value = (self.get(key) or "").strip().lower()
        return value if value in setting.words else setting.default or setting.words[0]

    def flag(self, key: str) -> bool:
        return (self.get(key) or "").strip().lower() in TRUE_WORDS

    def problems(self, engine_plugins: Collection[str] = ()) -> list[Problem]:
        """Every `subtask.*` key set here that the table refuses, lacks, or knows by an old name
        (`engine.<name>.*` keys of `engine_plugins` aside: those engines read their own)."""
        found = []
        for key, raw in self._set():
            table_key = row(key)
            if table_key is None and engine_name(key) not in engine_plugins:
                found.append(unknown_key_problem(key))
            if table_key is None:
                continue
            problem = refusal(key, raw)
            if problem:
                found.append(Problem(key, "bad", problem, fix_hint(key)))
            if NAME not in table_key and _parts(key) != _parts(table_key):
                found.append(self._old_name_problem(key, table_key))
        return found

    def require_valid(self, engine: str | None = None) -> None:
        """Refuse (exit 128, the key and its fix named) a value the table refuses, of every key but
        those of engines other than `engine`: what `start` checks before it makes anything."""
        bad = [(key, problem) for key, raw in self._set()
               if row(key) is not None and _applies(key, engine)
               for problem in [refusal(key, raw)] if problem]
        if bad:
            key, problem = bad[0]
            more = f" (and {len(bad) - 1} more: git subtask doctor)" if len(bad) > 1 else ""
            raise SubtaskError("fatal", problem + more, hint=fix_hint(key))

    def _set(self) -> list[tuple[str, str]]:
        """(key as the table spells it, value) of every `subtask.*` key git gave."""
        given = self.settings() or {}
        return [(spelled(key), value) for key, value in given.items() if key.startswith("subtask.")]

    def _old_name_problem(self, old: str, new: str) -> Problem:
        said = f"subtask.{old} is the old name of subtask.{new}"
        if self._read("subtask." + new) is not None:
            return Problem(old, "old", f"{said}, which is set too: subtask.{old} is not read",
                           f"git config --unset subtask.{old}")
        return Problem(old, "old", said, _move(old, new))


def _readable(key: str) -> str:
    """The table's key the code may read as `key` (its own spelling, or a patterned row's with an
    engine's name); KeyError for any other, an old name included: a bug here, never a user's."""
    table_key = row(key)
    if table_key is None or (NAME not in table_key and _parts(key) != _parts(table_key)):
        raise KeyError(f"subtask.{key} is not in the table of settings "
                       "(subtask/model/config.py SETTINGS)")
    return table_key


def _applies(key: str, engine: str | None) -> bool:
    """Does a job of `engine` read `key`? Every key but another engine's."""
    owner = SETTINGS[row(key) or key].engine
    if owner is None:
        return True
    return (engine_name(key) if owner == NAME else owner) == engine


def sign_mode_of(value: str | None) -> str:
    value = (value or "auto").strip().lower()
    return value if value in SETTINGS["sign"].words else "auto"


def signing_key_of(read: Callable[[str], str | None]) -> str | None:
    """The signing key a reader of git settings names, unless `subtask.sign` is never: the one
    rule both the record writer (`Config`) and the notes writer (pygit2's config) follow."""
    if sign_mode_of(read("subtask.sign")) == "never":
        return None
    return (read("user.signingkey") or "").strip() or None


class GitSettings:
    """A reader over every `subtask.*` setting git gave (`SETTINGS_ARGS`, `parse_settings`; the
    last value of a key wins, as in `git config --get`)."""

    def __init__(self, values: dict[str, str]):
        self._values = values

    def __call__(self, key: str) -> str | None:
        return self._values.get(_canonical(key))

    def every(self, key: str) -> list[str]:
        """Every value of a `MULTI_VALUED` key, in the order git gave them."""
        kept = self._values.get(_ALL + _canonical(key))
        return kept.split("\0") if kept is not None else []

    def all(self) -> dict[str, str]:
        return self._values  # `_ALL` keys too: a worker forked with them reads what we read

    def set(self, key: str, value: str) -> None:
        self._values[key] = value


# Every `subtask.*` setting, those git signs commits with, and those that say how git writes
# objects (`git/loose.py`, `gitrepo.open_repo`), and how our notes merge (`notes.ensure_notes_config`):
# one process reads them all.
SETTINGS_ARGS = ("config", "-z", "--get-regexp",
                 r"^(subtask|gpg)\.|^user\.(signingkey|name|email)$|^core\.(sharedrepository|fsync|fsyncobjectfiles)$"
                 r"|^extensions\.objectformat$|^notes\.subtask\.mergestrategy$")


# Keys that may be given many times (`git config --add`): every value is kept, for `get_all`.
MULTI_VALUED = ("subtask.isolation.writable", "subtask.isolation.readable", "subtask.isolation.socket",
                "subtask.isolation.env")
_ALL = "\0all:"  # the prefix of the key under which a multi-valued key's values are kept, NUL-separated


def parse_settings(out: bytes) -> dict[str, str]:
    """`git config -z --get-regexp` output as {key: last value} (and every value of a
    `MULTI_VALUED` key under `_ALL` + key)."""
    values: dict[str, str] = {}
    for item in out.decode("utf-8", "surrogateescape").split("\0"):
        key, _, value = item.partition("\n")
        if key:
            values[key] = value
            if key in MULTI_VALUED or _an_engines_excludes(key):
                kept = values.get(_ALL + key)
                values[_ALL + key] = value if kept is None else kept + "\0" + value
    return values


def _an_engines_excludes(key: str) -> bool:
    """`subtask.engine.<name>.exclude`, given once per pattern (`worker/evidence.engine_excludes`)."""
    return key.startswith("subtask.engine.") and key.endswith(".exclude")


def _canonical(key: str) -> str:
    """A key as git prints it: section and name lower-cased, a subsection as written."""
    section, _, rest = key.partition(".")
    middle, _, name = rest.rpartition(".")
    return ".".join(part for part in (section.lower(), middle, name.lower()) if part)
