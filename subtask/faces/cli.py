"""The `git subtask` command line: parse, call `api`, render. No logic lives here.

Every text printed goes through `echo` (control characters made visible, `render.safe`) or
`_emit_json` (exact values, escaped); the only raw escape sequences are `watch`'s own redraws.

One error path: `SubtaskError` becomes `error: <message>` (plus `hint:`) on stderr and git's exit
code; click usage errors exit 129; anything unexpected is reported in one line (set
SUBTASK_DEBUG=1 for the traceback), never as a bare traceback.

`api` loads each operation (and with it pygit2) on first use, so `--version` and `-h` stay instant.

Invariants:
- Never import `mcp` or `claude_agent_sdk` on the CLI's path, because each costs ~0.6 s
  (`tests/test_layers.py` imports `subtask.faces.cli` and looks).
"""

from __future__ import annotations

import json
import os
import sys

import click

from subtask import __version__, api  # api's names load on first use (api/__init__)
from subtask.faces import commands, output
from subtask.model.errors import EXIT_NEGATIVE, EXIT_USAGE, SubtaskError, interrupt_once
from subtask.model.start_options import MAP_OPTIONS, OPTIONS

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

# One way to print and one error path, shared with the commands that run without click.
echo, _emit, _emit_json, _emit_lines = output.echo, output.emit, output.emit_json, output.emit_lines
_repo, on_terminal, TTY_ENV = output.repo, output.on_terminal, output.TTY_ENV

PROGRESS_ENV = "SUBTASK_PROGRESS"  # "json": progress as JSON lines on stderr (the MCP `land` tool reads them)


def _land_progress():
    """How `land` shows its window while it works: a live line on a terminal's stderr, JSON lines
    for the MCP server's child (`SUBTASK_PROGRESS=json`), else nothing."""
    from subtask import words as render

    if os.environ.get(PROGRESS_ENV) == "json":
        def as_json(snapshot: dict) -> None:
            sys.stderr.write(json.dumps({"progress": snapshot}, separators=(",", ":")) + "\n")
            sys.stderr.flush()

        return as_json
    if not on_terminal(sys.stderr) or os.environ.get("TERM") == "dumb":
        return None

    def live(snapshot: dict) -> None:
        line = "" if snapshot.get("final") else render.land_progress(snapshot)
        sys.stderr.write("\r\x1b[K" + line)
        sys.stderr.flush()

    return live


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "--version", prog_name="git-subtask", message="%(prog)s %(version)s")
def cli() -> None:
    """Hand coding work to background agents; every job is a worktree, a branch and a record in git.

    Review with plain git: git log --notes=subtask
    """


def declared(command: commands.Command) -> click.Command:
    """The click command for one of the registry's (`faces/commands`): the same words, arguments
    and options, and the same `run` behind them."""
    params: list[click.Parameter] = []
    for p in command.params:
        if p.is_argument:
            params.append(click.Argument([p.name], metavar=p.metavar, required=p.required,
                                         nargs=-1 if p.nargs == commands.NARGS_ANY else 1))
            continue
        decls = [*p.flags, p.name]
        if p.is_flag:
            params.append(click.Option(decls, is_flag=True, help=p.help))
            continue
        kind = click.Choice(p.choices) if p.choices else click.IntRange(min=p.minimum) \
            if p.minimum is not None else p.kind
        if p.multiple:  # repeatable; none given is the default (None), not ()
            params.append(click.Option(decls, type=kind, multiple=True, metavar=p.metavar, help=p.help,
                                       callback=lambda ctx, param, value: list(value) or None))
            continue
        params.append(click.Option(decls, type=kind, default=p.default, metavar=p.metavar,
                                   show_default=p.show_default, help=p.help))

    def callback(**values):
        commands.call_here(command, values)

    return click.Command(command.name, context_settings=CONTEXT, callback=callback, params=params,
                         help=command.help)


for _command in commands.COMMANDS.values():
    cli.add_command(declared(_command))


