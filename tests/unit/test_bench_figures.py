"""The bench's burst figures: what each column counts (bench/README.md)."""

from __future__ import annotations

from datetime import UTC, datetime

from bench.observer import Message
from bench.workloads import burst_figures

BOUNDARY = datetime(2026, 12, 6, 11, 15, tzinfo=UTC).timestamp()


def _keyed(i: int, t: float, minute: int = 15) -> Message:
    key = f"s{i:06d}@2026-12-06T11:{minute:02}:00"
    return Message(BOUNDARY + t, f"id-{i}-{minute}", i, key, "gen1@host")


def test_a_message_of_an_earlier_boundary_is_known_by_its_key_wherever_it_arrived() -> None:
    msgs = [
        _keyed(0, 0.01),
        _keyed(1, 0.02),
        _keyed(1, 0.5, minute=14),  # the previous minute's, arriving late: not this burst's
        _keyed(0, 0.03),  # this burst's, a second time
    ]
    figures = burst_figures(msgs, BOUNDARY, size=2, window=10)
    assert figures["earlier_messages"] == 1
    assert (figures["messages"], figures["arrived"], figures["duplicates"]) == (3, 2, 1)
    assert figures["early_messages"] == 0


def test_without_a_key_a_message_is_placed_by_its_arrival() -> None:
    msgs = [
        Message(BOUNDARY - 5, "a", 0, None, "gen1@host"),  # an earlier boundary's
        Message(BOUNDARY - 0.2, "b", 1, None, "gen1@host"),  # this burst's, early
        Message(BOUNDARY + 0.1, "c", 0, None, "gen1@host"),
    ]
    figures = burst_figures(msgs, BOUNDARY, size=2, window=10)
    assert (figures["earlier_messages"], figures["early_messages"]) == (1, 1)
    assert figures["all_s"] == 0.1
