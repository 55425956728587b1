"""A fake paid CLI agent for the `command` engine: writes a file, commits it, maybe prints a cost.

The task is `key=value` words: `file=NAME` (default work.txt), `sleep=SECONDS`, `cost=USD` (print
`cost: $USD`; without it the cost is unknown and the worker charges the whole reservation) and
`hold=PATH` (wait until PATH exists; with `hold_member=K` only in member K of a best-of group) and
`log=PATH` (append `start|end <job> <time>` lines, for overlap and order checks).
"""

import os
import subprocess
import sys
import time

words = dict(w.split("=", 1) for w in sys.argv[1].split() if "=" in w)
job = os.environ.get("SUBTASK_JOB_ID", "?")


def log(what: str) -> None:
    if "log" in words:
        with open(words["log"], "a") as fh:
            fh.write(f"{what} {job} {time.time():.6f}\n")


log("start")
held = "hold" in words and words.get("hold_member", os.environ.get("SUBTASK_GROUP_MEMBER")) == \
    os.environ.get("SUBTASK_GROUP_MEMBER")
while held and not os.path.exists(words["hold"]):
    time.sleep(0.02)
time.sleep(float(words.get("sleep", 0)))
name = words.get("file", "work.txt")
with open(name, "a") as fh:
    fh.write(sys.argv[1] + "\n")
subprocess.run(["git", "add", name], check=True)
subprocess.run(["git", "commit", "-q", "--no-verify", "-m", f"agent wrote {name}"], check=True)
if "cost" in words:
    print(f"cost: ${words['cost']}")
log("end")
