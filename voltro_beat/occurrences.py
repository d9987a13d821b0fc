"""Occurrence maths: the UTC instants at which a schedule fires, and each occurrence's key.

Pure functions of their arguments: no I/O, no clock reads, no Celery or SQLAlchemy. Every
replica therefore computes the same instants, and the same keys, for the same schedule.

Cron expressions are evaluated on naive wall-clock times in the spec's zone, as croniter's
``get_next`` evaluates them: plain ones from croniter's expanded fields
(:meth:`voltro_beat.schedules.CronFields.following`, far cheaper than croniter's own search),
the rest by croniter itself. This module maps each wall time to real instants with Debian
cron's DST rule:

* a wall time that does not exist (spring-forward gap): a fixed-time job runs once, at the
  first instant after the gap; a wildcard job (minute or hour field starting with ``*``)
  skips it;
* a wall time that occurs twice (fall-back): a fixed-time job runs once, on the first pass;
  a wildcard job runs on both passes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from croniter import croniter

from voltro_beat.exceptions import VoltroBeatError
from voltro_beat.schedules import (
    CRON_REFERENCE,
    SOLAR_EVENTS,
    SPEC_TYPES,
    ClockedSpec,
    CronFields,
    CronSpec,
    IntervalSpec,
    SolarSpec,
    Spec,
    check_name,
    cron_fields,
    to_spec,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_SECOND = timedelta(seconds=1)
_DAY = timedelta(days=1)
# Like Celery's solar.max_search_days: a polar event absent for a whole year never comes.
_SOLAR_SEARCH_DAYS = 366
# Bounds the per-thread cron state (see _CronState) for processes that build schedules
# dynamically; an app has a few hundred distinct cron specs even with 100,000 entries.
_CRON_CACHE_SIZE = 65536
# croniter's own search horizon. Walking past DST gaps needs one too: a wildcard job whose
# every match is skipped (02:xx on the last Sunday of March, in Berlin) never fires.
_CRON_HORIZON = timedelta(days=50 * 366)


class NaiveDatetimeError(VoltroBeatError, ValueError):
    """A naive datetime was given where an aware instant is required."""


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


def occurrences_between(
    schedule: object, start: datetime, end: datetime, *, tz: str | None = None
) -> Iterator[datetime]:
    """Iterate over every occurrence in ``[start, end)``, in order, as UTC datetimes."""
    _require_aware(start, "start")
    _require_aware(end, "end")
    return _between(_spec(schedule, tz), start, end)


def occurrence_key(name: str, scheduled_at: datetime) -> str:
    """Return ``name@YYYY-MM-DDTHH:MM:SS`` (UTC), plus ``.mmm`` for a sub-second instant."""
    check_name(name)
    _require_aware(scheduled_at, "scheduled_at")
    utc = scheduled_at.astimezone(UTC)
    if utc.microsecond:
        return f"{name}@{utc:%Y-%m-%dT%H:%M:%S}.{utc.microsecond // 1000:03d}"
    return f"{name}@{utc:%Y-%m-%dT%H:%M:%S}"


def _require_aware(value: datetime, what: str) -> None:
    if value.utcoffset() is None:
        raise NaiveDatetimeError(f"{what} must be timezone-aware, got naive {value.isoformat()}")


def _spec(schedule: object, tz: str | None) -> Spec:
    return schedule if isinstance(schedule, SPEC_TYPES) else to_spec(schedule, tz=tz)


def _between(spec: Spec, start: datetime, end: datetime) -> Iterator[datetime]:
    # Instants are whole microseconds, so "strictly after start - 1 us" is "at or after start".
    current = _next(spec, start - _US)
    while current is not None and current < end:
        yield current
        current = _next(spec, current)


def _next(spec: Spec, after: datetime) -> datetime | None:
    if isinstance(spec, CronSpec):
        return _cron_next(spec, after)
    if isinstance(spec, IntervalSpec):
        # Integer arithmetic on the anchored grid: the same instants whatever `after` is.
        elapsed = (after - _EPOCH) // _US - spec.anchor_us
        return _EPOCH + _US * (spec.anchor_us + (elapsed // spec.every_us + 1) * spec.every_us)
    if isinstance(spec, ClockedSpec):
        return spec.at if spec.at > after else None
    return _solar_next(spec, after)


# --- cron -------------------------------------------------------------------------------


class _CronState:
    """What one thread keeps per cron spec.

    The last question and its answer: every entry sharing a spec asks the same question at
    the same instant (100,000 entries on one crontab cost one search per minute). The croniter
    object for expressions that are not plain, built on first use; it keeps its position in
    mutable state, hence one per thread.
    """

    __slots__ = ("after", "croniter", "fields", "result", "spec", "zone")

    def __init__(self, spec: CronSpec) -> None:
        self.spec = spec
        self.zone = ZoneInfo(spec.tz)
        self.fields: CronFields | None = cron_fields(spec)
        self.croniter: croniter | None = None
        self.after: datetime | None = None  # in UTC: equal only for the same instant
        self.result: datetime | None = None

    def step(self, wall: datetime) -> datetime:
        """The first matching wall time after the naive ``wall``: croniter's ``get_next``."""
        if self.fields is not None:
            found = self.fields.following(wall)
            if found is not None:
                return found
        it = self.croniter
        if it is None:
            spec = self.spec
            it = self.croniter = croniter(
                spec.expr,
                CRON_REFERENCE,
                day_or=spec.day_or,
                second_at_beginning=spec.second_at_beginning,
            )
        following: datetime = it.get_next(datetime, start_time=wall)
        return following


