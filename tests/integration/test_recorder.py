"""The recorder on a real store: a catch-up goes a statement a step, and replicas that owe
one at once share it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from voltro_beat.coordination import Coordination
from voltro_beat.engine import recorder
from voltro_beat.engine.guard import Guard
from voltro_beat.engine.recorder import Recorder, graces, run_of
from voltro_beat.metrics import Metrics
from voltro_beat.occurrences import occurrence_key
from voltro_beat.schedules import parse_entries
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.tables import runs

AT = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)


ENTRIES = {
    e.name: e
    for e in parse_entries(
        {f"s{n:02d}": {"task": "t", "schedule": 60.0} for n in range(40)},
        tz="UTC",
        max_lateness=timedelta(hours=1),
    )
}


@pytest.fixture
def replica(
    stores: Callable[..., BeatStore], monkeypatch: pytest.MonkeyPatch
) -> Callable[[str], Recorder]:
    """``replica(name)``: a recorder of ENTRIES as that replica, 10 runs a claim statement,
    each schedule's occurrence a minute before AT recorded already (its last before a
    downtime)."""
    monkeypatch.setattr(recorder, "BATCH", 10)

    def make(name: str) -> Recorder:
        store = stores(name)
        metrics = Metrics()
        return Recorder(
            store,
            ENTRIES,
            Guard(store, ENTRIES, {}, metrics),
            Coordination.ADVISORY_LOCK,
            timedelta(seconds=10),
            graces(ENTRIES.values()),
            metrics,
        )

    before = AT - timedelta(minutes=1)
    earlier = make("r0")
    for part in range(0, 40, 10):
        runs = [run_of(e, before, before, None) for e in list(ENTRIES.values())[part : part + 10]]
        list(earlier.record(runs, before))
    return make


def test_a_catch_up_larger_than_a_claim_statement_is_recorded_a_statement_a_step(
    replica: Callable[[str], Recorder],
) -> None:
    # A replica taking a third of a million schedules' shards over recorded their catch-up in
    # one step, every statement of it, and outlasted the shards' leases: the shards moved on.
    r1 = replica("r1")
    now = AT + timedelta(seconds=1)
    r1.owe(list(ENTRIES.values()), now, {}, None, {})
    won: list[str] = []
    for _ in range(4):
        assert r1.owing
        step = r1.settle(now, None)
        assert len(step) == 10
        won += [o.key for o in step]
    assert not r1.owing
    assert r1.settle(now, None) == []
    assert sorted(won) == [occurrence_key(f"s{n:02d}", AT) for n in range(40)]


def test_replicas_catching_up_at_once_each_win_a_share(
    replica: Callable[[str], Recorder],
) -> None:
    # Two replicas boot at once and owe the same catch-up, a statement each in turn. From one
    # start, the first replica's statements won every one and the second's found its rows:
    # all of it was one replica's to publish within the leases.
    now = AT + timedelta(seconds=1)
    won: dict[str, list[str]] = {"r1": [], "r2": []}
    r1, r2 = replica("r1"), replica("r2")
    for r in (r1, r2):
        r.owe(list(ENTRIES.values()), now, {}, None, {})
    while r1.owing or r2.owing:
        won["r1"] += [o.key.split("@")[0] for o in r1.settle(now, None, start=0.0)]
        won["r2"] += [o.key.split("@")[0] for o in r2.settle(now, None, start=0.5)]
    assert sorted(won["r1"]) == [f"s{n:02d}" for n in range(20)]
    assert sorted(won["r2"]) == [f"s{n:02d}" for n in range(20, 40)]


def test_a_catch_up_with_nothing_to_record_looks_up_a_statement_s_worth_a_step(
    replica: Callable[[str], Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing fell since each schedule's last run: a step still looks up one statement's
    # worth of schedules, not the next and the next. A boot at a third of a million
    # schedules with no history looked them all up in one step, 34 statements, and outlasted
    # the shards' leases.
    r1 = replica("r1")
    lookups: list[int] = []
    last_scheduled = r1._store.last_scheduled

    def traced(names: Any) -> Any:
        lookups.append(len(names))
        return last_scheduled(names)

    monkeypatch.setattr(r1._store, "last_scheduled", traced)
    r1.owe(list(ENTRIES.values()), AT - timedelta(seconds=30), {}, None, {})
    for n in range(4):
        assert r1.owing
        assert r1.settle(AT - timedelta(seconds=30), None) == []
        assert lookups == [10] * (n + 1)
    assert not r1.owing


def test_a_claim_s_lease_runs_longer_by_what_the_replica_publishes_before_it(
    replica: Callable[[str], Recorder],
) -> None:
    """A run claimed behind a backlog (what the replica won ahead and has not fenced yet, and
    the statement's own) is leased from its instant for the lease and WRITE_COST for each: at
    a million schedules a healthy replica's third of a burst met its leases at the fence ten
    seconds after the instant, and went through recovery."""
    r1 = replica("r1")
    instant = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    entries = list(ENTRIES.values())
    alone = list(r1.record([run_of(entries[0], instant, instant, None)], instant))
    queued = [run_of(e, instant, instant, None) for e in entries[1:11]]
    behind = [o for part in r1.record(queued, instant, behind=50_000) for o in part]
    assert len(alone) == 1 and len(behind) == 10
    store = r1._store
    with store.database.connect() as conn:
        leases = dict(conn.execute(sa.select(runs.c.id, runs.c.lease_until)).all())
    assert leases[alone[0][0].key] == instant + timedelta(seconds=10) + recorder.WRITE_COST
    assert {leases[o.key] for o in behind} == {
        instant + timedelta(seconds=10) + recorder.WRITE_COST * 50_010
    }
