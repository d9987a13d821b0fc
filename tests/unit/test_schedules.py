"""Schedule definitions -> specs, and beat_schedule parsing: every form, every bad input."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from types import MappingProxyType
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import schedules as celery_schedules

from voltro_beat.cron import CronSpec
from voltro_beat.exceptions import ConfigurationError, VoltroBeatError
from voltro_beat.schedules import (
    SOLAR_EVENTS,
    ClockedSpec,
    Entry,
    IntervalSpec,
    SolarSpec,
    cadence,
    parse_entries,
    to_spec,
)

HOUR = timedelta(hours=1)


def entries(**entry: Any) -> tuple[Entry, ...]:
    return parse_entries(
        {"job": {"task": "t", "schedule": 60, **entry}}, tz=None, max_lateness=HOUR
    )


# --- accepted forms -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "every_us"),
    [
        (timedelta(minutes=15), 900_000_000),
        (30, 30_000_000),
        (0.25, 250_000),
        (0.1, 100_000),
        (celery_schedules.schedule(timedelta(seconds=5)), 5_000_000),
        (celery_schedules.schedule(90), 90_000_000),
    ],
)
def test_intervals_become_microseconds_anchored_to_the_epoch(value: object, every_us: int) -> None:
    assert to_spec(value) == IntervalSpec(every_us=every_us, anchor_us=0)


def test_anchor_is_kept_in_microseconds_truncated_to_milliseconds() -> None:
    anchor = datetime(1970, 1, 1, 1, 0, 0, 123_456, tzinfo=ZoneInfo("Europe/Berlin"))
    # 01:00 in Berlin on 1970-01-01 is midnight UTC.
    assert to_spec(60, anchor=anchor) == IntervalSpec(60_000_000, 123_000)


@pytest.mark.parametrize(
    ("text", "expr", "seconds_first", "wildcard"),
    [
        ("30 2 * * *", "30 2 * * *", False, False),
        ("  0   *  * * * ", "0 * * * *", False, True),
        ("*/30 * * * *", "*/30 * * * *", False, True),
        ("*/5 2 * * *", "*/5 2 * * *", False, True),
        ("0 9 1 * mon", "0 9 1 * mon", False, False),
        ("*/10 * * * * *", "*/10 * * * * *", True, True),
        ("0 30 2 * * *", "0 30 2 * * *", True, False),
        ("@hourly", "0 * * * *", False, True),
        ("@daily", "0 0 * * *", False, False),
        ("@MIDNIGHT", "0 0 * * *", False, False),
        ("@weekly", "0 0 * * 0", False, False),
        ("@monthly", "0 0 1 * *", False, False),
        ("@yearly", "0 0 1 1 *", False, False),
        ("@annually", "0 0 1 1 *", False, False),
    ],
)
def test_cron_strings(text: str, expr: str, seconds_first: bool, wildcard: bool) -> None:
    assert to_spec(text, tz="Europe/Berlin") == CronSpec(
        expr=expr,
        tz="Europe/Berlin",
        day_or=True,
        second_at_beginning=seconds_first,
        wildcard=wildcard,
    )


def test_cron_tz_defaults_to_utc() -> None:
    spec = to_spec("0 * * * *")
    assert isinstance(spec, CronSpec)
    assert spec.tz == "UTC"


@pytest.mark.parametrize(
    ("schedule", "expr", "wildcard"),
    [
        (celery_schedules.crontab(), "* * * * *", True),
        (celery_schedules.crontab(minute=30, hour=2), "30 2 * * *", False),
        (celery_schedules.crontab(minute="*/15"), "0,15,30,45 * * * *", True),
        (celery_schedules.crontab(minute=0, hour="*/6"), "0 0,6,12,18 * * *", True),
        (
            celery_schedules.crontab(minute=0, hour=9, day_of_week="mon-fri", day_of_month="1-7"),
            "0 9 1,2,3,4,5,6,7 * 1,2,3,4,5",
            False,
        ),
        (
            celery_schedules.crontab(minute=[5, 10], hour={3}, month_of_year="*/3"),
            "5,10 3 * 1,4,7,10 *",
            False,
        ),
    ],
)
def test_celery_crontab_keeps_and_matching(schedule: object, expr: str, wildcard: bool) -> None:
    spec = to_spec(schedule, tz="America/New_York")
    assert spec == CronSpec(expr, "America/New_York", False, False, wildcard)


def test_celery_crontab_timezone_and_nowfun_are_ignored() -> None:
    schedule = celery_schedules.crontab(minute=0, hour=4, nowfun=lambda: datetime(2000, 1, 1))
    spec = to_spec(schedule, tz="Asia/Tokyo")
    assert isinstance(spec, CronSpec)
    assert spec.tz == "Asia/Tokyo"


def test_celery_solar_becomes_a_solar_spec() -> None:
    assert to_spec(celery_schedules.solar("sunset", 52.52, 13)) == SolarSpec("sunset", 52.52, 13.0)


def test_solar_tables_match_celerys() -> None:
    solar = celery_schedules.solar
    assert set(SOLAR_EVENTS) == solar._all_events
    for event, (method, horizon, use_center) in SOLAR_EVENTS.items():
        assert (method, horizon, use_center) == (
            solar._methods[event],
            solar._horizons[event],
            solar._use_center_l[event],
        )


def test_clocked_is_utc_truncated_to_milliseconds() -> None:
    at = datetime(2024, 5, 1, 12, 0, 0, 987_654, tzinfo=ZoneInfo("Europe/Berlin"))
    assert to_spec(at) == ClockedSpec(datetime(2024, 5, 1, 10, 0, 0, 987_000, tzinfo=UTC))


def test_specs_pass_through() -> None:
    spec = CronSpec("0 0 * * *", "UTC", True, False, False)
    assert to_spec(spec) is spec


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (IntervalSpec(1_500), timedelta(microseconds=1_500)),
        (to_spec("*/10 * * * * *"), timedelta(seconds=10)),
        (to_spec("0 * * * *"), HOUR),
        (to_spec("30 2 * * *"), timedelta(days=1)),
        (to_spec("0 9 * * 1-5"), timedelta(days=1)),
        (to_spec("0 0 1 * *"), timedelta(days=28)),  # February 2001 to March
        (SolarSpec("sunrise", 0.0, 0.0), timedelta(days=1)),
        (ClockedSpec(datetime(2024, 1, 1, tzinfo=UTC)), None),
    ],
)
def test_cadence(spec: Any, expected: timedelta | None) -> None:
    assert cadence(spec) == expected


def test_importing_schedules_does_not_import_celery() -> None:
    code = (
        "import sys, datetime as d; from voltro_beat import schedules as s;"
        "s.to_spec('0 * * * *'); s.to_spec(5); s.to_spec(d.timedelta(1));"
        "s.to_spec(d.datetime(2024, 1, 1, tzinfo=d.UTC)); print('celery' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- entries ------------------------------------------------------------------------------


def test_parse_entries_full_entry() -> None:
    kwargs = {"a": 1}
    options = {"queue": "q"}
    (entry,) = parse_entries(
        {
            "nightly": {
                "task": "proj.tasks.nightly",
                "schedule": "30 2 * * *",
                "args": [1, 2],
                "kwargs": kwargs,
                "options": options,
                "relative": False,
                "tz": "Europe/Berlin",
                "max_lateness": 120,
                "catch_up": "all",
                "on_overlap": "queue",
                "overlap_timeout": timedelta(minutes=5),
            }
        },
        tz="America/New_York",
        max_lateness=HOUR,
    )
    assert entry == Entry(
        name="nightly",
        task="proj.tasks.nightly",
        spec=CronSpec("30 2 * * *", "Europe/Berlin", True, False, False),
        args=(1, 2),
        kwargs={"a": 1},
        options={"queue": "q"},
        max_lateness=timedelta(minutes=2),
        catch_up="all",
        on_overlap="queue",
        overlap_timeout=timedelta(minutes=5),
    )
    # Read-only copies: the user's dicts can change without touching the entry, and back.
    assert isinstance(entry.kwargs, MappingProxyType)
    assert isinstance(entry.options, MappingProxyType)
    kwargs["a"] = 2
    options.clear()
    assert entry.kwargs == {"a": 1}
    assert entry.options == {"queue": "q"}
    with pytest.raises(TypeError):
        entry.kwargs["b"] = 1  # type: ignore[index]


def test_parse_entries_defaults() -> None:
    (entry,) = parse_entries(
        {"e": {"task": "t", "schedule": "0 * * * *"}}, tz="Asia/Tokyo", max_lateness=HOUR
    )
    assert entry.spec == CronSpec("0 * * * *", "Asia/Tokyo", True, False, True)
    assert (entry.args, dict(entry.kwargs), dict(entry.options)) == ((), {}, {})
    assert entry.max_lateness == HOUR
    assert (entry.catch_up, entry.on_overlap, entry.overlap_timeout) == ("latest", "allow", None)


def test_entries_of_one_schedule_object_share_one_spec() -> None:
    # Generated schedules (100,000 of them, say) reuse a handful of schedule objects: each is
    # validated once, and the replica holds one spec per object and zone.
    every, daily = timedelta(seconds=30), celery_schedules.crontab(minute=0, hour=3)
    raw = {f"e{n}": {"task": "t", "schedule": every if n % 2 else daily} for n in range(4)}
    raw["tokyo"] = {"task": "t", "schedule": daily, "tz": "Asia/Tokyo"}
    e0, e1, e2, e3, tokyo = parse_entries(raw, tz=None, max_lateness=HOUR)
    assert e1.spec is e3.spec == IntervalSpec(30_000_000)
    assert e0.spec is e2.spec
    assert tokyo.spec == CronSpec("0 3 * * *", "Asia/Tokyo", False, False, False)


def test_entry_anchor_shifts_the_interval() -> None:
    anchor = datetime(2024, 1, 1, 0, 0, 7, tzinfo=UTC)
    (entry,) = entries(anchor=anchor)
    assert entry.spec == IntervalSpec(60_000_000, 1_704_067_207_000_000)


def test_trigger_defaults_to_beat_and_may_be_external() -> None:
    (beat,) = entries()
    (external,) = entries(trigger="external", max_lateness=60)
    assert (beat.trigger, external.trigger) == ("beat", "external")
    assert external.max_lateness == timedelta(minutes=1)


def test_entry_order_is_kept() -> None:
    names = [f"e{i}" for i in range(5, 0, -1)]
    parsed = parse_entries(
        {name: {"task": "t", "schedule": 1} for name in names}, tz=None, max_lateness=HOUR
    )
    assert [entry.name for entry in parsed] == names


# --- invalid input: the error names the entry and the field -------------------------------


def raises_for(entry: str, field: str) -> Any:
    return pytest.raises(
        ConfigurationError, match="^" + re.escape(f"schedule {entry!r}, field {field!r}: ")
    )


@pytest.mark.parametrize(
    "value",
    [
        "61 * * * *",
        "not a cron at all",
        "* * *",
        "* * * * * * *",
        "0 0 * * * * 2024",
        "@reboot",
        "@every_minute",
        "H * * * *",
        "R 2 * * *",
        "0 0 30 2 *",
        "",
    ],
)
def test_bad_cron_strings(value: str) -> None:
    with raises_for("job", "schedule"):
        entries(schedule=value)


@pytest.mark.parametrize(
    "value",
    [0, -5, 0.0, timedelta(0), timedelta(seconds=-1), celery_schedules.schedule(0)],
)
def test_zero_or_negative_interval(value: object) -> None:
    with raises_for("job", "schedule") as info:
        entries(schedule=value)
    assert "positive" in str(info.value)


@pytest.mark.parametrize("value", [timedelta(microseconds=1_500), 0.0005, 1.0001])
def test_interval_not_whole_milliseconds(value: object) -> None:
    with raises_for("job", "schedule") as info:
        entries(schedule=value)
    assert "whole number of milliseconds" in str(info.value)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e20])
def test_unrepresentable_interval(value: float) -> None:
    with raises_for("job", "schedule"):
        entries(schedule=value)


@pytest.mark.parametrize(
    "value",
    [object(), [1, 2], date(2024, 1, 1), None, True, celery_schedules.BaseSchedule()],
)
def test_unknown_schedule_type(value: object) -> None:
    with raises_for("job", "schedule") as info:
        entries(schedule=value)
    assert "schedule type" in str(info.value)


def test_naive_clocked_datetime() -> None:
    with raises_for("job", "schedule") as info:
        entries(schedule=datetime(2030, 1, 1))
    assert "naive" in str(info.value)


@pytest.mark.parametrize(
    "name",
    ["a@b", "", "x" * 201],
)
def test_bad_names(name: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_entries({name: {"task": "t", "schedule": 1}}, tz=None, max_lateness=HOUR)
    assert info.value.entry == name
    assert info.value.field == "name"
    assert str(info.value).startswith(f"schedule {name!r}, field 'name': ")


def test_name_of_200_characters_is_fine() -> None:
    (entry,) = parse_entries({"x" * 200: {"task": "t", "schedule": 1}}, tz=None, max_lateness=HOUR)
    assert entry.name == "x" * 200


def test_non_string_name() -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_entries({1: {"task": "t", "schedule": 1}}, tz=None, max_lateness=HOUR)  # type: ignore[dict-item]
    assert (info.value.entry, info.value.field) == ("1", "name")


def test_unknown_entry_timezone() -> None:
    with raises_for("job", "tz") as info:
        entries(schedule="0 * * * *", tz="Mars/Olympus_Mons")
    assert "Mars/Olympus_Mons" in str(info.value)


@pytest.mark.parametrize("tz", ["Nowhere/City", "", "../etc/passwd"])
def test_unknown_app_timezone(tz: str) -> None:
    with raises_for("job", "tz"):
        parse_entries({"job": {"task": "t", "schedule": 5}}, tz=tz, max_lateness=HOUR)


def test_timezone_must_be_a_name() -> None:
    with raises_for("job", "tz"):
        entries(tz=ZoneInfo("UTC"))


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"schedule": 1, "tsak": "t"}, "tsak"),
        ({"task": "t", "schedule": 1, "catchup": "all"}, "catchup"),
        ({"schedule": 1}, "task"),
        ({"task": "", "schedule": 1}, "task"),
        ({"task": 5, "schedule": 1}, "task"),
        ({"task": "t"}, "schedule"),
        ({"task": "t", "schedule": 1, "relative": "yes"}, "relative"),
        ({"task": "t", "schedule": 1, "args": "ab"}, "args"),
        ({"task": "t", "schedule": 1, "kwargs": [("a", 1)]}, "kwargs"),
        ({"task": "t", "schedule": 1, "options": "q"}, "options"),
        ({"task": "t", "schedule": 1, "max_lateness": 0}, "max_lateness"),
        ({"task": "t", "schedule": 1, "max_lateness": -1.5}, "max_lateness"),
        ({"task": "t", "schedule": 1, "max_lateness": "1h"}, "max_lateness"),
        ({"task": "t", "schedule": 1, "max_lateness": True}, "max_lateness"),
        ({"task": "t", "schedule": 1, "catch_up": "some"}, "catch_up"),
        ({"task": "t", "schedule": 1, "on_overlap": "wait"}, "on_overlap"),
        ({"task": "t", "schedule": 1, "overlap_timeout": timedelta(0)}, "overlap_timeout"),
        ({"task": "t", "schedule": 1, "anchor": datetime(2024, 1, 1)}, "anchor"),
        ({"task": "t", "schedule": 1, "anchor": "2024-01-01"}, "anchor"),
        ({"task": "t", "schedule": "0 * * * *", "anchor": datetime.now(UTC)}, "anchor"),
        ({"task": "t", "schedule": 1, "trigger": "cronjob"}, "trigger"),
        ({"task": "t", "schedule": 1, "trigger": None}, "trigger"),
        # Only beat's own firing does these: refused on an external entry, not ignored.
        ({"task": "t", "schedule": 1, "trigger": "external", "catch_up": "all"}, "catch_up"),
        ({"task": "t", "schedule": 1, "trigger": "external", "on_overlap": "skip"}, "on_overlap"),
        (
            {"task": "t", "schedule": 1, "trigger": "external", "overlap_timeout": 5},
            "overlap_timeout",
        ),
    ],
)
def test_bad_entry_fields(entry: dict[str, Any], field: str) -> None:
    with raises_for("job", field):
        parse_entries({"job": entry}, tz=None, max_lateness=HOUR)


def test_entry_must_be_a_mapping() -> None:
    with pytest.raises(ConfigurationError, match=r"^schedule 'job': "):
        parse_entries({"job": ["t", 1]}, tz=None, max_lateness=HOUR)  # type: ignore[dict-item]


def test_errors_share_the_base_class() -> None:
    with pytest.raises(VoltroBeatError):
        to_spec("nope")
