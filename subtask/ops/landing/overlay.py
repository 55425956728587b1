"""The overlay: a verify judged by a harness the job could not touch, the trusted tests over the job's code.

Every verify that decides something (the worker's, a retry's, `merge`'s re-run, `verify --run`,
each landing of `land`, a best-of member's) runs here the same way (docs/verify.md "The judge"):

1. `prepare`: the job's worktree (or a scratch checkout of its commit) compared with a trusted
   commit (`git/harness.py`): the job's base for the worker, the target's tip for a landing, the
   branch it lands on for a re-run. A job started with `--harness job` is judged by its own tests
   and nothing here changes anything.
2. `overlaid`: the trusted versions written over the harness files the job changed or deleted,
   every harness file it added (committed, untracked or ignored) moved aside to a folder outside
   the worktree, and with them the bytecode folders beside harness files and pytest's cache (no
   rewritten test the job left is read); verify then runs with a fresh temp dir; afterwards the
   worktree is put back as the job left it, whatever happened. A job that touched no harness
   path and left no such cache costs only the comparison.
3. When the job did touch the harness, the worker runs verify a second time on its tree as it
   wrote it: "its own tests", reported apart, never the verdict.

A file the job added that would shadow the test runner, the standard library or an installed
distribution on the import path fails the `no-shadowing` check, which names it.

Invariants:
- Never change a worktree for a verdict before the journal that undoes it is on disk outside the
  worktree and the sandbox (`<worktreeDir>/.harness/<id>/overlay/journal.json`), nor let the
  change outlive the verify, because the engine of the next attempt would see the trusted tests
  and the autocommit would commit them: undone in `finally`, and again by `restore_left` before
  the next attempt and when a dead worker is settled
  (`judge::test_a_worker_killed_during_its_verify_leaves_the_job_its_own_files`).
- Never read, write or move through a link below the worktree: a folder the job replaced by a
  link or a file is moved aside like any added file, so the trusted files land inside the worktree.
- Never take the journal's paths as they are: each must be relative, without `..`, and every
  folder on the way a real folder, because a job running unconfined could have written it.
- Never judge a verify by a harness the job could have written (its tests, their configuration,
  the verify script), because any test passes once the job may edit it (issue 39: 13 of 17 ways
  of gaming a pytest suite passed the text checks): the worker, every re-run (`land`, `merge`,
  `verify --run`) and best-of judges lay a trusted tree's harness over the code first
  (`overlay.prepare`/`overlaid`); only `--harness job` in a record this clone trusts opts out, and
  says so (tests: `judge::*`).
- Never give a verify a fresh `PYTHONPYCACHEPREFIX`, nor move all of the bytecode beside the
  tests aside, because each made a small verify several times slower: the first recompiled the
  standard library and every installed package on each run (0.9 s to 4.8 s for one small test)
  and the second had pytest rewrite every test again (a 2,000-file repository's verify 2.6 s to
  5.2 s): only bytecode Python takes on trust (timestamp or unchecked `.pyc`) goes aside;
  pytest's, checked against a hash of the trusted bytes, stays (bench/harness.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from subtask.git import harness, harness_rule
from subtask.git.gitrepo import Repo, tree_of
from subtask.model.dataclass import dataclass, field
from subtask.state.statefiles import write_atomic

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any

STASH = ".harness"  # <worktreeDir>/.harness/<id>/: a job's moved files and its setup snapshot
SHADOWING = "no-shadowing"
MAX_UNUSED = 50


@dataclass
class Judge:
    """What a verify is judged by: the trusted commit (`source`: base | target | job) and how the
    job's tree differs from it."""

    source: str
    commit: str | None = None
    ref: str | None = None  # the branch a landing or a re-run lands on
    comparison: harness.Comparison | None = None
    shadows: list[str] = field(default_factory=list)
    tree: str | None = None  # the tree verify ran on: the head's, with the trusted harness in place
    error: str | None = None  # why the comparison could not be made: verify is then not run

    @property
    def own(self) -> bool:
        return self.source == "job"

    @property
    def touched(self) -> bool:
        return self.comparison is not None and self.comparison.touched

    def check(self) -> dict | None:
        """The `no-shadowing` check's failure, when a file the job added shadows a module (None
        otherwise, and for a job judged by its own tests: its checks stay the ones it asked for)."""
        if self.own or not self.shadows:
            return None
        return {"check": SHADOWING, "passed": False, "found": self.shadows[:20]}

    def facts(self, own_run: dict | None = None) -> dict:
        """What the record keeps (`VerifyResult.harness`)."""
        if self.own:
            return {"source": "job"}
        unused = self.comparison.unused() if self.comparison is not None else []
        out: dict[str, Any] = {"source": self.source, "commit": self.commit, "tree": self.tree,
                               "unused": unused[:MAX_UNUSED],
                               "files": self.comparison.trusted_files if self.comparison is not None else None}
        if self.ref:
            out["ref"] = self.ref
        if self.error:
            out["error"] = self.error
        if len(unused) > MAX_UNUSED:
            out["unused_more"] = len(unused) - MAX_UNUSED
        if own_run is not None:
            out["own"] = own_run
        return out


