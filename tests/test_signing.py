"""Signed provenance (issue 29): records, groups and notes signed as git signs, checked as git checks.

Real ed25519 keys made in the test with ssh-keygen, an allowed-signers file, no network.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import git, refs
from test_start import snapshot


@pytest.fixture
def keys(tmp_path) -> dict[str, Path]:
    """Two keys (alice, mallory) and an allowed-signers file that lists alice only."""
    folder = tmp_path / "keys"
    folder.mkdir()
    made = {}
    for name in ("alice", "mallory"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(folder / name)], check=True)
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
    assert "signed:  signed by alice@example.com" in note and "an allowed signer" in note


def test_without_a_key_or_with_sign_never_nothing_is_signed(cli, repo, keys):
    job = cli.start("true")
    cli.ok("wait", job)
    assert set(signature_codes(repo, f"refs/subtask/{job}/record")) == {"N"}
    assert cli.json("show", job)["signature"]["status"] == "unsigned"
    assert "signed:" not in git(repo, "notes", "--ref=subtask", "show", "HEAD")
    sign_with(repo, keys["alice"], keys["allowed"])
    git(repo, "config", "subtask.sign", "never")
    git(repo, "config", "commit.gpgSign", "true")  # the user's own commits: not ours to follow
    other = cli.start("true")
    cli.ok("wait", other)
    assert set(signature_codes(repo, f"refs/subtask/{other}/record")) == {"N"}


def test_sign_always_without_a_usable_key_refuses_to_start_and_changes_nothing(cli, repo, keys):
    git(repo, "config", "subtask.sign", "always")
    cli.ok("init")  # the notes config a first start would write
    before = snapshot(repo)
    proc = cli("start", "true")
    assert proc.returncode == 128 and "no signing key" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "hint: git config user.signingKey" in proc.stderr
    assert snapshot(repo) == before
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
