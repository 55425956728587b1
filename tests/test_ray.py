"""The Ray executor against a real two-node Ray cluster on this machine (no mock of Ray).

One cluster for the module (`tests/raycluster.py`: a keeper process that starts a head with
`subtask_slot: 2` and a second node with `subtask_slot: 2` and `subtask_node2: 2`, each in its own
temp dir and cache folder, and takes every process it started down at the end, even when the test
process dies). Its scenarios are the steps of one test, so a run starts one cluster (~7 s of
CPU, ~1 GB of memory) and runs them in order: everything a local job can ask for first, then the
scenario that loses the second node. A bare remote on local disk carries the jobs; clone b starts
them, clone a is the teammate.
"""

from __future__ import annotations

import json
import os
import sys
import time
import types
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
    running.home = home  # the nodes' HOME: their global git config
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


# A paid command engine that keeps a session: it appends its task to agent.txt, commits, and says
# its session and cost. Home reads its settings from the clone's config, the nodes from their
# global one (both written by the test).
AGENT = """#!/bin/sh
echo "$1" >> agent.txt
git add agent.txt && git commit -qm "agent: $1"
echo "session: s-$SUBTASK_JOB_ID${2:+ (resumed $2)}"
echo 'cost: $0.25'
"""


def agent_settings(cwd: Path, where: list[str], script: Path) -> None:
    """The `agent` engine in a config: `git -C cwd config [where...] subtask.engine.agent.* ...`."""
    settings = {"command": json.dumps(["sh", str(script), "{task}"]),
                "resumeCommand": json.dumps(["sh", str(script), "{task}", "{session}"]),
                "paid": "true", "costPattern": r"cost: \$([0-9.]+)", "sessionPattern": r"session: (\S+)"}
    for key, value in settings.items():
        git(cwd, "config", *where, f"subtask.engine.agent.{key}", value)


def state_of(clone: Path, job: str) -> dict:
    return json.loads(git(clone, "show", f"refs/subtask/{job}/record:state.json"))


def open_reservations(clone: Path, job: str) -> list[str]:
    from subtask.git.gitrepo import open_repo
    from subtask.state import ledger

    return [r.rid for r in ledger.open_reservations(open_repo(clone).state_dir) if r.job == job]


@pytest.mark.early
def test_a_ray_cluster_runs_every_kind_of_job_on_both_nodes_and_outlives_losing_one(cluster, tmp_path):
    """The module's scenarios, in the order they must run on its one cluster: every kind of job
    first, then the jobs spread over both nodes, the second node lost last."""
    for step in ("kinds", "nodes"):
        (tmp_path / step).mkdir()
    _every_kind_of_job(cluster, tmp_path / "kinds")
    _jobs_on_both_nodes_come_home_and_a_lost_node_fails_its_own(cluster, tmp_path / "nodes")