def start_options(command, options=None):
    """The options of `start` (or the given ones), from the one description of a start
    (`subtask.model.start_options`)."""
    for option in reversed(options or OPTIONS):
        if option.argument:
            command = click.argument(option.name, metavar=option.name.upper())(command)
            continue
        decls = [option.flag, *([option.short] if option.short else []), option.name]
        if option.kind is bool:
            command = click.option(*decls, is_flag=True, help=option.help_for("cli"))(command)
            continue
        kind = click.Choice(option.choices) if option.choices else option.kind
        if option.multiple or option.repeat:  # repeatable; none given is the default (None), not ()
            command = click.option(*decls, type=kind, multiple=True, metavar=option.metavar,
                                   callback=lambda ctx, param, value: list(value) or None,
                                   help=option.help_for("cli"))(command)
            continue
        command = click.option(*decls, type=kind, default=option.default, metavar=option.metavar,
                               show_default=option.show_default, help=option.help_for("cli"))(command)
    return command


def _map_options(command):
    return start_options(command, MAP_OPTIONS)


@cli.command("map", context_settings=CONTEXT)
@click.argument("pattern", metavar="GLOB")
@click.argument("template", metavar="TASK")
@click.option("--batch", type=int, default=1, show_default=True, help="files per job")
@click.option("--concurrency", type=int, help="at most this many of its jobs run at once (within subtask.maxRunning)")
@_map_options
@click.option("--json", "as_json", is_flag=True, help="print the group and its jobs as JSON")
def map_(pattern, template, batch, concurrency, as_json, **options):
    """Fan a task out over files: one job per batch of tracked files matching GLOB, as one group.

    TASK is a template: {files} becomes the batch's paths, shell-quoted and separated by spaces.
    GLOB is git's glob (`*` stays within a folder, `**` crosses folders), from the top of the
    repository. Prints the group id (sg-...) and one line per job; wait, list, show and stop take
    the group id, and `start --after sg-...` starts a job from all their heads merged.
    """
    from subtask.faces import replies

    if template == "-":
        template = sys.stdin.read()
    request = api.StartRequest(task=template, **options)
    _emit(replies.started(api.start_map(_repo(), pattern, request, batch=batch, concurrency=concurrency)), as_json)


def _is_group(text: str) -> bool:
    from subtask.model.job import is_group_ref

    return is_group_ref(text)


@cli.command(context_settings=CONTEXT)
@click.argument("job_id", metavar="ID")
@click.argument("message")
@click.option("--max-usd", type=float, help="budget for this attempt (default: the job's)")
@click.option("--timeout", type=float, help="seconds the engine may run this time")
@click.option("--json", "as_json", is_flag=True)
def reply(job_id, message, max_usd, timeout, as_json):
    """Start a new attempt of a finished job in its worktree, resuming the engine's session.

    For the shell engine MESSAGE is another script. Use - to read it from standard input.
    """
    from subtask.faces import replies

    if message == "-":
        message = sys.stdin.read()
    _emit(replies.started(api.reply(_repo(), job_id, message, max_usd=max_usd, timeout=timeout)), as_json)


@cli.command(context_settings=CONTEXT)
@click.argument("ids", nargs=-1, required=True)
@click.option("--timeout", type=float, help="stop watching after this many seconds (exit 1)")
def watch(ids, timeout):
    """Show live progress of jobs until they end: elapsed, state, latest activity per job.

    On a terminal the lines redraw in place; otherwise a line is printed whenever one changes.
    Exit codes as for wait.
    """
    from subtask import words as render

    repo = _repo()
    live = sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
    shown: dict[str, str] = {}
    drawn = [0]

    def draw(elapsed, ended, total, activities):
        lines = []
        for job, position, activity, _ in (api.status(repo, i)[0] for i in ids):
            lines.append(f"[{render.duration(elapsed)}] {render.status_line(job, position, activity)}")
        if live:
            click.echo(("\x1b[F" * drawn[0]) + "\n".join("\x1b[K" + line for line in lines))
            drawn[0] = len(lines)
        else:
            for line, job_id in zip(lines, ids, strict=False):
                body = line.split("] ", 1)[1]
                if shown.get(job_id) != body:
                    shown[job_id] = body
                    echo(line)

    draw(0.0, 0, len(ids), {})
    result = api.wait(repo, list(ids), timeout=timeout, on_tick=draw, tick=0.5 if live else 1.0)
    if live:
        click.echo("\x1b[F" * drawn[0], nl=False)
    for job in result.jobs:
        click.echo(("\x1b[K" if live else "") + render.one_line(job))
    sys.exit(0 if result.all_passed else EXIT_NEGATIVE)


