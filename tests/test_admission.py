"""Admission and spend under crashes, concurrency and bad input (issue 4).

Every test here ends by checking the books: the jobs `list` shows as active are exactly the ones
in slots.json, no reservation is open for an ended job, and the money `spend` shows as committed
is what the records say was charged. Paid work goes through a real `command` engine (the fake
agent in fake_agent.py), so the ledger matters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import git, kill_worker_and_engine, refs, wait_until

from subtask.model import faults
from subtask.state import liveness

FAKE_AGENT = Path(__file__).with_name("fake_agent.py")


def state_dir(repo: Path) -> Path:
    return Path(git(repo, "rev-parse", "--absolute-git-dir")) / "subtask"


def use_paid_engine(repo: Path, **config: str) -> None:
    """The fake paid agent as engine `fakepaid`, the default engine of `repo`."""
    settings = {
        "subtask.engine.fakepaid.command": json.dumps([sys.executable, str(FAKE_AGENT), "{task}"]),
        "subtask.engine.fakepaid.paid": "true",
        "subtask.engine.fakepaid.costPattern": r"cost: \$([0-9.]+)",
        "subtask.engine": "fakepaid",
        **{f"subtask.{k}": v for k, v in config.items()},
    }
    for key, value in settings.items():
        git(repo, "config", key, value)


def slot_entries(repo: Path) -> dict[str, list[str]]:
    path = state_dir(repo) / "slots.json"
    data = json.loads(path.read_text()) if path.exists() else {"running": [], "queue": []}
    return {"running": [e["job"] for e in data["running"]], "queue": [e["job"] for e in data["queue"]]}


def ledger_rows(repo: Path) -> list[dict]:
    path = state_dir(repo) / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def check_books(cli, repo: Path) -> dict[str, dict]:
    """`list`, `spend` and the slots agree after one command; returns the jobs by id."""
    jobs = {j["id"]: j for j in cli.json("list", "--all")["jobs"]}
    active = {i for i, j in jobs.items() if j["state"] in ("queued", "running")}
    entries = slot_entries(repo)
    assert set(entries["running"]) | set(entries["queue"]) == active, (entries, jobs)
    spend = cli.json("spend")
    assert {r["job"] for r in spend["open_reservations"]} <= active, spend
    closes = [r for r in ledger_rows(repo) if r["op"] == "close"]
    assert len({r["rid"] for r in closes}) == len(closes), f"a reservation was closed twice: {closes}"
    charged = 0.0
    for job_id in jobs:
        for attempt in cli.json("show", job_id)["state_detail"]["attempts"]:
            if attempt.get("rid") and attempt["state"] in ("done", "failed", "stopped"):
                charged += attempt["cost"]["charged"] or 0.0
    assert spend["committed_usd"] == pytest.approx(charged), (spend, jobs)
    return jobs


# ---------------------------------------------------------------- crashes at every step

START_POINTS = ["after_admit", "after_reserve", "after_branch", "after_record", "before_spawn"]
WORKER_POINTS = ["worker_start", "after_checkout", "after_engine", "after_verify", "before_final_record"]
ENGINE_RAN = {"after_engine", "after_verify", "before_final_record"}


def test_a_crash_at_any_step_leaks_no_slot_no_money_and_no_work(cli, repo):
    """SUBTASK_FAULT at each of the ten points, all at once; one `list` afterwards settles it all."""
    use_paid_engine(repo, maxRunning="20")
    procs = {point: subprocess.Popen(
        ["git", "subtask", "start", "--max-usd", "3", "--verify", "true", f"point={point} file={point}.txt cost=0.42"],
        cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, SUBTASK_FAULT=point)) for point in START_POINTS + WORKER_POINTS}
    results = {point: (p.wait(timeout=60), p.stdout.read()) for point, p in procs.items()}
    for point in START_POINTS:
        assert results[point][0] == 99, (point, results[point])
    started = {point: results[point][1].split()[0] for point in WORKER_POINTS}
    for point in started:
        assert results[point][0] == 0, (point, results[point])
    # wait notices each dead worker through its run-lock
    assert cli("wait", *started.values(), timeout=60).returncode == 1
    jobs = check_books(cli, repo)
    by_point = {j["task"].split()[0].removeprefix("point="): j for j in jobs.values()}
    # no record yet: nothing may remain, not even a branch or a pin
    for point in ("after_admit", "after_reserve"):
        assert point not in by_point
    # the record existed (made with the branch, in one ref transaction) but no worker ever ran it
    for point in ("after_branch", "after_record", "before_spawn"):
        assert by_point[point]["state"] == "failed", point
    for point in WORKER_POINTS:
        job = by_point[point]
        assert job["state"] == "failed", point
        attempt = cli.json("show", job["id"])["state_detail"]["attempts"][0]
        assert attempt["reason"] == "worker died", point
        # the engine may have spent: the whole reservation; it never started: nothing
        assert attempt["cost"]["charged"] == (3.0 if point in ENGINE_RAN else 0.0), point
        worktree = repo / ".subtask" / "worktrees" / job["id"]
        assert worktree.exists() == (point != "worker_start"), point
        if point in ENGINE_RAN:  # the agent's commit and its worktree survive the crash
            assert (worktree / f"{point}.txt").exists(), point
            assert git(repo, "log", "--format=%s", "-1", f"subtask/{job['id']}") == f"agent wrote {point}.txt"
    job_refs = ({r.split("/")[2] for r in refs(repo, "refs/subtask")}
                | {r.split("/")[3] for r in refs(repo, "refs/heads/subtask")})
    assert job_refs == {j["id"] for j in jobs.values()}, "orphan refs were left behind"
    assert cli.json("spend")["committed_usd"] == pytest.approx(9.0)


def test_a_start_refused_over_the_cap_changes_nothing(cli, repo):
    use_paid_engine(repo, monthlyCapUsd="5")
    proc = cli("start", "--max-usd", "7", "file=x.txt")
    assert proc.returncode == 1, proc.stderr
    assert "error: reserving $7.00" in proc.stderr and "monthly cap" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert [r for r in refs(repo) if "subtask" in r] == []
    assert slot_entries(repo) == {"running": [], "queue": []}
    assert ledger_rows(repo) == []
    assert list((state_dir(repo) / "run").glob("*.lock")) == []
    check_books(cli, repo)


def test_a_group_refused_at_a_later_member_closes_the_earlier_ones_and_frees_their_slots(repo):
    """A group is reserved all or none: the ledger refusing its third member (that attempt's
    reservation id is taken already) must close the first two members' reservations, once each,
    and take every member's slot back; what the ledger held before is left as it was."""
    from types import SimpleNamespace

    from subtask.git.gitrepo import open_repo
    from subtask.git.records import Job
    from subtask.model.errors import SubtaskError
    from subtask.model.job import Attempt, Cost, JobSpec, JobState, now
    from subtask.ops.running import admission
    from subtask.state import ledger

    use_paid_engine(repo, monthlyCapUsd="10", maxRunning="2")
    opened, sdir = open_repo(repo), state_dir(repo)
    base, worktrees = git(repo, "rev-parse", "HEAD"), repo / ".subtask" / "worktrees"

    def member(n: int) -> SimpleNamespace:
        job_id = f"st-0000000{n}"
        spec = JobSpec(id=job_id, task="cost=0.1", engine="fakepaid", base_ref="HEAD", base=base,
                       branch=f"subtask/{job_id}", worktree=str(worktrees / job_id), repo=str(repo),
                       created_at=now(), group="sg-00000001", member=n)
        attempt = Attempt(n=1, state="queued", message="cost=0.1", queued_at=now(),
                          cost=Cost(reserved=1.0), rid=f"{job_id}.1")
        job = Job(spec, JobState(attempts=[attempt]), None, "", "", None)
        return SimpleNamespace(job=job, paid=True)

    with ledger.lock(sdir):
        ledger.reserve_locked(sdir, job="st-00000003", attempt=1, engine="fakepaid", usd=1.0,
                              cap_usd=10.0)
    with pytest.raises(SubtaskError) as refused:
        admission.admit(opened, [member(n) for n in (1, 2, 3)], "a group of 3")
    assert refused.value.kind == "conflict" and "st-00000003.1" in refused.value.message
    assert slot_entries(repo) == {"running": [], "queue": []}
    ops = {rid: [r["op"] for r in ledger_rows(repo) if r.get("rid") == rid]
           for rid in ("st-00000001.1", "st-00000002.1", "st-00000003.1")}
    assert ops == {"st-00000001.1": ["reserve", "close"], "st-00000002.1": ["reserve", "close"],
                   "st-00000003.1": ["reserve"]}, ops
    assert [r.rid for r in ledger.open_reservations(sdir)] == ["st-00000003.1"]
    assert all(r["usd_charged"] == 0.0 for r in ledger_rows(repo) if r["op"] == "close")  # released


