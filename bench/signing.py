"""Issue 29: what signed records cost a job, and what the no-key path costs against the code before.

    PYTHONPATH=. python bench/signing.py [--runs 11] [--before DIR]

One small generated repository (20 files), copied per side; interleaved rounds (one sample of
every side per round, so a slow moment of the machine hits all alike), p50 of each:

- `ours`: this tree, no signing key (the path every user without a key takes);
- `ours+ssh`: this tree with an ed25519 key made here (`gpg.format ssh`, `user.signingKey` a key
  file, an allowed-signers file naming it): every record, group and notes commit signed;
- `before` (with `--before DIR`, e.g. `git archive main | tar -x -C DIR`): the code before.

Per side: `start` (until its prompt comes back; its CPU), start + wait of `true` (the job end
to end, as `wait` returns), and `show` (which checks the record's signature when there is one).
For the signed side also: how many commits one job signs (record, notes), and one `git
commit-tree -S` against one `git commit-tree` (the signature's own cost). Saves
bench/results/signing.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_speed import CPU, p50_ms, side, timed  # noqa: E402
from common import loadavg, make_repo, save  # noqa: E402

BENCH = Path(__file__).resolve().parent


def use_ssh_key(repo: Path, folder: Path) -> None:
    key = folder / "bench_key"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bench", "-f", str(key)], check=True)
        public = " ".join((folder / "bench_key.pub").read_text().split()[:2])
        (folder / "allowed_signers").write_text(f"bench@example.com {public}\n")
    for k, v in (("gpg.format", "ssh"), ("user.signingKey", str(key)),
                 ("gpg.ssh.allowedSignersFile", str(folder / "allowed_signers"))):
        subprocess.run(["git", "-C", str(repo), "config", k, v], check=True)


def end_to_end(s) -> tuple[float, float]:
    """(start + wait, start alone) of a `true` job, seconds; the start's CPU to CPU[<label> start]."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([*s.cli, "start", "--engine", "shell", "true"], cwd=s.repo, env=s.env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    job = proc.stdout.read().split()[0]
    _, _, usage = os.wait4(proc.pid, 0)
    start = time.perf_counter() - t0
    CPU.setdefault(f"{s.label} start", []).append(usage.ru_utime + usage.ru_stime)
    s.run("wait", job)
    s.last = job
    return time.perf_counter() - t0, start


def signed_commits(repo: Path, job: str) -> tuple[int, int]:
    """(record commits, of which signed) of one job."""
    codes = subprocess.run(["git", "-C", str(repo), "log", "--format=%G?", f"refs/subtask/{job}/record"],
                           capture_output=True, text=True, check=True).stdout.split()
    return len(codes), sum(1 for c in codes if c != "N")


def commit_tree_ms(repo: Path, sign: bool, runs: int) -> float:
    tree = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD^{tree}"], capture_output=True, text=True,
                          check=True).stdout.strip()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(["git", "-C", str(repo), "commit-tree", "-S" if sign else "--no-gpg-sign", tree, "-m", "x"],
                       capture_output=True, check=True)
        samples.append(time.perf_counter() - t0)
    return p50_ms(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--before", type=Path, help="another tree of git-subtask, measured in the same rounds")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="subtask-signing-bench-"))
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SUBTASK_")}
        repo = make_repo(tmp / "repo", files=20, folders=4)
        sides = [side("ours", BENCH.parent, tmp, env, False, repo, 1)]
        signed = side("ours+ssh", BENCH.parent, tmp, env, False, repo, 1)
        use_ssh_key(signed.repo, tmp)
        sides.append(signed)
        if args.before:
            sides.append(side("before", args.before.resolve(), tmp, env, False, repo, 1))
        for s in sides:  # warm: pyc, page cache
            end_to_end(s)
        samples = {s.label: {"start": [], "start+wait": [], "show": []} for s in sides}
        load0 = loadavg()
        for _ in range(args.runs):
            for s in sides:
                whole, start = end_to_end(s)
                samples[s.label]["start+wait"].append(whole)
                samples[s.label]["start"].append(start)
                samples[s.label]["show"].append(timed([*s.cli, "show", s.last], s.repo, s.env, f"{s.label} show"))
        load1 = loadavg()
        records, signed_n = signed_commits(signed.repo, signed.last)
        notes = subprocess.run(["git", "-C", str(signed.repo), "log", "-1", "--format=%G?", "refs/notes/subtask"],
                               capture_output=True, text=True, check=True).stdout.strip()
        per_sign = {"signed": commit_tree_ms(signed.repo, True, args.runs),
                    "unsigned": commit_tree_ms(signed.repo, False, args.runs)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    figures = {label: {name: p50_ms(v) for name, v in by_name.items()} for label, by_name in samples.items()}
    cpu = {key: p50_ms(values) for key, values in CPU.items()}
    print(f"{args.runs} interleaved rounds; load {load0} -> {load1}")
    print(f"  {'p50 ms':<14}" + "".join(f"{s.label:>12}" for s in sides))
    for name in ("start", "start+wait", "show"):
        print(f"  {name:<14}" + "".join(f"{figures[s.label][name]:>12}" for s in sides))
    print(f"  {'start cpu':<14}" + "".join(f"{cpu.get(f'{s.label} start', ''):>12}" for s in sides))
    print(f"one job signs {signed_n} of {records} record commits and its notes commit ({notes}); "
          f"git commit-tree -S {per_sign['signed']} ms, without -S {per_sign['unsigned']} ms")
    path = save("signing", {"runs": args.runs, "load": [load0, load1], "p50_ms": figures, "cpu_ms": cpu,
                            "record_commits": records, "signed": signed_n, "commit_tree_ms": per_sign})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
