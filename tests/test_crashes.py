"""Dead workers and half-written records: what a kill -9 or a stale lock leaves, and who repairs it.

Every job here is held by a file the test creates (never a sleep), and every test releases what it
holds in a `finally`, so a failing test leaves no worker or engine running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import gate_folder, git, host_pid, wait_until

from subtask.git.gitrepo import open_repo
from subtask.ops.running import lifecycle
from subtask.proc import procs
from subtask.state import liveness


def state_dir(repo: Path) -> Path:
    return Path(git(repo, "rev-parse", "--absolute-git-dir")) / "subtask"


def pids_of(repo: Path, job: str) -> dict:
    return lifecycle.read_pids(state_dir(repo), job)


def live_members(pgid: int) -> list[int]:
    """Pids in process group `pgid` that are not zombies (read from /proc)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


def kill_group_quietly(pgid: int | None) -> None:
    if pgid and pgid > 1:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


HOLD = "while [ ! -e '{go}' ]; do sleep 0.05; done"


def use_sh_command_engine(repo: Path) -> None:
    """A `command` engine that runs its task with sh (no shell engine code involved)."""
    git(repo, "config", "subtask.engine.sh.command", json.dumps(["sh", "-c", "{task}"]))


# ---------------------------------------------------------------- item 4: an engine never outlives its worker

@pytest.mark.parametrize("engine", ["shell", "command"])
def test_a_killed_workers_engine_group_ends_before_its_slot_is_freed(cli, repo, engine):
    """maxRunning=1; kill -9 A's worker while A's engine waits on a file: A's whole engine group
    is gone by the time the next command has settled A, so B never runs beside it and A's commit
    never lands after A was recorded failed."""
    git(repo, "config", "subtask.maxRunning", "1")
    if engine == "command":
        use_sh_command_engine(repo)
    go = gate_folder(repo) / "go"
    token = f"grandchild-{repo.parent.name}"
    # A background member of the engine's group, so "the leader died" is not enough.
    task = (f"sh -c \"trap '' TERM; sleep 60; :\" {token} & "
            f"{HOLD.format(go=go)}; echo A > fa; git add fa; git commit -qm A")
    args = ["--engine", "sh"] if engine == "command" else []
    a = cli.start(task, *args)
    engine_pgid = None
    try:
        host_pid(token)
        assert wait_until(lambda: "engine" in pids_of(repo, a), timeout=20)
        pids = pids_of(repo, a)
        engine_pgid = pids["engine"]
        os.kill(pids["worker"], signal.SIGKILL)
        # The parent-death signal ends the engine's leader with no command run at all.
        assert wait_until(lambda: not alive(engine_pgid), timeout=30), "the engine outlived its worker"
        rows = {r["id"]: r for r in cli.json("list")["jobs"]}
        assert rows[a]["state"] == "failed"
        # ... and the command that settled A ended the rest of its group before freeing the slot.
        assert live_members(engine_pgid) == [], "a member of the dead worker's engine group still runs"
        go.touch()
        b = cli.start("echo B > fb")
        assert cli("wait", b, timeout=30).returncode == 0
        time.sleep(0.3)
        log = git(repo, "log", "--format=%s", f"subtask/{a}")
        assert "A" not in log.splitlines(), "A's engine committed after A was recorded failed"
        assert cli("stop", a).returncode == 1
    finally:
        go.touch()
        kill_group_quietly(engine_pgid)


def test_a_killed_workers_verify_group_ends_when_the_job_is_settled(cli, repo):
    """kill -9 the worker while verify runs: the parent-death signal ends verify's leader only;
    the command that settles the job ends the rest of verify's process group (a test server a
    suite started, say) as it does the engine's."""
    go = gate_folder(repo) / "go"
    token = f"verify-member-{repo.parent.name}"
    verify = f"sh -c \"trap '' TERM; sleep 60; :\" {token} & {HOLD.format(go=go)}"
    a = cli.start("echo A > fa", "--verify", verify)
    member = None
    try:
        member = host_pid(token)
        os.kill(pids_of(repo, a)["worker"], signal.SIGKILL)
        assert wait_until(lambda: not liveness.is_held(state_dir(repo), a), timeout=60)
        assert cli.json("list")["jobs"][0]["state"] == "failed"
        assert not alive(member), "a member of the dead worker's verify group still runs"
    finally:
        go.touch()
        if member and alive(member):
            os.kill(member, signal.SIGKILL)