@cli.command(context_settings=CONTEXT)
@click.argument("job_id", metavar="ID")
@click.argument("paths", nargs=-1, metavar="[-- PATH...]")
@click.option("--stat", is_flag=True, help="a diffstat instead of the patch")
@click.option("--json", "as_json", is_flag=True, help="the diff as JSON: base, head, text (at most --max-bytes)")
@click.option("--max-bytes", type=int, help="with --json: at most this many bytes of text (default 50000)")
def diff(job_id, paths, stat, as_json, max_bytes):
    """git diff base..head of the job (works after its branch is deleted)."""
    if as_json:
        from subtask.faces import replies

        _emit(replies.git_output(api.diff(_repo(), job_id, stat=stat, paths=list(paths) or None, limit=max_bytes),
                                 what="diff", hint="--stat, or name paths"), True)
        return
    import subprocess

    sys.exit(subprocess.call(api.diff_argv(_repo(), job_id, stat=stat, paths=list(paths) or None)))


@cli.command(context_settings=CONTEXT)
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="the log as JSON: base, head, text (at most --max-bytes)")
@click.option("--max-bytes", type=int, help="with --json: at most this many bytes of text (default 50000)")
def log(job_id, as_json, max_bytes):
    """git log base..head --notes=subtask of the job."""
    if as_json:
        from subtask.faces import replies

        _emit(replies.git_output(api.log(_repo(), job_id, limit=max_bytes), what="log", hint="git subtask log ID"),
              True)
        return
    import subprocess

    sys.exit(subprocess.call(api.log_argv(_repo(), job_id)))


@cli.command(context_settings=CONTEXT)
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True)
def stop(job_id, as_json):
    """Stop a job: drop it from the queue, or end its worker (SIGTERM, then SIGKILL)."""
    from subtask.faces import replies

    repo = _repo()
    if _is_group(job_id):
        _emit(replies.stopped_group(repo, api.stop_group(repo, job_id)), as_json)
    else:
        _emit(replies.stopped(api.stop(repo, job_id)), as_json)


@cli.command(context_settings=CONTEXT)
@click.argument("job_id", metavar="ID")
@click.option("--squash", is_flag=True, help="one new commit on the current branch")
@click.option("--no-ff", "no_ff", is_flag=True, help="always a merge commit")
@click.option("--ff-only", "ff_only", is_flag=True, help="only a fast-forward")
@click.option("--force", is_flag=True,
              help="merge even if the job failed, verify failed, or its branch moved after verify")
@click.option("--reverify", is_flag=True, help="run the job's verify again here on the exact commit before merging "
              "(the default for another clone's job whose record no allowed signer signed)")
