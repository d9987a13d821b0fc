"""Occurrence maths and identity: the UTC instants at which a schedule fires, and what names
one occurrence on every replica (its key and its task id).

Pure functions of their arguments: no I/O, no clock reads, no Celery or SQLAlchemy. Every
replica therefore computes the same instants, keys and task ids for the same schedule
(guarantees 1 and 7 in docs/guarantees.md). Cron expressions are the business of
:mod:`voltro_beat.cron`; intervals, one-offs and solar events are computed here. What beat
records of an occurrence's run is in :mod:`voltro_beat.runs`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache

from voltro_beat import cron
from voltro_beat.cron import DAY, EPOCH, MICROSECOND, CronSpec
from voltro_beat.exceptions import NaiveDatetimeError
from voltro_beat.schedules import (
    SOLAR_EVENTS,
    SPEC_TYPES,
    ClockedSpec,
    CustomSpec,
    IntervalSpec,
    SolarSpec,
    Spec,
    cadence,
    check_name,
    to_spec,
)

#: How far :func:`latest_at_or_before` looks back.
_LOOK_BACK = timedelta(days=366)

# Like Celery's solar.max_search_days: a polar event absent for a whole year never comes.
_SOLAR_SEARCH_DAYS = 366

#: Fixed forever: task ids are uuid5(NAMESPACE, occurrence key) on every replica (guarantee 7).
NAMESPACE = uuid.UUID("5d3b9c1e-8f0a-5b6e-9a57-766f6c74726f")


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One occurrence of a schedule, as every replica names it: ``schedule`` at
    ``scheduled_at``, with the ``key`` and the ``task_id`` derived from them alone (see
    :meth:`of`).

    The task it runs is not part of it: that comes from the schedule's definition, which a
    rolling deploy may change while the occurrence stays the same (its run records the task,
    :class:`voltro_beat.runs.Run`).
    """

    schedule: str
    scheduled_at: datetime
    key: str
    task_id: str

    def __post_init__(self) -> None:
        if self.scheduled_at.utcoffset() is None:
            raise NaiveDatetimeError(f"{self.key}: scheduled_at must be an aware datetime")

    @classmethod
    def of(cls, schedule: str, scheduled_at: datetime) -> Occurrence:
        """The occurrence of ``schedule`` at ``scheduled_at``, with its key and task id."""
        key = occurrence_key(schedule, scheduled_at)
        return cls(schedule, scheduled_at, key, task_id_for(key))


def occurrence_key(name: str, scheduled_at: datetime) -> str:
    """Return ``name@YYYY-MM-DDTHH:MM:SS`` (UTC), plus ``.mmm`` for a sub-second instant."""
    check_name(name)
    _require_aware(scheduled_at, "scheduled_at")
    utc = scheduled_at.astimezone(UTC)
    if utc.microsecond:
        return f"{name}@{utc:%Y-%m-%dT%H:%M:%S}.{utc.microsecond // 1000:03d}"
    return f"{name}@{utc:%Y-%m-%dT%H:%M:%S}"


def task_id_for(key: str) -> str:
    """The task id of the occurrence ``key``: the same on every replica and every republish."""
    return str(uuid.uuid5(NAMESPACE, key))


def next_after(schedule: object, after: datetime, *, tz: str | None = None) -> datetime | None:
    """Return the first occurrence strictly after ``after``, in UTC.

    ``None`` when there is none: a one-off already past, a solar event that does not happen
    within a year, a cron job that only matches wall times that DST skips.

    ``schedule`` is a spec or any form :func:`voltro_beat.schedules.to_spec` accepts; ``tz``
    (the zone of a cron schedule given in another form, UTC if ``None``) is ignored for specs,
    which carry their own. ``after`` must be aware.
    """
    _require_aware(after, "after")
    return _next(_spec(schedule, tz), after)


def next_instants(spec: Spec, after: datetime, count: int) -> list[datetime]:
    """The first ``count`` occurrences strictly after ``after`` (fewer if the schedule ends)."""
    _require_aware(after, "after")
    found: list[datetime] = []
    while len(found) < count:
        at = _next(spec, found[-1] if found else after)
        if at is None:
            break
        found.append(at)
    return found


