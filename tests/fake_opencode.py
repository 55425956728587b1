"""A fake `opencode` CLI: `opencode run --format json [--session ID] [--] MESSAGE...`, printing the
JSON lines `opencode run --format json` prints (one object per line: step_start, tool_use, text,
step_finish with that step's cost and tokens; every event carries sessionID), after it writes and
commits a file as its tool call. Each call appends its argv to $FAKE_OPENCODE_LOG."""

import json
import os
import secrets
import subprocess
import sys
import time

args = sys.argv[1:]
with open(os.environ["FAKE_OPENCODE_LOG"], "a") as fh:
    fh.write(json.dumps(args) + "\n")
if args[:1] == ["--version"]:
    print("1.18.31")
    sys.exit(0)
assert args[:3] == ["run", "--format", "json"], args
rest = args[3:]
session = None
if rest[:1] == ["--session"]:
    session, rest = rest[1], rest[2:]
if rest[:1] == ["--"]:
    rest = rest[1:]
message = " ".join(rest)
session = session or "ses_" + secrets.token_hex(6)
now = int(time.time() * 1000)


def say(kind: str, **part) -> None:
    print(json.dumps({"type": kind, "timestamp": now, "sessionID": session,
                      "part": {"sessionID": session, "type": kind.replace("_", "-"), **part}},
                     separators=(",", ":")), flush=True)  # compact, as JavaScript's JSON.stringify


say("step_start", snapshot="0" * 40)
with open("opencode.txt", "a") as fh:
    fh.write(message + "\n")
subprocess.run(["git", "add", "opencode.txt"], check=True)
subprocess.run(["git", "commit", "-q", "--no-verify", "-m", "opencode wrote opencode.txt"], check=True)
say("tool_use", tool="bash", callID="call_1",
    state={"status": "completed", "input": {"command": "git commit"}, "output": "ok"})
say("step_finish", reason="tool-calls", cost=0.0123, tokens={"input": 1200, "output": 80, "cache": {"read": 0}})
say("step_start", snapshot="1" * 40)
say("text", text=f'I wrote "{message}" to opencode.txt.\nSTATUS: done')
say("step_finish", reason="stop", cost=0.0045, tokens={"input": 1400, "output": 20, "cache": {"read": 1000}})
