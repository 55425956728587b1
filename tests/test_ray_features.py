"""Everything a local job can ask for, on the suite's two-node Ray cluster (`tests/raycluster.py`):
`--retries` (the loop runs on the node, its money held at home), `reply`, `--after`, `--best-of`
and `map`; what cannot work there (`map --concurrency`, `--judge`) is refused in
tests/test_executors.py. One scenario, so that under xdist one worker starts one cluster (slow,
~1 GB of memory: run it alone on a small machine).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import git, make_team, ray_node_env

sys.path.insert(0, str(Path(__file__).parent))
from raycluster import Cluster  # noqa: E402

RAY_WAIT = float(os.environ.get("SUBTASK_TEST_RAY_WAIT", 180))  # only bounds a failure (slow CI)
pytestmark = pytest.mark.slow

# A paid command engine that keeps a session: it appends its task to agent.txt, commits, and says
# its session and cost. Home reads its settings from the clone's config, the nodes from their
# global one (both written by the test).
AGENT = """#!/bin/sh
echo "$1" >> agent.txt
git add agent.txt && git commit -qm "agent: $1"
echo "session: s-$SUBTASK_JOB_ID${2:+ (resumed $2)}"
echo 'cost: $0.25'
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("ray.job_submission")
    home = tmp_path_factory.mktemp("ray-home")
    env = ray_node_env(tmp_path_factory, home)
    running = Cluster.start(env=env)
    running.home = home
    try:
        yield running
    finally:
        running.stop()


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


def test_retries_reply_after_best_of_and_map_run_on_the_cluster(cluster, tmp_path):
    from ray.job_submission import JobSubmissionClient

    remote, [(_teammate, _), (ours, cli)] = make_team(tmp_path)
    git(ours, "config", "subtask.executor", "ray")
    git(ours, "config", "subtask.ray.address", cluster.address)
    client = JobSubmissionClient(cluster.address)
    script = cluster.home / "agent.sh"
    script.write_text(AGENT)
    agent_settings(ours, [], script)  # home's reading
    agent_settings(cluster.home, ["--file", str(cluster.home / ".gitconfig")], script)  # the nodes' (their HOME)
    gate = tmp_path / "gate"
    try:
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
        assert state_of(ours, after)["attempts"][0]["state"] == "waiting"
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