def occurrences_between(
    schedule: object, start: datetime, end: datetime, *, tz: str | None = None
) -> Iterator[datetime]:
    """Iterate over every occurrence in ``[start, end)``, in order, as UTC datetimes."""
    _require_aware(start, "start")
    _require_aware(end, "end")
    return _between(_spec(schedule, tz), start, end)


def latest_at_or_before(schedule: object, at: datetime) -> datetime | None:
    """The newest occurrence at or before ``at`` (``at`` snapped back to the schedule's grid);
    ``None`` if there is none within a year before it (or one cadence, if longer)."""
    _require_aware(at, "at")
    spec = _spec(schedule, None)
    # Look back one cadence at first, then twice as far each time: one step for intervals and
    # regular crons, a few for sparse ones.
    back = cadence(spec) or DAY
    while True:
        instants = list(_between(spec, at - back, at + MICROSECOND))
        if instants:
            return instants[-1]
        if back > _LOOK_BACK:
            return None
        back *= 2


def _require_aware(value: datetime, what: str) -> None:
    if value.utcoffset() is None:
        raise NaiveDatetimeError(f"{what} must be timezone-aware, got naive {value.isoformat()}")


def _spec(schedule: object, tz: str | None) -> Spec:
    return schedule if isinstance(schedule, SPEC_TYPES) else to_spec(schedule, tz=tz)


def _between(spec: Spec, start: datetime, end: datetime) -> Iterator[datetime]:
    # Instants are whole microseconds, so "strictly after start - 1 us" is "at or after start".
    current = _next(spec, start - MICROSECOND)
    while current is not None and current < end:
        yield current
        current = _next(spec, current)


def _next(spec: Spec, after: datetime) -> datetime | None:
    if isinstance(spec, CronSpec):
        return cron.next_instant(spec, after)
    if isinstance(spec, IntervalSpec):
        # Integer arithmetic on the anchored grid: the same instants whatever `after` is.
        elapsed = (after - EPOCH) // MICROSECOND - spec.anchor_us
        return EPOCH + MICROSECOND * (
            spec.anchor_us + (elapsed // spec.every_us + 1) * spec.every_us
        )
    if isinstance(spec, ClockedSpec):
        return spec.at if spec.at > after else None
    if isinstance(spec, CustomSpec):
        return spec.walk(after)
    return _solar_next(spec, after)


# --- solar ------------------------------------------------------------------------------


def _solar_next(spec: SolarSpec, after: datetime) -> datetime | None:
    # The event computed from one day's start may fall on the next day, so begin a day early;
    # one from two days before is always over by `after`'s day.
    day = after.astimezone(UTC).date() - DAY
    for _ in range(_SOLAR_SEARCH_DAYS):
        instant = _solar_event(spec, day)
        if instant is not None and instant > after:
            return instant
        day += DAY
    return None


@lru_cache(maxsize=4096)
def _solar_event(spec: SolarSpec, day: date) -> datetime | None:
    """The first event after ``day``'s UTC midnight, to the second; ``None`` if circumpolar.

    Computed from the canonical day start rather than from a previous run, so the instant
    does not wobble with when it is asked.
    """
    import ephem  # the optional `solar` extra; only solar schedules need it

    method, horizon, use_center = SOLAR_EVENTS[spec.event]
    start = ephem.Date(datetime(day.year, day.month, day.day))
    observer = ephem.Observer()  # configured as celery.schedules.solar configures its own
    observer.lat = str(spec.lat)
    observer.lon = str(spec.lon)
    observer.elev = 0
    observer.pressure = 0
    observer.horizon = horizon
    observer.date = start
    kwargs = {"use_center": True} if use_center else {}
    try:
        found = getattr(observer, method)(ephem.Sun(), start=start, **kwargs)
    except ephem.CircumpolarError:
        return None
    instant: datetime = found.datetime().replace(microsecond=0, tzinfo=UTC)
    return instant
