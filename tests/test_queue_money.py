"""Queue, recursion and money (issue 11, items 8-10).

- A job runs with the environment of the command that started it, whoever hands it its slot.
- A job that waits on its own child under maxRunning=1 lends it its slot (no deadlock), and the
  delegation depth is known from where the command runs, not only from SUBTASK_DEPTH.
- An engine that never started is charged nothing; the month's committed spend is rebuilt from
  the records when the state directory is lost; `spend --all-clones` reads the records only.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from conftest import Cli, git, grant_writable, make_repo, wait_until
from test_admission import check_books, ledger_rows, state_dir, use_paid_engine

HOLD = 'while [ ! -e "{release}" ]; do sleep 0.02; done'


def env_files(repo: Path) -> list[Path]:
    return sorted((state_dir(repo) / "run").glob("*.env*"))


# ---------------------------------------------------------------- item 8: the starter's environment


def test_a_queued_job_runs_with_the_environment_of_its_own_start(cli, repo, tmp_path):
    git(repo, "config", "subtask.maxRunning", "1")
    release = tmp_path / "release"
    out = tmp_path / "out"
    out.mkdir()
    grant_writable(out)
    try:
        first = cli.start(f'echo "$AWS_PROFILE" > {out}/a; {HOLD.format(release=release)}',
                          env={"AWS_PROFILE": "prod-7f3a"})
        second = cli.start(f'echo "$AWS_PROFILE" > {out}/b', env={"AWS_PROFILE": "dev-9c1e"})
        assert cli.json("show", second)["state"] == "queued"
        kept = env_files(repo)
        assert kept, "the queued job's environment is kept in the state directory"
        for path in kept:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        release.touch()
    cli.ok("wait", first, second, timeout=60)
    assert (out / "a").read_text().strip() == "prod-7f3a"
    assert (out / "b").read_text().strip() == "dev-9c1e"  # the worker that handed it the slot ran with prod
    assert env_files(repo) == [], "the environment is removed when the job ends"
    everything = git(repo, "log", "--all", "-p", "--format=%B") + git(repo, "notes", "--ref=subtask", "list")
    assert "prod-7f3a" not in everything and "dev-9c1e" not in everything  # never in git
    check_books(cli, repo)


@pytest.mark.parametrize("spawn", ["fork", "exec"])
def test_a_job_handed_a_slot_from_another_repository_keeps_its_environment(tmp_path, spawn):
    """A shared state directory: repo one's worker hands the slot to a job of repo two."""
    shared = tmp_path / "shared-state"
    one, two = make_repo(tmp_path / "one"), make_repo(tmp_path / "two")
    for r in (one, two):
        git(r, "config", "subtask.stateDir", str(shared))
        git(r, "config", "subtask.maxRunning", "1")
    release = tmp_path / "release"
    out = tmp_path / "out"
    out.mkdir()
    grant_writable(out)
    env = {"SUBTASK_SPAWN": "exec"} if spawn == "exec" else {}
    try:
        first = Cli(one).start(f'echo "$AWS_PROFILE" > {out}/a; {HOLD.format(release=release)}',
                               env={"AWS_PROFILE": "prod", **env})
        second = Cli(two).start(f'echo "$AWS_PROFILE" > {out}/b', env={"AWS_PROFILE": "dev"})
        assert Cli(two).json("show", second)["state"] == "queued"
    finally:
        release.touch()
    Cli(one).ok("wait", first, timeout=60)
    Cli(two).ok("wait", second, timeout=60)
    assert (out / "a").read_text().strip() == "prod"
    assert (out / "b").read_text().strip() == "dev"
    assert sorted((shared / "run").glob("*.env*")) == []


# ---------------------------------------------------------------- item 9: nested jobs


