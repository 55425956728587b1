"""A stand-in for aider (aider-chat 0.86), as far as git-subtask meets it, offline.

What it does, as aider does:
- `setup_git`: reads the identity with `git config --get user.name` / `user.email`; when either is
  missing it writes a placeholder into the repository's config (aider uses GitPython's
  `config_writer`, here `git config`), and a refused write ends it, exit 1, before any model call;
- one model call per run, reported as aider reports it: `Tokens: ... sent, ... received. Cost:
  $M message, $S session.`, each figure rounded as aider's `format_cost` rounds it (to the cent at
  $0.01 and above); `FAKE_AIDER_CALL_COST` is what the call costs (default 0.0149);
- the edit: appends the task to `work.txt`;
- auto-commits (unless `--no-auto-commits`): commits the edit with a message from another model
  call that its Cost line does not count (the "weak model" writing commit messages).
"""

import argparse
import math
import os
import subprocess
import sys


def format_cost(value: float) -> str:
    """aider's own rounding of a cost for its Cost line."""
    if value == 0:
        return "0.00"
    magnitude = abs(value)
    if magnitude >= 0.01:
        return f"{value:.2f}"
    return f"{value:.{max(2, 2 - int(math.log10(magnitude)))}f}"


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=False)


def setup_git() -> None:
    have = {key: git("config", "--get", key).stdout.strip() for key in ("user.name", "user.email")}
    for key, placeholder in (("user.name", "Your Name"), ("user.email", "you@example.com")):
        if not have[key]:
            wrote = git("config", key, placeholder)
            if wrote.returncode != 0:
                sys.stderr.write(wrote.stderr)
                sys.stderr.write("Traceback (most recent call last):\n  ...\nPermissionError: [Errno 13] "
                                 "Permission denied: '.git/config.lock'\n")
                sys.exit(1)
            print(f'Update git name with: git config {key} "{placeholder}"')


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--message-file", required=True)
    parser.add_argument("--auto-commits", action=argparse.BooleanOptionalAction, default=True)
    args, _ = parser.parse_known_args()
    print("Aider v0.86.1")
    setup_git()
    task = open(args.message_file).read().strip()
    cost = float(os.environ.get("FAKE_AIDER_CALL_COST", "0.0149"))
    with open("work.txt", "a") as f:
        f.write(task + "\n")
    print(f"Tokens: 2.3k sent, 110 received. Cost: ${format_cost(cost)} message, ${format_cost(cost)} session.")
    print("Applied edit to work.txt")
    if args.auto_commits:  # a commit message from a call its Cost line leaves out
        git("add", "work.txt")
        git("commit", "-q", "-m", "feat: " + task[:40])
        print("Commit 1a2b3c4 feat: " + task[:40])


main()
