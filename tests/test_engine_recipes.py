"""The command-engine recipes docs/engines.md gives for OpenCode and Kimi Code, run as written
against fakes that print what those CLIs print: cost read where their output gives it, the
summary and STATUS from the agent's words, a reply that resumes OpenCode's session."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import grant_writable

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).parent


def recipe(title: str) -> list[str]:
    """The `git config` lines of the first sh block under the `### <title>` heading of docs/engines.md."""
    text = (ROOT / "docs" / "engines.md").read_text()
    section = text.split(f"### {title}\n", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.startswith("git config")]


def install(repo: Path, tmp_path: Path, title: str, program: str, fake: str) -> dict[str, str]:
    """Set the recipe up in `repo` as docs/engines.md says, with `program` a fake; the environment to start with."""
    for line in recipe(title):
        subprocess.run(["bash", "-c", line], cwd=repo, check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / program
    # The fake beside its launcher, in the scratch folder a confined job's view shows (the suite's
    # own folder is not in it).
    shutil.copy(HERE / fake, bin_dir / fake)
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {bin_dir / fake} \"$@\"\n")
    exe.chmod(0o755)
    log = grant_writable(tmp_path / "logs") / f"{program}.argv"  # the fake's own record of its argv
    log.parent.mkdir(exist_ok=True)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", f"FAKE_{program.upper()}_LOG": str(log)}


def argvs(env: dict[str, str], program: str) -> list[list[str]]:
    path = Path(env[f"FAKE_{program.upper()}_LOG"])
    return [json.loads(line) for line in path.read_text().splitlines() if "--version" not in line]


def test_opencode_recipe_sums_its_steps_cost_and_resumes_its_session(repo, cli, tmp_path):
    env = install(repo, tmp_path, "OpenCode", "opencode", "fake_opencode.py")
    job = cli.start("add a line", "--engine", "opencode", env=env)
    assert cli("wait", job, env=env).returncode == 0
    shown = cli.json("show", job)
    first = shown["state_detail"]["attempts"][0]
    assert first["cost"]["observed"] == pytest.approx(0.0168) and first["cost"]["billing"] == "observed"
    assert first["outcome"] == "done" and first["session_id"].startswith("ses_")
    assert shown["summary"].splitlines() == ['I wrote "add a line" to opencode.txt.', "STATUS: done"]

    cli.ok("reply", job, "and one more", env=env)
    assert cli("wait", job, env=env).returncode == 0
    second = cli.json("show", job)["state_detail"]["attempts"][1]
    assert argvs(env, "opencode")[-1] == ["run", "--format", "json", "--session", first["session_id"],
                                          "and one more"]
    assert second["cost"]["observed"] == pytest.approx(0.0168)  # its own steps only
    assert cli.json("spend")["per_engine"]["opencode"]["committed"] == pytest.approx(0.0336)


def test_kimi_recipe_runs_print_mode_and_charges_the_reservation_it_cannot_read(repo, cli, tmp_path):
    env = install(repo, tmp_path, "Kimi Code", "kimi", "fake_kimi.py")
    job = cli.start("say 'hi' -- and $(nothing)", "--engine", "kimi", "--max-usd", "0.5", env=env)
    assert cli("wait", job, env=env).returncode == 0
    shown = cli.json("show", job)
    attempt = shown["state_detail"]["attempts"][0]
    assert argvs(env, "kimi") == [["--print", "-p", "say 'hi' -- and $(nothing)"]]  # one argument, as written
    assert (attempt["outcome"] == "done" and attempt["cost"]["charged"] == 0.5
            and attempt["cost"]["billing"] == "charged")
    assert shown["summary"].splitlines()[-2:] == ["Wrote the prompt to kimi.txt.", "STATUS: done"]
    assert "kimi.txt" in [f["path"] for f in shown["evidence"]["files"]]
