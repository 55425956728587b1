"""No secret reaches git, a note, a listing or a state file: the task, the engine's output, verify's
output and the summary are all redacted, and multi-line keys are redacted across lines and reads.

Fake secrets are assembled at run time so this file holds none a scanner would flag.
"""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

from conftest import git, grant_writable, wait_until

PEM_BODY = ["MIIEowIBAAKCAQEAzQ7Xk3bVq9TnYw2Lr8pHsE4mJ6cRfUa1oBgK0iDtZyxWv5N",
            "Hs4Ue7Qx0Pn2Wm9Tb6Kc1Jd8Lf3Ga5Rz0Yv7Xp2Sq9Nw4Mt6Bk1Ch8Dj3Ef5Gi7",
            "Ab3Cd5Ef7Gh9Ij1Kl3Mn5Op7Qr9St1Uv3Wx5Yz7Ab9Cd1Ef3Gh5Ij7Kl9Mn1Op3=="]
PEM = "\n".join(["-----BEGIN RSA " + "PRIVATE KEY-----", *PEM_BODY, "-----END RSA " + "PRIVATE KEY-----"])
AWS = "AKIA" + "Q7XZ2M4PLW8RT3NB"
GHP = "ghp_" + "Zx8Yw7Vu6Ts5Rq4Po3Nm2Lk1Jh0Gf9EdCbAz12"
ANT = "sk-" + "ant-api03-" + "Kq2Wn8Xr4Tz6Yb0Vm3Lp7Hs1Jd5Fg9Ce2Au8Io4"
PASSWORD = "hunter2-" + "Zq9xW"
JWT = ("eyJ" + "hbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiJzdWJ0YXNrLXRlc3QifQ" + ".Qm9vX3NpZ25hdHVyZV9mb3JfdGVzdHM")
SIX = "\n".join([PEM, f"aws {AWS}", f"github {GHP}", f"anthropic {ANT}", f"password={PASSWORD}", f"jwt {JWT}"])
NEEDLES = [*PEM_BODY, AWS, GHP, ANT, PASSWORD, JWT]


def hits(text: str | bytes, where: str) -> list[str]:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return [f"{where}: {needle[:12]}…" for needle in NEEDLES if needle in text]


def heredoc(path: Path | None = None) -> str:
    target = f" > '{path}'" if path else ""
    return f"cat{target} <<'EOF'\n{SIX}\nEOF\n"


def everything_in_git(repo: Path) -> list[str]:
    """Every hit in the repository's .git: objects (loose and packed), notes, and every plain file."""
    found = hits(git(repo, "log", "-p", "--all", "--notes=subtask"), "git log -p --all")
    for line in git(repo, "notes", "--ref=subtask", "list").splitlines():
        found += hits(git(repo, "notes", "--ref=subtask", "show", line.split()[1]), "git notes")
    every = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch-all-objects", "--batch"],
                           capture_output=True, check=True).stdout
    found += hits(every, "git cat-file --batch-all-objects")
    for path in (repo / ".git").rglob("*"):
        if path.is_file():
            found += hits(path.read_bytes(), str(path.relative_to(repo)))
    return found


def test_a_job_carrying_six_secret_formats_leaves_none_in_git_or_any_output(cli, repo, tmp_path):
    """Task, output, verify output and summary each hold the six formats: zero hits anywhere."""
    outside = grant_writable(tmp_path / "outside")
    outside.mkdir()
    (outside / "verify-input.txt").write_text(SIX + "\n")
    task = heredoc(outside / "engine-saw.txt") + heredoc()  # the engine's copy, then its output
    job = cli.start(task, "--verify", f"cat '{outside / 'verify-input.txt'}'")
    assert cli("wait", job).returncode == 0
    assert (outside / "engine-saw.txt").read_text() == SIX + "\n", "the engine got the task as written"
    record = cli.json("show", job)
    assert record["summary"].strip() and record["state_detail"]["attempts"][0]["verify"]["output_tail"].strip()
    found = everything_in_git(repo)
    for args in (["show", job], ["show", job, "--json"], ["list"], ["list", "--json"], ["list", "--all"],
                 ["result", job], ["result", job, "--full"], ["result", job, "--evidence"], ["log", job],
                 ["status", job], ["wait", job]):
        proc = cli(*args)
        found += hits(proc.stdout + proc.stderr, "git subtask " + " ".join(args))
    assert found == []
    assert "password=[REDACTED]" in record["spec"]["task"], "names survive, values do not"


