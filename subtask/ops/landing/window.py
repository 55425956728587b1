"""The land window's rules: which integrated states to verify, which prefix may land, who broke a batch.

`land` (subtask/ops/landing/land.py) keeps its jobs in a line. Each job is built on the state before
it (the target's tip, plus every job ahead of it still in the chain): tip+A, tip+A+B, ... Those
states are verified at once, up to the window's width, each in its own scratch worktree
(`Probe`); the target moves to the longest verified prefix as answers arrive. This module is
the bookkeeping of that line, without git: the mechanics (building, verifying, moving) are the
queue's.

- **The chain.** A job whose build or verify failed is out of it (`Entry.failing`): the jobs
  after it are built again without it at once (Zuul's speculation: it is probably the culprit).
  It is final only once every job ahead of it landed; if one ahead fails instead, it is built
  and verified again on the new chain (`stale`).
- **Probes.** Without batches every state of the chain is verified (`wanted`). With a batch
  size only the last state of each batch is; a batch never mixes verify commands.
- **Bisection.** A failed probe whose stretch (the states since the probe before it) holds one
  job names that job. Otherwise the stretch is cut in parts and the end of each but the last is
  verified at once (`BISECT` at a time), each on top of the parts before it; the last part's
  end is the probe that failed, never verified again. The parts before the first that fails
  land; the failing part is cut again until one job is left; the ones after it are built again
  without the culprit, as a new batch.
- **Landing.** The verified prefix (`verified_prefix`) ends at a passed probe with every state
  before it either passed or covered by that probe (a batch), and no failing job, unbuilt job or
  running probe before it.

Invariants:
- Never land a prefix whose states are not each built on the one before it, because a state
  built before a job was put ahead of it (`land --first`) does not hold that job: moved to it,
  the target would lose the job that was said landed (`verified_prefix` stops at such a state,
  `stale` builds it again) (`landwindow::test_a_job_put_ahead_of_built_states_lands_nothing_built_without_it`).
- Never move the land target past a state that no passed verify answers (its own, or, with
  `--batch`, that of a later state of its batch that passed), because with a window the answers
  come out of order: the target moves only to the end of the verified prefix
  (`window.verified_prefix`), and a failure takes its job out of the chain and builds the states after it
  again, so every first-parent commit `land` adds passes its verify when checked alone
  (`landwindow::test_twelve_jobs_with_a_bad_one_in_the_middle_land_the_other_eleven_each_verified`).
"""

from __future__ import annotations

import time

from subtask.model.dataclass import dataclass, field

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any

BISECT = 2  # probes at once when a failed batch is cut: its three parts' first two ends


@dataclass
class Probe:
    """The verify of one integrated state: running in a scratch worktree, or answered (`rerun`;
    at once when a result for the same key was already known)."""

    key: str | None
    tree: str = ""  # of the state
    asked: Any = None  # the harness the job asks for (`reverify.asked_harness`)
    trusted: str = ""  # the commit whose harness judges it (`Queue.judge_of`)
    scratch: Any = None  # integrate.Scratch
    ready: Any = None  # a Future: its scratch being checked out at the state
    pending: Any = None  # reverify.Pending
    rerun: Any = None  # reverify.Rerun, once answered
    reused: bool = False
    started: float = field(default_factory=time.monotonic)
    dropped: bool = False  # aborted: its answer, when it comes, is ignored

    @property
    def running(self) -> bool:
        return self.rerun is None and not self.dropped

    @property
    def passed(self) -> bool | None:
        return None if self.rerun is None else bool(self.rerun.result.passed)


@dataclass
class Entry:
    """One job of the line: its build (`built`: integrate.Built) and the probe of its state."""

    item: Any  # lineup.Item
    out: Any  # lineup.Outcome
    built: Any = None
    probe: Probe | None = None
    failing: bool = False  # negative on `built.onto`: out of the chain the later ones build on
    rebuilds: int = 0  # times the target moved under it
    reconciled: bool = False
    judged: bool = False  # its outcome is said and recorded (a conflict before its reconciliation)

    @property
    def onto(self) -> str | None:
        return None if self.built is None else self.built.onto

    @property
    def in_chain(self) -> bool:
        return self.built is not None and not self.failing

    @property
    def needs_verify(self) -> bool:
        """A state of its own to verify: built into a new commit, with a command to run on it."""
        return self.in_chain and self.built.kind == "built" and bool(self.item.command)

    @property
    def kind(self) -> tuple:
        """What a batch may not mix: the command run on its last state, and its time limit."""
        return (self.item.command, self.item.timeout)


