"""Issues 12 and 40: what confining a trivial job costs, ours against another tree's, in one run.

Run: python bench/isolation.py [--runs N] [--spawns N] [--before REV] [--no-save]. Rounds
alternate between the trees (and modes), so load drifts hit each alike; medians are printed and
written to bench/results/isolation.json.

- spawn: a confined `true` started through `procs.run` in a job's sandbox, in a process of each
  tree's own (the job's view built, Landlock, pid 1 of a pid namespace), `--spawns` a round; the
  same `true` unconfined for reference; and building the sandbox (once per attempt).
- job: start -> wait of a trivial shell job (`echo hi`) with `--isolation worktree`, each tree's
  CLI, and `--isolation none` with ours; and the part of its worker's time the sandbox takes
  (its phases `confinement`, `engine` and `wrap_up`), less noisy than start -> wait.
`--before` (default `main`): a revision of git-subtask, taken with `git archive` ("today's").
`--bwrap PATH`: also spawn `true` in the same kind of view built by bubblewrap (what Claude Code's
and Codex's sandboxes use), for docs/security.md's choice.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from common import make_repo, median_ms, save, sh, subtask_cmd  # noqa: E402

from subtask.proc import isolation, namespaces  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# Run with the tree to measure first on sys.path: builds a job's sandbox as the worker does
# (only the arguments every version takes), then spawns `true` in it and without it.
SPAWN = r"""
import json, statistics, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from subtask.proc import isolation, procs
assert isolation.__file__.startswith(sys.argv[1]), isolation.__file__
repo, worktree, admin, area, n = Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5], int(sys.argv[6])
t = time.perf_counter()
policy = isolation.build_policy("worktree", worktree=worktree, admin=admin, common_dir=repo / ".git",
                                has_branch=True, tmpdir=area, extra=[], engine_extra=[])
isolation.plan_namespaces(policy, network="allow", asked=True)
sandbox = isolation.Sandbox(policy)
build = time.perf_counter() - t
confined, plain = [], []
for _ in range(n):
    with isolation.confined(sandbox):
        t = time.perf_counter()
        result = procs.run(["true"], cwd=worktree)
        confined.append(time.perf_counter() - t)
    assert result.exit_code == 0, result
    t = time.perf_counter()
    procs.run(["true"], cwd=worktree)
    plain.append(time.perf_counter() - t)