def test_a_job_waiting_on_its_child_lends_it_its_slot_under_max_running_one(cli, repo):
    git(repo, "config", "subtask.maxRunning", "1")
    nested = ("child=$(git subtask start --engine shell 'echo child-ran' | cut -d' ' -f1); "
              "git subtask wait --timeout 8 \"$child\"; echo wait-rc=$?")
    parent = cli.start(nested, "--isolation", "none")  # a confined job may not start jobs
    cli.ok("wait", "--timeout", "30", parent, timeout=60)
    out = cli.ok("result", parent)
    assert "wait-rc=0" in out, out
    jobs = cli.json("list", "--all")["jobs"]
    assert len(jobs) == 2 and all(j["state"] == "done" for j in jobs), jobs
    child = next(j for j in jobs if j["id"] != parent)
    spec = cli.json("show", child["id"])
    assert spec["spec"]["parent"] == parent and spec["spec"]["depth"] == 1
    check_books(cli, repo)


@pytest.mark.parametrize("spawn", ["fork", "exec"])
def test_a_child_that_outlives_its_parent_runs_on_in_the_slot_it_was_lent(cli, repo, tmp_path, spawn):
    """A job starts a child and ends without waiting for it. The child's worker, orphaned once the
    nested `start` exits, is adopted by the parent's worker, which ends what its attempt left
    running when it ends: the child's worker is no leftover of the parent's (it carried the
    parent's SUBTASK_RUN mark, and was killed: `failed: worker died`). Under maxRunning=1 the
    child runs in the slot its parent lent it, and takes its place when the parent ends first."""
    git(repo, "config", "subtask.maxRunning", "1")
    gate, child_id = tmp_path / "gate", tmp_path / "child_id"
    env = {"SUBTASK_SPAWN": "exec"} if spawn == "exec" else {}  # kept for the parent, so its nested start execs too
    child_task = f"{HOLD.format(release=gate)}; echo child-ran"
    nested = f"git subtask start --engine shell --isolation none '{child_task}' | cut -d' ' -f1 > {child_id}"
    parent = cli.start(nested, "--isolation", "none", env=env)  # a confined job may not start jobs
    child = None
    try:
        cli.ok("wait", parent, timeout=60)
        child = child_id.read_text().strip()
        assert cli.json("show", child)["state"] == "running", cli.ok("show", child)
    finally:
        gate.touch()
    cli("wait", child, timeout=60)
    shown = cli.json("show", child)
    attempt = shown["state_detail"]["attempts"][-1]
    assert shown["state"] == "done", (attempt.get("error_kind"), attempt.get("reason"))
    assert "child-ran" in cli.ok("result", child)
    check_books(cli, repo)


def test_a_job_started_inside_another_keeps_no_run_mark_of_its_parent(tmp_path):
    """The kept environment of a job started inside another's engine leaves the parent's run mark
    out: the worker adopts it as its whole environment, and its git calls would carry the mark."""
    from subtask.proc import procs
    from subtask.state import jobenv

    jobenv.save(tmp_path, "st-child", {procs.RUN_MARKER_ENV: "st-parent.1.4242", "AWS_PROFILE": "dev"})
    assert jobenv.load(tmp_path, "st-child") == {"AWS_PROFILE": "dev"}


def test_a_running_job_lends_its_slot_to_one_child_at_a_time_and_the_count_never_grows(tmp_path):
    from subtask.state import slots

    current = slots.Slots()
    entry = lambda job, parent=None: slots.make_entry(job, 1, tmp_path, parent=parent)  # noqa: E731
    assert slots.admit(current, entry("P"), 1) == 0
    assert slots.admit(current, entry("other"), 1) == 1  # a top-level job queues behind P
    assert slots.admit(current, entry("C1", "P"), 1) == 0  # P's child runs in P's slot
    assert slots.admit(current, entry("C2", "P"), 1) == 2  # one child at a time
    assert slots.admit(current, entry("G", "C1"), 1) == 0  # C1 lends its slot to its own child
    assert slots.taken(current) == 1 and len(current.running) == 3
    slots.remove(current, "C1", 1)  # G takes C1's place: the slot P lent
    assert {e["job"]: e.get("slot_of") for e in current.running} == {"P": None, "G": "P"}
    assert [h.entry["job"] for h in slots.fill(current, tmp_path, 1)] == []  # P's slot is lent to G
    slots.remove(current, "G", 1)
    handed = slots.fill(current, tmp_path, 1)
    assert [h.entry["job"] for h in handed] == ["C2"]  # the lent slot goes to P's next child
    for h in handed:
        os.close(h.fd)
    slots.remove(current, "P", 1)  # C2 keeps P's own slot: still one taken, "other" still waits
    assert [e["job"] for e in current.running] == ["C2"] and slots.taken(current) == 1
    assert [h.entry["job"] for h in slots.fill(current, tmp_path, 1)] == []


