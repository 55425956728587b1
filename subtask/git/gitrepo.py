"""Access to the repository: open it from any directory, refs, worktrees, diff statistics.

The repository is found by `git rev-parse` and its `subtask.*` settings read by `git config`
(one process each, ~2 ms, side by side), and pygit2 is imported only when a command first needs
it (`Repo.git`): records, pins and branches are read and written through `Repo.objects`
(subtask/gitobjects.py), by git until pygit2 is loaded, so `start` and the reading commands never
pay the library's import, nor does a job's worker (its diff is git's, `diff_stats`).
Porcelain that libgit2 does not do as git does (`worktree
add/remove`, `gc --auto`, `merge`) runs the git binary with hooks disabled, because the tool's own
git commands must never trigger the user's hooks.

Invariants:
- The state dir is `<git-common-dir>/subtask` (or `subtask.stateDir`), shared by all worktrees.
- Never check a worktree out under a `.git/` folder, because Claude Code refuses to write there.
- Never import pygit2 in a command that only reads (`list`, `status`, `show`, `result`, `wait`,
  `spend`), nor in `start`, because its import is half of a reading command's CPU (~60 of ~120 ms)
  and a third of `start`'s, which the user waits for twice (the prompt, then the worker it forks):
  they read and write through `Repo.objects`, which asks git (`for-each-ref`, `cat-file --batch`,
  `rev-parse`, `hash-object`/`mktree`/`commit-tree`, one `update-ref --stdin` per compare-and-swap)
  until pygit2 is loaded. Both backends answer and write alike, to the commit id
  (`tests/test_gitread.py`, `tests/test_gitwrite.py`, which also run those commands where pygit2
  cannot be imported, or watch that `start` never imports it). A worker never imports it
  (`worker/engine.py`). Other writing commands import it on first use (`Repo.git`).
- Never build a `Path` on a reading command's path nor in `start`'s own process, because importing
  pathlib (with `urllib.parse`, `ipaddress` and `fnmatch`) is ~3 ms of a ~23 ms `list` and of a
  ~32 ms start: `Repo` keeps its paths as text (`root_str`, `state_dir_str`, `worktree_dir_str()`),
  `root`, `git_dir`, `common_dir` and `state_dir` are `Path`s made on first use for every other
  caller, and the state folder's names are joined as text (`state/paths.py` returns `str`); the
  worker imports pathlib after its fork (`tests/test_imports.py`: `NOT_ON_A_READ`, `NOT_AT_START`).
- Never run the tool's own git commands with the user's hooks, because a hook must not fire on
  bookkeeping (`git` passes `core.hooksPath=/dev/null`).
- Never read HEAD from its file but when it holds what git's files backend writes there (a
  branch's name or a commit id), because a symlinked HEAD or reftable's placeholder
  (`refs/heads/.invalid`) says something else: those go to `git symbolic-ref` (`Repo.head_ref`;
  `tests/test_gitread.py::test_heads_branch_read_from_its_file_is_what_git_says`).
"""

from __future__ import annotations

import os
import sys

from subtask.git import gitobjects, loose, pipes
from subtask.model.config import SETTINGS_ARGS, Config, GitSettings, parse_settings
from subtask.model.dataclass import dataclass, field, replace
from subtask.model.errors import SubtaskError
from subtask.state import paths

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    import subprocess
    from pathlib import Path
    from typing import Any

    import pygit2

    from subtask.git.gitobjects import GitObjects, Pygit2Objects

NO_HOOKS = ("-c", "core.hooksPath=/dev/null")
EXCLUDE_LINE = "/.subtask/"


