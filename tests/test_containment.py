"""A confined job changes nothing outside its worktree, through any door (docs/security.md).

Each test below is an attack a model-written job could make, tried with the real kernel
confinement: the job rewrites git metadata it may write (its worktree's `.git` file, its admin
folder's `commondir` and `HEAD`) so that the worker's own git, which runs unconfined, would do its
bidding; it rewrites the setup script the next worktree runs; it leaves children behind that
outlive it; it changes the mode, times or extended attributes of files outside its worktree.
Nothing of it may reach the main checkout, the repository's config, its refs, or a folder outside.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import git, processes_with, running_pids, wait_until

from subtask.proc import isolation, namespaces

LANDLOCK = isolation.support()
NAMESPACES = namespaces.support()
needs_landlock = pytest.mark.skipif(not LANDLOCK.available, reason=f"no usable Landlock here: {LANDLOCK.reason}")
needs_namespaces = pytest.mark.skipif(not NAMESPACES.available,
                                      reason=f"no user/mount/pid namespaces here: {NAMESPACES.reason}")


def evil_monitor(repo: Path, folder: Path) -> Path:
    """A program that, run by any git unconfined, leaves a mark in the main checkout, sets the main
    repository's hooks path and moves `main` to a forged commit. The job is let read it (it is not
    in a confined job's view otherwise), as if it had written it itself."""
    script = folder / "evil.sh"
    script.write_text("#!/bin/sh\n"
                      f"echo pwned > '{repo}/PWNED'\n"
                      f"git -C '{repo}' config core.hooksPath /nonexistent-evil-hooks\n"
                      f"forged=$(git -C '{repo}' commit-tree -m forged 'main^{{tree}}')\n"
                      f"git -C '{repo}' update-ref refs/heads/main \"$forged\"\n")
    script.chmod(0o755)
    git(repo, "config", "--add", "subtask.isolation.readable", str(script))
    return script


def untouched(repo: Path, main_before: str) -> None:
    assert not (repo / "PWNED").exists(), "a program the job named ran outside its sandbox"
    assert git(repo, "config", "--get", "core.hooksPath", check=False) == ""
    assert git(repo, "rev-parse", "main") == main_before
    assert git(repo, "status", "--porcelain") == ""


def ended(cli, job: str, timeout: float = 60) -> dict:
    cli("wait", job, timeout=timeout)
    return cli.json("show", job)["state_detail"]["attempts"][-1]


@needs_landlock
def test_a_job_that_points_its_dot_git_file_at_its_own_repository_runs_nothing_outside(cli, repo):
    """Case 1: the worker's autocommit (git status, add, commit) discovered the repository through
    the job's `.git` file and ran the fsmonitor that repository's config named, unconfined."""
    main_before = git(repo, "rev-parse", "main")
    script = ('git init -q evil && cp "$EVIL" evil/evil.sh && git -C evil config core.fsmonitor "$PWD/evil/evil.sh"'
              ' && echo "gitdir: $PWD/evil/.git" > .git && echo change > file.txt')
    evil = evil_monitor(repo, repo.parent)
    job = cli.start(script, env={"EVIL": str(evil)})
    attempt = ended(cli, job)
    untouched(repo, main_before)
    assert attempt["state"] == "failed" and ".git" in attempt["reason"], attempt
    cli("cleanup", job)  # nor does any later command trust it
    cli("gc", "--older-than", "0d")
    untouched(repo, main_before)


@needs_landlock
def test_a_job_that_points_its_admin_folders_commondir_at_its_own_repository_runs_nothing_outside(cli, repo):
    """Case 2: the admin folder's `commondir` names the repository whose config git reads."""
    main_before = git(repo, "rev-parse", "main")
    evil = evil_monitor(repo, repo.parent)
    script = ('git init -q --bare "$PWD/evil.git" && git --git-dir="$PWD/evil.git" config core.fsmonitor "$EVIL"'
              ' && echo "$PWD/evil.git" > "$(git rev-parse --git-dir)/commondir" && echo change > file.txt')
    job = cli.start(script, env={"EVIL": str(evil)})
    attempt = ended(cli, job)
    untouched(repo, main_before)
    assert attempt["state"] == "failed" and "commondir" in attempt["reason"], attempt


