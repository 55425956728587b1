"""The MCP face: the same jobs as `git subtask`, as tools for agents, on the mcp SDK's MCPServer.

Owns the tools' declarations: each tool's name, parameters (their schemas; `start`'s built from
`subtask.model.start_options`), annotations and docstring (what tools/list says), and its body,
which parses its arguments and calls `subtask.api` in a worker thread, answering the
`subtask.faces.replies` the CLI prints. No job logic lives here. How the server handles a call
(argument errors, error words, the reply's shape, job events told to the client) is
`subtask.faces.mcp_calls`. The process entry point (and its fast start) is
`subtask.faces.mcp_server`; `serve` runs this server over the line streams it hands over, and
`describe` produces the cached replies it answers with before the SDK is loaded.

Invariants:
- Importing this module registers every tool on `mcp_calls.server`: `server`, `serve` and
  `describe` are taken from here, never from `mcp_calls` alone.
- Nothing but protocol on stdout. Nothing here prints; workers log to files (lifecycle.spawn_worker),
  and the SDK logs to stderr. JSON text is `render.json_text`: exact values, escaped.
- A tool's name, signature, docstring or annotations are what mcp_cache.json caches: change one
  and run scripts/mcp_cache.py.
- Blocking calls (git, flocks, `api.wait`) run in worker threads, so one long `wait` never stalls
  other requests; `wait` sends progress from the event loop about once a second.
- Jobs outlive the server: workers are detached (own session), so a server that dies leaves them
  running, and any later server or the CLI reads their records.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Annotated, Any, Literal

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp_types import jsonrpc_message_adapter
from pydantic import Field, ValidationError, WithJsonSchema

from subtask import api
from subtask import words as render
from subtask.faces import jsonrpc, replies
from subtask.faces.mcp_calls import mcp_words, open_repo, server, tool
from subtask.faces.mcp_versions import installed_versions
from subtask.model import start_options
from subtask.model.errors import SubtaskError
from subtask.model.job import is_group_ref

PROGRESS_TICK = 1.0  # seconds between progress notifications during wait (at most 1/s, at least 1/10 s)
ACTIVITY_WIDTH = 60


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking api call in a worker thread, so the event loop keeps serving other requests."""
    return await anyio.to_thread.run_sync(fn, *args)


def _id_list(ids: list[str] | str) -> list[str]:
    return [ids] if isinstance(ids, str) else list(ids)


REPO = Annotated[str | None, Field(description="absolute path to a git work tree (default: the server's directory)")]
MAX_BYTES = Annotated[int, Field(description="at most this many bytes of git's output in the reply; the rest "
                                             "is counted and said to be left out")]


# ---------------------------------------------------------------- starting

def _start_signature(options=None, leading: tuple[inspect.Parameter, ...] = ()) -> inspect.Signature:
    """`start`'s parameters: the options of a start (or the given ones, after `leading`), from
    `subtask.model.start_options`, then `repo`."""
    kinds = {str: str, int: int, float: float, bool: bool}
    params = list(leading)
    for option in options or start_options.OPTIONS:
        kind: Any = Literal[option.choices] if option.choices else kinds[option.kind]
        if option.names or option.multiple:
            kind = kind | list[kind]
        if option.argument:
            params.append(inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY,
                                            annotation=Annotated[kind, Field(description=option.help_for("mcp"))]))
            continue
        if option.kind is not bool:
            kind = kind | None
        params.append(inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=option.default,
                                        annotation=Annotated[kind, Field(description=option.help_for("mcp"))]))
    params.append(inspect.Parameter("repo", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=REPO))
    return inspect.Signature(params)


async def start(*, repo: str | None = None, **options: Any) -> replies.Reply:
    """Start one background job in its own worktree and branch; answers its id at once (then call
    wait with it). With best_of: a group of attempts, answering the group id (sg-...), which wait,
    result, show, compare and merge take."""

    def run() -> replies.Reply:
        return replies.started(api.launch(open_repo(repo), api.StartRequest(**options)))

    return await _call(run)


start.__signature__ = _start_signature()  # type: ignore[attr-defined]
tool("start", title="Start a job")(start)

START_ITEMS = Annotated[list[dict[str, Any]], WithJsonSchema({"type": "array", "items": start_options.item_schema(),
                                                              "minItems": 1})]