# ---------------------------------------------------------------- death noticed by many at once

def test_a_killed_worker_is_charged_once_however_many_commands_notice(cli, repo):
    use_paid_engine(repo)
    job = cli.start("sleep=60", "--max-usd", "2")
    kill_worker_and_engine(repo, job)  # returns once the kernel has released its run-lock
    listers = [subprocess.Popen(["git", "subtask", "list", "--json"], cwd=repo, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(5)]
    seen = []
    for lister in listers:
        out, err = lister.communicate(timeout=60)
        assert lister.returncode == 0 and "Traceback" not in err, err
        seen.append(json.loads(out)["jobs"][0]["state"])
    # The lister that settles the job holds its run-lock meanwhile; one that looks then finds the
    # lock held and the record not yet written, so it may still say "running" (never anything else).
    assert "failed" in seen and set(seen) <= {"failed", "running"}, seen
    assert cli.json("list")["jobs"][0]["state"] == "failed"
    closes = [r for r in ledger_rows(repo) if r["op"] == "close"]
    assert [(r["rid"], r["usd_charged"]) for r in closes] == [(f"{job}.1", 2.0)]
    subjects = git(repo, "log", "--format=%s", f"refs/subtask/{job}/record").splitlines()
    assert sum(" failed" in s for s in subjects) == 1, subjects
    check_books(cli, repo)


# ---------------------------------------------------------------- a damaged slots file

@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_damaged_slots_file_is_rebuilt_without_forgetting_the_running_job(cli, repo, damage):
    git(repo, "config", "subtask.maxRunning", "1")
    running = cli.start("sleep 30")
    path = state_dir(repo) / "slots.json"
    if damage == "corrupt":
        path.write_text('{"v": 1, "running": [{"job": ')
    else:
        path.unlink()
    proc = cli("start", "true")
    out = proc.stdout
    assert "queued (#1 in queue)" in out, "the rebuilt slots forgot the running job"
    if damage == "corrupt":  # said to a person, not as a Python diagnostic
        assert proc.stderr.startswith("warning: ") and "slots.json is damaged" in proc.stderr, proc.stderr
        assert "UserWarning" not in proc.stderr and ".py:" not in proc.stderr
    queued = out.split()[0]
    assert slot_entries(repo) == {"running": [running], "queue": [queued]}
    cli.ok("stop", running)
    cli.ok("wait", queued)
    check_books(cli, repo)


# ---------------------------------------------------------------- stop

def test_stop_in_the_spawn_gap_and_of_a_queued_job_releases_their_money_once(cli, repo, tmp_path):
    use_paid_engine(repo, maxRunning="1")
    gate = tmp_path / "gate"  # the worker waits at worker_start until this exists (or HOLD_LIMIT_S)
    try:
        gap = cli.start("file=gap.txt cost=0.5", "--max-usd", "1",
                        env={"SUBTASK_FAULT_HOLD": f"worker_start:{gate}"})
        queued = cli.start("file=queued.txt", "--max-usd", "1")
        assert cli.json("show", queued)["position"] == 1
        assert f"{queued} stopped" in cli.ok("stop", queued)
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=30), "the worker never reached worker_start"
        # the worker is held until the gate exists: a stop that waited for it instead of ending it
        # would outlast this timeout (half the hold limit), whatever the machine's load
        assert f"{gap} stopped" in cli.ok("stop", gap, timeout=faults.HOLD_LIMIT_S / 2)
        assert not gate.exists()
        for job in (gap, queued):
            subjects = git(repo, "log", "--format=%s", f"refs/subtask/{job}/record").splitlines()
            assert sum(" stopped" in s or " failed" in s or " done" in s for s in subjects) == 1, subjects
        assert not (repo / ".subtask" / "worktrees" / gap / "gap.txt").exists()
        closes = sorted((r["rid"], r["usd_charged"]) for r in ledger_rows(repo) if r["op"] == "close")
        assert closes == sorted([(f"{gap}.1", 0.0), (f"{queued}.1", 0.0)])
        check_books(cli, repo)
    finally:
        gate.touch()  # a failing test never leaves the held worker waiting
    # a stopped job can be replied to: the old stop request must not end the new attempt
    cli.ok("reply", gap, "file=gap.txt cost=0.5")
    assert cli("wait", gap).returncode == 0
    assert cli.json("spend")["committed_usd"] == pytest.approx(0.5)
    check_books(cli, repo)


