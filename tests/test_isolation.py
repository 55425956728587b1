"""Confinement of engines (subtask/isolation.py): what a job may write, enforced by the kernel.

The hostile job below tries what a model-written script might: delete a file outside its worktree
and one in the main checkout, write to $HOME, move `main` and another branch, and commit. Under
the default `worktree` isolation only its own work and commit go through (the files outside are
not in its view, its HOME is a private one, the git dir is read-only but for its own parts), and
the record lists what its output says was refused, as claims; with `--isolation none` it all
happens, and the evidence says the main worktree changed. The Landlock tests are skipped (with
the reason) on a kernel without Landlock.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from subtask.proc import isolation, landlock, namespaces, procs
from tests.conftest import git, refs, wait_until

LANDLOCK = isolation.support()
needs_landlock = pytest.mark.skipif(not LANDLOCK.available, reason=f"no usable Landlock here: {LANDLOCK.reason}")
NO_LANDLOCK = {landlock.ABI_ENV: "0"}
NAMESPACES = namespaces.support()
needs_namespaces = pytest.mark.skipif(
    not NAMESPACES.available, reason=f"no user/mount/pid namespaces here: {NAMESPACES.reason}")


def hostile_script(repo: Path, decoy: Path) -> str:
    return "\n".join([
        f"rm '{decoy}'; echo rm-decoy=$?",
        f"rm '{repo}/README.md'; echo rm-main=$?",
        'echo pwned > "$HOME/pwned"; echo home=$?',
        "echo work > job.txt && git add job.txt && git commit -q -m 'job commit'; echo commit=$?",
        "git update-ref refs/heads/main HEAD; echo update-ref=$?",
        "git branch -f feature HEAD; echo branch=$?",
        'echo t > "$TMPDIR/t"; echo tmp=$?',
        "kill -0 $SUBTASK_WORKER_PID; echo signal-worker=$?",
        "true",
    ])


@pytest.fixture
def hostile(repo, tmp_path, isolated_git):
    decoy = tmp_path / "decoy.txt"
    decoy.write_text("keep me\n")
    git(repo, "branch", "feature")  # the job commits first, so moving main or feature to its HEAD would show
    return decoy, isolated_git, hostile_script(repo, decoy)


def outputs(repo: Path, job: str) -> dict[str, str]:
    """The `name=exit` lines the job printed, from its events file."""
    events = (repo / ".git" / "subtask" / "run" / f"{job}.events.jsonl").read_text().splitlines()
    lines = [e["text"] for e in map(json.loads, events) if e.get("type") == "output"]
    return dict(line.split("=", 1) for line in lines if "=" in line and " " not in line)


def evidence(cli, job: str) -> dict:
    return cli.json("show", job)["evidence"]


@needs_landlock
def test_a_confined_job_writes_only_its_worktree_and_its_branch(cli, repo, hostile):
    decoy, home, script = hostile
    main_before, feature_before = git(repo, "rev-parse", "main"), git(repo, "rev-parse", "feature")
    job = cli.start(script + "\ngit commit --allow-empty -q -m second; echo second=$?")
    cli.ok("wait", job)
    said = outputs(repo, job)
    assert said["rm-decoy"] != "0" and said["rm-main"] != "0"  # neither is in its view
    assert said["home"] == "0"  # its HOME is a private one, gone with it
    assert said["update-ref"] != "0" and said["branch"] != "0"
    assert said["commit"] == "0" and said["second"] == "0" and said["tmp"] == "0"
    if LANDLOCK.abi >= isolation.SCOPED_ABI:
        assert said["signal-worker"] != "0"  # its parent, the worker, is outside the sandbox
    assert decoy.read_text() == "keep me\n" and (repo / "README.md").exists() and not (home / "pwned").exists()
    assert git(repo, "rev-parse", "main") == main_before and git(repo, "rev-parse", "feature") == feature_before
    assert git(repo, "log", "--format=%s", f"subtask/{job}").splitlines()[:2] == ["second", "job commit"]
    iso = evidence(cli, job)["isolation"]
    assert iso["mode"] == "worktree" and iso["source"] == "default"
    writable = {g["path"] for g in iso["writable"]}
    assert str(repo / ".subtask" / "worktrees" / job) in writable and str(repo) not in writable
    assert "/tmp" in writable and str(home) in writable  # its private /tmp and HOME
    private = repo / ".subtask" / "worktrees" / ".tmp"  # private to the job, gone after it
    assert wait_until(lambda: not [p for p in private.iterdir() if job in p.name], timeout=30), list(private.iterdir())
    claimed = "\n".join(iso["claimed"])  # what its output says was refused: claims, not observations
    assert "refs/heads/main" in claimed and "Read-only file system" in claimed
    assert evidence(cli, job)["main_worktree"] == {"changed": False, "paths": []}
    envelope = json.loads(cli.ok("result", job, "--evidence"))
    assert envelope["isolation"]["mode"] == "worktree" and envelope["isolation"]["claimed"] == iso["claimed"]
    note = git(repo, "notes", "--ref=subtask", "show", f"subtask/{job}")
    assert "sandbox: worktree (Landlock ABI" in note and "claimed" in note and "main worktree unchanged" in note
    events = (repo / ".git" / "subtask" / "run" / f"{job}.events.jsonl").read_text()
    assert '"type": "isolation"' in events and "decoy.txt" in events


def seen_record(repo: Path) -> Path:
    return repo / ".git" / "subtask" / "landlock.json"


@needs_landlock
def test_start_records_this_boots_landlock_and_a_damaged_record_is_probed_again(cli, repo):
    """`start` chooses a job's isolation from this boot's first probe of Landlock (no `ctypes` on
    its path); a record it cannot read is only a cache: the kernel is asked again."""
    cli.ok("wait", cli.start("true"))
    seen = json.loads(seen_record(repo).read_text())
    assert seen["v"] == 1 and seen["abi"] == LANDLOCK.abi and seen["boot"].split()[1] == os.uname().release
    assert seen_record(repo).stat().st_mode & 0o777 == 0o600
    for damaged in ("{not json", json.dumps({"v": 1, "boot": "another boot", "abi": 99}),
                    json.dumps({"v": 1, "boot": seen["boot"], "abi": "7"})):
        seen_record(repo).write_text(damaged)
        job = cli.start("true")
        cli.ok("wait", job)
        assert evidence(cli, job)["isolation"]["mode"] == "worktree"
        assert json.loads(seen_record(repo).read_text()) == seen


@needs_landlock
@pytest.mark.skipif(LANDLOCK.abi < isolation.SCOPED_ABI, reason="signals are scoped from Landlock ABI 6")
def test_a_forged_record_of_this_boots_landlock_never_weakens_a_jobs_confinement(cli, repo, hostile):
    """The record says what `start` may choose; the worker confines from the kernel's own answer.
    Written by anyone to claim an older Landlock (no scoped signals or abstract sockets), it still
    leaves the job's processes unable to signal anything outside their sandbox."""
    cli.ok("wait", cli.start("true"))
    seen = json.loads(seen_record(repo).read_text())
    seen_record(repo).write_text(json.dumps({"v": 1, "boot": seen["boot"], "abi": landlock.MIN_ABI}))
    _decoy, _home, script = hostile
    job = cli.start(script)
    cli.ok("wait", job)
    assert outputs(repo, job)["signal-worker"] != "0"
    iso = evidence(cli, job)["isolation"]
    assert (iso["mode"], iso["signals"], iso["abstract_sockets"]) == (
        "worktree", "only inside the sandbox", "only inside the sandbox"), iso
    assert f"Landlock ABI {LANDLOCK.abi}" in iso["enforced_by"]