@tool("start_many", title="Start several jobs")
async def start_many(tasks: START_ITEMS) -> replies.Reply:
    """Start several jobs in one call; one line per item, in order: its id and state, or its error.

    Each item has the fields of start (and its own repo, if it likes). An item that fails does not
    stop the others. Then call wait once with all the ids.
    Chains: an item may carry "id" (a name of your choice) and "after" (a name or a list: ids of
    items of this call, or job/group ids); it then starts once those ended, from their heads, e.g.
    [{"id": "api", "task": ...}, {"id": "client", "after": "api", "task": ...}].
    """
    return await _call(lambda: replies.started_many(api.start_many(tasks, repo_for=open_repo),
                                                    words=mcp_words))


async def map_files(*, pattern: str, task: str, batch: int = 1, concurrency: int | None = None,
                    repo: str | None = None, **options: Any) -> replies.Reply:
    """One job per batch of tracked files matching pattern (git's glob: * within a folder, ** across),
    as one group (sg-...). task is a template: {files} becomes the batch's paths, shell-quoted.
    concurrency: at most this many of its jobs run at once. wait, list, result and stop take the
    group id; start with after=[the group id] starts a job from all their heads merged.
    """
    request = api.StartRequest(task=task, **options)
    return await _call(lambda: replies.started(api.start_map(open_repo(repo), pattern, request, batch=batch,
                                                             concurrency=concurrency)))


_KW = inspect.Parameter.KEYWORD_ONLY
map_files.__signature__ = _start_signature(start_options.MAP_OPTIONS, (  # type: ignore[attr-defined]
    inspect.Parameter("pattern", _KW, annotation=str),
    inspect.Parameter("task", _KW, annotation=str),
    inspect.Parameter("batch", _KW, default=1, annotation=int),
    inspect.Parameter("concurrency", _KW, default=None, annotation=int | None)))
tool("map", title="Fan a task out over files")(map_files)


# ---------------------------------------------------------------- waiting

def _progress_message(elapsed: float, ended: int, total: int, activities: dict[str, str | None]) -> str:
    parts = [f"{render.duration(elapsed)}: {ended} of {total} ended"]
    for job_id, activity in activities.items():
        text = (activity or "waiting").replace("\n", " ")
        if len(text) > ACTIVITY_WIDTH:
            text = text[: ACTIVITY_WIDTH - 1] + "…"
        parts.append(f"{job_id} {text}")
    return render.safe_line(" · ".join(parts))


SINCE_HELP = ("a cursor from the last wait's answer (0: from the beginning): answer the events after it (state "
              "changes, stall marks, progress lines) as soon as there is one, and the next cursor")


class _Abandoned(Exception):
    """Raised from the tick callback when the caller has gone: ends `api.wait` early."""


@tool("wait", read_only=True, title="Wait for jobs")
async def wait(ids: list[str] | str, ctx: Context, timeout: float = 300, any: bool = False,
               since: Annotated[str | None, Field(description=SINCE_HELP)] = None,
               repo: REPO = None) -> replies.Reply:
    """Block until the jobs end (any=true: until the first one ends), or one stalls; one line per job.

    Sends a progress notification about once a second (elapsed, n of total ended, each job's latest
    activity). On timeout the jobs keep running: call wait again. timeout=0 answers at once with the
    jobs as they are (a poll). Prefer one wait over polling.
    A best-of group id (sg-...) waits for every attempt, then answers the ranking and the pick.
    With since (a client that shows no progress): answers as soon as a job has an event after
    that cursor, with the events and the next cursor; pass it back and nothing is missed.
    """
    job_ids = _id_list(ids)
    first_only = any  # the parameter is named for the CLI's --any; keep the builtin out of it
    gone = threading.Event()

    def on_tick(elapsed: float, ended: int, total: int, activities: dict[str, str | None]) -> None:
        if gone.is_set():
            raise _Abandoned
        message = _progress_message(elapsed, ended, total, activities)
        try:  # progress is a courtesy: a failed send never ends the wait
            anyio.from_thread.run(ctx.report_progress, round(elapsed, 1), float(timeout), message)
        except Exception:
            pass

    def run() -> replies.Reply:
        where = open_repo(repo)
        waited = api.wait_ids(where, job_ids, timeout=timeout, any_=first_only, on_tick=on_tick,
                              tick=PROGRESS_TICK, since=since)
        return replies.waited_any(where, waited, timeout)

    try:
        return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        gone.set()  # the thread ends at its next tick instead of waiting out the timeout
        raise


# ---------------------------------------------------------------- reading

