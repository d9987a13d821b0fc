"""The clock a replica decides with: the database's, kept on the local monotonic clock."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from voltro_beat.clock import MAX_ROUND_TRIP, Clock, ClockMode

DB = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


def skewed(seconds: float) -> Clock:
    """A database clock on a host whose wall clock is ``seconds`` ahead of the real one."""
    return Clock(ClockMode.DATABASE, local=lambda: datetime.now(UTC) + timedelta(seconds=seconds))


def test_a_database_clock_reads_the_database_plus_elapsed_monotonic_time() -> None:
    clock = skewed(5)
    sent = time.monotonic()
    assert clock.observe(DB, sent, sent + 0.002)
    first = clock.now()
    assert abs(first - DB) < timedelta(milliseconds=50)
    time.sleep(0.05)
    assert timedelta(milliseconds=40) < clock.now() - first < timedelta(milliseconds=500)


def test_the_offset_is_the_local_clock_minus_the_database() -> None:
    clock = skewed(5)
    now = datetime.now(UTC)
    sent = time.monotonic()
    assert clock.observe(now, sent, time.monotonic())
    assert clock.offset is not None
    assert abs(clock.offset - timedelta(seconds=5)) < timedelta(milliseconds=50)
    assert clock.error is not None and clock.error <= MAX_ROUND_TRIP / 2


def test_a_slow_round_trip_is_not_used() -> None:
    clock = skewed(5)
    sent = time.monotonic()
    assert not clock.observe(DB, sent, sent + MAX_ROUND_TRIP.total_seconds() + 0.1)
    assert clock.offset is None
    assert abs(clock.now() - datetime.now(UTC) - timedelta(seconds=5)) < timedelta(seconds=1)


def test_before_its_first_reading_a_database_clock_is_not_synced() -> None:
    assert not skewed(0).synced
    assert Clock(ClockMode.LOCAL).synced


def test_a_local_clock_keeps_the_local_time_but_reports_the_offset() -> None:
    clock = Clock(ClockMode.LOCAL, local=lambda: DB + timedelta(seconds=3))
    sent = time.monotonic()
    assert clock.observe(DB, sent, sent)
    assert clock.now() == DB + timedelta(seconds=3)
    assert clock.offset is not None
    assert abs(clock.offset - timedelta(seconds=3)) < timedelta(milliseconds=50)


def test_the_most_precise_recent_reading_is_kept() -> None:
    clock = skewed(0)
    now = time.monotonic()
    assert clock.observe(DB, now - 0.2, now)  # 100 ms of error
    assert clock.observe(DB + timedelta(seconds=1), now - 0.0002, now)  # precise: taken
    assert clock.error == timedelta(microseconds=100)
    precise = clock.now()
    assert clock.observe(DB + timedelta(seconds=5), now - 0.2, now)  # coarse: not taken
    assert abs(clock.now() - precise) < timedelta(milliseconds=50)
    assert clock.error == timedelta(microseconds=100)