def prepare(repo: Repo, *, asked: list[str] | None, command: str | None, trusted: str, source: str, worktree: Path,
            head: str, ref: str | None = None, kept: dict | None = None, env: dict | None = None) -> Judge:
    """Compare `worktree` (holding `head`) with the trusted commit; `asked`: the spec's harness
    (None: a record from before it, judged by the default; []: by its own tests)."""
    if harness_rule.judged_by_job(asked):
        return Judge("job")
    try:
        return _prepare(repo, asked, command, trusted, source, worktree, head, ref, kept, env)
    except Exception as exc:  # a tree it cannot read, a file it cannot hash: no verdict, and why
        return Judge(source, trusted, ref, error=f"the trusted harness could not be laid: {type(exc).__name__}: {exc}")


def _prepare(repo: Repo, asked, command, trusted: str, source: str, worktree: Path, head: str, ref, kept,
             env) -> Judge:
    comparison = harness.compare(repo, trusted, worktree, asked, command, head=head, kept=kept,
                                 import_dirs=import_dirs(worktree, env))
    names = harness.names_to_probe(comparison.shadows)
    installed = installed_names(names, command, env) if names else set()
    tree = harness.overlaid_tree(repo, head, comparison) if comparison.touched else tree_of(repo, head)
    return Judge(source, trusted, ref, comparison, harness.shadow_findings(comparison.shadows, installed), tree)


def import_dirs(worktree: Path, env: dict | None) -> list[str]:
    """The worktree's folders on the verify's import path: its top, `src`, and PYTHONPATH's."""
    dirs = list(harness.IMPORT_DIRS)
    top = os.path.realpath(worktree)
    for entry in (env or {}).get("PYTHONPATH", "").split(os.pathsep):
        if entry:
            path = os.path.realpath(os.path.join(top, entry))
            if path == top or path.startswith(top + os.sep):
                rel = os.path.relpath(path, top).replace(os.sep, "/")
                dirs.append("" if rel == "." else rel)
    return list(dict.fromkeys(dirs))


PROBE = "import importlib.util, sys; print(' '.join(n for n in sys.argv[1:] if importlib.util.find_spec(n)))"


