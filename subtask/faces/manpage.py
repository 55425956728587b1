"""The manual page `git-subtask(1)` and its HTML twin, generated from the click commands.

`scripts/gen_docs.py` writes them to `man/`; the wheel installs them into `share/man/man1` and
`share/doc/git-subtask`, where `man` (and so `git subtask --help`) finds them next to the console
script. A test regenerates the page and compares, so the manual never drifts from the commands.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import click

from subtask import __version__
from subtask.model.config import documented

NAME = "git-subtask - hand coding work to background agents, with every job kept in git"
DESCRIPTION = """A person or a coding agent starts a job; a detached worker does it in its own git worktree and \
branch (subtask/<id>). Everything known about the job lives in git: a commit-chain record under \
refs/subtask/<id>/record, pins for its base and head, and a review block in refs/notes/subtask on \
the commit it produced, so the review screen is plain git log --notes=subtask and the history \
travels with git push. Only running-slot and spend bookkeeping live in lock-guarded files in \
<git-common-dir>/subtask/."""
EXIT_STATUS = [("0", "success"), ("1", "a negative answer: verify failed, a job did not finish, over budget, refused"),
               ("128", "fatal: not a git repository, unknown revision, unknown job"),
               ("129", "usage: bad option or argument")]
FILES = [("<git-common-dir>/subtask/", "slots.json, ledger.jsonl, run/<id>.lock, run/<id>.events.jsonl, logs/<id>.log"),
         ("<main worktree>/.subtask/worktrees/<id>", "job worktrees (subtask.worktreeDir)")]


def settings() -> list[tuple[str, str]]:
    """The SETTINGS section: every row of the table of settings (`model/config.py`), in words."""
    return [(key, f"{meaning} ({kind}; default {default})".replace("`", ""))
            for key, kind, default, meaning in documented()]


def commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    """Every visible command, depth first, with its full name (`notes rebuild`)."""
    out = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        full = f"{prefix}{name}"
        if isinstance(cmd, click.Group):
            out.extend(commands(cmd, full + " "))
        else:
            out.append((full, cmd))
    return out


def usage(name: str, cmd: click.Command) -> str:
    pieces = [f"git subtask {name}"]
    for param in cmd.params:
        if isinstance(param, click.Argument):
            metavar = param.make_metavar(click.Context(cmd)) if hasattr(param, "make_metavar") else param.name.upper()
            pieces.append(metavar)
    if any(isinstance(p, click.Option) for p in cmd.params):
        pieces.append("[OPTIONS]")
    return " ".join(pieces)


def options(cmd: click.Command) -> list[tuple[str, str]]:
    rows = []
    for param in cmd.params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        flags = ", ".join(param.opts + param.secondary_opts)
        if not param.is_flag and param.metavar:
            flags += f" {param.metavar}"
        elif not param.is_flag:
            flags += f" {param.type.name.upper()}" if param.type.name != "text" else " TEXT"
        default_help = "versioned JSON output" if "--json" in param.opts else ""
        rows.append((flags, _clean(param.help or default_help)))
    return rows


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("\b", "")).strip()


def paragraphs(cmd: click.Command) -> list[str]:
    text = (cmd.help or "").replace("\b\n", "")
    return [_clean(p) for p in text.split("\n\n") if p.strip()]


def _roff(text: str) -> str:
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + line) if line.startswith((".", "'")) else line for line in text.splitlines())


def roff(group: click.Group) -> str:
    lines = [f'.TH GIT\\-SUBTASK 1 "" "git-subtask {__version__}" "Git Manual"',
             ".SH NAME", _roff(NAME), ".SH SYNOPSIS",
             ".B git subtask", "\\fICOMMAND\\fR [\\fIARGS\\fR] [\\fIOPTIONS\\fR]",
             ".br", ".B git subtask \\-h | \\-\\-version", ".SH DESCRIPTION", _roff(DESCRIPTION),
             ".PP", _roff("Ids accept a unique prefix (st-1a2b), as git does for commits."), ".SH COMMANDS"]
    for name, cmd in commands(group):
        lines += [".TP", f"\\fB{_roff(usage(name, cmd))}\\fR"]
        for index, para in enumerate(paragraphs(cmd)):
            if index:
                lines.append(".IP")
            lines.append(_roff(para))
        for flags, help_text in options(cmd):
            lines += [".RS", ".TP", f"\\fB{_roff(flags)}\\fR", _roff(help_text or "-"), ".RE"]
    lines.append(".SH SETTINGS")
    for key, meaning in settings():
        lines += [".TP", f"\\fB{_roff(key)}\\fR", _roff(meaning)]
    lines.append(".SH EXIT STATUS")
    for code, meaning in EXIT_STATUS:
        lines += [".TP", f"\\fB{code}\\fR", _roff(meaning)]
    lines.append(".SH FILES")
    for path, meaning in FILES:
        lines += [".TP", f"\\fI{_roff(path)}\\fR", _roff(meaning)]
    lines += [".SH SEE ALSO", "\\fBgit-worktree\\fR(1), \\fBgit-notes\\fR(1), \\fBgit-log\\fR(1)", ""]
    return "\n".join(lines)


def to_html(group: click.Group) -> str:
    import html  # only when writing the page: the CLI imports this module on every start

    esc = html.escape
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>git-subtask(1) — git-subtask {__version__}</title>",
             "<style>body{font-family:sans-serif;max-width:50em;margin:2em auto;line-height:1.4}"
             "code,dt{font-family:monospace}dd{margin-bottom:.8em}</style></head><body>",
             "<h1>git-subtask(1)</h1>", f"<h2>Name</h2><p>{esc(NAME)}</p>",
             "<h2>Synopsis</h2><p><code>git subtask COMMAND [ARGS] [OPTIONS]</code></p>",
             f"<h2>Description</h2><p>{esc(DESCRIPTION)}</p>", "<h2>Commands</h2><dl>"]
    for name, cmd in commands(group):
        parts.append(f"<dt><b>{esc(usage(name, cmd))}</b></dt><dd>")
        parts.extend(f"<p>{esc(p)}</p>" for p in paragraphs(cmd))
        rows = options(cmd)
        if rows:
            parts.append("<dl>" + "".join(f"<dt>{esc(f)}</dt><dd>{esc(h)}</dd>" for f, h in rows) + "</dl>")
        parts.append("</dd>")
    parts.append("</dl><h2>Settings</h2><dl>")
    parts.extend(f"<dt>{esc(k)}</dt><dd>{esc(m)}</dd>" for k, m in settings())
    parts.append("</dl><h2>Exit status</h2><dl>")
    parts.extend(f"<dt>{c}</dt><dd>{esc(m)}</dd>" for c, m in EXIT_STATUS)
    parts.append("</dl></body></html>\n")
    return "\n".join(parts)


def installed_page_path() -> Path | None:
    """Where `man` looks for our page beside the running console script, if we own that prefix.

    man finds `<bin>/../share/man` of every PATH entry. A wheel install puts the page there; an
    editable install (`pip install -e`) installs no data files, so `git subtask --help` would
    answer "No manual entry". Only a script in `sys.prefix/bin` (a venv or a prefix pip wrote)
    counts: we never write next to a script we did not install.
    """
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if script is None or not script.is_absolute() or script.parent != Path(sys.prefix) / "bin":
        return None
    return Path(sys.prefix) / "share" / "man" / "man1" / "git-subtask.1"


def ensure_installed(group: click.Group) -> None:
    """Write the man page where `man` finds it when it is missing (one stat when it is there)."""
    path = installed_page_path()
    if path is None or path.exists():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(roff(group))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only prefix: `git subtask -h` still works
