"""Issue 39: what judging a verify by the base's tests costs, against today's verify, in one run.

    PYTHONPATH=. python bench/harness.py [--runs 7] [--tests 400]

One generated repository of 2,000 files: `--tests` test modules under tests/ (each imports one
code module and asserts on it), the rest code modules in 40 packages, a conftest.py and a
pyproject.toml with a pytest table. A job's worktree (`git worktree add`) holds the job's commit:
one code module changed. The verify is `python -m pytest -q` (plugin autoload off), run with
`sh -c` as the worker runs it (`procs.run`), in interleaved rounds, p50 of each:

- `today`: verify as it ran before issue 39, on the worktree as the job left it;
- `judged`: `overlay.prepare` (the comparison with the base: its tree read, the harness files on
  disk hashed, the worktree walked for files the job added) + `overlay.overlaid` + the same run;
- `compare` and `lay + undo`: the comparison and the overlay alone (no verify), the cost the
  judge adds in the ways a job leaves its worktree:
  - `clean`: the job touched no harness path and left no bytecode (an engine that ran no tests);
  - `bytecode`: it ran the tests itself, so their bytecode is there: moved aside for the verdict,
    so pytest rewrites and compiles the tests again (today's verify reads the job's bytecode);
  - `tests changed`: it changed a test and added a conftest.py: written back and moved aside
    (the verify that follows is also run a second time on its own tree, reported apart: that
    second run is counted on its own, not in the cost).

Target (the issue): the judge's cost at most 10 % of today's verify, or 30 ms, whichever is larger.
Saves bench/results/harness.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import loadavg, save, sh  # noqa: E402

from subtask.git.gitrepo import open_repo  # noqa: E402
from subtask.ops.landing import overlay  # noqa: E402
from subtask.proc import procs  # noqa: E402

FILES = 2000
VERIFY = "python -m pytest -q -x -p no:randomly"
SCENARIOS = ("clean", "bytecode", "tests changed")


def make_repo(path: Path, tests: int) -> Path:
    """2,000 files: `tests` test modules, code modules for the rest (less conftest and pyproject)."""
    path.mkdir(parents=True)
    sh("git", "init", "-q", "-b", "main", str(path))
    code = FILES - tests - 2
    for n in range(code):
        folder = path / f"pkg{n % 40:02d}"
        folder.mkdir(exist_ok=True)
        (folder / f"mod{n:04d}.py").write_text(f"def f{n}():\n    return {n}\n")
    (path / "tests").mkdir()
    for n in range(tests):
        (path / "tests" / f"test_m{n:04d}.py").write_text(
            f"from pkg{n % 40:02d}.mod{n:04d} import f{n}\n\n\ndef test_{n}(one):\n    assert f{n}() * one == {n}\n")
    (path / "conftest.py").write_text("import pytest\n\n\n@pytest.fixture\ndef one():\n    return 1\n")
    (path / "pyproject.toml").write_text('[project]\nname = "bench"\nversion = "0"\n\n'
                                         '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    sh("git", "add", "-A", cwd=path)
    commit(path, "generated")
    return path


def commit(path: Path, message: str) -> str:
    sh("git", "-c", "user.name=bench", "-c", "user.email=bench@example.com", "commit", "-qam", message, cwd=path)
    return sh("git", "rev-parse", "HEAD", cwd=path).stdout.strip()


def the_job(repo: Path, scenario: str) -> tuple[Path, str, str]:
    """A worktree of a job's commit on the base: (worktree, base, head)."""
    base = sh("git", "rev-parse", "HEAD", cwd=repo).stdout.strip()
    tree = repo.parent / f"job-{scenario.replace(' ', '-')}"
    sh("git", "worktree", "add", "-q", "-b", f"job-{scenario.replace(' ', '-')}", str(tree), base, cwd=repo)
    (tree / "pkg00" / "mod0000.py").write_text("def f0():\n    return 0  # the job's change\n")
    if scenario == "tests changed":
        test = tree / "tests" / "test_m0001.py"
        test.write_text(test.read_text().replace("* one ==", "==") + "\n")
        (tree / "tests" / "conftest.py").write_text("collect_ignore = []\n")
        sh("git", "add", "-A", cwd=tree)
    head = commit(tree, "the job")
    return tree, base, head


