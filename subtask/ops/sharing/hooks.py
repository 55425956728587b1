"""`git subtask hooks install | uninstall | status`: the post-merge hook, chained with what is there.

Owns `<hooks dir>/post-merge` when installed, and `<hooks dir>/post-merge.pre-subtask`, the hook
that was there before (a user's own, or one written by pre-commit, husky or lefthook), which our
hook calls first with the same arguments, passing its exit status through.

Invariants:
- Never compute the hooks path with `core.hooksPath=/dev/null` (the hooks-off switch the tool uses
  for its own git commands), because git would answer `/dev/null`: the hooks folder is git's
  effective one (`core.hooksPath` honoured).
- Install is idempotent; uninstall restores exactly what was there, byte for byte and mode,
  because the old hook is moved (renamed), never rewritten.
- Never overwrite a hook that is not ours (nor delete it); move it aside, because uninstall must
  restore it byte for byte.
- The hook never fails a merge, also when `git-subtask` is not on PATH; then it says so (on
  stderr), never silently doing nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from subtask.git.gitrepo import Repo
from subtask.model.dataclass import dataclass
from subtask.model.errors import SubtaskError

HOOK_NAME = "post-merge"
BACKUP_SUFFIX = ".pre-subtask"
MARKER = "# git-subtask post-merge hook"
# Kept identical to hooks/post-merge in the source tree (a test checks it).
HOOK_TEXT = r"""#!/bin/sh
# git-subtask post-merge hook: clean up after delegated jobs that just landed.
# Installed by `git subtask hooks install`; it never fails the merge.
old="$0.pre-subtask"
status=0
if [ -x "$old" ]; then
    case "$(head -n 1 "$old")" in
        # A POSIX sh hook (husky, lefthook) is sourced, so it keeps the $0 it finds its helpers by.
        *[/\ ]sh) ( . "$old" ); status=$? ;;
        *) "$old" "$@"; status=$? ;;
    esac
fi
if command -v git-subtask >/dev/null 2>&1; then
    git-subtask cleanup --merged --quiet >/dev/null 2>&1 || true
else
    echo "git-subtask post-merge hook: git-subtask is not on PATH here, so nothing was cleaned up" \
         "(the next git subtask command does it; or: git subtask cleanup --merged)" >&2
fi
exit $status
"""


@dataclass
class HookStatus:
    """The post-merge hook as it stands (`status`, and after `install` or `uninstall`)."""

    installed: bool
    path: Path
    chained: Path | None  # the previous hook we call first
    lines: list[str]


def hooks_dir(repo: Repo) -> Path:
    """git's effective hooks folder for the current worktree (honours core.hooksPath)."""
    workdir = Path(repo.git.workdir or repo.root)
    # Deliberately not gitrepo.git(): its `-c core.hooksPath=/dev/null` would be the answer.
    proc = subprocess.run(["git", "-C", str(workdir), "rev-parse", "--git-path", "hooks"], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise SubtaskError("fatal", f"could not find the hooks folder: {proc.stderr.strip()}")
    path = Path(os.path.expanduser(proc.stdout.strip()))
    return path if path.is_absolute() else (workdir / path)


def _is_ours(path: Path) -> bool:
    try:
        return MARKER in path.read_text(errors="replace")
    except OSError:
        return False


def status(repo: Repo) -> HookStatus:
    folder = hooks_dir(repo)
    hook, backup = folder / HOOK_NAME, folder / (HOOK_NAME + BACKUP_SUFFIX)
    installed = _is_ours(hook)
    chained = backup if installed and backup.exists() else None
    if installed:
        found = shutil.which("git-subtask")
        runs = (f"it runs {found} (git-subtask on PATH at merge time)" if found else
                "but git-subtask is not on PATH here: a merge from here only warns")
        lines = [f"installed: {hook}; {runs}"] + ([f"chained: runs {backup} first"] if chained else [])
    elif hook.exists() or hook.is_symlink():
        lines = [f"not installed: {hook} is another hook (install keeps it and calls it first)"]
    else:
        lines = [f"not installed: {hook}"]
    return HookStatus(installed, hook, chained, lines)


def install(repo: Repo) -> HookStatus:
    folder = hooks_dir(repo)
    hook, backup = folder / HOOK_NAME, folder / (HOOK_NAME + BACKUP_SUFFIX)
    if _is_ours(hook):
        if hook.read_text() != HOOK_TEXT:
            _write_hook(hook)  # an older version of ours: refresh it, keep the chain
        result = status(repo)
        result.lines.insert(0, "already installed")
        return result
    folder.mkdir(parents=True, exist_ok=True)
    if hook.exists() or hook.is_symlink():
        if backup.exists() or backup.is_symlink():
            raise SubtaskError("fatal", f"both {hook} and {backup} exist and neither is git-subtask's: "
                               "not touching them",
                               hint=f"merge them by hand, or add this line to {hook}: "
                                    "git-subtask cleanup --merged --quiet || true")
        os.rename(hook, backup)  # a rename keeps bytes, mode and symlinks exactly
    _write_hook(hook)
    return status(repo)


def _write_hook(hook: Path) -> None:
    tmp = hook.with_name(f".{hook.name}.subtask-tmp")
    tmp.write_text(HOOK_TEXT)
    tmp.chmod(0o755)
    os.replace(tmp, hook)


def uninstall(repo: Repo) -> HookStatus:
    folder = hooks_dir(repo)
    hook, backup = folder / HOOK_NAME, folder / (HOOK_NAME + BACKUP_SUFFIX)
    if not _is_ours(hook):
        result = status(repo)
        result.lines.insert(0, "nothing to uninstall")
        return result
    hook.unlink()
    restored = False
    if backup.exists() or backup.is_symlink():
        os.rename(backup, hook)
        restored = True
    result = status(repo)
    result.lines.insert(0, f"uninstalled; restored the previous hook {hook}" if restored else "uninstalled")
    return result
