"""`git subtask start`: start a job (or a best-of group); one line at once."""

from __future__ import annotations

import sys

from subtask.faces import output


def run(as_json: bool, **options) -> None:
    from subtask import api
    from subtask.faces import replies

    if options["task"] == "-":
        options["task"] = sys.stdin.read()
    started = api.launch(output.repo(), api.StartRequest(**options))
    output.emit(replies.started(started), as_json)