def test_a_job_that_removes_its_dot_git_file_ends_failed_and_cleanup_says_the_same_as_its_dry_run(cli, repo):
    """Issue 31, item 7: a task that removed its worktree's `.git` ended `done` with 0 changes and
    its file uncommitted; `cleanup --dry-run` said it would remove, the real cleanup exited 128."""
    job = cli.start("rm .git && echo x > left.txt")
    attempt = ended(cli, job)
    assert attempt["state"] == "failed" and ".git" in attempt["reason"], attempt
    dry, real = cli("cleanup", job, "--dry-run"), cli("cleanup", job)
    assert dry.returncode == real.returncode == 1, (dry.stderr, real.stderr)
    assert "keeping the worktree" in dry.stderr and "keeping the worktree" in real.stderr
    assert (repo / ".subtask" / "worktrees" / job / "left.txt").exists()


@pytest.mark.parametrize("target", ["refs/heads/main", "refs/notes/subtask", "refs/tags/v1"])
@needs_landlock
def test_a_job_that_points_its_head_at_another_ref_moves_nothing(cli, repo, target):
    """Case 3: `ref: refs/heads/main` written into the admin folder's HEAD made the autocommit
    commit on main, and the job ended done with "main worktree unchanged"."""
    git(repo, "tag", "v1")
    cli.ok("init")  # refs/notes/subtask exists
    before = {ref: git(repo, "rev-parse", ref, check=False) for ref in ("refs/heads/main", "refs/tags/v1")}
    script = f'echo "ref: {target}" > "$(git rev-parse --git-dir)/HEAD" && echo change > file.txt'
    job = cli.start(script)
    attempt = ended(cli, job)
    assert {ref: git(repo, "rev-parse", ref, check=False) for ref in before} == before
    notes = git(repo, "log", "--format=%H", "refs/notes/subtask").split()
    assert not [c for c in notes if "file.txt" in git(repo, "ls-tree", "-r", "--name-only", c)]
    assert attempt["state"] == "failed" and "HEAD" in attempt["reason"], attempt


@needs_landlock
def test_a_reply_after_a_job_pointed_its_dot_git_at_the_git_dir_is_granted_nothing_of_it(cli, repo):
    """Case 7: the sandbox granted the admin folder the worktree's `.git` named. A job that wrote
    `gitdir: <repo>/.git` there ended failed, as it should; its reply's sandbox then held the whole
    git dir (its config, every ref). A reply now checks the metadata before anything of it runs."""
    common = repo / ".git"
    main_before = git(repo, "rev-parse", "main")
    job = cli.start(f"printf 'gitdir: {common}\\n' > .git")
    first = ended(cli, job)
    assert first["state"] == "failed" and first["error_kind"] == "isolation", first
    cli.ok("reply", job, f"echo pwned > '{common}/pwned'; echo x > '{common}/refs/heads/evil'; touch replied")
    reply = ended(cli, job)
    assert not (common / "pwned").exists() and not (common / "refs" / "heads" / "evil").exists(), \
        "a reply's sandbox granted the folder the job's .git named"
    assert reply["state"] == "failed" and reply["error_kind"] == "isolation" and ".git" in reply["reason"], reply
    assert not (repo / ".subtask" / "worktrees" / job / "replied").exists(), "the reply's engine ran"
    untouched(repo, main_before)


