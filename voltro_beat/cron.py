"""The cron engine: an expression validated once, and the real instants it stands for.

croniter is the parser (and the reference the tests hold this module to). It runs on naive
wall-clock times; :func:`next_instant` walks those wall times in the spec's zone and maps each
to real instants with Debian cron's DST rule:

* a wall time that does not exist (spring-forward gap): a fixed-time job runs once, at the
  first instant after the gap; a wildcard job (minute or hour field starting with ``*``)
  skips it;
* a wall time that occurs twice (fall-back): a fixed-time job runs once, on the first pass;
  a wildcard job runs on both passes.

Plain expressions (every field a set of numbers) are searched from croniter's expanded
fields (:class:`CronFields`), far cheaper than croniter's own date arithmetic; the rest by
croniter itself. Pure: no clock, no I/O, no Celery. The time constants shared by the
occurrence maths live here too.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from types import MappingProxyType
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)
SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)
DAY = timedelta(days=1)

#: Fixed wall-clock reference for validation and cadence, so neither depends on the clock.
REFERENCE = datetime(2001, 1, 1)

MACROS: Mapping[str, str] = MappingProxyType(
    {
        "@yearly": "0 0 1 1 *",
        "@annually": "0 0 1 1 *",
        "@monthly": "0 0 1 * *",
        "@weekly": "0 0 * * 0",
        "@daily": "0 0 * * *",
        "@midnight": "0 0 * * *",
        "@hourly": "0 * * * *",
    }
)

# Bounds the per-expression caches. An app has a few hundred distinct expressions even with
# 100,000 entries; the bound only matters to a process that builds schedules dynamically.
_CACHE_SIZE = 65536
# Days (or skipped months) CronFields.following looks at before it leaves the question to
# croniter. A 29th of February that is also a Monday comes 40 years apart at worst: a few
# thousand steps.
_PLAIN_SEARCH_STEPS = 20_000
_CRONITER_YEARS = 50  # croniter's horizon (max_years_between_matches)
# Walking past DST gaps needs a horizon too: a wildcard job whose every match is skipped
# (02:xx on the last Sunday of March, in Berlin) never fires.
_HORIZON = timedelta(days=50 * 366)


@dataclass(frozen=True, slots=True)
class CronSpec:
    """A cron expression evaluated on the wall clock of zone ``tz``.

    ``day_or``: standard cron day matching (day-of-month OR day-of-week when both are
    restricted); ``False`` for Celery crontab's AND. ``second_at_beginning``: a sixth field,
    seconds, comes first. ``wildcard``: the minute or hour field starts with ``*`` (Debian
    cron's MIN_STAR|HR_STAR), so the job runs at every real instant across DST changes.
    """

    expr: str
    tz: str
    day_or: bool
    second_at_beginning: bool
    wildcard: bool


@dataclass(frozen=True, slots=True)
class CronFields:
    """croniter's expansion of a plain cron expression, as sorted values per field.

    Plain: every field a set of numbers (no ``L``, ``W`` or ``#``). ``days``, ``months`` and
    ``weekdays`` are ``None`` when unrestricted (croniter's ``*``); weekdays count from
    Sunday = 0. ``seconds`` is ``(0,)`` for a five-field expression. ``day_or``: a day
    matches when either of ``days`` and ``weekdays`` does (both restricted, OR matching);
    otherwise both must.
    """

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int] | None
    months: frozenset[int] | None
    weekdays: frozenset[int] | None
    day_or: bool

    def following(self, wall: datetime) -> datetime | None:
        """croniter's next match after the naive wall time ``wall``, or ``None``.

        The search croniter makes (the first wall time from the next whole minute, or the
        next whole second with a seconds field, at which every field matches), without its
        date arithmetic per field. ``None`` past the search bound, past croniter's horizon or
        at the end of the calendar: croniter's own ``get_next`` decides those.
        """
        try:
            if self.seconds == (0,):  # five fields (or seconds always 0): from the next minute
                start = wall.replace(second=0, microsecond=0) + MINUTE
            else:
                start = wall.replace(microsecond=0) + SECOND
            found = self._search(start)
        except (OverflowError, ValueError):
            return None
        if found is None or found.year - start.year > _CRONITER_YEARS:
            return None
        return found

    def _search(self, start: datetime) -> datetime | None:
        months, days, weekdays, day_or = self.months, self.days, self.weekdays, self.day_or
        first = time(self.hours[0], self.minutes[0], self.seconds[0])
        day = start.date()
        at = self._time_from(start.hour, start.minute, start.second)
        for _ in range(_PLAIN_SEARCH_STEPS):
            if months is not None and day.month not in months:
                day = (
                    date(day.year + 1, 1, 1)
                    if day.month == 12
                    else date(day.year, day.month + 1, 1)
                )
                at = first
                continue
            if at is not None:
                day_ok = days is None or day.day in days
                weekday_ok = weekdays is None or day.isoweekday() % 7 in weekdays
                if (day_ok or weekday_ok) if day_or else (day_ok and weekday_ok):
                    return datetime.combine(day, at)
            day += DAY
            at = first
        return None

    def _time_from(self, hour: int, minute: int, second: int) -> time | None:
        """The first matching time of day at or after ``hour:minute:second``, if any."""
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        h = bisect_left(hours, hour)
        if h < len(hours) and hours[h] == hour:
            m = bisect_left(minutes, minute)
            if m < len(minutes) and minutes[m] == minute:
                s = bisect_left(seconds, second)
                if s < len(seconds):
                    return time(hour, minute, seconds[s])
                m += 1
            if m < len(minutes):
                return time(hour, minutes[m], seconds[0])
            h += 1
        if h < len(hours):
            return time(hours[h], minutes[0], seconds[0])
        return None


# --- parsing and validation, once per expression ------------------------------------------


@lru_cache(maxsize=_CACHE_SIZE)
def parse_text(text: str) -> tuple[str, bool, bool] | str:
    """``(expr, second_at_beginning, wildcard)`` for a cron string, or why it is refused."""
    fields = text.split()
    if len(fields) == 1 and fields[0].startswith("@"):
        macro = MACROS.get(fields[0].lower())
        if macro is None:
            return f"unknown cron macro {fields[0]!r}; known: {', '.join(MACROS)}"
        fields = macro.split()
    if len(fields) not in (5, 6):
        return (
            f"cron expression {text!r} has {len(fields)} fields; expected 5 "
            "(minute hour day-of-month month day-of-week) or 6 with seconds first"
        )
    if any(part.lower().startswith(("r", "h")) for field in fields for part in field.split(",")):
        # croniter's R (random) and H (hashed) fields differ between replicas.
        return (
            f"cron expression {text!r} uses R or H fields, which are not the same on every replica"
        )
    seconds_first = len(fields) == 6
    for (field, lo, hi), value in zip(_FIELDS[not seconds_first :], fields, strict=True):
        error = _field_error(field, value, lo, hi)
        if error is not None:
            return f"cron expression {text!r}: {error}"
    minute, hour = fields[1:3] if seconds_first else fields[0:2]
    return " ".join(fields), seconds_first, minute.startswith("*") or hour.startswith("*")


#: The fields of a six-field expression (a five-field one has no seconds) and their ranges;
#: day-of-week 7 is Sunday again, as in croniter.
_FIELDS = (
    ("second", 0, 59),
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
)


def _field_error(field: str, text: str, lo: int, hi: int) -> str | None:
    """Why one field's numbers are out of its range, naming the field (croniter accepts some
    such fields silently, ``*/61``, and refuses others without naming the field)."""
    # A step larger than the field's span matches only its first value: ``*/61`` in the
    # minute field is minute 0, never "every 61 minutes".
    span = (6 if field == "day-of-week" else hi) - lo
    for part in text.split(","):
        base, slash, step = part.partition("/")
        if slash and step.isdigit() and not 1 <= int(step) <= span:
            return f"{field} step {step} in {part!r} is out of range (1-{span})"
        for number in base.split("-"):
            # Names (jan, mon), L, W, # and ? are croniter's to check.
            if number.isdigit() and not lo <= int(number) <= hi:
                return f"{field} {number} in {part!r} is out of range ({lo}-{hi})"
    return None


def checked(
    expr: str, tz: str, day_or: bool, second_at_beginning: bool, wildcard: bool
) -> CronSpec | str:
    """The spec of a valid expression (one shared object per definition), or why not."""
    facts = _facts(expr, day_or, second_at_beginning)
    if isinstance(facts, str):
        return facts
    return _interned(expr, tz, day_or, second_at_beginning, wildcard)


@lru_cache(maxsize=_CACHE_SIZE)
def _interned(
    expr: str, tz: str, day_or: bool, second_at_beginning: bool, wildcard: bool
) -> CronSpec:
    # One spec object for equal definitions: 100,000 entries over a few expressions share a
    # few specs (memory), and lookups keyed by spec mostly find the very same object.
    return CronSpec(expr, tz, day_or, second_at_beginning, wildcard)


def cadence(spec: CronSpec) -> timedelta:
    """The gap between the first two occurrences after :data:`REFERENCE`, on the wall clock.

    Exact for regular expressions, a fair estimate for irregular ones.
    """
    facts = _facts(spec.expr, spec.day_or, spec.second_at_beginning)
    if isinstance(facts, _Facts) and facts.cadence is not None:
        return facts.cadence
    # Not a validated expression (a spec built by hand): croniter raises as it would.
    it = _croniter(spec)
    first: datetime = it.get_next(datetime, start_time=REFERENCE)
    second: datetime = it.get_next(datetime, start_time=first)
    return second - first


def fields_of(spec: CronSpec) -> CronFields | None:
    """croniter's expansion of ``spec``'s expression, if it is plain (cached per expression).

    ``None`` when only croniter's own search applies: ``L``, ``W`` or ``#`` fields, or an
    expression croniter refuses.
    """
    facts = _facts(spec.expr, spec.day_or, spec.second_at_beginning)
    return facts.fields if isinstance(facts, _Facts) else None


@dataclass(frozen=True, slots=True)
class _Facts:
    """What croniter's parse of one expression tells: its cadence and plain fields."""

    cadence: timedelta | None  # None: croniter found no second occurrence
    fields: CronFields | None  # None: not plain


@lru_cache(maxsize=_CACHE_SIZE)
def _facts(expr: str, day_or: bool, second_at_beginning: bool) -> _Facts | str:
    """Validate an expression with croniter, once per expression; a string says why not.

    The zone plays no part: croniter runs on naive wall-clock time here.
    """
    try:
        it = croniter(expr, REFERENCE, day_or=day_or, second_at_beginning=second_at_beginning)
        fields = plain_fields(it, day_or)
        first = _wall_next(it, fields, REFERENCE)
    except CroniterBadDateError:
        return f"cron expression {expr!r} never fires"
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        # croniter signals bad syntax with CroniterBadCronError (a ValueError) and, for some
        # inputs, with bare lookup errors.
        return f"unparsable cron expression {expr!r}: {exc}"
    try:
        step: timedelta | None = _wall_next(it, fields, first) - first
    except (ValueError, TypeError, KeyError, IndexError):
        step = None  # cadence() asks croniter again, and raises as croniter does
    return _Facts(step, fields)


def _wall_next(it: croniter, fields: CronFields | None, wall: datetime) -> datetime:
    found = None if fields is None else fields.following(wall)
    if found is None:
        found = it.get_next(datetime, start_time=wall)
    return found


def plain_fields(it: croniter, day_or: bool) -> CronFields | None:
    """The fields of croniter's parse ``it`` as :class:`CronFields`, or None if not plain."""
    if it.nth_weekday_of_month or it.nearest_weekday or len(it.expanded) not in (5, 6):
        return None
    fields: list[tuple[int, ...] | None] = []
    for values, (low, high) in zip(it.expanded, _FIELD_RANGES, strict=False):
        if list(values) == ["*"]:
            fields.append(None)
        elif values and all(type(v) is int and low <= v <= high for v in values):
            fields.append(tuple(sorted(values)))
        else:
            return None  # "l" and the like: croniter's own search
    minutes, hours, days, months, weekdays = fields[:5]
    seconds = fields[5] if len(fields) == 6 else _ZERO
    return CronFields(
        seconds=_SIXTY if seconds is None else seconds,
        minutes=_SIXTY if minutes is None else minutes,
        hours=_TWENTY_FOUR if hours is None else hours,
        days=None if days is None else frozenset(days),
        months=None if months is None else frozenset(months),
        weekdays=None if weekdays is None else frozenset(weekdays),
        day_or=day_or and days is not None and weekdays is not None,
    )


# Shared by every expression's fields: "*" and a five-field expression's second.
_SIXTY = tuple(range(60))
_TWENTY_FOUR = tuple(range(24))
_ZERO = (0,)
# croniter's field order (seconds last): minute, hour, day, month, weekday, second.
_FIELD_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6), (0, 59))


