"""The Ray executor against a real two-node Ray cluster on this machine (no mock of Ray).

One cluster for the module (`tests/raycluster.py`: a keeper process that starts a head with
`subtask_slot: 2` and a second node with `subtask_slot: 2` and `subtask_node2: 2`, each in its own
temp dir and cache folder, and takes every process it started down at the end, even when the test
process dies). The scenario is one test, so that under xdist only one worker starts a cluster.
A bare remote on local disk carries the jobs; clone b starts them, clone a is the teammate.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from conftest import Cli, git, make_team, ray_node_env, refs, wait_until

sys.path.insert(0, str(Path(__file__).parent))
from raycluster import Cluster  # noqa: E402

RAY_WAIT = float(os.environ.get("SUBTASK_TEST_RAY_WAIT", 180))  # only bounds a failure (slow CI)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("ray.job_submission")
    home = tmp_path_factory.mktemp("ray-home")
    env = ray_node_env(tmp_path_factory, home,
                       # the head notices a lost node in ~3 s, not Ray's default ~30 s
                       RAY_health_check_period_ms="1000", RAY_health_check_timeout_ms="1000",
                       RAY_health_check_failure_threshold="3")
    started = time.monotonic()
    running = Cluster.start(env=env)
    running.seconds_to_start = time.monotonic() - started
    try:
        yield running
    finally:
        running.stop()


def _ray(address: str):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address)


def _infos(client, job_ids: list[str]) -> dict[str, object]:
    return {j: client.get_job_info(f"subtask-{j}-1") for j in job_ids}


def _status(info) -> str:
    return str(getattr(info.status, "value", info.status))


def _record(clone: Path, job_id: str) -> dict:
    state = json.loads(git(clone, "show", f"refs/subtask/{job_id}/record:state.json"))
    return state["attempts"][-1]


def _dump(client, job_ids: list[str]) -> str:
    """What Ray says of these jobs, for a failure message."""
    out = []
    for j in job_ids:
        info = client.get_job_info(f"subtask-{j}-1")
        out.append(f"{j}: {_status(info)} {info.message} on {info.driver_node_id}\n"
                   + client.get_job_logs(f"subtask-{j}-1")[-1500:])
    return "\n".join(out)


def _processes_of(job_ids: list[str]) -> list[str]:
    """Command lines of live processes that belong to these jobs (entrypoint, worker, engine)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(j in argv for j in job_ids) and "pytest" not in argv:
            found.append(argv)
    return found