def test_the_reaper_never_signals_a_reused_process_group(cli, repo, tmp_path):
    """A recorded engine pgid that now names an unrelated process (pid reuse) is left alone."""
    go = gate_folder(repo) / "go"
    # The stranger starts before the job, so its start time (in clock ticks of 10 ms) is provably
    # not the engine's: started together, they can share a tick, and then it passes for the engine.
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        a = cli.start(HOLD.format(go=go))
        assert wait_until(lambda: "engine" in pids_of(repo, a), timeout=30)
        pids = pids_of(repo, a)
        assert procs.start_time(stranger.pid) != pids["engine_started"]
        os.kill(pids["worker"], signal.SIGKILL)
        assert wait_until(lambda: not alive(pids["engine"]), timeout=30)
        # Pretend the engine's pid was reused by `stranger`: the record says pgid X, X is alive.
        path = Path(lifecycle.engine_file(state_dir(repo), a))
        recorded = json.loads(path.read_text())
        recorded["engine"] = stranger.pid
        path.write_text(json.dumps(recorded))
        assert cli.json("list")["jobs"][0]["state"] == "failed"
        assert stranger.poll() is None, "the reaper killed a process group that was not the engine's"
    finally:
        go.touch()
        stranger.kill()
        stranger.wait()


SPAWN_AND_DIE = r"""
import os, sys, threading
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from subtask.proc import procs
mode, marker = sys.argv[2], sys.argv[3]

def spawn():
    if mode == "procs":
        procs.run(["sh", "-c", f"echo $$ > {marker}; exec sleep 60"], cwd=".", timeout=120)
    else:  # the path the claude engine takes: the SDK's anyio.open_process of our launcher script
        import anyio
        from types import SimpleNamespace
        from subtask.engines import claude
        launch = claude._Launch(SimpleNamespace(job_id="t", private_dir=Path(marker).parent), "sh")  # not /tmp
        async def main():
            proc = await anyio.open_process([str(launch.script), "-c", f"echo $$ > {marker}; exec sleep 60"])
            await proc.wait()
        anyio.run(main)

spawn()
"""


@pytest.mark.parametrize("mode", ["procs", "claude_transport"])
def test_an_engine_child_dies_with_the_process_that_spawned_it(tmp_path, mode):
    """The child setup (PR_SET_PDEATHSIG) on both spawn paths engines use: procs.run (shell,
    command, codex) and the claude SDK's open_process of the launcher its `cli_path` names."""
    marker = tmp_path / "child.pid"
    src = str(Path(__file__).resolve().parents[1])
    parent = subprocess.Popen([sys.executable, "-c", SPAWN_AND_DIE, src, mode, str(marker)])
    child = None
    try:
        assert wait_until(lambda: marker.exists() and marker.read_text().strip(), timeout=60)
        child = int(marker.read_text())
        assert alive(child)
        parent.kill()
        parent.wait()
        assert wait_until(lambda: not alive(child), timeout=30), "the child outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        if child:
            kill_group_quietly(child)


# ---------------------------------------------------------------- item 5: a kill right after the final record

def doctor_check(cli, name: str) -> dict:
    return next(c for c in json.loads(cli("doctor", "--json").stdout)["checks"] if c["name"] == name)


