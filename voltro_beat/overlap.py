"""Overlap policies: what happens to an occurrence while its schedule's previous run is live.

Pure: the scheduler reads the schedule's live runs from the store and records what these
functions decide through the gate, so replicas deciding at once still leave one row.

* ``allow`` (Celery's behaviour): publish regardless.
* ``skip``: while a previous run is in flight (claimed, published, started or retrying),
  record the new occurrence ``skipped`` (reason ``overlap``) and do not publish it.
* ``queue``: record it ``queued``; it is published, oldest first and one at a time, once no
  earlier run of the schedule is live, or recorded missed once older than its lateness,
  whether its turn came or not (see :func:`promotion`).

A live run older than the schedule's overlap timeout (counted from when it started, else was
published, else claimed: the run's ``since``) no longer blocks anything: it is reported
as stale so that the scheduler can say so in its row (reason ``overlap_timeout``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from voltro_beat.runs import Run
from voltro_beat.status import Reason, Status


@dataclass(frozen=True, slots=True)
class View:
    """A schedule's live runs (unfinished occurrences) as one policy decision sees them."""

    running: tuple[Run, ...]
    queued: tuple[Run, ...]
    #: Running rows past the overlap timeout: they block nothing any more.
    stale: tuple[Run, ...]


def view(runs: Iterable[Run], *, now: datetime, timeout: timedelta) -> View:
    """Sort a schedule's live runs into running, queued and stale, oldest first."""
    running, queued, stale = [], [], []
    for run in sorted(runs, key=lambda r: r.occurrence.scheduled_at):
        if run.status == Status.QUEUED:
            queued.append(run)
        elif run.since is not None and now - run.since > timeout:
            stale.append(run)
        else:
            running.append(run)
    return View(tuple(running), tuple(queued), tuple(stale))


def decide(policy: str, at: datetime, live: View) -> tuple[Status, Reason | None]:
    """The first status of the occurrence at ``at``: ``claimed``, ``skipped`` or ``queued``."""
    if policy == "allow":
        return Status.CLAIMED, None
    earlier_running = any(r.occurrence.scheduled_at < at for r in live.running)
    if policy == "skip":
        return (Status.SKIPPED, Reason.OVERLAP) if earlier_running else (Status.CLAIMED, None)
    earlier_queued = any(r.occurrence.scheduled_at < at for r in live.queued)
    if earlier_running or earlier_queued:
        return Status.QUEUED, None
    return Status.CLAIMED, None


def with_claimed(live: View, run: Run) -> View:
    """``live`` after ``run`` was claimed in the same tick (it blocks what follows)."""
    return View((*live.running, run), live.queued, live.stale)


def promotion(live: View, now: datetime, lateness: timedelta) -> tuple[tuple[Run, ...], Run | None]:
    """The queued runs past ``lateness`` (never to be published: to record missed now, not
    when their turn comes) and the queued run to publish now: the oldest of the others, once
    nothing of the schedule is running."""
    overdue = tuple(r for r in live.queued if now - r.occurrence.scheduled_at > lateness)
    waiting = live.queued[len(overdue) :]
    return overdue, None if live.running or not waiting else waiting[0]