def test_the_main_worktree_is_compared_after_verify_as_well_as_after_the_engine(cli, repo):
    """The status after the job is taken in the background once nothing of the job runs any more:
    after verify when there is one, else right after the engine (the autocommit meanwhile). One
    job after another, so that each sees only its own change."""
    def run(task: str, *args: str) -> dict:
        job = cli.start(task, "--isolation", "none", *args)
        cli.ok("wait", job)
        return evidence(cli, job)["main_worktree"]

    assert run(f"echo e > {repo}/from-engine.txt; echo w > mine.txt") == {"changed": True, "paths": ["from-engine.txt"]}
    by_verify = run("echo w > mine.txt", "--verify", f"echo v > {repo}/from-verify.txt")
    assert by_verify == {"changed": True, "paths": ["from-verify.txt"]}
    assert run("echo w > mine.txt", "--verify", "true") == {"changed": False, "paths": []}


SLOW_STATUS_GIT = """#!/bin/sh
# The main worktree's status (`status --porcelain`, last; the job worktree's adds
# --untracked-files=all) waits for the gate, 3 s at most.
case "$*" in *" status --porcelain")
  n=0; while [ ! -e "{gate}" ] && [ $n -lt 150 ]; do sleep 0.02; n=$((n+1)); done;;
esac
exec {git} "$@"
"""