def test_a_key_streamed_line_by_line_is_redacted_in_events_record_and_summary(cli, repo):
    script = ("printf 'start\\n'; " + "; ".join(f"echo '{line}'; sleep 0.01" for line in PEM.splitlines())
              + "; echo done")
    job = cli.start(script)
    cli.ok("wait", job)
    events = repo / ".git" / "subtask" / "run" / f"{job}.events.jsonl"
    texts = [json.loads(line).get("text") for line in events.read_text().splitlines()]
    assert "[REDACTED]" in texts and "done" in texts and "start" in texts
    assert hits(events.read_text(), "events") == []
    record = cli.json("show", job)
    assert hits(record["summary"], "summary") == []
    assert hits(git(repo, "show", f"refs/subtask/{job}/record:events.jsonl"), "record events") == []


def test_a_key_split_across_reads_of_one_line_is_still_caught(cli, repo):
    """The token arrives in two writes with a pause between: one line, two reads."""
    half = len(ANT) // 2
    job = cli.start(f"printf 'key {ANT[:half]}'; sleep 0.3; printf '{ANT[half:]} ok\\n'")
    cli.ok("wait", job)
    assert hits(cli.ok("show", job, "--json"), "show") == []
    events = repo / ".git" / "subtask" / "run" / f"{job}.events.jsonl"
    assert hits(events.read_text(), "events") == [] and "[REDACTED] ok" in events.read_text()


def test_the_task_as_written_is_private_for_the_life_of_the_job_only(cli, repo, tmp_path):
    grant_writable(tmp_path)  # the job writes what it saw beside the repository
    release = tmp_path / "release"
    seen = tmp_path / "seen.txt"
    task = f"echo '{GHP} password={PASSWORD}' > '{seen}'\nwhile [ ! -e '{release}' ]; do sleep 0.05; done"
    job = cli.start(task)
    try:
        private = repo / ".git" / "subtask" / "run" / f"{job}.1.private.json"
        assert wait_until(seen.exists, 20)
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
        assert json.loads(private.read_text())["message"] == task
        assert hits(git(repo, "show", f"refs/subtask/{job}/record:spec.json"), "spec") == []
        assert hits(cli.ok("list", "--json"), "list --json") == []
    finally:
        release.touch()
    cli.ok("wait", job)
    assert seen.read_text() == f"{GHP} password={PASSWORD}\n"
    assert not private.exists(), "removed when the attempt ends"
    assert hits(cli.ok("show", job), "show") == []


def test_a_reply_is_stored_redacted_and_run_as_written(cli, repo, tmp_path):
    grant_writable(tmp_path)  # the job writes what it saw beside the repository
    seen = tmp_path / "reply-saw.txt"
    job = cli.start("true")
    cli.ok("wait", job)
    cli.ok("reply", job, f"echo 'token {ANT}' > '{seen}'")
    cli.ok("wait", job)
    assert seen.read_text() == f"token {ANT}\n"
    attempts = cli.json("show", job)["state_detail"]["attempts"]
    assert "[REDACTED]" in attempts[1]["message"]
    assert everything_in_git(repo) == []


def test_a_secret_in_the_verify_command_is_recorded_redacted_and_run_as_written(cli, repo, tmp_path):
    job = cli.start("true", "--verify", f"test '{GHP}' = '{GHP}' && echo checked")
    assert cli("wait", job).returncode == 0, "verify ran the command as written"
    assert cli.json("show", job)["spec"]["verify"].count("[REDACTED]") == 2
    assert everything_in_git(repo) == []
    assert not list((repo / ".git" / "subtask" / "run").glob("*.private.json"))


def test_readonly_jobs_redact_their_task_too(cli, repo):
    job = cli.start(f"echo 'aws {AWS}'", "--readonly")
    cli.ok("wait", job)
    assert everything_in_git(repo) == []


LONG_BODY = [f"Zk{i:04d}" + "Q2hhcmFjdGVycyBvZiBhIGtleSBib2R5IGxpbmUgdGhhdCBuZXZlciBlbmRz"[:58] for i in range(80)]


def long_key_script() -> str:
    """A key that never ends: BEGIN, then far more body lines than a summary or a tail holds."""
    body = "\\n".join(LONG_BODY)
    return f"printf '%s\\n' '-----BEGIN EC PRIVATE ''KEY-----'; printf '{body}\\n'"


def test_a_key_open_until_the_stream_ends_leaves_no_body_line_in_summary_or_events(cli, repo):
    job = cli.start(long_key_script())
    cli.ok("wait", job)
    record = cli.json("show", job)
    events = (repo / ".git" / "subtask" / "run" / f"{job}.events.jsonl").read_text()
    for text in (record["summary"], events, cli.ok("result", job, "--full")):
        assert not any(line[:6] in text for line in LONG_BODY), text


def test_verify_output_with_an_unended_key_keeps_no_body_line_in_its_tail(cli, repo):
    job = cli.start("true", "--verify", long_key_script())
    cli.ok("wait", job)
    tail = cli.json("show", job)["state_detail"]["attempts"][0]["verify"]["output_tail"]
    assert "[REDACTED]" in tail
    assert not any(line[:6] in tail for line in LONG_BODY), tail