def test_a_kill_right_after_the_final_record_loses_no_pin_and_no_note(cli, repo):
    """The worker dies between its final record and its note: the head pin is already there (it
    is written first), doctor names the missing note, the next command writes it, and after a
    squash merge and `git gc --prune=now` the job's commit is still in the repository."""
    job = cli.start("echo x > x.txt; git add x.txt; git commit -qm 'job commit'",
                    env={"SUBTASK_FAULT": "after_final_record"})
    assert wait_until(lambda: not liveness.is_held(state_dir(repo), job), timeout=60)
    assert cli.json("show", job)["state"] == "done"
    head = git(repo, "rev-parse", f"subtask/{job}")
    assert git(repo, "rev-parse", "--verify", "-q", f"refs/subtask/{job}/head", check=False) == head, \
        "the head pin must be written no later than the terminal record"
    check = doctor_check(cli, "records")
    assert check["status"] == "warn" and job in check["message"], check
    cli.ok("list")  # any command repairs it
    assert f"subtask {job}" in git(repo, "notes", "--ref=subtask", "show", head)
    assert doctor_check(cli, "records")["status"] == "ok"
    cli.ok("list")  # idempotent: a second repair changes nothing
    assert git(repo, "notes", "--ref=subtask", "show", head).count(f"subtask {job}") == 1
    cli.ok("merge", "--squash", job)
    git(repo, "gc", "--prune=now", "--quiet")
    assert git(repo, "cat-file", "-t", head) == "commit", "the job's commit was lost"
    assert head[:7] in cli.ok("show", job)


def test_a_kill_right_after_the_final_record_leaves_no_kept_environment(cli, repo):
    """The starter's environment (it may hold credentials) ends with the attempt even when the
    worker dies between its final record and dropping it: whoever settles the job drops it."""
    job = cli.start("true", env={"SUBTASK_FAULT": "after_final_record", "SOME_TOKEN": "tok-1234567890"})
    assert wait_until(lambda: not liveness.is_held(state_dir(repo), job), timeout=60)
    assert cli.json("show", job)["state"] == "done"
    cli.ok("list")  # settles the dead worker's job
    assert not (state_dir(repo) / "run" / f"{job}.env.json").exists(), "the job's kept environment outlived it"


# ---------------------------------------------------------------- item 6: a stale record.lock

def record_lock(repo: Path, job: str) -> Path:
    return (repo / git(repo, "rev-parse", "--git-common-dir")).resolve() / "refs" / "subtask" / job / "record.lock"


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_stale_record_lock_left_while_a_job_runs_does_not_stop_it_ending(cli, repo):
    """What a kill -9 inside a ref update leaves: the worker waits the lock out, removes it once it
    is stale, and records its successful end (not `failed`, not `running` forever)."""
    git(repo, "config", "subtask.refLockStale", "1")
    go = gate_folder(repo) / "go"
    job = cli.start(f"{HOLD.format(go=go)}; echo ok")
    lock = record_lock(repo, job)
    try:
        assert wait_until(lambda: "engine" in pids_of(repo, job), timeout=60)
        lock.touch()
        go.touch()
        waited = cli("wait", job, "--timeout", "60", timeout=120)
        assert waited.returncode == 0, waited.stdout + waited.stderr
        assert cli.json("show", job)["state"] == "done"
        assert not lock.exists()
        assert "Traceback" not in (state_dir(repo) / "logs" / f"{job}.log").read_text()
    finally:
        go.touch()
        lock.unlink(missing_ok=True)


def test_a_dead_workers_record_behind_a_ref_lock_keeps_its_slot_until_it_is_settled(cli, repo):
    """The worker dies while its record's ref lock is held. The next command cannot settle it yet
    (the lock is young): it keeps the slot. Once the lock is stale, the next command removes it and
    settles the job, `wait` returns, doctor reported what was wrong meanwhile."""
    git(repo, "config", "subtask.maxRunning", "1")
    # "young" for as long as the test needs it (a loaded machine took >10 s, the default); the
    # test then ages the lock past this on purpose
    git(repo, "config", "subtask.refLockStale", "3600")
    go = gate_folder(repo) / "go"
    job = cli.start(HOLD.format(go=go))
    lock = record_lock(repo, job)
    try:
        assert wait_until(lambda: "engine" in pids_of(repo, job), timeout=60)
        lock.touch()
        os.kill(pids_of(repo, job)["worker"], signal.SIGKILL)
        assert wait_until(lambda: not liveness.is_held(state_dir(repo), job), timeout=30)
        listed = cli("list")
        assert "Traceback" not in listed.stderr
        assert cli.json("show", job)["state"] == "running"
        slots = json.loads((state_dir(repo) / "slots.json").read_text())
        assert [e["job"] for e in slots["running"]] == [job], "the slot was freed before the record was settled"
        queued = cli.start("echo next")
        assert cli.json("show", queued)["position"] == 1
        age(lock, 7200)
        check = doctor_check(cli, "records")
        assert check["status"] == "warn" and "stale ref lock" in check["message"], check
        waited = cli("wait", job, "--timeout", "60", timeout=120)
        assert waited.returncode == 1 and f"{job} failed" in waited.stdout, waited.stdout + waited.stderr
        assert not lock.exists()
        assert cli("wait", queued, "--timeout", "60", timeout=120).returncode == 0
        assert doctor_check(cli, "records")["status"] == "ok"
    finally:
        go.touch()
        lock.unlink(missing_ok=True)


