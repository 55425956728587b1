"""Admission: the one critical section that gives attempts a slot (or a place in the queue) and
reserves their money, shared by `api` (start, reply, a group's start) and `plans` (a waiting job
that starts).

Invariants (docs/architecture.md):
- Lock order: slots, then ledger; nothing slow runs under either.
- Never reserve money before the slot entry is on disk, because a crash between the two would
  leave a reservation nobody can find; a slot entry without a record is ended by the next
  command (no run-lock holder) or by the worker handed its slot (tests:
  `test_a_crash_at_any_step_leaks_no_slot_no_money_and_no_work`).
- Never reserve a group's money one member at a time without checking the sum first, because a
  refusal of the third would leave the first two reserved: all N budgets are checked against the
  cap in the one admission critical section (`ledger.check_fits_locked`), then reserved; a refused
  group leaves no ref, slot entry, ledger row or run-lock file (test:
  `groups::test_a_paid_group_under_a_cap_that_fits_n_minus_1_budgets_is_refused_with_nothing_left`).
- Never let a refused or failed admission throw away the reaps and fills done in the same critical
  section, because those run-locks are already taken and those dead workers already removed; the
  error carries them out (`admission`) to be undone or handed on.
"""

from __future__ import annotations

from subtask.git.gitrepo import Repo
from subtask.model import faults, money
from subtask.ops.running import lifecycle, spending
from subtask.state import ledger, slots


def admit(repo: Repo, launches: list, what: str | None = None
          ) -> tuple[list[int], list[slots.HandOff], list[slots.HandOff]]:
    """The one critical section: reap, fill, admit or queue, reserve. Returns (positions, dead, handed).

    Each launch has `job` (its current attempt is the one admitted) and `paid`.

    The slot entries are saved before the money is reserved, so a crash between the two leaves a
    slot entry that recovery ends, never a reservation nobody knows about. Several launches (a
    group) are reserved all or none: the cap is checked for their sum before any row is written.
    A refusal (or any error) takes the entries back out but keeps what the reap and fill did; the
    error then carries them as `admission`, for the caller to undo or hand on.
    """
    state_dir = repo.state_dir_str
    max_running = repo.config.integer("maxRunning")
    failure: BaseException | None = None
    reserved: list[str] = []
    with slots.transaction(state_dir, rebuild=lambda: lifecycle.rebuild_slots(repo)) as current:
        dead = slots.reap_dead(current, state_dir)
        handed = slots.fill(current, state_dir, max_running)
        positions = []
        for launch in launches:
            job, attempt = launch.job, launch.job.state.current
            entry = slots.make_entry(job.id, attempt.n, repo.common_dir_str, parent=job.spec.parent,
                                     pool=job.spec.group if job.spec.concurrency else None,
                                     pool_max=job.spec.concurrency)
            positions.append(slots.admit(current, entry, max_running))
            attempt.state = "running" if positions[-1] == 0 else "queued"  # admitted: its worker starts now
        try:
            faults.point("after_admit")
            paid = [launch for launch in launches if launch.paid]
            if paid:
                slots.save(state_dir, current)
                cap = money.usd(repo.config.number("monthlyCapUsd"))
                with ledger.lock(state_dir):
                    if len(launches) > 1:
                        ledger.check_fits_locked(state_dir, [p.job.state.current.cost.reserved for p in paid], cap,
                                                 what=what or f"{len(paid)} jobs")
                    for launch in paid:
                        job, attempt = launch.job, launch.job.state.current
                        # Dated when queued: the record alone then tells the reservation's month.
                        reservation = ledger.reserve_locked(
                            state_dir, job=job.id, attempt=attempt.n, engine=job.spec.engine,
                            usd=attempt.cost.reserved, cap_usd=cap, now=spending.reserved_at(attempt.queued_at))
                        reserved.append(reservation.rid)
                faults.point("after_reserve")
        except BaseException as exc:
            for launch in launches:
                slots.remove(current, launch.job.id, launch.job.state.current.n)
            failure = exc
    if failure is not None:
        for rid in reserved:  # a group whose later reservation failed: none of it stays reserved
            ledger.close(state_dir, rid, 0.0, reason="start undone")
        failure.admission = (dead, handed)  # type: ignore[attr-defined]
        raise failure
    return positions, dead, handed


def after_admission(repo: Repo, admission: tuple[list[slots.HandOff], list[slots.HandOff]]) -> None:
    """Settle the dead workers the admission reaped and spawn the workers it handed slots to."""
    dead, handed = admission
    lifecycle.start_handoffs(repo, handed)
    lifecycle.end_reaped(repo, dead)


def fill_after_queueing(repo: Repo) -> list[slots.HandOff]:
    """A queued job's starter fills free slots once it lets go of its run-lock.

    While it was writing the branch and record it held that lock, and `slots.fill` stops at a busy
    queue head; a slot freed meanwhile would otherwise sit idle until the next command.
    """
    with slots.transaction(repo.state_dir_str, rebuild=lambda: lifecycle.rebuild_slots(repo)) as current:
        return slots.fill(current, repo.state_dir_str, repo.config.integer("maxRunning"))


def unadmit(repo: Repo, job_id: str, attempt_n: int) -> None:
    with slots.transaction(repo.state_dir_str, rebuild=lambda: lifecycle.rebuild_slots(repo)) as current:
        slots.remove(current, job_id, attempt_n)