# ---------------------------------------------------------------- recursion guard

def test_a_job_may_start_a_job_one_level_down_but_not_past_max_depth(cli, repo):
    nested = "git subtask start --engine shell 'true'; echo rc=$?"
    confined = cli.start(nested)  # a confined job cannot write the records of the jobs it would start
    cli("wait", confined)
    assert "runs confined (isolation worktree), so it cannot start jobs" in cli.ok("result", confined)
    git(repo, "config", "subtask.isolation", "none")  # delegation needs an unconfined parent
    allowed = cli.start(nested)
    cli.ok("wait", allowed)
    out = cli.ok("result", allowed)
    assert "rc=0" in out and "running" in out
    git(repo, "config", "subtask.maxDepth", "1")
    refused = cli.start(nested)
    cli.ok("wait", refused)
    out = cli.ok("result", refused)
    assert "rc=1" in out and "delegation depth 1 reached subtask.maxDepth=1" in out
    proc = cli("start", "true", env={"SUBTASK_DEPTH": "1"})
    assert proc.returncode == 1 and "maxDepth" in proc.stderr
    assert len(cli.json("list")["jobs"]) == 4  # three top-level jobs, one nested
    check_books(cli, repo)


# ---------------------------------------------------------------- stress

def barrier_argv(barrier: Path, argv: list[str]) -> list[str]:
    """Run `argv` once `barrier` exists, so every process starts at the same moment."""
    return ["sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.01; done; exec "$@"', str(barrier), *argv]


@pytest.mark.stress
def test_twelve_starts_at_once_never_run_more_than_two(cli, repo, tmp_path, control_dir):
    use_paid_engine(repo, maxRunning="2")
    log = control_dir / "times.log"
    barrier = tmp_path / "go"
    procs = [subprocess.Popen(barrier_argv(barrier, ["git", "subtask", "start", "--max-usd", "0",
                                                     f"sleep=0.3 file=f{n} log={log}"]),
                              cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(12)]
    time.sleep(0.5)
    barrier.touch()
    ids = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        ids.append(out.split()[0])
    assert cli("wait", *ids, timeout=90).returncode == 0
    events = sorted((float(t), kind, job) for kind, job, t in (line.split() for line in log.read_text().splitlines()))
    overlap = peak = 0
    for _, kind, _ in events:
        overlap += 1 if kind == "start" else -1
        peak = max(peak, overlap)
    assert peak <= 2, events
    started = [job for _, kind, job in events if kind == "start"]
    admitted = [r["job"] for r in ledger_rows(repo) if r["op"] == "reserve"]  # reserved in the critical section
    assert sorted(started) == sorted(ids) == sorted(admitted)
    # FIFO: two slots may be handed out at nearly the same moment, so neighbours can swap when
    # their engines start; a job admitted two or more places later never starts first.
    late = [(a, b) for i, a in enumerate(admitted) for b in admitted[i + 2:] if started.index(b) < started.index(a)]
    assert not late, (admitted, started)
    check_books(cli, repo)


@pytest.mark.stress
def test_eight_processes_racing_for_the_cap_get_exactly_seven_reservations(cli, repo, tmp_path):
    use_paid_engine(repo, monthlyCapUsd="50", maxJobUsd="7", maxRunning="8")
    barrier = tmp_path / "go"
    loop = 'for n in 1 2 3; do git subtask start --max-usd 7 "file=$n-$$"; echo "rc=$?"; done'
    procs = [subprocess.Popen(barrier_argv(barrier, ["sh", "-c", loop]), cwd=repo, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(8)]
    time.sleep(0.5)
    barrier.touch()
    outputs = [p.communicate(timeout=90) for p in procs]
    codes = [line for out, _ in outputs for line in out.splitlines() if line.startswith("rc=")]
    assert sorted(codes) == ["rc=0"] * 7 + ["rc=1"] * 17, outputs
    assert sum(err.count("would exceed the monthly cap") for _, err in outputs) == 17
    ids = [line.split()[0] for out, _ in outputs for line in out.splitlines() if line.startswith("st-")]
    assert len(ids) == 7 and len(refs(repo, "refs/heads/subtask")) == 7
    cli("wait", *ids, timeout=90)
    spend = cli.json("spend")
    assert spend["committed_usd"] == pytest.approx(49.0) and spend["open_usd"] == 0
    check_books(cli, repo)


def test_reading_commands_leave_the_slots_alone_while_nothing_needs_reconciling(cli, repo, tmp_path):
    """Issue 14: `list` and `status` reconcile (reap dead workers, fill slots) only when a look
    without the lock finds something to do; with one live job they neither lock nor rewrite the
    slots file. A dead worker is still reaped by the next reading command."""
    slots_file = repo / ".git" / "subtask" / "slots.json"
    gate = tmp_path / "gate"
    try:
        live = cli.start("true", env={"SUBTASK_FAULT_HOLD": f"worker_start:{gate}"})
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=60)
        before = os.stat(slots_file)
        cli.ok("list")
        cli.ok("status")
        after = os.stat(slots_file)
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "a read rewrote slots.json"
    finally:
        gate.touch()
    assert cli("wait", live).returncode == 0
    dead = cli.start("true", env={"SUBTASK_FAULT": "worker_start"})  # its worker dies at once
    assert wait_until(lambda: not liveness.is_held(repo / ".git" / "subtask", dead), timeout=60)
    cli.ok("list")  # reaps it
    assert slot_entries(repo) == {"running": [], "queue": []}
    assert "failed" in cli.ok("status", dead)