def test_wait_settles_a_running_record_that_no_slot_and_no_worker_holds(cli, repo):
    """A record left `running` with no slot entry and no run-lock (what the old "could not settle
    yet freed the slot" left): `wait` settles it instead of waiting forever, doctor names it."""
    go = gate_folder(repo) / "go"
    job = cli.start(HOLD.format(go=go))
    try:
        assert wait_until(lambda: "engine" in pids_of(repo, job), timeout=60)
        pids = pids_of(repo, job)
        os.kill(pids["worker"], signal.SIGKILL)
        assert wait_until(lambda: not liveness.is_held(state_dir(repo), job), timeout=30)
        (state_dir(repo) / "slots.json").write_text(json.dumps({"v": 1, "running": [], "queue": []}))
        check = doctor_check(cli, "records")
        assert check["status"] == "warn" and job in check["message"] and "no live worker" in check["message"], check
        waited = cli("wait", job, "--timeout", "60", timeout=120)
        assert waited.returncode == 1 and f"{job} failed" in waited.stdout, waited.stdout + waited.stderr
        assert live_members(pids["engine"]) == []
    finally:
        go.touch()


# ---------------------------------------------------------------- test gaps: stop's group kill, the record's CAS

def test_stop_kills_the_engines_whole_process_group_not_only_its_leader(repo, tmp_path):
    """`lifecycle.stop_running` against a worker and an engine that both ignore SIGTERM (so no
    worker cleanup can stand in for it): after the grace, every member of the engine's group is
    gone, not only the pid recorded for it."""
    from subtask.git.gitrepo import open_repo
    from subtask.ops.running import lifecycle

    handle = open_repo(repo)
    job = "st-0000abcd"
    member_file = tmp_path / "member.pid"
    fd = liveness.acquire(handle.state_dir, job)
    worker = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 60"], pass_fds=(fd,),
                              start_new_session=True)
    liveness.disown(fd)
    os.close(fd)  # the fake worker holds the run-lock now (closing is not unlocking)
    engine = subprocess.Popen(["sh", "-c", f"trap '' TERM; sleep 60 & echo $! > '{member_file}'; wait"],
                              start_new_session=True)
    member = None
    try:
        assert wait_until(lambda: member_file.exists() and member_file.read_text().strip(), timeout=30)
        member = int(member_file.read_text())
        lifecycle.record_pid(handle.state_dir, job, worker=worker.pid, engine=engine.pid)
        assert liveness.is_held(handle.state_dir, job)
        lifecycle.stop_running(handle, job, grace=0.3)
        assert not liveness.is_held(handle.state_dir, job)
        assert wait_until(lambda: not alive(member), timeout=30), "stop left a member of the engine's group running"
    finally:
        for proc in (worker, engine):
            kill_group_quietly(proc.pid)
            proc.wait()
        if member:
            try:
                os.kill(member, signal.SIGKILL)
            except OSError:
                pass


RACE_UPDATES = r"""
import sys, time
from pathlib import Path
from subtask.git import records
from subtask.git.gitrepo import open_repo
repo, job, tag, n, go = open_repo(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), Path(sys.argv[5])
while not go.exists():
    time.sleep(0.005)
for i in range(n):
    records.update(repo, job, lambda j, i=i: setattr(j, "summary", j.summary + f"{tag}-{i}\n"))
"""


