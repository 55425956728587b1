"""`git subtask list`: one line per job, newest first."""

from __future__ import annotations

from subtask.faces import output


def run(state: str | None, include_all: bool, limit: int | None, as_json: bool) -> None:
    from subtask import api
    from subtask.faces import replies

    repo = output.repo()
    listing = api.list_jobs(repo, state=state, include_all=include_all, limit=limit)
    reply = replies.listed(repo, api.list_groups(repo, listing.jobs), listing, state=state, unfold=include_all,
                           facts=as_json)
    if as_json:  # the words print the sweep's lines as notes (stderr: stdout stays the listing)
        for line in listing.swept:
            output.echo(line, err=True)
    output.emit(reply, as_json)
