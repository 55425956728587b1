"""`git subtask verify ID [--run]`: a job's record checked against git, from the record alone.

What a reviewer runs on a teammate's job, and what CI can run on a pushed branch: the record's
signature (as git checks it with this clone's allowed signers), its pins, its evidence computed
again from git (commits, files, +/-), its verify result against the commit it names, and with
`run` the verify command itself on that exact commit (`reverify`). Each finding says whether
the record's claim matches (`ok` True), does not (False), or is a fact with no claim to check
(None: not signed, started elsewhere, the branch moved on after the job).

Nothing here writes anything: no record, note, ref or pin (the scratch checkout of `run` goes).
"""

from __future__ import annotations

from subtask.git import ownership, records, signing
from subtask.git.gitrepo import Repo, diff_stats, tree_of
from subtask.git.records import Job
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.model.job import work_base
from subtask.ops.landing import landed, verify_rerun
from subtask.words import judge_line


@dataclass
class Finding:
    """One claim of a job's record checked against git, or a fact with no claim to check."""

    what: str
    ok: bool | None  # True: matches; False: does not; None: a fact, no claim to check
    detail: str

    def to_dict(self) -> dict:
        return {"what": self.what, "ok": self.ok, "detail": self.detail}


@dataclass
class Recheck:
    """What `git subtask verify` found of one job's record against git (`recheck`)."""

    job_id: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def mismatches(self) -> list[Finding]:
        return [f for f in self.findings if f.ok is False]

    def to_dict(self) -> dict:
        return {"v": 1, "id": self.job_id, "ok": not self.mismatches,
                "findings": [f.to_dict() for f in self.findings]}

    def lines(self) -> list[str]:
        mark = {True: "ok      ", False: "MISMATCH", None: "-       "}
        out = [f"{mark[f.ok]} {f.what}: {f.detail}" for f in self.findings]
        n = len(self.mismatches)
        out.append(f"{self.job_id}: " + ("what its record claims matches git" if not n else
                                         f"{n} mismatch{'es' if n > 1 else ''} between its record and git"))
        return out


def recheck(repo: Repo, job: Job, run: bool = False, reuse: bool | None = None) -> Recheck:
    attempt = job.state.current
    if not attempt.terminal:
        raise SubtaskError("not_finished", f"{job.id} is {attempt.state}: its record makes its claims when it ends",
                           hint=f"git subtask wait {job.id}")
    report = Recheck(job.id)
    add = report.findings.append
    provenance = signing.check_one(repo, job.tip, job.signed)
    add(Finding("signature", None if not provenance.signed else provenance.trusted,
                f"the record ({job.tip[:7] if job.tip else '?'}) is {provenance.words()}"))
    mine = ownership.owns(repo, job)
    add(Finding("clone", None, "started in this clone" if mine else
                f"started in {'clone ' + job.spec.clone if job.spec.clone else 'another clone'}, not this one"))
    head = landed.recorded_head(job)
    _pins(repo, job, head, add)
    if repo.objects.commit_of(head) is None:
        add(Finding("commits", False, f"the job's head {head[:7]} is not in this repository "
                                      f"(git fetch origin subtask/{job.id}, or git subtask pull for its pins)"))
        return report
    _evidence(repo, job, head, add)
    _verify_claim(repo, job, head, add)
    branch = landed.branch_ref(job)
    tip = repo.objects.ref(branch) if branch else None
    if tip is not None and tip.target != head:
        add(Finding("branch", None, f"{job.spec.branch} moved on to {tip.target[:7]} after the job "
                                    f"(its record ends at {head[:7]})"))
    if run:
        reuse = repo.config.flag("verify.reuse") if reuse is None else reuse
        _run(repo, job, head, add, trusted_record=mine or bool(provenance.trusted), reuse=reuse)
    return report


def _pins(repo: Repo, job: Job, head: str, add) -> None:
    for which, want in (("base", job.spec.base), ("head", head)):
        if which == "head" and head == job.spec.base:
            continue  # no commit made: no head pin
        name = records.pin_ref(job.id, which)
        ref = repo.objects.ref(name)
        if ref is None:
            add(Finding(f"{which} pin", False, f"{name} is missing (the record says {want[:7]})"))
        else:
            add(Finding(f"{which} pin", ref.target == want,
                        f"{name} is {ref.target[:7]}"
                        + ("" if ref.target == want else f", the record says {want[:7]}")))