@tool("status", read_only=True, title="Job status")
async def status(id: str | None = None, repo: REPO = None) -> replies.Reply:
    """One job's status in one line (queue position, latest activity); without id: every active job.

    Do not poll this to wait for jobs: call wait, which returns the moment they end.
    """
    return await _call(lambda: replies.status(api.status(open_repo(repo), id)))


@tool("result", read_only=True, title="Job result")
async def result(id: str, full: bool = False, evidence: bool = False, repo: REPO = None) -> replies.Reply:
    """A job's one-line status and summary (at most 10 lines; full=true for all of it); its
    structured content is the evidence envelope: what the runner observed (git base, head,
    commits, changed files, verification, commands, cost), apart from what the engine claimed.
    evidence=true returns that envelope as the text too. A best-of group id (sg-...): the ranking
    table and the pick's summary.
    """

    def run() -> replies.Reply:
        where = open_repo(repo)
        reply = (replies.group_result(where, api.get_group(where, id)) if is_group_ref(id)
                 else replies.result(where, api.get(where, id), full=full))
        if evidence:
            reply.text = render.json_text(reply.data)
        return reply

    return await _call(run)


@tool("show", read_only=True, title="Show a job")
async def show(id: str, repo: REPO = None) -> replies.Reply:
    """A job's whole record in words: task, engine, base, branch, worktree, isolation, verify, every
    attempt (state, reason, verify, cost), the changes (commits and files) and the summary. A
    best-of group id (sg-...): its members' table."""

    def run() -> replies.Reply:
        where = open_repo(repo)
        if is_group_ref(id):
            return replies.shown_group(where, api.get_group(where, id))
        job = api.get(where, id)
        return replies.shown(where, job, api.queue_position(where, job.id))

    return await _call(run)


@tool("diff", read_only=True, title="A job's diff")
async def diff(id: str, stat: bool = False, paths: list[str] | None = None, max_bytes: MAX_BYTES = api.OUTPUT_LIMIT,
               repo: REPO = None) -> replies.Reply:
    """git diff of a job's base and head: its patch, or stat=true for a diffstat (read that first on
    a large change); paths limits it to those files. Works after the job landed."""
    return await _call(lambda: replies.git_output(api.diff(open_repo(repo), id, stat=stat, paths=paths,
                                                           limit=max_bytes),
                                                  what="diff", hint="stat=true, or paths=[...]"))


@tool("log", read_only=True, title="A job's commits")
async def log(id: str, max_bytes: MAX_BYTES = api.OUTPUT_LIMIT, repo: REPO = None) -> replies.Reply:
    """git log --notes=subtask of a job's commits (base..head), with its review note."""
    return await _call(lambda: replies.git_output(api.log(open_repo(repo), id, limit=max_bytes),
                                                  what="log", hint="a larger max_bytes"))


@tool("compare", read_only=True, title="Compare a group's attempts")
async def compare(id: str, patch: bool = False, max_bytes: MAX_BYTES = api.OUTPUT_LIMIT,
                  repo: REPO = None) -> replies.Reply:
    """The diffs between a best-of group's attempts (sg-...), every pair, the pick first: a diffstat
    each, or patch=true for the full diffs."""
    if not is_group_ref(id):
        raise SubtaskError("usage", f"compare takes a group id (sg-...), not {id!r}", hint="diff takes a job id")
    return await _call(lambda: replies.compared(api.compare(open_repo(repo), id, stat=not patch, limit=max_bytes)))


@tool("list", read_only=True, title="List jobs")
async def list_jobs(state: str | None = None, limit: int = 20, all: bool = False,
                    repo: REPO = None) -> replies.Reply:
    """One line per job, newest first: id, state, verify, age, cost, engine, task; a best-of group
    is one line (all=true: its attempts under it).

    state: queued, running, done, failed, stopped, active or ended. Landed jobs are hidden (all=true
    shows them).
    """

    def run() -> replies.Reply:
        where = open_repo(repo)
        listing = api.list_jobs(where, state=state, include_all=all, limit=limit)
        return replies.listed(where, api.list_groups(where, listing.jobs), listing, state=state, unfold=all,
                              more_hint="list with a larger limit")

    return await _call(run)


