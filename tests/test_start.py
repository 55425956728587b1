"""`git subtask start`: what it creates, and that bad input changes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Cli, git, make_repo, refs, wait_until


def snapshot(repo: Path) -> dict:
    """Everything start could leave behind: refs, worktrees, slots, ledger."""
    state = Path(git(repo, "rev-parse", "--git-common-dir"))
    state = (repo / state if not state.is_absolute() else state) / "subtask"
    slots = (state / "slots.json").read_text() if (state / "slots.json").exists() else ""
    import json

    running = json.loads(slots)["running"] + json.loads(slots)["queue"] if slots else []
    return {
        "refs": sorted(r for r in refs(repo) if "subtask" in r and not r.startswith("refs/notes")),
        "worktrees": git(repo, "worktree", "list").count("\n"),
        "slots": running,
        "ledger": (state / "ledger.jsonl").read_text() if (state / "ledger.jsonl").exists() else "",
    }


def test_start_creates_branch_pin_record_and_worktree(cli, repo):
    out = cli.ok("start", "--verify", "test -f hello.txt", "echo hi > hello.txt")
    job_id, state, *_ = out.split()
    assert state == "running"
    assert f"branch subtask/{job_id}" in out
    assert f"refs/heads/subtask/{job_id}" in refs(repo)
    assert f"refs/subtask/{job_id}/base" in refs(repo)
    assert f"refs/subtask/{job_id}/record" in refs(repo)
    cli.ok("wait", job_id)
    worktree = repo / ".subtask" / "worktrees" / job_id
    assert (worktree / "hello.txt").read_text() == "hi\n"
    assert git(repo, "status", "--porcelain") == "", "the worktree folder must be excluded from the main checkout"
    assert "/.subtask/" in (repo / ".git" / "info" / "exclude").read_text()
    # the record is a commit chain whose subject is the status
    subjects = git(repo, "log", "--format=%s", f"refs/subtask/{job_id}/record").splitlines()
    assert subjects[0].startswith(f"{job_id} done · verify passed")
    assert any(" queued" in s or " running" in s for s in subjects[1:])


def test_start_from_detached_head_and_other_base(cli, repo):
    git(repo, "commit", "-q", "--allow-empty", "-m", "second")
    first = git(repo, "rev-parse", "HEAD~1")
    git(repo, "checkout", "-q", "--detach", "HEAD")
    job = cli.start("true")
    cli.ok("wait", job)
    assert cli.json("show", job)["spec"]["base"] == git(repo, "rev-parse", "HEAD")
    job2 = cli.start("true", "--base", first)
    assert cli.json("show", job2)["spec"]["base"] == first


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["start", "--engine", "nope", "true"], 129, "unknown engine 'nope'"),
        (["start", ""], 129, "the task is empty"),
        (["start", "   \n"], 129, "the task is empty"),
        (["start", "--base", "no-such-branch", "true"], 128, "unknown revision 'no-such-branch'"),
        (["start", "--verify-timeout", "0", "true"], 129, "--verify-timeout must be a positive finite"),
        (["start", "--verify-timeout", "inf", "true"], 129, "--verify-timeout must be a positive finite"),
        (["start", "--verify-timeout", "nan", "true"], 129, "--verify-timeout must be a positive finite"),
        (["start", "--timeout", "-1", "true"], 129, "--timeout must be a positive finite"),
        (["start", "--verify-timeout", "abc", "true"], 129, "is not a valid float"),
        (["start"], 129, "Missing argument"),
        (["show", "st-../x"], 129, "not a job id"),
        (["show", "st-1a2b/c"], 129, "not a job id"),
        (["show", "../etc"], 129, "not a job id"),
        (["show", "st-1a2b3c4d\n"], 129, "not a job id"),
        (["show", "st-ffffffff"], 128, "no job matches"),
        (["nonsense"], 129, "No such command"),
    ],
)
def test_bad_input_gets_a_clear_message_and_git_exit_code_and_changes_nothing(cli, repo, args, code, words):
    before = snapshot(repo)
    proc = cli(*args)
    assert proc.returncode == code, proc.stderr
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr
    assert snapshot(repo) == before


def test_two_mib_task_is_refused(cli, repo):
    before = snapshot(repo)
    proc = cli("start", "-", input="x" * (2 * 1024 * 1024))
    assert proc.returncode == 129
    assert "the limit is 1,048,576" in proc.stderr
    assert snapshot(repo) == before


def test_not_a_git_repository(tmp_path):
    proc = Cli(tmp_path)("start", "true")
    assert proc.returncode == 128
    assert "not a git repository" in proc.stderr


def test_bare_repository_is_refused(tmp_path, repo):
    bare = tmp_path / "bare.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    proc = Cli(bare)("start", "--engine", "shell", "true")
    assert proc.returncode == 128
    assert "bare repository" in proc.stderr
    assert refs(bare, "refs/subtask") == []


def test_ambiguous_prefix_lists_the_candidates(cli, repo):
    ids = {cli.start("true") for _ in range(3)}  # any two share the prefix "st-"
    by_first = {}
    for job in ids:
        by_first.setdefault(job[:4], []).append(job)
    prefix = "st-"
    proc = cli("show", prefix)
    assert proc.returncode == 129
    assert "ambiguous" in proc.stderr
    assert sorted(ids)[0] in proc.stderr
    unique = sorted(ids)[0][:9]
    matching = [j for j in ids if j.startswith(unique)]
    if len(matching) == 1:
        assert cli.json("show", unique)["id"] == matching[0]


def test_repository_path_with_spaces_and_non_ascii(tmp_path):
    repo = make_repo(tmp_path / "my répo with spaces", {"dossier été/naïve file.txt": "x\n"})
    cli = Cli(repo)
    job = cli.start("printf 'é\\n' > 'fichier über.txt'", "--verify", "test -f 'fichier über.txt'")
    out = cli.ok("wait", job)
    assert "done · verify passed" in out
    files = [f["path"] for f in cli.json("show", job)["evidence"]["files"]]
    assert files == ["fichier über.txt"]


def test_missing_verify_binary_fails_verify_with_exit_127(cli, repo):
    job = cli.start("true", "--verify", "no-such-binary-xyz --flag")
    proc = cli("wait", job)
    assert proc.returncode == 1
    assert "done · verify failed" in proc.stdout
    verify = cli.json("show", job)["state_detail"]["attempts"][0]["verify"]
    assert verify["exit_code"] == 127
    assert "not found" in verify["output_tail"]


@pytest.mark.parametrize("point", ["after_admit", "after_branch", "after_record", "before_spawn"])
def test_failure_at_each_start_step_undoes_every_earlier_step(cli, repo, point, monkeypatch):
    """An exception at each step (injected in process) leaves nothing behind."""
    from subtask import api
    from subtask.model import faults

    before = snapshot(repo)

    def explode(name):
        if name == point:
            raise RuntimeError(f"injected at {name}")

    monkeypatch.setattr(faults, "point", explode)
    monkeypatch.chdir(repo)
    with pytest.raises(RuntimeError):
        api.start(api.repo_at(repo), api.StartRequest(task="true", engine="shell"))
    assert snapshot(repo) == before
    assert list((Path(git(repo, "rev-parse", "--absolute-git-dir")) / "subtask" / "run").glob("*.lock")) == []


def test_a_starting_jobs_branch_never_exists_without_its_record(cli, repo, tmp_path):
    """The branch, the base pin, the record and its ownership ref are one ref transaction: whoever
    looks while a start is under way (a teammate's fetch, `gc`, a crash) sees all of them or none."""
    gate = tmp_path / "gate"
    proc = subprocess.Popen([sys.executable, "-m", "subtask", "start", "--engine", "shell", "true"], cwd=repo,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, SUBTASK_FAULT_HOLD=f"after_branch:{gate}"))
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=60), "start never reached after_branch"
        branches = git(repo, "for-each-ref", "--format=%(refname)", "refs/heads/subtask/").split()
        assert len(branches) == 1
        job = branches[0].rpartition("/")[2]
        made = set(git(repo, "for-each-ref", "--format=%(refname)", f"refs/subtask/{job}/",
                       f"refs/subtask-owned/{job}").split())
        assert {f"refs/subtask/{job}/record", f"refs/subtask/{job}/base"} <= made, made
    finally:
        gate.touch()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert cli("wait", job, "--timeout", "60").stdout.startswith(f"{job} done")


