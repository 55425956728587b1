"""The land window (issue 43): integrated states verified at once, batches that bisect, verify
once per tree, the hotfix lane, progress. Real repositories, real workers, the real CLI.

Runs are counted by a line each verify appends to a file in a folder the sandbox lets it write
(`control_dir`). "At once" is shown by holding, never by timing: a held verify waits for its
wave's gate file, which the test creates only once the whole wave has started, so a window that
ran them one after another would never fill the wave and the test fails (a wall-time bound
failed on a loaded machine with nothing wrong)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import git, is_ancestor, wait_until

ADD = "echo {text} > {name} && git add {name} && git commit -qm 'add {name}'"


def finished_jobs(cli, names: list[str], verify: str = "true") -> list[str]:
    """One shell job per name, each adding its own file, all ended (their own verify: `verify`)."""
    jobs = [cli.start(ADD.format(name=name, text=name), "--verify", verify) for name in names]
    cli.ok("wait", *jobs, timeout=600)
    return jobs


def counted(control: Path, check: str = "true") -> str:
    """A verify that appends a line to the run counter, then runs `check`."""
    return f"echo run >> {control}/runs; {check}"


def held(control: Path, waves: list[int], check: str = "true") -> str:
    """A verify counted like `counted`, held until its wave's gate opens: the first `waves[0]`
    runs wait for `gate0`, the next `waves[1]` for `gate1`, and so on (see `open_waves`)."""
    choose, total = "", 0
    for n, size in enumerate(waves):
        total += size
        choose += f'[ "$gate" ] || [ "$n" -gt {total} ] || gate={control}/gate{n}; '
    return (f"echo run >> {control}/runs; n=$(wc -l < {control}/runs); gate=; {choose}"
            f'while [ "$gate" ] && [ ! -f "$gate" ]; do sleep 0.05; done; {check}')


def open_waves(control: Path, waves: list[int], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`land *args` with a `held` verify: each wave's gate opens once all of its runs have started
    (and not before), then the queue's outcome."""
    queue = subprocess.Popen(["git", "subtask", "land", *args], cwd=cwd, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        total = 0
        for n, size in enumerate(waves):
            total += size
            assert wait_until(lambda total=total: runs(control) >= total, timeout=120), (
                f"wave {n}: {runs(control)} runs started, {total} expected at once")
            assert runs(control) == total, f"wave {n}: more than {size} runs"
            (control / f"gate{n}").touch()
        out, err = queue.communicate(timeout=300)
    finally:
        queue.kill()
    return subprocess.CompletedProcess(queue.args, queue.returncode, out, err)


def runs(control: Path) -> int:
    path = control / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def first_parent_commits(repo: Path, before: str) -> list[str]:
    return git(repo, "rev-list", "--first-parent", "--reverse", f"{before}..main").split()


def passes_alone(repo: Path, commit: str, command: str) -> bool:
    """The verify run by hand on one commit, in a worktree of its own."""
    path = repo.parent / f"check-{commit[:12]}"
    git(repo, "worktree", "add", "-q", "--detach", str(path), commit)
    try:
        return subprocess.run(["sh", "-c", command], cwd=path, capture_output=True).returncode == 0
    finally:
        git(repo, "worktree", "remove", "--force", str(path))


@pytest.mark.slow
def test_twelve_good_jobs_land_with_their_twelve_verifies_running_at_once(cli, repo, control_dir):
    names = [f"f{n:02d}.txt" for n in range(12)]
    jobs = finished_jobs(cli, names)
    before = git(repo, "rev-parse", "main")
    proc = open_waves(control_dir, [12], "--window", "12", "--verify", held(control_dir, [12]), *jobs, cwd=repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(12 of 12 landed)" in proc.stdout
    assert runs(control_dir) == 12, "every landed commit has its own verify"
    commits = first_parent_commits(repo, before)
    assert len(commits) == 12 and all((repo / name).exists() for name in names)
    for job, commit in zip(jobs, commits, strict=True):
        landing = cli.json("show", job)["state_detail"]["landings"][-1]
        assert landing["commit"] == commit and landing["landed"] and landing["verify"]["head"] == commit


@pytest.mark.slow
def test_twelve_jobs_with_a_bad_one_in_the_middle_land_the_other_eleven_each_verified(cli, repo, control_dir):
    """Twelve states verified at once; the five built on the bad one, built again without it, are
    verified at once in a second wave: two verify times, not one per job."""
    names = [f"f{n:02d}.txt" for n in range(12)]
    names[6] = "bad.txt"
    jobs = finished_jobs(cli, names)
    waves = [12, 5]
    verify = held(control_dir, waves, "! test -f bad.txt")
    before = git(repo, "rev-parse", "main")
    proc = open_waves(control_dir, waves, "--window", "12", "--verify", verify, *jobs, cwd=repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "(11 of 12 landed)" in proc.stdout and f"{jobs[6]}: failed" in proc.stdout, proc.stdout
    assert runs(control_dir) == sum(waves), f"{runs(control_dir)} verify runs"
    commits = first_parent_commits(repo, before)
    assert len(commits) == 11 and not (repo / "bad.txt").exists()
    assert all(passes_alone(repo, commit, verify) for commit in commits), "a landed commit fails its verify"
    assert cli.json("show", jobs[6])["state_detail"]["landings"][-1]["outcome"] == "failed"


@pytest.mark.slow
def test_a_batch_of_sixteen_with_one_bad_job_needs_at_most_nine_verify_runs(cli, repo, control_dir):
    names = [f"f{n:02d}.txt" for n in range(16)]
    names[9] = "bad.txt"
    jobs = finished_jobs(cli, names)
    verify = counted(control_dir, "! test -f bad.txt")
    before = git(repo, "rev-parse", "main")
    proc = cli("land", "--batch", "--verify", verify, *jobs, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "(15 of 16 landed)" in proc.stdout and f"{jobs[9]}: failed" in proc.stdout, proc.stdout
    assert runs(control_dir) <= 9, f"{runs(control_dir)} verify runs"
    assert "verified as part of batch" in proc.stdout
    commits = first_parent_commits(repo, before)
    assert len(commits) == 15 and not (repo / "bad.txt").exists()
    assert passes_alone(repo, commits[-1], verify), "the last state landed is the one a batch verified"
    landings = [cli.json("show", job)["state_detail"]["landings"][-1] for job in jobs]
    assert landings[9]["outcome"] == "failed" and not landings[9]["landed"]
    covered = [x for n, x in enumerate(landings) if n != 9 and x["batch"]]
    assert covered, "jobs verified only as part of a batch say so in their record"
    for x in covered:
        assert x["landed"] and x["verify"]["passed"] and x["batch_commit"] in commits
        assert x["batch"] == git(repo, "rev-parse", f"{x['batch_commit']}^{{tree}}")


def test_a_job_landed_by_a_batch_says_so_in_its_record(cli, repo, control_dir):
    """The first of two jobs in one batch is never verified on its own state: its record (the
    note `show` prints, and its JSON) says which batch's tree covered it."""
    a, b = finished_jobs(cli, ["a.txt", "b.txt"])
    proc = cli("land", "--batch", "--verify", counted(control_dir), a, b)
    assert proc.returncode == 0 and "(2 of 2 landed)" in proc.stdout, proc.stdout + proc.stderr
    assert runs(control_dir) == 1, "one verify for the batch's last state"
    landing = cli.json("show", a)["state_detail"]["landings"][-1]
    tree = git(repo, "rev-parse", "main^{tree}")
    assert landing["landed"] and landing["batch"] == tree
    assert f"verified as part of batch {tree[:7]}" in cli.ok("show", a)
    assert "part of batch" not in cli.ok("show", b), "the batch's last job was verified on its own state"


def test_re_landing_an_unchanged_tree_runs_its_verify_zero_times_and_says_it_reused(cli, repo, control_dir):
    a, b = finished_jobs(cli, ["a.txt", "bad.txt"])
    verify = counted(control_dir, "! test -f bad.txt")
    first = cli("land", "--atomic", "--verify", verify, a, b)
    assert first.returncode == 1 and f"{b} broke the queue" in first.stdout, first.stdout + first.stderr
    ran = runs(control_dir)
    again = cli("land", "--verify", verify, a)
    assert again.returncode == 0, again.stdout + again.stderr
    assert runs(control_dir) == ran, "the same tree, command, harness and environment: verified once"
    assert again.stdout.count("verify reused: passed on the same tree") == 1, again.stdout
    landing = cli.json("show", a)["state_detail"]["landings"][-1]
    assert landing["landed"] and landing["verify"]["reused"]["job"] == a
    assert "verify reused: passed on the same tree" in cli.ok("show", a), "its record says it was reused"
    forced = cli("land", "--no-reuse", "--verify", verify, b)
    assert forced.returncode == 1 and runs(control_dir) == ran + 1, "--no-reuse runs it"


def test_a_job_landed_as_the_very_tree_its_own_verify_passed_on_is_not_verified_again(cli, repo, control_dir):
    job = finished_jobs(cli, ["a.txt"], verify=counted(control_dir))[0]
    assert runs(control_dir) == 1  # its own verify, in its worker
    proc = cli("land", job)
    assert proc.returncode == 0 and "(fast-forward)" in proc.stdout, proc.stdout + proc.stderr
    assert runs(control_dir) == 1 and "verify reused" in proc.stdout, proc.stdout


def test_verify_run_of_an_unchanged_tree_reuses_the_result_unless_told_not_to(cli, repo, control_dir):
    job = finished_jobs(cli, ["a.txt"], verify=counted(control_dir))[0]
    proc = cli("verify", job, "--run")
    assert proc.returncode == 0 and "reused, not run again" in proc.stdout, proc.stdout + proc.stderr
    assert runs(control_dir) == 1
    proc = cli("verify", job, "--run", "--no-reuse")
    assert proc.returncode == 0 and "passed here on" in proc.stdout, proc.stdout + proc.stderr
    assert runs(control_dir) == 2


def test_a_commit_a_person_makes_while_the_window_verifies_is_kept(cli, repo, control_dir):
    """Made after the three states verified at once and before the target moves (held there):
    the compare-and-swap fails, and all three are built again on top of it."""
    jobs = finished_jobs(cli, ["a.txt", "b.txt", "c.txt"])
    gate, hold = control_dir / "gate", control_dir / "hold"
    verify = f"echo run >> {control_dir}/runs; while [ ! -f {gate} ]; do sleep 0.05; done"
    queue = subprocess.Popen(["git", "subtask", "land", "--window", "3", "--verify", verify, *jobs], cwd=repo,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, SUBTASK_FAULT_HOLD=f"land_verified:{hold}"))
    try:
        assert wait_until(lambda: runs(control_dir) >= 3, timeout=120), "the three states never verified at once"
        gate.touch()
        assert wait_until(lambda: Path(f"{hold}.reached").exists(), timeout=120), "no move was ever ready"
        (repo / "mine.txt").write_text("a person's work\n")
        git(repo, "add", "mine.txt")
        git(repo, "commit", "-qm", "a person's commit")
        mine = git(repo, "rev-parse", "HEAD")
        hold.touch()
        out, err = queue.communicate(timeout=300)
    finally:
        queue.kill()
    assert queue.returncode == 0, out + err
    assert "moved while it was built: building it again on top" in out
    assert is_ancestor(repo, mine, "main") and git(repo, "status", "--porcelain", "--untracked-files=no") == ""
    assert all((repo / name).exists() for name in ("a.txt", "b.txt", "c.txt", "mine.txt"))
    for job in jobs:
        landing = cli.json("show", job)["state_detail"]["landings"][-1]
        assert landing["landed"] and is_ancestor(repo, mine, landing["onto"]), "built again on the person's commit"


def test_land_first_puts_a_job_at_the_head_of_a_queue_that_is_already_running(cli, repo, control_dir):
    """The hotfix_job lane: a queue blocked verifying two jobs is handed a third by `land --first`,
    which lands first; the two are built again on it; the second process prints its outcome."""
    from subtask.git.gitrepo import open_repo
    from subtask.ops.landing import hotfix

    a, b, hotfix_job = finished_jobs(cli, ["a.txt", "b.txt", "hotfix.txt"])
    gate = control_dir / "gate"
    verify = f"echo run >> {control_dir}/runs; while [ ! -f {gate} ]; do sleep 0.05; done"
    before = git(repo, "rev-parse", "main")
    queue = subprocess.Popen(["git", "subtask", "land", "--window", "2", "--verify", verify, a, b], cwd=repo,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = None
    try:
        assert wait_until(lambda: runs(control_dir) >= 2, timeout=120), "the queue never verified"
        mixed = cli("land", "--first", hotfix_job, a)
        assert mixed.returncode == 129 and "--first hands it only the jobs it names" in mixed.stderr, mixed.stderr
        assert not list(hotfix.folder(open_repo(repo)).glob("*")), "a refused --first leaves no request"
        first = subprocess.Popen(["git", "subtask", "land", "--first", hotfix_job], cwd=repo, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        taken = hotfix.folder(open_repo(repo)) / f"{hotfix_job}{hotfix.TAKEN}"
        assert wait_until(taken.exists, timeout=120), "the running queue never took the hotfix"
        gate.touch()
        out, err = queue.communicate(timeout=300)
        said, said_err = first.communicate(timeout=300)
    finally:
        queue.kill()
        if first is not None:
            first.kill()
    assert queue.returncode == 0, out + err
    assert first.returncode == 0, said + said_err
    assert f"{hotfix_job}: landed as" in said and "put at the head of the queue by land --first" in said, said
    commits = first_parent_commits(repo, before)
    landed = [cli.json("show", job)["state_detail"]["landed_in"] for job in (hotfix_job, a, b)]
    assert commits == landed, "the hotfix landed first, the others after it"
    assert not list(hotfix.folder(open_repo(repo)).glob("*")), "no request is left behind"


def _entry(name: str, onto: str | None, passed: bool | None = None):
    """A line entry of the window's rules (no git): built onto `onto` as commit `name`+"-state",
    its verify answered `passed` (None: no probe started)."""
    from types import SimpleNamespace

    from subtask.ops.landing import window

    item = SimpleNamespace(command="make test", timeout=None)
    built = None if onto is None else SimpleNamespace(onto=onto, commit=f"{name}-state", kind="built")
    entry = window.Entry(item, SimpleNamespace(job=name), built=built)
    if passed is not None:
        entry.probe = window.Probe("key", rerun=SimpleNamespace(result=SimpleNamespace(passed=passed)))
    return entry


def test_a_job_put_ahead_of_built_states_lands_nothing_built_without_it():
    """`land --first` puts a job at the head of a line whose states were built (and verified)
    without it. Seen under load: the hotfix built onto the tip, then the job behind it answered
    passed before the states behind it were found stale: the target moved to the state of the
    job behind it, built on the old tip, and the hotfix was said landed but was not in it."""
    from subtask.ops.landing import window

    hotfix, a, b = _entry("hotfix", None), _entry("a", "tip", passed=True), _entry("b", "a-state", passed=True)
    assert window.stale([hotfix, a, b], "tip") == [a, b], "built without the job ahead: built again"
    hotfix.built = _entry("hotfix", "tip").built  # built, its verify not started (the window is full)
    assert window.stale([hotfix, a, b], "tip") == [a, b]
    assert window.verified_prefix([hotfix, a, b]) is None, "a's passed state does not hold the hotfix"
    a.built, a.probe = _entry("a-again", "hotfix-state").built, None  # built again on it, not verified yet
    assert window.verified_prefix([hotfix, a, b]) is None, "b's passed state was built on a's old one"


def test_land_first_with_no_queue_running_lands_that_job_first(cli, repo):
    a, b = finished_jobs(cli, ["a.txt", "b.txt"])
    before = git(repo, "rev-parse", "main")
    proc = cli("land", "--first", b, a)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    landed = [cli.json("show", job)["state_detail"]["landed_in"] for job in (b, a)]
    assert first_parent_commits(repo, before) == landed


def test_land_first_of_an_unknown_job_is_refused_and_changes_nothing(cli, repo):
    from subtask.git.gitrepo import open_repo
    from subtask.ops.landing import hotfix

    (a,) = finished_jobs(cli, ["a.txt"])
    before = git(repo, "rev-parse", "main")
    proc = cli("land", "--first", "st-0000dead", a)
    assert proc.returncode == 128 and "no job matches 'st-0000dead'" in proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert git(repo, "rev-parse", "main") == before and cli.json("show", a)["state"] == "done"
    assert not list(hotfix.folder(open_repo(repo)).glob("*")), "no request is left behind"


def test_land_first_naming_a_job_also_in_the_list_lands_it_once_first(cli, repo):
    a, b = finished_jobs(cli, ["a.txt", "b.txt"])
    before = git(repo, "rev-parse", "main")
    proc = cli("land", "--first", b, a, b)
    assert proc.returncode == 0 and "(2 of 2 landed)" in proc.stdout, proc.stdout + proc.stderr
    landed = [cli.json("show", job)["state_detail"]["landed_in"] for job in (b, a)]
    assert first_parent_commits(repo, before) == landed


def test_land_on_a_terminal_shows_a_live_line_of_the_window_and_clears_it(cli, repo, control_dir):
    jobs = finished_jobs(cli, ["a.txt", "b.txt"])
    gate = control_dir / "gate"
    verify = f"echo run >> {control_dir}/runs; while [ ! -f {gate} ]; do sleep 0.05; done"
    queue = subprocess.Popen(["git", "subtask", "land", "--window", "2", "--verify", verify, *jobs], cwd=repo,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # bytes: text mode reads \r as \n
                             env=dict(os.environ, SUBTASK_TTY="1"))
    try:
        assert wait_until(lambda: runs(control_dir) >= 2, timeout=120)
        time.sleep(1.5)  # a tick of the live line while both verify (it only redraws, nothing waits on it)
        gate.touch()
        out, err = (stream.decode() for stream in queue.communicate(timeout=300))
    finally:
        queue.kill()
    assert queue.returncode == 0 and "(2 of 2 landed)" in out, out + err
    lines = [line for line in err.split("\r\x1b[K") if line]
    assert any(line.startswith("land ") and "0 of 2 landed · verifying" in line and all(j in line for j in jobs)
               and "(window 2)" in line for line in lines), repr(err)
    assert err.endswith("\r\x1b[K"), "the live line is cleared before the report"


def test_atomic_lands_nothing_when_one_job_is_refused_whatever_the_window(cli, repo):
    """--atomic keeps its meaning in the window: a job refused at the gate (here: no commits)
    stops the queue, and the good job before it does not land."""
    (good,) = finished_jobs(cli, ["a.txt"])
    empty = cli.start("true", "--verify", "true")
    cli.ok("wait", empty)
    before = git(repo, "rev-parse", "main")
    proc = cli("land", "--atomic", "--window", "2", "--verify", "true", good, empty)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{empty} was refused: nothing landed (--atomic)" in proc.stdout, proc.stdout
    assert git(repo, "rev-parse", "main") == before and not (repo / "a.txt").exists()
    assert cli.json("show", good)["state_detail"]["landed_in"] is None
