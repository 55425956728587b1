"""`git subtask show`: the record of a job (or a group)."""

from __future__ import annotations

from subtask.faces import output


def run(job_id: str, as_json: bool, show_log: bool) -> None:
    from subtask import api
    from subtask.faces import replies

    repo = output.repo()
    if job_id[:3].lower() == "sg-":
        output.emit(replies.shown_group(repo, api.get_group(repo, job_id)), as_json)
        return
    job = api.get(repo, job_id)
    output.emit(replies.shown(repo, job, api.queue_position(repo, job.id)), as_json)
    if show_log and not as_json:
        log = api.worker_log(repo, job.id)
        output.echo("\nworker log:\n" + (log if log is not None else "(none)"))