@needs_landlock
def test_a_reply_checks_out_no_files_through_a_repository_the_job_made(cli, repo, tmp_path):
    """Case 8: a reply whose worktree has no index writes its files again (`git read-tree`); that
    git found its repository through the worktree's `.git`, which the job had pointed at a
    repository of its own whose smudge filter then ran unconfined."""
    marker = tmp_path / "escaped"
    script = ("set -e; W=$PWD; A=$(sed 's/^gitdir: //' .git); "
              "git init -q fake; cd fake; echo '* filter=x' > .gitattributes; echo hi > f; "
              f"git config filter.x.smudge \"sh -c 'touch {marker}; cat'\"; "
              "git add -A; git commit -qm x; cd $W; "
              "rm -f $A/index; printf \"gitdir: $W/fake/.git\\n\" > .git")
    job = cli.start(script)
    first = ended(cli, job)
    assert first["state"] == "failed" and first["error_kind"] == "isolation", first
    assert not marker.exists()
    cli.ok("reply", job, "touch replied")
    reply = ended(cli, job)
    assert not marker.exists(), "a program the job named ran outside its sandbox"
    assert reply["state"] == "failed" and reply["error_kind"] == "isolation" and ".git" in reply["reason"], reply
    assert not (repo / ".subtask" / "worktrees" / job / "replied").exists(), "the reply's engine ran"


def test_our_git_on_a_jobs_worktree_runs_not_while_its_admin_folder_holds_a_config_worktree(repo, tmp_path):
    """`check_metadata` looks once, and a job's command may run between that look and our git (a
    verify before its branch is moved back, a landing's verify before its scratch is reused): a
    filter it then wrote into the admin folder's config.worktree ran unconfined. `job_git` runs
    no git while a config.worktree git would read is there."""
    from subtask.git import worktrees
    from subtask.git.gitrepo import open_repo
    from subtask.model.errors import SubtaskError

    marker = tmp_path / "escaped"
    git(repo, "config", "core.repositoryformatversion", "1")
    git(repo, "config", "extensions.worktreeConfig", "true")
    worktree = repo / ".subtask" / "worktrees" / "st-1"
    git(repo, "worktree", "add", "-q", "--detach", str(worktree))
    opened = open_repo(repo)
    admin = worktrees.check_metadata(opened, "st-1", worktree, None, git(repo, "rev-parse", "HEAD"))
    # what the job's command does after the check
    git(worktree, "config", "--worktree", "filter.x.smudge", f"sh -c 'touch {marker}; cat'")
    (worktree / ".gitattributes").write_text("* filter=x\n")
    (worktree / "README.md").unlink()
    proc = worktrees.job_git(opened, admin, worktree, "checkout", "--force", "HEAD", "--", "README.md", check=False)
    assert not marker.exists(), "a filter the job wrote ran outside its sandbox"
    assert proc.returncode == 128 and "config.worktree" in proc.stderr, proc
    with pytest.raises(SubtaskError, match="config.worktree"):
        worktrees.job_git(opened, admin, worktree, "status")


@pytest.mark.parametrize("include", ["include.path", "includeIf.gitdir:/.path"])
def test_an_include_in_a_jobs_config_worktree_is_refused_as_git_copied_it(repo, tmp_path, include):
    """An include in an admin folder's config.worktree names a file relative to that folder, which
    the job may write: with the main worktree's config.worktree holding one, git's copy in a job's
    admin folder reads whatever the job put beside it. Refused as damaged metadata, and our git
    runs nothing there."""
    from subtask.git import worktrees
    from subtask.git.gitrepo import open_repo

    marker = tmp_path / "escaped"
    git(repo, "config", "core.repositoryformatversion", "1")
    git(repo, "config", "extensions.worktreeConfig", "true")
    git(repo, "config", "--worktree", include, "extra.inc")
    worktree = repo / ".subtask" / "worktrees" / "st-1"
    git(repo, "worktree", "add", "-q", "--detach", str(worktree))
    admin = repo / ".git" / "worktrees" / "st-1"
    assert include.split(".")[0] in (admin / "config.worktree").read_text()  # git copied it
    # what the job writes: the file its include names, and an attribute that runs its filter
    (admin / "extra.inc").write_text(f"[filter \"x\"]\n\tsmudge = sh -c 'touch {marker}; cat'\n")
    (worktree / ".gitattributes").write_text("* filter=x\n")
    (worktree / "README.md").unlink()
    opened = open_repo(repo)
    with pytest.raises(worktrees.MetadataChanged, match="config.worktree"):
        worktrees.check_metadata(opened, "st-1", worktree, None, git(repo, "rev-parse", "HEAD"))
    proc = worktrees.job_git(opened, admin, worktree, "checkout", "--force", "HEAD", "--",
                             "README.md", check=False)
    assert not marker.exists(), "a filter the job's include named ran outside its sandbox"
    assert proc.returncode == 128 and "config.worktree" in proc.stderr, proc


