"""Regenerate the manual page (and, with --cli, docs/cli.md from a real session).

    python scripts/gen_docs.py          # man/git-subtask.1, man/git-subtask.html
    python scripts/gen_docs.py --cli    # also docs/cli.md: every command and option, real output
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from subtask.cli import cli
from subtask.manpage import commands, options, paragraphs, roff, to_html, usage

ROOT = Path(__file__).resolve().parents[1]

# A real session: each entry is a shell command run in a scratch repository; its output goes in.
SESSION = [
    "git subtask start --engine shell --verify 'test -f hello.txt' 'echo hi > hello.txt'",
    "git subtask wait $J1",
    "git subtask start --engine shell 'echo fix > fix.txt; git add fix.txt; git commit -qm \"Fix the thing\"; echo Fixed it; echo STATUS: done'",
    "git subtask start --engine shell --verify false 'echo oops > oops.txt'",
    "git subtask wait $J2 $J3",
    "git subtask list",
    "git subtask status $J1",
    "git subtask show $J2",
    "git subtask result $J2",
    "git subtask result $J3; echo \"exit $?\"",
    "git subtask diff $J1 --stat",
    "git --no-pager log --notes=subtask -1 subtask/$J2",
    "git subtask reply $J2 'echo more >> fix.txt'",
    "git subtask wait $J2",
    "git subtask merge $J3; echo \"exit $?\"",
    "git subtask merge $J2",
    "git subtask cleanup $J1",
    "git subtask spend",
    "git subtask engines",
    "git subtask doctor",
    "git subtask show st-ffffffff; echo \"exit $?\"",
    "git subtask start ''; echo \"exit $?\"",
]


def reference() -> str:
    parts = []
    for name, cmd in commands(cli):
        parts.append(f"### `{usage(name, cmd)}`\n")
        parts.extend(p + "\n" for p in paragraphs(cmd))
        rows = options(cmd)
        if rows:
            parts.append("| option | meaning |\n|---|---|")
            parts.extend(f"| `{flags}` | {help_text} |" for flags, help_text in rows)
            parts.append("")
    return "\n".join(parts)


def real_session() -> str:
    tmp = Path(tempfile.mkdtemp(prefix="subtask-docs-"))
    repo = tmp / "demo"
    env = dict(os.environ, GIT_AUTHOR_NAME="Ada", GIT_AUTHOR_EMAIL="ada@example.com",
               GIT_COMMITTER_NAME="Ada", GIT_COMMITTER_EMAIL="ada@example.com", NO_COLOR="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "initial commit"], check=True, env=env)
    ids: list[str] = []
    out = []
    for command in SESSION:
        for n, job in enumerate(ids, 1):
            full = "wait" in command or not command.startswith("git subtask")
            command = command.replace(f"$J{n}", job if full else job[:7])
        proc = subprocess.run(["bash", "-c", f"{{ {command}; }} 2>&1"], cwd=repo, env=env, capture_output=True, text=True)
        text = proc.stdout.rstrip()
        if command.startswith("git subtask start") and proc.returncode == 0:
            ids.append(text.split()[0])
        text = text.replace(str(tmp), "/home/ada")
        out.append(f"```console\n$ {command}\n{text}\n```\n")
    return "\n".join(out)


def write_cli_doc() -> None:
    doc = f"""# Command line reference

`git subtask` is a git subcommand: git finds the `git-subtask` console script on PATH and runs it in
your directory. `git subtask --help` opens the manual page `git-subtask(1)`; `git subtask -h` and
`git subtask COMMAND -h` print usage.

## Exit codes

| code | meaning |
|---|---|
| 0 | success |
| 1 | a negative answer: verify failed, a job failed or did not finish, over budget, a merge refused |
| 128 | fatal: not a git repository, a bare repository, unknown revision, unknown job |
| 129 | usage: an unknown command or option, a bad value |

They are the same with `--json`. Every read command takes `--json`: versioned (`"v": 1`, or
`"schema_version": 1` for doctor), stable, and valid when there are no jobs yet. Progress goes to
stderr, and only on a terminal (`watch` redraws in place only on a terminal). Nothing prompts.

## A real session

The output below is from a real run (`python scripts/gen_docs.py --cli`), in a scratch repository.

{real_session()}
## Every command

{reference()}
"""
    (ROOT / "docs" / "cli.md").write_text(re.sub(r"\n{3,}", "\n\n", doc))
    print("wrote docs/cli.md")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", action="store_true", help="also regenerate docs/cli.md from a real session")
    args = parser.parse_args()
    (ROOT / "man").mkdir(exist_ok=True)
    (ROOT / "man" / "git-subtask.1").write_text(roff(cli))
    (ROOT / "man" / "git-subtask.html").write_text(to_html(cli))
    print("wrote man/git-subtask.1 and man/git-subtask.html")
    if args.cli:
        write_cli_doc()


if __name__ == "__main__":
    main()