@click.option("--json", "as_json", is_flag=True)
def merge(job_id, squash, no_ff, ff_only, force, reverify, as_json):
    """Merge a finished job into the current branch, then clean up after it.

    Merges a job that ended done and whose verify passed; a job started without --verify merges
    on done alone (nothing was checked: say --verify to gate it). Refuses (exit 1, with the
    reason) when the job has not finished or did not end done, its verify failed, or its branch
    moved after the commit verify tested, unless --force; never touches a dirty worktree; a
    conflict is aborted and the conflicting files listed. A job with no commits beyond its base
    has nothing to merge: exit 1, even with --force. Says "(fast-forward)" when it fast-forwarded;
    a squash commit takes the job's commit subject (one commit), or its summary's first line and
    the list of its commits (several).

    Another clone's job (pulled) is merged on its recorded verify only when an allowed signer
    signed its record (gpg.ssh.allowedSignersFile, or the keyring); otherwise its verify command
    runs here first, on the exact commit, in a scratch worktree (docs/review.md).
    """
    from subtask.faces import replies

    mode = api.merge_mode(squash=squash, no_ff=no_ff, ff_only=ff_only)
    if _is_group(job_id):
        _emit(replies.merged_group(*api.merge_group(_repo(), job_id, mode=mode, force=force, reverify=reverify)),
              as_json)
    else:
        _emit(replies.merged(api.merge(_repo(), job_id, mode=mode, force=force, reverify=reverify)), as_json)


@cli.command(context_settings=CONTEXT)
@click.argument("ids", nargs=-1, metavar="ID|GID...")
@click.option("--verify", "verify", metavar="CMD", help="run this on every integrated commit instead of each job's "
              "own verify (sh -c, in a scratch worktree)")
@click.option("--atomic", is_flag=True, help="all or nothing: the branch moves once, only if every job integrated "
              "and passed")
@click.option("--reconcile", is_flag=True, help="answer a conflict with a reply to the job on the new tip (a shell "
              "job's task runs again), and land it once that passes its verify")
@click.option("--squash", is_flag=True, help="one new commit per job")
@click.option("--no-ff", "no_ff", is_flag=True, help="always a merge commit")
@click.option("--rebase", is_flag=True, help="the job's commits replayed on the tip")
@click.option("--force", is_flag=True, help="land jobs that did not end done, whose verify failed, or that have "
              "nothing to verify (the integrated commit is still verified when there is a command)")
@click.option("--dry-run", "-n", is_flag=True, help="say what would happen and which jobs touch the same files; "
              "change nothing")
@click.option("--window", type=int, metavar="K", help="verify up to K integrated states at once (default: "
              "subtask.land.window, else the cores, at most the free worker slots)")
@click.option("--batch", is_flag=True, help="verify only the last state of each batch of jobs; a failed batch is "
              "cut until its culprit is found")
@click.option("--batch-size", "batch_size", type=int, metavar="N", help="jobs per batch (default: "
              "subtask.land.batch, else the whole queue); implies --batch")
@click.option("--no-reuse", "no_reuse", is_flag=True, help="run every verify, even for a tree whose result is "
              "already known")
@click.option("--first", "first", metavar="ID", multiple=True, help="put this job at the head of the queue (the "
              "hotfix lane): while another land runs, it is handed to that queue")
@click.option("--json", "as_json", is_flag=True)
def land(ids, verify, atomic, reconcile, squash, no_ff, rebase, force, dry_run, window, batch, batch_size, no_reuse,
         first, as_json):
    """Land finished jobs in the order given, each verified on the commit that lands.

    Each job is integrated on the one before it, from the current branch's tip (or
    subtask.landTarget), and up to --window of those states are verified at once, each in a
    scratch worktree (--verify, else each job's own verify). The branch moves, by
    compare-and-swap, to the longest prefix that passed: a commit made meanwhile is kept and the
    states are built again on it. A job that conflicts or fails is reported (files, both sides,
    verify output) and the states after it are built again without it; with --atomic nothing
    lands unless all pass; with --batch only each batch's last state is verified, and a failed
    batch is cut until its culprit is found. A result already known for the same tree, command,
    harness and environment is reused (--no-reuse runs it). A best-of group (sg-...) lands its
    pick. Exit 1 unless every job landed (docs/review.md, "Landing many").
    """
    from subtask.faces import replies

    mode = api.land_mode(squash=squash, no_ff=no_ff, rebase=rebase)
    result = api.land(_repo(), list(ids), mode=mode, verify=verify, atomic=atomic, reconcile=reconcile,
                      force=force, dry_run=dry_run, window=window,
                      batch=batch_size if batch_size is not None else (0 if batch else None),
                      reuse=False if no_reuse else None,
                      first=list(first), progress=_land_progress())
    _emit(replies.landed(result.to_dict()), as_json)


