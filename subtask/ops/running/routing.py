"""`--engine auto`: which engine runs a job, chosen by filters and an explicit utility.

Candidates are engines the person could have named with `--engine` (`subtask.routing.engines`,
else every agent engine git-subtask knows here: claude, codex, each configured command engine,
each plugin; `shell` only when named there, because its task is a script). Each passes five
filters in order, or is removed by the first it fails:

1. installed: its program is here;
2. authenticated: it has credentials (as far as can be told without spending);
3. isolation: it can be confined as asked (`--isolation`, `subtask.isolation`), the refusal
   `start` would give;
4. budget: a paid engine's budget fits `subtask.maxJobUsd` and what the monthly cap has left,
   and its jobs here have not cost more than that budget on average;
5. room: fewer of its jobs run here than `subtask.routing.<name>.maxRunning`, when set.

The rest are scored, each term shown (`routing explain`):

    score = weightPass * pass - weightCost * usd - weightTime * minutes + weightRoom * room

`pass` is its jobs' pass rate in this repository's records (done, verify not failed), smoothed
(passes + 1) / (ended + 2), so an engine with no history scores 0.5; `usd` its jobs' mean cost here
(no history: its budget when paid, else 0); `minutes` their mean time from start to end (no history:
0); `room` the share of its `maxRunning` left (1 without one). The weights are
`subtask.routing.weightPass`, `weightCost`, `weightTime` and `weightRoom`. The highest score wins; a
tie goes to the earlier candidate. No candidate left: refused, naming each one's filter. The job's
record keeps the choice and why.

Invariants:
- Never let `--engine auto` choose an engine the person could not have named with `--engine`
  (`routing.candidates`: `subtask.routing.engines`, else the engines known here), nor pass one
  over silently, because a routed job must be the job the person would have started: the
  record keeps the choice, the score and why each other candidate lost (`tests/test_routing.py`).
"""

from __future__ import annotations

from subtask.engines import configured_command_engines, engine_names, get_engine
from subtask.engines.base import preflight
from subtask.git import records
from subtask.git.gitrepo import Repo
from subtask.model.dataclass import dataclass, field
from subtask.model.errors import SubtaskError
from subtask.proc import isolation
from subtask.state import ledger

AUTO = "auto"
FILTERS = ("installed", "authenticated", "isolation", "budget", "room")
WEIGHTS = {"pass": "routing.weightPass", "cost": "routing.weightCost", "time": "routing.weightTime",
           "room": "routing.weightRoom"}
ENDED = ("done", "failed")  # a stopped or skipped job says nothing about its engine


@dataclass
class Candidate:
    """One engine `--engine auto` could choose: its score, or the filter that removed it."""

    name: str
    filter: str | None = None  # the filter that removed it
    why: str = ""  # in words
    score: float | None = None
    terms: dict[str, dict] = field(default_factory=dict)  # term -> {"value", "weight", "points"}
    history: dict = field(default_factory=dict)  # ended, passed, usd, minutes

    def to_dict(self) -> dict:
        return {"name": self.name, "removed_by": self.filter, "why": self.why or None,
                "score": None if self.score is None else round(self.score, 4), "terms": self.terms,
                "history": self.history}


@dataclass
class Routing:
    """Every candidate of one `--engine auto` choice, filtered and scored (`route`)."""

    candidates: list[Candidate]
    weights: dict[str, float]

    @property
    def chosen(self) -> Candidate | None:
        best, top = None, None
        for c in self.candidates:
            if c.score is not None and (top is None or c.score > top):  # the first of equals stays
                best, top = c, c.score
        return best

    def to_dict(self) -> dict:
        chosen = self.chosen
        return {"v": 1, "chosen": chosen.name if chosen else None, "weights": self.weights,
                "candidates": [c.to_dict() for c in self.candidates]}

    def record(self) -> dict:
        """What the job's record keeps: the choice, its score and terms, each other candidate's
        score or the filter that removed it."""
        chosen = self.chosen
        if chosen is None or chosen.score is None:  # callers ask `chosen` first, `refusal` if none
            raise ValueError("a routing that chose no engine has no record")
        return {"v": 1, "chosen": chosen.name, "score": round(chosen.score, 4), "terms": chosen.terms,
                "weights": self.weights,
                "others": {c.name: (round(c.score, 4) if c.score is not None else f"{c.filter}: {c.why}")
                           for c in self.candidates if c is not chosen}}

    def refusal(self) -> SubtaskError:
        lines = "; ".join(f"{c.name}: {c.filter}: {c.why}" for c in self.candidates) or "no candidate engine"
        return SubtaskError("fatal", f"--engine auto found no engine that can run this job: {lines}",
                            hint="git subtask routing explain '...' (same options); or name one: --engine E")


def candidates(repo: Repo) -> list[str]:
    configured = repo.config.get("routing.engines")
    if configured and configured.strip():
        return list(dict.fromkeys(configured.replace(",", " ").split()))
    commands = configured_command_engines(list((repo.config.settings() or {}).keys()))
    return [n for n in engine_names(commands) if n not in ("shell", "command")]