@tool("verify", read_only=True, title="Check a job's record against git")
async def verify(id: str, repo: REPO = None) -> replies.Reply:
    """Check a finished job's record against git: its signature (whose, and whether an allowed
    signer made it), its pins, its evidence computed again from git, its verify result against
    the commit it names. Says what matches and what does not (MISMATCH lines). Runs nothing:
    `git subtask verify ID --run` runs the job's verify command too.
    """
    def check() -> replies.Reply:
        report = api.verify(open_repo(repo), id)
        return replies.Reply("\n".join(report.lines()), report.to_dict(), exit_code=1 if report.mismatches else 0)

    return await _call(check)


@tool("spend", read_only=True, title="Spend")
async def spend(month: str | None = None, all_clones: bool = False, repo: REPO = None) -> replies.Reply:
    """Spend of paid engines this month (month: YYYY-MM): committed, reserved by running jobs, per
    engine, and what is left of subtask.monthlyCapUsd. all_clones: every clone whose records are here."""
    return await _call(lambda: replies.spend(api.spend(open_repo(repo), month, all_clones=all_clones), all_clones))


async def routing(*, repo: str | None = None, **options: Any) -> replies.Reply:
    """Which engine engine="auto" would choose for this start, and why; starts nothing: every
    candidate with the filter that removed it (installed, authenticated, isolation, budget, room)
    or its score and terms (pass rate, cost and time of its jobs in this repository, room left)."""
    return await _call(lambda: replies.routed(api.routing_explain(open_repo(repo), api.StartRequest(**options))))


routing.__signature__ = _start_signature()  # type: ignore[attr-defined]
tool("routing", read_only=True, title="Explain --engine auto")(routing)


@tool("du", read_only=True, title="Disk usage")
async def du(repo: REPO = None) -> replies.Reply:
    """What each job's worktree costs on disk (tracked, untracked, ignored files), the objects only
    its refs keep, other folders in the worktree folder, and what cleanup --merged and gc would free."""
    return await _call(lambda: replies.disk(api.du(open_repo(repo))))


@tool("engines", read_only=True, title="Engines")
async def engines(repo: REPO = None) -> replies.Reply:
    """The engines a job can use: installed, authenticated, paid or free, version, isolation."""
    return await _call(lambda: replies.engines(api.engines(open_repo(repo)), compact=True))


# ---------------------------------------------------------------- changing

@tool("reply", title="Reply to a job")
async def reply(id: str, message: str, max_usd: float | None = None, timeout: float | None = None,
                repo: REPO = None) -> replies.Reply:
    """Continue a finished job with a follow-up message (a new attempt on the same branch and session).

    Returns at once, like start; then call wait with the id.
    """
    return await _call(lambda: replies.started(api.reply(open_repo(repo), id, message, max_usd=max_usd,
                                                         timeout=timeout)))


@tool("merge", destructive=True, title="Merge a job")
async def merge(id: str, mode: Literal["merge", "squash", "no-ff", "ff-only"] = "merge", force: bool = False,
                repo: REPO = None) -> replies.Reply:
    """Merge a finished job's branch into the repository's current branch, then remove its clean
    worktree and landed branch (the record and note stay). Refuses, changing nothing, a job that did
    not end done, whose verify failed, or whose branch moved after verify tested it (force=true
    merges anyway), a job with nothing to merge, and a dirty or detached target. A conflict is
    aborted and its files listed. A best-of group id (sg-...) merges its pick and supersedes the rest.
    """

    def run() -> replies.Reply:
        where = open_repo(repo)
        if is_group_ref(id):
            return replies.merged_group(*api.merge_group(where, id, mode=mode, force=force))
        return replies.merged(api.merge(where, id, mode=mode, force=force))

    return await _call(run)