def test_a_reply_never_runs_in_a_worktree_not_named_for_its_job(cli, repo):
    """A record's worktree path is data: one naming a folder of the worktree folder that is not
    named for the job (here the person's own worktree, with no job's marker) is refused."""
    from test_provenance import forge

    job = cli.start("echo a > a.txt")
    assert ended(cli, job)["state"] == "done"
    mine = repo / ".subtask" / "worktrees" / "mine"
    git(repo, "worktree", "add", "-q", "--detach", str(mine))
    forge(repo, job, f"j.spec.worktree = {str(mine)!r}")
    refused = cli("reply", job, "touch replied")
    assert refused.returncode == 1 and "not running anything there" in refused.stderr, refused
    assert "Traceback" not in refused.stderr
    assert not (mine / "replied").exists() and git(mine, "status", "--porcelain") == ""
    assert len(cli.json("show", job)["state_detail"]["attempts"]) == 1


def test_the_worktree_settings_git_copies_from_the_main_worktree_are_not_taken_for_a_jobs(cli, repo):
    """With extensions.worktreeConfig on, `git worktree add` copies the main worktree's
    config.worktree into every new admin folder: that one is git's (the user's own settings), so
    a job runs and lands as without it; one the job changed is still refused."""
    git(repo, "config", "core.repositoryformatversion", "1")
    git(repo, "config", "extensions.worktreeConfig", "true")
    git(repo, "config", "--worktree", "user.note", "mine")
    jobs = [cli.start(f"echo {n} > {n}.txt", "--verify", f"test -f {n}.txt") for n in "ab"]
    for job in jobs:
        assert ended(cli, job)["state"] == "done", cli.json("show", job)["state_detail"]
    proc = cli("land", *jobs, timeout=120)
    assert proc.returncode == 0 and all(f"{j}: landed" in proc.stdout for j in jobs), proc.stdout + proc.stderr
    job = cli.start('git config --worktree user.note theirs; echo c > c.txt')
    attempt = ended(cli, job)
    assert attempt["state"] == "failed" and "config.worktree" in attempt["reason"], attempt


@needs_landlock
def test_setup_runs_confined_so_a_setup_script_the_job_rewrote_cannot_write_outside(cli, repo, tmp_path):
    """Case 4: the job rewrites `setup.sh` (it is committed to its branch); after cleanup and a
    reply, the new worktree ran the job's setup.sh unconfined."""
    outside = tmp_path / "outside-marker"
    (repo / "setup.sh").write_text("echo setting up\n")
    git(repo, "add", "setup.sh")
    git(repo, "commit", "-q", "-m", "setup script")
    git(repo, "config", "subtask.setup", "sh ./setup.sh")
    job = cli.start(f"echo 'echo pwned > {outside}; echo wrote=$?' > setup.sh")
    assert ended(cli, job)["state"] == "done"
    cli.ok("cleanup", job)
    assert not (repo / ".subtask" / "worktrees" / job).exists()
    cli.ok("reply", job, "true")
    cli("wait", job)
    assert not outside.exists(), "the job's setup script wrote outside its worktree"


