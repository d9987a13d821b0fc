"""Overlap policies: what happens to an occurrence while its schedule's previous run is live.

Pure: the scheduler reads the schedule's live runs from the store and records what these
functions decide through the gate, so replicas deciding at once still leave one row.

* ``allow`` (Celery's behaviour): publish regardless.
* ``skip``: while a previous run is claimed, published, started or retrying, record the new
  occurrence ``skipped`` (reason ``overlap``) and do not publish it.
* ``queue``: record it ``queued``; it is published, oldest first and one at a time, once no
  earlier run of the schedule is live (see :func:`next_to_promote`).

A live run older than the schedule's overlap timeout (counted from when it started, else was
published, else claimed) no longer blocks anything: it is reported as stale so that the
scheduler can say so in its row (reason ``overlap_timeout``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

#: Statuses of a run that is on its way or running.
RUNNING = frozenset({"claimed", "published", "started", "retrying"})
QUEUED = "queued"


@dataclass(frozen=True, slots=True)
class LiveRun:
    """A run row that is not finished: running (see :data:`RUNNING`) or ``queued``."""

    key: str
    schedule: str
    status: str
    scheduled_at: datetime
    #: When it started, else was published, else claimed (or queued).
    since: datetime


@dataclass(frozen=True, slots=True)
class View:
    """A schedule's live runs as one policy decision sees them."""

    running: tuple[LiveRun, ...]
    queued: tuple[LiveRun, ...]
    #: Running rows past the overlap timeout: they block nothing any more.
    stale: tuple[LiveRun, ...]


def view(runs: Iterable[LiveRun], *, now: datetime, timeout: timedelta) -> View:
    """Sort a schedule's live runs into running, queued and stale, oldest first."""
    running, queued, stale = [], [], []
    for run in sorted(runs, key=lambda r: r.scheduled_at):
        if run.status == QUEUED:
            queued.append(run)
        elif now - run.since > timeout:
            stale.append(run)
        else:
            running.append(run)
    return View(tuple(running), tuple(queued), tuple(stale))


def decide(policy: str, at: datetime, live: View) -> tuple[str, str | None]:
    """The first status of the occurrence at ``at``: ``claimed``, ``skipped`` or ``queued``."""
    if policy == "allow":
        return "claimed", None
    earlier_running = any(r.scheduled_at < at for r in live.running)
    if policy == "skip":
        return ("skipped", "overlap") if earlier_running else ("claimed", None)
    earlier_queued = any(r.scheduled_at < at for r in live.queued)
    return ("queued", None) if earlier_running or earlier_queued else ("claimed", None)


def with_claimed(live: View, run: LiveRun) -> View:
    """``live`` after ``run`` was claimed in the same tick (it blocks what follows)."""
    return View((*live.running, run), live.queued, live.stale)


def next_to_promote(live: View) -> LiveRun | None:
    """The queued run to publish now: the oldest, once nothing of the schedule is running."""
    if live.running or not live.queued:
        return None
    return live.queued[0]
