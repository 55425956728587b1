"""`git subtask result`: a job's (or a group's) status line and summary; exit 1 unless it passed."""

from __future__ import annotations

from subtask.faces import output


def run(job_id: str, full: bool, evidence: bool) -> None:
    from subtask import api
    from subtask.faces import replies

    repo = output.repo()
    if job_id[:3].lower() == "sg-":
        output.emit(replies.group_result(repo, api.get_group(repo, job_id)), evidence)
    else:
        output.emit(replies.result(repo, api.get(repo, job_id), full=full), evidence)