@cli.command("verify", context_settings=CONTEXT)
@click.argument("job_id", metavar="ID")
@click.option("--run", "run", is_flag=True, help="also run the job's verify command here, on the exact commit "
              "its record names, in a scratch worktree (a result already known for that tree is reused)")
@click.option("--no-reuse", "no_reuse", is_flag=True, help="with --run: run it even when its result is known")
@click.option("--json", "as_json", is_flag=True)
def verify_(job_id, run, no_reuse, as_json):
    """Check a finished job's record against git: what matches and what does not.

    From the record alone: its signature (as git checks it with gpg.ssh.allowedSignersFile or
    the keyring), its pins, its evidence computed again from git (commits, files, +/-), its
    verify result against the commit it names; with --run, the verify command itself. Exit 1
    on any mismatch. What a reviewer runs on a teammate's job, and CI on a pushed branch.
    """
    report = api.verify(_repo(), job_id, run=run, reuse=False if no_reuse else None)
    if as_json:
        _emit_json(report.to_dict())
    else:
        for line in report.lines():
            echo(line)
    sys.exit(EXIT_NEGATIVE if report.mismatches else 0)


@cli.command(context_settings=CONTEXT)
@click.argument("group_id", metavar="GID")
@click.option("--patch", "-p", is_flag=True, help="the full diffs instead of --stat")
@click.option("--json", "as_json", is_flag=True, help="the diffs as JSON (at most --max-bytes in all)")
@click.option("--max-bytes", type=int, help="with --json: at most this many bytes of diff text (default 50000)")
def compare(group_id, patch, as_json, max_bytes):
    """The diffs between a best-of-N group's members: git diff between their heads, every pair.

    The pick (or the first member) comes first; --stat by default.
    """
    if not _is_group(group_id):
        raise click.UsageError(f"compare takes a group id (sg-...), not {group_id!r}")
    if as_json:
        from subtask.faces import replies

        _emit(replies.compared(api.compare(_repo(), group_id, stat=not patch, limit=max_bytes)), True)
        return
    pairs = api.compare_argvs(_repo(), group_id, stat=not patch)
    import subprocess  # here, as for diff and log: no other command needs it

    code = 0
    for title, argv in pairs:
        echo(f"== {title}")
        sys.stdout.flush()
        code = max(code, subprocess.call(argv))
    sys.exit(code)


@cli.command(context_settings=CONTEXT)
@click.option("--dry-run", "-n", is_flag=True, help="say what would be removed")
@click.option("--older-than", default="30d", show_default=True,
              help="age of finished jobs whose clean worktrees go (30d, 12h, 2w)")
@click.option("--json", "as_json", is_flag=True)
def gc(dry_run, older_than, as_json):
    """Clean up landed jobs, remove clean worktrees of old finished jobs, prune, git gc --auto.

    Also deletes an old finished job's branch that has no commits beyond its base (stopped or
    failed before committing). Never touches running jobs, dirty worktrees or branches with
    unmerged commits; records and pins stay (they are the history).
    """
    _emit_lines(api.gc(_repo(), dry_run=dry_run, older_than=older_than).lines, as_json,
                nothing="nothing to collect", dry_run=dry_run)


