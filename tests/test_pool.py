"""The pool of ready worktrees (subtask/git/pool.py): a job's start takes one and rewrites only
the files that differ from its base; a finished job's clean worktree comes back emptied of
everything git does not track; nothing a job left, in its files or in its git metadata, ever
reaches the next job; a filler killed half-way leaves nothing that is handed out; the pool's
disk stays under `subtask.poolMaxBytes`."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import Cli, git, make_repo, wait_until

from subtask.git.gitrepo import open_repo
from subtask.state import liveness
from subtask.worker import refill

POOL = Path(".subtask") / "worktrees" / ".pool"


@pytest.fixture
def repo(tmp_path) -> Path:
    made = make_repo(tmp_path / "repo", {"README.md": "hello\n", "src/app.py": "print('app')\n",
                                         ".gitignore": "*.log\nbuild/\n"})
    git(made, "config", "--unset", "subtask.pool")  # the default: a pool of 2
    return made


def worker_of(repo: Path, job: str) -> int:
    """The worker that ran the job's attempt (each event names it)."""
    events = (repo / ".git" / "subtask" / "run" / f"{job}.events.jsonl").read_text().splitlines()
    return json.loads(events[0])["worker"]


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def settle(repo: Path, job: str) -> None:
    """Return once the job's worker, and the pool refill it started, have exited."""
    worker = worker_of(repo, job)
    assert wait_until(lambda: gone(worker), timeout=120), f"{job}'s worker {worker} is still running"


def pooled(repo: Path) -> list[str]:
    folder = repo / POOL
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) if folder.exists() else []


def run_job(cli, repo: Path, task: str, *args: str, passes: bool = True) -> str:
    job = cli.start(task, *args, env={"SUBTASK_PHASES": str(repo.parent / "phases.jsonl")})
    assert cli("wait", job).returncode == (0 if passes else 1)
    settle(repo, job)
    return job