class _CronCache(threading.local):
    """Per thread: the state of each cron spec (see :class:`_CronState`)."""

    def __init__(self) -> None:
        self.iters: dict[CronSpec, _CronState] = {}


_cron_cache = _CronCache()


def _cron_state(spec: CronSpec) -> _CronState:
    states = _cron_cache.iters
    state = states.get(spec)
    if state is None:
        if len(states) >= _CRON_CACHE_SIZE:
            states.clear()
        state = states[spec] = _CronState(spec)
    return state


def _cron_next(spec: CronSpec, after: datetime) -> datetime | None:
    state = _cron_state(spec)
    # Keyed by the UTC instant: aware datetimes in one zone compare by wall time, so two
    # passes of a repeated hour would look equal.
    key = after if after.tzinfo is UTC else after.astimezone(UTC)
    if key == state.after:
        return state.result
    result = _cron_search(spec, state, after)
    state.after, state.result = key, result
    return result


def _cron_search(spec: CronSpec, state: _CronState, after: datetime) -> datetime | None:
    zone = state.zone
    step = state.step
    local = after.astimezone(zone)
    # croniter gets whole seconds (it converts through float timestamps); every cron match is
    # a whole second, so "after the floor" equals "after the instant".
    wall = local.replace(tzinfo=None, microsecond=0)
    other_pass = local.replace(fold=1 - local.fold)
    if local.utcoffset() == other_pass.utcoffset():
        # The common case: `after` is not inside a repeated (fall-back) hour.
        return _first_primary(spec, step, zone, wall, after)
    return _cron_next_in_repeat(spec, step, zone, local, other_pass, wall, after)


_WallStep = Callable[[datetime], datetime]


def _cron_next_in_repeat(
    spec: CronSpec,
    step: _WallStep,
    zone: ZoneInfo,
    local: datetime,
    other_pass: datetime,
    wall: datetime,
    after: datetime,
) -> datetime | None:
    """Next occurrence when ``after`` lies in one of the two passes of a repeated hour."""
    first_pass, second_pass = (local, other_pass) if local.fold == 0 else (other_pass, local)
    change = _transition(zone, first_pass.astimezone(UTC), second_pass.astimezone(UTC))
    late_offset = second_pass.utcoffset()
    early_offset = first_pass.utcoffset()
    assert late_offset is not None and early_offset is not None
    # Wall times in [repeat_start, repeat_end) happen twice: before and after `change`.
    repeat_start = (change + late_offset).replace(tzinfo=None)
    repeat_end = (change + early_offset).replace(tzinfo=None)
    if local.fold == 0:
        result = _first_primary(spec, step, zone, wall, after)
        second_from = repeat_start - _SECOND  # the whole second pass is still ahead
    else:
        # First-pass instants of the repeated wall times are all behind us: resume after them.
        result = _first_primary(spec, step, zone, repeat_end - _SECOND, after)
        second_from = wall
    if spec.wildcard:
        repeat = step(second_from)
        if repeat < repeat_end:
            second = (repeat - late_offset).replace(tzinfo=UTC)
            result = second if result is None else min(result, second)
    return result


def _first_primary(
    spec: CronSpec, step: _WallStep, zone: ZoneInfo, wall: datetime, after: datetime
) -> datetime | None:
    """First primary instant (see :func:`_primary`) after ``after``, walking from ``wall``.

    Primary instants never decrease as wall time advances, so the first one past ``after`` is
    the smallest.
    """
    limit = wall + _CRON_HORIZON
    while wall < limit:
        wall = step(wall)
        instant = _primary(spec, zone, wall)
        if instant is not None and instant > after:
            return instant
    return None


def _primary(spec: CronSpec, zone: ZoneInfo, wall: datetime) -> datetime | None:
    """The instant a matching wall time stands for, before second passes are added.

    Normal: its one instant. Repeated: its first pass. Skipped by spring-forward: the end of
    the gap for a fixed-time job, nothing for a wildcard job.
    """
    aware = wall.replace(tzinfo=zone)
    early = aware.utcoffset()
    late = aware.replace(fold=1).utcoffset()
    assert early is not None and late is not None
    if early >= late:  # equal: an ordinary wall time; greater: the first of two passes
        return (wall - early).replace(tzinfo=UTC)
    if spec.wildcard:
        return None
    # In a gap fold=0 reads the wall time with the offset before the change, fold=1 after it,
    # so the change lies between the two readings.
    return _transition(zone, (wall - late).replace(tzinfo=UTC), (wall - early).replace(tzinfo=UTC))


def _transition(zone: ZoneInfo, before: datetime, after: datetime) -> datetime:
    """First instant in ``(before, after]`` with ``after``'s UTC offset (a whole second)."""
    offset = after.astimezone(zone).utcoffset()
    # Whole-second bounds, so the bisection lands exactly on the change.
    low = before.replace(microsecond=0)
    high = after if not after.microsecond else after.replace(microsecond=0) + _SECOND
    while high - low > _SECOND:
        middle = low + (high - low) // _SECOND // 2 * _SECOND
        if middle.astimezone(zone).utcoffset() == offset:
            high = middle
        else:
            low = middle
    return high


# --- solar ------------------------------------------------------------------------------


def _solar_next(spec: SolarSpec, after: datetime) -> datetime | None:
    # The event computed from one day's start may fall on the next day, so begin a day early;
    # one from two days before is always over by `after`'s day.
    day = after.astimezone(UTC).date() - _DAY
    for _ in range(_SOLAR_SEARCH_DAYS):
        instant = _solar_event(spec, day)
        if instant is not None and instant > after:
            return instant
        day += _DAY
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
