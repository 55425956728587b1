"""Shared helpers for the benchmarks: generated repositories, timing, result files."""

from __future__ import annotations

import contextlib
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


def make_repo(path: Path, files: int = 2000, folders: int = 50, packed: bool = False) -> Path:
    """A repository of `files` small files spread over `folders` folders, one commit; its objects
    loose, as a commit made here leaves them, or with `packed` a clone of that (`--no-local`: one
    pack), as a clone has them. Not `git gc`: it deletes the loose objects, and on ext4 without a
    journal every file created in the next minutes pays for each inode freed (see `create_cost`)."""
    made = path.with_name(path.name + "-loose") if packed else path
    made.mkdir(parents=True)
    sh("git", "init", "-q", "-b", "main", str(made))
    for n in range(files):
        folder = made / f"pkg{n % folders:02d}"
        folder.mkdir(exist_ok=True)
        (folder / f"mod{n:04d}.py").write_text(f"def f{n}():\n    return {n}\n")
    sh("git", "add", "-A", cwd=made)
    sh("git", "-c", "user.name=bench", "-c", "user.email=bench@example.com", "commit", "-q", "-m", "generated",
       cwd=made)
    if packed:
        sh("git", "clone", "-q", "--no-local", str(made), str(path))
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


def make_wheel_venv(where: Path, tree: Path | None = None) -> Path:
    """Ours installed as users get it: a wheel of this checkout in a fresh venv (no editable
    import hook, modules compiled by pip), its dependencies taken from the running venv."""
    import site
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    wheels = where / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "-w", str(wheels), str(tree or Path(__file__).resolve().parents[1])],
                   check=True, stderr=subprocess.DEVNULL)
    target = Path(subprocess.run([str(where / "bin" / "python"), "-c",
                                  "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    *map(str, wheels.glob("*.whl"))], check=True, env=env, stderr=subprocess.DEVNULL)
    deps = sysconfig.get_paths()["purelib"] if not site.getsitepackages() else site.getsitepackages()[0]
    (target / "zz-deps.pth").write_text(deps + "\n")  # a plain path line: no import hook runs
    # `pip install --target` writes no console scripts: the same entry point, written by hand.
    for name, module in (("git-subtask", "subtask.entry"), ("subtask-mcp", "subtask.faces.mcp_server")):
        script = where / "bin" / name
        script.write_text(f"#!{where / 'bin' / 'python'}\nimport sys\nfrom {module} import main\nsys.exit(main())\n")
        script.chmod(0o755)
    return where


def create_cost(under: Path, dirs: int = 40, per_dir: int = 50) -> float:
    """Microseconds to create one empty file, over `dirs` x `per_dir` files in a new folder under
    `under` (the shape of a generated checkout). It moves with the file system's state, not only
    with the disk: on ext4 without a journal, every new inode of a block group is allocated past
    the inodes freed there in the last minute (up to six while their table block is dirty), so
    a checkout right after a large delete costs several times more. Nothing is deleted here."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="create-cost-", dir=under))
    started = time.perf_counter()
    for d in range(dirs):
        os.mkdir(folder / f"d{d}")
        for f in range(per_dir):
            os.close(os.open(folder / f"d{d}" / f"f{f}", os.O_CREAT | os.O_WRONLY, 0o644))
    return round((time.perf_counter() - started) * 1e6 / (dirs * per_dir), 1)


def cpu_loop_s(count: int = 10_000_000) -> float:
    """Seconds for a pure-Python loop of `count` additions: the CPU's speed at the time. This
    machine's varied ~1.7x within an hour (2026-12-03, docs/benchmarks.md), and every figure
    with it, while the peer's fixed one-second polls did not: a ratio read with no such figure
    beside it cannot tell a slower CPU from slower code."""
    started = time.perf_counter()
    total = 0
    for n in range(count):
        total += n
    return round(time.perf_counter() - started, 2)


def file_system(path: Path) -> str:
    """`path`'s file system type, and for ext4 whether it has a journal (see `create_cost`)."""
    best = ("", "", "")
    for line in Path("/proc/mounts").read_text().splitlines():
        device, mount, kind = line.split()[:3]
        if str(path.resolve()).startswith(mount.rstrip("/") + "/") and len(mount) >= len(best[1]):
            best = (device, mount, kind)
    device, _, kind = best
    if kind == "ext4":
        journal = Path("/sys/fs/ext4") / Path(device).name / "journal_task"
        with contextlib.suppress(OSError):
            if journal.read_text().strip() == "<none>":
                return "ext4, no journal"
    return kind or "unknown"


def loadavg() -> list[float]:
    """The load averages, and the share of the last 10 s some task waited on the disk
    (`/proc/pressure/io`), which moves every figure that writes a checkout."""
    load = [round(x, 2) for x in os.getloadavg()]
    try:
        some = Path("/proc/pressure/io").read_text().splitlines()[0]
        load.append(f"io {float(some.split()[1].split('=')[1]):.0f}%")
    except (OSError, IndexError, ValueError):
        pass
    return load

