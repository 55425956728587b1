"""`git subtask wait`: block until jobs (or groups, or both) end; one line each."""

from __future__ import annotations

from subtask.faces import output


def run(ids: tuple[str, ...], any_: bool, timeout: float | None, since: str | None, as_json: bool) -> None:
    from subtask import api
    from subtask.faces import replies

    repo = output.repo()
    waited = api.wait_ids(repo, list(ids), timeout=timeout, any_=any_, since=since)
    output.emit(replies.waited_any(repo, waited, timeout), as_json)
