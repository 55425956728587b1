"""A job's life through the real CLI: wait, list, show, result, diff, stop, cleanup, queue, death."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import git, host_pid, kill_worker_and_engine, processes_with, running_pids, wait_until


def state_dir(repo: Path) -> Path:
    return Path(git(repo, "rev-parse", "--absolute-git-dir")) / "subtask"


def test_wait_exit_codes_follow_the_outcome(cli):
    ok = cli.start("true")
    failing_script = cli.start("exit 3")
    failing_verify = cli.start("true", "--verify", "false")
    assert cli("wait", ok).returncode == 0
    proc = cli("wait", failing_script)
    assert proc.returncode == 1
    assert "failed" in proc.stdout and "exit" in proc.stdout
    assert cli("wait", failing_verify).returncode == 1
    both = cli("wait", ok, failing_verify)
    assert both.returncode == 1
    assert len(both.stdout.splitlines()) == 2
    shown = cli.json("show", failing_script)["state_detail"]["attempts"][0]
    assert shown["error_kind"] == "exit"
    assert "exited with code 3" in shown["reason"]


def test_wait_any_returns_at_the_first_end_and_timeout_exits_1(cli, tmp_path):
    gate = tmp_path / "gate"  # never made: the slow job ends only when stopped
    slow = cli.start(f"while [ ! -e '{gate}' ]; do sleep 0.05; done")
    fast = cli.start("true")
    try:
        proc = cli("wait", "--any", slow, fast)  # returned at all: it did not wait for the slow one
        assert proc.returncode == 1  # the slow one has not ended
        assert f"{fast} done" in proc.stdout and cli.json("status", slow)["jobs"][0]["state"] == "running"
        proc = cli("wait", "--timeout", "0.5", slow)
        assert proc.returncode == 1 and "timed out" in proc.stderr
    finally:
        cli.ok("stop", slow)


def test_wait_returns_once_the_worker_has_wrapped_up_so_the_note_and_cleanup_are_there(cli, repo, tmp_path):
    """The worker writes the terminal record, then the note, the reservation and the slot, and
    only then lets go of the job: `wait && git log --notes=subtask` or `wait && cleanup` must see
    all of it, not a job that is still busy."""
    gate = tmp_path / "gate"
    job = cli.start("echo x > x.txt", env={"SUBTASK_FAULT_HOLD": f"after_final_record:{gate}"})
    try:
        assert wait_until(lambda: Path(f"{gate}.reached").exists(), timeout=60)
        waiter = subprocess.Popen(["git", "subtask", "wait", job], cwd=repo, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            waiter.wait(timeout=1)  # a wait that does not wait for the wrap-up is back by now
        except subprocess.TimeoutExpired:
            gate.touch()  # ... and one that does is let go
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0 and f"{job} done" in out, err
        # What the user does next, with the worker's wrap-up still held if wait did not wait for it:
        note = git(repo, "log", "-1", "--notes=subtask", "--format=%N", f"subtask/{job}")
        cleaned = cli("cleanup", job)
    finally:
        gate.touch()
    assert "subtask" in note, "wait returned before the job's note was written"
    assert cleaned.returncode == 0 and "later pass" not in cleaned.stdout + cleaned.stderr, cleaned


def test_wait_on_an_ended_job_a_reply_is_starting_returns_without_waiting_for_the_reply(cli, repo, tmp_path,
                                                                                        control_dir):
    """A reply's starter takes the run-lock before it appends its attempt: a wait that found the
    ended attempt and that lock held returns once the new attempt is there, not after it."""
    job = cli.start("true")
    cli.ok("wait", job)
    starting, waiting, go = tmp_path / "starting", tmp_path / "waiting", control_dir / "go"
    replier = subprocess.Popen(["git", "subtask", "reply", job, f"until [ -e {go} ]; do sleep 0.05; done"], cwd=repo,
                               env=dict(os.environ, SUBTASK_FAULT_HOLD=f"after_admit:{starting}"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    waiter = None
    try:
        assert wait_until(lambda: Path(f"{starting}.reached").exists(), timeout=60), replier.communicate()
        waiter = subprocess.Popen(["git", "subtask", "wait", job], cwd=repo, text=True,
                                  env=dict(os.environ, SUBTASK_FAULT_HOLD=f"wait_found_busy:{waiting}"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert wait_until(lambda: Path(f"{waiting}.reached").exists(), timeout=60), waiter.communicate()
        starting.touch()
        waiting.touch()
        out, err = waiter.communicate(timeout=30)  # well inside WRAP_UP_WAIT: the new attempt ended it
        assert waiter.returncode == 0 and f"{job} done" in out, err
        assert cli.json("show", job)["state_detail"]["attempts"][-1]["state"] in ("queued", "running")
    finally:
        for gate in (starting, waiting, go):
            gate.touch()
        for proc in (replier, waiter):
            if proc is not None:
                proc.communicate(timeout=60)
    cli.ok("wait", job)


def test_list_show_result_and_json(cli, repo):
    assert cli.json("list") == {"v": 1, "jobs": [], "more": 0}
    assert cli.ok("list") == ""
    job = cli.start("printf 'line %s\\n' 1 2 3 4 5 6 7 8 9 10 11 12; echo done > out.txt",
                    "--verify", "test -s out.txt")
    cli.ok("wait", job)
    rows = cli.ok("list").splitlines()
    assert rows[0].startswith("ID")
    assert rows[1].startswith(job) and "done" in rows[1] and "passed" in rows[1] and "$0.00" in rows[1]
    listed = cli.json("list")["jobs"]
    assert [j["id"] for j in listed] == [job]
    assert listed[0]["state"] == "done" and listed[0]["verify"] == "passed"
    shown = cli.json("show", job)
    assert shown["evidence"]["files"] == [{"path": "out.txt", "status": "A", "added": 1, "deleted": 0}]
    assert shown["evidence"]["autocommit"]["files"] == ["out.txt"]
    assert shown["evidence"]["verification"]["head"] == shown["evidence"]["head"]
    result = cli.ok("result", job)
    assert result.splitlines()[0].startswith(f"{job} done · verify passed")
    assert "line 12" in result
    assert len(result.splitlines()) <= 13  # its line, what judged it, its changes, 10 lines of summary
    envelope = json.loads(cli.ok("result", job, "--evidence"))
    assert envelope["v"] == 1 and envelope["state"] == "done"
    assert envelope["git"]["changed_files"][0]["path"] == "out.txt"
    assert envelope["verification"]["passed"] is True
    stat = cli.ok("diff", job, "--stat")
    assert "out.txt" in stat and "1 insertion" in stat
    # the autocommit carries the Subtask-Id trailer
    body = git(repo, "log", "-1", "--format=%B", f"subtask/{job}")
    assert f"Subtask-Id: {job}" in body


def test_list_filters_by_state(cli):
    done = cli.start("true")
    failed = cli.start("false")
    cli("wait", done, failed)
    assert [j["id"] for j in cli.json("list", "--state", "failed")["jobs"]] == [failed]
    assert [j["id"] for j in cli.json("list", "--state", "done")["jobs"]] == [done]
    proc = cli("list", "--state", "bogus")
    assert proc.returncode == 129


def test_note_stands_under_the_head_commit_and_two_jobs_on_one_commit_both_show(cli, repo):
    one = cli.start("true")  # no commit: its note goes on the base
    two = cli.start("true")
    cli.ok("wait", one, two)
    note = git(repo, "notes", "--ref=subtask", "show", "HEAD")
    assert f"subtask {one} · done" in note and f"subtask {two} · done" in note
    writer = cli.start("echo x > x.txt")
    cli.ok("wait", writer)
    head = git(repo, "rev-parse", f"subtask/{writer}")
    log = git(repo, "log", "--notes=subtask", "-1", f"subtask/{writer}")
    assert f"subtask {writer} · done · no verify" in log
    assert git(repo, "rev-parse", f"refs/subtask/{writer}/head") == head


def test_stop_ends_a_running_job_once_and_its_process_group(cli, repo, control_dir):
    token = f"stop-child-{control_dir.parent.name}"
    job = cli.start(f"sh -c 'trap \"\" TERM; sleep 60; :' {token} & wait")
    child = host_pid(token)
    out = cli.ok("stop", job, env={"GIT_CONFIG_PARAMETERS": "'subtask.stopgrace=1'"})
    assert f"{job} stopped" in out
    assert wait_until(lambda: not Path(f"/proc/{child}").exists()
                      or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2], timeout=30)
    record = git(repo, "log", "--format=%s", f"refs/subtask/{job}/record")
    assert sum(1 for line in record.splitlines() if " stopped" in line or " failed" in line) == 1
    assert cli("stop", job).returncode == 1  # already ended: a negative answer
    assert json.loads((state_dir(repo) / "slots.json").read_text())["running"] == []
    checks = {c["name"]: c for c in json.loads(cli("doctor", "--json").stdout)["checks"]}
    assert checks["state"]["status"] == "ok", checks["state"]  # the stop request was written 0600


def test_max_running_queues_and_hands_off_in_order(cli, repo, control_dir):
    git(repo, "config", "subtask.maxRunning", "1")
    log = control_dir / "order.log"
    ids = []
    go = control_dir / "go"
    for n in range(3):
        # the first holds the slot until we have looked at the queue
        hold = f"while [ ! -e '{go}' ]; do sleep 0.05; done" if n == 0 else "sleep 0.1"
        out = cli.ok("start", f"echo start {n} >> '{log}'; {hold}; echo end {n} >> '{log}'")
        ids.append(out.split()[0])
        assert ("running" in out) == (n == 0)
        if n:
            assert f"queued (#{n} in queue)" in out
    listing = cli.ok("list")
    assert "queued#" in listing
    go.touch()
    cli.ok("wait", *ids)
    lines = log.read_text().split("\n")
    assert [line for line in lines if line] == ["start 0", "end 0", "start 1", "end 1", "start 2", "end 2"]


def test_stop_on_a_queued_job_removes_it_from_the_queue(cli, repo):
    git(repo, "config", "subtask.maxRunning", "1")
    running = cli.start("sleep 60")
    queued = cli.start("echo never > never.txt")
    assert cli.json("show", queued)["position"] == 1
    out = cli.ok("stop", queued)
    assert f"{queued} stopped" in out
    cli.ok("stop", running)
    assert not (repo / ".subtask" / "worktrees" / queued / "never.txt").exists()
    slots = json.loads((state_dir(repo) / "slots.json").read_text())
    assert slots == {"v": 1, "running": [], "queue": []}


def test_killed_worker_is_noticed_by_the_next_command(cli, repo):
    job = cli.start("sleep 60")
    kill_worker_and_engine(repo, job)
    rows = cli.json("list")["jobs"]
    assert rows[0]["state"] == "failed"
    shown = cli.json("show", job)["state_detail"]["attempts"][0]
    assert shown["reason"] == "worker died"
    assert json.loads((state_dir(repo) / "slots.json").read_text())["running"] == []


def test_wait_notices_a_dead_worker(cli, repo):
    job = cli.start("sleep 60")
    running_pids(repo, job)
    waiter = subprocess.Popen(["git", "subtask", "wait", job], cwd=repo, stdout=subprocess.PIPE, text=True)
    kill_worker_and_engine(repo, job)
    out, _ = waiter.communicate(timeout=60)
    assert waiter.returncode == 1
    assert f"{job} failed" in out


def test_cleanup_removes_a_clean_worktree_and_keeps_a_dirty_one(cli, repo):
    job = cli.start("echo x > x.txt")
    cli.ok("wait", job)
    worktree = repo / ".subtask" / "worktrees" / job
    (worktree / "scratch.txt").write_text("uncommitted work\n")
    proc = cli("cleanup", job)
    assert proc.returncode == 1
    assert "uncommitted changes" in proc.stderr
    assert (worktree / "scratch.txt").exists()
    (worktree / "scratch.txt").unlink()
    assert "would remove" in cli.ok("cleanup", job, "--dry-run")
    assert worktree.exists()
    out = cli.ok("cleanup", job)
    assert "removed worktree" in out
    assert not worktree.exists()
    assert git(repo, "rev-parse", f"subtask/{job}")  # branch kept
    assert "x.txt" in cli.ok("diff", job, "--stat")
    running = cli.start("sleep 60")  # stopped below: it only has to outlast one command
    assert cli("cleanup", running).returncode == 1
    cli.ok("stop", running)


def test_reply_starts_one_new_attempt_and_keeps_every_attempt(cli, repo, control_dir):
    job = cli.start("echo one > a.txt")
    cli.ok("wait", job)
    gate = control_dir / "gate"
    hold = f"while [ ! -e '{gate}' ]; do sleep 0.02; done"
    try:
        running = cli.start(hold)
        assert cli("reply", running, "true").returncode == 1  # only finished jobs
        cli.ok("stop", running)
        # The new attempt runs until every racer has answered (however slow their start-up on a
        # loaded machine): a reply that arrived after it had ended would rightly start attempt 3.
        procs = [subprocess.Popen(["git", "subtask", "reply", job, f"{hold}; echo two >> a.txt"], cwd=repo,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
        results = [(*p.communicate(timeout=60), p.returncode) for p in procs]
        assert sorted(code for _, _, code in results) == [0, 1, 1, 1], results
    finally:
        gate.touch()
    cli.ok("wait", job)
    attempts = cli.json("show", job)["state_detail"]["attempts"]
    assert [a["n"] for a in attempts] == [1, 2]
    assert (repo / ".subtask" / "worktrees" / job / "a.txt").read_text() == "one\ntwo\n"
    note = git(repo, "log", "--notes=subtask", "-1", f"subtask/{job}")
    assert "attempt: 2" in note


def test_secrets_printed_by_an_engine_are_redacted_everywhere(cli, repo, control_dir):
    key = "sk-ant-api03-" + "A" * 40
    secrets_file = control_dir / "secrets.txt"
    secrets_file.write_text(f"using {key}\npassword=hunter2hunter2\n")
    job = cli.start(f"cat '{secrets_file}'; cat '{secrets_file}' >&2", "--verify", f"cat '{secrets_file}'; false")
    cli("wait", job)
    everything = (cli.ok("show", job, "--json") + cli("result", job).stdout
                  + git(repo, "notes", "--ref=subtask", "show", "HEAD"))
    everything += (state_dir(repo) / "run" / f"{job}.events.jsonl").read_text()
    assert key not in everything and "hunter2hunter2" not in everything
    assert "[REDACTED]" in everything


def test_verify_timeout_kills_the_verify_process_group(cli, repo, tmp_path):
    gate = tmp_path / "never-made"  # the verify (and a child of its group) would wait for it forever
    hold = f"while [ ! -e '{gate}' ]; do sleep 0.05; done"
    job = cli.start("true", "--verify", f"sh -c \"{hold}\" & {hold}", "--verify-timeout", "0.5")
    assert cli("wait", job).returncode == 1  # returned at all: the timeout ended verify
    verify = cli.json("show", job)["state_detail"]["attempts"][0]["verify"]
    assert verify["timed_out"] is True and verify["passed"] is False
    assert wait_until(lambda: not processes_with(str(gate)), timeout=30), "a process of verify outlived its timeout"


def test_engine_timeout_ends_the_job_failed_with_kind_timeout(cli):
    job = cli.start("sleep 30", "--timeout", "0.5")
    assert cli("wait", job).returncode == 1
    attempt = cli.json("show", job)["state_detail"]["attempts"][0]
    assert attempt["state"] == "failed" and attempt["error_kind"] == "timeout"
    assert "reply" in attempt["hint"]


@pytest.mark.parametrize("engine_output", [b"\xff\xfe broken utf-8 \xc3\x28\n",
                                           "\ud800".encode("utf-8", "surrogatepass")])
def test_non_utf8_engine_output_never_breaks_the_record(cli, repo, control_dir, engine_output):
    script = control_dir / "emit.py"
    script.write_bytes(b"import sys; sys.stdout.buffer.write(" + repr(engine_output).encode() + b")")
    job = cli.start(f"python3 '{script}'")
    cli.ok("wait", job)
    assert "\ufffd" in cli.ok("result", job)


def test_list_survives_a_damaged_cache_and_sees_every_change(cli, repo):
    job = cli.start("true")
    cli.ok("wait", job)
    assert cli.json("list")["jobs"][0]["state"] == "done"
    for cache in state_dir(repo).glob("list-cache-*.json"):
        cache.write_text("{not json")
    assert [j["id"] for j in cli.json("list")["jobs"]] == [job]
    other = cli.start("exit 1")
    cli("wait", other)
    states = {j["id"]: j["state"] for j in cli.json("list")["jobs"]}
    assert states == {job: "done", other: "failed"}


def test_list_writes_its_caches_only_when_that_spares_more_than_it_costs(cli, repo):
    """A cache file written (a new inode, ~0.8 ms) costs more than the few record reads it would
    spare the next `list` (~0.05 ms each): the listing's and the overlap marks' caches are written
    by the first `list`, then again once `records.CACHE_WORTH` records are new to them."""
    from subtask.git.records import CACHE_WORTH

    jobs = [cli.start("echo a > a.txt")]
    cli.ok("wait", jobs[0])
    cli.ok("list")
    caches = sorted(state_dir(repo).glob("list-cache-*.json")) + sorted(state_dir(repo).glob("behind-*.json"))
    assert len(caches) == 2, caches
    written = [(c.stat().st_ino, c.read_bytes()) for c in caches]
    while len(jobs) < CACHE_WORTH:
        jobs.append(cli.start(f"echo {len(jobs)} > a.txt"))
        cli.ok("wait", jobs[-1])
        shown = cli.json("list")["jobs"]
        assert [j["id"] for j in shown] == jobs[::-1]  # every new job listed, with its marks
        assert len(shown[0]["marks"]["overlaps"]) == len(jobs) - 1
        assert [(c.stat().st_ino, c.read_bytes()) for c in caches] == written
    jobs.append(cli.start("echo last > a.txt"))
    cli.ok("wait", jobs[-1])
    cli.ok("list")
    assert all(c.stat().st_ino != ino for c, (ino, _) in zip(caches, written, strict=True))


def test_wait_on_a_queued_job_sees_a_raised_max_running_without_another_command(cli, repo):
    git(repo, "config", "subtask.maxRunning", "1")
    go = repo.parent / "go"
    holder = cli.start(f"while [ ! -e '{go}' ]; do sleep 0.05; done")
    try:
        queued = cli.start("echo ran > ran.txt")
        assert cli.json("show", queued)["position"] == 1
        git(repo, "config", "subtask.maxRunning", "2")
        proc = cli("wait", queued, "--timeout", "30")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert cli.json("show", holder)["state"] == "running"  # the slot was not handed on: it was new
    finally:
        go.touch()
        cli("wait", holder, "--timeout", "30")


def test_a_shell_job_that_timed_out_is_hinted_a_script_not_continue(cli):
    job = cli.start("sleep 30", "--timeout", "0.5")
    cli("wait", job, "--timeout", "30")
    shown = cli.ok("show", job)
    assert f"git subtask reply {job} --timeout SECONDS 'SCRIPT'" in shown, shown
    assert "'continue'" not in shown


def test_a_stop_whose_wrap_up_fails_still_ends_stopped(cli, repo):
    """A stop under load can kill the worker's own git mid-write: the attempt ends as asked
    (stopped), not `failed` with a worker error. The job stands for that: it asks for its own
    stop and leaves an index git cannot read, so the worker's wrap-up (`git status`) fails."""
    stop_file = state_dir(repo) / "run"
    task = (f"touch '{stop_file}'/$SUBTASK_JOB_ID.stop; "
            "echo garbage > \"$(git rev-parse --git-dir)/index\"; echo new > new.txt")
    job = cli.start(task, "--isolation", "none")
    cli("wait", job, "--timeout", "60")
    shown = cli.json("show", job)
    assert shown["state"] == "stopped", shown["state_detail"]
    assert shown["state_detail"]["attempts"][-1]["reason"] == "stopped by request"


