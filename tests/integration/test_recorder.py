"""The recorder on a real store: replicas that claim one burst at once share it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from voltro_beat.coordination import Coordination
from voltro_beat.engine import recorder
from voltro_beat.engine.guard import Guard
from voltro_beat.engine.recorder import Recorder, graces, run_of
from voltro_beat.metrics import Metrics
from voltro_beat.schedules import parse_entries
from voltro_beat.store.beat import BeatStore

AT = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)


def test_replicas_claiming_one_burst_at_once_each_win_a_share(
    stores: Callable[..., BeatStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two replicas claim the same burst of four statements, a statement each in turn. From
    # one start, the first replica's statements won every batch and the second's found its
    # rows: the whole burst was one replica's to publish within the leases (at 100,000
    # schedules and three replicas on two cores, 30,000 of it went through recovery).
    monkeypatch.setattr(recorder, "BATCH", 10)
    entries = {
        e.name: e
        for e in parse_entries(
            {f"s{n:02d}": {"task": "t", "schedule": 60.0} for n in range(40)},
            tz="UTC",
            max_lateness=timedelta(hours=1),
        )
    }
    now = AT - timedelta(seconds=5)
    runs = [run_of(e, AT, now, None) for e in entries.values()]

    def replica(name: str) -> Recorder:
        store = stores(name)
        metrics = Metrics()
        return Recorder(
            store,
            entries,
            Guard(store, entries, {}, metrics),
            Coordination.ADVISORY_LOCK,
            timedelta(seconds=10),
            graces(entries.values()),
            metrics,
        )

    first = replica("r1").record(runs, now, start=0.0)
    second = replica("r2").record(runs, now, start=0.5)
    won: dict[str, list[str]] = {"r1": [], "r2": []}
    for _ in range(4):
        won["r1"] += [o.key for o in next(first)]
        won["r2"] += [o.key for o in next(second)]
    assert sorted(o.split("@")[0] for o in won["r1"]) == [f"s{n:02d}" for n in range(20)]
    assert sorted(o.split("@")[0] for o in won["r2"]) == [f"s{n:02d}" for n in range(20, 40)]
