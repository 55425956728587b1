"""`git subtask status`: what a job (or every active job) is doing now."""

from __future__ import annotations

from subtask.faces import output


def run(job_id: str | None, as_json: bool) -> None:
    from subtask import api
    from subtask.faces import replies

    output.emit(replies.status(api.status(output.repo(), job_id)), as_json)