@tool("land", destructive=True, title="Land many jobs")
async def land(ctx: Context, ids: list[str] | None = None, verify: str | None = None, atomic: bool = False,
               reconcile: bool = False, mode: Literal["merge", "squash", "no-ff", "rebase"] = "merge",
               force: bool = False, dry_run: bool = False, window: int | None = None, batch: bool = False,
               batch_size: int | None = None, reuse: bool = True, first: list[str] | None = None,
               repo: REPO = None) -> replies.Reply:
    """Land finished jobs (or best-of group ids: their picks) in the order given onto the current
    branch: each is integrated on the one before it, up to `window` of those states are verified at
    once in scratch worktrees (its verify, or `verify`), and the branch moves to the longest prefix
    that passed (a commit made meanwhile is kept: the states are built again on it). A job that
    conflicts or fails is reported (files, both sides, verify output) and the rest land;
    atomic=true lands all or nothing; reconcile=true answers a conflict with a reply to the job
    on the new tip and lands it once that passes; batch=true verifies only each batch's last state
    (batch_size jobs each) and cuts a failed batch until its culprit is found; reuse=false runs
    every verify even where the same tree's result is known; first=[ids] puts jobs at the head
    of the queue (handed to a land already running). dry_run=true says what would happen and which
    jobs change the same files, changing nothing. Sends progress notifications as wait does. The
    structured content's `ok` is false unless every job landed; a land that landed none is a tool
    error, as a refused merge is, with the same report.
    """
    args = [*(["--verify", verify] if verify else []), *(["--atomic"] if atomic else []),
            *(["--reconcile"] if reconcile else []), *([f"--{mode}"] if mode != "merge" else []),
            *(["--force"] if force else []), *(["--dry-run"] if dry_run else []),
            *(["--window", str(window)] if window is not None else []),
            *(["--batch"] if batch else []), *(["--batch-size", str(batch_size)] if batch_size is not None else []),
            *(["--no-reuse"] if not reuse else []),
            *(arg for job in first or [] for arg in ("--first", job)), "--json", "--", *_id_list(ids or [])]
    gone = threading.Event()
    sent = [-PROGRESS_TICK]
    loop = anyio.lowlevel.current_token()  # the reader of the child's stderr is no anyio thread

    def on_progress(snapshot: dict) -> None:
        elapsed = float(snapshot.get("elapsed") or 0.0)
        if gone.is_set() or snapshot.get("final") or elapsed < sent[0] + PROGRESS_TICK / 2:
            return  # progress increases, about as often as wait's
        sent[0] = elapsed
        try:  # progress is a courtesy: a failed send never ends the landing
            anyio.from_thread.run(ctx.report_progress, elapsed, None, render.land_progress(snapshot), token=loop)
        except Exception:
            pass

    try:
        return await anyio.to_thread.run_sync(lambda: _land_in_child(repo, args, on_progress), abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        gone.set()
        raise


def _land_in_child(repo: str | None, args: list[str], on_progress: Callable[[dict], None] | None = None
                   ) -> replies.Reply:
    """`git-subtask land` in a child process: the verifies it runs on integrated commits are its
    children, confined and killed with it, never this server's. Its `--json` is the reply's data;
    its error, this tool's; its progress (`SUBTASK_PROGRESS=json`: JSON lines on its stderr) goes
    to `on_progress` as it comes. The child is told the repository (`SUBTASK_REPO`, which it reads
    before its working directory), so one this server was started with never wins over the call's
    `repo`."""
    where = open_repo(repo)
    cwd = str(where.workdir() or where.root)
    child = subprocess.Popen([sys.executable, "-m", "subtask", "land", *args], cwd=cwd, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                             env={**os.environ, "SUBTASK_REPO": cwd, "SUBTASK_PROGRESS": "json"})
    stdout, stderr = child.stdout, child.stderr
    assert stdout is not None and stderr is not None  # both PIPE
    said: list[str] = []

    def read_stderr() -> None:
        for line in stderr:
            if line.startswith('{"progress":'):
                try:
                    snapshot = json.loads(line)["progress"]
                except (ValueError, KeyError, TypeError):
                    continue
                if on_progress is not None and isinstance(snapshot, dict):
                    on_progress(snapshot)
            elif line.strip():
                said.append(line.rstrip("\n"))

    reader = threading.Thread(target=read_stderr, name="subtask-land-stderr", daemon=True)
    reader.start()
    try:
        out = stdout.read()
        child.wait()
    except BaseException:
        child.terminate()  # the caller went away: the land ends as an interrupted one does
        child.wait()
        raise
    reader.join()
    if child.returncode in (0, 1) and out.lstrip().startswith("{"):
        return replies.landed(json.loads(out))
    message = next((line[len("error: "):] for line in said if line.startswith("error: ")), None)
    hint = next((line[len("hint: "):] for line in said if line.startswith("hint: ")), None)
    raise SubtaskError({1: "negative", 129: "usage"}.get(child.returncode, "fatal"),
                       message or f"git-subtask land exited {child.returncode}: {' '.join(said[-3:])}", hint,
                       exit_code=child.returncode)


@tool("stop", destructive=True, title="Stop a job")
async def stop(id: str, repo: REPO = None) -> replies.Reply:
    """Stop a job: drop it from the queue, or end its worker (SIGTERM, then SIGKILL). Work committed so
    far stays. A best-of group id (sg-...) stops every attempt."""

    def run() -> replies.Reply:
        where = open_repo(repo)
        if is_group_ref(id):
            return replies.stopped_group(where, api.stop_group(where, id))
        return replies.stopped(api.stop(where, id))

    return await _call(run)


@tool("cleanup", destructive=True, title="Remove a job's worktree")
async def cleanup(id: str, repo: REPO = None) -> replies.Reply:
    """Remove a finished job's worktree when it is clean, and its branch when it has no commits beyond its base; a branch with commits, the record and the note are kept."""  # noqa: E501
    return await _call(lambda: replies.report([api.cleanup(open_repo(repo), id)], dry_run=False))


# ---------------------------------------------------------------- serving and describing

def sdk_refusal(line: str, message: dict | None) -> bytes | None:
    """The error for a line the SDK's transport cannot read, which it would drop unanswered; None
    when it reads it. `subtask.faces.jsonrpc` passed the line (`message`, None for the initialize
    the front end answered); the SDK's reader is stricter (a nesting deeper than ~250 levels, a
    lone surrogate), and its word is final."""
    try:
        jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValidationError as exc:
        ident = message["id"] if jsonrpc.is_request(message) else None
        why = exc.errors(include_url=False)[0]["msg"] if exc.errors() else str(exc)
        refused = jsonrpc.error(jsonrpc.INVALID_REQUEST, ident, f"this server cannot read it: {why}")
        return jsonrpc.line_of(refused)
    return None


async def serve(stdin: Any, stdout: Any) -> None:
    """`MCPServer.run_stdio_async` over the given line streams instead of fd 0 and 1.

    stdin: async-iterable of JSON-RPC lines; stdout: has async `write(str)` and `flush()`. The
    front end (subtask.faces.mcp_server) owns the real pipes, so it hands the SDK's stdio transport
    explicit streams; the rest is exactly what run_stdio_async does.
    """
    from mcp.server.stdio import stdio_server

    lowlevel = server._lowlevel_server  # what run_stdio_async (and the SDK's own Client) uses
    async with stdio_server(stdin=stdin, stdout=stdout) as (read_stream, write_stream):
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())