@pytest.mark.parametrize("point", ["after_admit", "after_branch", "after_record"])
def test_ctrl_c_during_start_leaves_nothing_behind(cli, repo, point, tmp_path):
    before = snapshot(repo)
    gate = tmp_path / "gate"  # start waits at `point` until this exists: Ctrl-C lands there, whatever the load
    err_file = tmp_path / "stderr"
    with open(err_file, "w") as err_out:  # a file, not a pipe: nothing a child kept open can hold up the wait
        proc = subprocess.Popen([sys.executable, "-m", "subtask", "start", "--engine", "shell", "true"],
                                cwd=repo, stdout=subprocess.DEVNULL, stderr=err_out,
                                env=dict(os.environ, SUBTASK_FAULT_HOLD=f"{point}:{gate}"),
                                # Ctrl-C must reach it even when the suite runs with SIGINT ignored,
                                # which children inherit (seen: a background job of a shell without job
                                # control, SigIgn 0x7 in /proc/<pid>/status)
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    run_dir = Path(git(repo, "rev-parse", "--absolute-git-dir")) / "subtask" / "run"
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=60), "start never reached " + point
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        gate.touch()
        if proc.poll() is None:
            proc.kill()
    err = err_file.read_text()
    assert code == 130, err
    assert "Traceback" not in err
    assert snapshot(repo) == before
    assert list(run_dir.glob("*.lock")) == []


