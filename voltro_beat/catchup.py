"""Catch-up after downtime: what to do, at boot, with occurrences no replica handled (and
which occurrence an external trigger's late arrival stands for).

Pure: the scheduler passes the newest occurrence the store remembers for a schedule and the
current instant (on the database clock), and records the runs :func:`plan` returns
(``claimed`` to publish, ``missed`` otherwise) through the gate, so every replica that boots at
once agrees row by row.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta

from voltro_beat.occurrences import Occurrence, latest_at_or_before, next_after
from voltro_beat.runs import Run
from voltro_beat.schedules import Entry, cadence
from voltro_beat.status import Reason, Status

#: At most this many occurrences of one schedule are recorded at boot (the newest ones).
MAX_BACKFILL = 1000


@dataclass(frozen=True, slots=True)
class Plan:
    """The runs to record for one schedule, oldest first.

    ``unrecorded_until``: when more than :data:`MAX_BACKFILL` occurrences fell in the window,
    the newest of those left out (all at or before it were too); ``None`` when none was.
    """

    runs: list[Run]
    unrecorded_until: datetime | None = None


def plan(
    entry: Entry,
    last: datetime | None,
    now: datetime,
    *,
    on_time: timedelta,
    live_since: datetime | None = None,
    live_until: datetime | None = None,
) -> Plan:
    """The runs of ``entry``'s occurrences after ``last`` up to ``now``, each with its fate.

    A schedule with no history (``last`` is None) starts from now: nothing historical fires
    on a first boot. Only occurrences within ``entry.max_lateness`` of ``now`` are considered
    (older ones could never be published, and a fast schedule could have millions of them),
    and of those the newest :data:`MAX_BACKFILL`.

    Catch-up is for downtime: an occurrence less than ``on_time`` old (the publish lease) may
    be one a live replica is about to claim (an overlap schedule is claimed at its instant, a
    loaded replica claims late), so it is published whatever the policy, as that replica
    would, and the claims gate lets only one of them have it. Of the older ones, ``latest``
    publishes the newest when none is on time and records the others ``missed``; ``skip``
    records them all ``missed``; ``all`` publishes each one. And an occurrence at or after
    ``live_since`` (when the longest-running live replica that runs the schedule started:
    another one, or in cluster coordination the one taking the schedule's shard over) fell
    while that replica ran it, held up but not down: it is published within its
    lateness, late as that replica would publish it after a stall; the policy is for the
    occurrences before, when no replica ran the schedule. So is an occurrence at or before
    ``live_until`` (in cluster coordination, when the live replica that owned the schedule's
    shard released it to the one taking it over).
    """
    if last is None:
        return Plan([])
    after = max(last, now - entry.max_lateness - timedelta(microseconds=1))
    instants, unrecorded_until = newest(entry, after, now, MAX_BACKFILL)
    down = [
        at
        for at in instants
        if (live_since is None or at < live_since) and (live_until is None or at > live_until)
    ]
    recent = sum(1 for at in down if at > now - on_time)
    sent = {"all": len(down), "latest": max(1, recent), "skip": recent}[entry.catch_up]
    # The oldest of the downtime's occurrences, all but the newest ``sent`` of them.
    missed = set(down[: max(0, len(down) - sent)])
    lateness = entry.max_lateness
    return Plan(
        [
            Run(Occurrence.of(entry.name, at), entry.task, Status.MISSED, Reason.CATCH_UP)
            if at in missed
            else Run(Occurrence.of(entry.name, at), entry.task, deadline=at + lateness)
            for at in instants
        ],
        unrecorded_until,
    )


def last_due(entry: Entry, at: datetime, *, early: timedelta) -> datetime | None:
    """The occurrence an external trigger arriving at ``at`` stands for: the newest one at or
    before ``at``, if it is at most ``entry.max_lateness`` before it; else ``None``.

    An arrival at most ``early`` before an occurrence, and nearer to it than to the one before
    (the platform's clock a little ahead of the database's), stands for that occurrence: the
    trigger waits for its instant.
    """
    instant = latest_at_or_before(entry.spec, at)
    upcoming = next_after(entry.spec, at)
    if (
        upcoming is not None
        and upcoming - at <= early
        and (instant is None or upcoming - at < at - instant)
    ):
        return upcoming
    return instant if instant is not None and at - instant <= entry.max_lateness else None


def newest(
    entry: Entry, after: datetime, until: datetime, limit: int
) -> tuple[list[datetime], datetime | None]:
    """The newest ``limit`` instants of ``entry`` in ``(after, until]``, oldest first, and the
    newest instant of that window left out (None if none was).

    The schedule's own instants are walked, never estimated: the walk starts ``limit + 1``
    typical gaps before ``until`` and, while it finds no more than ``limit`` instants and has
    not reached ``after``, starts four times further back. An irregular schedule (``0-4 9 * * *``,
    whose typical gap is a minute) is therefore walked back to ``after`` if need be, and a
    one-second schedule down for a day costs a walk of about ``limit`` instants.
    """
    span = (cadence(entry.spec) or until - after) * (limit + 1)
    while True:
        start = max(after, until - span)
        found: deque[datetime] = deque(maxlen=limit + 1)
        at = next_after(entry.spec, start)
        while at is not None and at <= until:
            found.append(at)
            at = next_after(entry.spec, at)
        if len(found) > limit:
            return list(found)[1:], found[0]
        if start == after:
            return list(found), None
        span *= 4
