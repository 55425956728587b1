"""Regenerate the manual page and README's settings table, and (--cli, --mcp) docs/cli.md and
docs/mcp.md from real sessions.

    python scripts/gen_docs.py          # man/git-subtask.1, man/git-subtask.html, README's settings
    python scripts/gen_docs.py --cli    # also docs/cli.md: every command and option, real output
    python scripts/gen_docs.py --mcp    # also docs/mcp.md's tool table and its real exchange

tests/test_docs.py runs the same sessions again and fails when the pages show outputs the tool no
longer prints (ids, hashes, times and paths aside: `normalize`), or options and tools it lacks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from subtask.faces.cli import cli
from subtask.faces.manpage import commands, options, paragraphs, roff, to_html, usage

ROOT = Path(__file__).resolve().parents[1]

# A real session: each entry is a shell command run in a scratch repository; its output goes in.
# Entries marked False depend on the machine (versions, this month, its kernel): shown, not checked.
SESSION = [
    ("git subtask start --engine shell --verify 'test -f hello.txt' 'echo hi > hello.txt'", True),
    ("git subtask wait $J1", True),
    ("git subtask wait --since 0 $J1", True),
    ("git subtask start --engine shell "
     "'echo fix > fix.txt; git add fix.txt; git commit -qm \"Fix the thing\"; echo Fixed it; echo STATUS: done'", True),
    ("git subtask start --engine shell --verify false 'echo oops > oops.txt'", True),
    ("git subtask wait $J2 $J3", True),
    ("git subtask list", True),
    ("git subtask status $J1", True),
    ("git subtask show $J2", True),
    ("git subtask result $J2", True),
    ("git subtask result $J3; echo \"exit $?\"", True),
    ("git subtask diff $J1 --stat", True),
    ("git --no-pager log --notes=subtask -1 subtask/$J2", True),
    ("git subtask reply $J2 'echo more >> fix.txt'", True),
    ("git subtask wait $J2", True),
    ("git subtask merge $J3; echo \"exit $?\"", True),
    ("git subtask merge --squash --no-ff $J2; echo \"exit $?\"", True),
    ("git subtask merge $J2", True),
    ("git subtask start --engine shell --verify 'grep -q hello greeting.txt' "
     "'echo hello > greeting.txt && git add greeting.txt && git commit -qm \"Say hello\"'", True),
    ("git subtask start --engine shell --verify 'grep -q hi greeting.txt' "
     "'echo hi > greeting.txt && git add greeting.txt && git commit -qm \"Say hi\"'", True),
    ("git subtask start --engine shell --verify 'test -f notes.txt' "
     "'echo notes > notes.txt && git add notes.txt && git commit -qm \"Add notes\"'", True),
    ("git subtask wait $J4 $J5 $J6", True),
    ("git subtask list", True),
    ("git subtask land --dry-run $J4 $J5 $J6; echo \"exit $?\"", True),
    ("git subtask land $J4 $J5 $J6; echo \"exit $?\"", True),
    ("git subtask du", True),
    ("git subtask cleanup $J1", True),
    ("git subtask pool", False),  # sizes on disk are the file system's
    ("git subtask install all --scope project --dry-run", True),
    ("git subtask spend", False),
    ("git subtask engines", False),
    ("git subtask doctor", False),
    ("echo draft >> README.md && mkdir -p src && cd src && git subtask start --engine shell 'ls'", True),
    ("git config subtask.routing.engines shell; git subtask routing explain 'echo routed > routed.txt'", False),
    ("git subtask show st-ffffffff; echo \"exit $?\"", True),
    ("git subtask start ''; echo \"exit $?\"", True),
]

# docs/orchestration.md: chains, a skip, a map and the namespace, in one scratch repository. `$GATE`
# is a file the first job waits for (so the listing shows its waiters waiting), `$GATE2` one the
# failing job waits for (so its waiter is recorded waiting, never found it ended); `$G1` the map's group.
ORCHESTRATION_SESSION = [
    ("git subtask start --engine shell --verify 'python3 -c \"import api\"' "
     "'while [ ! -e \"$GATE\" ]; do sleep 0.05; done; echo \"VERSION = 2\" > api.py'", True),
    ("git subtask start --engine shell --after $J1 --verify 'python3 -c \"import client\"' "
     "'echo \"from api import VERSION\" > client.py'", True),
    ("git subtask start --engine shell --after $J2 "
     "'echo \"client speaks api $(grep -o [0-9] api.py)\" > DOCS.md'", True),
    ("git subtask list", True),
    ("touch \"$GATE\"; git subtask wait $J3", True),
    ("git subtask show $J3 | sed -n 1,7p", True),
    ("git --no-pager log --format='%s' subtask/$J3", True),
    ("git subtask start --engine shell 'while [ ! -e \"$GATE2\" ]; do sleep 0.05; done; exit 3'", True),
    ("git subtask start --engine shell --after $J4 'echo never'", True),
    ("touch \"$GATE2\"; git subtask wait $J5; echo \"exit $?\"", True),
    ("mkdir src; for n in 1 2 3 4 5 6; do echo \"x = $n\" > src/m$n.py; done; "
     "git add src; git commit -qm 'six modules'", True),
    ("git subtask map 'src/*.py' 'for f in {files}; do echo \"# reviewed\" >> \"$f\"; done' --batch 2 "
     "--concurrency 2 --engine shell --verify 'grep -q reviewed src/*.py'", True),
    ("git subtask wait $G1", True),
    ("git subtask start --engine shell --after $G1 'grep -c reviewed src/*.py'", True),
    ("git subtask wait $J6 >/dev/null; git subtask result $J6", True),
    ("git subtask start --engine shell 'echo \"port $SUBTASK_PORT (+$SUBTASK_PORTS), tmp $TMPDIR, "
     "compose project $COMPOSE_PROJECT_NAME\"'", True),
    ("git subtask wait $J7 >/dev/null; git subtask result $J7 | tail -1", False),  # this machine's free ports
]

# The MCP exchange: (tool, arguments, whether to show its structured content too). `$J1`... are the
# job ids in the order the replies named them, `$G1` the group's.
MCP_SESSION = [
    ("start_many", {"tasks": [
        {"task": "printf 'def add(a, b):\\n    return a + b\\n' > calc.py && git add calc.py "
                 "&& git commit -qm 'Add calc.add'",
         "verify": "python3 -c 'import calc; assert calc.add(2, 3) == 5'"},
        {"task": "echo '# Usage' >> README.md", "verify": "grep -q Usage README.md"},
        {"task": "echo oops > oops.txt", "verify": "false"},
        {"task": "", "engine": "shell"}]}, False),
    ("wait", {"ids": ["$J1", "$J2", "$J3"], "timeout": 60}, False),
    ("wait", {"ids": ["$J2"], "since": "0"}, False),
    ("diff", {"id": "$J1", "stat": True}, True),
    ("diff", {"id": "$J1"}, False),
    ("result", {"id": "$J3"}, False),
    ("merge", {"id": "$J1"}, True),
    ("merge", {"id": "$J3"}, False),
    ("log", {"id": "$J2"}, False),
    ("merge", {"id": "$J2", "mode": "squash"}, False),
    ("list", {}, False),
    ("start", {"task": "seq 1 $SUBTASK_GROUP_MEMBER > seq.txt", "best_of": 2, "verify": "test -s seq.txt"}, False),
    ("wait", {"ids": ["$G1"], "timeout": 60}, False),
    ("compare", {"id": "$G1"}, False),
    ("land", {"ids": ["$G1"], "dry_run": True}, True),
    ("land", {"ids": ["$G1"]}, False),
    ("list", {}, False),
    ("du", {}, False),
    ("wait", {"ids": ["$J1"], "timeout": "soon"}, False),
    ("start", {"task": "x", "verfiy": "true"}, False),
    ("result", {"id": "st-deadbeef"}, False),
]


def normalize(text: str) -> str:
    """What a page shows, with what changes from run to run made alike: job and group ids (named by
    the order they appear), commit hashes, times, ages, dates, this month and column padding."""
    names: dict[str, str] = {}
    full = re.findall(r"\b(?:st|sg)-[0-9a-f]{8}\b", text)

    def named(match: re.Match) -> str:  # a short prefix is named as the id it is short for
        found = next((f for f in full if f.startswith(match.group(0))), match.group(0))
        return names.setdefault(found, f"{found[:3]}<{len(names) + 1}>")

    text = re.sub(r"\b(?:st|sg)-[0-9a-f]{4,8}\b", named, text)
    text = re.sub(r"\b[0-9a-f]{7,40}\b", "<sha>", text)
    text = re.sub(r"\b\d+(?:\.\d+)?(?:s|ms)\b|\b\d+m\d\ds\b|\b\d+h\d\dm\b", "<t>", text)
    text = re.sub(r"\b\d{4}-\d{2}(?:-\d{2})?(?:[ T][0-9:.+-]+)?\b", "<date>", text)
    text = re.sub(r"(Date|Author): .*", r"\1: <who or when>", text)
    text = re.sub(r"subtask-docs-[^/]+", "<tmp>", text)
    text = re.sub(r"\d{10}\.\d+", "<time>", text)
    text = re.sub(r"\b\d{2}:\d{2}:\d{2}\b", "<clock>", text)
    text = re.sub(r"\b\d+(?:\.\d)? (?:B|KiB|MiB|GiB)\b", "<size>", text)  # du: blocks differ by file system
    text = re.sub(r"(<sha>|\.)\.\d+\b", r"\1.<offset>", text)  # a wait cursor's byte offsets
    return "\n".join(re.sub(r"[ \t]+", " ", line).rstrip() for line in text.splitlines())


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


def _scratch() -> tuple[Path, Path, dict[str, str]]:
    tmp = Path(tempfile.mkdtemp(prefix="subtask-docs-"))
    repo = tmp / "demo"
    (tmp / "home").mkdir()
    env = dict(os.environ, HOME=str(tmp / "home"), GIT_AUTHOR_NAME="Ada", GIT_AUTHOR_EMAIL="ada@example.com",
               GIT_COMMITTER_NAME="Ada", GIT_COMMITTER_EMAIL="ada@example.com", NO_COLOR="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", SUBTASK_SERVER="0")
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, env=env)
    (repo / "README.md").write_text("# demo\n")
    subprocess.run(["git", "-C", str(repo), "add", "README.md"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", "initial commit"], check=True, env=env)
    return tmp, repo, env


def session_blocks(session=None) -> list[tuple[str, str, bool]]:
    """(command, what it printed, checked) for each entry of `session` (SESSION), run for real.
    `$J<n>` is the n-th job a start printed, `$G<n>` the n-th group a map printed."""
    tmp, repo, env = _scratch()
    gates = tmp / "gates"  # jobs see them read-only (a confined job's view holds nothing it is not given)
    gates.mkdir()
    subprocess.run(["git", "-C", str(repo), "config", "--add", "subtask.isolation.readable", str(gates)], check=True)
    env = dict(env, GATE=str(gates / "gate"), GATE2=str(gates / "gate2"))
    named: dict[str, list[str]] = {"J": [], "G": []}
    out = []
    for command, checked in SESSION if session is None else session:
        for kind, found in named.items():
            for n, one in reversed(list(enumerate(found, 1))):
                full = "wait" in command or not command.startswith("git subtask") or kind == "G"
                command = command.replace(f"${kind}{n}", one if full else one[:7])
        proc = subprocess.run(["bash", "-c", f"{{ {command}; }} 2>&1"], cwd=repo, env=env,
                              capture_output=True, text=True)
        text = proc.stdout.rstrip()
        if command.startswith(("git subtask start", "git subtask map")) and proc.returncode == 0:
            named["G" if command.startswith("git subtask map") else "J"].append(text.split()[0])
        out.append((command, text.replace(str(tmp), "/home/ada"), checked))
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def real_session(session=None) -> str:
    return "\n".join(f"```console\n$ {command}\n{text}\n```\n" for command, text, _ in session_blocks(session))


def write_orchestration_doc() -> None:
    path = ROOT / "docs" / "orchestration.md"
    path.write_text(replace_generated(path.read_text(), "session", real_session(ORCHESTRATION_SESSION),
                                      flag="--orchestration"))
    print("wrote docs/orchestration.md")


def mcp_blocks() -> list[tuple[str, str, str | None, bool]]:
    """(call, text, structured JSON or None, is_error) for each entry of MCP_SESSION, over a real
    stdio session with `python -m subtask.faces.mcp_server` in a scratch repository."""
    import anyio
    from mcp import Client, StdioServerParameters

    tmp, repo, env = _scratch()
    subprocess.run(["git", "-C", str(repo), "config", "subtask.engine", "shell"], check=True, env=env)
    params = StdioServerParameters(command=sys.executable, args=["-m", "subtask.faces.mcp_server"], cwd=str(repo),
                                   env=dict(env, PYTHONPATH=str(ROOT)))
    out = []

    async def run() -> None:
        named: dict[str, list[str]] = {"J": [], "G": []}  # job ids, group ids: in the order replies named them
        async with Client(params, mode="legacy") as client:
            for tool, arguments, show in MCP_SESSION:
                call = json.dumps(arguments, ensure_ascii=False)
                for kind, found in named.items():
                    for n, one in reversed(list(enumerate(found, 1))):
                        call = call.replace(f"${kind}{n}", one)
                result = await client.call_tool(tool, json.loads(call))
                text = "\n".join(b.text for b in result.content if b.type == "text")
                for one in re.findall(r"\b(?:st|sg)-[0-9a-f]{8}\b", text):
                    kind = "J" if one.startswith("st-") else "G"
                    if one not in named[kind] and one not in call:
                        named[kind].append(one)
                data = result.structured_content
                shown = json.dumps(data, ensure_ascii=False) if show and data else None
                out.append((f"{tool} {call}", text.replace(str(tmp), "/home/ada"),
                            shown.replace(str(tmp), "/home/ada") if shown else None, bool(result.is_error)))

    anyio.run(run)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def mcp_exchange() -> str:
    parts = []
    for call, text, data, error in mcp_blocks():
        parts.append(f"**`{call}`**" + ("  (isError)" if error else "") + f"\n\n```\n{text}\n```\n")
        if data:
            parts.append(f"structured content:\n\n```json\n{data}\n```\n")
    return "\n".join(parts)


def mcp_tools_table() -> str:
    """One row per tool, from the server's own tools/list: its parameters (required ones bold,
    defaults given) and its annotations."""
    import anyio
    from mcp import Client

    from subtask.faces.mcp_tools import server

    async def listed():
        async with Client(server, mode="legacy") as client:
            return (await client.list_tools()).tools

    rows = ["| tool | parameters | annotations |", "|---|---|---|"]
    for tool in anyio.run(listed):
        schema = tool.input_schema
        required = set(schema.get("required", []))
        params = []
        for name, prop in schema.get("properties", {}).items():
            if name in required:
                params.append(f"**`{name}`**")
            elif "default" in prop and prop["default"] is not None:
                params.append(f"`{name}={json.dumps(prop['default'])}`")
            else:
                params.append(f"`{name}`")
        notes = [word for word, on in (("read-only", tool.annotations.read_only_hint),
                                       ("destructive", tool.annotations.destructive_hint)) if on]
        rows.append(f"| `{tool.name}` | {', '.join(params)} | {', '.join(notes) or '-'} |")
    return "\n".join(rows) + "\n"


BEGIN = "<!-- generated by scripts/gen_docs.py{flag}: {name} -->"
END = "<!-- end of generated {name} -->"


def _begin(flag: str, name: str) -> str:
    """The opening marker of a generated part, with the flag that makes it (none: every run)."""
    return BEGIN.format(flag=f" {flag}" if flag else "", name=name)


def replace_generated(text: str, name: str, body: str, flag: str = "--mcp") -> str:
    """`text` with the part between the markers named `name` replaced by `body`."""
    begin, end = _begin(flag, name), END.format(name=name)
    head, rest = text.split(begin, 1)
    return f"{head}{begin}\n{body}{end}{rest.split(end, 1)[1]}"


def settings_table() -> str:
    """README's settings table: every row of subtask/model/config.py SETTINGS."""
    from subtask.model.config import documented

    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, kind, default, meaning in documented():
        meaning = meaning.replace("|", r"\|")
        rows.append(f"| `{key}` | {kind} | {default} | {meaning} |")
    return "\n".join(rows) + "\n"