def installed_names(names: list[str], command: str | None, env: dict | None) -> set[str]:
    """Which of `names` the verify's interpreter imports from outside the worktree (isolated mode:
    no current folder, no PYTHON* variables): the python the command names, else python3 on its PATH."""
    path = (env or os.environ).get("PATH", os.defpath)
    exe = None
    for word in (command or "").split():
        if os.path.basename(word).startswith("python") and "/" not in word:
            exe = shutil.which(word, path=path)
            break
    exe = exe or shutil.which("python3", path=path) or shutil.which("python", path=path)
    if exe is None:
        return set()
    try:
        out = subprocess.run([exe, "-I", "-c", PROBE, *names], cwd="/", capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return set(out.split()) & set(names)


# ---------------------------------------------------------------- the overlay

def stash_of(repo: Repo, job_id: str) -> Path:
    return repo.worktree_dir() / STASH / job_id / "overlay"


def snapshot_file(repo: Repo, job_id: str) -> Path:
    return repo.worktree_dir() / STASH / job_id / "before.json"


def keep_snapshot(repo: Repo, job_id: str, kept: dict) -> None:
    """What the fresh worktree held beyond its tree before the job ran (`harness.snapshot`)."""
    write_atomic(snapshot_file(repo, job_id), json.dumps({"v": 1, "files": kept}).encode())


def read_snapshot(repo: Repo, job_id: str) -> dict:
    try:
        data = json.loads(snapshot_file(repo, job_id).read_text())
        files = data.get("files") if isinstance(data, dict) else None
        return files if isinstance(files, dict) else {}
    except (OSError, ValueError):
        return {}


def forget(repo: Repo, job_id: str) -> None:
    """The job's folder beside its worktree, once the worktree is gone: its setup snapshot; never
    an overlay's moved files (`restore_left` puts those back first), which stay until they are."""
    snapshot_file(repo, job_id).unlink(missing_ok=True)
    if not stash_of(repo, job_id).exists():
        shutil.rmtree(repo.worktree_dir() / STASH / job_id, ignore_errors=True)


@contextlib.contextmanager
def overlaid(repo: Repo, judge: Judge, worktree: Path, stash: Path, tmpdir: Path | str) -> Iterator[dict]:
    """The worktree with the trusted harness in place while the block runs (see the module
    docstring); yields what the verify's environment adds (a fresh temp dir inside `tmpdir`, so
    nothing the job's engine left there is found either). Put back in `finally`."""
    if judge.own:
        yield {}
        return
    fresh = Path(tmpdir) / f"verify-{os.urandom(4).hex()}"
    fresh.mkdir(mode=0o700)
    extra = {"TMPDIR": str(fresh), "TMP": str(fresh), "TEMP": str(fresh)}
    try:
        if judge.comparison is None or judge.comparison.empty:
            yield extra
            return
        restore(stash, worktree)  # one a killed run left, before this one is laid
        try:
            apply(repo, judge.comparison, worktree, stash)
            yield extra
        finally:
            restore(stash, worktree)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


def apply(repo: Repo, found: harness.Comparison, worktree: Path, stash: Path) -> None:
    """Lay the trusted harness over `worktree`: the journal first, then the moves and writes."""
    entries: list[dict] = []
    gone: list[str] = []
    slot = 0

    def aside(path: str) -> None:
        nonlocal slot
        entries.append({"kind": "aside", "path": path, "slot": str(slot)})
        gone.append(path)
        slot += 1

    for path in [*found.blockers, *found.aside, *found.quiet]:
        aside(path)
    made: list[str] = []
    for put in found.puts:
        below_gone = any(put.path.startswith(g + "/") for g in gone)
        if not below_gone and os.path.lexists(worktree / put.path):
            entries.append({"kind": "replaced", "path": put.path, "slot": str(slot)})
            slot += 1
        else:
            for folder in _missing_folders(worktree, put.path, gone, made):
                made.append(folder)
                entries.append({"kind": "made", "path": folder})
            entries.append({"kind": "written", "path": put.path})
    stash.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(stash, 0o700)
    write_atomic(stash / "journal.json", json.dumps({"v": 1, "entries": entries}).encode())
    puts = {put.path: put for put in found.puts}
    wanted = [put.oid for put in found.puts if put.content is None]
    read = repo.objects.read(wanted)  # one batch: the trusted blobs written back
    trusted = {oid: found[1] if found is not None else b"" for oid, found in zip(wanted, read, strict=True)}
    for entry in entries:
        target = worktree / entry["path"]
        if entry["kind"] in ("aside", "replaced"):
            _move(target, stash / entry["slot"])
        if entry["kind"] == "made":
            os.mkdir(target)
        elif entry["kind"] in ("replaced", "written"):
            put = puts[entry["path"]]
            _write(target, put.content if put.content is not None else trusted[put.oid], put.mode)


def _missing_folders(worktree: Path, path: str, gone: list[str], made: list[str]) -> list[str]:
    parts = path.split("/")[:-1]
    out = []
    for n in range(1, len(parts) + 1):
        folder = "/".join(parts[:n])
        if folder in made:
            continue
        if folder in gone or any(folder.startswith(g + "/") for g in gone) or not os.path.lexists(worktree / folder):
            out.append(folder)
    return out


def restore(stash: Path, worktree: Path) -> bool:
    """Undo an overlay from its journal (idempotent: each step looks before it acts); True when
    there was one. The stash goes once every moved file is back."""
    journal = stash / "journal.json"
    try:
        data = json.loads(journal.read_text())
        entries = data["entries"] if isinstance(data, dict) and isinstance(data.get("entries"), list) else []
    except FileNotFoundError:
        shutil.rmtree(stash, ignore_errors=True)
        return False
    except (OSError, ValueError):
        entries = []
    failed: OSError | None = None
    for entry in reversed(entries):
        try:
            _undo(stash, worktree, entry)
        except OSError as exc:  # the others are put back all the same; the stash keeps this one
            failed = failed or exc
    leftovers = [p for p in stash.iterdir() if p.name != "journal.json"] if stash.is_dir() else []
    if not leftovers:
        shutil.rmtree(stash, ignore_errors=True)
    if failed is not None:
        raise failed
    return True


def _undo(stash: Path, worktree: Path, entry) -> None:
    rel = entry.get("path") if isinstance(entry, dict) else None
    if not isinstance(rel, str) or not _safe(worktree, rel):
        return
    target = worktree / rel
    kind = entry.get("kind")
    if kind in ("aside", "replaced"):
        moved = stash / str(entry.get("slot"))
        if os.path.lexists(moved):
            _remove(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            _move(moved, target)
    elif kind in ("written", "made"):
        _remove(target)


def restore_left(repo: Repo, job_id: str) -> bool:
    """Undo an overlay a killed worker left in the job's worktree (`<worktreeDir>/<id>`)."""
    stash = stash_of(repo, job_id)
    if not stash.exists():
        return False
    return restore(stash, repo.worktree_dir() / job_id)


def _safe(worktree: Path, rel: str) -> bool:
    if not rel or rel.startswith("/") or "\0" in rel:
        return False
    parts = PurePosixPath(rel).parts
    if ".." in parts or "." in parts:
        return False
    for n in range(1, len(parts)):
        try:
            if not stat.S_ISDIR(os.lstat(worktree.joinpath(*parts[:n])).st_mode):
                return False
        except FileNotFoundError:
            return True  # nothing below a missing folder to harm; the move back makes it
        except OSError:
            return False
    return True


def _move(source: Path, target: Path) -> None:
    try:
        os.rename(source, target)
    except OSError as exc:
        if exc.errno != 18:  # EXDEV: another file system
            raise
        shutil.move(str(source), str(target))


def _remove(path: Path) -> None:
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def _write(path: Path, data: bytes, mode: int) -> None:
    if mode == 0o120000:
        os.symlink(os.fsdecode(data), path)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if mode == 0o100755 else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
