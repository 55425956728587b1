"""The `shell` engine: the task is a bash script run in the worktree.

The script is run from a private file (`ctx.task_file()`, `bash FILE`), never as `bash -c TASK`:
the kernel caps one argv element at 128 KiB, the task limit is 1 MiB.

Free and deterministic: the quick start and the test engine. Output lines become events; the
summary is the last lines of the output; a non-zero exit ends the attempt failed with that code.
On reply the message is simply another script run in the same worktree.

Invariants:
- Never let a background process that holds stdout keep a shell job open, because the run would
  never end: it ends `STDOUT_GRACE` (2 s) after the script exits.
"""

from __future__ import annotations

import os

from subtask.engines.base import EngineContext, Outcome, Probe, last_lines, parse_status

# A script that leaves a background process holding stdout (`server &`) still ends.
STDOUT_GRACE = 2.0
# A reply to a shell job is another script, so "reply 'continue'" would run `continue`.
TIMEOUT_HINT = "run what is left with more time: git subtask reply <id> --timeout SECONDS 'SCRIPT'"


class ShellEngine:
    name = "shell"
    paid = False
    isolation = "none of its own (git-subtask confines it where it can: see confinement)"
    confinable = True  # every process it starts goes through procs.run
    default_isolation = "worktree"

    def probe(self) -> Probe:
        import shutil  # `doctor`'s: a `start` never runs it (shutil: bz2, lzma; subprocess: threading,
        import subprocess  # signal, locale)

        bash = shutil.which("bash")
        version = None
        if bash:
            out = subprocess.run([bash, "--version"], capture_output=True, text=True, check=False)
            version = (out.stdout.splitlines() or [""])[0] or None
        return Probe(self.name, bash is not None, True, version, self.paid, self.isolation)

    def run(self, ctx: EngineContext) -> Outcome:
        from subtask.proc import procs

        output: list[str] = []

        def on_line(stream: str):
            def emit(line: str) -> None:
                output.append(line)
                if len(output) > 2000:
                    del output[:1000]
                ctx.emit({"type": "output", "stream": stream, "text": line})

            return emit

        # From a file, not `bash -c TASK`: one argv element holds at most 128 KiB.
        task_file = ctx.task_file()
        try:
            result = procs.run(
                ["bash", str(task_file)],
                cwd=ctx.worktree,
                env=ctx.env,
                timeout=ctx.timeout,
                on_stdout_line=on_line("stdout"),
                on_stderr_line=on_line("stderr"),
                on_start=ctx.on_pid,
                stdout_grace=STDOUT_GRACE,
                redact=True,  # the summary and every event are built from redacted lines
            )
        finally:
            try:
                os.unlink(task_file)
            except FileNotFoundError:
                pass
        text = "\n".join(output)
        summary = last_lines(text)
        commands = [{"command": ctx.task, "exit": result.exit_code}]
        if result.timed_out:
            return Outcome(False, summary, None, commands=commands, error_kind="timeout",
                           error=f"the script ran past its timeout of {ctx.timeout:g}s",
                           error_hint=TIMEOUT_HINT)
        if result.exit_code != 0:
            return Outcome(False, summary, result.exit_code, commands=commands, error_kind="exit",
                           error=f"the script exited with code {result.exit_code}")
        return Outcome(True, summary, 0, outcome=parse_status(text), commands=commands)
