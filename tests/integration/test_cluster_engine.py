"""Cluster coordination in the engine: two scheduler replicas in one process on one SQLite
store, on a clock the test drives (``beat_kit``)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from beat_kit import fail_once, rows, sec, tick

from voltro_beat.exceptions import StoreError
from voltro_beat.shards import assign
from voltro_beat.store import tables

#: One shard: whichever replica the assignment names owns every schedule.
CLUSTER = {"voltro_beat_coordination": "cluster", "voltro_beat_shards": 1}
#: Second 2 of every minute: a schedule with no history until its first occurrence.
AT_SECOND_2 = {"s": {"task": "proj.work", "schedule": "2 * * * * *"}}


def shard_to_b(replicas: Any, schedule: dict[str, Any]) -> tuple[Any, Any]:
    """Replicas ``a`` and ``b``: ``a`` boots alone and takes the one shard, ``b`` boots, the
    assignment gives it the shard, ``a`` releases it at its heartbeat (1.2 s) and ``b`` takes
    it at its own (1.3 s)."""
    assert assign(1, ["a", "b"])["b"] == {0}
    a = replicas("a", schedule=schedule, **CLUSTER)
    b = replicas("b", schedule=schedule, **CLUSTER)
    for replica, at in ((a, 0.2), (b, 0.3), (a, 1.2), (b, 1.3)):
        tick(replica, sec(at))
    return a, b


def break_claims(monkeypatch: pytest.MonkeyPatch, replica: Any) -> None:
    """From now on every claim statement of ``replica`` fails; its other statements work."""

    def fails(*args: Any, **kwargs: Any) -> set[str]:
        raise StoreError("claims failing")

    monkeypatch.setattr(replica._store, "claim", fails)


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


SKIP_EVERY_SECOND = {
    "s": {"task": "proj.work", "schedule": "* * * * * *", "catch_up": "skip"},
}


def test_occurrences_a_stopping_owner_had_not_claimed_are_published_not_missed(
    replicas: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The only replica falls behind (its claims fail, its heartbeats go through), another
    boots meanwhile and leaves the shard to it, then the owner stops gracefully and releases
    the shard. The one taking it catches up: what fell before the release was a live
    replica's, not downtime, so even a ``skip`` schedule publishes it late. Found by the
    simulation (cluster seed 1597); before the fix the occurrences before the taker's own
    start were recorded missed (catch_up)."""
    assert assign(1, ["b", "c"])["b"] == {0}
    owner = replicas("b", schedule=SKIP_EVERY_SECOND, **CLUSTER)
    for n in range(2, 30):
        tick(owner, sec(n / 10))
    break_claims(monkeypatch, owner)
    t = 3.0
    while t < 8.0:
        tick(owner, sec(t))
        t += 0.1
    taker = replicas("c", schedule=SKIP_EVERY_SECOND, **CLUSTER)
    while t < 14.0:
        tick(owner, sec(t))
        tick(taker, sec(t + 0.05))
        t += 0.1
    owner._store.database.clock = lambda: sec(14.0)
    owner.close()
    while t < 16.0:
        tick(taker, sec(t))
        t += 0.1
    found = rows(store_url)
    fates = {n: found[f"s@2026-01-01T10:00:{n:02}"].status for n in range(4, 14)}
    assert set(fates.values()) <= {"claimed", "published"}, fates


EVERY_SECOND = {"s": {"task": "proj.work", "schedule": "* * * * * *", "max_lateness": 30}}