@pytest.mark.parametrize("where", ["worktree", "main-repo"])
def test_unsetting_subtask_depth_inside_a_job_does_not_escape_max_depth(cli, repo, where):
    git(repo, "config", "subtask.maxDepth", "1")
    # SUBTASK_DEPTH and SUBTASK_JOB_ID both removed. From the job's worktree in a new session (only
    # its cwd tells), or from elsewhere pointed at the main repository (its process group tells).
    unset = "env -u SUBTASK_DEPTH -u SUBTASK_JOB_ID"
    command = (f"setsid -w {unset} git subtask start --engine shell true" if where == "worktree"
               else f"cd / && {unset} git -C '{repo}' subtask start --engine shell true")
    # Unconfined, where its ancestry is what tells (a confined job sees no state folder, and
    # cannot start jobs at all: containment::test_a_confined_job_that_unsets_its_isolation_*).
    job = cli.start(f"{command}; echo rc=$?", *(["--isolation", "none"] if where == "main-repo" else []))
    cli.ok("wait", job, timeout=60)
    out = cli.ok("result", job)
    assert "rc=1" in out and "maxDepth=1" in out, out
    assert len(cli.json("list", "--all")["jobs"]) == 1
    check_books(cli, repo)


# ---------------------------------------------------------------- item 10: money


def test_a_paid_engine_that_is_not_installed_is_charged_nothing(cli, repo, tmp_path):
    # `start` refuses an engine that is not installed (preflight), so the binary goes after the
    # start, while the job waits in the queue behind a held one: it is missing when the job runs.
    # (Named by its path in git config, not found on PATH: a real codex may be installed here.)
    git(repo, "config", "subtask.maxRunning", "1")
    bin_dir = tmp_path / "bin"
    git(repo, "config", "subtask.engine.codex.path", str(bin_dir / "codex"))  # before the holder's worker reads config
    release = tmp_path / "release"
    holder = cli.start(f"while [ ! -e {release} ]; do sleep 0.02; done")
    bin_dir.mkdir()
    (bin_dir / "codex").write_text("#!/bin/sh\nexit 97\n")
    (bin_dir / "codex").chmod(0o755)
    env = {"OPENAI_API_KEY": "sk-test-fake"}
    try:
        job = cli.start("x", "--engine", "codex", "--max-usd", "5", env=env)
        assert cli.json("show", job)["position"] == 1
        (bin_dir / "codex").unlink()
    finally:
        release.touch()
    cli("wait", holder, job, timeout=60)
    attempt = cli.json("show", job)["state_detail"]["attempts"][-1]
    assert attempt["state"] == "failed" and attempt["error_kind"] == "not_installed", attempt
    assert attempt["cost"]["charged"] == 0.0, attempt
    assert cli.json("spend")["committed_usd"] == 0.0
    check_books(cli, repo)


def test_a_paid_engine_that_fails_to_launch_is_charged_nothing(cli, repo, tmp_path):
    broken = tmp_path / "agent"
    broken.write_text("#!/nonexistent/interpreter\n")
    broken.chmod(0o755)
    use_paid_engine(repo)
    git(repo, "config", "subtask.engine.fakepaid.command", json.dumps([str(broken), "{task}"]))
    job = cli.start("x", "--max-usd", "5")
    cli("wait", job, timeout=60)
    attempt = cli.json("show", job)["state_detail"]["attempts"][-1]
    assert attempt["state"] == "failed", attempt
    assert attempt["cost"]["charged"] == 0.0, attempt
    assert cli.json("spend")["committed_usd"] == 0.0
    check_books(cli, repo)


