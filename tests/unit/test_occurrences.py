"""Occurrence maths: keys, intervals, one-offs, solar events, plain cron, bad arguments."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from itertools import islice
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import solar

from voltro_beat.exceptions import ConfigurationError, NaiveDatetimeError, VoltroBeatError
from voltro_beat.occurrences import (
    latest_at_or_before,
    next_after,
    occurrence_key,
    occurrences_between,
)
from voltro_beat.schedules import ClockedSpec, IntervalSpec, SolarSpec, to_spec

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


# --- keys -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("at", "key"),
    [
        (utc(2024, 3, 31, 1, 0, 0), "nightly@2024-03-31T01:00:00"),
        # Aware non-UTC instants are keyed in UTC.
        (
            datetime(2024, 3, 31, 3, 0, tzinfo=ZoneInfo("Europe/Berlin")),
            "nightly@2024-03-31T01:00:00",
        ),
        (utc(2024, 1, 1, 0, 0, 0, 500_000), "nightly@2024-01-01T00:00:00.500"),
        (utc(2024, 1, 1, 0, 0, 0, 7_000), "nightly@2024-01-01T00:00:00.007"),
        (utc(1999, 12, 31, 23, 59, 59), "nightly@1999-12-31T23:59:59"),
    ],
)
def test_occurrence_key(at: datetime, key: str) -> None:
    assert occurrence_key("nightly", at) == key


def test_key_rejects_naive_datetimes() -> None:
    with pytest.raises(NaiveDatetimeError) as info:
        occurrence_key("n", datetime(2024, 1, 1))
    assert isinstance(info.value, VoltroBeatError)
    assert isinstance(info.value, ValueError)
    assert "scheduled_at" in str(info.value)


@pytest.mark.parametrize("name", ["a@b", "", "x" * 201])
def test_key_rejects_bad_names(name: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        occurrence_key(name, T0)
    assert info.value.field == "name"


@pytest.mark.parametrize(
    "call",
    [
        lambda: next_after("* * * * *", datetime(2024, 1, 1)),
        lambda: next_after(60, datetime(2024, 1, 1)),
        lambda: occurrences_between(60, datetime(2024, 1, 1), T0),
        lambda: occurrences_between(60, T0, datetime(2030, 1, 1)),
    ],
)
def test_naive_datetimes_are_rejected_at_once(call: object) -> None:
    with pytest.raises(NaiveDatetimeError, match="timezone-aware"):
        call()  # type: ignore[operator]


def test_bad_schedule_names_the_field() -> None:
    with pytest.raises(ConfigurationError, match="field 'schedule'"):
        next_after("every day", T0)


# --- intervals ----------------------------------------------------------------------------


def test_interval_grid_is_anchored_to_the_epoch() -> None:
    # 2024-05-01 12:00:00Z is 1714564800 s after the epoch, a multiple of 15 minutes.
    assert next_after(timedelta(minutes=15), T0) == utc(2024, 5, 1, 12, 15)
    assert next_after(timedelta(minutes=15), T0 - timedelta(microseconds=1)) == T0
    assert next_after(7, T0) == utc(2024, 5, 1, 12, 0, 3)  # 1714564800 = 7 * 244937828 + 4
    assert list(occurrences_between(timedelta(hours=1), T0, T0 + timedelta(hours=3))) == [
        T0,
        utc(2024, 5, 1, 13),
        utc(2024, 5, 1, 14),
    ]


def test_interval_with_anchor() -> None:
    spec = to_spec(timedelta(hours=1), anchor=utc(2020, 1, 1, 0, 20))
    assert next_after(spec, T0) == utc(2024, 5, 1, 12, 20)
    assert next_after(spec, utc(1970, 1, 1, 0, 30)) == utc(1970, 1, 1, 1, 20)  # before the anchor


def test_sub_second_interval_keys() -> None:
    instants = list(islice(occurrences_between(0.25, T0, T0 + timedelta(seconds=1)), 10))
    assert [occurrence_key("fast", at) for at in instants] == [
        "fast@2024-05-01T12:00:00",
        "fast@2024-05-01T12:00:00.250",
        "fast@2024-05-01T12:00:00.500",
        "fast@2024-05-01T12:00:00.750",
    ]


def test_interval_after_in_another_zone() -> None:
    after = datetime(2024, 5, 1, 14, 0, 0, 1, tzinfo=ZoneInfo("Europe/Berlin"))  # 12:00:00.000001Z
    assert next_after(IntervalSpec(60_000_000), after) == utc(2024, 5, 1, 12, 1)


# --- one-offs ------------------------------------------------------------------------------


def test_clocked() -> None:
    at = datetime(2024, 5, 1, 14, 30, tzinfo=ZoneInfo("Europe/Berlin"))
    assert next_after(at, T0) == utc(2024, 5, 1, 12, 30)
    assert next_after(at, utc(2024, 5, 1, 12, 30)) is None
    assert next_after(ClockedSpec(T0), T0 - timedelta(microseconds=1)) == T0
    assert list(occurrences_between(at, T0, T0 + timedelta(days=1))) == [utc(2024, 5, 1, 12, 30)]
    assert list(occurrences_between(at, T0, utc(2024, 5, 1, 12, 30))) == []


# --- cron ---------------------------------------------------------------------------------


def test_cron_basics_in_utc() -> None:
    assert next_after("30 2 * * *", T0) == utc(2024, 5, 2, 2, 30)
    assert next_after("0 0 29 2 *", T0) == utc(2028, 2, 29)
    # Six fields: seconds first.
    assert next_after("15 0 * * * *", T0) == utc(2024, 5, 1, 12, 0, 15)
    # Standard OR day matching: the 13th (a Monday in May 2024) or any Friday (the 3rd).
    assert list(occurrences_between("0 0 13 * 5", T0, utc(2024, 5, 20), tz="UTC")) == [
        utc(2024, 5, 3),
        utc(2024, 5, 10),
        utc(2024, 5, 13),
        utc(2024, 5, 17),
    ]


def test_tz_argument_applies_to_unparsed_schedules_only() -> None:
    assert next_after("0 9 * * *", T0, tz="Asia/Tokyo") == utc(2024, 5, 2, 0)
    spec = to_spec("0 9 * * *")  # UTC
    assert next_after(spec, T0, tz="Asia/Tokyo") == utc(2024, 5, 2, 9)


def test_celery_crontab_and_day_matching() -> None:
    from celery.schedules import crontab

    # Celery ANDs the day fields: the first Monday of the month, not "1st-7th or Mondays".
    first_monday = crontab(minute=0, hour=9, day_of_week="mon", day_of_month="1-7")
    assert list(occurrences_between(first_monday, utc(2024, 1, 1), utc(2024, 5, 1))) == [
        utc(2024, 1, 1, 9),
        utc(2024, 2, 5, 9),
        utc(2024, 3, 4, 9),
        utc(2024, 4, 1, 9),
    ]
    # The same fields as a cron string OR them.
    assert next_after("0 9 1-7 * mon", utc(2024, 1, 7, 10)) == utc(2024, 1, 8, 9)


def test_rare_crontab_far_ahead() -> None:
    from celery.schedules import crontab

    # Celery ANDs: the 29th of February that is a Monday; 2024's was a Thursday.
    leap_monday = crontab(minute=0, hour=0, day_of_month=29, month_of_year=2, day_of_week=1)
    assert next_after(leap_monday, utc(2024, 3, 1)) == utc(2044, 2, 29)
    assert next_after(leap_monday, utc(2073, 1, 1)) == utc(2112, 2, 29)  # 2100 is no leap year


# --- solar ---------------------------------------------------------------------------------

BERLIN_SUNRISE = SolarSpec("sunrise", 52.52, 13.405)


def celery_solar_next(event: str, lat: float, lon: float, day_start: datetime) -> datetime:
    """Celery's own next event after a canonical day start (clock fixed at that start)."""
    app = Celery(set_as_current=False)
    app.conf.timezone = "UTC"
    schedule = solar(event, lat, lon, app=app, nowfun=lambda: day_start)
    return day_start + schedule.remaining_estimate(day_start)