def test_a_stop_that_breaks_the_setup_still_ends_stopped(cli, repo):
    """`stop` writes its marker, then signals the worker's process group: a git of the worker's
    setup (its checkout) can die of it before the worker itself sees the stop, and the attempt
    ended `failed · setup` (CI, a stop through MCP right after the start). The end is the one the
    user asked for. The setup command stands for that git: it asks for the job's stop, then fails."""
    stop_file = state_dir(repo) / "run"
    git(repo, "config", "subtask.setup", f"touch '{stop_file}'/$SUBTASK_JOB_ID.stop; exit 3")
    job = cli.start("echo never > never.txt", "--isolation", "none")
    cli("wait", job, "--timeout", "60")
    shown = cli.json("show", job)
    assert shown["state"] == "stopped", shown["state_detail"]
    assert shown["state_detail"]["attempts"][-1]["reason"] == "stopped by request"


SAY_CONTEXT = "echo nice=$(nice); echo fsize=$(ulimit -f); echo umask=$(umask); echo net=$(readlink /proc/self/ns/net)"


def said(repo: Path, job: str) -> dict[str, str]:
    """The `name=value` lines a job printed, from its events file."""
    events = (state_dir(repo) / "run" / f"{job}.events.jsonl").read_text().splitlines()
    lines = [e["text"] for e in map(json.loads, events) if e.get("type") == "output"]
    return dict(line.split("=", 1) for line in lines if "=" in line)


