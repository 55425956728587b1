"""The `command` engine: any CLI agent, run from an argv template kept in git config.

    git config subtask.engine.<name>.command '["aider","--yes","--message","{task}"]'

What it owns: reading the template, substituting the placeholders `{task}`, `{task_file}`,
`{worktree}`, `{model}` (and `{session}` in the optional resume template) inside each argv
element, running the argv in the worktree, and reading cost and status from its output.

Invariants:
- Never a shell and never `str.format`: each element is a JSON string whose placeholders are
  replaced literally in one pass, so a task holding quotes, `$(...)` or `{worktree}` reaches the
  agent as the exact text, inside a single argv element.
- `{task_file}` is the attempt's private task file (`ctx.task_file()`: 0600, in the state
  folder's run/, outside the worktree so the agent cannot commit it); removed when the run ends.
  Use it rather than `{task}` for long tasks: one argv element holds at most 128 KiB.
- The summary leaves out the edit blocks an agent printed (`without_edit_blocks`).
- Cost: the last match of `costPattern` in the output, in dollars, exact as printed (with
  `costSum`, the sum of every match). A paid engine whose cost is unknown reports None, so the
  worker charges the reservation; a free engine reports $0. With `answerPattern` (a line its
  program prints for every model answer), a run that printed none was never answered
  (`billed=False`): the worker charges it nothing.
- With `textPattern`, the summary and the STATUS line are read from the agent's words in its
  output (group 1 of each match, JSON escapes decoded), not from every line: JSON-lines agents.
- The program is the template's first element, or the one after a leading `env NAME=VALUE ...`
  (a recipe may give the agent variables that way): that one must be on PATH.
- `run` never raises for an agent failure: a bad template, a missing binary, a bad exit or a
  timeout come back as an Outcome with `error_kind` set.
- Never charge a command engine's run for nothing unless it can tell, because a program may be
  answered and print no cost (aider with an unpriced model): with `answerPattern` set, a run
  whose output had no model answer (nor a cost) is `billed=False`; without one it cannot tell
  (`None`) (tests: `engines_e2e::test_an_aider_that_never_reached_its_model_is_charged_nothing`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path

from subtask.engines.base import EngineContext, Outcome, Probe, last_lines, parse_status
from subtask.model import lazyre, money
from subtask.model.config import TRUE_WORDS, parse_argv
from subtask.proc import procs

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any

ConfigReader = Callable[[str], "str | None"]

_PLACEHOLDER_RE = lazyre.compile(r"\{(task|task_file|worktree|model|session)\}")
_KEEP_LINES = 400  # enough output for a 10-line summary and a trailing STATUS line


def template_error(name: str, key: str = "command") -> str:
    return (f"subtask.engine.{name}.{key} must be a JSON list of strings, "
            'e.g. ["aider","--yes","--message","{task}"]')


def parse_template(raw: str | None) -> list[str] | None:
    """The argv template from its JSON text, or None when missing or not a list of strings."""
    return parse_argv(raw)


def substitute(template: list[str], values: Mapping[str, str]) -> list[str]:
    """Each element with its placeholders replaced, in a single pass.

    One pass matters: replacing `{task}` first and `{worktree}` next would also rewrite a
    `{worktree}` that the task text itself contains.
    """
    return [_PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), element)
            for element in template]


def program_of(template: list[str]) -> str:
    """The program a template runs: its first element, or the one `env NAME=VALUE ...` runs."""
    if Path(template[0]).name != "env":
        return template[0]
    rest = template[1:]
    while rest and "=" in rest[0] and not rest[0].startswith("-"):
        rest = rest[1:]
    return rest[0] if rest and not rest[0].startswith("-") else template[0]


def _which(name: str, env: Mapping[str, str]) -> str | None:
    if os.sep in name:
        return name if Path(name).is_file() and os.access(name, os.X_OK) else None
    return shutil.which(name, path=env.get("PATH"))


class _Output:
    """Output lines as events, the stdout tail for the summary (or, with `textPattern`, the
    agent's own words in it), the cost (the last `costPattern` match, or with `costSum` the sum
    of every match: an agent that prints each step's cost, as OpenCode does), and whether a line
    said the model answered."""

    def __init__(self, emit: Callable[[dict[str, Any]], None], cost_re: re.Pattern[str] | None,
                 session_re: re.Pattern[str] | None, answer_re: re.Pattern[str] | None = None,
                 text_re: re.Pattern[str] | None = None, cost_sum: bool = False) -> None:
        self.emit = emit
        self.cost_re = cost_re
        self.session_re = session_re
        self.answer_re = answer_re
        self.text_re = text_re
        self.cost_sum = cost_sum
        self.stdout: list[str] = []
        self.cost: Decimal | None = None
        self.session_id: str | None = None
        self.answered = False

    def on(self, stream: str) -> Callable[[str], None]:
        def handle(line: str) -> None:
            if stream == "stdout":
                self.stdout += self.words(line)
                del self.stdout[:-_KEEP_LINES]
            self.scan(line)
            self.emit({"type": "output", "stream": stream, "text": line})

        return handle

    def words(self, line: str) -> list[str]:
        """What of a stdout line the summary reads: the line, or the `textPattern` matches in it
        (group 1; a JSON string's escapes decoded: `\\n` is a new line)."""
        if self.text_re is None:
            return [line]
        found: list[str] = []
        for match in self.text_re.finditer(line):
            text = match.group(1) if match.groups() and match.group(1) is not None else ""
            try:
                text = json.loads(f'"{text}"')
            except ValueError:
                pass  # not JSON string content: the text as it stands
            found += text.splitlines()
        return found

    def scan(self, line: str) -> None:
        if self.cost_re is not None:
            for match in self.cost_re.finditer(line):
                try:
                    cost = money.usd(match.group(1))  # exact as printed: "0.0149" is $0.0149
                except IndexError:
                    cost = None
                if cost is not None:
                    self.cost = (self.cost or money.ZERO) + cost if self.cost_sum else cost
                    self.answered = True
        if self.answer_re is not None and self.answer_re.search(line):
            self.answered = True
        if self.session_re is not None:
            said = self.session_re.search(line)
            if said and said.groups() and said.group(1):
                self.session_id = said.group(1)


class CommandEngine:
    isolation = "none of its own (git-subtask confines it where it can: see confinement)"
    confinable = True  # every process it starts goes through procs.run
    default_isolation = "worktree"  # an agent that needs its config dir: git config --add subtask.isolation.writable

    def __init__(self, name: str, config: ConfigReader) -> None:
        self.name = name
        self._config = config
        self.paid = (config(f"engine.{name}.paid") or "").strip().lower() in TRUE_WORDS

    def _key(self, key: str) -> str | None:
        return self._config(f"engine.{self.name}.{key}")

    @property
    def resumes(self) -> bool:
        """A retry resumes the session only with a resume template; else it runs the task again."""
        return self._key("resumeCommand") is not None

    def template(self) -> list[str] | None:
        return parse_template(self._key("command"))

    def readable_paths(self, env: Mapping[str, str]) -> list[Path]:
        """The files its templates name (the agent's program, a script it runs), for a confined
        view: the user's own configuration says them, nothing the job chose."""
        found: list[Path] = []
        for key in ("command", "resumeCommand"):
            for word in parse_template(self._key(key)) or []:
                if _PLACEHOLDER_RE.search(word):
                    continue
                path = _which(word, env) if "/" not in word else word
                if path and os.path.isabs(path) and os.path.exists(path):
                    found += [Path(path), Path(os.path.realpath(path))]
        return list(dict.fromkeys(found))

    # -- probe --------------------------------------------------------------------------------

    def probe(self) -> Probe:
        template = self.template()
        if template is None:
            return Probe(self.name, False, None, None, self.paid, self.isolation,
                         template_error(self.name))
        program = program_of(template)
        found = _which(program, os.environ)
        detail = "" if found else f"{program} not found on PATH"
        # A generic CLI cannot be asked whether it is logged in without spending.
        return Probe(self.name, found is not None, None, None, self.paid, self.isolation, detail)

    # -- run ----------------------------------------------------------------------------------

    def run(self, ctx: EngineContext) -> Outcome:
        template, key = self._choose_template(ctx)
        if template is None:
            return Outcome(False, session_id=ctx.session_id, error_kind="engine",
                           error=template_error(self.name, key))
        program = program_of(template)
        if _which(program, ctx.env) is None:
            return Outcome(False, session_id=ctx.session_id, error_kind="not_installed",
                           error=f"{program} not found on PATH (engine {self.name})")
        output = _Output(ctx.emit, self._regex(ctx, "costPattern"), self._regex(ctx, "sessionPattern"),
                         self._regex(ctx, "answerPattern"), self._regex(ctx, "textPattern"),
                         cost_sum=(self._key("costSum") or "").strip().lower() in TRUE_WORDS)
        task_file = ctx.task_file() if _uses(template, "task_file") else None
        try:
            argv = substitute(template, {
                "task": ctx.task,
                "task_file": str(task_file or ""),
                "worktree": str(ctx.worktree),
                "model": ctx.model or "",
                "session": ctx.session_id or "",
            })
            result = self._spawn(ctx, argv, output)
        finally:
            if task_file is not None:
                try:
                    os.unlink(task_file)
                except FileNotFoundError:
                    pass
        return self._outcome(ctx, result, output)

    def _choose_template(self, ctx: EngineContext) -> tuple[list[str] | None, str]:
        """The resume template on a reply to a known session, else the command template."""
        if ctx.session_id and self._key("resumeCommand") is not None:
            return parse_template(self._key("resumeCommand")), "resumeCommand"
        return self.template(), "command"

    def _regex(self, ctx: EngineContext, key: str) -> re.Pattern[str] | None:
        pattern = self._key(key)
        if not pattern:
            return None
        try:
            return re.compile(pattern)
        except re.error as exc:
            ctx.emit({"type": "warning",
                      "text": f"subtask.engine.{self.name}.{key} is not a valid regex: {exc}"})
            return None

    @staticmethod
    def _spawn(ctx: EngineContext, argv: list[str], output: _Output) -> Any:
        return procs.run(argv, cwd=ctx.worktree, env=ctx.env, timeout=ctx.timeout,
                         on_stdout_line=output.on("stdout"), on_stderr_line=output.on("stderr"),
                         on_start=ctx.on_pid, redact=True)

    def _outcome(self, ctx: EngineContext, result: Any, output: _Output) -> Outcome:
        text = "\n".join(output.stdout)
        outcome = Outcome(True, last_lines(without_edit_blocks(text)), result.exit_code, outcome=parse_status(text),
                          session_id=output.session_id or ctx.session_id,
                          cost_usd=self._cost(output), model=ctx.model, billed=self._billed(output))
        if result.timed_out:
            outcome.ok, outcome.exit_code, outcome.error_kind = False, None, "timeout"
            outcome.error = f"{self.name} ran past its timeout of {ctx.timeout:g}s"
        elif result.exit_code != 0:
            outcome.ok, outcome.error_kind = False, "exit"
            outcome.error = f"{self.name} exited with code {result.exit_code}"
        return outcome

    def _cost(self, output: _Output) -> Decimal | None:
        if output.cost is not None:
            return output.cost
        if self._key("costPattern"):
            return None  # configured but not found: let the worker charge the reservation
        return None if self.paid else money.ZERO

    def _billed(self, output: _Output) -> bool | None:
        """True when a line showed a model answer (a cost, or `answerPattern`); False when
        `answerPattern` is set and no line matched it; None (cannot tell) without one."""
        if output.answered:
            return True
        return False if output.answer_re is not None else None


_BLOCK_START = lazyre.compile(r"^<{7} (SEARCH|ORIGINAL)\s*$")
_BLOCK_MIDDLE = lazyre.compile(r"^={7}\s*$")
_BLOCK_END = lazyre.compile(r"^>{7} (REPLACE|UPDATED)\s*$")


def without_edit_blocks(text: str) -> str:
    """The output without the search/replace edit blocks agents print (aider's `<<<<<<< SEARCH`
    … `=======` … `>>>>>>> REPLACE`): a block is code, not a summary. A whole block goes; a marker
    whose block is cut off (the output tail starts inside one) goes alone."""
    lines = text.splitlines()
    kept: list[str] = []
    i = 0
    while i < len(lines):
        if _BLOCK_START.match(lines[i]):
            end = next((j for j in range(i + 1, len(lines)) if _BLOCK_END.match(lines[j])), None)
            if end is not None:
                i = end + 1
                continue
        if not (_BLOCK_START.match(lines[i]) or _BLOCK_MIDDLE.match(lines[i]) or _BLOCK_END.match(lines[i])):
            kept.append(lines[i])
        i += 1
    return "\n".join(kept)


def _uses(template: list[str], placeholder: str) -> bool:
    token = "{" + placeholder + "}"
    return any(token in element for element in template)
