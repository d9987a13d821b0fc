"""The timeline (voltro_beat.engine.timeline): what a step takes of a burst larger than one
claim statement, at fixed instants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from voltro_beat.engine.timeline import Pending, Timeline
from voltro_beat.schedules import parse_entries

T0 = datetime(2026, 1, 1, 10, 0, 0, tzinfo=UTC)
ENTRIES = parse_entries(
    {f"s{n:02d}": {"task": "t", "schedule": "0 * * * * *"} for n in range(40)},
    tz="UTC",
    max_lateness=timedelta(seconds=30),
)


def burst() -> Timeline:
    timeline = Timeline(timedelta(seconds=10), (), lambda name: False, lambda name: True)
    for entry in reversed(ENTRIES):
        timeline.push(Pending(entry, [T0]))
    return timeline


def names(pending: list[Pending]) -> list[str]:
    return [p.entry.name for p in pending]


def test_a_burst_within_the_limit_is_taken_whole() -> None:
    assert len(burst().due(T0, 40)) == 40


def test_a_larger_burst_is_taken_a_limit_at_a_time_from_the_replica_s_start() -> None:
    timeline = burst()
    first = timeline.due(T0, 10, start=0.5)
    assert names(first) == [f"s{n:02d}" for n in range(20, 30)]
    assert timeline.next is not None and timeline.next <= T0  # the rest is due still
    # On from where it was, round to the first.
    assert names(timeline.due(T0, 10, start=0.5)) == [f"s{n:02d}" for n in range(30, 40)]
    assert names(timeline.due(T0, 10, start=0.5)) == [f"s{n:02d}" for n in range(10)]
    assert names(timeline.due(T0, 10, start=0.5)) == [f"s{n:02d}" for n in range(10, 20)]
    assert timeline.due(T0, 10, start=0.5) == []
    assert timeline.next is None


def test_what_is_left_of_a_burst_gets_its_claim_time_again_when_the_schedules_deferred_change() -> (
    None
):
    deferred: set[str] = set()
    timeline = Timeline(timedelta(seconds=10), (), lambda name: name in deferred, lambda n: True)
    for entry in ENTRIES:
        timeline.push(Pending(entry, [T0]))
    timeline.due(T0, 10)
    deferred.update(f"s{n:02d}" for n in range(20, 40))  # another replica's now
    timeline.requeue()
    assert names(timeline.due(T0, 100)) == [f"s{n:02d}" for n in range(10, 20)]
    assert timeline.next == T0 + timedelta(seconds=10)  # a lease after their instant


def test_the_timeline_holds_the_schedules_of_the_shards_held_alone() -> None:
    # In cluster coordination the others' schedules are not stepped past: at a million
    # schedules and three replicas, each replica popped and advanced 667,000 of them a lease
    # after every boundary, and its steps outlasted the shards' leases.
    held = {f"s{n:02d}" for n in range(20)}
    timeline = Timeline(timedelta(seconds=10), (), lambda name: False, held.__contains__)
    for entry in ENTRIES:
        timeline.push(Pending(entry, [T0]))
    assert sorted(p.entry.name for p in timeline) == sorted(held)
    assert "s20" not in timeline
    timeline.due(T0, 5)
    held.difference_update(f"s{n:02d}" for n in range(10))  # a shard moved away
    timeline.requeue()
    assert "s05" not in timeline
    assert sorted(names(timeline.due(T0, 100))) == [f"s{n:02d}" for n in range(10, 20)]
    assert timeline.next is None


@given(
    limit=st.integers(1, 50),
    starts=st.lists(st.floats(0, 0.999), min_size=1, max_size=60),
)
def test_every_schedule_due_is_taken_once_within_the_limit(limit: int, starts: list[float]) -> None:
    timeline = burst()
    taken: list[str] = []
    for start in starts:
        step = timeline.due(T0, limit, start)
        assert 0 < len(step) <= limit or (not step and len(taken) == 40)
        taken += names(step)
    taken += names(timeline.due(T0, 40))
    assert sorted(taken) == [e.name for e in ENTRIES]
