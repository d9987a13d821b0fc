"""Catch-up planning at boot, with fixed instants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voltro_beat.catchup import MAX_BACKFILL, Plan, last_due, plan
from voltro_beat.occurrences import next_after, occurrences_between
from voltro_beat.schedules import parse_entries

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
ZERO = timedelta(0)


def entry(schedule: object = 5.0, **keys: object):  # type: ignore[no-untyped-def]
    (parsed,) = parse_entries(
        {"e": {"task": "t", "schedule": schedule, **keys}},
        tz=None,
        max_lateness=timedelta(days=1),
    )
    return parsed


def at(seconds: int) -> datetime:
    return NOW - timedelta(seconds=seconds)


def fates(made: Plan) -> list[tuple[datetime, str, str | None]]:
    return [(f.occurrence.scheduled_at, f.status, f.reason) for f in made.runs]


def test_no_history_starts_from_now() -> None:
    assert plan(entry(), None, NOW, on_time=ZERO) == Plan([])


def test_latest_publishes_the_newest_and_records_the_rest_missed() -> None:
    # Last recorded 20 s ago; a 5 s interval has 15, 10, 5 and 0 s ago since then.
    assert fates(plan(entry(catch_up="latest"), at(20), NOW, on_time=ZERO)) == [
        (at(15), "missed", "catch_up"),
        (at(10), "missed", "catch_up"),
        (at(5), "missed", "catch_up"),
        (NOW, "claimed", None),
    ]


def test_skip_records_everything_missed() -> None:
    fills = plan(entry(catch_up="skip"), at(20), NOW, on_time=ZERO).runs
    assert [f.status for f in fills] == ["missed"] * 4
    assert {f.reason for f in fills} == {"catch_up"}


def test_all_publishes_each_one() -> None:
    fills = plan(entry(catch_up="all"), at(20), NOW, on_time=ZERO).runs
    assert [(f.occurrence.scheduled_at, f.status) for f in fills] == [
        (at(15), "claimed"),
        (at(10), "claimed"),
        (at(5), "claimed"),
        (NOW, "claimed"),
    ]


@pytest.mark.parametrize("policy", ["latest", "skip", "all"])
def test_only_occurrences_within_max_lateness(policy: str) -> None:
    fills = plan(entry(catch_up=policy, max_lateness=12), at(60), NOW, on_time=ZERO).runs
    assert [f.occurrence.scheduled_at for f in fills] == [at(10), at(5), NOW]


@pytest.mark.parametrize("policy", ["latest", "skip"])
def test_an_occurrence_a_live_replica_still_covers_is_published(policy: str) -> None:
    # Finding 8 of issue 18: booting while a live replica is about to claim the occurrences of
    # the last 10 s (its lease), the booting replica must not record them missed.
    assert fates(plan(entry(catch_up=policy), at(20), NOW, on_time=timedelta(seconds=10))) == [
        (at(15), "missed", "catch_up"),
        (at(10), "missed", "catch_up"),
        (at(5), "claimed", None),
        (NOW, "claimed", None),
    ]


@pytest.mark.parametrize("policy", ["latest", "skip"])
def test_what_fell_while_another_live_replica_ran_the_schedule_is_not_downtime(
    policy: str,
) -> None:
    # Found by tests/sim (seed 9): the live replica was held up, not down; what it did not
    # claim yet it publishes late, within max_lateness, and so does the booting replica. What
    # fell before that replica started was downtime: the policy says.
    made = plan(
        entry(catch_up=policy),
        at(30),
        NOW,
        on_time=timedelta(seconds=10),
        live_since=at(17),
    )
    newest_of_downtime = ("claimed", None) if policy == "latest" else ("missed", "catch_up")
    assert fates(made) == [
        (at(25), "missed", "catch_up"),
        (at(20), *newest_of_downtime),
        (at(15), "claimed", None),
        (at(10), "claimed", None),
        (at(5), "claimed", None),
        (NOW, "claimed", None),
    ]


def test_a_replica_started_after_the_downtime_does_not_hide_it() -> None:
    # Replicas restarted together: the first one's registry row must not make the others
    # publish what fell while none ran (tests/acceptance/test_replica_failures.py).
    made = plan(entry(catch_up="skip"), at(30), NOW, on_time=ZERO, live_since=at(2))
    assert [f for _, f, _ in fates(made)] == ["missed"] * 5 + ["claimed"]


def test_what_fell_before_a_live_owner_released_its_shard_is_not_downtime() -> None:
    # Cluster coordination (tests/sim, seed 1597): the shard's previous owner was live until it
    # released the shard 15 s ago; what it had not claimed by then is published late. What fell
    # after, until the taker started 2 s ago, was downtime.
    made = plan(
        entry(catch_up="skip"),
        at(30),
        NOW,
        on_time=ZERO,
        live_since=at(2),
        live_until=at(15),
    )
    assert fates(made) == [
        (at(25), "claimed", None),
        (at(20), "claimed", None),
        (at(15), "claimed", None),
        (at(10), "missed", "catch_up"),
        (at(5), "missed", "catch_up"),
        (NOW, "claimed", None),
    ]


def test_nothing_new_since_the_last_run() -> None:
    # Last recorded at 11:59:55; the next instant, 12:00:00, is not due at 11:59:59.
    assert plan(entry(), at(5), at(1), on_time=ZERO) == Plan([])


def test_a_fast_schedule_keeps_only_the_newest_rows() -> None:
    fills = plan(entry(1.0, catch_up="skip"), at(86_000), NOW, on_time=ZERO).runs
    assert len(fills) == MAX_BACKFILL
    assert fills[-1].occurrence.scheduled_at == NOW
    assert fills[0].occurrence.scheduled_at == at(MAX_BACKFILL - 1)


# --- irregular schedules: the walk covers the whole window (issue 9, hole 5) -------------------


def test_an_irregular_cron_is_walked_back_to_max_lateness() -> None:
    # Down from 08:00 to 08:30 the next day: 09:00-09:04 of the first day are inside the day of
    # max_lateness, though the typical gap (a minute) times the cap reaches back only 16 hours.
    now = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)
    last = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
    made = plan(entry("0-4 9 * * *", catch_up="skip"), last, now, on_time=ZERO)
    assert [r.occurrence.scheduled_at for r in made.runs] == [
        datetime(2026, 3, 1, 9, minute, tzinfo=UTC) for minute in range(5)
    ]
    assert made.unrecorded_until is None


def test_minutes_one_and_two_of_every_hour_all_come_back() -> None:
    now = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
    made = plan(entry("1,2 * * * *", catch_up="skip"), now - timedelta(days=1), now, on_time=ZERO)
    assert len(made.runs) == 48


CRON_FIELD = st.one_of(
    st.just("*"),
    st.integers(0, 5).map(str),
    st.lists(st.integers(0, 5), min_size=2, max_size=3, unique=True).map(
        lambda v: ",".join(map(str, sorted(v)))
    ),
    st.tuples(st.integers(0, 3), st.integers(1, 3)).map(lambda t: f"{t[0]}-{t[0] + t[1]}"),
)
IRREGULAR = st.tuples(
    CRON_FIELD,
    st.one_of(st.just("*"), st.integers(0, 23).map(str), st.just("8-10"), st.just("0,12")),
    st.one_of(st.just("*"), st.just("1,15"), st.just("29-31")),
    st.one_of(st.just("*"), st.just("mon-fri"), st.just("sat")),
).map(lambda f: f"{f[0]} {f[1]} {f[2]} * {f[3]}")


@settings(max_examples=150, deadline=None)
@given(
    IRREGULAR,
    st.sampled_from(["latest", "skip", "all"]),
    st.integers(1, 3 * 86_400),  # downtime, seconds
    st.integers(60, 2 * 86_400),  # max_lateness, seconds
    st.integers(0, 600),  # on time (the lease), seconds
    st.datetimes(
        min_value=datetime(2024, 1, 1), max_value=datetime(2027, 1, 1), timezones=st.just(UTC)
    ),
)
def test_every_occurrence_inside_max_lateness_is_recorded_once(
    expr: str, policy: str, down: int, lateness: int, on_time_s: int, now: datetime
) -> None:
    """Every occurrence in (last, now] within max_lateness is published or recorded missed,
    none twice: all of them, or the newest MAX_BACKFILL and a bound that says what was not.
    Those less than ``on_time`` old are published whatever the policy; of the others the
    policy decides."""
    e = entry(expr, catch_up=policy, max_lateness=lateness)
    last = now - timedelta(seconds=down)
    on_time = timedelta(seconds=on_time_s)
    made = plan(e, last, now, on_time=on_time)
    window_start = max(last + timedelta(microseconds=1), now - e.max_lateness)
    expected = list(occurrences_between(e.spec, window_start, now + timedelta(microseconds=1)))
    got = [r.occurrence.scheduled_at for r in made.runs]
    assert len(got) == len(set(got))
    if made.unrecorded_until is None:
        assert got == expected
    else:
        assert len(got) == MAX_BACKFILL
        assert got == expected[-MAX_BACKFILL:]
        assert made.unrecorded_until == expected[-MAX_BACKFILL - 1]
    published = [r.occurrence.scheduled_at for r in made.runs if r.status == "claimed"]
    recent = [at for at in got if at > now - on_time]
    assert set(recent) <= set(published)
    assert published == got[len(got) - len(published) :]  # the newest ones
    expected_sent = {"all": len(got), "latest": min(len(got), max(1, len(recent))), "skip": 0}
    assert len(published) == max(len(recent), expected_sent[policy])
    assert all(r.reason == "catch_up" for r in made.runs if r.status == "missed")


# --- the occurrence an external trigger's arrival stands for ------------------------------

MS = timedelta(milliseconds=1)


@pytest.mark.parametrize(
    ("schedule", "occurrence"),
    [
        (3600, datetime(2026, 3, 1, 11, 0, tzinfo=UTC)),
        ("0 */6 * * *", datetime(2026, 3, 1, 6, 0, tzinfo=UTC)),
        ("*/10 * * * * *", datetime(2026, 3, 1, 11, 59, 50, tzinfo=UTC)),
    ],
)
def test_an_arrival_snaps_back_to_the_newest_occurrence(
    schedule: object, occurrence: datetime
) -> None:
    e = entry(schedule, max_lateness=timedelta(hours=7))
    after = next_after(e.spec, occurrence)
    assert after is not None
    # Exactly on the occurrence, just after it, and 1 ms before the next one: all that one.
    assert last_due(e, occurrence, early=ZERO) == occurrence
    assert last_due(e, occurrence + MS, early=ZERO) == occurrence
    assert last_due(e, after - MS, early=ZERO) == occurrence
    # On the next one: the next one.
    assert last_due(e, after, early=ZERO) == after


def test_an_early_arrival_stands_for_the_occurrence_it_precedes() -> None:
    # Issue 18: a platform whose clock runs ahead of the database's fires a little early; that
    # arrival is the coming occurrence (the trigger waits for it), not the previous one.
    e = entry(3600, max_lateness=timedelta(hours=7))
    occurrence = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    second = timedelta(seconds=1)
    assert last_due(e, occurrence - 300 * MS, early=second) == occurrence
    assert last_due(e, occurrence - second, early=second) == occurrence
    assert last_due(e, occurrence - second - MS, early=second) == occurrence - timedelta(hours=1)
    assert last_due(e, occurrence + MS, early=second) == occurrence
    once = entry(occurrence)
    assert last_due(once, occurrence - 300 * MS, early=second) == occurrence
    # A cadence shorter than the offset: the nearer occurrence.
    fast = entry(1.0)
    assert last_due(fast, occurrence + 300 * MS, early=second) == occurrence
    assert last_due(fast, occurrence + 700 * MS, early=second) == occurrence + second


def test_an_arrival_beyond_max_lateness_stands_for_nothing() -> None:
    occurrence = datetime(2026, 3, 1, 11, 0, tzinfo=UTC)
    e = entry(3600, max_lateness=timedelta(minutes=10))
    assert last_due(e, occurrence + timedelta(minutes=10), early=ZERO) == occurrence
    assert last_due(e, occurrence + timedelta(minutes=10) + MS, early=ZERO) is None
    assert last_due(e, occurrence + timedelta(minutes=59, seconds=59), early=ZERO) is None


def test_an_arrival_before_a_one_off_stands_for_nothing() -> None:
    once = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    e = entry(once)
    assert last_due(e, once - MS, early=ZERO) is None
    assert last_due(e, once + timedelta(hours=23), early=ZERO) == once
    assert last_due(e, once + timedelta(days=1, milliseconds=1), early=ZERO) is None


@settings(max_examples=200, deadline=None)
@given(
    every_s=st.integers(min_value=1, max_value=86_400),
    lateness_s=st.integers(min_value=1, max_value=2 * 86_400),
    offset_ms=st.integers(min_value=0, max_value=10**10),
)
def test_last_due_is_the_newest_occurrence_within_max_lateness(
    every_s: int, lateness_s: int, offset_ms: int
) -> None:
    e = entry(every_s, max_lateness=lateness_s)
    arrival = NOW + timedelta(milliseconds=offset_ms)
    found = last_due(e, arrival, early=ZERO)
    window = list(
        occurrences_between(e.spec, arrival - timedelta(seconds=lateness_s), arrival + MS)
    )
    assert found == (window[-1] if window else None)
