#!/usr/bin/env bash
# Install git-subtask into .venv and run one real job on the shell engine in a scratch repository.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
python3 -m venv "$here/.venv"
"$here/.venv/bin/pip" install -q "$here"
export PATH="$here/.venv/bin:$PATH"
scratch="$(mktemp -d)/demo repo"
git init -q -b main "$scratch"
cd "$scratch"
git -c user.name=Demo -c user.email=demo@example.com commit -q --allow-empty -m "initial commit"
echo "\$ git subtask start --engine shell --verify 'test -f hello.txt' 'echo hi > hello.txt'"
# Capture, then print: `tee /dev/stderr` would truncate stderr when it is a file.
started=$(git subtask start --engine shell --verify 'test -f hello.txt' 'echo hi > hello.txt')
echo "$started"
job=${started%% *}
echo "\$ git subtask wait $job"
git subtask wait "$job"
echo "\$ git subtask list"
git subtask list
echo "\$ git log --notes=subtask -1 subtask/$job"
git --no-pager log --notes=subtask -1 "subtask/$job"
echo
echo "scratch repository: $scratch"
