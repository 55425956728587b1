"""The verify loop and the checks, through the real CLI and real workers (docs/verify.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import git, make_repo, refs, wait_for_run_lock_release

from subtask.git.gitrepo import open_repo
from subtask.state import ledger

# Each run counts itself in n.txt (so every attempt changes something) and keeps what the retry
# was told about verify.
COUNTING = ('n=$(cat n.txt 2>/dev/null || echo 0); echo $((n+1)) > n.txt; '
            'if [ -n "$SUBTASK_VERIFY_OUTPUT" ]; then cp "$SUBTASK_VERIFY_OUTPUT" "told-$((n+1)).txt"; fi')


def attempts_of(cli, job: str) -> list[dict]:
    return cli.json("show", job)["state_detail"]["attempts"]


def test_a_shell_job_that_passes_on_its_second_run_ends_done_after_two_attempts(cli, repo):
    job = cli.start(COUNTING, "--verify", 'echo "n is $(cat n.txt)"; test "$(cat n.txt)" -ge 2', "--retries", "3")
    assert cli("wait", job).returncode == 0
    attempts = attempts_of(cli, job)
    assert [(a["n"], a["state"], a["verify"]["passed"], a["retry"]) for a in attempts] == [
        (1, "done", False, None), (2, "done", True, 1)]
    assert attempts[0]["verify"]["exit_code"] == 1 and "n is 1" in attempts[0]["verify"]["output_tail"]
    # the retry ran the task again, told through SUBTASK_VERIFY_OUTPUT what verify said
    told = git(repo, "show", f"subtask/{job}:told-2.txt")
    assert told.startswith('verify: echo "n is $(cat n.txt)"; test "$(cat n.txt)" -ge 2 -> exit 1 on ')
    assert "n is 1" in told
    assert git(repo, "show", f"subtask/{job}:n.txt") == "2"
    # each attempt has its line in show and in the note
    shown = cli.ok("show", job)
    assert "attempt 1: done · verify failed" in shown and "attempt 2 (retry 1): done · verify passed" in shown
    note = git(repo, "notes", "--ref=subtask", "show", f"subtask/{job}")
    assert note.splitlines()[0].startswith(f"subtask {job} · done · verify passed")
    assert "  1: done · verify failed (exit 1)" in note and "  2: retry 1 · done · verify passed" in note
    # the file the retry was told through is gone with its attempt
    state = open_repo(repo).state_dir
    assert not list((state / "run").glob(f"{job}.*.verify.txt"))


def test_a_job_that_never_passes_ends_at_n_plus_1_attempts_with_the_best_on_its_branch(cli, repo):
    verify = ('n=$(cat n.txt); case $n in 1) echo "2 passed, 3 failed in 0.1s";; '
              '2) echo "4 passed, 1 failed in 0.1s";; *) echo "1 passed, 4 failed in 0.1s";; esac; exit 1')
    job = cli.start(COUNTING, "--verify", verify, "--retries", "2")
    assert cli("wait", job).returncode == 1
    shown = cli.json("show", job)
    attempts = shown["state_detail"]["attempts"]
    assert len(attempts) == 3 and [a["state"] for a in attempts] == ["done"] * 3
    assert [a["verify"]["tests"] for a in attempts] == [{"passed": 2, "failed": 3}, {"passed": 4, "failed": 1},
                                                        {"passed": 1, "failed": 4}]
    assert attempts[2]["not_retried"] == "no retries left (2 used)"
    heads = [a["head"] for a in attempts]
    best = shown["state_detail"]["best"]
    assert best == {"attempt": 2, "head": heads[1], "why": "most tests passed (4 passed, 1 failed)",
                    "moved_from": heads[2]}
    # the branch, its worktree and the evidence are those of attempt 2; every attempt's head is pinned
    assert git(repo, "rev-parse", f"subtask/{job}") == heads[1]
    worktree = repo / ".subtask" / "worktrees" / job
    assert (worktree / "n.txt").read_text() == "2\n" and not (worktree / "told-3.txt").exists()
    assert git(worktree, "status", "--porcelain") == ""
    assert shown["evidence"]["head"] == heads[1] and shown["evidence"]["attempt"] == 2
    for n, head in enumerate(heads, 1):
        assert git(repo, "rev-parse", f"refs/subtask/{job}/attempts/{n}") == head
    assert git(repo, "rev-parse", f"refs/subtask/{job}/head") == heads[1]
    assert "left at attempt 2: most tests passed (4 passed, 1 failed)" in cli.ok("show", job)
    note = git(repo, "notes", "--ref=subtask", "show", heads[1])
    assert "left at attempt 2" in note
    # the record and git agree
    assert cli("verify", job).returncode == 0, cli.ok("verify", job)


def test_the_loop_ends_at_the_first_attempt_that_changed_nothing(cli, repo):
    job = cli.start("echo same > same.txt", "--verify", "false", "--retries", "4")
    assert cli("wait", job).returncode == 1
    attempts = attempts_of(cli, job)
    assert len(attempts) == 2
    assert attempts[1]["not_retried"] == "it changed nothing"
    assert attempts[0]["head"] == attempts[1]["head"]


def test_a_job_that_passes_first_time_runs_once(cli, repo):
    job = cli.start("echo ok > ok.txt", "--verify", "test -f ok.txt", "--retries", "2")
    assert cli("wait", job).returncode == 0
    assert len(attempts_of(cli, job)) == 1


def test_retries_need_a_verify_and_a_sane_count(cli, repo):
    for args, words in ((["--retries", "2"], "--retries needs --verify"),
                        (["--retries", "6", "--verify", "true"], "from 0 to 5"),
                        (["--retries", "-1", "--verify", "true"], "from 0 to 5"),
                        (["--retries", "1", "--verify", "true", "--readonly"], "--readonly"),
                        (["--check", "no-such"], "unknown check")):
        proc = cli("start", *args, "true")
        assert proc.returncode == 129 and words in proc.stderr, (args, proc.stderr)
    assert refs(repo, "refs/subtask") == [] and refs(repo, "refs/heads/subtask") == []


# ---------------------------------------------------------------- checks: gaming the verify

@pytest.fixture
def project(tmp_path) -> Path:
    repo = make_repo(tmp_path / "project", {
        "src/calc.py": "def add(a, b):\n    return a - b\n",
        "tests/test_calc.py": "from src.calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n"
                              "def test_zero():\n    assert add(0, 0) == 0\n",
    })
    return repo


@pytest.mark.parametrize("task, check, found", [
    ("git rm -q tests/test_calc.py", "no-test-deletion", "tests/test_calc.py removed"),
    ("sed -i 's/^def test_add/@pytest.mark.skip\\ndef test_add/' tests/test_calc.py", "no-suppression",
     "tests/test_calc.py:4 adds @pytest.mark.skip"),
    ("sed -i 's/return a - b/return a - b  # noqa/' src/calc.py", "no-suppression", "src/calc.py:2 adds # noqa"),
    ("echo notes > NOTES.md; sed -i 's/a - b/a + b/' src/calc.py", "paths=src/**", "NOTES.md is outside src/**"),
])
def test_a_job_that_games_its_verify_ends_failed_naming_the_check(project, task, check, found):
    from conftest import Cli

    cli = Cli(project)
    args = ["--check", "paths=src/**"] if check.startswith("paths") else []
    job = cli.start(task, "--verify", "true", *args)
    assert cli("wait", job).returncode == 1
    attempt = attempts_of(cli, job)[0]
    assert attempt["state"] == "failed" and attempt["error_kind"] == "check"
    assert attempt["verify"]["exit_code"] == 0 and attempt["verify"]["passed"] is False
    assert attempt["verify"]["checks_failed"] == [check]
    assert f"check {check} failed: {found}" in attempt["reason"]
    line = cli.ok("result", job, check=False) if False else cli("result", job).stdout
    assert line.splitlines()[0].startswith(f"{job} failed · verify failed · check")
    assert f"check {check} failed: {found}" in line


def test_check_none_lets_a_meant_deletion_pass(project):
    from conftest import Cli

    cli = Cli(project)
    job = cli.start("git rm -q tests/test_calc.py", "--verify", "true", "--check", "none")
    assert cli("wait", job).returncode == 0
    assert attempts_of(cli, job)[0].get("checks") is None
    assert cli.json("show", job)["spec"]["checks"] == []


def test_a_failed_check_feeds_the_loop_like_a_failed_verify(project):
    from conftest import Cli

    cli = Cli(project)
    # first run: silence the failing test; the retry (told why) fixes the code and drops the marker
    task = ('if [ -n "$SUBTASK_VERIFY_OUTPUT" ]; then cp "$SUBTASK_VERIFY_OUTPUT" told.txt; git checkout -q HEAD~1 -- '
            'tests/test_calc.py; sed -i "s/a - b/a + b/" src/calc.py; '
            'else sed -i "s/^def test_add/@pytest.mark.skip\\ndef test_add/" tests/test_calc.py; fi')
    verify = f"{sys.executable} -m pytest -q -p no:cacheprovider tests"
    job = cli.start(task, "--verify", verify, "--retries", "1")
    assert cli("wait", job).returncode == 0, cli.ok("show", job)
    attempts = attempts_of(cli, job)
    assert [a["state"] for a in attempts] == ["failed", "done"]
    assert attempts[0]["verify"]["checks_failed"] == ["no-suppression"]
    assert attempts[1]["verify"]["passed"] is True and attempts[1]["verify"]["tests"] == {"passed": 2, "failed": 0}
    told = git(project, "show", f"subtask/{job}:told.txt")
    assert "checks: check no-suppression failed: tests/test_calc.py:4 adds @pytest.mark.skip" in told


def test_a_summary_that_claims_a_pass_is_answered_by_the_record(cli, repo):
    job = cli.start("echo work > w.txt; echo 'All tests pass.'; echo 'Updated w.txt and src/missing.py.'",
                    "--verify", "echo '1 failed, 2 passed'; exit 1")
    assert cli("wait", job).returncode == 1
    claims = cli.json("show", job)["evidence"]["claims"]
    assert claims == [{"claim": "All tests pass", "against": "verify failed (exit 1)"},
                      {"claim": "changed src/missing.py", "against": "not in the diff"}]
    line = 'claims: "All tests pass" — verify failed (exit 1); "changed src/missing.py" — not in the diff'
    assert line in cli("result", job).stdout
    assert line.replace("claims: ", "claims:  ") in git(repo, "notes", "--ref=subtask", "show", f"subtask/{job}")


# ---------------------------------------------------------------- money

PAID_AGENT = """import subprocess, sys
with open("runs.txt", "a") as out:
    out.write("run\\n")