def took_from_pool(repo: Path, job: str) -> bool:
    """Did the job's worker take a pooled worktree? (Its phase marks say `pool`, else `register`.)"""
    for line in (repo.parent / "phases.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry["job"] == job:
            return "pool" in dict(entry["marks"])
    raise AssertionError(f"{job}: no phase marks")


def phase_took(repo: Path, job: str, name: str) -> float:
    """Seconds the worker's phase `name` took (from the mark before it; `SUBTASK_PHASES`)."""
    for line in (repo.parent / "phases.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry["job"] == job:
            marks = entry["marks"]
            at = [n for n, _ in marks].index(name)
            return marks[at][1] - marks[at - 1][1]
    raise AssertionError(f"{job}: no phase marks")


SNAPSHOT = ('s=$(git status --porcelain --ignored --untracked-files=all); h=$(git symbolic-ref HEAD); '
            'r=$(git rev-parse HEAD); l=$(find . -path ./.git -prune -o -type f -print | sort); '
            'printf "seen\\n%s\\n--\\n%s\\n--\\n%s\\n--\\n%s\\n" "$s" "$h" "$r" "$l" > seen.txt')


def seen(repo: Path, job: str) -> tuple[str, str, str, list[str]]:
    """What a SNAPSHOT job saw in its worktree: (status, HEAD's branch, HEAD, files)."""
    status, head, commit, files = git(repo, "show", f"subtask/{job}:seen.txt").removeprefix("seen\n").split("\n--\n")
    return status.strip(), head.strip(), commit.strip(), files.split()


def test_a_job_takes_a_pooled_worktree_at_its_base_with_a_clean_status(cli, repo):
    made = cli.json("pool", "fill", "1")
    assert made["count"] == 1 and len(made["made"]) == 1
    entry = made["made"][0]["name"]
    git(repo, "commit", "-q", "--allow-empty", "-m", "base moves on")
    (repo / "src" / "app.py").write_text("print('app 2')\n")
    git(repo, "commit", "-q", "-am", "a file differs from the pooled one")
    job = run_job(cli, repo, SNAPSHOT)
    assert took_from_pool(repo, job) and entry not in pooled(repo)
    status, head, commit, files = seen(repo, job)
    assert status == ""
    assert head == f"refs/heads/subtask/{job}"
    assert commit == git(repo, "rev-parse", "main")
    assert files == ["./.gitignore", "./README.md", "./src/app.py"]
    assert git(repo, "show", f"subtask/{job}:src/app.py") == "print('app 2')"
    phases = cli.json("show", job)
    assert phases["state"] == "done"
    assert len(pooled(repo)) == 2  # refilled in the background of the job, to subtask.pool (2)


def test_a_pooled_worktrees_index_trusts_every_file_so_the_jobs_first_status_reads_none_again(cli, repo):
    """A fill writes the files and then the index within one second, and git takes a file written
    in its index's second for "racily clean": the first status of the job that takes the entry,
    its autocommit's, would read every such file again (~10 ms at 2,000 files, on a short job's
    path). The filler settles the index itself, in the background: every file it holds was
    written in a second before the index's."""
    made = cli.json("pool", "fill", "1")
    entry = repo / POOL / made["made"][0]["name"]
    index = Path(git(entry, "rev-parse", "--path-format=absolute", "--git-path", "index"))
    tracked = git(entry, "ls-files").split()
    racy = [n for n in tracked if int((entry / n).lstat().st_mtime) >= int(index.stat().st_mtime)]
    assert tracked and racy == []


def test_a_jobs_untracked_and_ignored_files_never_reach_the_next_job_from_the_pool(cli, repo):
    git(repo, "config", "subtask.pool", "1")
    first = run_job(cli, repo, "echo secret > leak.log; mkdir -p build; echo bin > build/out; "
                               "mkdir -p empty/nested; echo kept > kept.txt")
    cli.ok("gc")  # the pool is emptied: the next entry must be the first job's worktree
    assert pooled(repo) == []
    cli.ok("cleanup", first)
    back = pooled(repo)
    assert len(back) == 1  # it came back
    leftovers = sorted(str(p.relative_to(repo / POOL / back[0])) for p in (repo / POOL / back[0]).rglob("*")
                       if ".git" not in p.parts)
    assert "leak.log" not in leftovers and not any(p.startswith(("build", "empty")) for p in leftovers)
    second = run_job(cli, repo, SNAPSHOT)
    assert took_from_pool(repo, second) and back[0] not in pooled(repo)  # the second job took it
    status, head, commit, files = seen(repo, second)
    assert status == "" and head == f"refs/heads/subtask/{second}" and commit == git(repo, "rev-parse", "main")
    assert files == ["./.gitignore", "./README.md", "./src/app.py"]  # not kept.txt (the first job's commit)


def test_what_worktreeinclude_brings_is_there_again_for_the_next_job(cli, repo):
    (repo / ".worktreeinclude").write_text("*.log\n")
    (repo / "local.log").write_text("the user's own\n")
    git(repo, "config", "subtask.pool", "1")
    first = run_job(cli, repo, "echo mine > local.log; echo other > other.log")
    cli.ok("gc")
    cli.ok("cleanup", first)
    assert len(pooled(repo)) == 1
    second = run_job(cli, repo, "cat local.log > copy.txt; ls *.log > logs.txt")
    assert took_from_pool(repo, second)
    assert git(repo, "show", f"subtask/{second}:copy.txt") == "the user's own"
    assert git(repo, "show", f"subtask/{second}:logs.txt") == "local.log"


def test_a_tracked_file_a_job_hid_from_git_is_never_pooled(cli, repo):
    """A job that changes a tracked file and tells git not to look (its index is its own to write)
    leaves a worktree git calls clean: the index is rebuilt and every file hashed before pooling."""
    git(repo, "config", "subtask.pool", "1")
    first = run_job(cli, repo, "git update-index --assume-unchanged README.md; echo planted > README.md; "
                               "git update-index --skip-worktree src/app.py; echo planted > src/app.py")
    cli.ok("gc")
    out = cli.ok("cleanup", first)
    assert "removed worktree" in out
    assert pooled(repo) == []
    assert not (repo / ".subtask" / "worktrees" / first).exists()
    second = run_job(cli, repo, SNAPSHOT)
    status, _, _, _ = seen(repo, second)
    assert status == ""
    assert git(repo, "show", f"subtask/{second}:README.md") == "hello"


@pytest.mark.parametrize("change", ["MERGE_HEAD", "HEAD"])
def test_a_worktree_whose_admin_files_its_job_changed_is_not_pooled(cli, repo, change):
    git(repo, "config", "subtask.pool", "1")
    write = ('git rev-parse HEAD > "$(git rev-parse --git-dir)/MERGE_HEAD"' if change == "MERGE_HEAD"
             else 'git checkout -q --detach')
    first = run_job(cli, repo, write, passes=change == "MERGE_HEAD")  # a moved HEAD fails its job
    cli.ok("gc")
    cli("cleanup", first)
    assert pooled(repo) == []
    second = run_job(cli, repo, SNAPSHOT)
    assert git(repo, "rev-list", "--count", f"main..subtask/{second}") == "1"  # no merge of the first job's


@pytest.mark.parametrize("damage", ["config.worktree", "HEAD", "gitdir", "extra", "no-index"])
def test_a_pooled_worktree_whose_admin_files_changed_is_discarded(cli, repo, damage):
    made = cli.json("pool", "fill", "1")["made"][0]
    admin = repo / ".git" / "worktrees" / made["name"]
    (Path(made["path"]) / "planted.log").write_text("seen by a job only if the entry was handed out\n")
    if damage == "config.worktree":
        (admin / "config.worktree").write_text("[core]\n\tfsmonitor = touch /tmp/pwned\n")
    elif damage == "HEAD":
        (admin / "HEAD").write_text("ref: refs/heads/main\n")
    elif damage == "gitdir":
        (admin / "gitdir").write_text(str(repo / ".git") + "\n")
    elif damage == "extra":
        (admin / "MERGE_HEAD").write_text(made["commit"] + "\n")
    else:
        (admin / "index").unlink()
    git(repo, "config", "subtask.pool", "0")  # no refill: the job's worktree is what we look at
    job = run_job(cli, repo, SNAPSHOT)
    assert pooled(repo) == [] and not admin.exists() and not Path(made["path"]).exists()  # discarded
    assert not took_from_pool(repo, job)
    assert not {"config.worktree", "MERGE_HEAD"} & set(os.listdir(repo / ".git" / "worktrees" / job))
    status, head, commit, files = seen(repo, job)
    assert status == "" and head == f"refs/heads/subtask/{job}" and commit == git(repo, "rev-parse", "main")
    assert files == ["./.gitignore", "./README.md", "./src/app.py"]  # not the planted file


def test_killing_a_worker_during_refill_leaves_no_half_made_entry_that_is_handed_out(cli, repo, tmp_path):
    gate, held = tmp_path / "gate", tmp_path / "held"
    job = cli.start(f"until [ -e {held} ]; do sleep 0.05; done",  # the job runs while its refill builds
                    env={"SUBTASK_FAULT_HOLD": f"pool_building:{gate}"})
    reached = Path(f"{gate}.reached")
    assert wait_until(lambda: reached.exists() and reached.read_text().strip(), timeout=120)
    filler = int(reached.read_text().split()[0])
    building = list((repo / POOL / ".building").iterdir())
    assert len(building) == 1  # registered, its files not written
    os.killpg(worker_of(repo, job), signal.SIGKILL)  # the worker (its refill has a group of its own)
    assert wait_until(lambda: gone(worker_of(repo, job)))
    assert wait_until(lambda: group_gone(filler))  # it dies with its worker (PR_SET_PDEATHSIG)
    held.touch()
    assert pooled(repo) == []
    git(repo, "config", "subtask.pool", "0")
    second = run_job(cli, repo, SNAPSHOT)  # a checkout of its own: nothing half-made is handed out
    status, _, _, files = seen(repo, second)
    assert status == "" and files == ["./.gitignore", "./README.md", "./src/app.py"]
    assert cli.json("pool")["debris"] == 1
    git(repo, "config", "subtask.pool", "1")
    after = cli.json("pool", "fill")
    assert after["count"] == 1 and after["debris"] == 0  # the next filler removed it
    assert not building[0].exists() and not (repo / ".git" / "worktrees" / building[0].name).exists()
    assert "prunable" not in git(repo, "worktree", "list", "--porcelain")


def test_wait_is_held_no_longer_than_the_refill_grace_and_nothing_of_the_refill_runs_after(cli, repo, tmp_path):
    """A refill still building when the job's work is done is given `refill.GRACE`, then ended
    with its whole process group before the run-lock goes: `wait` returns soon (the hold lasts
    60 s), nothing of the filler runs afterwards, and what it left is debris, never an entry."""
    gate = tmp_path / "gate"
    job = cli.start("true", env={"SUBTASK_FAULT_HOLD": f"pool_building:{gate}"})
    reached = Path(f"{gate}.reached")
    assert wait_until(lambda: reached.exists() and reached.read_text().strip(), timeout=120)
    filler = int(reached.read_text().split()[0])
    began = time.monotonic()
    assert cli("wait", job).returncode == 0
    assert time.monotonic() - began < 20  # not the hold's 60 s, nor wait's own 60 s for a wrap-up
    assert not liveness.is_held(open_repo(repo).state_dir, job)
    assert group_gone(filler)  # the filler and every git it ran: its own process group, ended
    gate.touch()  # a filler still alive would go on from here
    settle(repo, job)
    assert pooled(repo) == []
    git(repo, "config", "subtask.pool", "0")
    second = run_job(cli, repo, SNAPSHOT)
    assert not took_from_pool(repo, second)  # nothing half-made is handed out
    status, _, _, files = seen(repo, second)
    assert status == "" and files == ["./.gitignore", "./README.md", "./src/app.py"]
    git(repo, "config", "subtask.pool", "1")
    after = cli.json("pool", "fill")
    assert after["count"] == 1 and after["debris"] == 0  # the next filler removed what it left
    assert list((repo / POOL / ".building").iterdir()) == []
    assert "prunable" not in git(repo, "worktree", "list", "--porcelain")


def test_a_short_job_that_leaves_the_pool_a_ready_worktree_refills_nothing(cli, repo, tmp_path):
    """With a worktree still ready after its take, a job's refill waits `SUBTASK_REFILL_AFTER`
    seconds of its run before it begins; a job over sooner refills nothing, so no refill holds
    its `wait` nor writes files beside it (a refill that began would stop at the gate)."""
    assert cli.json("pool", "fill")["count"] == 2
    gate = tmp_path / "gate"
    job = cli.start("true", env={"SUBTASK_FAULT_HOLD": f"pool_building:{gate}", "SUBTASK_REFILL_AFTER": "600",
                                 "SUBTASK_PHASES": str(repo.parent / "phases.jsonl")})
    assert cli("wait", job).returncode == 0
    settle(repo, job)
    assert took_from_pool(repo, job)
    assert not Path(f"{gate}.reached").exists(), "a refill began beside a job that left the pool a worktree"
    assert len(pooled(repo)) == 1 and cli.json("pool")["debris"] == 0
    # Ended unbegun, at once: with the grace the phase lasts it whole (the refill sleeps on).
    assert phase_took(repo, job, "refill_ended") < refill.GRACE


def test_after_a_refill_ended_half_made_the_next_short_job_refills_nothing(cli, repo, tmp_path):
    """A refill ended at the grace leaves debris: refills do not fit this repository's short jobs
    (a slow disk, a big checkout), so the next job defers its refill even with the pool empty,
    rather than hold its `wait` for a refill that is ended again."""
    gate = tmp_path / "gate"
    first = cli.start("true", env={"SUBTASK_FAULT_HOLD": f"pool_building:{gate}"})
    assert cli("wait", first).returncode == 0  # its refill, held at the gate, ended at the grace
    settle(repo, first)
    assert pooled(repo) == [] and cli.json("pool")["debris"] == 1
    second_gate = tmp_path / "second-gate"
    second = cli.start("true", env={"SUBTASK_FAULT_HOLD": f"pool_building:{second_gate}",
                                    "SUBTASK_REFILL_AFTER": "600", "SUBTASK_PHASES": str(repo.parent / "phases.jsonl")})
    assert cli("wait", second).returncode == 0
    settle(repo, second)
    assert not Path(f"{second_gate}.reached").exists(), "a refill began beside a short job again"
    assert phase_took(repo, second, "refill_ended") < refill.GRACE


def test_a_job_that_runs_past_the_deferral_refills_the_pool_beside_it(cli, repo, tmp_path, control_dir):
    assert cli.json("pool", "fill")["count"] == 2
    held, engine = tmp_path / "held", control_dir / "engine"
    job = cli.start(f"touch {engine}; until [ -e {held} ]; do sleep 0.05; done", env={"SUBTASK_REFILL_AFTER": "0.2"})
    try:
        # Its engine runs once its worker took a pooled worktree ("running" is its starter's word,
        # said before: the pool still held both, and the test went on before the take).
        assert wait_until(engine.exists, timeout=120), "the job's engine never ran"
        assert wait_until(lambda: len(pooled(repo)) == 2, timeout=120), "the pool was not refilled beside the job"
    finally:
        held.touch()
    assert cli("wait", job).returncode == 0
    settle(repo, job)
    assert len(pooled(repo)) == 2 and cli.json("pool")["debris"] == 0


def test_a_stop_of_the_job_ends_its_refill_too(cli, repo, tmp_path):
    gate, held = tmp_path / "gate", tmp_path / "held"
    job = cli.start(f"until [ -e {held} ]; do sleep 0.05; done",
                    env={"SUBTASK_FAULT_HOLD": f"pool_building:{gate}"})
    reached = Path(f"{gate}.reached")
    assert wait_until(lambda: reached.exists() and reached.read_text().strip(), timeout=120)
    filler = int(reached.read_text().split()[0])
    cli.ok("stop", job)
    assert cli.json("show", job)["state"] == "stopped"
    assert not liveness.is_held(open_repo(repo).state_dir, job)
    assert group_gone(filler)  # nothing of the job runs once stop returns, its refill included
    assert pooled(repo) == []


def test_the_pools_disk_stays_under_pool_max_bytes(cli, repo):
    one = cli.json("pool", "fill", "1")["made"][0]["bytes"]
    cli.ok("gc")
    git(repo, "config", "subtask.poolMaxBytes", str(one * 2 + one // 2))
    status = cli.json("pool", "fill", "5")
    assert status["count"] == 2 and status["bytes"] <= status["max_bytes"]
    git(repo, "config", "subtask.poolMaxBytes", str(one // 2))
    assert cli.json("pool", "fill", "5")["made"] == []
    cli.ok("gc")
    assert cli.json("pool", "fill", "5")["count"] == 0  # not even one fits
    git(repo, "config", "subtask.poolMaxBytes", str(one * 2 + one // 2))
    git(repo, "config", "subtask.pool", "3")
    jobs = [run_job(cli, repo, f"echo {n} > f{n}.txt") for n in range(3)]
    for job in jobs:
        cli.ok("cleanup", job)  # each comes back only while it fits
    status = cli.json("pool")
    assert status["bytes"] <= status["max_bytes"] and status["count"] <= 2


def test_pool_shows_what_it_holds_and_gc_empties_it(cli, repo):
    assert cli.json("pool") == {"v": 1, "target": 2, "max_bytes": 2 << 30, "count": 0, "bytes": 0, "entries": [],
                                "debris": 0}
    text = cli.ok("pool", "fill")
    assert text.startswith("made 2 pooled worktrees at ") and "pool: 2 of 2 ready worktrees" in text
    status = cli.json("pool")
    assert status["count"] == 2 and status["bytes"] > 0
    assert {e["commit"] for e in status["entries"]} == {git(repo, "rev-parse", "HEAD")}
    assert cli.ok("pool", "fill").startswith("made 0 pooled worktrees")
    lines = cli.json("gc")["lines"]
    assert sum("removed the pooled worktree" in line for line in lines) == 2
    assert cli.json("pool")["count"] == 0 and pooled(repo) == []
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


@pytest.mark.parametrize("args", [["fill", "-1"], ["fill", "two"], ["fill", "1", "2"]])
def test_pool_fill_refuses_bad_input_and_makes_nothing(cli, repo, args):
    proc = cli("pool", *args)
    assert proc.returncode == 129, proc.stderr
    assert "Traceback" not in proc.stderr and pooled(repo) == []


def test_doctor_reports_the_pool(cli, repo):
    cli.ok("pool", "fill", "1")
    checks = {c["name"]: c for c in cli.json("doctor")["checks"]}
    assert checks["pool"]["status"] == "ok" and "1 of 2 ready" in checks["pool"]["message"]


def test_a_worker_stopped_while_it_moves_a_pooled_worktree_leaves_the_next_attempt_its_base(cli, repo, tmp_path):
    """Taken, not yet moved to the job's base (stopped at that moment, a file half-written as a
    killed `read-tree` leaves it): the reply's attempt still gets exactly its base, and `cleanup`
    of a job whose engine never ran removes such a worktree as it removes git's own half checkout."""
    cli.ok("pool", "fill", "1")
    (repo / "src" / "app.py").write_text("print('app 2')\n")
    git(repo, "commit", "-q", "-am", "the base moves on")
    gate = tmp_path / "gate"
    job = cli.start(SNAPSHOT, env={"SUBTASK_FAULT_HOLD": f"before_files_checkout:{gate}"})
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=60)
        cli.ok("stop", job)
    finally:
        gate.touch()
    worktree = repo / ".subtask" / "worktrees" / job
    assert (worktree / "src" / "app.py").read_text() == "print('app')\n"  # the pooled commit's files
    (worktree / "src" / "app.py").write_text("print('ap")  # as a killed read-tree leaves a file it was writing
    assert cli("reply", job, SNAPSHOT).returncode == 0
    cli.ok("wait", job)
    status, head, commit, files = seen(repo, job)
    assert status == "" and head == f"refs/heads/subtask/{job}" and commit == git(repo, "rev-parse", "main")
    assert git(repo, "show", f"subtask/{job}:src/app.py") == "print('app 2')"


def test_cleanup_removes_a_pooled_worktree_a_stopped_job_never_moved(cli, repo, tmp_path):
    cli.ok("pool", "fill", "1")
    (repo / "src" / "app.py").write_text("print('app 2')\n")
    git(repo, "commit", "-q", "-am", "the base moves on")
    gate = tmp_path / "gate"
    job = cli.start("echo never > never.txt", env={"SUBTASK_FAULT_HOLD": f"before_files_checkout:{gate}"})
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=60)
        cli.ok("stop", job)
    finally:
        gate.touch()
    out = cli.ok("cleanup", job)
    assert "removed worktree" in out, out
    assert not (repo / ".subtask" / "worktrees" / job).exists()


def test_mcp_start_many_and_map_take_pooled_worktrees(repo, monkeypatch):
    """The MCP server's `start_many` and `map` start their jobs as `start` does: each worker takes
    a pooled worktree while there is one."""
    import anyio
    from mcp import Client, StdioServerParameters
    from test_mcp import call, server_env

    git(repo, "config", "subtask.pool", "4")
    assert Cli(repo).json("pool", "fill")["count"] == 4
    env = dict(server_env(), SUBTASK_PHASES=str(repo.parent / "phases.jsonl"))
    params = StdioServerParameters(command=sys.executable, args=["-m", "subtask.faces.mcp_server"], cwd=str(repo),
                                   env=env)

    async def main() -> list[str]:
        async with Client(params, mode="legacy") as client:
            many = await call(client, "start_many", {"tasks": [{"task": "echo one > one.txt"},
                                                               {"task": "echo two > two.txt"}]})
            mapped = await call(client, "map", {"pattern": "src/*.py", "task": "echo '# seen' >> {files}"})
            ids = list(dict.fromkeys(re.findall(r"\bst-[0-9a-f]{8}\b", many + mapped)))
            await call(client, "wait", {"ids": ids})
            return ids

    ids = anyio.run(main)
    assert len(ids) == 3
    for job in ids:
        settle(repo, job)
        assert took_from_pool(repo, job), job


def blocked_on_worktree_lock(repo: Path) -> bool:
    inode = (repo / ".git" / "subtask" / "worktree.lock").stat().st_ino
    with open("/proc/locks") as fh:
        return any("->" in line and "FLOCK" in line and line.split()[-3].endswith(f":{inode}") for line in fh)


def test_a_filler_never_removes_an_entry_a_worker_is_taking(cli, repo, tmp_path):
    """Half-way through a take (its admin folder renamed, its folder not yet moved) an entry looks
    like debris; a filler clearing debris at that moment waits for the take instead of removing it."""
    import subprocess

    cli.ok("pool", "fill", "1")
    gate = tmp_path / "gate"
    job = cli.start(SNAPSHOT, env={"SUBTASK_FAULT_HOLD": f"pool_claiming:{gate}",
                                   "SUBTASK_PHASES": str(repo.parent / "phases.jsonl")})
    filler = None
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=60)
        filler = subprocess.Popen(["git", "subtask", "pool", "fill", "3"], cwd=repo, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        assert wait_until(lambda: blocked_on_worktree_lock(repo), timeout=60), "the filler did not wait for the take"
    finally:
        gate.touch()
        if filler is not None:
            filler.communicate(timeout=120)
    assert cli("wait", job).returncode == 0
    settle(repo, job)
    assert took_from_pool(repo, job)
    status, _, _, _ = seen(repo, job)
    assert status == ""


def test_a_reply_in_a_new_worktree_from_the_pool_starts_from_the_branch_not_the_base(cli, repo):
    """A job whose worktree is gone (cleaned up; a Ray node's attempt) gets a pooled one for its
    reply: at the branch's tip, never at the job's base (its files then looked deleted, and the
    autocommit recorded the deletion of the job's own work)."""
    job = run_job(cli, repo, "echo one > one.txt")
    cli.ok("cleanup", job)  # its worktree goes; its branch, not landed, stays
    assert not (repo / ".subtask" / "worktrees" / job).exists()
    cli.ok("pool", "fill", "1")  # an entry at the job's base
    cli.ok("reply", job, SNAPSHOT)
    assert cli("wait", job).returncode == 0
    settle(repo, job)
    status, head, commit, files = seen(repo, job)
    assert status == "" and "./one.txt" in files
    assert git(repo, "show", f"subtask/{job}:one.txt") == "one"