def _start_all(cli: Cli, tasks: list[str]) -> list[str]:
    """Start the jobs at once (each start waits on Ray and the remote; in turn they add up)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(tasks)) as pool:
        return list(pool.map(cli.start, tasks))


def _gated(gate: Path, name: str) -> str:
    return f'while [ ! -e "{gate}" ]; do sleep 0.1; done; echo "{name}" > {name}.txt'


def test_jobs_run_on_both_nodes_of_a_ray_cluster_and_come_home_through_git(cluster, tmp_path):
    remote, [(teammate, teammate_cli), (ours, cli)] = make_team(tmp_path)
    git(ours, "config", "subtask.executor", "ray")
    git(ours, "config", "subtask.ray.address", cluster.address)
    client = _ray(cluster.address)
    gate, gate2 = tmp_path / "gate", tmp_path / "gate2"
    try:
        # -- 6 jobs: at most 2 per node at once (the subtask_slot resource), the rest PENDING
        jobs = _start_all(cli, [_gated(gate, f"job{i}") for i in range(6)])
        seen: dict[str, str] = {}

        def four_run_two_wait() -> bool:
            infos = _infos(client, jobs)
            running = [j for j, info in infos.items() if _status(info) == "RUNNING"]
            per_node: dict[str, int] = {}
            for j in running:
                per_node[infos[j].driver_node_id] = per_node.get(infos[j].driver_node_id, 0) + 1
                seen[j] = infos[j].driver_node_id
            assert all(n <= 2 for n in per_node.values()), per_node
            return len(running) == 4 and sum(_status(i) == "PENDING" for i in infos.values()) == 2

        assert wait_until(four_run_two_wait, timeout=RAY_WAIT, interval=0.5)
        assert len(set(seen.values())) == 2, "both nodes ran jobs"
        slots = ours / ".git" / "subtask" / "slots.json"
        assert not slots.exists() or json.loads(slots.read_text()).get("running", []) == [], "no local slot is held"
        # a damaged slots.json is rebuilt from the records: a Ray job is no dead local worker
        slots.parent.mkdir(exist_ok=True)
        slots.write_text("{")
        cli.ok("list")
        assert json.loads(slots.read_text())["running"] == [] and json.loads(slots.read_text())["queue"] == []
        assert all(_record(ours, j)["state"] in ("queued", "running") for j in jobs)

        # -- stop a job Ray holds PENDING
        queued = cli.start(_gated(gate, "queued"))
        assert _status(client.get_job_info(f"subtask-{queued}-1")) == "PENDING"
        assert "stopped" in cli.ok("stop", queued)
        assert _record(ours, queued)["state"] == "stopped"
        assert _record(ours, queued)["reason"] == "stopped while queued"
        # Ray holds the stop until a slot frees; the node it lands on then finds the attempt ended

        gate.touch()
        waited = cli("wait", *jobs[:5], timeout=RAY_WAIT)
        assert waited.returncode == 0, waited.stdout + waited.stderr
        assert wait_until(lambda: _status(client.get_job_info(f"subtask-{queued}-1")) in ("STOPPED", "SUCCEEDED"),
                          timeout=RAY_WAIT, interval=0.5)
        assert _record(ours, queued)["state"] == "stopped"
        assert git(ours, "rev-parse", f"refs/heads/subtask/{queued}") == git(ours, "rev-parse", "HEAD")
        assert git(remote, "rev-parse", f"refs/subtask/{queued}/record") == \
            git(ours, "rev-parse", f"refs/subtask/{queued}/record")
        # the last job is not waited for (this machine could have been offline): `pull` brings it
        assert wait_until(lambda: _record(remote, jobs[5])["state"] == "done", timeout=RAY_WAIT, interval=0.5)
        assert _record(ours, jobs[5])["state"] != "done"
        cli.ok("pull")
        base = git(ours, "rev-parse", "HEAD")
        for i, job in enumerate(jobs):
            attempt = _record(ours, job)
            assert attempt["state"] == "done", attempt
            head = git(ours, "rev-parse", f"refs/heads/subtask/{job}")
            assert head != base and git(ours, "show", f"{head}:job{i}.txt") == f"job{i}"
            assert git(ours, "rev-parse", f"refs/subtask/{job}/head") == head
            assert git(ours, "rev-parse", f"refs/subtask/{job}/base") == base
            assert job in git(ours, "notes", "--ref=subtask", "show", head)
        # the nodes worked in their own cache folders and dropped each job's worktree once pushed
        assert {m.parent.parent.name for m in cluster.base.glob("cache-*/*/mirror")} == {"cache-head", "cache-node2"}
        assert not [
            w for w in cluster.base.glob("cache-*/*/worktrees/st-*") if w.name in jobs]
        assert "job0.txt" in cli.ok("diff", jobs[0], "--stat")
        assert jobs[0] in cli.ok("log", jobs[0])
        assert cli.ok("result", jobs[0]).startswith(jobs[0])
        assert "ran on:    ray" in cli.ok("show", jobs[0])
        cli.ok("merge", jobs[0])
        assert (ours / "job0.txt").read_text().strip() == "job0"

        # -- a teammate's clone sees the commits and the note after a pull
        teammate_cli.ok("pull")
        head = git(ours, "rev-parse", f"refs/subtask/{jobs[1]}/head")
        assert "job1.txt" in git(teammate, "show", "--stat", head)
        assert jobs[1] in git(teammate, "log", "--notes=subtask", "-1", head)

        # -- the second node is lost mid-job: its jobs end failed with Ray's reason, the rest finish
        git(ours, "config", "subtask.ray.resources", '{"subtask_node2": 1}')
        doomed = _start_all(cli, [_gated(gate2, f"doomed{i}") for i in range(2)])
        git(ours, "config", "--unset", "subtask.ray.resources")
        survivor = cli.start(_gated(gate2, "survivor"))

        def engines_running() -> bool:  # each node claimed its job and pushed `running`
            return all(_record(remote, j)["state"] == "running" for j in doomed + [survivor])

        assert wait_until(engines_running, timeout=RAY_WAIT, interval=0.5), _dump(client, doomed + [survivor])
        node2 = {client.get_job_info(f"subtask-{j}-1").driver_node_id for j in doomed}
        assert len(node2) == 1 and client.get_job_info(f"subtask-{survivor}-1").driver_node_id not in node2
        assert cluster.kill_raylet("node2")
        # nothing of theirs runs on: not the entrypoint, not the worker, not the engine
        assert wait_until(lambda: not _processes_of(doomed), timeout=60, interval=0.2), _processes_of(doomed)
        lost = cli("wait", *doomed, timeout=RAY_WAIT)
        assert lost.returncode == 1, lost.stdout + lost.stderr
        for job in doomed:
            attempt = _record(ours, job)
            assert attempt["state"] == "failed", attempt
            assert f"the Ray job subtask-{job}-1 failed" in attempt["reason"], attempt["reason"]
        gate2.touch()
        cli.ok("wait", survivor, timeout=RAY_WAIT)
        assert _record(ours, survivor)["state"] == "done"
    finally:
        gate.touch()
        gate2.touch()
    print(f"\nthe Ray cluster took {cluster.seconds_to_start:.1f}s to start")


def test_start_on_ray_refuses_what_cannot_work_and_changes_nothing(tmp_path, repo):
    """No Ray, no address, no remote, a remote that refuses a dry-run push, an address nothing
    answers on: each refused with the reason before anything is created, here or on the remote."""
    remote = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(remote))
    git(repo, "remote", "add", "origin", str(remote))
    cli = Cli(repo)

    def refused(code: int, words: str, *args: str, env: dict | None = None) -> None:
        proc = cli("start", *args, "echo hi > hi.txt", env=env)
        assert proc.returncode == code and words in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
        assert refs(repo, "refs/subtask") == [] and refs(repo, "refs/heads/subtask") == []
        assert refs(remote, "refs/subtask") == [] and refs(remote, "refs/heads/subtask") == []

    refused(129, "it must be local or ray", "--on", "moon")
    git(repo, "config", "subtask.executor", "ray")
    refused(129, "no Ray cluster to run on", env={"RAY_ADDRESS": ""})
    git(repo, "config", "subtask.ray.address", "http://127.0.0.1:9")  # a closed port
    git(repo, "config", "subtask.remote", "nowhere")
    refused(129, "no remote named 'nowhere'")
    git(repo, "config", "--unset", "subtask.remote")
    no_ray = tmp_path / "no-ray"
    (no_ray / "ray").mkdir(parents=True)
    (no_ray / "ray" / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    refused(128, "the ray executor needs Ray", env={"PYTHONPATH": str(no_ray)})
    git(repo, "remote", "set-url", "origin", str(tmp_path / "gone.git"))
    refused(128, "a dry-run push was refused")
    git(repo, "remote", "set-url", "origin", str(remote))
    refused(128, "cannot reach the Ray cluster at http://127.0.0.1:9")
    # --on wins over the config, and a local job never imports Ray (the fake one would fail it)
    assert cli("start", "--on", "local", "echo hi > hi.txt", env={"PYTHONPATH": str(no_ray)}).returncode == 0


def test_the_test_clusters_ports_are_never_handed_out_twice(monkeypatch):
    """The keeper asks the kernel for a free port per Ray component (port 0, then closed): the
    kernel may hand the same one out again, and Ray then refuses the node ("port 44515 ... used by
    other components", seen in CI). A port the keeper handed out is never handed out again."""
    import raycluster

    offered = iter([44515, 44515, 44515, 44516])

    class Probe:
        def __init__(self, *args):
            self.port = next(offered)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            pass

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(raycluster.socket, "socket", Probe)
    monkeypatch.setattr(raycluster, "_handed_out", set())
    assert [raycluster._free_port(), raycluster._free_port()] == [44515, 44516]