@cli.group(context_settings=CONTEXT, invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def pool(ctx, as_json):
    """The pool of ready worktrees: how many (of subtask.pool), at which commits, their disk.

    A job's worker takes one (rewriting only the files that differ from the job's base) and
    refills the pool in the background of that job; a landed or cleaned-up job's clean worktree
    comes back to it, emptied of every untracked and ignored file. gc empties it.
    """
    if ctx.invoked_subcommand is None:
        from subtask.faces import replies

        _emit(replies.pool(api.pool_status(_repo())), as_json)


@pool.command("fill", context_settings=CONTEXT)
@click.argument("count", type=click.IntRange(min=0), required=False, metavar="[N]")
@click.option("--json", "as_json", is_flag=True)
def pool_fill(count, as_json):
    """Fill the pool now to N ready worktrees (default subtask.pool) at HEAD, within subtask.poolMaxBytes."""
    from subtask.faces import replies

    made, status = api.pool_fill(_repo(), count)
    _emit(replies.pool(status, made), as_json)


@cli.group(context_settings=CONTEXT)
def routing():
    """How --engine auto chooses an engine (docs/engines.md, "Routing")."""


@routing.command("explain", context_settings=CONTEXT)
@start_options
@click.option("--json", "as_json", is_flag=True)
def routing_explain(as_json, **options):
    """Which engine --engine auto would choose for this start, and why; starts nothing.

    Every candidate, with the filter that removed it (installed, authenticated, isolation,
    budget, room) or its score and the terms of it (pass rate, cost and time of its jobs in this
    repository, room left). Exit 1 when no candidate is left (start --engine auto refuses then).
    """
    from subtask.faces import replies

    if options["task"] == "-":
        options["task"] = sys.stdin.read()
    _emit(replies.routed(api.routing_explain(_repo(), api.StartRequest(**options))), as_json)


@cli.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True)
def du(as_json):
    """What jobs cost on disk, and what cleanup --merged and gc would free.

    Per job whose worktree this clone checked out: its bytes on disk, split into tracked,
    untracked and ignored files (a running job's is measured whole), and the objects only its
    branch and pins keep; every other folder in the worktree folder (scratch worktrees, temp
    dirs); the total; and the worktrees cleanup --merged and gc would remove, with their bytes.
    """
    from subtask.faces import replies

    _emit(replies.disk(api.du(_repo())), as_json)


@cli.command(context_settings=CONTEXT)
@click.option("--display", is_flag=True, help="also show the review notes in plain git log (notes.displayRef)")
def init(display):
    """Set the repository up for git-subtask (notes merge strategy, notes ref; optional display)."""
    changed = api.init(_repo(), display=display)
    for line in changed or ["already set up"]:
        echo(line)


@cli.group(context_settings=CONTEXT)
def notes():
    """The review notes in refs/notes/subtask."""


@notes.command("rebuild", context_settings=CONTEXT)
def notes_rebuild():
    """Regenerate every job's note block from its record (idempotent)."""
    echo(f"{api.notes_rebuild(_repo())} block(s) changed")


@cli.group(context_settings=CONTEXT)
def hooks():
    """The post-merge hook that cleans up after landed jobs."""


def _hooks(action: str, as_json: bool = False) -> None:
    result = api.hooks(_repo(), action)
    _emit_lines(result.lines, as_json, installed=result.installed)
    if action == "status" and not result.installed:
        sys.exit(EXIT_NEGATIVE)


@hooks.command("install", context_settings=CONTEXT)
def hooks_install():
    """Install the post-merge hook (an existing hook is kept and called first)."""
    _hooks("install")


@hooks.command("uninstall", context_settings=CONTEXT)
def hooks_uninstall():
    """Remove the hook and restore exactly what was there."""
    _hooks("uninstall")


@hooks.command("status", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True)
def hooks_status(as_json):
    """Is the hook installed? (exit 1 if not)"""
    _hooks("status", as_json)


@cli.command(context_settings=CONTEXT)
@click.argument("remote", default="origin")
@click.option("--branches", is_flag=True, help="push the job branches too")
def push(remote, branches):
    """Push job records and review notes to REMOTE, never forced; exit 1 if a record diverged there
    (an older or newer copy is no divergence)."""
    result = api.push(_repo(), remote, branches=branches)
    for line in result.lines or ["everything up to date"]:
        echo(line)
    sys.exit(0 if result.ok else EXIT_NEGATIVE)


@cli.command(context_settings=CONTEXT)
@click.argument("remote", default="origin")
def pull(remote):
    """Fetch teammates' job records and notes from REMOTE; a local record is never overwritten."""
    result = api.pull(_repo(), remote)
    for line in result.lines or ["everything up to date"]:
        echo(line)
    sys.exit(0 if result.ok else EXIT_NEGATIVE)