subprocess.run(["git", "add", "runs.txt"], check=True)
subprocess.run(["git", "commit", "-q", "-m", "one more run"], check=True)
print("cost: $0.42")
print("STATUS: done")
"""


def paid_engine(repo: Path) -> None:
    script = repo.parent / "paid_agent.py"
    script.write_text(PAID_AGENT)
    git(repo, "config", "subtask.engine.fakepaid.command", json.dumps([sys.executable, str(script), "{task}"]))
    git(repo, "config", "subtask.engine.fakepaid.paid", "true")
    git(repo, "config", "subtask.engine.fakepaid.costPattern", r"cost: \$([0-9.]+)")


def ledger_rids(repo: Path) -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in (open_repo(repo).state_dir / "ledger.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "rid" in row:
            rows.setdefault(row["rid"], []).append(row["op"])
    return rows


def test_each_retry_of_a_paid_engine_reserves_and_is_charged_like_a_reply(cli, repo):
    paid_engine(repo)
    job = cli.start("one more run", "--engine", "fakepaid", "--max-usd", "3", "--verify",
                    'test "$(wc -l < runs.txt)" -ge 3', "--retries", "2")
    assert cli("wait", job).returncode == 0
    attempts = attempts_of(cli, job)
    assert [a["cost"]["charged"] for a in attempts] == [0.42, 0.42, 0.42]
    assert [a["rid"] for a in attempts] == [f"{job}.1", f"{job}.2", f"{job}.3"]
    assert ledger_rids(repo) == {f"{job}.{n}": ["reserve", "close"] for n in (1, 2, 3)}
    assert cli.json("spend")["committed_usd"] == pytest.approx(1.26)


def test_a_paid_retry_the_monthly_cap_cannot_hold_is_refused_with_nothing_reserved(cli, repo):
    paid_engine(repo)
    # $3 fits for the first attempt; after it, $0.42 is spent and $3 more does not fit under $3.20
    git(repo, "config", "subtask.monthlyCapUsd", "3.2")
    job = cli.start("one more run", "--engine", "fakepaid", "--max-usd", "3", "--verify", "false", "--retries", "2")
    assert cli("wait", job).returncode == 1
    attempts = attempts_of(cli, job)
    assert len(attempts) == 1
    assert attempts[0]["not_retried"].startswith("refused: reserving $3.00 for "
                                                 + f"{job}.2 would exceed the monthly cap")
    assert ledger_rids(repo) == {f"{job}.1": ["reserve", "close"]}
    assert ledger.open_reservations(open_repo(repo).state_dir) == []
    assert cli.json("spend")["committed_usd"] == pytest.approx(0.42)
    # ... but where the cap holds exactly what a reply would need, the retry runs
    # 0.42 spent before, 0.42 + 0.42 + 3: the second retry fits to the cent
    git(repo, "config", "subtask.monthlyCapUsd", "4.26")
    job = cli.start("one more run", "--engine", "fakepaid", "--max-usd", "3", "--verify", "false", "--retries", "2")
    assert cli("wait", job).returncode == 1
    assert len(attempts_of(cli, job)) == 3


def test_a_worker_killed_after_reserving_a_retry_leaks_no_slot_and_no_money(cli, repo):
    paid_engine(repo)
    job = cli.start("one more run", "--engine", "fakepaid", "--max-usd", "3", "--verify", "false", "--retries", "2",
                    env={"SUBTASK_FAULT": "after_retry_reserved"})
    wait_for_run_lock_release(repo, job)
    assert cli("wait", job).returncode == 1  # the next command settles the dead worker
    attempts = attempts_of(cli, job)
    assert len(attempts) == 1 and attempts[0]["state"] == "failed" and attempts[0]["reason"] == "worker died"
    assert ledger_rids(repo) == {f"{job}.1": ["reserve", "close"], f"{job}.2": ["reserve", "close"]}
    state = open_repo(repo).state_dir
    assert ledger.open_reservations(state) == []
    assert json.loads((state / "slots.json").read_text())["running"] == []
    assert not list((state / "run").glob(f"{job}.2.*"))


# ---------------------------------------------------------------- groups

def test_a_member_that_games_its_verify_is_never_the_pick(project):
    from conftest import Cli

    cli = Cli(project)
    task = ('if [ "$SUBTASK_GROUP_MEMBER" = 1 ]; then git rm -q tests/test_calc.py; '
            'else sed -i "s/a - b/a + b/; s/^$/\\n/" src/calc.py; fi')
    verify = f"{sys.executable} -m pytest -q -p no:cacheprovider tests || test ! -d tests"
    out = cli.ok("start", "--best-of", "2", "--verify", verify, "--pick", "smallest", "--retries", "1", task)
    gid = out.split()[0]
    assert cli("wait", gid).returncode == 0
    group = cli.json("show", gid)
    members = group["members"]
    assert group["pick"] == members[1]
    first = cli.json("show", members[0])["state_detail"]["attempts"]
    assert first[0]["state"] == "failed" and first[0]["verify"]["checks_failed"] == ["no-test-deletion"]
    assert len(first) == 2 and first[1]["retry"] == 1  # each member loops on its own
    assert len(cli.json("show", members[1])["state_detail"]["attempts"]) == 1


# ---------------------------------------------------------------- the same through MCP

def test_mcp_start_takes_retries_and_checks_and_answers_like_the_cli(project, monkeypatch):
    import anyio
    from mcp import Client

    from subtask.faces.mcp_server import server

    monkeypatch.chdir(project)
    task = ('if [ -n "$SUBTASK_VERIFY_OUTPUT" ]; then sed -i "s/a [*] b/a + b/" src/calc.py; '
            'else echo draft > NOTES.md; sed -i "s/a - b/a * b/" src/calc.py; fi')
    verify = f"{sys.executable} -m pytest -q -p no:cacheprovider tests"

    async def main():
        async with Client(server, mode="legacy") as client:
            started = await client.call_tool("start", {"task": task, "verify": verify, "retries": 2,
                                                       "check": ["paths=src/**"]})
            job = started.structured_content["id"]
            await client.call_tool("wait", {"ids": [job], "timeout": 120})
            result = await client.call_tool("result", {"id": job})
            shown = await client.call_tool("show", {"id": job})
            bad = await client.call_tool("start", {"task": "true", "retries": 9, "verify": "true"})
            return job, result, shown, bad

    job, result, shown, bad = anyio.run(main)
    envelope = result.structured_content
    assert envelope["state"] == "failed" and envelope["attempts"] == 3
    # the first attempt wrote outside src/; its retry fixed the code but the note it left stays,
    # and the next one changed nothing
    assert [a["checks_failed"] for a in envelope["loop"]] == [["paths=src/**"]] * 3
    assert envelope["loop"][1]["retry"] == 1 and envelope["loop"][1]["tests"] == {"passed": 2, "failed": 0}
    assert envelope["loop"][2]["not_retried"] == "it changed nothing"
    assert envelope["best"] is None  # every attempt failed a check: none is a better place to leave it
    text = result.content[0].text
    assert "check paths=src/** failed: NOTES.md is outside src/**" in text
    assert "attempts: 1: failed · verify failed (check paths=src/**; 1 passed, 1 failed)" in text
    assert "attempt 2 (retry 1): failed · verify failed (check paths=src/**; 2 passed, 0 failed)" in \
        shown.content[0].text
    # its parameter, never the flag
    assert bad.is_error and "error: retries must be a whole number from 0 to 5" in bad.content[0].text


def test_a_re_run_verify_fails_on_the_recorded_checks_whatever_the_command_exits(project):
    """`merge` re-runs a record it cannot trust (and `verify --run` any): the checks the job
    recorded run there too, so a record that says "passed" of a deleted test is not enough."""
    from conftest import Cli

    from subtask.git import records
    from subtask.ops.landing import verify_rerun

    cli = Cli(project)
    job = cli.start("git rm -q tests/test_calc.py", "--verify", "true")
    cli("wait", job)
    repo = open_repo(project)
    recorded = records.read(repo, job)
    rerun = verify_rerun.run(repo, recorded, git(project, "rev-parse", f"subtask/{job}"))
    assert rerun.result.exit_code == 0 and rerun.result.passed is False
    assert rerun.result.checks_failed == ["no-test-deletion"]
    assert "exit 0; check no-test-deletion failed" in rerun.line(job)
    checked = cli("verify", "--run", job)
    assert "failed (exit 0; check no-test-deletion failed)" in checked.stdout


def test_completion_knows_the_checks_and_the_retries(cli):
    assert cli.ok("__complete", "start", "--check").split() == ["no-test-deletion", "no-suppression", "paths=", "none"]
    assert cli.ok("__complete", "start", "--retries").split() == ["0", "1", "2", "3", "4", "5"]
    assert {"--retries", "--check"} <= set(cli.ok("__complete", "start").split())


def test_a_reply_after_a_failed_loop_runs_its_own_loop_and_clears_where_the_last_was_left(cli, repo):
    verify = ('n=$(cat n.txt); case $n in 1) echo "3 passed, 1 failed";; 2) echo "1 passed, 3 failed";; '
              '*) echo "4 passed";; esac; test "$n" -ge 4')
    job = cli.start(COUNTING, "--verify", verify, "--retries", "1")
    assert cli("wait", job).returncode == 1
    shown = cli.json("show", job)
    assert shown["state_detail"]["best"]["attempt"] == 1
    assert git(repo, "show", f"subtask/{job}:n.txt") == "1"  # left at attempt 1
    cli.ok("reply", job, COUNTING)  # from attempt 1's work: n is 2, then 3 in its own retry
    assert cli("wait", job).returncode == 1
    attempts = cli.json("show", job)["state_detail"]["attempts"]
    assert [(a["n"], a["retry"]) for a in attempts] == [(1, None), (2, 1), (3, None), (4, 1)]
    cli.ok("reply", job, COUNTING)
    assert cli("wait", job).returncode == 0
    shown = cli.json("show", job)
    assert shown["state_detail"]["best"] is None and shown["state_detail"]["attempts"][-1]["verify"]["passed"]


def test_a_teammate_cannot_move_the_pin_of_one_of_my_attempts(tmp_path):
    from conftest import make_team

    remote, ((a, cli_a), (b, cli_b)) = make_team(tmp_path)
    mine = cli_b.start(COUNTING, "--verify", "false", "--retries", "1")
    cli_b("wait", mine)
    pin = f"refs/subtask/{mine}/attempts/1"
    ours = git(b, "rev-parse", pin)
    cli_b.ok("push")
    cli_a.ok("pull")
    git(a, "fetch", "-q", "origin", f"{pin}:{pin}")  # (pull fetches every refs/subtask/* ref; to be sure)
    forged = git(a, "commit-tree", "-p", ours, "-m", "forged", f"{ours}^{{tree}}")
    git(a, "update-ref", pin, forged)
    git(a, "push", "-q", "origin", pin)
    pulled = cli_b("pull")
    assert git(b, "rev-parse", pin) == ours, pulled.stdout
    assert git(b, "rev-parse", f"refs/subtask-theirs/origin/{mine}/attempts/1") == forged


# The retry's verify does worse and then changes its worktree's git metadata (after the worker's
# last look at it, before the branch is moved back to the better attempt).
WORSE_THEN = """if [ -z "${{SUBTASK_RETRY:-}}" ]; then echo '2 passed, 1 failed'; exit 1; fi
echo '0 passed, 3 failed'
{tamper}
exit 1
"""
TAMPERS = {
    # a smudge filter in the admin folder's config.worktree, which git reads (extensions.worktreeConfig)
    "config.worktree": ("d=$(git rev-parse --git-dir); git config -f \"$d/config.worktree\" filter.x.smudge "
                        "\"sh -c 'touch {marker}; cat'\"; echo '* filter=x' > .gitattributes"),
    "HEAD": "h=$(git rev-parse HEAD); echo $h > \"$(git rev-parse --git-dir)/HEAD\"",  # detached
}


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_the_branch_is_not_moved_back_through_metadata_the_last_verify_changed(cli, repo, tmp_path, tamper):
    """Moving the branch back to the best attempt rewrites the worktree's files (`read-tree -u`)
    through the admin folder checked before verify ran: a smudge filter the verify then wrote into
    its config.worktree ran unconfined. The metadata is checked again before the move."""
    marker = tmp_path / "escaped"
    git(repo, "config", "core.repositoryformatversion", "1")
    git(repo, "config", "extensions.worktreeConfig", "true")
    (repo / "v.sh").write_text(WORSE_THEN.format(tamper=TAMPERS[tamper].format(marker=marker)))
    git(repo, "add", "v.sh")
    git(repo, "commit", "-qm", "a verify script")
    job = cli.start("echo ${SUBTASK_RETRY:-0} > n.txt && git add n.txt && git commit -qm n", "--verify", "sh v.sh",
                    "--retries", "1", "--check", "none")
    assert cli("wait", job).returncode == 1
    shown = cli.json("show", job)["state_detail"]
    assert not marker.exists(), "a filter the job's verify wrote ran outside its sandbox"
    best = shown["best"]
    assert best["attempt"] == 1 and best["moved_from"] is None and "metadata" in best["why"], best
    assert git(repo, "rev-parse", f"subtask/{job}") == shown["attempts"][-1]["head"]  # left where it was
