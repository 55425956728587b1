#!/bin/bash
# The limit (issue 14): one job done by bare git commands, the floor git-subtask is measured against.
#
#   bench/limit.sh REPO ID TASK [ENGINE...]
#
# Creates the worktree and branch (`git worktree add -b`), runs the same fake engine git-subtask
# runs (default: `kimi --output-format stream-json -p TASK`, bench/peer.py's fake kimi on PATH)
# in it, commits what it left (`git add -A && git commit`, only if `git status` shows anything),
# takes the evidence (`git diff --numstat base..HEAD`), writes two refs (`git update-ref`: base and
# head pins) and one review note (`git notes add`). Prints the unix time when the note is written
# (its "terminal state written"), like the other tools' own timestamps in bench/peer.py.
set -euo pipefail
repo=$1 id=$2 task=$3
shift 3
[ $# -gt 0 ] || set -- kimi --output-format stream-json -p "$task"
cd "$repo"
base=$(git rev-parse HEAD)
wt=$repo/.limit-worktrees/$id
git worktree add --quiet -b "limit/$id" "$wt" "$base"
(cd "$wt" && "$@" >/dev/null)
cd "$wt"
if [ -n "$(git status --porcelain --untracked-files=all)" ]; then
  git add -A
  git commit --quiet --no-verify -m "limit $id: work left uncommitted"
fi
head=$(git rev-parse HEAD)
stats=$(git diff --numstat "$base..$head")
git update-ref "refs/limit/$id/base" "$base"
git update-ref "refs/limit/$id/head" "$head"
git notes --ref=limit add -f -m "limit $id: done
${stats}" "$head"
date +%s.%N
