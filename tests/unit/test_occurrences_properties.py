"""Property tests: the invariants every replica relies on, for random schedules and instants.

Instants are drawn both at random and close to DST changes, where the mapping from wall time
to real time is interesting. The last tests check agreement, in UTC, with croniter's own
search and with Celery's own ``crontab.is_due``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

from celery import Celery
from celery.schedules import crontab
from croniter import CroniterBadDateError, croniter
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from voltro_beat.cron import REFERENCE as CRON_REFERENCE
from voltro_beat.cron import CronSpec
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.occurrences import next_after, occurrence_key, occurrences_between
from voltro_beat.schedules import IntervalSpec, Spec, cadence, to_spec

US = timedelta(microseconds=1)
MINUTE = timedelta(minutes=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]
TRANSITIONS = [
    ("Europe/Berlin", datetime(2024, 3, 31, 1, tzinfo=UTC)),  # 02:00 -> 03:00
    ("Europe/Berlin", datetime(2024, 10, 27, 1, tzinfo=UTC)),  # 03:00 -> 02:00
    ("America/New_York", datetime(2024, 3, 10, 7, tzinfo=UTC)),  # 02:00 -> 03:00
    ("America/New_York", datetime(2024, 11, 3, 6, tzinfo=UTC)),  # 02:00 -> 01:00
    ("Australia/Lord_Howe", datetime(2024, 4, 6, 15, tzinfo=UTC)),  # 02:00 -> 01:30
    ("Australia/Lord_Howe", datetime(2024, 10, 5, 15, 30, tzinfo=UTC)),  # 02:00 -> 02:30
]

PROPERTIES = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much]
)


def cron_field(low: int, high: int) -> st.SearchStrategy[str]:
    value = st.integers(low, high)
    step = st.integers(1, (high - low + 1) // 2)
    bounds = st.tuples(value, value).map(sorted)
    return st.one_of(
        st.just("*"),
        step.map(lambda k: f"*/{k}"),
        value.map(str),
        bounds.map(lambda ab: f"{ab[0]}-{ab[1]}"),
        st.tuples(bounds, step).map(lambda t: f"{t[0][0]}-{t[0][1]}/{t[1]}"),
        st.lists(value, min_size=2, max_size=4, unique=True).map(
            lambda v: ",".join(map(str, sorted(v)))
        ),
    )


FIVE_FIELDS = st.tuples(
    cron_field(0, 59), cron_field(0, 23), cron_field(1, 31), cron_field(1, 12), cron_field(0, 6)
).map(" ".join)
SIX_FIELDS = st.tuples(cron_field(0, 59), FIVE_FIELDS).map(" ".join)
CRON = st.one_of(FIVE_FIELDS, SIX_FIELDS)


# Near a DST change only the time of day matters: day fields stay open so the change day
# matches, and the hours include those the changes touch.
NIGHT_HOURS = st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True).map(
    lambda hours: ",".join(map(str, sorted(hours)))
)
EDGE_MINUTES = st.sampled_from(["*", "0", "30", "0,30", "59", "29,59", "*/15", "*/20"])
TIME_OF_DAY = st.tuples(
    st.one_of(cron_field(0, 59), EDGE_MINUTES), st.one_of(cron_field(0, 23), NIGHT_HOURS)
).map(lambda fields: f"{fields[0]} {fields[1]} * * *")
TIME_OF_DAY_SECONDS = st.tuples(cron_field(0, 59), TIME_OF_DAY).map(" ".join)


ANY_ZONE = st.sampled_from(ZONES)


@st.composite
def cron_specs(
    draw: st.DrawFn,
    expressions: st.SearchStrategy[str] = CRON,
    zones: st.SearchStrategy[str] = ANY_ZONE,
) -> CronSpec:
    try:
        spec = to_spec(draw(expressions), tz=draw(zones))
    except ConfigurationError:  # e.g. the 31st of February: never fires
        assume(False)
        raise
    assert isinstance(spec, CronSpec)
    return spec


INTERVALS = st.builds(
    IntervalSpec,
    every_us=st.integers(1, 10**8).map(lambda ms: ms * 1000),
    anchor_us=st.integers(-(10**15), 10**15),
)
RANDOM_INSTANTS = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC)
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[Spec, datetime]:
    """A schedule and an instant: at random, or a cron schedule near a DST change in its zone."""
    if draw(st.booleans()):
        return draw(st.one_of(cron_specs(), INTERVALS)), draw(RANDOM_INSTANTS)
    zone, change = draw(st.sampled_from(TRANSITIONS))
    spec = draw(cron_specs(st.one_of(TIME_OF_DAY, TIME_OF_DAY_SECONDS), st.just(zone)))
    return spec, change + draw(st.integers(-3 * 3600 * 10**6, 3 * 3600 * 10**6)) * US


def walk(spec: Spec, after: datetime, steps: int) -> list[datetime]:
    instants = []
    for _ in range(steps):
        at = next_after(spec, after)
        if at is None:
            break
        instants.append(at)
        after = at
    return instants


@PROPERTIES
@given(cases())
def test_next_after_strictly_increases(case: tuple[Spec, datetime]) -> None:
    spec, after = case
    instants = walk(spec, after, 25)
    assert instants
    assert all(at.tzinfo is UTC for at in instants)
    assert all(a < b for a, b in pairwise([after, *instants]))


@PROPERTIES
@given(cases())
def test_walking_next_after_equals_occurrences_between(case: tuple[Spec, datetime]) -> None:
    spec, after = case
    instants = walk(spec, after, 25)
    assert list(occurrences_between(spec, after + US, instants[-1] + US)) == instants
    # The end is exclusive, the start inclusive.
    assert list(occurrences_between(spec, instants[0], instants[-1])) == instants[:-1]


@PROPERTIES
@given(cases())
def test_keys_are_unique_per_schedule(case: tuple[Spec, datetime]) -> None:
    spec, after = case
    keys = [occurrence_key("job", at) for at in walk(spec, after, 40)]
    assert len(set(keys)) == len(keys)


def walk_until(spec: Spec, after: datetime, last: datetime) -> list[datetime]:
    instants: list[datetime] = []
    at = next_after(spec, after)
    while at is not None and at <= last:
        instants.append(at)
        at = next_after(spec, at)
    return instants


@PROPERTIES
@given(cases(), st.floats(0, 40), st.floats(0.001, 0.999))
def test_independent_of_where_the_walk_starts(
    case: tuple[Spec, datetime], lead: float, fraction: float
) -> None:
    spec, after = case
    instants = walk(spec, after, 15)
    # A walk started up to 40 typical gaps earlier reaches the same instants after `after`.
    step = cadence(spec)
    assert step is not None
    earlier = walk_until(spec, after - step * lead, instants[-1])
    assert [at for at in earlier if at > after] == instants
    # Asking from anywhere between two occurrences gives the later one.
    for before, following in pairwise(instants):
        assert next_after(spec, before + (following - before) * fraction) == following


@PROPERTIES
@given(
    st.integers(1, 10**7),
    st.one_of(st.none(), RANDOM_INSTANTS),
    RANDOM_INSTANTS,
    st.lists(st.floats(0, 50), min_size=2, max_size=4),
)
def test_intervals_identical_for_any_process_start(
    every_ms: int, anchor: datetime | None, window: datetime, leads: list[float]
) -> None:
    every = timedelta(milliseconds=every_ms)
    spec = to_spec(every, anchor=anchor)
    origin = anchor.replace(microsecond=anchor.microsecond // 1000 * 1000) if anchor else EPOCH
    # Processes started up to 50 intervals before the window, each walking from its start.
    seen = [
        [at for at in walk_until(spec, window - every * lead, window + every * 10) if at > window]
        for lead in leads
    ]
    assert all(instants == seen[0] for instants in seen)
    assert len(seen[0]) == 10
    assert all((at - origin) % every == timedelta(0) for at in seen[0])


# --- against the definition, evaluated instant by instant ---------------------------------


def matcher(spec: CronSpec) -> Callable[[datetime], bool]:
    """Whether a wall time matches the cron fields (croniter parses; no croniter search)."""
    fields, _ = croniter.expand(spec.expr, second_at_beginning=spec.second_at_beginning)
    minute, hour, dom, month, dow = fields[:5]
    second = fields[5] if spec.second_at_beginning else [0]

    def ok(values: list[int | str], value: int) -> bool:
        return values[0] == "*" or value in values

    def matches(wall: datetime) -> bool:
        day_ok, weekday_ok = ok(dom, wall.day), ok(dow, wall.isoweekday() % 7)
        restricted = dom[0] != "*" and dow[0] != "*"
        day = (day_ok or weekday_ok) if spec.day_or and restricted else (day_ok and weekday_ok)
        return (
            day
            and ok(second, wall.second)
            and ok(minute, wall.minute)
            and ok(hour, wall.hour)
            and ok(month, wall.month)
        )

    return matches


def by_definition(spec: CronSpec, instants: Iterable[datetime], step: timedelta) -> list[datetime]:
    """Debian cron's rule, checked at every real instant one step apart.

    An instant runs when its wall clock matches, except a second pass of a repeated wall
    time for a fixed-time job; a fixed-time job also runs at the first instant after a gap
    in the wall clock if a skipped wall time matches.
    """
    zone = ZoneInfo(spec.tz)
    matches = matcher(spec)
    found = []
    for at in instants:
        local = at.astimezone(zone)
        wall = local.replace(tzinfo=None)
        previous = (at - step).astimezone(zone).replace(tzinfo=None)
        skipped = []
        while previous + step < wall:
            previous += step
            skipped.append(previous)
        if spec.wildcard:
            runs = matches(wall)
        else:
            runs = (matches(wall) and local.fold == 0) or any(map(matches, skipped))
        if runs:
            found.append(at)
    return found


@st.composite
def at_a_change(draw: st.DrawFn, expressions: st.SearchStrategy[str]) -> tuple[CronSpec, datetime]:
    """A cron spec in the zone of a DST change, with either day matching, and the change."""
    zone, change = draw(st.sampled_from(TRANSITIONS))
    spec = replace(draw(cron_specs(expressions, st.just(zone))), day_or=draw(st.booleans()))
    try:  # ANDed day fields can be impossible where ORed ones were not (the 30th of February)
        croniter(
            spec.expr,
            CRON_REFERENCE,
            day_or=spec.day_or,
            second_at_beginning=spec.second_at_beginning,
        ).get_next(datetime)
    except CroniterBadDateError:
        assume(False)
    return spec, change


@PROPERTIES
@given(at_a_change(st.one_of(TIME_OF_DAY, FIVE_FIELDS)))
@example((CronSpec("*/20 2 * * *", "Europe/Berlin", True, False, True), TRANSITIONS[0][1]))
@example((CronSpec("*/20 1 * * *", "America/New_York", True, False, True), TRANSITIONS[3][1]))
@example((CronSpec("10,40 2 * * *", "Australia/Lord_Howe", True, False, False), TRANSITIONS[5][1]))
@example((CronSpec("40 1 * * *", "Australia/Lord_Howe", True, False, False), TRANSITIONS[4][1]))
def test_minutes_around_dst_changes_follow_the_definition(case: tuple[CronSpec, datetime]) -> None:
    spec, change = case
    start, end = change - timedelta(hours=2), change + timedelta(hours=2)
    minutes = (start + timedelta(minutes=i) for i in range((end - start) // timedelta(minutes=1)))
    assert list(occurrences_between(spec, start, end)) == by_definition(
        spec, minutes, timedelta(minutes=1)
    )


@PROPERTIES
@given(at_a_change(TIME_OF_DAY_SECONDS))
def test_seconds_around_dst_changes_follow_the_definition(case: tuple[CronSpec, datetime]) -> None:
    spec, change = case
    start, end = change - timedelta(minutes=1), change + timedelta(minutes=1)
    seconds = (start + timedelta(seconds=i) for i in range((end - start) // timedelta(seconds=1)))
    assert list(occurrences_between(spec, start, end)) == by_definition(
        spec, seconds, timedelta(seconds=1)
    )


# --- agreement with croniter and with Celery, in UTC --------------------------------------


@PROPERTIES
@given(CRON, RANDOM_INSTANTS)
def test_utc_cron_agrees_with_croniter(expr: str, after: datetime) -> None:
    try:
        spec = to_spec(expr)
    except ConfigurationError:
        assume(False)
        raise
    after = after.replace(microsecond=0)
    reference = croniter(
        expr, after.replace(tzinfo=None), second_at_beginning=len(expr.split()) == 6
    )
    expected = [reference.get_next(datetime).replace(tzinfo=UTC) for _ in range(20)]
    assert walk(spec, after, 20) == expected


def around(day: int, low: int, high: int) -> st.SearchStrategy[str | set[int]]:
    """A Celery crontab day field: open, or a set that includes ``day``, so it can fire."""
    return st.one_of(
        st.just("*"),
        st.sets(st.integers(low, high), max_size=6).map(lambda days: days | {day}),
    )


@st.composite
def celery_crontabs(draw: st.DrawFn) -> tuple[dict[str, object], datetime]:
    start = draw(RANDOM_INSTANTS).replace(second=0, microsecond=0)
    fields: dict[str, object] = {
        "minute": draw(st.one_of(cron_field(0, 59), st.sets(st.integers(0, 59), min_size=1))),
        "hour": draw(cron_field(0, 23)),
        "day_of_week": draw(st.one_of(around(start.isoweekday() % 7, 0, 6), st.just("mon-fri"))),
        "day_of_month": draw(around(start.day, 1, 31)),
        "month_of_year": draw(around(start.month, 1, 12)),
    }
    return fields, start


@settings(PROPERTIES, max_examples=15)  # each walks 1440 minutes through Celery
@given(celery_crontabs())
def test_utc_crontab_agrees_with_celery_is_due(case: tuple[dict[str, Any], datetime]) -> None:
    fields, start = case
    app = Celery(set_as_current=False)
    app.conf.timezone = "UTC"
    clock = [start]
    try:
        schedule = crontab(**fields, nowfun=lambda: clock[0], app=app)
    except ValueError:  # e.g. only the 31st, in April
        assume(False)
        raise
    # Celery's own beat, ticking every minute for a day.
    fired, last_run = [], start
    for minute in range(1, 1440 + 1):
        clock[0] = start + timedelta(minutes=minute)
        if schedule.is_due(last_run).is_due:
            fired.append(clock[0])
            last_run = clock[0]
    window = occurrences_between(schedule, start + MINUTE, start + MINUTE * (1440 + 1))
    assert list(window) == fired
