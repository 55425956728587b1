"""Executors behind one registry: the core asks `subtask.model.executors` what a job's executor can do
and hands a job run elsewhere to its backend, never comparing names (issue 30)."""

from __future__ import annotations

import sys
import types

import pytest
from conftest import git, refs

from subtask import api
from subtask.git import records
from subtask.model import executors


@pytest.mark.parametrize("args, flag, missing", [
    (["--verify", "true", "--best-of", "2", "--judge", "true"], "--judge", "each attempt's worktree"),
])
def test_what_an_executor_elsewhere_cannot_do_is_refused_naming_what_is_missing(cli, repo, args, flag, missing):
    before = refs(repo)
    refused = cli("start", "--on", "ray", *args, "echo hi")
    assert refused.returncode == 129, refused.stderr
    assert f"{flag} is not supported for a job on ray: " in refused.stderr and missing in refused.stderr
    assert "--on local" in refused.stderr and "Traceback" not in refused.stderr
    assert refs(repo) == before


def test_a_map_bounded_by_local_slots_is_refused_on_an_executor_elsewhere(cli, repo):
    git(repo, "config", "subtask.executor", "ray")
    refused = cli("map", "*.md", "look at {files}", "--concurrency", "2")
    assert refused.returncode == 129 and "map --concurrency is not supported for a job on ray: " in refused.stderr
    assert "subtask_slot" in refused.stderr and refs(repo, "refs/subtask") == []


def test_ray_can_do_what_a_local_job_can_but_those_two(repo):
    ray = executors.REGISTRY["ray"]
    assert ray.can == frozenset(executors.FEATURES) - {"concurrency", "judge"}
    assert set(dict(ray.missing)) == {"concurrency", "judge"}


def test_an_unknown_executor_is_a_usage_error(cli, repo):
    refused = cli("start", "--on", "moon", "echo hi")
    assert refused.returncode == 129 and "it must be local or ray" in refused.stderr


def test_a_new_executor_is_one_registry_entry_and_the_core_hands_it_its_jobs(repo, monkeypatch):
    """An executor registered with a backend gets the job at start, `wait`'s watch and `stop`; the
    start says where the job is and `list` shows it `on` that executor."""
    calls: list[str] = []
    backend = types.ModuleType("fake_elsewhere")

    def submit(repo_, job, paid):
        calls.append("submit")
        job.spec.extra["executor"] = {"kind": "fake"}
        records.create(repo_, job)
        return job

    def stop(repo_, job_id):
        calls.append("stop")
        return records.update(repo_, job_id, lambda job: setattr(job.state.current, "state", "stopped"))

    backend.submit, backend.stop = submit, stop
    backend.collect_active = lambda repo_, entries: calls.append(f"collect {len(entries)}") or []
    monkeypatch.setitem(sys.modules, "fake_elsewhere", backend)
    monkeypatch.setitem(executors.REGISTRY, "fake", executors.Executor("fake", "fake_elsewhere", frozenset()))
    monkeypatch.chdir(repo)
    here = api.repo_at(repo)

    started = api.start(here, api.StartRequest(task="echo hi", engine="shell", on="fake"))
    assert (started.on, started.state) == ("fake", "queued")
    [entry] = [e for e in api.list_jobs(here).jobs if e["id"] == started.job.id]
    assert entry["on"] == "fake"
    assert api.stop(here, started.job.id).state.current.state == "stopped"
    assert calls[0] == "submit" and "stop" in calls


class _Answering:
    """A job client that answers every status request with the error `text` (as Ray's SDK raises
    an HTTP error: `RuntimeError("Request failed with status code 404: ...")`)."""

    def __init__(self, text: str):
        self.text = text

    def get_job_info(self, submission_id: str):
        raise RuntimeError(self.text)


@pytest.mark.parametrize(("answer", "status"), [
    ("Request failed with status code 404: Job subtask-st-00000001-1 does not exist.", "MISSING"),
    ("Request failed with status code 404: 404: Not Found.", None),  # another server at the address
    ("Request failed with status code 500: actor not found while the dashboard restarts.", None),
])
def test_a_ray_job_is_lost_only_when_ray_says_it_has_no_such_job(monkeypatch, answer, status):
    """Home ends a job whose Ray answer is MISSING ("Ray lost it": failed). Only Ray's own words
    for a job it does not have say so; any other error (a proxy's or another server's 404, a
    dashboard restarting) is Ray not reached: the job is left as it is, and asked again later."""
    pytest.importorskip("ray.job_submission")
    from subtask.executors import ray as ray_executor

    monkeypatch.setattr(ray_executor, "client", lambda address: _Answering(answer))
    attempt = types.SimpleNamespace(extra={"ray_job": "subtask-st-00000001-1"})
    job = types.SimpleNamespace(spec=types.SimpleNamespace(extra={"executor": {"kind": "ray", "address": "http://a:1"}}),
                                state=types.SimpleNamespace(current=attempt))
    assert ray_executor.ray_state(job).status == status