def test_a_lost_state_directory_keeps_the_months_spend_and_the_cap(cli, repo):
    use_paid_engine(repo, monthlyCapUsd="5")
    job = cli.start("cost=2.5 file=a", "--max-usd", "3")
    cli.ok("wait", job, timeout=60)
    assert cli.json("spend")["committed_usd"] == pytest.approx(2.5)
    shutil.rmtree(state_dir(repo))
    spend = cli.json("spend")
    assert spend["committed_usd"] == pytest.approx(2.5), spend
    refused = cli("start", "cost=1 file=b", "--max-usd", "3")
    assert refused.returncode == 1 and "monthly cap" in refused.stderr, refused.stderr
    ok = cli.start("cost=1 file=b", "--max-usd", "2.5")
    cli.ok("wait", ok, timeout=60)
    assert cli.json("spend")["committed_usd"] == pytest.approx(3.5)
    rebuilt = [r for r in ledger_rows(repo) if r["op"] == "close"]
    assert len({r["rid"] for r in rebuilt}) == len(rebuilt) == 2
    check_books(cli, repo)


def test_a_lost_ledger_keeps_a_running_jobs_reservation(cli, repo, tmp_path):
    use_paid_engine(repo, monthlyCapUsd="5")
    release = tmp_path / "release"
    try:
        running = cli.start(f"cost=1 file=a sleep=0 hold={release}", "--max-usd", "4")
        (state_dir(repo) / "ledger.jsonl").unlink()
        spend = cli.json("spend")
        assert spend["open_usd"] == pytest.approx(4), spend
        assert cli("start", "file=b", "--max-usd", "2").returncode == 1  # 4 open + 2 > 5
    finally:
        release.touch()
    cli.ok("wait", running, timeout=60)
    assert cli.json("spend")["committed_usd"] == pytest.approx(1)
    check_books(cli, repo)


def test_spend_all_clones_reports_the_teams_spend_from_records(tmp_path):
    origin = tmp_path / "origin.git"
    seed = make_repo(tmp_path / "seed")
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(origin))
    clones = []
    for name, cost in (("alice", "2"), ("bob", "1.25")):
        path = tmp_path / name
        git(tmp_path, "clone", "-q", str(origin), str(path))
        use_paid_engine(path)
        c = Cli(path)
        c.ok("wait", c.start(f"cost={cost} file={name}", "--max-usd", "3"), timeout=60)
        c.ok("push")
        clones.append((path, c))
    for _path, c in clones:
        c.ok("pull")
    shutil.rmtree(state_dir(clones[0][0]))  # rebuilt from alice's own records, not bob's
    for path, c in clones:
        mine = c.json("spend")
        assert mine["committed_usd"] == pytest.approx(2 if path.name == "alice" else 1.25), mine
        team = c.json("spend", "--all-clones")
        assert team["committed_usd"] == pytest.approx(3.25), team
        assert sorted(team["clones"].values(), key=lambda v: v["committed"]) == [
            {"committed": pytest.approx(1.25), "open": 0.0, "jobs": 1},
            {"committed": pytest.approx(2), "open": 0.0, "jobs": 1}]


