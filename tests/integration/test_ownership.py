"""Cluster coordination's gate (``voltro_beat.engine.ownership``) on a real store, SQLite and
PostgreSQL: replicas bring their shards in step with the live members at each heartbeat."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from voltro_beat.config import Settings
from voltro_beat.engine.ownership import Ownership
from voltro_beat.metrics import Metrics
from voltro_beat.replicas import Replica
from voltro_beat.schedules import parse_entries
from voltro_beat.store.beat import BeatStore

ENTRIES = {
    e.name: e
    for e in parse_entries(
        {f"s{i}": {"task": "t", "schedule": 60} for i in range(40)},
        tz=None,
        max_lateness=timedelta(hours=1),
    )
}


def replica(name: str, group: str = "default", coordination: str = "cluster") -> Replica:
    settings = {"coordination": coordination, "group": group, "shards": 8}
    return Replica(name, "host", 1, "v", None, None, None, settings)


def ownership(store: BeatStore, metrics: Metrics | None = None) -> Ownership:
    settings = Settings.resolve(
        {"voltro_beat_coordination": "cluster", "voltro_beat_shards": 8},
        overrides={"replica": store.replica},
        environ={},
    )
    return Ownership(store, settings, ENTRIES, metrics or Metrics())


def test_owners_split_the_shards_hand_them_over_and_never_share_one(
    stores: Callable[[str], BeatStore],
) -> None:
    metrics = Metrics()
    metrics.enable()
    a, b = ownership(stores("a"), metrics), ownership(stores("b"))
    # a alone: every shard, and it catches up on every schedule.
    changed, gained = a.refresh([replica("a")])
    assert changed and len(a.held) == 8 and sorted(gained) == sorted(ENTRIES)
    # b joins: a's view has not changed yet, so b takes nothing that a holds.
    both = [replica("a"), replica("b")]
    assert b.refresh(both) == (False, [])
    # a sees b and gives up b's shards; b takes them at its next heartbeat, one epoch on.
    a.refresh(both)
    changed, gained = b.refresh(both)
    assert changed and len(a.held) == len(b.held) == 4
    assert not a.held.keys() & b.held.keys()
    assert set(b.held.values()) == {2}
    assert {n for n in ENTRIES if b.holds(n)} == set(gained)
    assert all(a.holds(n) != b.holds(n) for n in ENTRIES)
    assert set(a.tenure.held) == {n for n in ENTRIES if a.holds(n)}
    # Replicas of another group or coordination are not members.
    others = [*both, replica("c", group="billing"), replica("d", coordination="advisory_lock")]
    assert a.members(others) == ["a", "b"]
    a.refresh(others)
    sample = metrics.registry.get_sample_value
    assert sample("voltro_beat_shards_owned", {"group": "default"}) == 4
    assert sample("voltro_beat_shards_unowned", {"group": "default"}) == 0
    assert sample("voltro_beat_shard_handoffs_total", {"group": "default", "change": "given"}) == 4
    # A graceful stop: b takes a's shards at once.
    a.release()
    b.refresh([replica("b")])
    assert len(b.held) == 8 and not a.held