def _croniter(spec: CronSpec) -> croniter:
    return croniter(
        spec.expr, REFERENCE, day_or=spec.day_or, second_at_beginning=spec.second_at_beginning
    )


# --- the search: wall times to real instants --------------------------------------------


class _State:
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
        self.fields: CronFields | None = fields_of(spec)
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
            it = self.croniter = _croniter(self.spec)
        following: datetime = it.get_next(datetime, start_time=wall)
        return following


class _States(threading.local):
    """Per thread: the state of each cron spec (see :class:`_State`)."""

    def __init__(self) -> None:
        self.by_spec: dict[CronSpec, _State] = {}


_states = _States()


def _state(spec: CronSpec) -> _State:
    states = _states.by_spec
    state = states.get(spec)
    if state is None:
        if len(states) >= _CACHE_SIZE:
            states.clear()
        state = states[spec] = _State(spec)
    return state


def next_instant(spec: CronSpec, after: datetime) -> datetime | None:
    """The first instant of ``spec`` strictly after the aware ``after``, in UTC, or None."""
    state = _state(spec)
    # Keyed by the UTC instant: aware datetimes in one zone compare by wall time, so two
    # passes of a repeated hour would look equal.
    key = after if after.tzinfo is UTC else after.astimezone(UTC)
    if key == state.after:
        return state.result
    result = _search(spec, state, after)
    state.after, state.result = key, result
    return result


def _search(spec: CronSpec, state: _State, after: datetime) -> datetime | None:
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
    return _next_in_repeat(spec, step, zone, local, other_pass, wall, after)


_WallStep = Callable[[datetime], datetime]


def _next_in_repeat(
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
        second_from = repeat_start - SECOND  # the whole second pass is still ahead
    else:
        # First-pass instants of the repeated wall times are all behind us: resume after them.
        result = _first_primary(spec, step, zone, repeat_end - SECOND, after)
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
    limit = wall + _HORIZON
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
    high = after if not after.microsecond else after.replace(microsecond=0) + SECOND
    while high - low > SECOND:
        middle = low + (high - low) // SECOND // 2 * SECOND
        if middle.astimezone(zone).utcoffset() == offset:
            high = middle
        else:
            low = middle
    return high
