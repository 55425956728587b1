"""Best-of-N groups (issue 15): N ordinary jobs at one task, the pick verify and a rule make, and
the commands that take a group id. Real repositories, real workers, the real CLI.

Members tell themselves apart by SUBTASK_GROUP_MEMBER (1..N), so one task does different work.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import anyio
import pytest
from conftest import git, refs, running_pids, wait_until
from test_admission import check_books, ledger_rows, slot_entries, state_dir, use_paid_engine

# Member 1 breaks verify, member 2 writes 10 lines, member 3 one line.
DIFFERENT_WORK = """case "$SUBTASK_GROUP_MEMBER" in
1) echo broken > fail.txt ;;
2) seq 1 10 > big.txt ;;
3) echo small > small.txt ;;
esac"""
NOT_BROKEN = "! test -e fail.txt"


def group_json(cli, gid: str) -> dict:
    return cli.json("show", gid)


def note_of(repo: Path, job: str) -> str:
    head = git(repo, "rev-parse", f"refs/subtask/{job}/head")
    return git(repo, "notes", "--ref=subtask", "show", head)


def started_group(out: str) -> tuple[str, list[str]]:
    lines = out.splitlines()
    return lines[0].split()[0], [line.split()[0] for line in lines[1:]]


def test_a_group_picks_the_smaller_passing_member_and_merge_lands_it_keeping_the_others(cli, repo):
    gid, members = started_group(cli.ok("start", "--best-of", "3", DIFFERENT_WORK, "--verify", NOT_BROKEN))
    assert gid.startswith("sg-") and len(members) == 3
    waited = cli("wait", gid)
    assert waited.returncode == 0, waited.stderr + waited.stdout
    broken, big, small = members
    shown = group_json(cli, gid)
    assert shown["v"] == 1 and shown["state"] == "picked" and shown["pick"] == small, shown
    assert [r["member"] for r in shown["table"]] == [small, big, broken]  # passing first, fewer lines first
    assert [(r["verify"], r["lines"]) for r in shown["table"]] == [("passed", 1), ("passed", 10), ("failed", 1)]
    text = cli.ok("show", gid)
    assert all(m in text for m in members) and "rank" in text and "+10 -0" in text
    # The group record is a commit chain in git, like a job's.
    assert len(git(repo, "rev-list", f"refs/subtask/groups/{gid}/record").split()) >= 2
    # Every member's note says its rank and the pick.
    assert "rank 1 of 3 · the pick" in note_of(repo, small)
    assert f"rank 3 of 3 (verify exited with code 1) · pick {small}" in note_of(repo, broken)
    # list folds the group to one line; --all unfolds its members under it.
    listed = cli.ok("list").splitlines()
    assert len(listed) == 2 and listed[1].startswith(gid) and broken not in listed[1], listed
    unfolded = cli.ok("list", "--all")
    assert all(m in unfolded for m in members)
    compared = cli.ok("compare", gid)
    assert f"== {small} .. {big}" in compared and "big.txt" in compared
    # A commit made on a member's branch after it ended is kept: its head pin does not keep it.
    git(cli.json("show", big)["spec"]["worktree"], "commit", "-q", "--allow-empty", "-m", "by hand, later")
    # merge lands the pick through the ordinary gate and supersedes the others.
    merged = cli.ok("merge", gid)
    assert f"{small}: merged into main" in merged, merged
    assert (repo / "small.txt").exists() and not (repo / "big.txt").exists()
    assert f"refs/heads/subtask/{big}" in refs(repo) and "not kept by its head pin" in merged
    git(repo, "branch", "-D", f"subtask/{big}")
    for other in (big, broken):
        head = git(repo, "rev-parse", f"refs/subtask/{other}/head")
        assert git(repo, "cat-file", "-t", head) == "commit"  # kept by the head pin
        assert f"refs/heads/subtask/{other}" not in refs(repo)  # branch deleted: the pin keeps it
        assert not Path(cli.json("show", other)["spec"]["worktree"]).exists()
        assert "superseded" in note_of(repo, other)
    assert group_json(cli, gid)["merged"]["superseded"] == [broken, big]


def test_first_pass_stops_the_rest_and_releases_their_money(cli, repo, tmp_path):
    use_paid_engine(repo, maxRunning="2", monthlyCapUsd="10")
    never = tmp_path / "never"  # member 2 holds on it until it is stopped; member 3 waits in the queue
    try:
        gid, members = started_group(cli.ok("start", "--best-of", "3", "--first-pass", "--max-usd", "2",
                                            f"cost=0.5 hold={never} hold_member=2", "--verify", "test -s work.txt"))
        assert cli("wait", "--timeout", "40", gid, timeout=90).returncode == 0
    finally:
        never.touch()
    first, running, queued = members
    shown = group_json(cli, gid)
    assert shown["pick"] == first and shown["first_pass"], shown
    jobs = {m: cli.json("show", m)["state_detail"]["attempts"][-1] for m in members}
    assert jobs[first]["state"] == "done" and jobs[first]["cost"]["charged"] == pytest.approx(0.5)
    assert jobs[running]["state"] == jobs[queued]["state"] == "stopped"
    assert jobs[queued]["cost"]["charged"] == 0.0  # never started: its reservation released
    assert jobs[queued]["reason"].endswith("while queued"), jobs[queued]  # stopped before it was handed a slot
    spend = cli.json("spend")
    assert spend["open_usd"] == 0.0 and spend["open_reservations"] == []
    # What was spent, exactly: the winner's reported cost plus the stopped running member's whole
    # reservation (it reported no cost: it may have spent up to it); nothing for the queued one.
    assert spend["committed_usd"] == pytest.approx(0.5 + jobs[running]["cost"]["charged"])
    closes = {r["rid"]: r["usd_charged"] for r in ledger_rows(repo) if r["op"] == "close"}
    assert closes == {f"{first}.1": 0.5, f"{running}.1": jobs[running]["cost"]["charged"], f"{queued}.1": 0.0}
    check_books(cli, repo)


def test_a_judge_orders_the_passing_members_and_one_without_a_number_ranks_last(cli, repo, control_dir):
    judged = control_dir / "judged"  # the judge runs in the member's sandbox: a path it may write
    judge = (f'echo "$SUBTASK_JOB_ID" >> {judged}; case "$SUBTASK_GROUP_MEMBER" in 1) echo 5;; 2|3) echo 9;; '
             '*) echo "no score";; esac')
    gid, members = started_group(cli.ok("start", "--best-of", "4", "echo $SUBTASK_GROUP_MEMBER > m.txt",
                                        "--verify", "true", "--judge", judge))
    assert cli("wait", gid).returncode == 0
    shown = group_json(cli, gid)
    ranked = [r["member"] for r in shown["table"]]
    assert ranked == [members[1], members[2], members[0], members[3]], shown["table"]  # higher first, tie to earlier
    assert [r.get("score") for r in shown["table"]] == [9, 9, 5, None]
    assert "no number" in shown["table"][-1]["note"]
    assert sorted(judged.read_text().split()) == sorted(members)  # once per passing member, its id in the env


def test_a_judge_runs_in_the_members_sandbox(cli, repo, tmp_path):
    """The judge runs the user's command on what a member wrote (its conftest.py, its Makefile):
    confined as the member's verify was, it writes nothing outside the member's worktree."""
    from subtask.proc import isolation

    if not isolation.support().available:
        pytest.skip(f"no usable Landlock here: {isolation.support().reason}")
    outside = tmp_path / "judge-wrote"
    gid, _ = started_group(cli.ok("start", "--best-of", "2", f"echo 'touch {outside}' > judge.sh",
                                  "--verify", "true", "--judge", "sh judge.sh; echo 1"))
    cli("wait", gid)
    assert not outside.exists(), "the judge ran a member's script outside its sandbox"


def test_a_judge_is_granted_the_members_admin_folder_never_what_its_dot_git_names(cli, repo):
    """A member's verify runs after the worker's last look at its metadata, and may point the
    worktree's `.git` at the git dir: the judge's sandbox, read from that file, then let the
    member's judge.sh write the repository's git dir (its config, every ref)."""
    from subtask.proc import isolation

    if not isolation.support().available:
        pytest.skip(f"no usable Landlock here: {isolation.support().reason}")
    common = repo / ".git"
    gid, members = started_group(cli.ok("start", "--best-of", "2", f"echo 'touch {common}/judge-wrote' > judge.sh",
                                        "--verify", f"printf 'gitdir: {common}\\n' > .git",
                                        "--judge", "sh judge.sh; echo 1"))
    cli("wait", gid)
    assert [cli.json("show", m)["state_detail"]["attempts"][-1]["state"] for m in members] == ["done", "done"]
    assert not (common / "judge-wrote").exists(), "the judge's sandbox granted the folder a member's .git named"


def test_a_judge_run_from_a_threaded_process_is_confined_too(cli, repo, tmp_path):
    """Whoever settles the group judges (a worker, `wait` with its watcher threads, the MCP
    server): with other threads alive the judge is still confined (its sandbox is handed to the
    one child, never made the process's)."""
    import threading

    from subtask.git import records
    from subtask.git.gitrepo import open_repo
    from subtask.ops.plans import groups
    from subtask.proc import isolation

    if not isolation.support().available:
        pytest.skip(f"no usable Landlock here: {isolation.support().reason}")
    outside = tmp_path / "judge-wrote"
    gid, members = started_group(cli.ok("start", "--best-of", "2", "true", "--verify", "true"))
    cli("wait", gid)
    opened = open_repo(repo)
    group, _ = groups.read(opened, gid)
    hold = threading.Event()
    other = threading.Thread(target=hold.wait, daemon=True)
    other.start()
    try:
        groups.run_judge(opened, group, f"touch '{outside}'; echo 1", records.read(opened, members[0]))
    finally:
        hold.set()
    assert not outside.exists(), "the judge ran outside the member's sandbox"


def test_a_paid_group_under_a_cap_that_fits_n_minus_1_budgets_is_refused_with_nothing_left(cli, repo):
    use_paid_engine(repo, monthlyCapUsd="5")
    before = refs(repo)
    refused = cli("start", "--best-of", "3", "--max-usd", "2", "cost=1", "--verify", "true")
    assert refused.returncode == 1, refused.stderr
    assert [r for r in ledger_rows(repo) if r["op"] != "mark"] == [] and refs(repo) == before
    assert "monthly cap" in refused.stderr and "$5.00 is left" in refused.stderr and "room for 2 of 3" in refused.stderr
    bad = [
        (["--best-of", "1"], "from 2 to 8"), (["--best-of", "9"], "from 2 to 8"),
        (["--best-of", "2", "--engine", "shell,nosuch"], "unknown engine 'nosuch'"),
        (["--best-of", "2", "--pick", "cheapest", "--judge", "echo 1"], "--judge"),
        (["--pick", "smallest"], "--best-of"),
        (["--best-of", "2", "--first-pass", "--judge", "echo 1"], "--first-pass"),
    ]
    for args, words in bad:
        proc = cli("start", *args, "true", "--verify", "true")
        assert proc.returncode == 129 and words in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
    no_verify = cli("start", "--best-of", "2", "true")
    assert no_verify.returncode == 129 and "--verify" in no_verify.stderr
    assert refs(repo) == before
    assert [r for r in ledger_rows(repo) if r["op"] != "mark"] == []
    assert slot_entries(repo) == {"running": [], "queue": []}
    run = state_dir(repo) / "run"
    assert not run.exists() or list(run.iterdir()) == []
    assert not (repo / ".subtask" / "worktrees").exists() or not list((repo / ".subtask" / "worktrees").iterdir())


@pytest.mark.stress
def test_a_member_killed_mid_run_and_a_group_stopped_midway(cli, repo, tmp_path):
    gate = tmp_path / "gate"
    task = (f'if [ "$SUBTASK_GROUP_MEMBER" = 2 ]; then while [ ! -e {gate} ]; do sleep 0.02; done; fi; '
            'echo $SUBTASK_GROUP_MEMBER > m.txt')
    stop_task = f"while [ ! -e {gate} ]; do sleep 0.02; done"
    try:
        gid, members = started_group(cli.ok("start", "--best-of", "3", task, "--verify", "true"))
        victim = members[1]
        os.kill(running_pids(repo, victim)["worker"], signal.SIGKILL)
        assert cli("wait", gid, timeout=90).returncode == 0
        shown = group_json(cli, gid)
        assert shown["pick"] == members[0] and shown["table"][-1]["member"] == victim, shown["table"]
        assert shown["table"][-1]["state"] == "failed" and "worker died" in shown["table"][-1]["note"]
        stopped_gid, stopped = started_group(cli.ok("start", "--best-of", "2", stop_task, "--verify", "true"))
        cli.ok("stop", stopped_gid)
    finally:
        gate.touch()
    assert cli("wait", stopped_gid).returncode == 1
    shown = group_json(cli, stopped_gid)
    assert shown["state"] == "stopped" and shown["pick"] is None
    jobs = check_books(cli, repo)
    assert {jobs[m]["state"] for m in stopped} == {"stopped"}
    refused = cli("merge", stopped_gid)
    assert refused.returncode == 1 and "no pick" in refused.stderr


def test_mcp_starts_a_group_and_answers_its_ranking(repo, monkeypatch):
    from mcp import Client

    from subtask.faces.mcp_server import server

    monkeypatch.chdir(repo)

    async def main() -> tuple[str, str, str]:
        async with Client(server, mode="legacy") as client:
            started = await client.call_tool("start", {"task": DIFFERENT_WORK, "best_of": 3, "engine": ["shell"],
                                                       "verify": NOT_BROKEN})
            gid = started.content[0].text.split()[0]
            waited = await client.call_tool("wait", {"ids": gid, "timeout": 60})
            result = await client.call_tool("result", {"id": gid})
            return gid, waited.content[0].text, result.content[0].text

    gid, waited, result = anyio.run(main)
    assert gid.startswith("sg-")
    for text in (waited, result):
        assert text.startswith(f"{gid} picked") and "rank" in text and "pick: st-" in text, text
        assert len(text.splitlines()) <= 10


@pytest.mark.stress
def test_settles_racing_at_the_last_member_decide_once_and_judge_once(cli, repo, tmp_path, control_dir):
    """The last member's worker and three `show`s reach the decision together: one decides (the
    judge runs once per passing member), the others read its pick; one terminal commit."""
    judged = control_dir / "judged"
    gates = [tmp_path / f"gate-{n}" for n in range(4)]
    hold = lambda gate: {"SUBTASK_FAULT_HOLD": f"before_group_decide:{gate}"}  # noqa: E731
    racers = []
    try:
        gid, members = started_group(cli.ok("start", "--best-of", "2", "true", "--verify", "true", "--judge",
                                            f'echo "$SUBTASK_JOB_ID" >> {judged}; echo 1', env=hold(gates[0])))
        assert wait_until(lambda: Path(f"{gates[0]}.reached").exists(), timeout=60)
        for gate in gates[1:]:
            racers.append(subprocess.Popen(["git", "subtask", "show", gid], cwd=repo,
                                           env=dict(os.environ, **hold(gate)),
                                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        assert wait_until(lambda: all(Path(f"{g}.reached").exists() for g in gates), timeout=60)
    finally:
        for gate in gates:
            gate.touch()
    for racer in racers:
        assert racer.wait(timeout=60) == 0, racer.stderr.read()
    assert cli("wait", gid).returncode == 0
    assert sorted(judged.read_text().split()) == sorted(members)  # judged once each
    subjects = git(repo, "log", "--format=%s", f"refs/subtask/groups/{gid}/record").splitlines()
    assert sum(" picked " in s for s in subjects) == 1, subjects


def test_a_group_start_killed_after_its_records_ends_its_members_failed_and_no_pick(cli, repo):
    """Killed inside start after the records (`SUBTASK_FAULT=after_record`): the next command ends
    the members failed, charged nothing (their engines never started), and the group has no pick."""
    use_paid_engine(repo)
    crashed = cli("start", "--best-of", "3", "cost=0.1", "--verify", "true", env={"SUBTASK_FAULT": "after_record"})
    assert crashed.returncode == 99, crashed.stderr
    jobs = check_books(cli, repo)
    assert len(jobs) == 3 and {j["state"] for j in jobs.values()} == {"failed"}
    gid = refs(repo, "refs/subtask/groups/")[0].split("/")[3]
    assert cli("wait", gid).returncode == 1
    assert group_json(cli, gid)["state"] == "no_pick"
    spend = cli.json("spend")
    assert spend["committed_usd"] == 0.0 and spend["open_usd"] == 0.0


def test_a_stale_ref_lock_on_a_group_record_is_removed_and_the_group_still_settles(cli, repo, tmp_path):
    """A group's record is a commit chain like a job's, kept by the same store: the lock a writer
    killed inside its update left is removed once stale, and the group settles (not "too much
    contention", not `running` forever)."""
    git(repo, "config", "subtask.refLockStale", "1")
    go = tmp_path / "go"
    gid, members = started_group(cli.ok(
        "start", "--best-of", "2", f"while [ ! -e '{go}' ]; do sleep 0.05; done; echo $SUBTASK_GROUP_MEMBER > m.txt",
        "--verify", "true"))
    common = (repo / git(repo, "rev-parse", "--git-common-dir")).resolve()
    lock = common / "refs" / "subtask" / "groups" / gid / "record.lock"
    try:
        lock.touch()
        then = os.stat(lock).st_mtime - 3600
        os.utime(lock, (then, then))
        go.touch()
        waited = cli("wait", gid, "--timeout", "120", timeout=180)
        assert waited.returncode == 0, waited.stdout + waited.stderr
        assert group_json(cli, gid)["state"] == "picked"
        assert not lock.exists()
    finally:
        go.touch()
        lock.unlink(missing_ok=True)


def test_completing_a_group_never_waits_for_a_run_lock_this_process_holds(cli, repo, monkeypatch):
    """`merge` and `land` hold the pick's run-lock while they record the group's end: waiting for
    that lock to be released waited for ourselves (30 s per landing of a group)."""
    from subtask import api
    from subtask.ops.plans import groups
    from subtask.ops.running import lifecycle
    from subtask.state import liveness

    gid, members = started_group(cli.ok("start", "--best-of", "2", DIFFERENT_WORK, "--verify", NOT_BROKEN))
    cli("wait", gid)
    monkeypatch.chdir(repo)
    here = api.repo_at(repo)
    waited: list[str] = []
    monkeypatch.setattr(lifecycle, "wait_lock_released", lambda state_dir, job_id, timeout: waited.append(job_id))
    fd = liveness.acquire(here.state_dir, members[1])
    try:
        groups.complete(here, groups.read(here, gid)[0], wait_for_workers=True)
    finally:
        liveness.release(fd)
    assert waited == []


def test_a_judge_that_scores_no_member_still_settles_the_group_on_the_first_passing_one(cli, repo):
    gid, members = started_group(cli.ok("start", "--best-of", "2", "echo $SUBTASK_GROUP_MEMBER > m.txt",
                                        "--verify", "true", "--judge", "echo no number"))
    assert cli("wait", gid).returncode == 0
    shown = group_json(cli, gid)
    assert shown["pick"] == members[0] and "no judge score" in shown["reason"], shown