@pytest.fixture
def leftovers(tmp_path):
    """A token for the processes a job leaves behind; any still alive when the test ends is killed."""
    token = str(tmp_path / "left-behind-gate")
    yield token
    for pid in processes_with(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def orphan(gate: str) -> str:
    """A child that leaves the job's process group and session, then commits when the gate opens."""
    return (f"setsid sh -c 'while [ ! -e \"{gate}\" ]; do sleep 0.05; done; echo late > late.txt; "
            f"git add late.txt; git commit -qm late' </dev/null >/dev/null 2>&1 &")


def test_the_leftover_detector_sees_the_jobs_processes_and_not_its_worker(cli, repo, tmp_path):
    """The worker is forked from `start` and keeps its argv (the task, the gate's path with it) while
    it finishes after the job ended: the detector the tests below use must not take it for a child
    of the job that outlived it (a loaded machine saw it so)."""
    hold = tmp_path / "hold"
    job = cli.start(f"""sh -c 'while [ ! -e "{hold}" ]; do sleep 0.05; done'""", "--isolation", "none")
    try:
        worker = running_pids(repo, job)["worker"]
        assert wait_until(lambda: processes_with(str(hold)), timeout=60), "the job's sh -c was never seen"
        assert worker not in processes_with(str(hold))
    finally:
        hold.touch()


@pytest.mark.parametrize("isolation_mode", ["worktree", "none"])
def test_no_child_of_a_job_outlives_it(cli, repo, leftovers, isolation_mode):
    """Case 5: a child started with setsid kept running after the job ended done, beside the next
    job, and committed to the branch later."""
    if isolation_mode == "worktree" and not LANDLOCK.available:
        pytest.skip(f"no usable Landlock here: {LANDLOCK.reason}")
    job = cli.start(orphan(leftovers) + "\necho work > work.txt", "--isolation", isolation_mode)
    assert ended(cli, job)["state"] == "done"
    head = git(repo, "rev-parse", f"subtask/{job}")
    assert processes_with(leftovers) == [], "a child of the job outlived it"
    Path(leftovers).touch()
    assert git(repo, "rev-parse", f"subtask/{job}") == head


@needs_namespaces
@pytest.mark.parametrize("ending", ["worker killed", "stop"])
def test_no_child_of_a_job_outlives_its_worker_killed_or_stop(cli, repo, leftovers, tmp_path, ending):
    """Case 5, the worker SIGKILLed (the kernel ends the job's every process with it), or `stop`."""
    hold = tmp_path / "hold"
    job = cli.start(orphan(leftovers) + f'\nwhile [ ! -e "{hold}" ]; do sleep 0.05; done')
    try:
        assert wait_until(lambda: processes_with(leftovers), timeout=60)
        if ending == "stop":
            cli.ok("stop", job)
        else:
            os.kill(running_pids(repo, job)["worker"], signal.SIGKILL)
        assert wait_until(lambda: not processes_with(leftovers), timeout=30), f"a child outlived: {ending}"
    finally:
        hold.touch()


def test_an_unconfined_jobs_children_go_when_its_killed_worker_is_settled(cli, repo, leftovers, tmp_path):
    """Without a pid namespace (`--isolation none`), the command that settles a dead worker's job
    ends what it left outside its process group, by the mark in their environment."""
    hold = tmp_path / "hold"
    job = cli.start(orphan(leftovers) + f'\nwhile [ ! -e "{hold}" ]; do sleep 0.05; done', "--isolation", "none")
    try:
        assert wait_until(lambda: processes_with(leftovers), timeout=60)
        pids = running_pids(repo, job)
        os.kill(pids["worker"], signal.SIGKILL)
        os.killpg(pids["engine"], signal.SIGKILL)
        assert wait_until(lambda: cli.json("list")["jobs"][0]["state"] == "failed", timeout=60)
        assert wait_until(lambda: not processes_with(leftovers), timeout=30), "a child outlived its settled job"
    finally:
        hold.touch()


def metadata(path: Path) -> tuple:
    info = os.lstat(path)
    try:
        attrs = sorted(os.listxattr(path))
    except OSError:
        attrs = []
    return info.st_mode, info.st_uid, info.st_gid, info.st_mtime_ns, attrs


@needs_namespaces
@needs_landlock
def test_a_confined_job_cannot_change_metadata_outside_its_worktree(cli, repo, tmp_path):
    """Case 6: Landlock does not cover a file's mode, owner, times and xattrs; the job changed a
    file in the main checkout (git status then showed it modified) and chmod 777'd a folder of
    another process (the socket folder of the command server there was then)."""
    folder = tmp_path / "sockets"
    folder.mkdir(mode=0o700)
    readme = repo / "README.md"
    before = metadata(readme), metadata(folder)
    script = "\n".join([
        f"chmod 777 '{readme}'; echo chmod=$?",
        f"touch -d '2001-01-01' '{readme}'; echo touch=$?",
        f"python3 -c \"import os; os.setxattr('{readme}', 'user.evil', b'1')\"; echo xattr=$?",
        f"chown 12345 '{readme}'; echo chown=$?",
        f"chmod 777 '{folder}'; echo chmod_folder=$?",
        "echo work > work.txt",
    ])
    job = cli.start(script)
    assert ended(cli, job)["state"] == "done"
    assert (metadata(readme), metadata(folder)) == before
    assert git(repo, "status", "--porcelain") == ""
    iso = cli.json("show", job)["evidence"]["isolation"]
    assert "mount" in iso["enforced_by"] and "mount namespace" in iso["metadata"]


@pytest.fixture
def host_listener():
    """A TCP server on the host's loopback: a job without network must not reach it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted = []
    stop = threading.Event()

    def serve():
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(1)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


CONNECT = ("python3 -c \"import socket,sys\n"
           "try:\n socket.create_connection(('127.0.0.1', {port}), timeout=5).close(); print('host=0')\n"
           "except OSError as e: print('host=1')\n"
           "s=socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); p=s.getsockname()[1]\n"
           "socket.create_connection(('127.0.0.1', p), timeout=5).close(); print('own=0')\"")


@needs_namespaces
def test_network_none_leaves_the_job_only_its_own_loopback(cli, repo, host_listener):
    port, accepted = host_listener
    git(repo, "config", "subtask.isolation.network", "none")
    job = cli.start(CONNECT.format(port=port) + " > net.txt")
    assert ended(cli, job)["state"] == "done"
    said = git(repo, "show", f"subtask/{job}:net.txt").split()
    assert said == ["host=1", "own=0"] and accepted == []
    assert cli.json("show", job)["evidence"]["isolation"]["network"] == "none"
    git(repo, "config", "subtask.isolation.network", "allow")
    job = cli.start(CONNECT.format(port=port) + " > net.txt")
    assert ended(cli, job)["state"] == "done"
    assert git(repo, "show", f"subtask/{job}:net.txt").split() == ["host=0", "own=0"]


def test_a_bad_network_setting_is_refused_at_start(cli, repo):
    git(repo, "config", "subtask.isolation.network", "sometimes")
    proc = cli("start", "true")
    assert proc.returncode == 128 and "subtask.isolation.network" in proc.stderr
    assert git(repo, "for-each-ref", "refs/subtask/") == ""


def test_network_none_is_refused_where_it_cannot_be_enforced(cli, repo):
    git(repo, "config", "subtask.isolation.network", "none")
    proc = cli("start", "true", env={isolation.NAMESPACES_ENV: "0"})
    assert proc.returncode == 128 and "network" in proc.stderr, proc.stderr
    assert git(repo, "for-each-ref", "refs/subtask/") == ""


@pytest.fixture
def no_namespaces(monkeypatch):
    monkeypatch.setenv(isolation.NAMESPACES_ENV, "0")


def test_doctor_says_what_is_not_confined_without_namespaces(cli, repo):
    proc = cli("doctor", env={namespaces.ENV: "0"})
    line = next(line for line in proc.stdout.splitlines() if " isolation " in f" {line} ")
    if LANDLOCK.available:
        assert line.lower().startswith("warn") and "no namespaces" in line and "metadata" in line, line
    git(repo, "config", "subtask.isolation.network", "none")
    proc = cli("doctor", env={namespaces.ENV: "0"})
    line = next(line for line in proc.stdout.splitlines() if " isolation " in f" {line} ")
    assert line.lower().startswith("fail") and "network" in line, line


def test_engines_say_what_confinement_holds_here(cli, repo):
    out = cli.ok("engines")
    if NAMESPACES.available:
        assert "pid namespace" in out
    engines = {e["name"]: e for e in cli.json("engines")["engines"]}
    if NAMESPACES.available and LANDLOCK.available:
        assert "mount namespace" in engines["shell"]["confinement"]
        assert "pid namespace" in engines["shell"]["confinement"]


def _unused():  # keep imports honest for linters when a test is skipped
    return subprocess


# -- smaller doors, found in the same run ----------------------------------------------------------


@needs_landlock
def test_a_confined_job_that_unsets_its_isolation_variable_still_gets_the_documented_refusal(cli, repo):
    job = cli.start("env -u SUBTASK_ISOLATION git subtask start true; echo rc=$?")
    cli("wait", job)
    out = cli.ok("result", job)
    assert "rc=128" in out and "runs confined" in out and "cannot start jobs" in out, out
    assert "unexpected" not in out
    assert len(cli.json("list", "--all")["jobs"]) == 1


@pytest.mark.early
@pytest.mark.slow
def test_a_job_printing_50_mb_keeps_a_bounded_events_file(cli, repo):
    """Events keep a head and a tail, and say how much was dropped between them."""
    job = cli.start("yes 'line of output that goes on and on' | head -c 50000000; echo the-end")
    assert ended(cli, job, timeout=300)["state"] == "done"
    events = repo / ".git" / "subtask" / "run" / f"{job}.events.jsonl"
    size = events.stat().st_size
    assert size < 4 * 1024 * 1024, f"events file of {size} bytes"
    text = events.read_text()
    assert "the-end" in text and '"type": "dropped"' in text


@pytest.mark.early
@pytest.mark.slow
def test_a_job_writing_100000_files_keeps_a_bounded_evidence_with_exact_totals(cli, repo):
    job = cli.start("mkdir many && cd many && seq 1 100000 | xargs touch")
    assert ended(cli, job, timeout=300)["state"] == "done"
    evidence = cli.json("show", job)["evidence"]
    assert evidence["totals"]["files"] == 100000
    assert len(evidence["files"]) <= 1000 and evidence["files_omitted"] == 100000 - len(evidence["files"])
    record = git(repo, "cat-file", "-s", f"refs/subtask/{job}/record:evidence.json")
    assert int(record) < 512 * 1024
    assert "100000 files" in cli.ok("show", job)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs for the state folder needs root")
def test_a_full_state_folder_fails_no_innocent_queued_job_and_says_which_folder(repo, tmp_path):
    """The state folder on a 4 MiB tmpfs: a job printing 20 MB (its events bounded) runs, the job
    queued behind it runs, and a command that cannot write says which folder is full."""
    state = tmp_path / "state"
    state.mkdir()
    git(repo, "config", "subtask.stateDir", str(state))
    git(repo, "config", "subtask.maxRunning", "1")
    script = f"""
set -e
mount -t tmpfs -o size=4m tmpfs '{state}'
a=$(git subtask start "yes 'a long line of output' | head -c 20000000" | cut -d' ' -f1)
b=$(git subtask start 'echo b > b.txt' | cut -d' ' -f1)
git subtask wait "$a" "$b" > '{tmp_path}/waited' || true
git subtask list > '{tmp_path}/listed'
head -c 8000000 /dev/zero > '{state}/filler' || true
git subtask start 'echo c > c.txt' > '{tmp_path}/full.out' 2> '{tmp_path}/full.err' || echo $? > '{tmp_path}/full.rc'
"""
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=repo,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    waited = (tmp_path / "waited").read_text().splitlines()
    assert len(waited) == 2 and all(" done " in line for line in waited), waited
    err = (tmp_path / "full.err").read_text()
    assert (tmp_path / "full.rc").read_text().strip() == "128"
    assert "no space left in" in err and str(state) in err and "unexpected" not in err, err
