"""How both admins show a run (status colours, lags and durations, the capped row count, late
or stuck) and a replica (live or gone, its clock offset)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from voltro_beat.coordination import Outcome
from voltro_beat.status import ON_WORKER, UNFINISHED, Status

#: A list page counts at most this many rows: counting a table of millions on every page load
#: would read all of it. Past the cap the page says "10,000+" and offers the pages up to it.
COUNT_CAP = 10_000

#: Every value of ``coordination_outcome`` (the outcome filter's choices).
OUTCOMES = tuple(Outcome)

_GREEN, _RED, _AMBER, _GREY, _BLUE = "#2e7d32", "#c62828", "#e65100", "#757575", "#1565c0"

#: The colour of each status: green succeeded, red failed (or revoked, rejected), amber missed,
#: grey skipped, blue not finished yet (claimed, published, running, retrying, queued).
COLOURS: Mapping[Status, str] = {
    **dict.fromkeys(UNFINISHED, _BLUE),
    Status.SUCCEEDED: _GREEN,
    Status.FAILED: _RED,
    Status.REVOKED: _RED,
    Status.REJECTED: _RED,
    Status.MISSED: _AMBER,
    Status.SKIPPED: _GREY,
}

#: The legend of those colours, in the order the overview shows it.
LEGEND = (
    ("succeeded", _GREEN),
    ("failed", _RED),
    ("missed", _AMBER),
    ("skipped", _GREY),
    ("running", _BLUE),
)


#: A run started this long ago and not finished is marked stuck, unless told otherwise
#: (``VOLTRO_BEAT_ADMIN_STUCK_AFTER``, seconds).
STUCK_AFTER = timedelta(hours=1)
#: The markers of a run that should have moved on, and their colour.
LATE, STUCK = "late", "stuck"
MARKER_COLOUR = _AMBER


def delay(
    status: str,
    *,
    published_at: datetime | None,
    lease_until: datetime | None,
    started_at: datetime | None,
    now: datetime,
    stuck_after: timedelta = STUCK_AFTER,
) -> str | None:
    """:data:`LATE` for a run claimed and not published past its lease, :data:`STUCK` for
    one on a worker (started or retrying) and not finished ``stuck_after`` since it started;
    None for any other. ``now`` is the database's clock, which the lease is on."""
    if status == Status.CLAIMED and published_at is None and lease_until is not None:
        return LATE if lease_until < now else None
    if status in ON_WORKER and started_at is not None:
        return STUCK if started_at < now - stuck_after else None
    return None


def delay_of(run: Any, stuck_after: timedelta) -> str | None:
    """:func:`delay` of a run row as both admins read it: its columns, and ``database_now``
    (the database's clock, read with the row)."""
    return delay(
        run.status,
        published_at=run.published_at,
        lease_until=run.lease_until,
        started_at=run.started_at,
        now=run.database_now,
        stuck_after=stuck_after,
    )


def colour(status: str) -> str:
    """The colour of ``status`` (grey for a value this version does not know)."""
    try:
        return COLOURS[Status(status)]
    except ValueError:
        return _GREY


class AtLeast(int):
    """A row count that reached :data:`COUNT_CAP`: compares as the number counted, shows as
    "10,000+" wherever a template prints it (the admins print counts in several places)."""

    def __str__(self) -> str:
        return f"{COUNT_CAP:,}+"


def capped(counted: int) -> int:
    """``counted`` (of a query limited to ``COUNT_CAP + 1`` rows) as the count a page shows."""
    return AtLeast(counted) if counted > COUNT_CAP else counted


def lag(scheduled_at: datetime, at: datetime | None) -> float | None:
    """Seconds from ``scheduled_at`` to ``at`` (the publish lag when ``at`` is published_at)."""
    return None if at is None else (at - scheduled_at).total_seconds()


def instant_text(at: datetime | None) -> str:
    """``at`` to the millisecond (runs a second apart must read apart); ``-`` for none."""
    return "-" if at is None else f"{at:%Y-%m-%d %H:%M:%S.%f}"[:-3]


def seconds_text(seconds: float | None) -> str:
    """``0.0123`` as ``12 ms``, ``4.5`` as ``4.50 s``, ``125`` as ``2 min 5 s``; ``-`` for none."""
    if seconds is None:
        return "-"
    if abs(seconds) < 1:
        return f"{seconds * 1000:.0f} ms"
    if abs(seconds) < 60:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def revision_text(revision: int | None) -> str:
    """Which definition fired a run: a revision of the schedules table, or the app's own."""
    return "the app's beat_schedule" if revision is None else f"{revision} (schedules table)"


def liveness(live: bool) -> tuple[str, str]:
    """A replica's state as its badge shows it: the word and its colour."""
    return ("live", _GREEN) if live else ("gone", _GREY)


def ownership(owner: str | None, lease_until: datetime | None, now: datetime) -> tuple[str, str]:
    """A shard's state as its badge shows it: owned while its owner's lease runs on the
    database's clock, else not owned (its schedules wait for a replica to take it)."""
    held = owner is not None and lease_until is not None and lease_until > now
    return ("owned", _GREEN) if held else ("not owned", _RED)


#: A singleton's state and its badge's colour.
SINGLETON_COLOURS = {"running": _GREEN, "returned": _BLUE, "failed": _RED, "stopped": _GREY}


def offset_text(offset: float | None) -> str:
    """A replica's clock offset (its clock minus the database's) in signed seconds."""
    return "-" if offset is None else f"{offset:+.3f} s"


def json_text(text: str) -> str:
    """A JSON column (a replica's settings or schedule map) indented, keys sorted."""
    return json.dumps(json.loads(text), indent=2, sort_keys=True)
