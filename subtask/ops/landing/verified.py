"""Verify once per tree: what a verify result answers (its key), and the results already known.

A verify's verdict depends on the files it ran on, the command, what judged it and where it ran.
Its key is one digest of those four (docs/review.md, "Verify once per tree"):

- the tree of the commit it ran on (the integrated commit's in `land`);
- the command, as records show it (secrets redacted);
- the harness source: `harness.digest` of the trusted commit whose harness judged it (the
  target's tip in `land`, the base for a job's own verify), `job` for a job judged by its own tests;
- the environment fingerprint: the operating system and machine, whether it ran confined and
  with what network, and the output of `subtask.verify.fingerprint` where that is set (`sh -c`
  in the repository's root, once per process; its exit status counts too).

A result already known for the same key is reused instead of run again, and recorded as reused
(`VerifyResult.reused`: which job's run, on which commit, when, on whose word). Known results:

- this clone's own runs that no record of its own holds (a teammate's job landed here, `verify
  --run`): `<state>/verified-<repo>.jsonl`, appended by `remember`;
- job records: each attempt's verify and each landing's verify carrying a key, from a record this
  clone wrote or one an allowed signer signed (`_signer`, as `landing.trust_of` decides). Read
  once per record tip into `<state>/verified-index-<repo>.json` (a tip never changes meaning: the
  index can be incomplete, never stale).

Invariants:
- Never reuse a verify result whose key differs in any of its four parts, nor one from a record
  no allowed signer vouches for, nor one that timed out or never ran (the harness could not be
  laid), because a tree passing one command, harness or environment says nothing of another,
  and a teammate's unsigned "passed" is what a job that gamed its tests would push; the key is
  recomputed by whoever looks it up, never read from the result it would match. A reused result
  is recorded as reused (`VerifyResult.reused`), never as a run
  (`landwindow::test_re_landing_an_unchanged_tree_runs_its_verify_zero_times_and_says_it_reused`).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from subtask.git import harness, harness_rule, ownership, records
from subtask.git.gitrepo import Repo
from subtask.model.dataclass import dataclass
from subtask.model.job import VerifyResult
from subtask.state.statefiles import open_private, read_bytes, write_atomic

LOG = "verified"  # <state>/verified-<repo>.jsonl: this clone's runs
INDEX = "verified-index"  # <state>/verified-index-<repo>.json: keyed results of record tips
INDEX_VERSION = 1
LOG_KEEP = 5000  # lines kept when the log is rewritten (it is, past twice that)
FINGERPRINT_TIMEOUT = 60.0


# ---------------------------------------------------------------- the key

_FINGERPRINTS: dict[tuple, str] = {}


def fingerprint(repo: Repo, *, confined: bool, network: str) -> str:
    """The environment a verify runs in, as a digest (see the module docstring)."""
    command = (repo.config.get("verify.fingerprint") or "").strip()
    cache_key = (str(repo.root), command, confined, network)
    found = _FINGERPRINTS.get(cache_key)
    if found is None:
        system = os.uname()  # what platform.system() and .machine() read, without its ~1.4 ms
        facts = {"v": 1, "system": system.sysname, "machine": system.machine, "confined": confined,
                 "network": network}
        if command:
            facts["fingerprint"] = _fingerprint_output(repo, command)
        found = _FINGERPRINTS[cache_key] = _digest(facts)
    return found


def _fingerprint_output(repo: Repo, command: str) -> str:
    try:
        proc = subprocess.run(["sh", "-c", command], cwd=repo.workdir() or repo.root, capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=FINGERPRINT_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"not run: {type(exc).__name__}"
    return f"exit {proc.returncode}\n" + proc.stdout.decode("utf-8", "replace")


def key_of(repo: Repo, *, tree: str, command: str, trusted: str | None, asked: list[str] | None, confined: bool,
           network: str) -> str | None:
    """The key of a verify of `tree` by `command` (as records show it), judged by the harness of the
    commit `trusted`; None when no trusted commit judges it (nothing to key it by)."""
    if trusted is None and not harness_rule.judged_by_job(asked):
        return None
    source = harness.digest(repo, trusted, asked, command) if trusted is not None else harness_rule.JOB
    return _digest({"v": 1, "tree": tree, "command": command, "harness": source,
                    "env": fingerprint(repo, confined=confined, network=network)})


def _digest(obj) -> str:
    import hashlib  # a verify's key: OpenSSL's ~3.5 ms are no worker's without one

    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def reusable_key(result: VerifyResult | None) -> str | None:
    """The key of a result that says something about its tree (it ran to an exit of its own);
    None for any other result."""
    if (result is None or not result.key or result.exit_code is None or result.timed_out
            or result.reused is not None or result.checks_failed):
        return None
    return result.key


# ---------------------------------------------------------------- known results

@dataclass
class Found:
    """A verify result known for a key (`find`), with where it ran and who says so."""

    result: VerifyResult
    job: str  # the job whose run it was
    commit: str  # the commit it ran on
    at: float
    by: str  # "this clone", or the signer of the record it was read from

    def reused(self) -> VerifyResult:
        """The result as a new one records it: the same verdict, saying where it came from."""
        copy = VerifyResult.from_dict(self.result.to_dict())
        copy.reused = {"job": self.job, "commit": self.commit, "at": self.at, "by": self.by}
        return copy


class Known:
    """The verify results this clone may reuse, by key (loaded on the first `find`)."""

    def __init__(self, repo: Repo):
        self.repo = repo
        self._by_key: dict[str, Found] | None = None

    def find(self, key: str | None) -> Found | None:
        if not key:
            return None
        if self._by_key is None:
            by_key: dict[str, Found] = {}
            self._load_records(by_key)
            self._load_log(by_key)
            self._by_key = by_key
        return self._by_key.get(key)

    def add(self, result: VerifyResult, job: str, by: str = "this clone") -> None:
        """A result just run here: found by later lookups of this process (`remember` keeps it)."""
        key = reusable_key(result)
        if key is not None and self._by_key is not None:
            self._by_key[key] = Found(result, job, result.head, time.time(), by)

    def remember(self, result: VerifyResult, job: str) -> None:
        """Keep a result run here that no record of this clone's will hold (and find it from now on)."""
        self.add(result, job)
        if reusable_key(result) is not None:
            remember(self.repo, result, job)

    # -- sources

    def _load_log(self, by_key: dict[str, Found]) -> None:
        for line in _log_lines(self.repo):
            try:
                entry = json.loads(line)
                result = VerifyResult.from_dict(entry["result"])
            except (ValueError, KeyError, TypeError):
                continue  # a damaged line is skipped, never trusted
            key = reusable_key(result)
            if key is not None:
                by_key[key] = Found(result, str(entry.get("job")), result.head,
                                    float(entry.get("at") or 0), "this clone")

    def _load_records(self, by_key: dict[str, Found]) -> None:
        index = _read_index(self.repo)
        fresh: dict[str, dict] = {}
        owned = ownership.owned_keys(self.repo)
        for job_id, ref in records.record_refs(self.repo):
            if ref.symbolic:
                continue
            entry = index.get(ref.target)
            if entry is None:
                entry = _index_entry(self.repo, job_id, ref.target, owned)
            fresh[ref.target] = entry
            if not entry.get("results"):
                continue
            by = "this clone" if entry.get("owned") else None
            if by is None:
                try:
                    job = records.read_commit(self.repo, ref.target, job_id)
                except Exception:  # a damaged record vouches for nothing
                    continue
                by = _signer(self.repo, job)
                if by is None:
                    continue
            for item in entry["results"]:
                try:
                    result = VerifyResult.from_dict(item["result"])
                except (KeyError, TypeError):
                    continue
                key = reusable_key(result)
                if key is not None and key not in by_key:
                    by_key[key] = Found(result, job_id, result.head, float(item.get("at") or 0), by)
        if fresh.keys() != index.keys():
            _write_index(self.repo, fresh)


