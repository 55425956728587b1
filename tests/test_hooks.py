"""The post-merge hook: install, chain with what is there (also via core.hooksPath), uninstall exactly."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from conftest import git, refs

from subtask.ops.sharing.hooks import HOOK_TEXT

ROOT = Path(__file__).resolve().parent.parent
OLD_HOOK = """#!/bin/sh
# a user's own post-merge hook
echo "old hook ran with $*" >> "$(git rev-parse --show-toplevel)/old-hook.log"
exit 3
"""
# Shaped like husky's generated wrapper: it finds its helper and the user's script by its own name ($0).
HUSKY_WRAPPER = """#!/usr/bin/env sh
. "$(dirname "$0")/h"
"""
HUSKY_H = """#!/usr/bin/env sh
n=$(basename "$0")
s=$(dirname "$(dirname "$0")")/$n
[ -f "$s" ] || exit 0
sh -e "$s" "$@"
"""


def test_shipped_hook_file_matches_the_installed_text():
    assert (ROOT / "hooks" / "post-merge").read_text() == HOOK_TEXT
    assert os.access(ROOT / "hooks" / "post-merge", os.X_OK)


def test_install_is_idempotent_and_status_reports(cli, repo):
    assert cli("hooks", "status").returncode == 1
    assert "installed:" in cli.ok("hooks", "install")
    assert "already installed" in cli.ok("hooks", "install")
    hook = repo / ".git" / "hooks" / "post-merge"
    assert hook.read_text() == HOOK_TEXT and os.access(hook, os.X_OK)
    assert not (repo / ".git" / "hooks" / "post-merge.pre-subtask").exists()
    assert "installed" in cli.ok("hooks", "status")
    assert cli.ok("hooks", "uninstall").startswith("uninstalled")
    assert not hook.exists()
    assert "nothing to uninstall" in cli.ok("hooks", "uninstall")


def test_hook_chains_an_existing_hook_and_cleans_up_after_a_plain_merge(cli, repo):
    hooks = repo / ".git" / "hooks"
    old = hooks / "post-merge"
    old.write_text(OLD_HOOK)
    old.chmod(0o750)
    original = (old.read_bytes(), stat.S_IMODE(old.stat().st_mode))
    cli.ok("hooks", "install")
    cli.ok("hooks", "install")
    assert (hooks / "post-merge.pre-subtask").read_bytes() == original[0]
    assert "chained" in cli.ok("hooks", "status")
    job = cli.start("echo x > f && git add f && git commit -qm f")
    cli.ok("wait", job)
    git(repo, "merge", "-q", f"subtask/{job}")  # hooks on: git runs our hook, which runs the old one first
    assert (repo / "old-hook.log").read_text() == "old hook ran with 0\n"
    assert f"refs/heads/subtask/{job}" not in refs(repo)
    assert not (repo / ".subtask" / "worktrees" / job).exists()
    # the old hook's exit status passes through
    proc = subprocess.run([str(hooks / "post-merge"), "1"], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 3
    cli.ok("hooks", "uninstall")
    assert (old.read_bytes(), stat.S_IMODE(old.stat().st_mode)) == original
    assert not (hooks / "post-merge.pre-subtask").exists()


def test_core_hooks_path_and_a_husky_style_hook(cli, repo):
    husky = repo / ".husky"
    (husky / "_").mkdir(parents=True)
    (husky / "_" / "h").write_text(HUSKY_H)
    wrapper = husky / "_" / "post-merge"
    wrapper.write_text(HUSKY_WRAPPER)
    wrapper.chmod(0o755)
    (husky / "post-merge").write_text('echo "husky user hook $*" > husky.log\n')
    git(repo, "config", "core.hooksPath", ".husky/_")
    before = wrapper.read_bytes()
    out = cli.ok("hooks", "install")
    assert str(husky / "_" / "post-merge") in out, "installed where git looks, not in .git/hooks"
    assert not (repo / ".git" / "hooks" / "post-merge").exists()
    job = cli.start("echo y > g && git add g && git commit -qm g")
    cli.ok("wait", job)
    git(repo, "merge", "-q", f"subtask/{job}")
    assert (repo / "husky.log").read_text() == "husky user hook 0\n", "husky still finds its hook by name"
    assert cli.json("show", job)["state_detail"]["landed_in"]
    cli.ok("hooks", "uninstall")
    assert wrapper.read_bytes() == before and os.access(wrapper, os.X_OK)


def test_hook_never_fails_the_merge_without_git_subtask_on_path(repo, tmp_path):
    hooks = repo / ".git" / "hooks"
    hook = hooks / "post-merge"
    hook.write_text(HOOK_TEXT)
    hook.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(["sh", str(hook), "0"], cwd=repo, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "git-subtask is not on PATH here" in proc.stderr  # said, never silent (issue 31)


def test_install_refuses_to_overwrite_two_foreign_hooks(cli, repo):
    hooks = repo / ".git" / "hooks"
    (hooks / "post-merge").write_text("#!/bin/sh\necho a\n")
    (hooks / "post-merge.pre-subtask").write_text("#!/bin/sh\necho b\n")
    proc = cli("hooks", "install")
    assert proc.returncode == 128 and "not touching them" in proc.stderr
    assert (hooks / "post-merge").read_text() == "#!/bin/sh\necho a\n"
