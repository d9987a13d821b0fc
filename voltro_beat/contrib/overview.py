"""The schedules overview: one line per schedule, its recent runs, and what comes next.

Each admin reads the rows its own way (Django's ORM, SQLAlchemy); this module turns them
into lines, and computes the next occurrences of the app's schedule the way beat does (its
``beat_schedule`` and Celery's own entries, voltro_beat's settings,
:func:`voltro_beat.occurrences.next_after`).
"""

from __future__ import annotations

import importlib
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from voltro_beat.beat_schedule import load_schedule
from voltro_beat.config import Settings
from voltro_beat.contrib.display import colour, lag, seconds_text
from voltro_beat.exceptions import VoltroBeatError
from voltro_beat.occurrences import next_instants
from voltro_beat.replicas import Replica
from voltro_beat.schedules import DEFAULT_GROUP
from voltro_beat.tally import Tally, tally

#: How many of each schedule's newest runs a line shows.
RECENT = 50
#: How many next occurrences a line shows.
UPCOMING = 3
#: Schedules per page (each one costs a query of its newest runs).
PAGE_SIZE = 50


class Recent(NamedTuple):
    """The columns of a run the overview reads, newest first."""

    key: str
    status: str
    reason: str | None
    scheduled_at: datetime
    published_at: datetime | None


@dataclass(frozen=True)
class Square:
    key: str
    status: str
    colour: str


@dataclass(frozen=True)
class Line:
    """One schedule in the overview."""

    schedule: str
    #: Its newest runs, oldest first (read left to right).
    squares: tuple[Square, ...]
    #: Those runs by outcome; its success rate is over the ones that executed.
    tally: Tally
    last_run: Recent | None
    #: Median publish lag of those runs, in seconds (None: none published).
    median_lag: float | None
    #: Its next occurrences (UTC), when the overview knows the app.
    upcoming: tuple[datetime, ...]

    @property
    def median_lag_text(self) -> str:
        return seconds_text(self.median_lag)


def line(schedule: str, recent: Sequence[Recent], upcoming: Sequence[datetime] = ()) -> Line:
    """The line of ``schedule`` from its newest runs (``recent``, newest first)."""
    lags = [x for r in recent if (x := lag(r.scheduled_at, r.published_at)) is not None]
    return Line(
        schedule=schedule,
        squares=tuple(Square(r.key, r.status, colour(r.status)) for r in reversed(recent)),
        tally=tally((r.status, r.reason, 1) for r in recent),
        last_run=recent[0] if recent else None,
        median_lag=statistics.median(lags) if lags else None,
        upcoming=tuple(upcoming),
    )


@dataclass(frozen=True)
class Page:
    """One page of the schedules, by name."""

    names: Sequence[str]
    number: int
    pages: int
    total: int


def page(names: Sequence[str], requested: str | None) -> Page:
    """Page ``requested`` (1-based; anything else is page 1, past the end the last) of
    ``names``, :data:`PAGE_SIZE` a page."""
    pages = max(1, -(-len(names) // PAGE_SIZE))
    try:
        number = min(max(int(requested or 1), 1), pages)
    except ValueError:
        number = 1
    start = (number - 1) * PAGE_SIZE
    return Page(names[start : start + PAGE_SIZE], number, pages, len(names))


def lines(
    schedules: Iterable[str],
    recent_of: Callable[[str], Sequence[Recent]],
    upcoming: Mapping[str, Sequence[datetime]],
) -> list[Line]:
    """A line for each of ``schedules`` (``recent_of(name)`` reads its newest runs)."""
    return [line(name, recent_of(name), upcoming.get(name, ())) for name in schedules]


@dataclass(frozen=True)
class Upcoming:
    """The next occurrences of each entry of the app's ``beat_schedule``, or why not."""

    by_schedule: Mapping[str, tuple[datetime, ...]]
    problem: str | None = None
    #: Group -> how many of the app's schedules it has.
    groups: Mapping[str, int] = field(default_factory=dict)

    def unserved(self, live: Iterable[Replica]) -> list[str]:
        """A warning for each group of the app's schedules no replica in ``live`` serves."""
        served = {str(r.settings.get("group", DEFAULT_GROUP)) for r in live}
        return [
            f"group {group}: {count} schedules and NO LIVE REPLICA: nothing fires them (while "
            "a replica of another group is live, it records their occurrences missed, reason "
            "no_replica, past their lateness)"
            for group, count in sorted(self.groups.items())
            if group not in served
        ]


def upcoming(app_path: str | None, *, now: datetime, count: int = UPCOMING) -> Upcoming:
    """The next ``count`` occurrences after ``now`` of each entry of the Celery app at
    ``app_path`` (``"proj.celery:app"``); nothing when ``app_path`` is None.

    A path that does not import or a configuration beat would refuse is reported in
    ``problem``, not raised: the rest of the page still renders.
    """
    if not app_path:
        return Upcoming({})
    try:
        app = _load(app_path)
        entries = load_schedule(app, Settings.resolve(app.conf)).entries.values()
    except (ImportError, AttributeError, ValueError, VoltroBeatError) as exc:
        return Upcoming({}, problem=f"cannot read the schedule of {app_path!r}: {exc}")
    found: dict[str, tuple[datetime, ...]] = {}
    groups: Counter[str] = Counter()
    for entry in entries:
        groups[entry.group] += 1
        found[entry.name] = tuple(next_instants(entry.spec, now, count))
    return Upcoming(found, groups=groups)


def _load(app_path: str) -> Any:
    module, _, attribute = app_path.partition(":")
    target: Any = importlib.import_module(module)
    for name in (attribute or "app").split("."):
        target = getattr(target, name)
    return target