sandbox.close()
bwrap = []
if len(sys.argv) > 7:  # the same kind of view built by bubblewrap, for comparison (`--bwrap`)
    git_dir = str(repo / ".git")
    view = [sys.argv[7], "--die-with-parent", "--new-session", "--unshare-pid", "--cap-drop", "ALL",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", str(Path.home())]
    for folder in ("/usr", "/etc", "/opt", "/sys"):
        view += ["--ro-bind", folder, folder]
    for link in ("/bin", "/sbin", "/lib", "/lib64"):
        if Path(link).is_symlink():
            view += ["--symlink", str(Path(link).readlink()), link]
    for folder in dict.fromkeys([sys.prefix, sys.base_prefix]):
        view += ["--ro-bind", folder, folder]
    view += ["--ro-bind", git_dir, git_dir, "--bind", str(admin), str(admin), "--bind", git_dir + "/objects",
             git_dir + "/objects", "--bind", str(worktree), str(worktree), "--chdir", str(worktree)]
    for _ in range(n):
        t = time.perf_counter()
        result = procs.run([*view, "true"], cwd=worktree)
        bwrap.append(time.perf_counter() - t)
        assert result.exit_code == 0, result
print(json.dumps({"build": build, "confined": confined, "plain": plain, "bwrap": bwrap}))
"""


def worktree_of(repo: Path) -> tuple[Path, Path]:
    name = "st-bench000"
    path = repo / ".subtask" / "worktrees" / name
    sh("git", "worktree", "add", "-q", "-b", f"subtask/{name}", str(path), cwd=repo)
    return path, repo / ".git" / "worktrees" / name


def spawn_round(tree: Path, repo: Path, worktree: Path, admin: Path, area: Path, spawns: int,
                bwrap: str | None = None) -> dict:
    shutil.rmtree(area, ignore_errors=True)
    area.mkdir()
    proc = subprocess.run([sys.executable, "-c", SPAWN, str(tree), str(repo), str(worktree), str(admin), str(area),
                           str(spawns), *([bwrap] if bwrap else [])], capture_output=True, text=True, cwd=area.parent)
    if proc.returncode != 0:
        raise SystemExit(f"spawning in {tree} failed: {proc.stderr}")
    return json.loads(proc.stdout)


CLI = "import sys; from subtask.entry import main; sys.exit(main())"


def cli_of(tree: Path) -> tuple[list[str], dict]:
    """A tree's CLI, run from the tree itself (its workers too: PYTHONPATH), the dependencies
    from this venv."""
    if tree == ROOT:
        return subtask_cmd(), dict(os.environ)
    return [sys.executable, "-c", CLI], dict(os.environ, PYTHONPATH=str(tree))


# The phases of a worker's attempt that confinement touches (subtask/model/phases.py): building the
# sandbox, running the engine in it, and closing it.
SANDBOX_PHASES = ("confinement", "engine", "wrap_up")


def sandbox_phases(path: Path) -> list[float]:
    """Per attempt written to `path` (SUBTASK_PHASES), the seconds of `SANDBOX_PHASES`."""
    found = []
    for line in path.read_text().splitlines() if path.exists() else []:
        marks = json.loads(line)["marks"]
        steps = zip(marks, marks[1:], strict=False)
        found.append(sum(t1 - t0 for (_, t0), (name, t1) in steps if name in SANDBOX_PHASES))
    return found


def start_to_wait(cli: tuple[list[str], dict], repo: Path, mode: str) -> float:
    command, env = cli
    t0 = time.perf_counter()
    job = sh(*command, "start", "--engine", "shell", "--isolation", mode, "echo hi",
             cwd=repo, env=env).stdout.split()[0]
    sh(*command, "wait", job, cwd=repo, env=env)
    return time.perf_counter() - t0


def archive(rev: str, where: Path) -> Path:
    """The tree of `rev`, compiled as an installed package is (else every process of it compiles)."""
    import compileall

    where.mkdir()
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=data, check=True)
    compileall.compile_dir(str(where / "subtask"), quiet=1)
    return where


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="rounds (each: every tree, every mode)")
    parser.add_argument("--spawns", type=int, default=20, help="confined spawns per tree per round")
    parser.add_argument("--before", default="main", help="the revision to compare with (git archive)")
    parser.add_argument("--bwrap", help="a bubblewrap binary: also spawn `true` in the same kind of view built by it")
    parser.add_argument("--no-save", action="store_true", help="print only; write no results file")
    args = parser.parse_args()
    if not (isolation.support().available and namespaces.support().available):
        print(f"isolation worktree: not available here ({isolation.support().reason or namespaces.support().reason})")
        return 0
    root = Path(tempfile.mkdtemp(prefix="subtask-bench-isolation-"))
    try:
        before_tree = archive(args.before, root / "before-tree")
        trees = {"ours": ROOT, "before": before_tree}
        spawn_repo = make_repo(root / "spawn-repo", files=20, folders=2)
        worktree, admin = worktree_of(spawn_repo)
        clis = {name: cli_of(tree) for name, tree in trees.items()}
        for name, (_, env) in clis.items():
            env["SUBTASK_PHASES"] = str(root / f"phases-{name}.jsonl")
        repos = {name: make_repo(root / f"repo-{name}", files=200, folders=10) for name in trees}
        for name, repo in repos.items():
            start_to_wait(clis[name], repo, "worktree")  # warm caches once, outside the figures
        spawns = {name: {"build": [], "confined": [], "plain": [], "bwrap": []} for name in trees}
        jobs: dict[str, list[float]] = {"none": [], "ours": [], "before": []}
        for _ in range(args.runs):
            for name, tree in trees.items():
                got = spawn_round(tree, spawn_repo, worktree, admin, root / f"area-{name}", args.spawns,
                                  args.bwrap if name == "ours" else None)
                spawns[name]["build"].append(got["build"])
                for kind in ("confined", "plain", "bwrap"):
                    spawns[name][kind] += got.get(kind, [])
            jobs["none"].append(start_to_wait(clis["ours"], repos["ours"], "none"))
            for name in trees:
                jobs[name].append(start_to_wait(clis[name], repos[name], "worktree"))
        phases = {name: sandbox_phases(root / f"phases-{name}.jsonl")[2:] for name in trees}  # warm-ups aside
    finally:
        shutil.rmtree(root, ignore_errors=True)
    spawn_ms = {name: {kind: median_ms(values) for kind, values in figures.items() if values}
                for name, figures in spawns.items()}
    job_ms = {name: median_ms(values) for name, values in jobs.items()}
    phase_ms = {name: median_ms(values) for name, values in phases.items() if values}
    print(f"spawn (median of {args.runs * args.spawns}): confined true  ours {spawn_ms['ours']['confined']:.1f} ms, "
          f"before {spawn_ms['before']['confined']:.1f} ms; unconfined {spawn_ms['ours']['plain']:.1f} ms")
    if "bwrap" in spawn_ms["ours"]:
        print(f"spawn: true in the same kind of view built by bubblewrap ({args.bwrap}): "
              f"{spawn_ms['ours']['bwrap']:.1f} ms")
    print(f"sandbox built once per attempt: ours {spawn_ms['ours']['build']:.1f} ms, "
          f"before {spawn_ms['before']['build']:.1f} ms")
    print(f"isolation none      start -> wait  median {job_ms['none']:7.1f} ms  ({args.runs} runs, ours)")
    print(f"isolation worktree  start -> wait  median {job_ms['ours']:7.1f} ms ours, {job_ms['before']:7.1f} ms "
          f"before ({args.before})")
    if len(phase_ms) == 2:
        print(f"the sandbox's part of a job (the worker's {', '.join(SANDBOX_PHASES)} phases): "
              f"ours {phase_ms['ours']:.1f} ms, before {phase_ms['before']:.1f} ms")
    overhead = spawn_ms["ours"]["confined"] - spawn_ms["before"]["confined"]
    per_job = phase_ms["ours"] - phase_ms["before"] if len(phase_ms) == 2 else job_ms["ours"] - job_ms["before"]
    print(f"the view's cost against {args.before}: {overhead:+.1f} ms per confined child, {per_job:+.1f} ms "
          f"per trivial job (target <= 10 ms); {isolation.support().describe()}; load {os.getloadavg()[0]:.1f}")
    if not args.no_save:
        path = save("isolation", {"runs": args.runs, "spawns": args.spawns, "before": args.before,
                                  "spawn_median_ms": spawn_ms, "job_median_ms": job_ms,
                                  "sandbox_phases_median_ms": phase_ms})
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