def test_a_takeover_catch_up_that_meets_a_store_error_is_retried_not_lost(
    replicas: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shard's owner stalls for good; the other replica, live all along, takes the shard
    once the lease ran out and catches up on what fell meanwhile, published late. That
    catch-up's first statement fails: the next step must retry it, as it stood when the shard
    was taken. Before the fix the next heartbeat no longer saw the shard as just taken and
    the occurrences older than a lease before the takeover had no row at all."""
    a, _ = shard_to_b(replicas, EVERY_SECOND)  # b takes the shard, then stalls for good
    # a's next read of the schedules' last runs is its catch-up of the shard it takes.
    failures = fail_once(monkeypatch, a._store, "last_scheduled")
    t = 1.4
    while t < 20.0:
        tick(a, sec(t))
        t += 0.1
    assert failures
    found = rows(store_url)
    fates = {
        n: getattr(found.get(f"s@2026-01-01T10:00:{n:02}"), "status", None) for n in range(3, 18)
    }
    assert None not in fates.values(), fates


def test_a_replica_whose_claims_fail_lets_its_shards_go_to_a_live_one(
    replicas: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica whose claims fail while its heartbeats go through (a deploy whose claims are
    broken) holds the shard the assignment gives it. After a lease of failed steps it lets
    the shard go; the other replica, live all along, takes it once its lease ran out and
    catches up on what fell meanwhile, within the lateness. Found by the simulation (seed 11,
    cluster coordination); before the fix the failing replica renewed the shard at every
    heartbeat and none of its occurrences had a row while it lived."""
    a, b = shard_to_b(replicas, EVERY_SECOND)
    break_claims(monkeypatch, b)
    t = 1.4
    while t < 40.0:
        tick(a, sec(t))
        tick(b, sec(t + 0.05))
        t += 0.1
    taker, broken = a._engine.gate.ownership, b._engine.gate.ownership
    assert taker is not None and taker.held
    assert broken is not None and not broken.held
    found = rows(store_url)
    fates = {
        n: getattr(found.get(f"s@2026-01-01T10:00:{n:02}"), "status", None) for n in range(3, 38)
    }
    assert set(fates.values()) <= {"claimed", "published"}, fates


TWO_GROUPS = {
    "mine": {"task": "proj.work", "schedule": 5.0},
    "theirs": {"task": "proj.work", "schedule": 5.0, "group": "billing", "max_lateness": 10},
}


@pytest.mark.parametrize("coordination", ["advisory_lock", "cluster"])
def test_a_group_with_no_live_replica_gets_missed_rows_after_its_lateness(
    replicas: Any, store_url: str, coordination: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Group ``billing`` has a schedule and no replica: a replica of the default group says so
    once, loudly, and records its occurrences ``missed`` (no_replica) once they are past their
    lateness and a lease (10 s here); none of the newer ones. Once a billing replica is
    live, that stops, and the billing replica's own catch-up finds nothing taken from it."""
    conf = {"voltro_beat_coordination": coordination, "voltro_beat_publish_timeout": 10}
    mine = replicas("a", schedule=TWO_GROUPS, **conf)
    t = 0.0
    while t < 40.0:
        tick(mine, sec(t))
        t += 0.5
    errors = [r.getMessage() for r in caplog.records if "NO LIVE REPLICA" in r.getMessage()]
    assert len(errors) == 1, errors
    found = rows(store_url)
    theirs = {k: (r.status, r.reason) for k, r in found.items() if k.startswith("theirs@")}
    # At 39.5 s: instants up to 39.5 - 10 - 10 = 19.5 s, from when replica a first saw the
    # group unserved (its boot, 0 s: the schedule has no history).
    assert theirs == {
        f"theirs@2026-01-01T10:00:{n:02}": ("missed", "no_replica") for n in (5, 10, 15)
    }
    assert all(r.replica == "a" for k, r in found.items() if k.startswith("theirs@"))
    billing = replicas("b", schedule=TWO_GROUPS, voltro_beat_group="billing", **conf)
    while t < 60.0:
        tick(mine, sec(t))
        tick(billing, sec(t + 0.1))
        t += 0.5
    found = rows(store_url)
    theirs = {
        k: (r.status, r.reason, r.replica) for k, r in found.items() if k.startswith("theirs@")
    }
    # b joined at 40.1 s: its catch-up looks back from there (lateness 10 s): a records up to
    # 40.1 - 10 + 1 (the join margin), b the rest, each once.
    assert {k: v for k, v in theirs.items() if v[2] == "a"} == {
        f"theirs@2026-01-01T10:00:{n:02}": ("missed", "no_replica", "a")
        for n in (5, 10, 15, 20, 25, 30)
    }
    later = {k: v[:2] for k, v in theirs.items() if v[2] == "b"}
    assert later["theirs@2026-01-01T10:00:35"] == ("published", None)
    assert sorted(later) == [f"theirs@2026-01-01T10:00:{n:02}" for n in range(35, 60, 5)]
    assert later["theirs@2026-01-01T10:00:55"][0] in {"claimed", "published"}


def test_a_replica_s_timeline_holds_the_schedules_of_its_shards_alone(
    replicas: Any, store_url: str
) -> None:
    """Each replica's timeline holds its own shards' schedules, none of the others': at a
    million schedules and three replicas, each stepped past 667,000 others' occurrences a
    lease after every boundary, and its steps outlasted the shards' leases. A shard taken
    over joins the timeline of the replica that took it."""
    schedule = {f"s{n:02d}": {"task": "proj.work", "schedule": 1.0} for n in range(20)}
    settings = {"voltro_beat_coordination": "cluster", "voltro_beat_shards": 4}
    a = replicas("a", schedule=schedule, **settings)
    b = replicas("b", schedule=schedule, **settings)
    for t in (0.2, 0.3, 1.2, 1.3, 2.2, 2.3):  # both boot, then the shards settle
        tick(a if int(t * 10) % 2 == 0 else b, sec(t))
    on: dict[str, set[str]] = {}
    for name, r in (("a", a), ("b", b)):
        ownership = r._engine.gate.ownership
        on[name] = {p.entry.name for p in r._engine.timeline}
        assert on[name] == {n for n in schedule if ownership.holds(n)}
    assert on["a"] and on["b"] and not on["a"] & on["b"]
    assert on["a"] | on["b"] == set(schedule)
    a.close()  # releases its shards: b takes them at its next heartbeat
    for n in range(24, 80):
        tick(b, sec(n / 10))
    assert {p.entry.name for p in b._engine.timeline} == set(schedule)
    found = rows(store_url)
    at = "2026-01-01T10:00:07"
    assert {(f"s{n:02d}", found[f"s{n:02d}@{at}"].replica) for n in range(20)} == {
        (name, "b") for name in schedule
    }


def test_a_step_whose_claim_outlasts_the_heartbeat_interval_heartbeats_before_its_upkeep(
    replicas: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a million schedules a replica's claim statement took seconds; the heartbeat came
    only at the start of the next step, after the recovery slice, and the shards' leases
    ran out under a replica that was working (``lost shards``, taken back at once, caught
    up on again). Now a step heartbeats again after its claims when one came due meanwhile:
    the registry row and the shard's lease run from the end of the claim."""
    a = replicas("a", **CLUSTER)
    tick(a, sec(0.2))  # boots and takes the one shard
    claim = a._store.claim

    def slow(*args: Any, **kwargs: Any) -> Any:
        a._store.database.clock = lambda: sec(4.5)  # the statement took 3 s
        return claim(*args, **kwargs)

    monkeypatch.setattr(a._store, "claim", slow)
    tick(a, sec(1.5))

    with sa.create_engine(store_url).connect() as conn:
        seen = conn.execute(sa.select(tables.replicas.c.last_seen)).scalar_one()
        lease = conn.execute(sa.select(tables.shards.c.lease_until)).scalar_one()
    assert (seen, lease) == (sec(4.5), sec(14.5))
