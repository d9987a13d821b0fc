"""Cluster coordination in the store, on SQLite and on PostgreSQL: shard leases, and the epoch
check of a shard owner's claim (guarantee 14)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_store import LEASE, SHORT, occ, recent

from voltro_beat.cli import main
from voltro_beat.coordination import Coordination
from voltro_beat.replicas import Replica
from voltro_beat.shards import Tenure
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.reads import shard_leases
from voltro_beat.store.registry import Registry

CLUSTER = Coordination.CLUSTER
Stores = Callable[[str], BeatStore]


def take(store: BeatStore, *shards: int, lease=LEASE) -> dict[int, int]:  # type: ignore[no-untyped-def]
    return store.exchange_shards("g", keep={}, release=(), acquire=shards, lease=lease)[1]


def test_a_free_shard_goes_to_one_replica_and_moves_only_once_released(
    stores: Stores,
) -> None:
    a, b = stores("a"), stores("b")
    assert take(a, 0, 1) == {0: 1, 1: 1}
    assert take(b, 0, 1) == {}
    held, gained = a.exchange_shards("g", keep={0: 1, 1: 1}, release=[1], acquire=(), lease=LEASE)
    assert (held, gained) == ({0: 1}, {})
    assert take(b, 0, 1) == {1: 2}  # one more epoch at every change of owner
    rows = {r.shard: r for r in shard_leases(a.database, now=a.database.time())}
    assert (rows[0].owner, rows[0].epoch) == ("a", 1)
    assert (rows[1].owner, rows[1].epoch) == ("b", 2)
    assert 0 < (rows[1].lease_left or 0) <= LEASE.total_seconds()
    assert a.release_shards("g") == 1
    assert take(b, 0) == {0: 2}
    # A replica that holds a shard without knowing it (the answer of the exchange that took
    # it was lost) takes it back at the same epoch.
    assert take(b, 0) == {0: 2}


def test_a_shard_whose_lease_ran_out_is_taken_and_its_owner_cannot_renew_it(
    stores: Stores,
) -> None:
    a, b = stores("a"), stores("b")
    assert take(a, 3, lease=SHORT) == {3: 1}
    held, _ = a.exchange_shards("g", keep={3: 1}, release=(), acquire=(), lease=SHORT)
    assert held == {3: 1}  # renewed while it runs
    time.sleep(SHORT.total_seconds() * 1.5)
    assert take(b, 3) == {3: 2}
    held, gained = a.exchange_shards("g", keep={3: 1}, release=(), acquire=(), lease=LEASE)
    assert (held, gained) == ({}, {})


def test_a_shard_owner_records_its_runs_with_the_shard_and_epoch(stores: Stores) -> None:
    a = stores("a")
    take(a, 5)
    won = a.claim([occ(0)], coordination=CLUSTER, lease=LEASE, tenure=Tenure("g", {"s": (5, 1)}))
    assert won == {occ(0).occurrence.key}
    (row,) = recent(a)
    assert (row["coordination_outcome"], row["shard"], row["epoch"]) == ("cluster", 5, 1)


def test_an_owner_that_lost_its_shard_cannot_claim_whatever_it_believes(
    stores: Stores,
) -> None:
    """The epoch check: a paused owner wakes up after its lease ran out and its shard moved;
    its claims are refused, the new owner's go in. Fails without the check in the claim
    statement (the paused owner's insert would win the key)."""
    a, b = stores("a"), stores("b")
    take(a, 5, lease=SHORT)
    stale = Tenure("g", {"s": (5, 1)})
    time.sleep(SHORT.total_seconds() * 1.5)
    # Lease run out, nobody took the shard yet: still refused.
    assert a.claim([occ(0)], coordination=CLUSTER, lease=LEASE, tenure=stale) == set()
    assert take(b, 5) == {5: 2}
    assert a.claim([occ(1)], coordination=CLUSTER, lease=LEASE, tenure=stale) == set()
    # Taking it back does not revive the old epoch either.
    assert b.release_shards("g") == 1
    assert take(a, 5) == {5: 3}
    assert a.claim([occ(2)], coordination=CLUSTER, lease=LEASE, tenure=stale) == set()
    fresh = Tenure("g", {"s": (5, 3)})
    keys = {occ(n).occurrence.key for n in (0, 1, 2)}
    runs = [occ(n) for n in (0, 1, 2)]
    assert a.claim(runs, coordination=CLUSTER, lease=LEASE, tenure=fresh) == keys


def test_a_schedule_outside_the_tenure_is_not_claimed(stores: Stores) -> None:
    a = stores("a")
    take(a, 5)
    tenure = Tenure("g", {"s": (5, 1)})
    assert a.claim([occ(0, "other")], coordination=CLUSTER, lease=LEASE, tenure=tenure) == set()


@pytest.mark.parametrize("group", ["g", "h"])
def test_groups_have_their_own_shards(stores: Stores, group: str) -> None:
    a, b = stores("a"), stores("b")
    assert a.exchange_shards(group, keep={}, release=(), acquire=[0], lease=LEASE)[1] == {0: 1}
    other = "h" if group == "g" else "g"
    assert b.exchange_shards(other, keep={}, release=(), acquire=[0], lease=LEASE)[1] == {0: 1}


def test_the_shards_command_says_who_owns_what_and_what_nobody_owns(
    stores: Stores, url: str
) -> None:
    a, b = stores("a"), stores("b")
    take(a, 0, 1)
    take(b, 2)
    take(b, 3, lease=SHORT)
    time.sleep(SHORT.total_seconds() * 1.5)
    result = CliRunner().invoke(main, ["shards", "--store", url, "--all"])
    assert result.exit_code == 0, result.output
    assert "group g: 4 shards, 2 owners (a 2, b 1); NOT OWNED: 1 (3)" in result.output
    assert "(nobody)" in result.output
    b.record_singleton("g", "inbox", token=2, state="running")
    a.record_singleton("g", "inbox", token=1, state="failed", error="Traceback\nValueError: x")
    result = CliRunner().invoke(main, ["shards", "--store", url])
    # A stale owner's note does not overwrite the newer one's.
    assert "singleton inbox (group g): running on b since" in result.output, result.output
    status = CliRunner().invoke(main, ["status", "--store", url])
    assert "shards: group g: 4 shards" in status.output, status.output


def test_status_names_a_group_of_schedules_no_live_replica_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stores: Stores
) -> None:
    store = stores("a")  # registers nothing: a replica of group default, below
    name = f"groups_app_{tmp_path.name.replace('-', '_')}"
    schedule = {
        "report": {"task": "t", "schedule": 60.0},
        "invoice": {"task": "t", "schedule": 60.0, "group": "billing"},
    }
    (tmp_path / f"{name}.py").write_text(
        f"from celery import Celery\napp = Celery({name!r})\n"
        f"app.conf.beat_schedule = {schedule!r}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    settings = {"group": "default", "publish_timeout": 10.0}
    replica = Replica("a", "h", 1, "v", None, None, None, settings)
    Registry(store.database).register(replica, {"report": "00"})
    url = str(store.database.engine.url.render_as_string(hide_password=False))
    out = CliRunner().invoke(main, ["status", "-A", name, "--store", url])
    assert out.exit_code == 0, out.output
    assert "group billing: 1 schedules and NO LIVE REPLICA" in out.output
    assert "group default" not in out.output
    sys.modules.pop(name, None)