def test_a_job_the_mcp_servers_zygote_hands_a_slot_keeps_its_environment(cli, repo, tmp_path):
    """A's worker dies; a threaded caller with a zygote (as the MCP server) reaps it and hands B
    its slot: B's worker is forked by the zygote from an environment that is not B's."""
    import signal
    import subprocess
    import sys
    import textwrap

    from test_mcp import server_env

    from subtask.git.gitrepo import open_repo
    from subtask.ops.running import lifecycle
    from subtask.state import liveness

    git(repo, "config", "subtask.maxRunning", "1")
    out = tmp_path / "out"
    out.mkdir()
    grant_writable(out)
    release = tmp_path / "release"
    first = cli.start(HOLD.format(release=release), env={"AWS_PROFILE": "prod-7f3a"})
    second = cli.start(f'echo "$AWS_PROFILE" > {out}/b', env={"AWS_PROFILE": "dev-9c1e"})
    sdir = open_repo(repo).state_dir
    # The engine is recorded once the worker started it: wait for that, not for a guess of time.
    assert wait_until(lambda: "engine" in lifecycle.read_pids(sdir, first), timeout=60)
    pids = lifecycle.read_pids(sdir, first)
    try:
        for key in ("engine", "worker"):
            os.killpg(pids[key], signal.SIGKILL)
        assert liveness.wait_released(sdir, first) is not False
        script = textwrap.dedent("""
            import os, threading, time
            from subtask.worker import zygote
            assert zygote.start() is not None
            threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # no fork from here
            os.environ["AWS_PROFILE"] = "zygote-55aa"
            from subtask import api; from subtask.ops.running import lifecycle
            repo = api.repo_at(".")
            api.list_jobs(repo)  # reaps A, hands B its slot through the zygote
            print(lifecycle.read_pids(repo.state_dir, os.environ["JOB"]).get("worker"))
        """)
        proc = subprocess.run([sys.executable, "-c", script], cwd=str(repo), env=dict(server_env(), JOB=second),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "fork server failed" not in proc.stderr, proc.stderr
    finally:
        release.touch()
    cli.ok("wait", second, timeout=60)
    assert (out / "b").read_text().strip() == "dev-9c1e"
    # `wait` returns once the terminal state is recorded; the worker drops the kept environment
    # just after that, so look once it has let go of the job.
    liveness.wait_released(sdir, second)
    assert env_files(repo) == [], f"A (killed) is {first}, B (handed A's slot) is {second}"


def test_the_spend_in_the_records_is_read_once_per_record_tip(cli, repo, monkeypatch):
    """Thousands of jobs: the charges are cached by record tip, so a second read opens no record."""
    from subtask.git import records
    from subtask.git.gitrepo import open_repo
    from subtask.ops.running import spending

    use_paid_engine(repo)
    jobs = [cli.start(f"cost=0.5 file=f{n}", "--max-usd", "1") for n in range(3)]
    cli.ok("wait", *jobs, timeout=60)
    first = spending.record_charges(open_repo(repo))
    assert sorted(c.job for c in first) == sorted(jobs) and all(c.charged == 0.5 for c in first)

    def no_reads(*args, **kwargs):
        raise AssertionError("a cached record was read again")

    monkeypatch.setattr(records, "read_commit", no_reads)
    assert sorted(spending.record_charges(open_repo(repo)), key=lambda c: c.rid) == sorted(first, key=lambda c: c.rid)


def test_a_job_that_ends_while_the_ledger_is_restored_is_not_left_open(cli, repo, monkeypatch):
    """The records were read while the job ran; it ended (closing nothing: no ledger) before the
    restore appended its reservation: the restore closes it from its final record."""
    from subtask.git.gitrepo import open_repo
    from subtask.model.dataclass import replace
    from subtask.ops.running import spending
    from subtask.state import ledger

    use_paid_engine(repo)
    cli.ok("wait", cli.start("cost=0.5", "--max-usd", "1"), timeout=60)
    shutil.rmtree(state_dir(repo))
    handle = open_repo(repo)
    stale = [replace(c, charged=None) for c in spending.record_charges(handle)]
    monkeypatch.setattr(spending, "record_charges", lambda _repo: stale)
    spending.sync_ledger(handle)
    spend = ledger.summary(handle.state_dir, 100.0)
    assert (spend.committed_usd, spend.open_usd) == (pytest.approx(0.5), 0.0), spend


def test_a_crash_at_any_step_leaves_no_kept_environment(cli, repo):
    """The kept environment and the task as written (both may hold secrets) go with their
    attempt, whatever step crashed."""
    import subprocess

    from test_admission import START_POINTS, WORKER_POINTS

    use_paid_engine(repo, maxRunning="20")
    procs = [subprocess.Popen(["git", "subtask", "start", "--max-usd", "1", f"file={point}.txt password=hunter2"],
                              cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, SUBTASK_FAULT=point, SECRET_TOKEN="s3cr3t-77"))
             for point in START_POINTS + WORKER_POINTS]
    started = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        if proc.returncode == 0:
            started.append(out.split()[0])
    assert len(started) == len(WORKER_POINTS)
    cli("wait", *started, timeout=60)
    cli.ok("list")
    assert env_files(repo) == []
    run = Path(git(repo, "rev-parse", "--absolute-git-dir")) / "subtask" / "run"
    assert sorted(p.name for p in run.glob("*.private.json")) == []
    check_books(cli, repo)