def _evidence(repo: Repo, job: Job, head: str, add) -> None:
    evidence = job.evidence
    if evidence is None:
        add(Finding("evidence", None, "the record holds none (the attempt ended before it was computed)"))
        return
    base = work_base(job)  # a reconciled job's evidence counts from where land moved it
    if evidence.head != head or evidence.base != base:
        add(Finding("evidence", False, f"it covers {evidence.base[:7]}..{evidence.head[:7]}, the record's job is "
                                       f"{base[:7]}..{head[:7]}"))
        return
    commits, files, totals = diff_stats(repo, base, head)
    said = {(f.get("path"), f.get("status"), f.get("added"), f.get("deleted")) for f in evidence.files}
    seen = {(f["path"], f["status"], f["added"], f["deleted"]) for f in files}
    problems = []
    if [c.get("sha") for c in evidence.commits] != [c["sha"] for c in commits]:
        problems.append(f"commits: the record lists {len(evidence.commits)}, git has {len(commits)}")
    if said != seen:
        differ = sorted({p for p, *_ in said ^ seen if p})
        problems.append("files: " + ", ".join(differ[:10]) + (" …" if len(differ) > 10 else "")
                        + " differ from what the record says")
    keys = ("commits", "files", "added", "deleted")
    if any(evidence.totals.get(k) != totals[k] for k in keys):
        problems.append(f"totals: the record says {_totals(evidence.totals)}, git says {_totals(totals)}")
    add(Finding("evidence", not problems, "; ".join(problems) if problems else
                f"{_totals(totals)} since {base[:7]}, as recorded"))


def _totals(t: dict) -> str:
    files, commits = t.get("files"), t.get("commits")
    return (f"{files} file{'' if files == 1 else 's'}, +{t.get('added')} -{t.get('deleted')}, "
            f"{commits} commit{'' if commits == 1 else 's'}")


def _verify_claim(repo: Repo, job: Job, head: str, add) -> None:
    verify = job.state.kept.verify
    if verify is None:
        return
    tree = tree_of(repo, head)
    problems = []
    if verify.head != head:
        problems.append(f"it ran on {verify.head[:7]}, the job's head is {head[:7]}")
    elif verify.tree and tree and verify.tree != tree:
        problems.append(f"it names the tree {verify.tree[:7]}, {head[:7]} has {tree[:7]}")
    word = "passed" if verify.passed else "failed"
    add(Finding("verify", not problems, "; ".join(problems) if problems else
                f"recorded {word} on {head[:7]} (exit {verify.exit_code})"))


def _run(repo: Repo, job: Job, head: str, add, *, trusted_record: bool, reuse: bool) -> None:
    if not job.spec.verify:
        add(Finding("verify --run", None, "the record names no verify command"))
        return
    rerun = verify_rerun.run(repo, job, head, trusted_record=trusted_record, reuse=reuse)
    here = "passed" if rerun.result.passed else ("timed out" if rerun.result.timed_out else
                                                 f"failed (exit {rerun.result.exit_code}"
                                                 + "".join(f"; check {c} failed"
                                                           for c in rerun.result.checks_failed or ())
                                                 + ")")
    claim = job.state.kept.verify
    if rerun.result.reused:
        found = rerun.result.reused
        detail = (f"{rerun.result.command} {here} on the same tree, judged the same way, here before: reused, not run "
                  f"again (at {str(found.get('commit'))[:7]}, {found.get('job')}, {found.get('by')}; "
                  "--no-reuse runs it)")
    else:
        detail = f"{rerun.result.command} {here} here on {head[:7]}" + ("" if rerun.confined else " (unconfined)")
    judged = judge_line(rerun.result)
    if judged:
        detail += f", {judged}"
    if claim is None:
        add(Finding("verify --run", None, detail + "; the record holds no result to compare"))
        return
    said = "passed" if claim.passed else "failed"
    add(Finding("verify --run", rerun.result.passed == claim.passed, f"{detail}; the record says {said}"))