def route(repo: Repo, *, readonly: bool, isolation: str | None, max_usd: float | None) -> Routing:
    """Every candidate filtered and scored for a job asking for this isolation and budget."""
    weights = {term: repo.config.number(key) for term, key in WEIGHTS.items()}
    entries = records.list_entries(repo)
    found = []
    for name in candidates(repo):
        candidate = Candidate(name)
        found.append(candidate)
        try:
            engine = get_engine(name, repo.config)
        except SubtaskError as exc:
            candidate.filter, candidate.why = "installed", exc.message
            continue
        history = _history(entries, name)
        candidate.history = history
        removed = (_installed(engine) or _isolation(repo, engine, readonly, isolation)
                   or _budget(repo, engine, max_usd, history) or _room(repo, name, entries))
        if removed:
            candidate.filter, candidate.why = removed
            continue
        _score(candidate, engine, history, weights, _budget_usd(repo, max_usd), _room_left(repo, name, entries))
    return Routing(found, weights)


def _installed(engine) -> tuple[str, str] | None:
    probe = engine.probe()
    if not probe.installed:
        return "installed", probe.detail or "not installed"
    if probe.authenticated is False:
        return "authenticated", probe.detail or "not logged in"
    refusal = preflight(engine)  # what `start` itself refuses (a provider's key, a missing CLI)
    if refusal:
        return "authenticated", refusal
    return None


def _isolation(repo: Repo, engine, readonly: bool, flag: str | None) -> tuple[str, str] | None:
    try:
        isolation.resolve(engine, readonly=readonly, flag=flag, configured=repo.config.get("isolation"))
    except SubtaskError as exc:
        return "isolation", exc.message
    return None


def _budget_usd(repo: Repo, max_usd: float | None) -> float:
    return float(repo.config.number("defaultMaxUsd")) if max_usd is None else float(max_usd)


def _budget(repo: Repo, engine, max_usd: float | None, history: dict) -> tuple[str, str] | None:
    if not engine.paid:
        return None

    usd = _budget_usd(repo, max_usd)
    cap = repo.config.number("maxJobUsd")
    if usd > cap:
        return "budget", f"its budget ${usd:.2f} is above subtask.maxJobUsd=${cap:.2f}"
    left = ledger.summary(repo.state_dir, repo.config.number("monthlyCapUsd")).left_usd
    if left < usd:
        return "budget", f"its budget ${usd:.2f} is more than this month's cap has left (${max(left, 0):.2f})"
    mean = history.get("usd")
    if mean is not None and mean > usd:
        return "budget", f"its {history['ended']} jobs here cost ${mean:.2f} on average, above this job's ${usd:.2f}"
    return None


def _running(entries: list[dict], name: str) -> int:
    return sum(1 for e in entries if e.get("engine") == name and e.get("state") == "running")


def _cap(repo: Repo, name: str) -> int | None:
    raw = repo.config.get(f"routing.{name}.maxRunning")
    return int(float(raw)) if raw not in (None, "") else None


def _room(repo: Repo, name: str, entries: list[dict]) -> tuple[str, str] | None:
    cap = _cap(repo, name)
    if cap is not None and _running(entries, name) >= cap:
        key = f"routing.{name}.maxRunning"
        return "room", f"{_running(entries, name)} of its jobs run here, git config subtask." + f"{key} is {cap}"
    return None


def _room_left(repo: Repo, name: str, entries: list[dict]) -> float:
    cap = _cap(repo, name)
    return 1.0 if not cap else max(0.0, (cap - _running(entries, name)) / cap)


def _history(entries: list[dict], name: str) -> dict:
    """This repository's ended jobs of the engine: how many, how many passed, mean cost and minutes."""
    ended = [e for e in entries if e.get("engine") == name and e.get("state") in ENDED]
    passed = sum(1 for e in ended if e.get("state") == "done" and e.get("verify") != "failed")
    costs = [e["cost"] for e in ended if isinstance(e.get("cost"), (int, float))]
    times = [(e["ended"] - e["created"]) / 60 for e in ended
             if isinstance(e.get("ended"), (int, float)) and isinstance(e.get("created"), (int, float))]
    return {"ended": len(ended), "passed": passed,
            "usd": round(sum(costs) / len(costs), 4) if costs else None,
            "minutes": round(sum(times) / len(times), 3) if times else None}


def _score(candidate: Candidate, engine, history: dict, weights: dict[str, float], budget: float,
           room: float) -> None:
    usd = history["usd"] if history["usd"] is not None else (budget if engine.paid else 0.0)
    values = {"pass": (history["passed"] + 1) / (history["ended"] + 2), "cost": usd,
              "time": history["minutes"] or 0.0, "room": room}
    signs = {"pass": 1, "cost": -1, "time": -1, "room": 1}
    candidate.terms = {term: {"value": round(value, 4), "weight": weights[term],
                              "points": round(signs[term] * weights[term] * value, 4)}
                       for term, value in values.items()}
    candidate.score = sum(signs[t] * weights[t] * v for t, v in values.items())