class _Replies:
    """A stdout for `serve` that keeps the JSON replies and signals when all expected ids have one."""

    def __init__(self, ids: set[Any]) -> None:
        self.by_id: dict[Any, dict] = {}
        self.ids = ids
        self.complete = anyio.Event()

    async def write(self, line: str) -> None:
        message = json.loads(line)
        if "method" not in message and message.get("id") in self.ids:
            self.by_id[message["id"]] = message
            if len(self.by_id) == len(self.ids):
                self.complete.set()

    async def flush(self) -> None:
        pass


async def _converse(messages: list[dict]) -> dict[Any, dict]:
    """Run the real server over in-memory lines; its reply to each request, by id."""
    send, receive = anyio.create_memory_object_stream[str](len(messages) + 1)
    replies = _Replies({m["id"] for m in messages if "id" in m})
    async with anyio.create_task_group() as group:
        group.start_soon(serve, receive, replies)
        for message in messages:
            await send.send(json.dumps(message) + "\n")
        with anyio.fail_after(30):
            await replies.complete.wait()
        await send.aclose()  # end of input: the server ends
    return replies.by_id


LIST_METHODS = ("tools/list", "prompts/list", "resources/list", "resources/templates/list")


def describe() -> dict:
    """What subtask/faces/mcp_cache.json holds: the SDK's own replies to `initialize` and to each list
    request it serves (no cursor), for every protocol version it negotiates through `initialize`."""
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION

    results: dict[str, dict[str, Any]] = {}
    for version in HANDSHAKE_PROTOCOL_VERSIONS:
        messages: list[dict] = [
            {"jsonrpc": "2.0", "id": 0, "method": "initialize",
             "params": {"protocolVersion": version, "capabilities": {},
                        "clientInfo": {"name": "subtask-describe", "version": "0"}}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            *({"jsonrpc": "2.0", "id": n, "method": method} for n, method in enumerate(LIST_METHODS, 1)),
        ]
        replies = anyio.run(_converse, messages)
        methods = ("initialize", *LIST_METHODS)
        # A method the server does not serve answers an error: the front end leaves it to the SDK.
        results[version] = {methods[n]: reply["result"] for n, reply in sorted(replies.items()) if "result" in reply}
    return {"sdk": installed_versions(), "latest": LATEST_HANDSHAKE_VERSION, "results": results}