def write_readme_settings() -> None:
    path = ROOT / "README.md"
    path.write_text(replace_generated(path.read_text(), "settings", settings_table(), flag=""))
    print("wrote README.md's settings table")


def generated(text: str, name: str, flag: str = "--mcp") -> str:
    return text.split(_begin(flag, name), 1)[1].split(END.format(name=name), 1)[0].lstrip("\n")


def write_mcp_doc() -> None:
    path = ROOT / "docs" / "mcp.md"
    text = replace_generated(path.read_text(), "tools", mcp_tools_table())
    path.write_text(replace_generated(text, "exchange", mcp_exchange()))
    print("wrote docs/mcp.md")


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
`"schema_version": 1` for doctor), stable, and valid when there are no jobs yet; the MCP tools
answer the same JSON as their structured content. When a command has nothing to show it says so
on stdout at a terminal and on stderr otherwise, so a script reading stdout gets nothing; what a
command's lazy sweep removed is said on stderr, once. `watch` redraws in place only on a
terminal. Nothing prompts. `git subtask help [COMMAND]` works like `git help`.

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
    parser.add_argument("--mcp", action="store_true", help="also regenerate docs/mcp.md's tools and exchange")
    parser.add_argument("--orchestration", action="store_true",
                        help="also regenerate docs/orchestration.md's real session")
    args = parser.parse_args()
    (ROOT / "man").mkdir(exist_ok=True)
    (ROOT / "man" / "git-subtask.1").write_text(roff(cli))
    (ROOT / "man" / "git-subtask.html").write_text(to_html(cli))
    print("wrote man/git-subtask.1 and man/git-subtask.html")
    write_readme_settings()
    if args.cli:
        write_cli_doc()
    if args.mcp:
        write_mcp_doc()
    if args.orchestration:
        write_orchestration_doc()


if __name__ == "__main__":
    main()
