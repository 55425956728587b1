"""What every face calls to start: one job or a best-of group (`launch`), and many at once
(`start_many`), each item's fields checked as `model/start_options` declares them.

Invariants:
- An item of `start_many` that fails is reported in its place and the rest still start; an item
  after one that could not start is not started, and items that wait for each other in a circle
  are refused.
"""

from __future__ import annotations

from subtask.api.read import repo_at
from subtask.api.starting import StartResult, _list, left_out, look_at_checkout, start
from subtask.git.gitrepo import Repo
from subtask.model.errors import SubtaskError
from subtask.model.start_options import BY_NAME as START_OPTIONS
from subtask.model.start_options import GROUP_ONLY, StartRequest

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from subtask.api.groups import GroupStart


def launch(repo: Repo, request: StartRequest, said: dict | None = None) -> StartResult | GroupStart:
    """What every face calls: a job (`start`), or with `best_of` a group of them (`start_group`);
    with what it leaves out of the caller's checkout (`said`: those already found, by base, so a
    call that starts many looks once)."""
    given = [name for name in GROUP_ONLY if getattr(request, name)]
    if given and request.best_of is None:
        raise SubtaskError("usage", f"{' and '.join(START_OPTIONS[n].flag for n in given)} "
                           f"{'goes' if len(given) == 1 else 'go'} with --best-of N",
                           hint="git subtask start --best-of 3 --verify 'pytest -q' ...")
    look = None if said else look_at_checkout(repo, request)  # many starts: the first one looks
    try:
        result: StartResult | GroupStart
        if request.best_of is not None:
            from subtask.api.groups import start_group

            result = start_group(repo, request)
        else:
            result = start(repo, request)
        base = result.job.spec.base if isinstance(result, StartResult) else result.group.base
        result.left_out = left_out(repo, request, None if request.after else base, said, look)
    finally:
        if look is not None:
            look.end()
    return result


def request_from_dict(item) -> tuple[str | None, StartRequest]:
    """(repo, request) from one start_many item: the fields of `start` (`StartRequest`), plus an
    optional `repo`; each checked for its kind as declared there."""
    if not isinstance(item, dict):
        raise SubtaskError("usage", f"each item must be an object with a task, not {type(item).__name__}")
    unknown = sorted(set(item) - set(START_OPTIONS) - {"repo", "id"})
    if unknown:
        raise SubtaskError("usage", f"unknown field {', '.join(map(repr, unknown))} "
                           f"(known: repo, id, {', '.join(START_OPTIONS)})")
    for key in ("repo", "id"):
        if item.get(key) is not None and not isinstance(item[key], str):
            raise SubtaskError("usage", f"{key} must be a string, not {item[key]!r}")
    for name, option in START_OPTIONS.items():
        value = item.get(name)
        if value is not None:
            check_option(option, value)
    fields = {k: item[k] for k in START_OPTIONS if item.get(k) is not None}
    return item.get("repo"), StartRequest(**{"task": ""} | fields)


def check_option(option, value) -> None:
    """`value` is of the kind `option` declares (numbers' ranges are checked where they are used)."""
    kind = option.kind
    if (option.names or option.multiple) and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return
    if kind is bool:
        ok, words = isinstance(value, bool), "true or false"
    elif kind is str:
        ok, words = isinstance(value, str), "a string" + (" or a list of strings" if option.names else "")
    elif kind is int:
        ok, words = isinstance(value, int) and not isinstance(value, bool), "a whole number"
    else:
        ok, words = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    if not ok:
        raise SubtaskError("usage", f"{option.name} must be {words}, not {value!r}")
    if option.choices and value not in option.choices:
        raise SubtaskError("usage", f"unknown {option.name} {value!r} ({', '.join(option.choices)})")


def start_many(items: list, repo_for=repo_at) -> list[StartResult | GroupStart | SubtaskError]:
    """Start each item; an item that fails is reported in its place and the rest still start.

    Each item is a dict with the fields of `start` and an optional `repo` (a path `repo_for` opens;
    None = its default), so one call can fan out over several repositories. Each repository is
    opened once per call (finding it and reading its settings are two git processes).

    An item may name itself (`id`) and wait for others (`after`: ids of items of this call, or
    job and group ids): items start in an order where each comes after those it names, which it
    then waits for (`start --after`). An item after one that could not start is not started;
    items that wait for each other in a circle are refused.
    """
    if not isinstance(items, list) or not items:
        raise SubtaskError("usage", "start_many needs at least one task")
    opened: dict[str | None, Repo] = {}
    said: dict = {}  # what the jobs leave out of each checkout, looked at once per base

    def repo_of(path: str | None) -> Repo:
        if path not in opened:
            opened[path] = repo_for(path)
        return opened[path]

    results: list[StartResult | GroupStart | SubtaskError | None] = [None] * len(items)
    local: dict[str, int] = {}
    started: dict[int, str] = {}  # item -> the id of the job (or group) it started
    for n, item in enumerate(items):
        name = item.get("id") if isinstance(item, dict) else None
        if isinstance(name, str) and name.strip():
            if name.strip() in local:
                results[n] = SubtaskError("usage", f"two items have the id {name!r}: ids must be unique in a call")
            local.setdefault(name.strip(), n)

    def local_after(item) -> list[int]:
        names = item.get("after") if isinstance(item, dict) else None
        names = [names] if isinstance(names, str) else names if isinstance(names, list) else []
        return [local[a.strip()] for a in names if isinstance(a, str) and a.strip() in local]

    waits = {n: local_after(item) for n, item in enumerate(items)}
    for n in _dependency_order(waits):
        if results[n] is not None:
            continue
        item = items[n]
        if n not in waits:  # in a circle
            results[n] = SubtaskError("usage", f"item {n + 1} waits for itself through others: `after` makes a circle")
            continue
        failed = [m for m in waits[n] if isinstance(results[m], SubtaskError)]
        if failed:
            results[n] = SubtaskError("usage", f"item {n + 1} waits for item {failed[0] + 1}, which did not start")
            continue
        try:
            path, request = request_from_dict(item)
            if request.after:  # this call's ids become the jobs (or groups) they started
                request.after = [started[local[a]] if a in local else a for a in _list(request.after)]
            result = launch(repo_of(path), request, said)
            results[n], started[n] = result, _started_id(result)
        except SubtaskError as exc:
            results[n] = exc
    return [r if r is not None else SubtaskError("usage", "`after` makes a circle") for r in results]


def _started_id(result: StartResult | GroupStart) -> str:
    return result.job.id if isinstance(result, StartResult) else result.group.id


def _dependency_order(waits: dict[int, list[int]]) -> list[int]:
    """Every item after those it waits for (stable: in the call's order where free); the items of
    a circle come last, removed from `waits` so the caller refuses them."""
    order: list[int] = []
    done: set[int] = set()
    left = sorted(waits)
    while left:
        ready = [n for n in left if all(m in done for m in waits[n])]
        if not ready:
            for n in left:
                waits.pop(n)
            return order + left
        order.append(ready[0])
        done.add(ready[0])
        left.remove(ready[0])
    return order


def run_remote(job_id: str, url: str, attempt: int) -> int:
    """On a cluster node: fetch the job from `url`, run its worker, push its results; the exit
    code (the Ray job's entrypoint, `executors/ray`)."""
    from subtask.worker import remote

    return remote.run(job_id, url, attempt)
