"""Overlap policies, decided from a schedule's live runs at fixed instants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from voltro_beat.occurrences import Occurrence
from voltro_beat.overlap import decide, promotion, view, with_claimed
from voltro_beat.runs import Run
from voltro_beat.status import Status

T0 = datetime(2026, 1, 1, 10, 0, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def run(n: int, status: str, since: int | None = None) -> Run:
    at = T0 + timedelta(seconds=n)
    started = at if since is None else T0 + timedelta(seconds=since)
    return Run(Occurrence("s", at, f"s@{n}", f"id-{n}"), "t", Status(status), since=started)


def at(n: int) -> datetime:
    return T0 + timedelta(seconds=n)


@pytest.mark.parametrize("status", ["claimed", "published", "started", "retrying"])
def test_skip_while_a_predecessor_is_live(status: str) -> None:
    live = view([run(0, status)], now=at(1), timeout=HOUR)
    assert decide("skip", at(1), live) == ("skipped", "overlap")
    assert decide("queue", at(1), live) == ("queued", None)
    assert decide("allow", at(1), live) == ("claimed", None)


def test_nothing_live_publishes() -> None:
    live = view([], now=at(1), timeout=HOUR)
    for policy in ("allow", "skip", "queue"):
        assert decide(policy, at(1), live) == ("claimed", None)


def test_a_later_run_does_not_block_an_earlier_occurrence() -> None:
    live = view([run(5, "started")], now=at(6), timeout=HOUR)
    assert decide("skip", at(3), live) == ("claimed", None)


def test_queue_waits_behind_queued_runs_too() -> None:
    live = view([run(1, "queued")], now=at(2), timeout=HOUR)
    assert decide("queue", at(2), live) == ("queued", None)
    # A queued run is not running: skip does not wait for it.
    assert decide("skip", at(2), live) == ("claimed", None)


def test_a_run_past_the_timeout_no_longer_blocks_and_is_reported() -> None:
    stuck = run(0, "started", since=0)
    live = view([stuck], now=at(3601), timeout=HOUR)
    assert live.stale == (stuck,)
    assert decide("skip", at(3601), live) == ("claimed", None)
    assert decide("queue", at(3601), live) == ("claimed", None)


def test_the_timeout_counts_from_the_start_not_the_schedule() -> None:
    # Scheduled two hours ago but started only a minute ago: still blocking.
    late_start = run(0, "started", since=7140)
    live = view([late_start], now=at(7200), timeout=HOUR)
    assert live.running == (late_start,)


def test_same_tick_occurrences_queue_behind_the_first() -> None:
    live = view([], now=at(3), timeout=HOUR)
    assert decide("queue", at(1), live) == ("claimed", None)
    live = with_claimed(live, run(1, "claimed"))
    assert decide("queue", at(2), live) == ("queued", None)
    assert decide("skip", at(2), live) == ("skipped", "overlap")


def test_promotion_is_oldest_first_and_one_at_a_time() -> None:
    queued = [run(3, "queued"), run(2, "queued")]
    live = view([run(1, "started"), *queued], now=at(4), timeout=HOUR)
    assert promotion(live, at(4), HOUR) == ((), None)
    assert promotion(view(queued, now=at(4), timeout=HOUR), at(4), HOUR) == ((), run(2, "queued"))
    assert promotion(view([], now=at(4), timeout=HOUR), at(4), HOUR) == ((), None)


def test_queued_runs_past_their_lateness_are_missed_before_their_turn() -> None:
    # s@1 still runs; s@2 and s@3 can no longer be published within 5 s of their instant.
    queued = [run(4, "queued"), run(2, "queued"), run(3, "queued")]
    live = view([run(1, "started"), *queued], now=at(9), timeout=HOUR)
    late = timedelta(seconds=5)
    assert promotion(live, at(9), late) == ((run(2, "queued"), run(3, "queued")), None)
    alone = view(queued, now=at(9), timeout=HOUR)
    assert promotion(alone, at(9), late) == ((run(2, "queued"), run(3, "queued")), run(4, "queued"))
