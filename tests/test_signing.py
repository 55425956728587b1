"""Signed provenance (issue 29): records, groups and notes signed as git signs, checked as git checks.

Real ed25519 keys made in the test with ssh-keygen, an allowed-signers file, no network.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git, make_team, refs
from test_provenance import MAKES_X, forge, ran_verify, take, teammate_job, writable_folder
from test_start import snapshot


@pytest.fixture
def keys(tmp_path) -> dict[str, Path]:
    """Two keys (alice, mallory) and an allowed-signers file that lists alice only."""
    folder = tmp_path / "keys"
    folder.mkdir()
    made = {}
    for name in ("alice", "mallory"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(folder / name)],
                       check=True)
        made[name] = folder / name
    allowed = folder / "allowed_signers"
    allowed.write_text(f"alice@example.com {' '.join((folder / 'alice.pub').read_text().split()[:2])}\n")
    made["allowed"] = allowed
    return made


def sign_with(repo: Path, key: Path, allowed: Path) -> None:
    git(repo, "config", "gpg.format", "ssh")
    git(repo, "config", "user.signingKey", str(key))
    git(repo, "config", "gpg.ssh.allowedSignersFile", str(allowed))


def signature_codes(repo: Path, rev: str) -> list[str]:
    """git's own verdict (%G?) on every commit of `rev`'s history, newest first."""
    return git(repo, "log", "--format=%G?", rev).splitlines()


def test_with_a_key_every_record_group_and_notes_commit_is_signed_and_show_says_by_whom(cli, repo, keys):
    sign_with(repo, keys["alice"], keys["allowed"])
    job = cli.start("echo hi > hi.txt", "--verify", "test -f hi.txt")
    cli.ok("wait", job)
    record = signature_codes(repo, f"refs/subtask/{job}/record")
    assert len(record) >= 3 and set(record) == {"G"}, record
    assert signature_codes(repo, "refs/notes/subtask")[0] == "G"
    gid = cli.ok("start", "--best-of", "2", "true", "--verify", "true").split()[0]
    cli.ok("wait", gid)
    assert set(signature_codes(repo, f"refs/subtask/groups/{gid}/record")) == {"G"}

    shown = cli.json("show", job)
    assert shown["signature"]["status"] == "good" and shown["signature"]["trusted"] is True
    assert shown["signature"]["signer"] == "alice@example.com" and shown["mine"] is True
    assert "signed by alice@example.com" in cli.ok("show", job) and "started in this clone" in cli.ok("show", job)
    listed = {e["id"]: e for e in cli.json("list")["jobs"]}
    assert listed[job]["signature"]["signer"] == "alice@example.com" and listed[job]["mine"] is True
    note = git(repo, "notes", "--ref=subtask", "show", f"refs/subtask/{job}/head")
    assert "record:  signed by alice@example.com" in note and "an allowed signer" in note


def test_without_a_key_or_with_sign_never_nothing_is_signed(cli, repo, keys):
    job = cli.start("true")
    cli.ok("wait", job)
    assert set(signature_codes(repo, f"refs/subtask/{job}/record")) == {"N"}
    assert cli.json("show", job)["signature"]["status"] == "unsigned"
    assert "record:" not in git(repo, "notes", "--ref=subtask", "show", "HEAD")
    sign_with(repo, keys["alice"], keys["allowed"])
    git(repo, "config", "subtask.sign", "never")
    git(repo, "config", "commit.gpgSign", "true")  # the user's own commits: not ours to follow
    other = cli.start("true")
    cli.ok("wait", other)
    assert set(signature_codes(repo, f"refs/subtask/{other}/record")) == {"N"}
    git(repo, "config", "--unset", "gpg.ssh.allowedSignersFile")
    assert "gpg.ssh.allowedSignersFile is not set" in cli("doctor").stdout


def test_sign_always_without_a_usable_key_refuses_to_start_and_changes_nothing(cli, repo, keys):
    git(repo, "config", "subtask.sign", "always")
    cli.ok("init")  # the notes config a first start would write
    before = snapshot(repo)
    proc = cli("start", "true")
    assert proc.returncode == 128 and "no signing key" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "hint: git config user.signingKey" in proc.stderr
    assert snapshot(repo) == before
    assert "subtask.sign is always but git has no signing key" in cli("doctor").stdout
    sign_with(repo, keys["alice"].parent / "missing-key", keys["allowed"])  # configured, but not there
    proc = cli("start", "true")
    assert proc.returncode == 128 and "could not sign" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert snapshot(repo) == before
    assert not [r for r in refs(repo) if "subtask" in r and not r.startswith("refs/notes")]


def test_auto_with_a_broken_key_writes_unsigned_records_and_says_so(cli, repo, keys):
    sign_with(repo, keys["alice"].parent / "missing-key", keys["allowed"])
    proc = cli("start", "true")
    assert proc.returncode == 0 and "could not sign" in proc.stderr, proc.stderr
    job = proc.stdout.split()[0]
    cli.ok("wait", job)
    assert cli.json("show", job)["state"] == "done"
    assert set(signature_codes(repo, f"refs/subtask/{job}/record")) == {"N"}


def test_a_record_signed_by_a_key_not_in_the_allowed_signers_is_reported_untrusted(cli, repo, keys):
    sign_with(repo, keys["mallory"], keys["allowed"])
    job = cli.start("true")
    cli.ok("wait", job)
    shown = cli.json("show", job)
    assert shown["signature"]["status"] == "untrusted" and shown["signature"]["trusted"] is False
    assert "not an allowed signer" in cli.ok("show", job)
    keys["allowed"].write_text(keys["allowed"].read_text() + "mallory@example.com "
                               + " ".join((keys["mallory"].parent / "mallory.pub").read_text().split()[:2]) + "\n")
    assert cli.json("show", job)["signature"]["signer"] == "mallory@example.com"  # the cache saw the file change


# A git that answers `%G?` with a letter this git-subtask does not know (a later git may add one):
# the real git's answer, its letter for the commit replaced.
GIT_WITH_A_NEW_LETTER = """#!{python}
import subprocess, sys
proc = subprocess.run([{git!r}, *sys.argv[1:]], capture_output=True)
out = proc.stdout
if any("%G?" in arg for arg in sys.argv[1:]):
    out = out.replace(b"\\x1fG\\x1f", b"\\x1f{letter}\\x1f")
