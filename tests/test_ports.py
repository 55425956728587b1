"""A namespace per job (issue 34): its own ports, TMPDIR and names, and a teardown when it ends.

Real workers and the real CLI; the allocation file is also driven directly, since its rules
(never overlap, never a bound port, release exactly once) are what keeps parallel jobs apart.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import git, kill_worker_and_engine, wait_until
from test_admission import state_dir

from subtask.model.errors import SubtaskError
from subtask.state import ports

SERVE = """python3 - <<'EOF'
import os, socket, time
port = int(os.environ["SUBTASK_PORT"])
server = socket.socket()
server.bind(("127.0.0.1", port))  # no SO_REUSEADDR: a port another job holds fails here
server.listen()
with open(os.path.join("{control}", os.environ["SUBTASK_JOB_ID"]), "w") as out:
    out.write(f"{{port}} {{os.environ['SUBTASK_PORTS']}} {{os.environ['TMPDIR']}} "
              f"{{os.environ['COMPOSE_PROJECT_NAME']}} {{os.environ['SUBTASK_NAMESPACE']}}")
while not os.path.exists("{gate}"):
    time.sleep(0.02)
client = socket.create_connection(("127.0.0.1", port))  # our own server answers on our port
client.close()
EOF"""


def test_ten_jobs_at_once_each_serve_on_their_own_port(cli, repo, control_dir, tmp_path):
    git(repo, "config", "subtask.maxRunning", "10")
    gate = tmp_path / "gate"
    jobs = [cli.start(SERVE.format(control=control_dir, gate=gate), "--verify", "true") for _ in range(10)]
    try:
        # All ten hold their servers at once before any is let go.
        assert wait_until(lambda: len(list(control_dir.iterdir())) == 10, timeout=120), list(control_dir.iterdir())
    finally:
        gate.touch()
    for job in jobs:
        assert cli("wait", job, timeout=120).returncode == 0, cli.ok("show", job)
    seen = {job: (control_dir / job).read_text().split() for job in jobs}
    firsts = sorted(int(port) for port, *_ in seen.values())
    assert all(b - a >= 10 for a, b in zip(firsts, firsts[1:], strict=False)), firsts  # ranges never overlap
    assert firsts[0] >= 20000
    for job, (_port, count, tmpdir, compose, namespace) in seen.items():
        assert count == "10" and compose == namespace == job
        assert tmpdir == "/tmp"  # a private /tmp of its view, each its own
    assert ports.held(state_dir(repo)) == []  # every range given back when its attempt ended


def test_an_unconfined_job_gets_a_private_tmpdir_too(cli, repo, control_dir):
    job = cli.start(f'echo "$TMPDIR $SUBTASK_PORT" > "{control_dir}/env"', "--isolation", "none")
    assert cli("wait", job).returncode == 0
    tmpdir, port = (control_dir / "env").read_text().split()
    assert tmpdir.endswith(f"/.tmp/{job}") and int(port) >= 20000
    assert not Path(tmpdir).exists()  # removed with the attempt


def test_a_range_with_a_port_in_use_is_passed_over(cli, repo, control_dir):
    git(repo, "config", "subtask.portBase", "23000")
    git(repo, "config", "subtask.portsPerJob", "3")
    busy = socket.socket()
    try:
        busy.bind(("127.0.0.1", 23001))
        busy.listen()
    except OSError:
        pytest.skip("port 23001 is in use on this machine")
    try:
        job = cli.start(f'echo "$SUBTASK_PORT $SUBTASK_PORTS" > "{control_dir}/port"')
        assert cli("wait", job).returncode == 0
    finally:
        busy.close()
    assert (control_dir / "port").read_text().split() == ["23002", "3"]


def test_allocation_never_overlaps_a_held_range_and_releases_once(tmp_path):
    free = lambda port: port != 20012  # noqa: E731 - something outside holds 20012
    first = ports.allocate(tmp_path, "st-00000001", 1, 20000, 10, is_free=free)
    second = ports.allocate(tmp_path, "st-00000002", 1, 20000, 10, is_free=free)
    assert (first, second) == (20000, 20013)
    assert ports.allocate(tmp_path, "st-00000001", 1, 20000, 10, is_free=free) == first  # asked again: the same
    assert ports.release(tmp_path, "st-00000001", 2) is False  # another attempt's release frees nothing
    assert ports.release(tmp_path, "st-00000001", 1) is True
    assert ports.release(tmp_path, "st-00000001", 1) is False  # exactly once
    assert ports.allocate(tmp_path, "st-00000003", 1, 20000, 10, is_free=free) == 20000
    assert [e["job"] for e in ports.held(tmp_path)] == ["st-00000002", "st-00000003"]
    assert oct((tmp_path / "ports.json").stat().st_mode & 0o777) == "0o600"
    assert json.loads((tmp_path / "ports.json").read_text())["v"] == 1
    with pytest.raises(SubtaskError, match="no 10 consecutive free ports"):
        ports.allocate(tmp_path, "st-00000004", 1, 65520, 10, is_free=lambda port: port not in (65525, 65530))
    with pytest.raises(SubtaskError, match="goes past 65535"):
        ports.allocate(tmp_path, "st-00000004", 1, 65530, 10, is_free=free)


def test_a_damaged_allocation_file_reads_as_none_and_is_rewritten(tmp_path):
    (tmp_path / "ports.json").write_text("{not json")
    with pytest.warns(UserWarning, match="damaged"):
        assert ports.allocate(tmp_path, "st-00000001", 1, 20000, 2, is_free=lambda p: True) == 20000
    assert [e["first"] for e in ports.held(tmp_path)] == [20000]


def test_a_dead_workers_ports_are_released_by_whoever_settles_it(cli, repo, tmp_path):
    gate = tmp_path / "gate"
    job = cli.start(f"while [ ! -e '{gate}' ]; do sleep 0.02; done")
    try:
        assert wait_until(lambda: [e["job"] for e in ports.held(state_dir(repo))] == [job])
        kill_worker_and_engine(repo, job)
    finally:
        gate.touch()
    cli.ok("list")  # the sweep settles the dead worker
    assert cli.json("show", job)["state"] == "failed"
    assert ports.held(state_dir(repo)) == []


def test_teardown_runs_confined_with_the_jobs_names_when_the_attempt_ends(cli, repo, control_dir):
    out = control_dir / "teardown"
    escape = repo / "escaped-by-teardown"
    git(repo, "config", "subtask.teardown",
        f'echo "$SUBTASK_JOB_ID $SUBTASK_PORT $COMPOSE_PROJECT_NAME" >> "{out}"; echo x > "{escape}"')
    ok = cli.start(f'echo "$SUBTASK_PORT" > "{control_dir}/port"')
    failed = cli.start("exit 3")
    assert cli("wait", ok).returncode == 0 and cli("wait", failed).returncode == 1
    lines = sorted(out.read_text().splitlines())
    assert sorted(line.split()[0] for line in lines) == sorted([ok, failed])  # whatever ended the attempt
    mine = next(line.split() for line in lines if line.startswith(ok))
    assert mine == [ok, (control_dir / "port").read_text().strip(), ok]
    assert not escape.exists()  # confined like the job: the main worktree is not its to write
    log = subprocess.run(["git", "subtask", "show", ok, "--log"], cwd=repo, capture_output=True, text=True).stdout
    assert "teardown" in log and "Read-only file system" in log, log  # its failure is said in the worker log