def _every_kind_of_job(cluster, tmp_path: Path) -> None:
    """Everything a local job can ask for: `--retries` (the loop runs on the node, its money held at
    home), `reply`, `--after`, `--best-of` and `map`; what cannot work there (`map --concurrency`,
    `--judge`) is refused in tests/test_executors.py."""
    remote, [(_teammate, _), (ours, cli)] = make_team(tmp_path)
    git(ours, "config", "subtask.executor", "ray")
    git(ours, "config", "subtask.ray.address", cluster.address)
    client = _ray(cluster.address)
    script = cluster.home / "agent.sh"
    script.write_text(AGENT)
    agent_settings(ours, [], script)  # home's reading
    agent_settings(cluster.home, ["--file", str(cluster.home / ".gitconfig")], script)  # the nodes' (their HOME)
    gate = tmp_path / "gate"
    try:
        # -- a job Ray does not have is MISSING by Ray's own words (test_executors: no other words are)
        from subtask.executors import ray as ray_executor

        unknown = types.SimpleNamespace(
            spec=types.SimpleNamespace(extra={"executor": {"kind": "ray", "address": cluster.address}}),
            state=types.SimpleNamespace(current=types.SimpleNamespace(extra={"ray_job": "subtask-st-0000dead-1"})))
        assert ray_executor.ray_state(unknown).status == "MISSING"
        # -- --retries: the node runs the loop; home sees one job end, every attempt pinned
        retried = cli.start('if [ -n "$SUBTASK_RETRY" ]; then echo ok > ok.txt; else echo first > first.txt; fi',
                            "--retries", "2", "--verify", "test -f ok.txt")
        # -- a paid loop: its three budgets held at home in one reservation while it runs
        paid = cli.start("step", "--engine", "agent", "--max-usd", "1", "--retries", "2",
                         "--verify", 'test "$(wc -l < agent.txt)" -ge 2')
        assert open_reservations(ours, paid) == [f"{paid}.1"]
        spend = cli.json("spend")
        assert spend["open_usd"] == pytest.approx(3.0), spend
        # -- --after: recorded waiting here, handed to Ray once what it waits for ended
        first = cli.start(f'while [ ! -e "{gate}" ]; do sleep 0.1; done; echo from-first > first.txt')
        after = cli.start("cat first.txt > after.txt", "--after", first)
        # (seen once in ~11 runs beside three `yes`: `after` skipped, so `first` had ended failed)
        assert state_of(ours, after)["attempts"][0]["state"] == "waiting", state_of(ours, first)
        assert json.loads(git(ours, "show", f"refs/subtask/{after}/record:spec.json"))["executor"]["kind"] == "ray"
        gate.touch()

        waited = cli("wait", retried, paid, after, timeout=RAY_WAIT)  # not first: waiting on after settles it
        assert waited.returncode == 0, waited.stdout + waited.stderr

        attempts = state_of(ours, retried)["attempts"]
        assert [(a["n"], a["state"], a["verify"]["passed"], a.get("retry")) for a in attempts] == [
            (1, "done", False, None), (2, "done", True, 1)]
        assert attempts[1]["ray_job"] == f"subtask-{retried}-1"  # the same Ray job ran the retry
        assert git(ours, "show", f"refs/subtask/{retried}/attempts/1:first.txt") == "first"
        assert git(ours, "show", f"subtask/{retried}:ok.txt") == "ok"

        loop = state_of(ours, paid)["attempts"]
        assert [(a["state"], a["verify"]["passed"], a["cost"]["charged"]) for a in loop] == [
            ("done", False, 0.25), ("done", True, 0.25)]
        assert open_reservations(ours, paid) == []  # the loop's third budget went back
        assert cli.json("spend")["per_engine"]["agent"]["committed"] == pytest.approx(0.5)

        shown = json.loads(git(ours, "show", f"refs/subtask/{after}/record:spec.json"))
        assert shown["base"] == git(ours, "rev-parse", f"refs/subtask/{first}/head")
        assert git(ours, "show", f"subtask/{after}:after.txt") == "from-first"
        assert client.get_job_info(f"subtask-{after}-1").status.value == "SUCCEEDED"

        # -- reply: attempt n+1 on Ray; a session engine's reply is pinned to the node that holds it
        cli.ok("reply", retried, "echo replied > replied.txt")
        cli.ok("reply", paid, "more")
        waited = cli("wait", retried, paid, timeout=RAY_WAIT)
        assert waited.returncode == 0, waited.stdout + waited.stderr
        third = state_of(ours, retried)["attempts"][2]
        assert (third["state"], third["ray_job"]) == ("done", f"subtask-{retried}-3")
        assert git(ours, "show", f"subtask/{retried}:replied.txt") == "replied"
        again = state_of(ours, paid)["attempts"][2]
        assert again["state"] == "done" and again["session_id"] == f"s-{paid}"
        assert f"(resumed s-{paid})" in git(ours, "show", f"refs/subtask/{paid}/record:summary.md")
        assert git(ours, "show", f"subtask/{paid}:agent.txt").splitlines()[-1] == "more"
        replied = client.get_job_info(f"subtask-{paid}-3")
        asked = json.loads(replied.metadata["subtask_resources"])
        pinned = [k for k in asked if k.startswith("node:")]
        assert pinned == list(again["pinned"]) and len(pinned) == 1, (asked, again)  # the record says where
        assert replied.status.value == "SUCCEEDED"  # a node with that resource ran it
        assert "subtask_slot" in asked and json.loads(
            client.get_job_info(f"subtask-{retried}-3").metadata["subtask_resources"]) == {"subtask_slot": 1.0}
        assert open_reservations(ours, paid) == []
        assert cli.json("spend")["per_engine"]["agent"]["committed"] == pytest.approx(0.75)

        # -- best-of: every attempt on Ray, the pick decided at home
        group = cli.ok("start", "--best-of", "2", "--verify", "test -s pick.txt",
                       "seq 1 $SUBTASK_GROUP_MEMBER > pick.txt").split()[0]
        # -- map: one job per batch, each on Ray
        (ours / "src").mkdir()
        for name in ("a", "b"):
            (ours / "src" / f"{name}.txt").write_text(f"{name}\n")
        git(ours, "add", "src")
        git(ours, "commit", "-qm", "two files")
        mapped = cli.ok("map", "src/*.txt", "for f in {files}; do echo mapped >> $f; done",
                        "--verify", "grep -q mapped src/*.txt").split()[0]
        picked = cli("wait", group, timeout=RAY_WAIT)
        assert picked.returncode == 0, picked.stdout + picked.stderr
        shown = cli.json("show", group)
        assert shown["state"] == "picked" and len(shown["members"]) == 2
        for member in shown["members"]:
            assert client.get_job_info(f"subtask-{member}-1").status.value == "SUCCEEDED"
        assert cli("wait", mapped, timeout=RAY_WAIT).returncode == 0
        ran = cli.json("show", mapped)
        assert ran["state"] == "done" and len(ran["members"]) == 2
        for member in ran["members"]:
            assert client.get_job_info(f"subtask-{member}-1").status.value == "SUCCEEDED"

        # -- a failure after any step of a start handed to Ray (`executors/ray.start`, on the start
        # transaction) undoes exactly what was done: here, on the remote, in the ledger; no Ray job
        before = handed_over(ours, remote)
        jobs_before = {j.job_id for j in client.list_jobs()}
        for step in ("after_branch", "start_pinned", "start_job_recorded", "start_reserved", "start_pushed"):
            failed = cli("start", "--engine", "agent", "--max-usd", "1", "more",
                         env={"SUBTASK_FAULT_RAISE": step})
            assert failed.returncode == 128 and f"injected fault at {step}" in failed.stderr, (step, failed.stderr)
            assert handed_over(ours, remote) == before, step
        assert {j.job_id for j in client.list_jobs()} == jobs_before
    finally:
        gate.touch()


