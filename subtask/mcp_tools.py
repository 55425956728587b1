"""The MCP face: the same jobs as `git subtask`, as tools for agents, on the mcp SDK's MCPServer.

Owns only the protocol: each tool parses its arguments, calls `subtask.api` in a worker thread
and renders compact text with `subtask.render`. No job logic lives here. The process entry point
(and its fast start) is `subtask.mcp_server`; `serve` runs this server over the line streams it
hands over, and `describe` produces the cached replies it answers with before the SDK is loaded.

Invariants:
- Nothing but protocol on stdout. Nothing here prints; workers log to files (lifecycle.spawn_worker),
  and the SDK logs to stderr.
- Every text a tool returns, errors included, passes `render.safe` (in `tool`): an agent's user
  reads it too, and a job's text may come from a model or a teammate. JSON text is
  `render.json_text`: exact values, escaped.
- A `SubtaskError` becomes a tool error (isError) with the CLI's words: `error: ...` and `hint: ...`.
- The tools an agent reads (start, start_many, wait, status, result, list, ...) return text only:
  Claude Code shows a model the structured part instead of the text when both are present, so
  every tool is registered with `structured_output=False`.
- Blocking calls (git, flocks, `api.wait`) run in worker threads, so one long `wait` never stalls
  other requests; `wait` sends progress from the event loop about once a second.
- Jobs outlive the server: workers are detached (own session), so a server that dies leaves them
  running, and any later server or the CLI reads their records.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from subtask import __version__, api, groups, render
from subtask.errors import SubtaskError, from_os_error
from subtask.model import is_group_ref

INSTRUCTIONS = """\
git-subtask hands coding work to background workers. Each job gets its own git worktree and branch
(subtask/<id>) and runs while you do other things; its record and review note live in git.

The pattern:
1. start_many with every independent task at once (or start for one). Each returns its job id at
   once; jobs beyond subtask.maxRunning wait in a queue.
2. One wait with all the ids. It blocks until they end and reports progress meanwhile. Never poll
   status in a loop: wait is cheaper and returns the moment a job ends.
3. result <id> for a job's summary (evidence=true for the JSON evidence: commits, files, verify).
4. Review the work with plain git: git log --notes=subtask, git diff <base>...subtask/<id>.
   Merge what you keep; cleanup <id> removes a finished job's worktree.

For the shell engine the task is a bash script. `verify` is a command run with `sh -c` (POSIX sh,
not bash) on the job's final commit; exit 0 means verified. `repo` is an absolute path to a git work tree (default: the server's
working directory)."""

PROGRESS_TICK = 1.0  # seconds between progress notifications during wait (at most 1/s, at least 1/10 s)
ACTIVITY_WIDTH = 60

server = MCPServer("subtask", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING")


# ---------------------------------------------------------------- plumbing

def _error_text(exc: SubtaskError) -> str:
    return f"error: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else "")


def _tool_error(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=render.safe(text))], is_error=True)


def tool(name: str, *, read_only: bool = False, destructive: bool = False, title: str | None = None):
    """Register `fn` as a text-only tool whose SubtaskErrors become tool errors with the CLI's words."""

    def decorate(fn: Callable[..., Awaitable[str]]) -> Callable[..., Awaitable[str]]:
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> str | CallToolResult:
            try:
                return render.safe(await fn(*args, **kwargs))
            except SubtaskError as exc:
                return _tool_error(_error_text(exc))
            except Exception as exc:  # same one-line report as the CLI; the traceback goes to stderr
                said = from_os_error(exc) if isinstance(exc, OSError) else None
                if said is not None:
                    return _tool_error(_error_text(said))
                if os.environ.get("SUBTASK_DEBUG"):
                    import traceback

                    traceback.print_exc(file=sys.stderr)
                return _tool_error(f"error: unexpected {type(exc).__name__}: {exc}")

        annotations = ToolAnnotations(title=title, readOnlyHint=read_only, destructiveHint=destructive,
                                      idempotentHint=read_only or None, openWorldHint=False)
        server.add_tool(wrapper, name=name, annotations=annotations, structured_output=False)
        return fn

    return decorate


