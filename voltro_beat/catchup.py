"""Catch-up after downtime: what to do, at boot, with occurrences no replica handled.

Pure: the scheduler passes the newest occurrence the store remembers for a schedule and the
current instant, and records the occurrences :func:`plan` returns (``claimed`` to publish,
``missed`` otherwise) through the gate, so every replica that boots at once agrees row by row.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from voltro_beat.occurrences import Occurrence, next_after
from voltro_beat.schedules import Entry, cadence
from voltro_beat.status import Reason, Status

#: At most this many occurrences of one schedule are recorded at boot (the newest ones).
MAX_BACKFILL = 1000


def plan(entry: Entry, last: datetime | None, now: datetime) -> list[Occurrence]:
    """The occurrences of ``entry`` after ``last`` up to ``now``, each with its fate.

    A schedule with no history (``last`` is None) starts from now: nothing historical fires
    on a first boot. Only occurrences within ``entry.max_lateness`` of ``now`` are considered
    (older ones could never be published, and a fast schedule could have millions of them).
    ``latest`` publishes the newest and records the others ``missed``; ``skip`` records all
    ``missed``; ``all`` publishes each one.
    """
    if last is None:
        return []
    start = max(last, now - entry.max_lateness - timedelta(microseconds=1))
    step = cadence(entry.spec)
    if step is not None:
        # Walk only as far back as the rows we keep: a one-second schedule down for a day
        # has 86,400 candidates.
        start = max(start, now - step * (MAX_BACKFILL + 1))
    instants: list[datetime] = []
    at = next_after(entry.spec, start)
    while at is not None and at <= now:
        instants.append(at)
        at = next_after(entry.spec, at)
    instants = instants[-MAX_BACKFILL:]
    published = {"all": len(instants), "latest": 1, "skip": 0}[entry.catch_up]
    cut = max(0, len(instants) - published)
    return [
        Occurrence.of(entry.name, entry.task, at, Status.MISSED, Reason.CATCH_UP)
        for at in instants[:cut]
    ] + [Occurrence.of(entry.name, entry.task, at) for at in instants[cut:]]