@dataclass
class Repo:
    """A repository as `open_repo` found it; pygit2 is opened only when first asked for."""

    # Paths as text, as git gave them; `git_dir`, `root`, `common_dir` and `opened_at` are the same
    # as `Path`s. A reading command joins the text (`os.path`) and never imports pathlib.
    git_dir_str: str  # this worktree's git dir (the main one's, or .git/worktrees/<name>)
    root_str: str  # the main worktree
    common_dir_str: str
    config: Config
    _git: pygit2.Repository | None = field(default=None, repr=False)
    opened_at_str: str | None = None  # the folder it was found from (a command's working directory)

    @property
    def git_dir(self) -> Path:
        return _path(self.git_dir_str)

    @property
    def root(self) -> Path:
        return _path(self.root_str)

    @property
    def common_dir(self) -> Path:
        return _path(self.common_dir_str)

    @property
    def opened_at(self) -> Path | None:
        return None if self.opened_at_str is None else _path(self.opened_at_str)

    @property
    def git(self) -> pygit2.Repository:
        """The pygit2 repository, opened (and the library imported, ~60 ms) on first use."""
        if self._git is None:
            import pygit2

            self._git = pygit2.Repository(self.git_dir_str)
        return self._git

    @property
    def objects(self) -> GitObjects | Pygit2Objects:
        """Refs and objects to read and write: in-process once pygit2 is loaded, through git before."""
        sign = self.config.signing_key() is not None
        if self._git is not None or pygit2_ready():
            return gitobjects.Pygit2Objects(self.git, sign)
        return gitobjects.GitObjects(self.git_dir_str, sign, self.common_dir_str, loose=loose.usable(self.config.git))

    def handover(self) -> dict[str, Any] | None:
        """This repository for a worker forked from another process (JSON, `from_handover`): the
        paths and settings git gave us; None unless opened at the main worktree (a linked
        worktree's settings may be its own) and read through git."""
        settings = self.config.settings()
        if settings is None or os.path.realpath(self.git_dir_str) != self.common_dir_str:
            return None
        return {"v": 1, "git_dir": self.git_dir_str, "root": self.root_str, "common_dir": self.common_dir_str,
                "settings": settings}

    @classmethod
    def from_handover(cls, data: dict[str, Any]) -> Repo:
        return cls(str(data["git_dir"]), str(data["root"]), str(data["common_dir"]),
                   Config(GitSettings(dict(data["settings"]))))

    def for_thread(self) -> Repo:
        """This repository for another thread or a forked child: the same paths and settings, its
        own pygit2 handle (pygit2 objects are never shared), so no git process finds it again."""
        return replace(self, _git=None)

    def workdir(self) -> str | None:
        """The top of the worktree this repository was opened in (as pygit2's `workdir`)."""
        if os.path.realpath(self.git_dir_str) == self.common_dir_str:
            return self.root_str
        try:  # a linked worktree's git dir names its `.git` file in `gitdir`
            with open(os.path.join(self.git_dir_str, "gitdir")) as fh:
                dot_git = path_text(os.path.join(self.git_dir_str, fh.read().strip()))
        except OSError:
            return None
        return os.path.dirname(dot_git)

    def has_ref_file(self, ref: str) -> bool:
        """A loose ref file at `ref`'s name in the common git dir, whatever it holds (git's listing
        leaves out a damaged one): no git process."""
        return os.path.isfile(os.path.join(self.common_dir_str, ref))

    def head_ref(self, main: bool = False) -> str | None:
        """The branch ref HEAD names (`refs/heads/main`, maybe unborn), None when detached; this
        worktree's HEAD, or with `main` the main worktree's. Read from HEAD's file when it names a
        branch or a commit, as git's files backend writes it (whole, by rename); anything else (a
        symlink, reftable's placeholder `refs/heads/.invalid`) is git's to answer (`symbolic-ref`)."""
        git_dir = self.common_dir_str if main else self.git_dir_str
        try:
            fd = os.open(os.path.join(git_dir, "HEAD"), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            fd = -1
        if fd >= 0:
            with os.fdopen(fd, "rb") as fh:
                text = fh.read(4096).decode("utf-8", "surrogateescape")
            line = text.removesuffix("\n")
            if gitobjects.is_oid(line):
                return None
            branch = line.removeprefix("ref: ")
            if branch.startswith("refs/heads/") and branch != line and branch.split() == [branch] \
                    and branch not in ("refs/heads/", "refs/heads/.invalid"):
                return branch
        code, out, _ = pipes.run(["git", "--git-dir", git_dir, "symbolic-ref", "-q", "HEAD"])
        if code != 0:
            return None
        return os.fsdecode(out).strip() or None

    def head_branch(self) -> str | None:
        """The short name of the branch this worktree's HEAD names (`main`); None when detached."""
        ref = self.head_ref()
        return ref.removeprefix("refs/heads/") if ref is not None and ref.startswith("refs/heads/") else None

    def state_file(self, stem: str, suffix: str = ".json") -> str:
        """`<state>/<stem>-<repo><suffix>`: a file of this repository's own in a state folder that
        several repositories may share (`subtask.stateDir`)."""
        return paths.repo_file(self.state_dir_str, self.common_dir_str, stem, suffix)

    @property
    def state_dir(self) -> Path:
        return _path(self.state_dir_str)

    @property
    def state_dir_str(self) -> str:
        configured = self.config.get("stateDir")
        # an absolute one replaces the root
        return path_text(os.path.join(self.root_str, os.path.expanduser(configured))) if configured \
            else os.path.join(self.common_dir_str, "subtask")

    def worktree_dir(self) -> Path:
        return _path(self.worktree_dir_str())

    def worktree_dir_str(self) -> str:
        configured = self.config.get("worktreeDir")
        if configured:
            return path_text(os.path.join(self.root_str, os.path.expanduser(configured)))
        return os.path.join(self.root_str, ".subtask", "worktrees")


def open_repo(path: str | os.PathLike[str] | None = None) -> Repo:
    """The repository containing `path` (default: the current directory), found as git finds it
    (`git rev-parse`: GIT_DIR, ceilings, safe.directory), without loading pygit2. A SHA-256
    repository is refused here, before anything is written: pygit2's libgit2 reads SHA-1 only, and
    a job started there failed at its end with its branch and record left behind."""
    start = os.fspath(path or os.getcwd())
    if path is not None and not os.path.exists(start):
        raise SubtaskError("fatal", f"not a git repository: {start} does not exist")
    # The settings are read beside the search, by a git that finds the same git dir: one git
    # process's time instead of two, one after the other.
    # Both without `subprocess` (`pipes`): every command pays this, a reading one ~4 ms for it.
    settings = pipes.start(["git", "-C", start, *SETTINGS_ARGS], stderr=False)
    try:
        code, out, err = pipes.run(["git", "-C", start, "rev-parse", "--path-format=absolute", "--git-dir",
                                    "--git-common-dir", "--is-bare-repository"])
    finally:
        values = parse_settings(settings.communicate()[1])
    lines = os.fsdecode(out).splitlines()
    if code != 0 or len(lines) != 3:
        why = err.decode("utf-8", "replace").strip().removeprefix("fatal: ")
        if "not a git repository" in why or not why:
            raise SubtaskError("fatal", f"not a git repository (or any of the parent directories): {start}",
                               hint="run it inside a git work tree, or git init")
        raise SubtaskError("fatal", f"cannot open the repository at {start}: {why}")
    git_dir, common, bare = lines[0], os.path.realpath(lines[1]), lines[2] == "true"
    if values.get("extensions.objectformat", "sha1").lower() != "sha1":
        raise SubtaskError("fatal", f"{common} holds SHA-256 objects: git-subtask works in SHA-1 repositories "
                                    "only (libgit2, which it reads records with, reads no other)",
                           hint="run it in a SHA-1 clone of the work (git init --object-format=sha1)")
    if bare:
        raise SubtaskError("fatal", f"this operation must be run in a work tree, and {start} is a bare repository",
                           hint="clone it first: git clone <bare> <dir>")
    return Repo(git_dir, _main_worktree(common, start), common, Config(GitSettings(values)),
                opened_at_str=os.path.realpath(start))


def path_text(text: str) -> str:
    """`str(Path(text))` without pathlib: repeated slashes made one, `.` parts and a trailing slash
    dropped, `..` kept (a link may lead elsewhere than the text says)."""
    kept = [part for part in text.split("/") if part not in ("", ".")]
    lead = "//" if text.startswith("//") and not text.startswith("///") else "/" if text.startswith("/") else ""
    return lead + "/".join(kept) if kept or lead else "."


def _path(text: str) -> Path:
    from pathlib import Path  # here: a reading command never imports pathlib (~3 ms of its ~24)

    return Path(text)


def pygit2_ready() -> bool:
    """pygit2 is imported (by whatever needed it first): `Repo.objects` then asks it, in-process."""
    return sys.modules.get("pygit2") is not None


def _main_worktree(common: str, start: str) -> str:
    if os.path.basename(common) == ".git":
        return os.path.dirname(common)
    # A separate git dir (`git init --separate-git-dir`, core.worktree): git knows no main
    # worktree for it (its `worktree list` names the git dir), so the worktree we are in is the root.
    top = os.fsdecode(pipes.run(["git", "-C", start, "rev-parse", "--show-toplevel"])[1]).strip()
    return os.path.realpath(top) if top else os.path.dirname(common)


def resolve_commit(repo: Repo, rev: str) -> str:
    """The commit id `rev` names, or a fatal error."""
    if not rev or rev.startswith("-") or "\n" in rev:
        raise SubtaskError("usage", f"not a valid revision: {rev!r}")
    commit = repo.objects.commit_of(rev)
    if commit is None:
        unborn = _unborn_branch(repo) if rev == "HEAD" else None
        if unborn is not None:
            raise unborn
        raise SubtaskError("fatal", f"unknown revision '{rev}': it names no commit in {repo.root}",
                           hint="git log --oneline -5")
    return commit


def _unborn_branch(repo: Repo) -> SubtaskError | None:
    """What to say when HEAD names a branch with no commits yet (a fresh `git init`, `checkout
    --orphan`): there is nothing to start from, and `git log` would only repeat it."""
    head_ref = repo.head_ref(main=True)
    if head_ref is None or not head_ref.startswith("refs/heads/") or repo.objects.ref(head_ref) is not None:
        return None
    head = head_ref.removeprefix("refs/heads/")
    branches = git(repo.root, "for-each-ref", "--count=1", "--format=x", "refs/heads/", check=False)
    if not branches.stdout.strip():
        return SubtaskError("fatal", "this repository has no commits yet: a job starts from one",
                            hint="make the first one: git add -A && git commit -m 'Initial commit'")
    return SubtaskError("fatal", f"the current branch {head} has no commits yet: a job starts "
                        "from a commit", hint=f"commit on {head} first, or give --base main")


def git(repo_root: Path | str, *args: str, check: bool = True, input: str | None = None,
        timeout: float | None = None, env: dict[str, str] | None = None,
        own_group: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the git binary with hooks disabled; a failure is a fatal error with git's words.
    `own_group`: in a process group of its own, which a signal to the caller's group (`stop`'s
    SIGTERM to a worker) does not reach half-way through."""
    import subprocess

    proc = subprocess.run(["git", *NO_HOOKS, "-C", str(repo_root), *args], capture_output=True,
                          text=True, input=input, timeout=timeout, check=False, env=env,
                          stdin=None if input is not None else subprocess.DEVNULL, start_new_session=own_group)
    if check and proc.returncode != 0:
        raise SubtaskError("fatal", f"git {' '.join(args[:2])} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def ensure_excluded(common_dir: Path) -> None:
    """Add `/.subtask/` to info/exclude once, so worktrees never show as untracked files."""
    exclude = common_dir / "info" / "exclude"
    try:
        text = exclude.read_text() if exclude.exists() else ""
    except OSError:
        return
    if EXCLUDE_LINE in text.splitlines():
        return
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with open(exclude, "a") as fh:
        fh.write(("" if not text or text.endswith("\n") else "\n") + EXCLUDE_LINE + "\n")


def check_worktree_location(path: str) -> None:
    if ".git" in path.split(os.sep):
        raise SubtaskError("usage", f"worktree directory {path} is below a .git folder, "
                           "where Claude Code refuses to write",
                           hint="git config subtask.worktreeDir <a folder outside .git>")


FALLBACK_AUTHOR = ("git-subtask worker", "git-subtask@localhost")


def author_identity(repo: Repo) -> tuple[str, str]:
    """The user's name and email for commits of their work (`user.name`, `user.email`, as
    libgit2's default signature reads them), with a fallback that never fails."""
    name, email = ((repo.config.git(key) or "").strip() for key in ("user.name", "user.email"))
    if not name or not email or any(c in name + email for c in "<>\n"):
        return FALLBACK_AUTHOR
    return name, email


def tree_of(repo: Repo, commit: str) -> str:
    """The id of the tree a commit (its id, or a name git resolves to one) holds; KeyError when
    there is no such commit."""
    objects = repo.objects
    tree = gitobjects.tree_of_commit(objects, commit) if gitobjects.is_oid(commit) else None
    if tree is None:  # a name, a tag: git peels it to its commit
        named = objects.commit_of(commit)
        tree = gitobjects.tree_of_commit(objects, named) if named is not None else None
    if tree is None:
        raise KeyError(commit)
    return tree


# What the evidence's diff is, whatever the user's diff settings: no external diff or textconv,
# git's default algorithm, no order file, renames as `diff.renames` says (as libgit2 found them).
DIFF = ("diff", "--no-ext-diff", "--no-textconv", "--no-color", "--diff-algorithm=myers", "-O/dev/null")
DIFF_ARGS = (*DIFF, "--raw", "--numstat", "-z")


def diff_stats(repo: Repo, base: str,
               head: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, int]]:
    """Commits (sha, subject; children before parents) and changed files (path, status, +/-;
    a binary file's lines count 0) of base..head, and totals: two git processes, no libgit2."""
    commits: list[dict[str, Any]] = []
    files: list[dict[str, Any]] = []
    if base != head:
        listed = pipes.run(["git", "--git-dir", str(repo.git_dir), "rev-list", "--topo-order", f"{base}..{head}"])
        shas = os.fsdecode(listed[1]).split()
        for sha, found in zip(shas, repo.objects.read(shas), strict=True):
            message = gitobjects.commit_message(found[1]).decode("utf-8", "replace") if found else ""
            commits.append({"sha": sha, "subject": message.splitlines()[0] if message else ""})
        files = _changed_files(pipes.run(["git", *NO_HOOKS, "-C", str(repo.root), *DIFF_ARGS, base, head])[1])
    totals = {"commits": len(commits), "files": len(files), "added": sum(f["added"] for f in files),
              "deleted": sum(f["deleted"] for f in files)}
    return commits, files, totals


