"""A fake Kimi Code CLI: `kimi --print -p PROMPT`, printing the assistant's words as text (print
mode's default output), after it writes and commits a file. Print mode says nothing of cost or
tokens. Each call appends its argv to $FAKE_KIMI_LOG."""

import json
import os
import subprocess
import sys

args = sys.argv[1:]
with open(os.environ["FAKE_KIMI_LOG"], "a") as fh:
    fh.write(json.dumps(args) + "\n")
if args[:1] in (["--version"], ["-V"]):
    print("kimi, version 1.5.0")
    sys.exit(0)
assert args[:2] == ["--print", "-p"] and len(args) == 3, args
prompt = args[2]
print("Let me write the file.", flush=True)
with open("kimi.txt", "a") as fh:
    fh.write(prompt + "\n")
subprocess.run(["git", "add", "kimi.txt"], check=True)
subprocess.run(["git", "commit", "-q", "--no-verify", "-m", "kimi wrote kimi.txt"], check=True)
print("Wrote the prompt to kimi.txt.\nSTATUS: done", flush=True)