@pytest.mark.parametrize("isolation", ["none", "worktree"])
def test_a_queued_job_runs_with_its_starters_nice_value_limits_umask_and_network(cli, repo, control_dir, isolation):
    """Issue 40: a job that waited for a slot is run by the worker that frees it, which has its own
    nice value, limits, umask and network namespace; the job must get its starter's, as an
    unqueued job (whose worker its starter forked) does. The starter holds a network namespace of
    its own open (`unshare -n`), as a shell in one would."""
    if os.geteuid() != 0:
        pytest.skip("a network namespace of the starter's own needs root here (unshare -n)")
    git(repo, "config", "subtask.maxRunning", "1")
    go = control_dir / "go"
    holder = cli.start(f"while [ ! -e '{go}' ]; do sleep 0.05; done", "--isolation", isolation)
    started, release = control_dir / "started", control_dir / "release"
    starter = subprocess.Popen(
        ["unshare", "-n", "bash", "-c",
         f"ulimit -f 2048; umask 027; nice -n 10 git subtask start --isolation {isolation} '{SAY_CONTEXT}' "
         f"> '{started}.tmp' && mv '{started}.tmp' '{started}'; "
         f"while [ ! -e '{release}' ]; do sleep 0.05; done"], cwd=repo)
    try:
        assert wait_until(started.exists, timeout=60), "the starter never started its job"
        out = started.read_text()
        assert "queued" in out, out
        queued = out.split()[0]
        starter_net = os.readlink(f"/proc/{starter.pid}/ns/net")
        go.touch()
        cli("wait", holder, queued, timeout=120)
    finally:
        release.touch()
        starter.wait(timeout=30)
    values = said(repo, queued)
    assert cli.json("show", queued)["state"] == "done", values
    assert values["nice"] == "10" and values["fsize"] == "2048" and values["umask"] == "0027", values
    assert values["net"] == starter_net != os.readlink("/proc/self/ns/net"), values
    # the control: started the same way with a free slot, the job's worker is its starter's fork
    control = subprocess.run(["bash", "-c", f"ulimit -f 2048; umask 027; nice -n 10 git subtask start "
                              f"--isolation {isolation} '{SAY_CONTEXT}'"],
                             cwd=repo, capture_output=True, text=True, check=True).stdout.split()[0]
    cli.ok("wait", control)
    assert said(repo, control) | {"net": ""} == {"nice": "10", "fsize": "2048", "umask": "0027", "net": ""}


