"""Shared helpers for the benchmarks: generated repositories, timing, result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def sh(*args: str, cwd=None, env=None, check=True) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=check)


def make_repo(path: Path, files: int = 2000, folders: int = 50) -> Path:
    """A repository of `files` small files spread over `folders` folders, one commit."""
    path.mkdir(parents=True)
    sh("git", "init", "-q", "-b", "main", str(path))
    for n in range(files):
        folder = path / f"pkg{n % folders:02d}"
        folder.mkdir(exist_ok=True)
        (folder / f"mod{n:04d}.py").write_text(f"def f{n}():\n    return {n}\n")
    sh("git", "add", "-A", cwd=path)
    sh("git", "-c", "user.name=bench", "-c", "user.email=bench@example.com", "commit", "-q", "-m", "generated", cwd=path)
    sh("git", "config", "subtask.engine", "shell", cwd=path)
    sh("git", "config", "user.name", "bench", cwd=path)
    sh("git", "config", "user.email", "bench@example.com", cwd=path)
    return path


def timed(fn, runs: int = 7) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 1)


def machine() -> dict:
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "git": sh("git", "--version").stdout.strip()}


def save(name: str, data: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2))
    return path


def subtask_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "git-subtask"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "subtask"]