sys.stdout.buffer.write(out)
sys.stderr.buffer.write(proc.stderr)
sys.exit(proc.returncode)
"""


@pytest.mark.parametrize("letter", ["Z", "g"])
def test_a_signature_letter_unknown_here_is_never_a_good_one(cli, repo, keys, tmp_path, letter):
    """Only `G` (a valid signature by an allowed signer) is good: any other answer git gives for
    a record signed by an allowed signer, one unknown here included, is not trusted."""
    sign_with(repo, keys["alice"], keys["allowed"])
    job = cli.start("true")
    cli.ok("wait", job)
    assert cli.json("show", job)["signature"]["status"] == "good"  # what the real git says
    bin_dir = tmp_path / "newer-git"
    bin_dir.mkdir()
    fake = bin_dir / "git"
    real = shutil.which("git")
    fake.write_text(GIT_WITH_A_NEW_LETTER.format(python=sys.executable, git=real, letter=letter))
    fake.chmod(0o755)
    for cached in (repo / ".git" / "subtask").glob("signatures-*"):
        cached.unlink()  # asked again, of the git below
    # git-subtask itself, not through `git subtask`: git would put its own folder first on PATH
    newer = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def show(*args: str) -> str:
        return subprocess.run([shutil.which("git-subtask"), "show", job, *args], cwd=repo,
                              env=newer, capture_output=True, text=True, check=True).stdout

    shown = json.loads(show("--json"))["signature"]
    assert shown["status"] == "unverifiable" and shown["trusted"] is False, shown
    words = show()
    assert "an allowed signer" not in words and "git cannot check it here" in words, words


# ---------------------------------------------------------------- a teammate's signed record at merge

@pytest.fixture
def team(tmp_path):
    return make_team(tmp_path)


def signed_teammate_job(team, keys, key: str, log: Path, verify: str) -> str:
    """The teammate (a) signs with `key`; we (b) trust alice only. Their job, pulled with its branch."""
    remote, ((a, cli_a), (b, cli_b)) = team
    sign_with(a, keys[key], keys["allowed"])
    git(b, "config", "gpg.ssh.allowedSignersFile", str(keys["allowed"]))
    theirs = teammate_job(cli_a, b, MAKES_X, verify)
    take(cli_b, b, theirs)
    return theirs


def test_a_teammates_record_signed_by_an_allowed_signer_is_merged_on_its_recorded_verify(team, keys, tmp_path):
    log = writable_folder(tmp_path / "log") / "ran"
    theirs = signed_teammate_job(team, keys, "alice", log, f"echo ran >> {log}; test -f x.txt")
    _, (_, (b, cli_b)) = team
    merged = cli_b("merge", theirs)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "signed by alice@example.com" in merged.stdout and "re-ran" not in merged.stdout
    assert ran_verify(log) == 1  # only the teammate's worker ran it


def test_a_teammates_record_signed_by_a_key_not_allowed_here_has_its_verify_re_run(team, keys, tmp_path):
    log = writable_folder(tmp_path / "log") / "ran"
    theirs = signed_teammate_job(team, keys, "mallory", log, f"echo ran >> {log}; test -f x.txt")
    _, (_, (b, cli_b)) = team
    merged = cli_b("merge", theirs)
    assert merged.returncode == 0 and "not an allowed signer" in merged.stdout and "re-ran verify" in merged.stdout
    assert ran_verify(log) == 2


@pytest.mark.parametrize("key", ["alice", "mallory"])
def test_land_reuses_a_teammates_verify_of_the_same_tree_only_when_an_allowed_signer_signed_it(team, keys,
                                                                                               tmp_path, key):
    """Verify once per tree (issue 43): the teammate's pass on the very tree that lands is reused
    when alice (allowed here) signed the record, and run again when mallory (not allowed) did."""
    log = writable_folder(tmp_path / "log") / "ran"
    theirs = signed_teammate_job(team, keys, key, log, f"echo ran >> {log}; test -f x.txt")
    _, (_, (b, cli_b)) = team
    landed = cli_b("land", theirs)
    assert landed.returncode == 0, landed.stdout + landed.stderr
    if key == "alice":
        assert ran_verify(log) == 1 and "verify reused: passed on the same tree" in landed.stdout, landed.stdout
    else:
        assert ran_verify(log) == 2 and "verify reused" not in landed.stdout, landed.stdout
    assert (b / "x.txt").exists()


def graft_signature(clone: Path, signed: str, unsigned: str) -> str:
    """The commit `unsigned` with the signature header of `signed`: content the signer never signed."""
    header = git(clone, "cat-file", "commit", signed).split("\n\n", 1)[0]
    sig = header[header.index("gpgsig "):]
    head, _, message = git(clone, "cat-file", "commit", unsigned).partition("\n\n")
    raw = f"{head}\n{sig}\n\n{message}\n"
    return subprocess.run(["git", "-C", str(clone), "hash-object", "-t", "commit", "-w", "--stdin"], input=raw,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_record_altered_after_signing_is_reported_bad_and_its_verify_not_trusted(team, keys, tmp_path):
    remote, ((a, cli_a), (b, cli_b)) = team
    log = writable_folder(tmp_path / "log") / "ran"
    theirs = signed_teammate_job(team, keys, "alice", log, f"echo ran >> {log}; test -f y.txt")  # fails
    signed = git(a, "rev-parse", f"refs/subtask/{theirs}/record")
    git(a, "config", "subtask.sign", "never")
    forge(a, theirs, "j.state.current.verify.passed = True; j.state.current.verify.exit_code = 0")
    altered = graft_signature(a, signed, git(a, "rev-parse", f"refs/subtask/{theirs}/record"))
    git(a, "update-ref", f"refs/subtask/{theirs}/record", altered)
    cli_a.ok("push")
    cli_b.ok("pull")
    shown = cli_b.json("show", theirs)
    assert shown["signature"]["status"] == "bad" and shown["state_detail"]["attempts"][-1]["verify"]["passed"]
    assert "BAD signature" in cli_b.ok("show", theirs)
    refused = cli_b("merge", theirs)
    assert refused.returncode == 1 and "verify failed when re-run here" in refused.stderr, \
        refused.stdout + refused.stderr
    assert "BAD signature" in refused.stderr