def open_repo(path: str | None) -> api.Repo:
    """The repository a tool works on: an absolute path to a work tree, or the server's directory."""
    if path is None or path == "":
        return api.repo_at(os.environ.get("SUBTASK_REPO") or os.getcwd())
    if not os.path.isabs(path):
        raise SubtaskError("usage", f"repo must be an absolute path to a git work tree, not {path!r}",
                           hint="give the full path, e.g. /home/me/project, or leave repo out for "
                                f"the server's directory ({os.getcwd()})")
    return api.repo_at(path)


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking api call in a worker thread, so the event loop keeps serving other requests."""
    return await anyio.to_thread.run_sync(fn, *args)


def _id_list(ids: list[str] | str) -> list[str]:
    return [ids] if isinstance(ids, str) else list(ids)


# ---------------------------------------------------------------- starting

@tool("start", title="Start a job")
async def start(task: str, repo: str | None = None, base: str = "HEAD", engine: str | None = None,
                verify: str | None = None, max_usd: float | None = None, max_turns: int | None = None,
                model: str | None = None, readonly: bool = False, timeout: float | None = None,
                isolation: str | None = None, best_of: int | None = None, engines: list[str] | str | None = None,
                pick: str | None = None, judge: str | None = None, first_pass: bool = False,
                after: list[str] | str | None = None, on_fail: str | None = None) -> str:
    """Start one background job in its own worktree and branch; returns its id at once.

    task: what the engine should do (for engine "shell": a bash script). engine: shell, claude,
    codex or a configured command engine (default: git config subtask.engine, else claude).
    verify: command run with sh -c (POSIX sh) on the job's final commit, exit 0 = verified.
    timeout: seconds the engine may run. readonly: no branch; the engine only reads. isolation:
    none, worktree or readonly (what the engine may write; default: the engine's). Then call wait
    with the id.
    best_of: N (2-8) attempts at the task as a group (needs verify); engines: a list cycled over
    them; pick: smallest (default), cheapest or fastest; judge: a command whose last line scores
    each passing attempt (higher wins); first_pass: the first to pass wins. Returns the group id
    (sg-...): wait and result take it and answer the ranking and the pick.
    after: job or group ids to wait for: the job is recorded "waiting" and starts from their
    head(s) once they end done with verify passed; else it ends "skipped" (on_fail: "run" starts
    it anyway).
    """
    request = api.StartRequest(task=task, engine=engine, base=base, verify=verify, timeout=timeout,
                               max_usd=max_usd, max_turns=max_turns, model=model, readonly=readonly,
                               isolation=isolation, after=[after] if isinstance(after, str) else after,
                               on_fail=on_fail)

    def run() -> str:
        if best_of is not None:
            how = api.GroupRequest(best_of=best_of, engines=engines or engine, models=model, pick=pick,
                                   judge=judge, first_pass=first_pass)
            request.engine = request.model = None
            started = api.start_group(open_repo(repo), request, how)
            return "\n".join([f"{started.group.id} started: {len(started.members)} attempts · rule "
                              f"{started.group.rule_text} (wait {started.group.id} for the pick)",
                              *(render.started_line(r.job, r.position) for r in started.members)])
        if engines is not None or pick is not None or judge is not None or first_pass:
            raise SubtaskError("usage", "engines, pick, judge and first_pass go with best_of")
        result = api.start(open_repo(repo), request)
        return render.started_line(result.job, result.position)

    return await _call(run)


@tool("start_many", title="Start several jobs")
async def start_many(tasks: list[dict[str, Any]]) -> str:
    """Start several jobs in one call; one line per item, in order: its id and state, or its error.

    Each item has the fields of start: {"task": ..., "engine": ..., "verify": ..., "repo": ..., ...}.
    An item that fails does not stop the others. Then call wait once with all the ids.
    Chains: an item may carry "id" (a name of your choice) and "after" (a name or a list: ids of
    items of this call, or job/group ids); it then starts once those ended, from their heads, e.g.
    [{"id": "api", "task": ...}, {"id": "client", "after": "api", "task": ...}].
    """

    def run() -> str:
        lines = []
        for n, result in enumerate(api.start_many(tasks, repo_for=open_repo), 1):
            if isinstance(result, SubtaskError):
                lines.append(f"{n}. error: {result.message}" + (f" (hint: {result.hint})" if result.hint else ""))
            else:
                lines.append(f"{n}. {render.started_line(result.job, result.position)}")
        return "\n".join(lines)

    return await _call(run)


@tool("map", title="Fan a task out over files")
async def map_files(pattern: str, task: str, batch: int = 1, concurrency: int | None = None, repo: str | None = None,
              base: str = "HEAD", engine: str | None = None, verify: str | None = None, max_usd: float | None = None,
              model: str | None = None, timeout: float | None = None) -> str:
    """One job per batch of tracked files matching pattern (git's glob: * within a folder, ** across),
    as one group (sg-...). task is a template: {files} becomes the batch's paths, shell-quoted.
    concurrency: at most this many of its jobs run at once. wait, list, result and stop take the
    group id; start with after=[the group id] starts a job from all their heads merged.
    """
    request = api.StartRequest(task=task, engine=engine, base=base, verify=verify, timeout=timeout,
                               max_usd=max_usd, model=model)

    def run() -> str:
        started = api.start_map(open_repo(repo), pattern, request, batch=batch, concurrency=concurrency)
        group = started.group
        return "\n".join([f"{group.id} started: {len(started.members)} jobs · {group.concurrency or 'any'} at once "
                          f"(wait {group.id} for them all)", *(render.started_line(r.job, r.position)
                                                               for r in started.members)])

    return await _call(run)


# ---------------------------------------------------------------- waiting

def _progress_message(elapsed: float, ended: int, total: int, activities: dict[str, str | None]) -> str:
    parts = [f"{render.duration(elapsed)}: {ended} of {total} ended"]
    for job_id, activity in activities.items():
        text = (activity or "waiting").replace("\n", " ")
        if len(text) > ACTIVITY_WIDTH:
            text = text[: ACTIVITY_WIDTH - 1] + "…"
        parts.append(f"{job_id} {text}")
    return render.safe_line(" · ".join(parts))


class _Abandoned(Exception):
    """Raised from the tick callback when the caller has gone: ends `api.wait` early."""


@tool("wait", read_only=True, title="Wait for jobs")
async def wait(ids: list[str] | str, ctx: Context, timeout: float = 300, any: bool = False,
               repo: str | None = None) -> str:
    """Block until the jobs end (any=true: until the first one ends), or one stalls; one line per job.

    Sends a progress notification about once a second (elapsed, n of total ended, each job's latest
    activity). On timeout the jobs keep running: call wait again. Prefer one wait over polling status.
    A best-of group id (sg-...) waits for every attempt, then answers the ranking and the pick.
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

    def run() -> str:
        where = open_repo(repo)
        if [i for i in job_ids if is_group_ref(i)]:  # (`any` is the parameter here)
            waited = api.wait_groups(where, job_ids, timeout=timeout, on_tick=on_tick, tick=PROGRESS_TICK)
            lines = [groups.result_text(where, group) for group in waited.groups]
            if waited.timed_out:
                lines.append(f"timed out after {timeout:g}s; the attempts continue: call wait again")
            return "\n\n".join(lines)
        result = api.wait(where, job_ids, timeout=timeout, any_=first_only, on_tick=on_tick, tick=PROGRESS_TICK)
        lines = [render.ended_lines(job, api.queue_position(where, job.id)) for job in result.jobs]
        lines += [render.stalled_hint(job) for job in result.jobs if job.id in result.stalled]
        if result.timed_out:
            still = sum(1 for job in result.jobs if not job.state.current.terminal)
            lines.append(f"timed out after {timeout:g}s; {still} still running (they continue): call wait again")
        return "\n".join(lines)

    try:
        return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        gone.set()  # the thread ends at its next tick instead of waiting out the timeout
        raise


# ---------------------------------------------------------------- reading

@tool("status", read_only=True, title="Job status")
async def status(id: str | None = None, repo: str | None = None) -> str:
    """One job's status in one line (queue position, latest activity); without id: every active job.

    Do not poll this to wait for jobs: call wait, which returns the moment they end.
    """

    def run() -> str:
        rows = api.status(open_repo(repo), id)
        return "\n".join(render.status_line(*row) for row in rows) if rows else "no active jobs"

    return await _call(run)


@tool("result", read_only=True, title="Job result")
async def result(id: str, full: bool = False, evidence: bool = False, repo: str | None = None) -> str:
    """A job's one-line status and summary (at most 10 lines; full=true for all of it).

    evidence=true returns the evidence envelope as JSON instead: what the runner observed (git base,
    head, commits, changed files, verification, commands, cost), apart from what the engine claimed.
    A best-of group id (sg-...): the ranking table and the pick's summary.
    """

    def run() -> str:
        if is_group_ref(id):
            where = open_repo(repo)
            group = api.get_group(where, id)
            return render.json_text(group.to_dict(), default=str) if evidence else groups.result_text(where, group)
        job = api.get(open_repo(repo), id)
        if evidence:
            return render.json_text(api.evidence_envelope(job), default=str)
        return render.result_text(job, full=full)

    return await _call(run)


@tool("list", read_only=True, title="List jobs")
async def list_jobs(state: str | None = None, limit: int = 20, repo: str | None = None) -> str:
    """One line per job, newest first: id, state, verify, age, cost, engine, task.

    state: queued, running, done, failed, stopped, active or ended. Landed jobs are hidden.
    """

    def run() -> str:
        listing = api.list_jobs(open_repo(repo), state=state, limit=limit)
        if not listing.jobs:
            return "no jobs" + (f" in state {state}" if state else "")
        more = [f"({listing.more} older jobs not shown: list with a larger limit)"] if listing.more else []
        return "\n".join([render.LIST_HEADER, *(render.list_line(e, e.get("position")) for e in listing.jobs), *more])

    return await _call(run)


@tool("verify", read_only=True, title="Check a job's record against git")
async def verify(id: str, repo: str | None = None) -> str:
    """Check a finished job's record against git: its signature (whose, and whether an allowed
    signer made it), its pins, its evidence computed again from git, its verify result against
    the commit it names. Says what matches and what does not (MISMATCH lines). Runs nothing:
    `git subtask verify ID --run` runs the job's verify command too.
    """
    return await _call(lambda: "\n".join(api.verify(open_repo(repo), id).lines()))


@tool("engines", read_only=True, title="Engines")
async def engines(repo: str | None = None) -> str:
    """The engines a job can use: installed, authenticated, paid or free, version, isolation."""

    def run() -> str:
        lines = []
        for p in api.engines(open_repo(repo)):
            auth = {True: "yes", False: "no", None: "unknown"}[p.authenticated]
            lines.append(f"{p.name}: installed={'yes' if p.installed else 'no'} auth={auth} "
                         f"{'paid' if p.paid else 'free'} {p.version or '-'} · isolation: {p.isolation}")
        return "\n".join(lines)

    return await _call(run)


# ---------------------------------------------------------------- changing

@tool("reply", title="Reply to a job")
async def reply(id: str, message: str, repo: str | None = None) -> str:
    """Continue a finished job with a follow-up message (a new attempt on the same branch and session).

    Returns at once, like start; then call wait with the id.
    """

    def run() -> str:
        answer = api.reply(open_repo(repo), id, message)
        return render.started_line(answer.job, answer.position)

    return await _call(run)


@tool("stop", destructive=True, title="Stop a job")
async def stop(id: str, repo: str | None = None) -> str:
    """Stop a job: drop it from the queue, or end its worker (SIGTERM, then SIGKILL). Work committed so far stays."""
    return await _call(lambda: render.one_line(api.stop(open_repo(repo), id)))


@tool("cleanup", destructive=True, title="Remove a job's worktree")
async def cleanup(id: str, repo: str | None = None) -> str:
    """Remove a finished job's worktree when it is clean, and its branch when it has no commits beyond its base; a branch with commits, the record and the note are kept."""
    return await _call(lambda: api.cleanup(open_repo(repo), id))


# ---------------------------------------------------------------- serving and describing

async def serve(stdin: Any, stdout: Any) -> None:
    """`MCPServer.run_stdio_async` over the given line streams instead of fd 0 and 1.

    stdin: async-iterable of JSON-RPC lines; stdout: has async `write(str)` and `flush()`. The
    front end (subtask.mcp_server) owns the real pipes, so it hands the SDK's stdio transport
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
    """What subtask/mcp_cache.json holds: the SDK's own replies to `initialize` and to each list
    request it serves (no cursor), for every protocol version it negotiates through `initialize`."""
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION

    from subtask.mcp_versions import installed_versions

    results: dict[str, dict[str, Any]] = {}
    for version in HANDSHAKE_PROTOCOL_VERSIONS:
        replies = anyio.run(_converse, [
            {"jsonrpc": "2.0", "id": 0, "method": "initialize",
             "params": {"protocolVersion": version, "capabilities": {},
                        "clientInfo": {"name": "subtask-describe", "version": "0"}}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            *({"jsonrpc": "2.0", "id": n, "method": method} for n, method in enumerate(LIST_METHODS, 1)),
        ])
        methods = ("initialize", *LIST_METHODS)
        # A method the server does not serve answers an error: the front end leaves it to the SDK.
        results[version] = {methods[n]: reply["result"] for n, reply in sorted(replies.items()) if "result" in reply}
    return {"sdk": installed_versions(), "latest": LATEST_HANDSHAKE_VERSION, "results": results}
