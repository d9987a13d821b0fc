"""Cluster coordination in the engine: two scheduler replicas in one process on one SQLite
store, on a clock the test drives (``beat_kit``)."""

from __future__ import annotations

from typing import Any

from beat_kit import rows, sec, tick

from voltro_beat.shards import assign

#: One shard: whichever replica the assignment names owns every schedule.
CLUSTER = {"voltro_beat_coordination": "cluster", "voltro_beat_shards": 1}
#: Second 2 of every minute: a schedule with no history until its first occurrence.
AT_SECOND_2 = {"s": {"task": "proj.work", "schedule": "2 * * * * *"}}


def test_a_new_schedules_first_occurrence_survives_an_owner_that_stalled(
    replicas: Any, store_url: str
) -> None:
    """The shard of a schedule that has no run yet moves to its assigned owner, which stalls
    before the first occurrence; the other replica, live all along, takes the shard back once
    the lease ran out, a moment after that occurrence came up on its timeline (a lease after
    its instant) and was left to the owner. Its catch-up must start at its own start, not at
    "now" as for a schedule with no history at boot: before the fix the occurrence had no
    row at all."""
    assert assign(1, ["a", "b"])["b"] == {0}
    a = replicas("a", schedule=AT_SECOND_2, **CLUSTER)
    b = replicas("b", schedule=AT_SECOND_2, **CLUSTER)
    tick(a, sec(0.2))  # boots alone and takes the shard
    tick(b, sec(0.3))  # the assignment gives the shard to b
    tick(a, sec(1.2))  # a's heartbeat: it releases the shard
    tick(b, sec(1.3))  # b's heartbeat: it takes the shard, then stalls for good
    # a ticks on; the registry counts b until 11.3, so a takes the shard at its heartbeat
    # at 12.2; at 12.0 the occurrence at second 2 came up and was b's.
    for n in range(14, 140):
        tick(a, sec(n / 10))
    ownership = a._engine.gate.ownership
    assert ownership is not None and ownership.held
    found = rows(store_url)
    assert "s@2026-01-01T10:00:02" in found, sorted(found)
    assert found["s@2026-01-01T10:00:02"].replica == "a"