@cli.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True)
def engines(as_json):
    """The engines: installed, authenticated, version, paid, isolation."""
    from subtask.faces import replies

    _emit(replies.engines(api.engines(_repo()), compact=False), as_json)


@cli.command(context_settings=CONTEXT)
@click.option("--month", help="YYYY-MM (default: this month, UTC)")
@click.option("--all-clones", "all_clones", is_flag=True,
              help="the spend of every clone whose records were pulled here, from the records only")
@click.option("--json", "as_json", is_flag=True)
def spend(month, all_clones, as_json):
    """Spend of paid engines: committed, open reservations, per engine, cap left."""
    from subtask.faces import replies

    _emit(replies.spend(api.spend(_repo(), month, all_clones=all_clones), all_clones), as_json)


def _install(client: str, scope: str, dry_run: bool, as_json: bool, uninstall: bool) -> None:
    verb = "uninstall" if uninstall else "install"

    def show(lines: list[str]) -> None:
        if as_json:
            return
        echo(f"git subtask {verb} {client} --scope {scope}" + (" (dry run: nothing changes)" if dry_run else ":"))
        for line in lines:
            echo(f"  {line}")

    plan = api.install(client, scope, uninstall=uninstall, dry_run=dry_run, where=os.environ.get("SUBTASK_REPO"),
                       on_plan=show)
    if as_json:
        _emit_json(plan.to_dict() | {"dry_run": dry_run})
    elif plan.steps and not dry_run:
        undo = f"undo: git subtask uninstall {client} --scope {scope}" if not uninstall else "install again: " \
               f"git subtask install {client} --scope {scope}"
        echo(f"done (backups of changed files in {plan.backups}; {undo})")
        if not uninstall:
            echo("restart the client's session to load the server; check it: git subtask doctor")


@cli.command(context_settings=CONTEXT)
@click.argument("client", type=click.Choice(["claude", "codex", "all"]))
@click.option("--scope", type=click.Choice(["user", "project"]), default="user", show_default=True,
              help="user: every project of yours; project: this repository (.mcp.json, .codex/config.toml), "
                   "for the team")
@click.option("--dry-run", "-n", is_flag=True, help="show the plan; change nothing")
@click.option("--json", "as_json", is_flag=True)
def install(client, scope, dry_run, as_json):
    """Register the MCP server, and the agent's guide as a skill, in Claude Code or Codex.

    Shows the plan first, backs up every file it changes, writes atomically, and records what it
    added, so `uninstall` takes out exactly that. Running it again changes nothing. Claude Code
    (user scope): `claude mcp add` when claude is on PATH, else ~/.claude.json; Codex:
    ~/.codex/config.toml with the variables the server's engines need (env_vars).
    """
    _install(client, scope, dry_run, as_json, uninstall=False)


@cli.command(context_settings=CONTEXT)
@click.argument("client", type=click.Choice(["claude", "codex", "all"]))
@click.option("--scope", type=click.Choice(["user", "project"]), default="user", show_default=True)
@click.option("--dry-run", "-n", is_flag=True, help="show the plan; change nothing")
@click.option("--json", "as_json", is_flag=True)
def uninstall(client, scope, dry_run, as_json):
    """Take out what `git subtask install` added, and nothing else: an entry or file changed since is left, and said."""
    _install(client, scope, dry_run, as_json, uninstall=True)


@cli.command("help", context_settings=CONTEXT)
@click.argument("words", nargs=-1, metavar="[COMMAND]")
@click.pass_context
def help_(ctx, words):
    """The manual page (as git subtask --help), or a command's usage: git subtask help start."""
    if not words:
        import subprocess

        if subprocess.call(["git", "help", "subtask"], stderr=subprocess.DEVNULL) != 0:
            echo(cli.get_help(ctx.parent))  # no man here: the usage of every command
        return
    command, path = cli, ["git subtask"]
    for word in words:
        found = command.get_command(ctx, word) if isinstance(command, click.Group) else None
        if found is None or found.hidden:
            raise SubtaskError("usage", f"no such command: git subtask {' '.join(words)}",
                               hint="git subtask help   (every command is in the manual page)")
        command, path = found, [*path, word]
    with click.Context(command, info_name=" ".join(path), parent=None) as sub:
        echo(command.get_help(sub))