def run_verify(tree: Path, env: dict) -> float:
    result = procs.run(["sh", "-c", VERIFY], cwd=tree, env=env, timeout=600, tail_bytes=4096, stdout_grace=2.0,
                       redact=True)
    if result.exit_code != 0:
        raise SystemExit(f"verify failed in {tree}: {result.stdout_tail[-500:]}")
    return result.seconds


def judged(repo, tree: Path, base: str, head: str, env: dict, stash: Path, tmp: Path) -> tuple[float, ...]:
    """(compare, its CPU, lay + undo, the whole judged verify), seconds."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    judge = overlay.prepare(repo, asked=None, command=VERIFY, trusted=base, source="base", worktree=tree, head=head,
                            env=env)
    compared, compared_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert judge.error is None, judge.error
    laid = 0.0
    t1 = time.perf_counter()
    with overlay.overlaid(repo, judge, tree, stash, tmp) as extra:
        laid += time.perf_counter() - t1
        run_verify(tree, {**env, **extra})
        t2 = time.perf_counter()
    laid += time.perf_counter() - t2
    return compared, compared_cpu, laid, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--tests", type=int, default=400, help="test modules among the 2,000 files")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="subtask-harness-bench-"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONDONTWRITEBYTECODE",) and not k.startswith("SUBTASK_")}
    env.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")
    samples: dict[str, dict[str, list[float]]] = {
        s: {k: [] for k in ("today", "judged", "compare", "compare_cpu", "lay", "own")} for s in SCENARIOS}
    try:
        repo_path = make_repo(tmp / "repo", args.tests)
        repo = open_repo(repo_path)
        jobs = {s: the_job(repo_path, s) for s in SCENARIOS}
        load0 = loadavg()
        for _ in range(args.runs + 1):  # the first round warms the page cache and bytecode: dropped
            for scenario, (tree, base, head) in jobs.items():
                row = samples[scenario]
                if scenario == "clean":  # an engine that ran no tests: no bytecode in the worktree
                    for cache in tree.rglob("__pycache__"):
                        shutil.rmtree(cache)
                row["today"].append(run_verify(tree, env))
                if scenario == "clean":
                    for cache in tree.rglob("__pycache__"):
                        shutil.rmtree(cache)
                compared, compared_cpu, laid, whole = judged(repo, tree, base, head, env,
                                                             tmp / f"stash-{scenario}", tmp)
                row["compare"].append(compared)
                row["compare_cpu"].append(compared_cpu)
                row["lay"].append(laid)
                row["judged"].append(whole)
                if scenario == "tests changed":  # the second run, on the job's own tree: reported apart
                    row["own"].append(run_verify(tree, env))
        load1 = loadavg()
        hashed = {s: overlay.prepare(repo, asked=None, command=VERIFY, trusted=jobs[s][1], source="base",
                                     worktree=jobs[s][0], head=jobs[s][2]).comparison.hashed for s in SCENARIOS}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def p50(values: list[float]) -> float:
        return round(statistics.median(values[1:]) * 1000, 1) if len(values) > 1 else float("nan")

    figures = {}
    print(f"{FILES} files ({args.tests} test modules), {args.runs} interleaved rounds; load {load0} -> {load1}")
    print(f"  {'p50 ms':<14}{'today':>9}{'judged':>9}{'compare':>9}{'its CPU':>9}{'lay+undo':>9}{'cost':>9}"
          f"{'ratio':>8}{'limit':>8}  {'own run':>8}")
    for scenario in SCENARIOS:
        row = {k: p50(v) for k, v in samples[scenario].items()}
        cost = round(row["judged"] - row["today"], 1)
        limit = round(max(0.10 * row["today"], 30.0), 1)
        row.update(cost=cost, ratio=round(row["judged"] / row["today"], 3), limit=limit, ok=cost <= limit,
                   hashed=hashed[scenario])
        figures[scenario] = row
        own = f"{row['own']:>8}" if row["own"] == row["own"] else f"{'-':>8}"
        print(f"  {scenario:<14}{row['today']:>9}{row['judged']:>9}{row['compare']:>9}{row['compare_cpu']:>9}"
              f"{row['lay']:>9}{cost:>9}"
              f"{row['ratio']:>8}{limit:>8}  {own}  {'ok' if row['ok'] else 'OVER'} ({hashed[scenario]} files hashed)")
    path = save("harness", {"files": FILES, "tests": args.tests, "runs": args.runs, "verify": VERIFY,
                            "load": [load0, load1], "figures": figures})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
