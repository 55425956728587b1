#!/usr/bin/env bash
# Install git-subtask into .venv and run one real job on the shell engine in a scratch repository.
#
#   bash scripts/quickstart.sh          # the scratch repository is removed at the end
#   bash scripts/quickstart.sh --keep   # ... or kept, to look around in it
#
# It leaves nothing behind: the scratch repository goes (unless --keep), and no process outlives
# the script (`wait` returns once the job's worker let go). QUICKSTART_SKIP_INSTALL=1 uses
# the git-subtask already on PATH (the test suite runs it so).
set -euo pipefail
keep=0
[ "${1:-}" = "--keep" ] && keep=1
here="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "${QUICKSTART_SKIP_INSTALL:-}" ]; then
    # The same editable install as the README's test command, in the same .venv: either may come
    # first, and neither turns the other's install into a frozen copy of the checkout.
    [ -x "$here/.venv/bin/pip" ] || python3 -m venv "$here/.venv"
    "$here/.venv/bin/pip" install -q -e "$here"
    export PATH="$here/.venv/bin:$PATH"
fi
tmp="$(mktemp -d)"
if [ "$keep" = 0 ]; then
    trap 'rm -rf "$tmp"' EXIT
fi
scratch="$tmp/demo repo"
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
if [ "$keep" = 1 ]; then
    echo "scratch repository (kept): $scratch"
else
    echo "done; the scratch repository is removed (bash scripts/quickstart.sh --keep keeps it)"
fi
