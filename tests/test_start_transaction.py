"""One start transaction for every way a job begins (`model/transaction.py`): a failure after
any of its steps, in start, a best-of group, a map, a reply and a job that waits, undoes exactly
what was done. Afterwards the repository holds the refs it held before, no worktree, no slot,
no queue entry, and the state folder the files it held before. So does a failure where a
waiting job is moved on, and where the verify loop reserves its next attempt. The Ray
executor's hand-over, on the same transaction, is tested with the suite's cluster
(tests/test_ray.py: here, on the remote, in the ledger, and no Ray job)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import git

LAUNCH = ["start_locked", "start_admitted", "start_words_kept", "start_env_kept", "after_branch",
          "start_job_recorded", "after_record", "before_spawn"]
WAYS = {
    "start": (LAUNCH, lambda cli, repo: ["start", "echo hi > hi.txt"]),
    "best-of": ([*LAUNCH, "start_group_recorded"],
                lambda cli, repo: ["start", "--best-of", "2", "--verify", "true", "echo hi > hi.txt"]),
    "map": ([*LAUNCH, "start_group_recorded"], lambda cli, repo: ["map", "*.md", "echo {files} > out.txt"]),
    "after": (["start_locked", "start_words_kept", "start_env_kept", "start_waiting_entry", "after_record"],
              lambda cli, repo: ["start", "--after", cli.start("true"), "echo hi > hi.txt"]),
    "reply": ([s for s in LAUNCH if s not in ("start_locked", "after_branch")],
              lambda cli, repo: ["reply", cli.start("echo one > one.txt"), "and one more"]),
}
CASES = [(way, step) for way, (steps, _) in WAYS.items() for step in steps]


def what_is_there(repo: Path) -> dict:
    """What a start leaves behind: refs, worktrees, slots, the state folder's files (not its
    caches of what no job changes: the listing's, this boot's Landlock, `landlock.json`, and the
    copy of the user's index its look at the checkout refreshes, `main-index/`)."""
    state = repo / ".git" / "subtask"
    slots = json.loads((state / "slots.json").read_text()) if (state / "slots.json").exists() else {}
    files = sorted(str(p.relative_to(state)) for p in state.rglob("*") if p.is_file()
                   and p.suffix != ".log" and p.name not in ("list-cache.json", "slots.json", "landlock.json")
                   and not p.name.endswith(".lock") and p.parent.name != "main-index")
    return {"refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/subtask", "refs/heads",
                        "refs/notes"),
            "worktrees": git(repo, "worktree", "list", "--porcelain").count("worktree "),
            "running": slots.get("running", []), "queue": slots.get("queue", []), "files": files}


@pytest.mark.parametrize(("way", "step"), CASES, ids=[f"{w}-{s}" for w, s in CASES])
def test_a_failure_after_any_step_undoes_exactly_what_was_done(cli, repo, way, step):
    steps, command = WAYS[way]
    args = command(cli, repo)
    for job in [a for a in args if a.startswith("st-")]:
        cli.ok("wait", job)  # what it waits for, or what it replies to, has ended
    before = what_is_there(repo)
    failed = cli(*args, env={"SUBTASK_FAULT_RAISE": step})
    assert failed.returncode == 128, failed
    assert f"injected fault at {step}" in failed.stderr and "Traceback" not in failed.stderr
    assert what_is_there(repo) == before


def test_a_failure_moving_a_waiting_job_on_undoes_its_branch_and_ends_it_failed(cli, repo, control_dir):
    """The worker of the job it waited for moves it on (`plans/waiting._start`): a failure there
    leaves no branch, pin, worktree, slot or waiting entry of it, and its record says why."""
    gate = control_dir / "gate"
    first = cli.start(f"while [ ! -e '{gate}' ]; do sleep 0.02; done",
                      env={"SUBTASK_FAULT_RAISE": "before_leaving_waiting"})  # its worker moves the next on
    waiting = cli.start("echo hi > hi.txt", "--after", first)
    gate.touch()
    cli.ok("wait", first)
    ended = cli("wait", waiting, "--timeout", "60", "--json")
    assert ended.returncode == 1, ended.stderr
    attempt = json.loads(ended.stdout)["jobs"][0]["state_detail"]["attempts"][-1]
    assert attempt["state"] == "failed" and "injected fault at before_leaving_waiting" in attempt["reason"], attempt
    refs = git(repo, "for-each-ref", "--format=%(refname)")
    assert f"refs/heads/subtask/{waiting}" not in refs and f"refs/subtask/{waiting}/base" not in refs, refs
    there = what_is_there(repo)
    assert there["worktrees"] == 2 and there["running"] == [] and there["queue"] == []  # main and the first's
    slots = json.loads((repo / ".git" / "subtask" / "slots.json").read_text())
    assert slots.get("waiting", []) == []


def test_a_failure_after_a_retry_is_reserved_gives_its_slot_back_and_ends_the_job(cli, repo):
    """The verify loop reserves the next attempt (`worker/retries`): a failure before its record
    is written gives the slot entry back, keeps no words of the attempt that never ran, and the
    job ends with its first attempt's verdict."""
    job = cli.start("echo hi > hi.txt", "--verify", "false", "--retries", "1",
                    env={"SUBTASK_FAULT_RAISE": "after_retry_reserved"})
    assert cli("wait", job).returncode == 1
    attempts = cli.json("show", job)["state_detail"]["attempts"]
    assert [(a["n"], a["state"], (a["verify"] or {}).get("passed")) for a in attempts] == [(1, "done", False)], attempts
    assert "could not reserve the next attempt: injected fault at after_retry_reserved" in attempts[0]["not_retried"]
    there = what_is_there(repo)
    assert there["running"] == [] and there["queue"] == []
    assert not [f for f in there["files"] if f.startswith(f"run/{job}.2.")], there["files"]  # its words, its verify
