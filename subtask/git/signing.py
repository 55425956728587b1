"""Signed provenance: who signed a record commit, and whether git trusts that signer here.

Writing: every commit the tool writes for itself (records, groups, notes) is signed by git when
git has a signing key (`user.signingKey`, `gpg.format` ssh/openpgp/x509) and `subtask.sign` is
not `never` (`gitobjects.commit_tree`). `subtask.sign=always` refuses to start a job without one
(`require_key`, then the first record commit must sign).

Reading: `check` asks git, as `git log --show-signature` does (`%G?`, `%GS`, `%GK`), with this
clone's trust settings: `gpg.ssh.allowedSignersFile` (and its revocation file) for ssh keys, the
keyring for openpgp and x509. Only "good" (`G`: a valid signature by an allowed signer) is
trusted; a key not in the allowed signers is "untrusted", content changed after signing "bad".

Invariants:
- Never trust a signature git did not call good with this clone's own trust settings, because
  a record names whatever signer its writer likes; the signer's principal comes from the
  allowed-signers file, never from the record.
- Never call a commit signed from what a record says: only the commit's own `gpgsig` header
  (`gitobjects.commit_signed`), which git then checks.
- Never cache a signature's verdict by commit alone, because it depends on this clone's allowed
  signers and keyring: the cache (`<state>/signatures-<repo>.json`) is keyed by commit id *and* a
  fingerprint of those files (`trust_fingerprint`), so a changed allowed-signers file or keyring
  makes every verdict be asked again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from subtask.git.gitrepo import Repo
from subtask.model.errors import SubtaskError
from subtask.model.provenance import UNSIGNED, Provenance  # noqa: F401  (the names callers use)
from subtask.state.statefiles import write_atomic

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any

STATUS = {"G": "good", "U": "untrusted", "B": "bad", "X": "expired", "Y": "expired", "R": "revoked",
          "E": "unverifiable", "N": "unsigned"}
CHUNK = 500  # commits per git log
KEY_HINT = ("git config user.signingKey ~/.ssh/id_ed25519.pub; git config gpg.format ssh   "
            "(or: git config subtask.sign auto)")




def require_key(repo: Repo) -> None:
    """Refuse (before anything changes) to start a job under `subtask.sign=always` without a key."""
    if repo.config.sign_mode() == "always" and repo.config.signing_key() is None:
        raise SubtaskError("fatal", "subtask.sign is always, but git has no signing key (user.signingKey): "
                           "not starting a job whose record would be unsigned", hint=KEY_HINT)


def check(repo: Repo, commits: list[str]) -> dict[str, Provenance]:
    """{commit: Provenance} for signed commits (the caller knows the others are unsigned)."""
    wanted = list(dict.fromkeys(c for c in commits if c))
    if not wanted:
        return {}
    fingerprint = trust_fingerprint(repo)
    cache = _read_cache(repo, fingerprint)
    found = {c: _from_fields(cache[c]) for c in wanted if isinstance(cache.get(c), dict)}
    missing = [c for c in wanted if c not in found]
    for i in range(0, len(missing), CHUNK):
        found.update(_ask_git(repo, missing[i:i + CHUNK]))
    if missing:
        _write_cache(repo, fingerprint, cache | {c: _fields(found[c]) for c in missing if c in found})
    return found


def check_one(repo: Repo, commit: str | None, signed: bool) -> Provenance:
    """The provenance of one record tip; `signed` (its `gpgsig` header) spares unsigned ones a git run."""
    if not commit or not signed:
        return UNSIGNED
    return check(repo, [commit]).get(commit, Provenance("unverifiable"))


def _from_fields(d: dict[str, Any]) -> Provenance:
    return Provenance(*(str(d.get(k) or "") for k in ("status", "signer", "key", "trust")))


def _fields(p: Provenance) -> dict[str, Any]:
    return {"status": p.status, "signer": p.signer, "key": p.key, "trust": p.trust}


def _ask_git(repo: Repo, commits: list[str]) -> dict[str, Provenance]:
    proc = subprocess.run(["git", "--git-dir", str(repo.git_dir), "log", "--no-walk=unsorted",
                           "--format=%H%x1f%G?%x1f%GS%x1f%GK%x1f%GT%x1e", *commits, "--"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False,
                          env=dict(os.environ, LC_ALL="C", LANGUAGE="C"))
    found = {}
    for record in proc.stdout.split("\x1e"):
        fields = record.strip("\n").split("\x1f")
        if len(fields) == 5 and fields[0] in commits:
            found[fields[0]] = Provenance(STATUS.get(fields[1], "unverifiable"), fields[2].strip(), fields[3].strip(),
                                          fields[4].strip())
    return found


def trust_fingerprint(repo: Repo) -> str:
    """What git's verdict depends on besides the commit: the format, the allowed-signers and
    revocation files (their contents), and the keyring's files (their size and time)."""
    parts = [repo.config.git("gpg.format") or "openpgp"]
    for key in ("gpg.ssh.allowedsignersfile", "gpg.ssh.revocationfile"):
        value = repo.config.git(key)
        parts.append(f"{key}={value}")
        if value:
            try:
                parts.append(hashlib.sha1(Path(os.path.expanduser(value)).read_bytes()).hexdigest())
            except OSError:
                parts.append("unreadable")
    home = Path(os.environ.get("GNUPGHOME") or Path.home() / ".gnupg")
    for name in ("pubring.kbx", "pubring.gpg", "trustdb.gpg", "pubring.kbx~"):
        try:
            st = (home / name).stat()
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            pass
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()


def _cache_path(repo: Repo) -> Path:
    return Path(repo.state_file("signatures"))


def _read_cache(repo: Repo, fingerprint: str) -> dict[str, Any]:
    try:
        data = json.loads(_cache_path(repo).read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("v") != 1 or data.get("trust") != fingerprint:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def _write_cache(repo: Repo, fingerprint: str, entries: dict[str, Any]) -> None:
    """Best effort: a cache that cannot be written costs the next look a git run."""
    try:
        write_atomic(_cache_path(repo), json.dumps({"v": 1, "trust": fingerprint, "entries": entries},
                                                   separators=(",", ":")).encode(), durable=False)
    except OSError:
        pass