@pytest.mark.stress
def test_concurrent_record_updates_lose_nothing(cli, repo, tmp_path):
    """Four processes append to one record 25 times each, all at once: every change is there once
    (an update written without its compare-and-swap loses some)."""
    job = cli.start("true")
    cli.ok("wait", job)
    go = tmp_path / "go"
    writers = [subprocess.Popen([sys.executable, "-c", RACE_UPDATES, str(repo), job, f"w{n}", "25", str(go)],
                                stderr=subprocess.PIPE, text=True) for n in range(4)]
    try:
        time.sleep(0.3)  # let every writer reach the barrier; it only widens the race
        go.touch()
        for writer in writers:
            assert writer.wait(timeout=60) == 0, writer.stderr.read()
    finally:
        for writer in writers:
            writer.kill()
            writer.wait()
    summary = git(repo, "show", f"refs/subtask/{job}/record:summary.md")
    lines = [line for line in summary.splitlines() if line.startswith("w")]
    expected = {f"w{n}-{i}" for n in range(4) for i in range(25)}
    assert len(lines) == len(expected) and set(lines) == expected, f"{len(expected - set(lines))} updates were lost"


INTERRUPTED_SPAWN = r"""
import os, signal, sys, threading, time
from subtask.proc import procs
marker = sys.argv[1]
real_setup = procs.child_setup_for

def slow_setup(parent_pid):
    setup = real_setup(parent_pid)
    def child():
        setup()
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(2.0)  # the parent is interrupted inside Popen, waiting for this exec; the stop is deferred till then
    return child

def interrupt_once_the_child_exists():  # an event, not a delay: a loaded machine may take any time to fork
    while not os.path.exists(marker):
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGINT)

procs.child_setup_for = slow_setup
# Python leaves SIGINT ignored when it starts with it ignored (a background job of a shell without
# job control, as some CI runners start us): Ctrl-C must raise KeyboardInterrupt here.
signal.signal(signal.SIGINT, signal.default_int_handler)
threading.Thread(target=interrupt_once_the_child_exists, daemon=True).start()
try:
    procs.run(["sh", "-c", "exec sleep 60"], cwd=".", timeout=120, kill_grace=0.5)
except KeyboardInterrupt:
    pass
time.sleep(120)  # stay alive (the test kills us): the parent-death signal must not be what ends the child
"""


def test_an_interrupt_during_the_spawn_never_loses_the_child(tmp_path):
    """`stop` (SIGTERM, a KeyboardInterrupt in the worker) landing while `subprocess.Popen` is still
    waiting for the child's exec: the child is ended with its group, not left running unseen."""
    marker = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", INTERRUPTED_SPAWN, str(marker)])
    child = None
    try:
        assert wait_until(lambda: marker.exists() and marker.read_text().strip(), timeout=60)
        child = int(marker.read_text())
        assert wait_until(lambda: not alive(child), timeout=30), "the interrupted spawn left its child running"
    finally:
        parent.kill()
        parent.wait()
        if child:
            kill_group_quietly(child)


def test_the_starter_recording_its_worker_never_drops_the_engine_the_worker_recorded(cli, repo, tmp_path):
    """Seen beside a CPU hog: the starter read the pid file, the worker then recorded its engine,
    and the starter's write of the worker's pid dropped it, so `stop` and the reaper of a dead
    worker could no longer find the engine's process group."""
    gate = tmp_path / "gate"  # the starter waits, having read the pid file, until this exists
    sdir = open_repo(repo).state_dir
    starter = subprocess.Popen(["git", "subtask", "start", "sleep 60"], cwd=repo, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "SUBTASK_FAULT_HOLD": f"recording_worker_pid:{gate}"})
    job = None
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=60), starter.stderr
        job = next(sdir.joinpath("run").glob("*.lock")).stem
        assert wait_until(lambda: "engine" in lifecycle.read_pids(sdir, job), timeout=60)
        engine = lifecycle.read_pids(sdir, job)["engine"]
        gate.touch()
        out, err = starter.communicate(timeout=60)
        assert starter.returncode == 0, err
        assert lifecycle.read_pids(sdir, job).get("engine") == engine, "the engine's pid was lost"
        cli.ok("stop", job)
        assert wait_until(lambda: not procs._group_exists(engine), timeout=30), "stop left the engine running"
    finally:
        gate.touch()
        if starter.poll() is None:
            starter.kill()
        if job:
            cli("stop", job)