def handed_over(clone: Path, remote: Path) -> dict:
    """What a start handed to Ray leaves: the clone's refs, the remote's, open reservations, slots."""
    from subtask.git.gitrepo import open_repo
    from subtask.state import ledger, slots

    state_dir = open_repo(clone).state_dir
    taken = slots.read(state_dir)
    return {"refs": git(clone, "for-each-ref", "--format=%(refname) %(objectname)"),
            "remote": git(remote, "for-each-ref", "--format=%(refname) %(objectname)"),
            "reserved": sorted(r.rid for r in ledger.open_reservations(state_dir)),
            "slots": (taken.running, taken.queue)}


def _jobs_on_both_nodes_come_home_and_a_lost_node_fails_its_own(cluster, tmp_path: Path) -> None:
    """Six jobs, at most two per node at once, come home through git; then the second node is
    lost, its job fails saying so, and the survivor ends done."""
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


def test_one_test_takes_the_cluster_so_a_run_starts_one():
    """pytest-xdist hands tests to its workers one by one (`--dist loadgroup` no longer groups
    them under pytest 9.2, pytest-xdist#1386), and each worker that runs a test taking the module's
    cluster starts one: two such tests were two clusters at once on two cores (~13 s of start, ~1
    GB each). So the scenarios are steps of one test, in the order they must run."""
    import inspect

    takers = [name for name, function in globals().items()
              if name.startswith("test_") and "cluster" in inspect.signature(function).parameters]
    assert len(takers) == 1, takers


def test_the_clusters_minute_starts_with_the_run(request):
    """The cluster's test is the run's longest (~70 s with its cluster's start): marked `early`,
    it is collected among the first `-n 4` tests (tests/conftest.py) and starts at once on a worker
    of its own; collected where its file falls, two thirds of the way, the run ended waiting for
    it alone."""
    cluster_test = test_a_ray_cluster_runs_every_kind_of_job_on_both_nodes_and_outlives_losing_one
    assert [m.name for m in getattr(cluster_test, "pytestmark", [])].count("early") == 1
    early = [item.get_closest_marker("early") is not None for item in request.session.items]
    assert early == sorted(early, reverse=True), "every early test is collected before the others"
    assert early.count(True) <= 5, "a few, so each gets a worker of its own at the start"