@pytest.mark.parametrize("amount", ["-5", "nan", "inf", "1e9"])
def test_a_bad_budget_is_refused_for_a_free_engine_too(cli, repo, amount):
    proc = cli("start", "--engine", "shell", "--max-usd", amount, "true")
    assert proc.returncode == 129, proc.stderr
    assert "--max-usd" in proc.stderr and "Traceback" not in proc.stderr
    assert "e+" not in proc.stderr, "hints name amounts as a person types them"
    assert refs(repo, "refs/subtask/") == []


@pytest.mark.parametrize("key, value", [("maxRunning", "0"), ("maxRunning", "1.5"), ("maxRunning", "abc"),
                                        ("monthlyCapUsd", "abc"), ("maxDepth", "-1"),
                                        ("deleteLandedBranches", "maybe")])
def test_an_invalid_setting_is_refused_at_use_and_reported_by_doctor(cli, repo, key, value):
    git(repo, "config", f"subtask.{key}", value)
    report = json.loads(cli("doctor", "--json").stdout)
    settings = next(c for c in report["checks"] if c["name"] == "settings")
    assert settings["status"] == "fail" and f"subtask.{key}" in settings["message"]
    assert any(f"git config subtask.{key}" in step for step in settings["remediation"])
    if key == "deleteLandedBranches":
        return
    proc = cli("spend") if key == "monthlyCapUsd" else cli("start", "true")
    assert proc.returncode == 128 and f"subtask.{key}" in proc.stderr, proc.stderr
    assert f"hint: git config subtask.{key}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert refs(repo, "refs/subtask/") == []