def test_solar_matches_celery_from_the_day_start_truncated_to_the_second() -> None:
    for event, lat, lon in [
        ("sunrise", 52.52, 13.405),
        ("sunset", -33.87, 151.21),
        ("solar_noon", 0, 0),
    ]:
        day_start = utc(2024, 6, 21)
        expected = celery_solar_next(event, lat, lon, day_start).replace(microsecond=0)
        assert next_after(solar(event, lat, lon), day_start) == expected
        assert expected.microsecond == 0


def test_solar_sunrise_berlin_midsummer() -> None:
    # Sunrise in Berlin on 2024-06-21 is at about 04:43 CEST (02:43 UTC).
    at = next_after(BERLIN_SUNRISE, utc(2024, 6, 21))
    assert at is not None
    assert utc(2024, 6, 21, 2, 40) < at < utc(2024, 6, 21, 2, 47)


def test_solar_does_not_wobble_with_the_start() -> None:
    # Whatever instant before sunrise the question is asked from, the answer is the same.
    first = next_after(BERLIN_SUNRISE, utc(2024, 6, 20, 3))
    assert first is not None
    for start in [utc(2024, 6, 20, 3, 0, 1), utc(2024, 6, 20, 23), first - timedelta(seconds=1)]:
        assert next_after(BERLIN_SUNRISE, start) == first
    following = next_after(BERLIN_SUNRISE, first)
    assert following is not None
    assert timedelta(hours=23, minutes=58) < following - first < timedelta(hours=24, minutes=2)


def test_solar_skips_the_polar_night() -> None:
    # Tromsø has no sunrise from late November until mid-January.
    at = next_after(SolarSpec("sunrise", 69.65, 18.96), utc(2024, 12, 1))
    assert at is not None
    assert utc(2025, 1, 10) < at < utc(2025, 1, 20)


# --- purity -------------------------------------------------------------------------------


def test_occurrences_does_not_import_celery() -> None:
    code = (
        "import sys, datetime as d; from voltro_beat import occurrences as o;"
        "t = d.datetime(2024, 1, 1, tzinfo=d.UTC);"
        "o.next_after('0 * * * *', t, tz='Europe/Berlin'); o.next_after(5, t);"
        "o.occurrence_key('x', t); list(o.occurrences_between(d.timedelta(1), t, t));"
        "print('celery' in sys.modules, 'sqlalchemy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        ("*/10 * * * * *", datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)),  # on the grid: itself
        (7.0, datetime(2026, 1, 1, 12, 0, 25, tzinfo=UTC)),  # epoch-anchored interval
        ("0 3 * * 1", datetime(2025, 12, 29, 3, 0, tzinfo=UTC)),  # last Monday
        ("0 0 29 2 *", datetime(2024, 2, 29, tzinfo=UTC)),  # looks back further and further
        (ClockedSpec(datetime(2027, 1, 1, tzinfo=UTC)), None),  # a one-off still to come
    ],
)
def test_latest_at_or_before_snaps_back_to_the_grid(
    schedule: object, expected: datetime | None
) -> None:
    at = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    assert latest_at_or_before(schedule, at) == expected
    assert latest_at_or_before(schedule, at + timedelta(microseconds=1)) == expected
