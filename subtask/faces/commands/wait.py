"""`git subtask wait`: block until jobs (or groups) end; one line each."""

from __future__ import annotations

from subtask.faces import output
from subtask.model.errors import SubtaskError


def run(ids: tuple[str, ...], any_: bool, timeout: float | None, as_json: bool) -> None:
    from subtask import api
    from subtask.faces import replies

    repo = output.repo()
    groups = [i[:3].lower() == "sg-" for i in ids]
    if any(groups):
        if not all(groups):
            raise SubtaskError("usage", "wait takes job ids or group ids, not both")
        output.emit(replies.waited_groups(repo, api.wait_groups(repo, list(ids), timeout=timeout), timeout), as_json)
    else:
        output.emit(replies.waited(repo, api.wait(repo, list(ids), timeout=timeout, any_=any_), timeout), as_json)