def _signer(repo: Repo, job) -> str | None:
    """Who vouches for a teammate's record: the allowed signer git names, None when none does
    (as `landing.trust_of` decides, without importing it: landing imports reverify, which imports
    this module)."""
    from subtask.git import signing

    provenance = signing.check_one(repo, job.tip, job.signed)
    return (provenance.signer or "an allowed signer") if provenance.trusted else None


def _index_entry(repo: Repo, job_id: str, tip: str, owned: set[str]) -> dict:
    """The keyed results one record tip holds: its attempts' verifies and its landings'."""
    try:
        job = records.read_commit(repo, tip, job_id)
    except Exception:
        return {"results": []}
    found = []
    for attempt in job.state.attempts:
        if attempt.verify is not None and reusable_key(attempt.verify) is not None:
            found.append({"result": attempt.verify.to_dict(), "at": attempt.ended_at or 0})
    for landing in job.state.landings:
        if landing.verify is not None and reusable_key(landing.verify) is not None:
            found.append({"result": landing.verify.to_dict(), "at": landing.at})
    return {"owned": ownership.owns(repo, job, owned), "results": found}


def _read_index(repo: Repo) -> dict[str, dict]:
    try:
        data = json.loads(read_bytes(repo.state_file(INDEX)))
    except (OSError, ValueError):
        return {}
    tips = data.get("tips") if isinstance(data, dict) and data.get("v") == INDEX_VERSION else None
    return {k: v for k, v in tips.items() if isinstance(v, dict)} if isinstance(tips, dict) else {}


def _write_index(repo: Repo, tips: dict[str, dict]) -> None:
    """Best effort: an index that cannot be written only costs the next lookup some reads."""
    try:
        write_atomic(repo.state_file(INDEX), json.dumps({"v": INDEX_VERSION, "tips": tips},
                                                         separators=(",", ":")).encode(), durable=False)
    except OSError:
        pass


# ---------------------------------------------------------------- this clone's runs

def _log_path(repo: Repo) -> str:
    return repo.state_file(LOG, ".jsonl")


def _log_lines(repo: Repo) -> list[str]:
    try:
        with open(_log_path(repo), encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()
    except OSError:
        return []


def remember(repo: Repo, result: VerifyResult, job: str) -> None:
    """Append a result run here to this clone's log (one line, `O_APPEND`: whole lines even when
    two processes append at once); rewritten to its last `LOG_KEEP` lines once it holds twice that."""
    line = json.dumps({"v": 1, "job": job, "at": time.time(), "result": result.to_dict()},
                      separators=(",", ":")) + "\n"
    path = _log_path(repo)
    try:
        repo.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = open_private(path)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        if os.stat(path).st_size > LOG_KEEP * 2 * 1500:
            lines = _log_lines(repo)
            if len(lines) > LOG_KEEP * 2:
                write_atomic(path, ("\n".join(lines[-LOG_KEEP:]) + "\n").encode(), durable=False)
    except OSError:
        pass  # a result not kept is only run again