def test_a_job_stopped_during_its_checkout_is_cleaned_up(cli, repo, tmp_path):
    """Stopped after its worktree was registered, before git wrote its files: its folder reads as
    every file deleted, yet no engine of it ever ran, so `cleanup` removes it (and a stop that
    lands during `git worktree add` waits for the registration to finish)."""
    gate = tmp_path / "gate"
    job = cli.start("echo never > never.txt", env={"SUBTASK_FAULT_HOLD": f"before_files_checkout:{gate}"})
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=60)
        cli.ok("stop", job)
    finally:
        gate.touch()
    assert cli.json("show", job)["state"] == "stopped"
    out = cli.ok("cleanup", job)
    assert "removed worktree" in out, out
    assert not (repo / ".subtask" / "worktrees" / job).exists()
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


@pytest.mark.parametrize("command,edits", [("cleanup", "edited"), ("cleanup", "added"), ("gc", "edited+added")])
def test_a_person_s_edits_in_the_worktree_of_a_job_whose_engine_never_ran_are_kept(cli, repo, command, edits):
    """The other side of the rule above: a job that failed at its setup never ran an engine, but
    its checkout is whole and a person may work in it. Their edit and their new file are kept,
    with the usual words (the worktree used to be removed with --force, edits and all)."""
    git(repo, "config", "subtask.setup", "exit 3")
    job = cli.start("echo never > never.txt")
    cli("wait", job, timeout=60)
    attempt = cli.json("show", job)["state_detail"]["attempts"][-1]
    assert attempt["state"] == "failed" and attempt["engine_started_at"] is None, attempt
    worktree = repo / ".subtask" / "worktrees" / job
    mine = {name: f"{name} by a person\n" for name, kind in (("README.md", "edited"), ("notes.txt", "added"))
            if kind in edits}
    for name, text in mine.items():
        (worktree / name).write_text(text)
    proc = cli(command, *([job] if command == "cleanup" else ["--older-than", "0s"]))
    said = proc.stdout + proc.stderr
    assert "removed worktree" not in said and "uncommitted changes or untracked files" in said, said
    if command == "cleanup":
        assert proc.returncode == 1 and "keeping the worktree" in proc.stderr, said
    for name, text in mine.items():
        assert (worktree / name).read_text() == text


@pytest.mark.parametrize("written", ["as_git_wrote_it", "changed_by_a_person"])
def test_a_checkout_stopped_half_way_goes_unless_a_file_in_it_differs_from_git_s(cli, repo, tmp_path, written):
    """A checkout stopped while git wrote its files (no index yet: git writes it last) reads as
    every file deleted and the files written so far untracked: those are git's own, so the
    worktree goes; a file that is not what git would have written there is a person's, and stays."""
    gate = tmp_path / "gate"
    job = cli.start("echo never > never.txt", env={"SUBTASK_FAULT_HOLD": f"before_files_checkout:{gate}"})
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=60)
        cli.ok("stop", job)
    finally:
        gate.touch()
    worktree = repo / ".subtask" / "worktrees" / job
    assert not (repo / ".git" / "worktrees" / job / "index").exists()
    text = "hello\n" if written == "as_git_wrote_it" else "hello, from a person\n"
    (worktree / "README.md").write_text(text)  # the one file git wrote before the stop, or a person's
    proc = cli("cleanup", job)
    if written == "as_git_wrote_it":
        assert proc.returncode == 0 and "removed worktree" in proc.stdout, proc.stdout + proc.stderr
        assert not worktree.exists()
    else:
        assert proc.returncode == 1 and "keeping the worktree" in proc.stderr, proc.stdout + proc.stderr
        assert (worktree / "README.md").read_text() == text


def test_a_job_whose_engine_ran_keeps_a_worktree_that_reads_as_changed(cli, repo):
    """The other side of the rule above: once an engine ran, a worktree git sees changed in (here
    its index is gone, so every file reads deleted) is kept, whatever made it so."""
    job = cli.start("echo work > work.txt")
    cli("wait", job)
    (repo / ".git" / "worktrees" / job / "index").unlink()
    proc = cli("cleanup", job)
    assert proc.returncode == 1 and "keeping the worktree" in proc.stderr, proc.stderr
    assert (repo / ".subtask" / "worktrees" / job / "work.txt").exists()