@cli.command(context_settings=CONTEXT)
def mcp():
    """Run the MCP server on stdio (the same as subtask-mcp), for Claude Code, Codex and other agents."""
    # loads the mcp SDK (~0.6 s) once it has answered initialize: only here
    from subtask.faces import mcp_server

    mcp_server.main()


@cli.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True)
@click.option("--strict", is_flag=True, help="exit 1 on warnings too")
def doctor(as_json, strict):
    """Check git, the repository, hooks, notes, state files, slots, worktrees and engines.

    Exit 1 when a check fails (or warns, with --strict).
    """
    report = api.doctor(os.environ.get("SUBTASK_REPO") or None)
    if as_json:
        _emit_json(report.to_dict())
    else:
        marks = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}
        width = max(len(check.name) for check in report.checks)
        for check in report.checks:
            echo(f"{marks[check.status]}  {check.name:<{width}}  {check.message}")
            for step in check.remediation:
                echo(f"      {'':<{width}}  -> {step}")
    failed = report.status == "fail" or (strict and report.status == "warn")
    sys.exit(EXIT_NEGATIVE if failed else 0)


@cli.command(context_settings=CONTEXT)
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell):
    """Print the completion script for SHELL (commands, options and job ids).

    \b
    bash: git subtask completion bash > ~/.local/share/bash-completion/completions/git-subtask
    zsh:  git subtask completion zsh > "${fpath[1]}/_git-subtask"
    fish: git subtask completion fish > ~/.config/fish/completions/git-subtask.fish
    """
    from subtask.faces.completion import SCRIPTS

    click.echo(SCRIPTS[shell], nl=False)


@cli.command("run-remote", hidden=True, context_settings=CONTEXT)
@click.argument("job_id", metavar="ID")
@click.option("--remote", "url", required=True, help="the URL this node fetches the job from and pushes it to")
@click.option("--attempt", type=int, required=True, help="the attempt the Ray job was submitted for")
def run_remote(job_id, url, attempt):
    """On a cluster node: fetch the job, run its worker, push its results (the Ray job's entrypoint)."""
    sys.exit(api.run_remote(job_id, url, attempt))


@cli.command("__complete", hidden=True, context_settings={"ignore_unknown_options": True})
@click.argument("words", nargs=-1, type=click.UNPROCESSED)
def complete_words(words):
    """Completion candidates for the words typed so far (used by the completion scripts)."""
    from subtask.faces.completion import candidates

    def job_ids():
        try:
            return api.all_ids(_repo())
        except Exception:  # outside a repository, or a damaged one: no ids to offer
            return []

    def engines():
        try:
            return api.engine_names(_repo())
        except Exception:
            return ["shell", "claude", "codex"]

    echo("\n".join(candidates(cli, list(words), job_ids, engines)))


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI with git's exit codes and one error path (`output.guarded`)."""
    from subtask.faces import manpage
    from subtask.model import faults

    interrupt_once()
    output.prepare()
    manpage.ensure_installed(cli)
    faults.point("cli_dispatch")
    output.guarded(lambda: _click_main(argv))


def _click_main(argv: list[str] | None) -> None:
    """click's own failures in git's words: a usage error exits 129 with the usage."""
    try:
        cli.main(args=argv, prog_name="git subtask", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
        sys.exit(EXIT_USAGE)
    except click.UsageError as exc:
        echo(f"error: {exc.format_message()}", err=True)
        if exc.ctx is not None:
            echo(exc.ctx.get_usage(), err=True)
        sys.exit(EXIT_USAGE)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(130)
