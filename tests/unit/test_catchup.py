"""Catch-up planning at boot, with fixed instants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from voltro_beat.catchup import MAX_BACKFILL, plan
from voltro_beat.occurrences import Occurrence
from voltro_beat.schedules import parse_entries

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def entry(schedule: object = 5.0, **keys: object):  # type: ignore[no-untyped-def]
    (parsed,) = parse_entries(
        {"e": {"task": "t", "schedule": schedule, **keys}},
        tz=None,
        max_lateness=timedelta(days=1),
    )
    return parsed


def at(seconds: int) -> datetime:
    return NOW - timedelta(seconds=seconds)


def fates(fills: list[Occurrence]) -> list[tuple[datetime, str, str | None]]:
    return [(f.scheduled_at, f.status, f.reason) for f in fills]


def test_no_history_starts_from_now() -> None:
    assert plan(entry(), None, NOW) == []


def test_latest_publishes_the_newest_and_records_the_rest_missed() -> None:
    # Last recorded 20 s ago; a 5 s interval has 15, 10, 5 and 0 s ago since then.
    assert fates(plan(entry(catch_up="latest"), at(20), NOW)) == [
        (at(15), "missed", "catch_up"),
        (at(10), "missed", "catch_up"),
        (at(5), "missed", "catch_up"),
        (NOW, "claimed", None),
    ]


def test_skip_records_everything_missed() -> None:
    fills = plan(entry(catch_up="skip"), at(20), NOW)
    assert [f.status for f in fills] == ["missed"] * 4
    assert {f.reason for f in fills} == {"catch_up"}


def test_all_publishes_each_one() -> None:
    fills = plan(entry(catch_up="all"), at(20), NOW)
    assert [(f.scheduled_at, f.status) for f in fills] == [
        (at(15), "claimed"),
        (at(10), "claimed"),
        (at(5), "claimed"),
        (NOW, "claimed"),
    ]


@pytest.mark.parametrize("policy", ["latest", "skip", "all"])
def test_only_occurrences_within_max_lateness(policy: str) -> None:
    fills = plan(entry(catch_up=policy, max_lateness=12), at(60), NOW)
    assert [f.scheduled_at for f in fills] == [at(10), at(5), NOW]


def test_nothing_new_since_the_last_run() -> None:
    # Last recorded at 11:59:55; the next instant, 12:00:00, is not due at 11:59:59.
    assert plan(entry(), at(5), at(1)) == []


def test_a_fast_schedule_keeps_only_the_newest_rows() -> None:
    fills = plan(entry(1.0, catch_up="skip"), at(86_000), NOW)
    assert len(fills) == MAX_BACKFILL
    assert fills[-1].scheduled_at == NOW
    assert fills[0].scheduled_at == at(MAX_BACKFILL - 1)