def test_a_queued_job_whose_starters_namespace_is_gone_fails_and_says_why(cli, repo, control_dir):
    """Refused, never lent: when nothing is left in the starter's network namespace by the time
    a slot frees, the job is not run in the worker's; it fails before anything of it runs."""
    if os.geteuid() != 0:
        pytest.skip("a network namespace of the starter's own needs root here (unshare -n)")
    git(repo, "config", "subtask.maxRunning", "1")
    go, ran = control_dir / "go", control_dir / "ran"
    holder = cli.start(f"while [ ! -e '{go}' ]; do sleep 0.05; done")
    out = subprocess.run(["unshare", "-n", "git", "subtask", "start", f"touch '{ran}'"], cwd=repo,
                         capture_output=True, text=True, check=True).stdout
    assert "queued" in out, out
    queued = out.split()[0]
    go.touch()
    assert cli("wait", holder, queued, timeout=120).returncode == 1
    attempt = cli.json("show", queued)["state_detail"]["attempts"][0]
    assert attempt["state"] == "failed" and "net namespace is gone" in attempt["reason"], attempt
    assert not ran.exists()


def _a_network_namespace_numbered(number: str, deadline: float = 60.0) -> subprocess.Popen | None:
    """A process holding a new network namespace that the kernel gave `number` again (it hands out
    the lowest free one once a namespace is torn down), or None once another process holds that
    number (another test's sandbox took it first) or the deadline passed."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        holder = subprocess.Popen(["unshare", "-n", "sh", "-c", "readlink /proc/self/ns/net; exec cat"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if holder.stdout.readline().strip() == number:
            return holder
        holder.stdin.close()
        holder.wait(timeout=30)
        if _holders_of(number):
            return None
        time.sleep(0.05)
    return None


def _holders_of(number: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/net") == number:
                found.append(pid)
        except OSError:
            pass
    return found


def test_a_queued_job_never_enters_a_namespace_that_was_given_its_starters_number(cli, repo, control_dir):
    """A namespace's number is reused as soon as it is torn down: a process found in a namespace
    numbered as the starter's was, once its starter has gone, may be in another job's sandbox.
    The job fails as its starter's namespace is gone; it never runs in that other one."""
    if os.geteuid() != 0:
        pytest.skip("a network namespace of the starter's own needs root here (unshare -n)")
    git(repo, "config", "subtask.maxRunning", "1")
    go, ran = control_dir / "go", control_dir / "ran"
    holder = cli.start(f"while [ ! -e '{go}' ]; do sleep 0.05; done")
    starter = f"readlink /proc/self/ns/net; exec git subtask start 'touch {ran}'"
    out = subprocess.run(["unshare", "-n", "sh", "-c", starter], cwd=repo, capture_output=True, text=True,
                         check=True).stdout
    number, started = out.splitlines()[:2]
    assert "queued" in started, out
    queued = started.split()[0]
    impostor = _a_network_namespace_numbered(number)
    try:
        if impostor is None and not _holders_of(number):
            pytest.skip(f"the kernel did not give {number} out again within a minute")
        go.touch()
        assert cli("wait", holder, queued, timeout=120).returncode == 1
        attempt = cli.json("show", queued)["state_detail"]["attempts"][0]
        assert attempt["state"] == "failed" and "net namespace is gone" in attempt["reason"], attempt
        assert not ran.exists()
    finally:
        if impostor is not None:
            impostor.stdin.close()
            impostor.wait(timeout=30)