def test_the_main_worktree_is_snapshotted_before_the_engine_can_change_it(cli, repo, tmp_path):
    """A slow status of the main worktree must not run on into the engine: what the engine wrote
    would be in the 'before' snapshot too, and its change would go unseen."""
    shim, gate = tmp_path / "shim", tmp_path / "engine-wrote"
    shim.mkdir()
    (shim / "git").write_text(SLOW_STATUS_GIT.format(gate=gate, git=shutil.which("git")))
    (shim / "git").chmod(0o755)
    env = dict(os.environ, PATH=f"{shim}{os.pathsep}{os.environ['PATH']}")
    console = str(Path(sys.executable).parent / "git-subtask")  # `git subtask` puts git's own git first
    task = f"echo e > {repo}/from-engine.txt; touch {gate}"
    job = subprocess.run([console, "start", "--isolation", "none", task], cwd=repo, env=env, check=True,
                         capture_output=True, text=True, timeout=60).stdout.split()[0]
    cli.ok("wait", job)
    assert evidence(cli, job)["main_worktree"] == {"changed": True, "paths": ["from-engine.txt"]}


@needs_landlock
def test_the_same_job_unconfined_does_it_all_and_the_evidence_says_so(cli, repo, hostile):
    decoy, home, script = hostile
    main_before = git(repo, "rev-parse", "main")
    job = cli.start(script, "--isolation", "none")
    cli.ok("wait", job)
    said = outputs(repo, job)
    assert said["rm-decoy"] == said["rm-main"] == said["home"] == said["update-ref"] == said["commit"] == "0"
    assert said["signal-worker"] == "0"
    assert not decoy.exists() and not (repo / "README.md").exists() and (home / "pwned").exists()
    assert git(repo, "rev-parse", "main") != main_before
    ev = evidence(cli, job)
    assert ev["isolation"]["mode"] == "none" and ev["isolation"]["source"] == "flag"
    assert ev["main_worktree"]["changed"] is True and "README.md" in ev["main_worktree"]["paths"]
    note = git(repo, "notes", "--ref=subtask", "show", f"subtask/{job}")
    assert "main worktree CHANGED while the job ran" in note and "README.md" in note
    assert "main worktree CHANGED" in cli.ok("show", job)


@needs_landlock
def test_a_readonly_job_can_write_only_its_temp_dir(cli, repo, tmp_path):
    job = cli.start("echo x > f.txt; echo write=$?; git commit --allow-empty -q -m no; echo commit=$?; "
                    'echo t > "$TMPDIR/t"; echo tmp=$?', "--readonly")
    cli.ok("wait", job)
    said = outputs(repo, job)
    assert said["write"] != "0" and said["commit"] != "0" and said["tmp"] == "0"
    ev = evidence(cli, job)
    assert ev["isolation"]["mode"] == "readonly" and ev["isolation"]["claimed"]
    assert not any("worktree" in g["why"] or g["why"].startswith("git") for g in ev["isolation"]["writable"])
    assert refs(repo, "refs/heads/subtask") == []