def stale(line: list[Entry], tip: str) -> list[Entry]:
    """The built entries whose state no longer is tip + the chain ahead of them (a job ahead left
    or rejoined the chain, a job was put ahead of them by `land --first`, or the target moved), in
    line order. One built behind an unbuilt one is stale whatever it was built on: no state holds
    the job ahead yet."""
    found, at, gap = [], tip, False
    for entry in line:
        if entry.built is None:
            gap = True
            continue
        if gap or entry.onto != at:
            found.append(entry)
            continue
        if entry.in_chain:
            at = entry.built.commit
    return found


def chain_tip(line: list[Entry], tip: str) -> str:
    """The state the next unbuilt entry builds on."""
    at = tip
    for entry in line:
        if entry.built is None:
            break
        if entry.in_chain:
            at = entry.built.commit
    return at


def wanted(line: list[Entry], batch: int) -> list[Entry]:
    """The entries whose state should be verified now and is not (no probe yet), in line order.
    `batch` 0: every state; else the last of each batch of that many, and bisection cuts."""
    out: list[Entry] = []
    stretch: list[Entry] = []  # built states since the last probe
    complete = all(e.built is not None for e in line)
    running = False  # a probe ahead has not answered: a failed batch after it waits to be cut
    for n, entry in enumerate(line):
        if entry.built is None:
            break
        if not entry.needs_verify:
            continue
        if entry.probe is not None:
            if entry.probe.passed is False:
                if stretch and not running:  # a failed batch: cut it
                    out += [e for e in cuts(stretch) if e.probe is None]
                return out  # nothing after a failure is worth verifying yet
            running = running or entry.probe.running
            stretch = []
            continue
        if not batch:
            out.append(entry)
            continue
        stretch.append(entry)
        later = [e for e in line[n + 1:] if e.built is None or e.needs_verify]
        ends = (len(stretch) >= batch or (complete and not later)
                or (bool(later) and later[0].built is not None and later[0].kind != entry.kind))
        if ends:
            out.append(entry)
            stretch = []
    return out


def cuts(stretch: list[Entry], width: int = BISECT) -> list[Entry]:
    """Where a failed batch is cut (`stretch`: its states before the failed one): the ends of the
    first parts when it and its failed end are cut in `width` + 1 parts, as even as they come."""
    m = len(stretch) + 1
    count = min(width, m - 1)
    return [stretch[i] for i in sorted({max(0, round(m * k / (count + 1)) - 1) for k in range(1, count + 1)})]


def culprit(line: list[Entry], entry: Entry) -> bool:
    """Does the failed probe of `entry` name it alone (no unprobed state of the chain since the
    probe before it)?"""
    before = None
    for other in line:
        if other is entry:
            break
        if other.needs_verify:
            before = other
    return before is None or before.probe is not None


def verified_prefix(line: list[Entry]) -> int | None:
    """The index of the last entry of the prefix that may land (see the module docstring): a
    passed probe, or an entry with nothing to verify right after the prefix."""
    last, at = -1, None
    for n, entry in enumerate(line):
        if not entry.in_chain or (at is not None and entry.onto != at):
            break  # a failing job, or a state not built on the one before it (`stale` has not run)
        at = entry.built.commit
        if not entry.needs_verify:
            if last == n - 1:
                last = n  # its state is the one before it
            continue
        if entry.probe is None:
            continue  # in a batch: covered by a later probe, or not yet
        if entry.probe.passed is not True:
            break
        last = n
    return None if last < 0 else last


def covering(line: list[Entry], n: int) -> Entry | None:
    """The entry whose passed probe covers entry `n` of a landing prefix (itself when it has one)."""
    for entry in line[n:]:
        if entry.needs_verify and entry.probe is not None:
            return entry
    return None