@pytest.mark.stress
def test_checkouts_run_outside_the_worktree_lock_and_a_half_done_one_is_completed(cli, repo, tmp_path):
    """Issue 14: only the worktree's registration is serialized, so one job writing its files
    never holds up another's checkout; a worker killed between registration and its files leaves
    a worktree that the next attempt checks out, rather than running in an empty folder (whose
    autocommit would record every file deleted)."""
    import fcntl

    lock_path = repo / ".git" / "subtask" / "worktree.lock"
    gate = tmp_path / "gate"
    try:
        held = cli.start("echo a > a.txt", env={"SUBTASK_FAULT_HOLD": f"before_files_checkout:{gate}"})
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=60), "never reached the file checkout"
        fd = os.open(lock_path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free while that job's files are written
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        other = cli.start("echo b > b.txt")
        assert cli("wait", other).returncode == 0  # not held up by the held job's checkout
    finally:
        gate.touch()
    assert cli("wait", held).returncode == 0
    crashed = cli.start("echo c > c.txt", env={"SUBTASK_FAULT": "before_files_checkout"})
    assert cli("wait", crashed).returncode != 0  # its worker died: the attempt is settled failed
    cli.ok("reply", crashed, "echo c > c.txt")
    assert cli("wait", crashed).returncode == 0
    for job, name in ((held, "a.txt"), (other, "b.txt"), (crashed, "c.txt")):
        changed = git(repo, "diff", "--name-status", f"main..subtask/{job}").splitlines()
        assert changed == [f"A\t{name}"], (job, changed)
        assert git(repo / ".subtask" / "worktrees" / job, "status", "--porcelain") == ""


def test_the_worker_writes_its_phase_marks_only_when_asked(cli, repo, tmp_path):
    """bench/peer.py's per-phase breakdown (issue 14) reads these marks; without SUBTASK_PHASES
    nothing is written."""
    marks_file = tmp_path / "phases.jsonl"
    job = cli.start("echo x > x.txt", env={"SUBTASK_PHASES": str(marks_file)})
    assert cli("wait", job).returncode == 0
    quiet = cli.start("true")
    assert cli("wait", quiet).returncode == 0
    # The worker writes its marks after letting go of the run-lock, which is what `wait` waits for.
    assert wait_until(lambda: marks_file.exists() and marks_file.read_text().endswith("\n"), timeout=30)
    [line] = marks_file.read_text().splitlines()
    entry = json.loads(line)
    names = [name for name, _ in entry["marks"]]
    assert (entry["v"], entry["job"], entry["attempt"]) == (1, job, 1)
    assert names[0] == "worker_start" and names[-1] == "run_lock_released"
    for phase in ("checkout", "engine", "autocommit", "evidence", "pins", "record", "note", "slot_hand_off"):
        assert phase in names
    times = [at for _, at in entry["marks"]]
    assert times == sorted(times)


def test_each_attempt_records_when_its_worker_took_it(cli, repo, control_dir):
    """A started job's worker writes nothing before its engine starts (its starter recorded it
    running), yet the time it took the job is recorded, as for one handed a slot from the queue."""
    git(repo, "config", "subtask.maxRunning", "1")
    gate = control_dir / "gate"
    first = cli.start(f"while [ ! -e {gate} ]; do sleep 0.05; done")
    queued = cli.start("true")
    assert json.loads(cli.ok("show", queued, "--json"))["state"] == "queued"
    gate.touch()
    cli.ok("wait", first, queued)
    for job in (first, queued):
        attempt = json.loads(cli.ok("show", job, "--json"))["state_detail"]["attempts"][-1]
        assert (attempt["queued_at"] <= attempt["started_at"] <= attempt["engine_started_at"]
                <= attempt["ended_at"]), attempt


def test_a_start_whose_branch_or_record_exists_makes_none_of_its_refs(cli, repo):
    """`records.create_started` is all or nothing, and says which name was taken."""
    from subtask import api
    from subtask.git import records
    from subtask.model.errors import SubtaskError

    done = cli.start("true")
    cli.ok("wait", done)
    found = api.repo_at(repo)
    job = records.read(found, done)
    job.spec.id, job.tip = "st-0000000f", None
    git(repo, "branch", "subtask/st-0000000f")
    before = refs(repo)
    with pytest.raises(SubtaskError, match="cannot create the branch subtask/st-0000000f: it already exists"):
        records.create_started(found, job, "subtask/st-0000000f")
    assert refs(repo) == before
    job.spec.id = done  # its record exists: a read-only start (no branch) of the same id
    with pytest.raises(SubtaskError, match=f"a record for {done} already exists"):
        records.create_started(found, job, None)
    assert refs(repo) == before
