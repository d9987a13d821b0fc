"""The cron engine (voltro_beat.cron) at scale: the plain-expression search agrees with
croniter's, equal specs share one answer per instant, and parsing shares work per expression.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab
from croniter import CroniterBadDateError, croniter
from hypothesis import example, given, settings
from hypothesis import strategies as st

from voltro_beat import cron
from voltro_beat.cron import CronSpec
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.occurrences import next_after
from voltro_beat.schedules import parse_entries, to_spec

HOUR = timedelta(hours=1)
AFTER = datetime(2024, 5, 14, 10, 17, 23, 456_789, tzinfo=UTC)


def field(
    low: int, high: int, names: tuple[str, ...] = (), *, span: int | None = None
) -> st.SearchStrategy[str]:
    value = st.integers(low, high)
    bounds = st.tuples(value, value).map(sorted)
    # Steps beyond the field's span are refused (test_a_step_or_value_out_of_range_...).
    step = st.integers(1, high - low if span is None else span)
    plain = st.one_of(
        st.just("*"),
        step.map(lambda k: f"*/{k}"),
        value.map(str),
        bounds.map(lambda ab: f"{ab[0]}-{ab[1]}"),
        st.tuples(bounds, step).map(lambda t: f"{t[0][0]}-{t[0][1]}/{t[1]}"),
        st.lists(value, min_size=2, max_size=4, unique=True).map(lambda v: ",".join(map(str, v))),
    )
    return st.one_of(plain, st.sampled_from(names)) if names else plain


EXPRESSIONS = st.tuples(
    field(0, 59),
    field(0, 23),
    # The 29th to 31st, which some months lack, on their own too.
    st.one_of(field(1, 31), st.sampled_from(["29", "30", "31", "30,31", "29-31"])),
    field(1, 12, ("jan", "feb", "feb,aug", "nov-dec")),
    field(0, 7, ("mon-fri", "sat,sun", "7", "5-7"), span=6),
).map(" ".join)
SECONDS = field(0, 59)
WALLS = st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2090, 1, 1))


@settings(max_examples=400, deadline=None)
@given(EXPRESSIONS, st.none() | SECONDS, st.booleans(), WALLS)
@example("0 0 29 2 1", None, False, datetime(2016, 3, 1))  # 28 years to the next one
@example("0 0 31 2,4 *", None, True, datetime(2024, 1, 1))  # never: croniter says so
@example("59 23 31 12 *", "59", True, datetime(2024, 12, 31, 23, 59, 58, 999_999))
@example("*/15 * * * *", None, True, datetime(2024, 12, 31, 23, 45))
def test_plain_search_agrees_with_croniter(
    expr: str, seconds: str | None, day_or: bool, wall: datetime
) -> None:
    if seconds is not None:
        expr = f"{seconds} {expr}"
    try:
        it = croniter(expr, wall, day_or=day_or, second_at_beginning=seconds is not None)
    except ValueError:  # croniter refuses it (a range running backwards, say)
        return
    fields = cron.plain_fields(it, day_or)
    assert fields is not None
    try:
        expected: datetime | None = it.get_next(datetime)
    except CroniterBadDateError:
        expected = None
    found = fields.following(wall)
    if expected is None:
        assert found is None  # the search leaves it to croniter, which raises
    elif expected.year - wall.year < 40:
        assert found == expected
    else:
        assert found in (expected, None)  # far ahead: the search may leave it to croniter


@pytest.mark.parametrize("expr", ["0 0 L * *", "0 0 15W * *", "0 0 * * mon#2", "* * * * 5l"])
def test_l_w_and_hash_fields_are_left_to_croniter(expr: str) -> None:
    try:
        spec = to_spec(expr)
    except ConfigurationError:
        return
    assert isinstance(spec, CronSpec)
    assert cron.fields_of(spec) is None
    expected = croniter(expr, AFTER.replace(tzinfo=None)).get_next(datetime)
    assert next_after(spec, AFTER) == expected.replace(tzinfo=UTC)


def test_equal_specs_share_one_search_per_instant(monkeypatch: pytest.MonkeyPatch) -> None:
    searches: list[tuple[CronSpec, datetime]] = []
    search = cron._search

    def counting(spec: CronSpec, state: Any, after: datetime) -> datetime | None:
        searches.append((spec, after))
        return search(spec, state, after)

    monkeypatch.setattr(cron, "_search", counting)
    entries = parse_entries(
        {f"s{i}": {"task": "t", "schedule": crontab(minute="*")} for i in range(1000)},
        tz="Europe/Berlin",
        max_lateness=HOUR,
    )
    # Instants compare as instants, whatever zone they are given in.
    firsts = {next_after(e.spec, AFTER.astimezone(ZoneInfo("Asia/Tokyo"))) for e in entries}
    assert firsts == {datetime(2024, 5, 14, 10, 18, tzinfo=UTC)}
    (first,) = firsts
    assert first is not None
    assert {next_after(e.spec, first) for e in entries} == {first + timedelta(minutes=1)}
    assert len(searches) == 2


def test_the_two_passes_of_a_repeated_hour_are_different_questions() -> None:
    # 02:30 in Berlin on 2024-10-27 happens twice; in one zone the two compare equal.
    berlin = ZoneInfo("Europe/Berlin")
    first_pass = datetime(2024, 10, 27, 2, 30, tzinfo=berlin)
    second_pass = first_pass.replace(fold=1)
    assert first_pass == second_pass and first_pass.utcoffset() != second_pass.utcoffset()
    spec = to_spec("*/20 * * * *", tz="Europe/Berlin")
    assert next_after(spec, first_pass) == datetime(2024, 10, 27, 0, 40, tzinfo=UTC)
    assert next_after(spec, second_pass) == datetime(2024, 10, 27, 1, 40, tzinfo=UTC)
    assert next_after(spec, first_pass) == datetime(2024, 10, 27, 0, 40, tzinfo=UTC)


def test_equal_definitions_share_one_spec_object() -> None:
    entries = parse_entries(
        {
            **{f"c{i}": {"task": "t", "schedule": crontab(minute="*/5")} for i in range(3)},
            **{f"s{i}": {"task": "t", "schedule": " */5  * * * *"} for i in range(3)},
        },
        tz=None,
        max_lateness=HOUR,
    )
    crontabs, strings = entries[:3], entries[3:]
    assert len({id(e.spec) for e in crontabs}) == 1
    assert len({id(e.spec) for e in strings}) == 1
    # Celery's AND day matching vs cron's OR: equal text, different specs.
    assert crontabs[0].spec != strings[0].spec


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("*/61 * * * *", "minute step 61 in '*/61' is out of range (1-59)"),
        ("0-59/60 * * * *", "minute step 60 in '0-59/60' is out of range (1-59)"),
        ("*/90 * * * * *", "second step 90 in '*/90' is out of range (1-59)"),
        ("0 */24 * * *", "hour step 24 in '*/24' is out of range (1-23)"),
        ("0 0 */32 * *", "day-of-month step 32 in '*/32' is out of range (1-30)"),
        ("0 0 * */12 *", "month step 12 in '*/12' is out of range (1-11)"),
        ("0 0 * * */7", "day-of-week step 7 in '*/7' is out of range (1-6)"),
        ("5-70 * * * *", "minute 70 in '5-70' is out of range (0-59)"),
        ("0 1,25 * * *", "hour 25 in '25' is out of range (0-23)"),
        ("0 0 0 * *", "day-of-month 0 in '0' is out of range (1-31)"),
        ("0 0 * 13 *", "month 13 in '13' is out of range (1-12)"),
        ("0 0 * * 1-8", "day-of-week 8 in '1-8' is out of range (0-7)"),
        ("61 0 0 * * *", "second 61 in '61' is out of range (0-59)"),
    ],
)
def test_a_step_or_value_out_of_range_names_its_field(expr: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_entries({"e": {"task": "t", "schedule": expr}}, tz=None, max_lateness=HOUR)
    assert str(info.value) == f"schedule 'e', field 'schedule': cron expression {expr!r}: {message}"


@pytest.mark.parametrize(
    "expr", ["*/59 * * * *", "30-10 * * * *", "0 0 * * 7", "0 0 1 jan-dec mon-fri", "0 0 L * *"]
)
def test_steps_and_values_within_range_are_accepted(expr: str) -> None:
    parse_entries({"e": {"task": "t", "schedule": expr}}, tz=None, max_lateness=HOUR)


@pytest.mark.parametrize("value", ["61 * * * *", "0 0 31 2 *", "@often", "* * *"])
def test_a_bad_expression_names_each_entry_that_uses_it(value: str) -> None:
    for name in ("first", "second"):
        with pytest.raises(ConfigurationError) as info:
            parse_entries({name: {"task": "t", "schedule": value}}, tz=None, max_lateness=HOUR)
        assert (info.value.entry, info.value.field) == (name, "schedule")
        assert str(info.value).startswith(f"schedule {name!r}, field 'schedule': ")