RawEntry = tuple[str, list[str], str, str]  # status letter, its paths (a rename's or copy's two), old id, new id


def raw_entries(fields: list[str]) -> tuple[list[RawEntry], int]:
    """The entries of `git diff --raw -z` at the start of `fields` (its output split at NULs):
    each `:modes ids STATUS` and its path (a rename's or copy's two paths); and the index of the
    first field after them (a numstat's or a patch's)."""
    found: list[RawEntry] = []
    pos = 0
    while pos < len(fields) and fields[pos].startswith(":"):
        _, _, old_id, new_id, status = fields[pos].split()
        count = 2 if status[0] in "RC" else 1
        found.append((status[0], fields[pos + 1:pos + 1 + count], old_id, new_id))
        pos += 1 + count
    return found, pos


def _changed_files(out: bytes) -> list[dict[str, Any]]:
    """The files of `git diff --raw --numstat -z`: each raw entry, then each numstat entry in the
    same order."""
    fields = out.decode("utf-8", "replace").split("\0")
    raw, pos = raw_entries(fields)
    files = []
    for status, named, _, _ in raw:
        plus, minus, counted = fields[pos].split("\t", 2)  # a path may hold a tab
        pos += 1 if counted else 3  # a rename's numstat names no path on its line: both follow
        entry: dict[str, Any] = {"path": named[-1], "status": status, "added": _lines(plus), "deleted": _lines(minus)}
        if len(named) == 2:
            entry["old_path"] = named[0]
        files.append(entry)
    return files


def _lines(counted: str) -> int:
    return int(counted) if counted.isdigit() else 0  # "-": a binary file
