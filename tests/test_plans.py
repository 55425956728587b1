"""Jobs that wait for jobs (`start --after`) and maps over files (`git subtask map`), issue 34.

Real repositories, real workers, the real CLI. Jobs are held with gate files (never sleeps): a
shell job loops until its gate exists, so a test decides when it ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import git, make_team, refs, wait_until
from test_admission import check_books, ledger_rows, slot_entries, state_dir, use_paid_engine


def hold(gate: Path) -> str:
    return f"while [ ! -e '{gate}' ]; do sleep 0.02; done"


def shown(cli, job: str) -> dict:
    return cli.json("show", job)


def attempt_of(cli, job: str) -> dict:
    return shown(cli, job)["state_detail"]["attempts"][-1]


def waiting_entries(repo: Path) -> list[str]:
    path = state_dir(repo) / "slots.json"
    return [e["job"] for e in json.loads(path.read_text()).get("waiting", [])] if path.exists() else []


def head_of(repo: Path, job: str) -> str:
    return git(repo, "rev-parse", f"refs/subtask/{job}/head")


# ---------------------------------------------------------------- chains

def test_a_chain_runs_in_order_each_from_the_one_before_and_the_last_holds_all_three(cli, repo, tmp_path):
    gate = tmp_path / "gate"
    a = cli.start(f"{hold(gate)}; echo a > a.txt")
    b_line = cli.ok("start", "--after", a, "test -f a.txt && echo b > b.txt")
    b = b_line.split()[0]
    assert b_line.split()[1] == "waiting" and f"after {a}" in b_line, b_line
    c = cli.start("test -f b.txt && echo c > c.txt", "--after", b)
    # Waiting holds nothing: no slot, no branch, no worktree; they list as waiting.
    listed = {j["id"]: j["state"] for j in cli.json("list")["jobs"]}
    assert listed == {a: "running", b: "waiting", c: "waiting"}, listed
    assert slot_entries(repo)["running"] == [a] and sorted(waiting_entries(repo)) == sorted([b, c])
    assert f"refs/heads/subtask/{b}" not in refs(repo) and not Path(shown(cli, b)["spec"]["worktree"]).exists()
    waiter = subprocess.Popen(["git", "subtask", "wait", c], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        gate.touch()
        out, err = waiter.communicate(timeout=120)
    finally:
        waiter.kill()
    assert waiter.returncode == 0, out + err  # `wait` on a waiting job waits through its start to its end
    jobs = {j: attempt_of(cli, j) for j in (a, b, c)}
    assert all(x["state"] == "done" for x in jobs.values()), jobs
    assert jobs[a]["ended_at"] <= jobs[b]["started_at"] and jobs[b]["ended_at"] <= jobs[c]["started_at"], jobs
    # Each starts from the head of the one before; C's branch holds all three changes.
    assert shown(cli, b)["spec"]["base"] == head_of(repo, a)
    assert shown(cli, c)["spec"]["base"] == head_of(repo, b)
    assert shown(cli, c)["spec"]["base_ref"] == f"head of {b}"
    tree = git(repo, "ls-tree", "--name-only", f"subtask/{c}").split()
    assert {"a.txt", "b.txt", "c.txt"} <= set(tree), tree
    assert waiting_entries(repo) == []
    check_books(cli, repo)


def test_a_failed_job_skips_its_chain_naming_the_reason_and_holds_nothing(cli, repo, tmp_path):
    use_paid_engine(repo, monthlyCapUsd="10")
    gate = tmp_path / "gate"
    git(repo, "config", "subtask.engine", "shell")
    a = cli.start(f"{hold(gate)}; exit 3")
    b = cli.start("cost=0.5", "--after", a, "--engine", "fakepaid")
    c = cli.start("echo c > c.txt", "--after", b)
    assert cli.json("spend")["open_reservations"] == []  # waiting costs no money
    gate.touch()
    waited = cli("wait", c)
    assert waited.returncode == 1, waited.stdout + waited.stderr
    b_attempt, c_attempt = attempt_of(cli, b), attempt_of(cli, c)
    assert b_attempt["state"] == "skipped" and c_attempt["state"] == "skipped"
    assert (b_attempt["reason"].startswith(f"{a} ended failed")
            and "exited with code 3" in b_attempt["reason"]), b_attempt
    assert c_attempt["reason"].startswith(f"{b} ended skipped ({a} ended failed"), c_attempt
    assert f"skipped · {a} ended failed" in waited.stdout or "skipped" in waited.stdout, waited.stdout
    for job in (b, c):
        assert f"refs/heads/subtask/{job}" not in refs(repo)
        assert not Path(shown(cli, job)["spec"]["worktree"]).exists()
    assert not any(r.get("job") == b for r in ledger_rows(repo))  # never reserved, never charged
    assert slot_entries(repo) == {"running": [], "queue": []} and waiting_entries(repo) == []
    assert "skipped" in cli.ok("show", c) and f"{b} ended skipped" in cli.ok("show", c)
    note = git(repo, "notes", "--ref=subtask", "show", shown(cli, c)["spec"]["base"])
    assert f"subtask {c} · skipped" in note and f"skipped: {b} ended skipped" in note and f"after:   {b}" in note
    replied = cli("reply", c, "echo again")
    assert replied.returncode == 1 and "never started" in replied.stderr, replied.stderr
    check_books(cli, repo)


def test_on_fail_run_starts_the_waiter_from_the_failed_head(cli, repo):
    a = cli.start("echo a > a.txt; git add a.txt; git commit -qm a; exit 3")
    b = cli.start("test -f a.txt", "--after", a, "--on-fail", "run")
    assert cli("wait", b).returncode == 0
    assert attempt_of(cli, a)["state"] == "failed" and attempt_of(cli, b)["state"] == "done"
    assert shown(cli, b)["spec"]["base"] == head_of(repo, a)


def test_a_job_after_two_starts_from_their_integration_and_a_conflict_fails_it_naming_the_files(cli, repo):
    x = cli.start("echo x > x.txt")
    y = cli.start("echo y > y.txt")
    both = cli.start("test -f x.txt && test -f y.txt", "--after", x, "--after", y)
    assert cli("wait", both).returncode == 0, cli.ok("show", both)
    base = shown(cli, both)["spec"]["base"]
    parents = git(repo, "rev-list", "--parents", "-n", "1", base).split()[1:]
    assert sorted(parents) == sorted([head_of(repo, x), head_of(repo, y)])
    # Both write one file differently: their heads cannot be integrated.
    p = cli.start("echo one > same.txt")
    q = cli.start("echo two > same.txt")
    clash = cli.start("true", "--after", f"{p},{q}")
    assert cli("wait", clash).returncode == 1
    failed = attempt_of(cli, clash)
    assert failed["state"] == "failed" and failed["error_kind"] == "conflict", failed
    assert "conflict in same.txt" in failed["reason"] and p in failed["reason"] and q in failed["reason"], failed
    assert f"refs/heads/subtask/{clash}" not in refs(repo) and slot_entries(repo)["running"] == []


def test_after_a_job_that_already_ended_starts_at_once(cli, repo):
    a = cli.start("echo a > a.txt")
    assert cli("wait", a).returncode == 0
    line = cli.ok("start", "--after", a[:6], "test -f a.txt")
    b = line.split()[0]
    assert line.split()[1] in ("running", "queued"), line
    assert cli("wait", b).returncode == 0


def test_a_teammates_waiting_job_pulled_here_is_never_started_here(tmp_path):
    """Their job waits for one that ended; a rebuild of our slots file from the records lists it
    as waiting here too, and its jobs have ended: the next command must drop it, never start it
    (no branch, worktree, slot or record change of ours), because its task is theirs to run."""
    remote, ((a, cli_a), (b, cli_b)) = make_team(tmp_path)
    first = cli_a.start("echo x > x.txt")
    assert cli_a("wait", first).returncode == 0
    # their start dies before it moves its job on: it stays waiting, its job ended
    crashed = cli_a("start", "--after", first, "echo theirs > w.txt",
                    env={"SUBTASK_FAULT": "before_leaving_waiting"})
    assert crashed.returncode == 99, crashed.stderr
    theirs = next(r.split("/")[2] for r in refs(a, "refs/subtask") if r.endswith("/record")
                  and first not in r)
    git(a, "push", "-q", "origin", "refs/subtask/*:refs/subtask/*")  # what `git subtask push` sends
    cli_b.ok("pull")
    pulled = git(b, "rev-parse", f"refs/subtask/{theirs}/record")
    assert cli_b.json("show", theirs)["state"] == "waiting"
    (state_dir(b) / "slots.json").write_text("{damaged")
    cli_b.ok("list")  # rebuilds the slots file from every record here, then moves waiting jobs on
    cli_b.ok("list")
    assert cli_b.json("show", theirs)["state"] == "waiting"
    assert git(b, "rev-parse", f"refs/subtask/{theirs}/record") == pulled
    assert refs(b, "refs/heads/subtask") == []
    assert not (b / ".subtask" / "worktrees" / theirs).exists()
    assert slot_entries(b) == {"running": [], "queue": []} and theirs not in waiting_entries(b)


# ---------------------------------------------------------------- stop

def test_stop_of_a_waiting_job_ends_it_and_skips_its_waiters(cli, repo, tmp_path):
    gate = tmp_path / "gate"
    a = cli.start(hold(gate))
    b = cli.start("true", "--after", a)
    c = cli.start("true", "--after", b)
    assert cli.ok("stop", b).startswith(f"{b} stopped")
    assert attempt_of(cli, b)["reason"] == "stopped while waiting"
    assert attempt_of(cli, c)["state"] == "skipped" and b in attempt_of(cli, c)["reason"]
    assert waiting_entries(repo) == [] and attempt_of(cli, a)["state"] == "running"
    gate.touch()
    assert cli("wait", a).returncode == 0
    assert attempt_of(cli, b)["state"] == "stopped"  # a terminal state is never overwritten


def test_stop_of_the_job_it_waits_for_skips_it(cli, repo, tmp_path):
    gate = tmp_path / "gate"
    a = cli.start(hold(gate))
    b = cli.start("true", "--after", a)
    try:
        cli.ok("stop", a)
    finally:
        gate.touch()
    assert cli("wait", b).returncode == 1
    assert attempt_of(cli, b)["state"] == "skipped" and attempt_of(cli, b)["reason"].startswith(f"{a} ended stopped")


# ---------------------------------------------------------------- crashes: exactly once

def test_a_waiter_starts_exactly_once_after_every_process_died(cli, repo, tmp_path, control_dir):
    """A's worker dies right after A's end, before it starts B; `wait` is killed meanwhile;
    then eight commands at once notice A ended: B starts once."""
    gate, runs = tmp_path / "gate", control_dir / "runs"
    a = cli.start(hold(gate), env={"SUBTASK_FAULT": "before_advance"})
    b = cli.start(f"echo $SUBTASK_JOB_ID >> '{runs}'; echo b > b.txt", "--after", a)
    waiter = subprocess.Popen(["git", "subtask", "wait", b], cwd=repo, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    os.killpg(waiter.pid, signal.SIGKILL)
    waiter.wait()
    gate.touch()
    sdir = state_dir(repo)
    from subtask.state import liveness

    assert wait_until(lambda: attempt_of(cli, a)["state"] == "done" and not liveness.is_held(sdir, a))
    assert attempt_of(cli, b)["state"] == "waiting"  # the worker that would have started it is gone
    lookers = [subprocess.Popen(["git", "subtask", "list"], cwd=repo, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True) for _ in range(8)]
    for looker in lookers:
        assert looker.wait(timeout=120) == 0, looker.stderr.read()
    assert cli("wait", b).returncode == 0
    assert runs.read_text().split() == [b]
    assert len(shown(cli, b)["state_detail"]["attempts"]) == 1
    assert waiting_entries(repo) == []
    check_books(cli, repo)


def test_commands_that_see_a_waiter_ready_while_another_starts_it_leave_it_to_that_one(cli, repo, tmp_path,
                                                                                       control_dir):
    """One `list` is held in the middle of starting B (its branch made, its record still waiting);
    four more see B ready meanwhile: none starts it; once let go, the first does, once."""
    gate, runs = tmp_path / "gate", control_dir / "runs"
    a = cli.start(hold(tmp_path / "a-gate"), env={"SUBTASK_FAULT": "before_advance"})  # its worker starts no one
    b = cli.start(f"echo $SUBTASK_JOB_ID >> '{runs}'", "--after", a)
    env = {"SUBTASK_FAULT_HOLD": f"before_leaving_waiting:{gate}"}
    (tmp_path / "a-gate").touch()
    from subtask.state import liveness

    assert wait_until(lambda: attempt_of(cli, a)["state"] == "done" and not liveness.is_held(state_dir(repo), a))
    first = subprocess.Popen(["git", "subtask", "list"], cwd=repo, env=dict(os.environ, **env),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists() or first.poll() is not None)
        assert first.poll() is None, first.stderr.read()
        for _ in range(4):
            cli.ok("list")
        assert attempt_of(cli, b)["state"] == "waiting" and not runs.exists()
    finally:
        gate.touch()
    assert first.wait(timeout=120) == 0, first.stderr.read()
    assert cli("wait", b).returncode == 0
    assert runs.read_text().split() == [b]


def test_a_worker_that_dies_after_starting_its_waiter_leaves_no_run_lock_held(cli, repo, tmp_path):
    """The waiter's worker is forked from the one that ended: it must not keep that one's run-lock
    (as `wait`, `cleanup` and the sweep read it) held for as long as it runs."""
    from subtask.state import liveness

    gate, a_gate = tmp_path / "gate", tmp_path / "a-gate"
    a = cli.start(hold(a_gate), env={"SUBTASK_FAULT": "after_advance"})
    b = cli.start(hold(gate), "--after", a)
    a_gate.touch()  # a ends now, and its worker starts b
    try:
        assert wait_until(lambda: attempt_of(cli, b)["state"] == "running")
        assert wait_until(lambda: not liveness.is_held(state_dir(repo), a), timeout=20), "a's run-lock outlived a"
        assert liveness.is_held(state_dir(repo), b)
    finally:
        gate.touch()
    assert cli("wait", b).returncode == 0


@pytest.mark.parametrize("point", ["before_leaving_waiting", "after_leaving_waiting"])
def test_a_mover_killed_while_starting_a_waiter_leaves_it_to_the_next_command(cli, repo, control_dir, point):
    use_paid_engine(repo, monthlyCapUsd="10")
    runs = control_dir / "runs"
    a = cli.start("cost=0.1")
    assert cli("wait", a).returncode == 0
    # The start itself moves it on at once: it dies there.
    crashed = cli("start", "--after", a, f"cost=0.1 log={runs}", env={"SUBTASK_FAULT": point})
    assert crashed.returncode == 99, crashed.stderr
    b = next(j["id"] for j in cli.json("list", "--all")["jobs"] if j["id"] != a)
    assert cli("wait", b).returncode == 0  # its watcher's sweep starts it
    assert [line.split()[:2] for line in runs.read_text().splitlines()] == [["start", b], ["end", b]]
    assert len(shown(cli, b)["state_detail"]["attempts"]) == 1
    assert [r["op"] for r in ledger_rows(repo) if r.get("rid") == f"{b}.1"] == ["reserve", "close"]
    assert waiting_entries(repo) == []
    check_books(cli, repo)


def test_a_paid_waiter_reserves_when_it_starts_and_a_full_cap_fails_it_then(cli, repo, tmp_path):
    use_paid_engine(repo, monthlyCapUsd="3")
    gate = tmp_path / "gate"
    a = cli.start(f"cost=0.5 hold={gate}", "--max-usd", "2")
    b = cli.start("cost=0.5", "--after", a, "--max-usd", "2")
    assert [r["job"] for r in cli.json("spend")["open_reservations"]] == [a]
    gate.touch()
    assert cli("wait", a).returncode == 0
    assert cli("wait", b).returncode == 0
    rows = [r for r in ledger_rows(repo) if r.get("rid") == f"{b}.1"]
    assert [r["op"] for r in rows] == ["reserve", "close"]
    # $0.5 + $0.5 spent of $3: a third waiter's $2.5 does not fit when it would start.
    c = cli.start("cost=0.1", "--after", b, "--max-usd", "2.5")
    assert cli("wait", c).returncode == 1
    failed = attempt_of(cli, c)
    assert failed["state"] == "failed" and failed["error_kind"] == "budget", failed
    check_books(cli, repo)


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("args, words", [
    (["--after", "st-00000000"], "no job matches"),
    (["--after", "sg-00000000"], "no group matches"),
    (["--after", "nonsense!"], "not a job id"),
    (["--on-fail", "run"], "--on-fail goes with --after"),
    (["--after", "{a}", "--on-fail", "maybe"], "on-fail"),
    (["--after", "{a}", "--base", "HEAD~0"], "give --base or --after"),
    (["--after", ""], "--after names no job"),  # `--after "$ID"` with $ID empty: never a job started at once
    (["--after", ","], "--after names no job"),
])
def test_bad_after_input_is_refused_and_leaves_nothing(cli, repo, args, words):
    a = cli.start("true")
    cli.ok("wait", a)
    before = refs(repo)
    proc = cli("start", *[x.format(a=a) for x in args], "true")
    assert proc.returncode in (128, 129) and "error:" in proc.stderr and words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert refs(repo) == before and waiting_entries(repo) == []


# ---------------------------------------------------------------- map

def map_repo(repo: Path, n: int = 20) -> list[str]:
    names = [f"src/f{k:02}.py" for k in range(1, n + 1)]
    for name in names:
        (repo / name).parent.mkdir(exist_ok=True)
        (repo / name).write_text(f"# {name}\n")
    (repo / "other.txt").write_text("not matched\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "files")
    return names


def overlap(log: Path) -> int:
    """The most jobs that ran at once, from their own `start`/`end` lines."""
    events = []
    for line in log.read_text().splitlines():
        what, _job, when = line.split()
        events.append((float(when), 0 if what == "end" else 1))
    most = now = 0
    for _when, kind in sorted(events):
        now += 1 if kind else -1
        most = max(most, now)
    return most


def test_map_over_twenty_files_by_five_makes_four_jobs_never_more_than_two_running(cli, repo, control_dir, tmp_path):
    names = map_repo(repo)
    git(repo, "config", "subtask.maxRunning", "4")
    log, gate = control_dir / "log", tmp_path / "gate"
    template = (f"echo start $SUBTASK_JOB_ID $(date +%s.%N) >> '{log}'; {hold(gate)}; "
                "for f in {files}; do echo '# mapped' >> \"$f\"; done; "
                f"echo end $SUBTASK_JOB_ID $(date +%s.%N) >> '{log}'")
    out = cli.ok("map", "src/*.py", template, "--batch", "5", "--concurrency", "2", "--verify", "true")
    lines = out.splitlines()
    gid, members = lines[0].split()[0], [line.split()[0] for line in lines[1:]]
    assert gid.startswith("sg-") and len(members) == 4, out
    assert wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 2)
    states = {j["id"]: j["state"] for j in cli.json("list", "--all")["jobs"]}
    assert sorted(states.values()) == ["queued", "queued", "running", "running"], states  # within maxRunning 4
    gate.touch()
    waited = cli("wait", gid)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert overlap(log) == 2 and len(log.read_text().splitlines()) == 8
    group = cli.json("show", gid)
    assert group["kind"] == "map" and group["state"] == "done" and group["concurrency"] == 2, group
    touched = []
    for job in members:
        files = git(repo, "diff", "--name-only", shown(cli, job)["spec"]["base"], f"subtask/{job}").split()
        assert len(files) == 5, files
        touched += files
    assert sorted(touched) == names  # every matching file once; other.txt never
    assert "map" in cli.ok("list") and gid in cli.ok("list")
    # A job after the whole map starts from the integration of its four heads.
    after = cli.start("grep -c mapped src/*.py | grep -v ':0$' | wc -l | grep -qx 20", "--after", gid)
    assert cli("wait", after).returncode == 0, cli.ok("show", after)


def test_stop_of_a_map_stops_its_jobs_and_bad_maps_are_refused(cli, repo, tmp_path):
    map_repo(repo, 4)
    gate = tmp_path / "gate"
    out = cli.ok("map", "src/*.py", f"{hold(gate)}; echo {{files}}", "--concurrency", "1")
    gid = out.split()[0]
    assert len(out.splitlines()) == 5  # batch 1 by default: one job per file
    try:
        assert f"{gid} map stopped" in cli.ok("stop", gid)
    finally:
        gate.touch()
    assert all(j["state"] == "stopped" for j in cli.json("list", "--all")["jobs"])
    for args, words in ((["nothing/*.x", "do {files}"], "no tracked file matches"),
                        (["src/*.py", "no placeholder"], "{files}"),
                        (["src/*.py", "do {files}", "--batch", "0"], "--batch"),
                        (["src/*.py", "do {files}", "--concurrency", "-1"], "--concurrency")):
        proc = cli("map", *args)
        assert proc.returncode in (128, 129) and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------- over MCP

def test_start_many_chains_items_by_id_and_refuses_circles(repo, monkeypatch):
    import anyio
    from test_mcp import call, connect, job_id_in

    monkeypatch.chdir(repo)

    async def main():
        async with connect("inproc", repo) as client:
            answer = await call(client, "start_many", {"tasks": [
                {"id": "client", "after": "api", "task": "test -f api.txt && echo c > client.txt"},
                {"id": "api", "task": "echo a > api.txt"},
                {"id": "docs", "after": ["api", "client"], "task": "test -f client.txt && echo d > docs.txt"},
                {"id": "x", "after": "y", "task": "true"},
                {"id": "y", "after": "x", "task": "true"},
                {"after": "nothing-here", "task": "true"},
            ]})
            lines = answer.splitlines()
            assert len(lines) == 6, answer
            client_id, api_id, docs_id = (job_id_in(line) for line in lines[:3])
            assert lines[0].startswith(f"1. {client_id} waiting") and f"after {api_id}" in lines[0], lines[0]
            assert "circle" in lines[3] and "circle" in lines[4], answer
            assert lines[5].startswith("6. error:") and "nothing-here" in lines[5], lines[5]
            waited = await call(client, "wait", {"ids": [docs_id], "timeout": 120})
            assert waited.startswith(f"{docs_id} done"), waited
            return client_id, api_id, docs_id

    client_id, api_id, docs_id = anyio.run(main)
    assert set(git(repo, "ls-tree", "--name-only", f"subtask/{docs_id}").split()) >= \
        {"api.txt", "client.txt", "docs.txt"}


def test_map_over_mcp_and_wait_for_its_group(repo, monkeypatch):
    import anyio
    from test_mcp import call, connect

    map_repo(repo, 3)
    monkeypatch.chdir(repo)

    async def main():
        async with connect("inproc", repo) as client:
            answer = await call(client, "map", {"pattern": "src/*.py", "task": "echo '# m' >> {files}",
                                                "concurrency": 1, "verify": "true"})
            gid = answer.split()[0]
            assert gid.startswith("sg-") and sum(line.startswith("  st-") for line in answer.splitlines()) == 3, answer
            waited = await call(client, "wait", {"ids": [gid], "timeout": 120})
            assert f"{gid} map done" in waited, waited

    anyio.run(main)


def test_completion_offers_ids_after_after_and_the_new_states(cli, repo):
    job = cli.start("true")
    assert job in cli.ok("__complete", "start", "--after").split()
    assert cli.ok("__complete", "start", "--on-fail").split() == ["skip", "run"]
    assert {"waiting", "skipped"} <= set(cli.ok("__complete", "list", "--state").split())
    assert "map" in cli.ok("__complete").split()
