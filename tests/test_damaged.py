"""Damaged records: a record ref pointing at a blob, at an unrelated commit, at a commit with garbage
JSON, or at an object that is not there. Every command on that job says it is damaged and how to
inspect it (exit 128, no traceback), `wait` returns, `list` and the other jobs carry on, doctor
reports it, and nothing deletes the damaged ref (it is what there is to inspect)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import blocked_on_run_lock, git, wait_until

DAMAGE = ("blob", "unrelated-commit", "garbage-json", "wrong-types", "missing-object")


def damage(repo, job_id: str, kind: str) -> None:
    ref = f"refs/subtask/{job_id}/record"

    def obj(text: str) -> str:
        return subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--stdin"], input=text,
                              capture_output=True, text=True, check=True).stdout.strip()

    def commit_with(spec: str, state: str, list_line: str) -> str:
        listing = f"100644 blob {obj(spec)}\tspec.json\n100644 blob {obj(state)}\tstate.json\n"
        tree = subprocess.run(["git", "-C", str(repo), "mktree"], input=listing, capture_output=True, text=True,
                              check=True).stdout.strip()
        return git(repo, "commit-tree", tree, "-m", f"damaged\n\nSubtask-List: {list_line}\n")

    if kind == "blob":
        git(repo, "update-ref", ref, obj("not a commit\n"))
    elif kind == "unrelated-commit":
        git(repo, "update-ref", ref, "HEAD")
    elif kind == "garbage-json":
        git(repo, "update-ref", ref, commit_with("{not json", "[1, 2", "{torn"))
    elif kind == "wrong-types":  # a list line that looks right, so only the files are wrong
        git(repo, "update-ref", ref, commit_with('{"id": 7, "task": null}', '{"attempts": "many"}',
                                                 f'{{"v": 1, "id": "{job_id}", "state": "done"}}'))
    elif kind == "missing-object":
        (repo / ".git" / ref).write_text("1234567890123456789012345678901234567890\n")


def assert_names_the_damage(proc, job_id: str, what: str):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 128, f"{what}: exit {proc.returncode}: {out}"
    assert f"{job_id}" in proc.stderr and "damaged" in proc.stderr, f"{what}: {out}"
    assert f"git log refs/subtask/{job_id}/record" in proc.stderr, f"{what}: no way to inspect it named: {out}"
    assert "unexpected" not in out and "Traceback" not in out, f"{what}: {out}"


def record_tip(repo, job_id: str, kind: str) -> str:
    ref = f"refs/subtask/{job_id}/record"
    return (repo / ".git" / ref).read_text() if kind == "missing-object" else git(repo, "rev-parse", ref)


COMMANDS = (("show", "{v}"), ("show", "{v}", "--json"), ("result", "{v}"), ("status", "{v}"), ("diff", "{v}"),
            ("log", "{v}"), ("merge", "{v}"), ("reply", "{v}", "again"), ("stop", "{v}"), ("cleanup", "{v}"),
            ("wait", "{v}"), ("wait", "{healthy}", "{v}"), ("wait", "--any", "{v}"))


def test_every_command_names_a_damaged_record_and_the_others_carry_on(repo, cli):
    """One repository holds a record of each kind of damage: every command meets each kind (one
    kind per command, in turn, and `show` every kind), and the healthy job carries on."""
    healthy = cli.start("true")
    victims = {kind: cli.start(f"echo {i} > v{i}.txt && git add v{i}.txt && git commit -qm v{i}")
               for i, kind in enumerate(DAMAGE)}
    cli.ok("wait", healthy, *victims.values())
    for kind, victim in victims.items():
        damage(repo, victim, kind)
    tips = {kind: record_tip(repo, victim, kind) for kind, victim in victims.items()}
    runs = [(args, DAMAGE[i % len(DAMAGE)]) for i, args in enumerate(COMMANDS)]
    runs += [(("show", "{v}"), kind) for kind in DAMAGE]
    for args, kind in runs:
        victim = victims[kind]
        argv = [a.format(v=victim, healthy=healthy) for a in args]
        assert_names_the_damage(cli(*argv, timeout=30), victim, f"{' '.join(argv)} ({kind})")
    listed = cli("list")
    assert listed.returncode == 0 and healthy in listed.stdout and "Traceback" not in listed.stderr, listed
    for kind, victim in victims.items():
        if kind != "wrong-types":  # list reads only the list line (one object per job): damage there is warned about
            assert victim in listed.stderr and "damaged" in listed.stderr, (kind, listed.stderr)
            assert victim not in listed.stdout, kind
    assert cli.json("show", healthy)["state"] == "done"
    doctor = cli("doctor")
    assert doctor.returncode == 1 and "damaged" in doctor.stdout, doctor.stdout
    for kind, victim in victims.items():
        assert f"git log refs/subtask/{victim}/record" in doctor.stdout, (kind, doctor.stdout)
    # sharing goes on too: a damaged ref here is kept and reported, never a crash
    remote = repo.parent / "remote.git"
    git(repo.parent, "init", "-q", "--bare", str(remote))
    git(repo, "remote", "add", "origin", str(remote))
    for args in (("push",), ("pull",), ("push",)):
        proc = cli(*args)
        assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr and "unexpected" not in proc.stderr, \
            (args, proc.stdout, proc.stderr)
    # the sweeps and gc go on without it, and nothing removes what there is to inspect
    for args in (("cleanup", "--merged"), ("gc", "--older-than", "0s"), ("notes", "rebuild"), ("spend",)):
        proc = cli(*args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stdout, proc.stderr)
    assert {kind: record_tip(repo, victim, kind) for kind, victim in victims.items()} == tips


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs /proc/locks to see the waiter blocked")
def test_wait_returns_when_a_record_is_damaged_while_it_waits(repo, cli):
    gate = repo.parent / "go"
    job_id = cli.start(f"while [ ! -e '{gate}' ]; do sleep 0.05; done")
    waiter = subprocess.Popen(["git", "subtask", "wait", job_id], cwd=repo, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: blocked_on_run_lock(repo, job_id), timeout=60)  # past its first look
        damage(repo, job_id, "blob")
        gate.touch()
        out, err = waiter.communicate(timeout=30)
    finally:
        gate.touch()
        if waiter.poll() is None:
            waiter.kill()
    assert waiter.returncode == 128 and job_id in err and "damaged" in err, (out, err)
    assert "Traceback" not in err and "unexpected" not in err, err


def test_a_dead_workers_damaged_record_is_kept_and_its_slot_freed(repo, cli):
    git(repo, "config", "subtask.maxRunning", "1")
    crashed = cli("start", "true", env={"SUBTASK_FAULT": "after_record"})  # a slot entry, a record, no worker
    assert crashed.returncode == 99
    job_id = git(repo, "for-each-ref", "--format=%(refname)", "refs/subtask/").split("/")[2]
    damage(repo, job_id, "unrelated-commit")
    listed = cli("list")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert job_id in listed.stderr and "damaged" in listed.stderr, listed.stderr
    assert git(repo, "rev-parse", f"refs/subtask/{job_id}/record") == git(repo, "rev-parse", "HEAD")  # kept
    assert f"refs/subtask/{job_id}/base" in git(repo, "for-each-ref", "refs/subtask/")
    other = cli.start("true")  # the dead worker's slot came back
    assert cli.json("wait", other, "--timeout", "60")["jobs"][0]["state"] == "done"


def test_a_garbage_loose_ref_file_is_a_damaged_record(repo, cli):
    """A record ref whose loose file holds no object id: every command says the record is
    damaged (pygit2 raised "corrupted loose reference file" as an unexpected GitError)."""
    job = cli.start("echo a > a")
    cli.ok("wait", job)
    (repo / ".git" / f"refs/subtask/{job}/record").write_text("garbage, not an object id\n")
    for args in (("show", job), ("result", job), ("cleanup", job), ("merge", job), ("diff", job)):
        assert_names_the_damage(cli(*args), job, " ".join(args))
    for args in (("list",), ("gc", "--dry-run"), ("cleanup", "--merged"), ("start", "true")):
        proc = cli(*args)
        assert proc.returncode == 0 and "unexpected" not in proc.stderr, (args, proc.stderr)


def test_a_pulled_record_whose_evidence_lacks_fields_is_shown_without_a_crash(repo, cli):
    """Evidence is a teammate's claim: an entry of `files` without its fields (or not an object)
    is shown as far as it goes; nothing crashes with a KeyError."""
    job = cli.start("echo a > a")
    cli.ok("wait", job)
    tip = git(repo, "rev-parse", f"refs/subtask/{job}/record")
    evidence = json.loads(git(repo, "show", f"{tip}:evidence.json"))
    evidence["files"] = [{"path": "a"}, {"status": "M"}, "not-an-object", {"path": 7, "added": "x"}]
    evidence["commits"] = [{"subject": "no sha"}, 3]
    forge_record_file(repo, job, tip, "evidence.json", evidence)
    for args in (("show", job), ("show", job, "--json"), ("result", job), ("result", job, "--evidence"),
                 ("list",), ("log", job), ("status",), ("notes", "rebuild")):
        proc = cli(*args)
        assert "Traceback" not in proc.stderr and "unexpected" not in proc.stderr, (args, proc.stderr)


def test_a_dead_workers_damaged_record_gives_back_its_ports(repo, cli):
    """The worker held a range of ports (`$SUBTASK_PORT`) when it was killed and its record was
    damaged: whoever settles it frees the range, or those ports are gone from the pool for good."""
    import signal

    from test_crashes import pids_of, state_dir

    gate = repo.parent / "go"
    job_id = cli.start(f"while [ ! -e '{gate}' ]; do sleep 0.05; done")
    ports_file = state_dir(repo) / "ports.json"
    try:
        assert wait_until(lambda: "engine" in pids_of(repo, job_id), timeout=60)
        assert job_id in ports_file.read_text()
        damage(repo, job_id, "unrelated-commit")
        os.kill(pids_of(repo, job_id)["worker"], signal.SIGKILL)
        assert wait_until(lambda: cli("list").returncode == 0 and job_id not in ports_file.read_text(), timeout=60)
    finally:
        gate.touch()


def test_a_pulled_record_whose_verify_judge_is_not_a_name_is_shown_without_a_crash(repo, cli):
    """Who judged a verify (`harness.source`) is a teammate's claim too: a list there is shown as
    written; `show` and `result` do not end with a TypeError (it was looked up in a dict)."""
    job = cli.start("echo a > a", "--verify", "true")
    cli.ok("wait", job)
    tip = git(repo, "rev-parse", f"refs/subtask/{job}/record")
    state = json.loads(git(repo, "show", f"{tip}:state.json"))
    state["attempts"][-1]["verify"]["harness"] = {"source": ["base"], "commit": 7}
    forge_record_file(repo, job, tip, "state.json", state)
    for args in (("show", job), ("result", job)):
        proc = cli(*args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr and "unexpected" not in proc.stderr, \
            (args, proc.stderr)
        assert "tests from ['base']" in proc.stdout, (args, proc.stdout)


def forge_record_file(repo, job: str, tip: str, name: str, data: dict) -> None:
    """A teammate's record as a pull may bring it: one more commit on the job's record chain in
    which the file `name` holds `data` (JSON), the rest as at `tip`."""
    blob = subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--stdin"], input=json.dumps(data),
                          capture_output=True, text=True, check=True).stdout.strip()
    listing = git(repo, "ls-tree", tip).replace(git(repo, "rev-parse", f"{tip}:{name}"), blob)
    tree = subprocess.run(["git", "-C", str(repo), "mktree"], input=listing + "\n", capture_output=True, text=True,
                          check=True).stdout.strip()
    forged = git(repo, "commit-tree", tree, "-p", tip, "-m", git(repo, "log", "-1", "--format=%B", tip))
    git(repo, "update-ref", f"refs/subtask/{job}/record", forged)