@needs_landlock
def test_configured_writable_paths_are_granted_and_listed(cli, repo, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    git(repo, "config", "--add", "subtask.isolation.writable", str(cache))
    git(repo, "config", "--add", "subtask.isolation.writable", str(tmp_path / "absent"))
    job = cli.start(f"echo built > '{cache}/artifact'; echo cache=$?")
    cli.ok("wait", job)
    assert outputs(repo, job)["cache"] == "0" and (cache / "artifact").read_text() == "built\n"
    iso = evidence(cli, job)["isolation"]
    assert {"path": str(cache), "why": "subtask.isolation.writable"} in iso["writable"]
    assert iso["missing"] == [str(tmp_path / "absent")]
    show = cli.ok("show", job)
    assert f"writable: {cache} (subtask.isolation.writable)" in show and "not granted (missing)" in show


@needs_landlock
def test_a_reply_runs_confined_like_the_first_attempt(cli, repo, tmp_path):
    decoy = tmp_path / "decoy.txt"
    decoy.write_text("keep me\n")
    job = cli.start("echo first > first.txt")
    cli.ok("wait", job)
    cli.ok("reply", job, f"rm '{decoy}'; echo rm=$?; touch /etc/reply-wrote; echo etc=$?")
    cli.ok("wait", job)
    assert decoy.exists() and outputs(repo, job)["rm"] != "0" and outputs(repo, job)["etc"] != "0"
    assert (evidence(cli, job)["attempt"] == 2
            and "/etc/reply-wrote" in "".join(evidence(cli, job)["isolation"]["claimed"]))


@needs_landlock
def test_verify_runs_confined_too(cli, repo, tmp_path):
    outside = tmp_path / "verify-wrote"
    job = cli.start("true", "--verify", f"touch '{outside}' && touch /etc/verify-wrote")
    cli("wait", job)
    assert not outside.exists()  # it wrote in its private /tmp, which went with it
    ev = evidence(cli, job)
    assert ev["verification"]["passed"] is False
    assert any("/etc/verify-wrote" in line for line in ev["isolation"]["claimed"])


def test_the_admin_folder_granted_is_the_one_its_caller_names_never_what_dot_git_says(repo, tmp_path):
    """The worktree's `.git` is the job's to write: a policy read from it (a reply's, a judge's, a
    landing's verify in a reused scratch) granted whatever folder the job named, the git dir too."""
    worktree = repo / ".subtask" / "worktrees" / "st-1"
    git(repo, "worktree", "add", "-q", "--detach", str(worktree))
    common = repo / ".git"
    admin = common / "worktrees" / "st-1"
    (worktree / ".git").write_text(f"gitdir: {common}\n")
    policy = isolation.build_policy("worktree", worktree=worktree, admin=admin, common_dir=common,
                                    has_branch=False, tmpdir=str(tmp_path), extra=[], engine_extra=[])
    granted = [g.path for g in policy.grants]
    assert str(admin) in granted and str(common) not in granted, granted
    with pytest.raises(isolation.IsolationError, match="admin folder"):
        isolation.build_policy("worktree", worktree=worktree, admin=common / "worktrees" / "gone", common_dir=common,
                               has_branch=False, tmpdir=str(tmp_path), extra=[], engine_extra=[])


@needs_landlock
def test_a_child_that_cannot_be_confined_is_never_started(tmp_path):
    """The pre-exec hook fails closed: a bad ruleset means exit 126, not an unconfined exec."""
    marker = tmp_path / "ran"
    fd = os.open(os.devnull, os.O_RDONLY)  # not a ruleset: landlock_restrict_self refuses it
    isolation._active = isolation.Sandbox(isolation.Policy("none"))
    isolation._active.fd = fd
    try:
        result = procs.run(["sh", "-c", f"touch '{marker}'"], cwd=tmp_path)
    finally:
        isolation._active = None
        os.close(fd)
    assert result.exit_code == 126 and "could not confine" in result.stderr_tail
    assert not marker.exists()


SAY_NAMESPACES = "for n in mnt pid user; do echo ns-$n=$(readlink /proc/self/ns/$n); done"


def namespaces_seen(repo: Path, job: str) -> dict[str, bool]:
    """Which of its namespaces the job's process saw differ from this test's."""
    said = outputs(repo, job)
    return {n: said[f"ns-{n}"] != os.readlink(f"/proc/self/ns/{n}") for n in ("mnt", "pid", "user")}


@needs_landlock
@needs_namespaces
@pytest.mark.parametrize("flags, configured", [(["--isolation", "worktree"], None),
                                                (["--readonly", "--isolation", "readonly"], None),
                                                ([], "worktree")])
def test_a_confined_mode_asked_for_runs_the_job_in_namespaces_of_its_own(cli, repo, flags,
                                                                          configured):
    """Seen from inside the job: a mount and a pid namespace of its own (and a user namespace,
    which lends them, unless we are root); `none` shares ours. A reply where the namespaces are
    gone fails, never runs with less than was asked."""
    if configured:
        git(repo, "config", "subtask.isolation", configured)
    job = cli.start(SAY_NAMESPACES, *flags)
    cli.ok("wait", job)
    own = {"mnt": True, "pid": True, "user": not namespaces.root()}
    assert namespaces_seen(repo, job) == own, outputs(repo, job)
    assert "mount+pid namespaces" in evidence(cli, job)["isolation"]["enforced_by"]
    cli.ok("reply", job, SAY_NAMESPACES, env={namespaces.ENV: "0"})
    assert cli("wait", job).returncode == 1
    reply = cli.json("show", job)["state_detail"]["attempts"][-1]
    assert reply["state"] == "failed" and reply["error_kind"] == "isolation", reply
    assert "namespaces unavailable" in reply["reason"], reply
    unconfined = cli.start(SAY_NAMESPACES, "--isolation", "none")
    cli.ok("wait", unconfined)
    assert namespaces_seen(repo, unconfined) == {"mnt": False, "pid": False, "user": False}


def test_isolation_that_cannot_be_enforced_is_refused_at_start(cli, repo):
    for args, env in ((["--isolation", "worktree"], NO_LANDLOCK),
                      (["--readonly", "--isolation", "readonly"], NO_LANDLOCK),
                      (["--engine", "claude", "--isolation", "worktree"],
                       dict(NO_LANDLOCK, ANTHROPIC_API_KEY="sk-ant-fake-for-preflight"))):
        proc = cli("start", *args, "true", env=env)
        assert proc.returncode == 128, proc.stderr
        assert "cannot be" in proc.stderr and "Traceback" not in proc.stderr
    git(repo, "config", "subtask.isolation", "worktree")
    proc = cli("start", "true", env=NO_LANDLOCK)
    assert proc.returncode == 128 and "git config subtask.isolation worktree cannot be enforced" in proc.stderr
    assert refs(repo, "refs/subtask") == [] and refs(repo, "refs/heads/subtask") == []


def test_an_engine_that_cannot_be_confined_is_refused_and_said_so():
    """A third-party engine that does not declare `confinable` (its processes may bypass procs.run)."""
    from subtask.model.errors import SubtaskError

    class Plugin:
        name = "plugin"

    with pytest.raises(SubtaskError) as refused:
        isolation.resolve(Plugin(), readonly=False, flag="worktree", configured=None)
    assert refused.value.exit_code == 128 and "cannot be confined by git-subtask" in refused.value.message
    assert isolation.resolve(Plugin(), readonly=False, flag=None, configured=None).mode == "none"
    assert isolation.describe(Plugin()).startswith("none (not started through git-subtask")
    assert isolation.describe(Plugin(), "worktree").startswith("every start refused")


def test_bad_isolation_values_are_usage_errors(cli, repo):
    proc = cli("start", "--isolation", "sandbox", "true")
    assert proc.returncode == 129 and "--isolation must be one of none, worktree, readonly" in proc.stderr
    git(repo, "config", "subtask.isolation", "bogus")
    proc = cli("start", "true")
    assert proc.returncode == 128 and "subtask.isolation must be one of" in proc.stderr
    assert refs(repo, "refs/subtask") == []


def test_without_landlock_the_default_falls_back_to_none_and_says_why(cli, repo):
    job = cli.start("echo hi", env=NO_LANDLOCK)
    cli.ok("wait", job)
    spec = cli.json("show", job)["spec"]
    assert (spec["isolation"] == "none"
            and spec["isolation_source"].startswith("default: worktree isolation unavailable"))
    doctor = json.loads(cli.ok("doctor", "--json", env=NO_LANDLOCK))
    check = next(c for c in doctor["checks"] if c["name"] == "isolation")
    assert check["status"] == "ok" and check["message"].startswith("note: engines run unconfined")


def test_engines_and_doctor_say_what_each_engine_gets_here(cli, repo):
    probes = {p["name"]: p for p in cli.json("engines")["engines"]}
    if LANDLOCK.available:
        assert probes["shell"]["confinement"].startswith("worktree by default (Landlock ABI")
        assert probes["command"]["confinement"].startswith("worktree by default")
    assert probes["claude"]["confinement"].startswith("none by default (its own sandbox applies)")
    assert probes["codex"]["confinement"].startswith("none by default")
    doctor = json.loads(cli.ok("doctor", "--json"))
    check = next(c for c in doctor["checks"] if c["name"] == "isolation")
    assert "shell: " in check["message"] and "claude: none" in check["message"]
    git(repo, "config", "subtask.isolation", "worktree")
    probes = {p["name"]: p for p in cli.json("engines")["engines"]}
    if LANDLOCK.available:
        assert probes["shell"]["confinement"].startswith("worktree (git config subtask.isolation)")
        assert probes["claude"]["confinement"].startswith("worktree (git config subtask.isolation)")
    else:
        assert probes["shell"]["confinement"].startswith("every start refused")


@needs_landlock
@pytest.mark.slow
def test_bench_isolation_runs(tmp_path):
    """bench/isolation.py prints the cost of isolation on a trivial shell job (one round, quick)."""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, str(root / "bench" / "isolation.py"), "--runs", "1", "--no-save"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "isolation none" in proc.stdout and "isolation worktree" in proc.stdout
