"""The scheduler's tick against a real SQLite store and kombu's in-memory broker.

Replicas are VoltroScheduler instances in this process sharing one SQLite file; the clock is
driven by passing fixed instants to the tick, so each scenario is exact and fast. Several
real ``celery beat`` processes are exercised in tests/acceptance.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery

from voltro_beat.exceptions import ConfigurationError
from voltro_beat.occurrences import task_id_for
from voltro_beat.scheduler import RETRY_DELAY, VoltroScheduler

T0 = datetime(2026, 1, 1, 10, 0, 0, tzinfo=UTC)
EVERY_SECOND = {"s": {"task": "proj.work", "schedule": "* * * * * *"}}


def sec(n: float) -> datetime:
    return T0 + timedelta(seconds=n)


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'voltro.sqlite3'}"


@pytest.fixture
def replicas(store_url: str) -> Iterator[Any]:
    """Build schedulers (replicas) on the shared store; close them all afterwards."""
    made: list[VoltroScheduler] = []
    # kombu's in-memory broker is one per process: start from an empty queue.
    drain(Celery("drain", broker="memory://", set_as_current=False))

    def make(
        name: str = "r1", *, broker: str = "memory://", schedule: Any = None, **conf: Any
    ) -> VoltroScheduler:
        app = Celery(f"proj-{name}", broker=broker, set_as_current=False)
        app.conf.update(
            {
                "voltro_beat_store_url": store_url,
                "voltro_beat_replica": name,
                "beat_schedule": EVERY_SECOND if schedule is None else schedule,
                "result_expires": None,
                **conf,
            }
        )
        scheduler = VoltroScheduler(app)
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        scheduler.close()


def drain(app: Celery) -> list[dict[str, Any]]:
    """Every message on the default queue of the in-memory broker, as headers."""
    headers = []
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue("celery")
        while True:
            try:
                message = queue.get(timeout=0.05)
            except queue.Empty:
                break
            headers.append(message.headers)
            message.ack()
    return headers


def rows(store_url: str) -> dict[str, Any]:
    engine = sa.create_engine(store_url)
    with engine.connect() as conn:
        result = conn.execute(sa.text("SELECT * FROM _voltro_schedule_runs ORDER BY id"))
        found = {row.id: row for row in result}
    engine.dispose()
    return found


def test_two_replicas_publish_each_occurrence_once(replicas: Any, store_url: str) -> None:
    r1, r2 = replicas("r1"), replicas("r2")
    for n in range(4):
        r1._tick(sec(n))
        r2._tick(sec(n))
    published = drain(r1.app)
    keys = [h["voltro_occurrence"] for h in published]
    assert sorted(keys) == [f"s@2026-01-01T10:00:0{n}" for n in (1, 2, 3)]
    for h in published:
        assert h["id"] == task_id_for(h["voltro_occurrence"])
        assert h["periodic_task_name"] == "s"
    recorded = rows(store_url)
    assert set(recorded) == set(keys)
    assert {r.coordination_outcome for r in recorded.values()} == {"won_lock"}
    assert {r.status for r in recorded.values()} == {"published"}


def test_single_coordination_still_fenced_by_the_run_row(replicas: Any, store_url: str) -> None:
    r1 = replicas("r1", voltro_beat_coordination="single")
    r2 = replicas("r2", voltro_beat_coordination="single")
    for n in range(3):
        r1._tick(sec(n))
        r2._tick(sec(n))
    assert len(drain(r1.app)) == 2
    assert {r.coordination_outcome for r in rows(store_url).values()} == {"single"}


def test_entry_options_are_kept_and_not_mutated(replicas: Any) -> None:
    options = {"queue": "celery", "priority": 3, "headers": {"mine": "yes"}}
    schedule = {"s": {"task": "proj.work", "schedule": 1.0, "options": options}}
    r1 = replicas("r1", schedule=schedule)
    r1._tick(sec(0))
    r1._tick(sec(1))
    (headers,) = drain(r1.app)
    assert headers["mine"] == "yes"
    assert headers["voltro_occurrence"] == "s@2026-01-01T10:00:01"
    assert options == {"queue": "celery", "priority": 3, "headers": {"mine": "yes"}}


def test_store_down_fails_closed_and_warns_once(
    replicas: Any, caplog: pytest.LogCaptureFixture
) -> None:
    r1 = replicas("r1", voltro_beat_store_url="postgresql+psycopg://root@127.0.0.1:1/none")
    with caplog.at_level(logging.WARNING, logger="voltro_beat"):
        delays = [r1.tick() for _ in range(3)]
    assert delays == [RETRY_DELAY] * 3
    assert drain(r1.app) == []
    warnings = [r for r in caplog.records if "store is down" in r.getMessage()]
    assert len(warnings) == 1


def test_late_occurrences_are_missed_not_published(replicas: Any, store_url: str) -> None:
    schedule = {"s": {"task": "proj.work", "schedule": 1.0, "max_lateness": 2}}
    r1 = replicas("r1", schedule=schedule)
    r1._tick(sec(0))
    # Nothing ran for 5 s: 1..2 s are more than 2 s late at 5 s, 3..5 are not.
    r1._tick(sec(5))  # handles 1 s, the first one still due
    r1._tick(sec(5))  # the backlog: 2..5 s in one batch
    recorded = rows(store_url)
    assert {k: r.status for k, r in recorded.items()} == {
        "s@2026-01-01T10:00:01": "missed",
        "s@2026-01-01T10:00:02": "missed",
        "s@2026-01-01T10:00:03": "published",
        "s@2026-01-01T10:00:04": "published",
        "s@2026-01-01T10:00:05": "published",
    }
    assert recorded["s@2026-01-01T10:00:01"].reason == "late"
    assert len(drain(r1.app)) == 3


def test_broker_down_leaves_claimed_then_recovered_with_same_task_id(
    replicas: Any, store_url: str
) -> None:
    down = replicas("down", broker="redis://127.0.0.1:1/0")
    down._tick(sec(0))
    down._tick(sec(1))
    key = "s@2026-01-01T10:00:01"
    assert rows(store_url)[key].status == "claimed"
    # Another replica's recovery sweep takes the row over once publish_timeout (10 s) passed.
    up = replicas("up")
    up._tick(sec(5))
    assert key not in [h["voltro_occurrence"] for h in drain(up.app)]
    up._tick(sec(12))
    (headers,) = [h for h in drain(up.app) if h["voltro_occurrence"] == key]
    assert headers["id"] == task_id_for(key)
    assert rows(store_url)[key].status == "published"
    assert rows(store_url)[key].replica == "up"


def test_recovery_takes_chunks_each_within_its_lease(
    replicas: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = {name: {"task": "proj.work", "schedule": "* * * * * *"} for name in "abc"}
    down = replicas("down", broker="redis://127.0.0.1:1/0", schedule=schedule)
    down._tick(sec(0))
    down._tick(sec(1))  # a, b and c @ 10:00:01 stay claimed
    up = replicas("up", schedule=schedule)
    monkeypatch.setattr("voltro_beat.scheduler.PUBLISH_CHUNK", 1)
    up._recover(sec(12))  # one chunk after another: all three
    assert {r.status for r in rows(store_url).values()} == {"published"}
    # Same again, but each chunk seems to take three seconds: after half the publish
    # timeout the sweep stops taking rows, so none is held past its lease.
    down._tick(sec(2))
    clock = itertools.count(step=3)
    monkeypatch.setattr(
        "voltro_beat.scheduler.time", SimpleNamespace(monotonic=lambda: next(clock))
    )
    up._recover(sec(13))
    statuses = [r.status for k, r in rows(store_url).items() if k.endswith("10:00:02")]
    assert sorted(statuses) == ["claimed", "claimed", "published"]


def test_unpublished_run_past_lateness_is_recorded_missed(replicas: Any, store_url: str) -> None:
    schedule = {"s": {"task": "proj.work", "schedule": 1.0, "max_lateness": 5}}
    down = replicas("down", broker="redis://127.0.0.1:1/0", schedule=schedule)
    down._tick(sec(0))
    down._tick(sec(1))
    up = replicas("up", schedule=schedule)
    up._tick(sec(30))
    first = rows(store_url)["s@2026-01-01T10:00:01"]
    assert (first.status, first.reason) == ("missed", "publish_failed")


def test_catch_up_latest_after_downtime(replicas: Any, store_url: str) -> None:
    schedule = {"s": {"task": "proj.work", "schedule": 5.0}}
    first = replicas("r1", schedule=schedule)
    first._tick(sec(0))
    first._tick(sec(5))
    first.close()
    drain(first.app)
    # Down from 5 s to 22 s: 10, 15 and 20 were never handled.
    second = replicas("r2", schedule=schedule)
    second._tick(sec(22))
    statuses = {k: (r.status, r.reason) for k, r in rows(store_url).items()}
    assert statuses == {
        "s@2026-01-01T10:00:05": ("published", None),
        "s@2026-01-01T10:00:10": ("missed", "catch_up"),
        "s@2026-01-01T10:00:15": ("missed", "catch_up"),
        "s@2026-01-01T10:00:20": ("published", None),
    }
    assert [h["voltro_occurrence"] for h in drain(second.app)] == ["s@2026-01-01T10:00:20"]


def test_claims_are_pruned_on_win(replicas: Any, store_url: str) -> None:
    r1 = replicas("r1")
    r1._tick(sec(0))
    for n in range(1, 200):
        r1._tick(sec(n))
    engine = sa.create_engine(store_url)
    with engine.connect() as conn:
        claims = conn.execute(sa.text("SELECT count(*) FROM _voltro_schedule_claims")).scalar()
        runs = conn.execute(sa.text("SELECT count(*) FROM _voltro_schedule_runs")).scalar()
    engine.dispose()
    # A one-second cadence keeps about a minute of claims; the runs stay for the retention.
    assert runs == 199
    assert 55 <= claims <= 65


def test_bad_entry_fails_at_construction(replicas: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        replicas("r1", schedule={"bad": {"task": "t", "schedule": "61 * * * *"}})
    assert "'bad'" in str(info.value)


def test_lazy_instance_does_no_io(store_url: str) -> None:
    app = Celery("lazy", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.update(
        voltro_beat_store_url="postgresql+psycopg://root@127.0.0.1:1/none",
        beat_schedule=EVERY_SECOND,
    )
    scheduler = VoltroScheduler(app, lazy=True)
    assert "coordination advisory_lock" in scheduler.info
    scheduler.close()
    scheduler.close()


def test_close_is_idempotent_and_stops_ticking(replicas: Any) -> None:
    r1 = replicas("r1")
    r1._tick(sec(0))
    r1.close()
    r1.close()
    assert r1.tick() == r1.max_interval


def test_entry_lateness_must_be_shorter_than_runs_retention(replicas: Any) -> None:
    schedule = {"slow": {"task": "t", "schedule": 60.0, "max_lateness": 8 * 86400}}
    with pytest.raises(ConfigurationError) as info:
        replicas("r1", schedule=schedule)
    assert (info.value.entry, info.value.field) == ("slow", "max_lateness")


def finish(store_url: str, key: str, status: str = "succeeded") -> None:
    """What the worker's ledger would write when the run ends."""
    engine = sa.create_engine(store_url)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE _voltro_schedule_runs SET status = :s WHERE id = :k"),
            {"s": status, "k": key},
        )
    engine.dispose()


def test_overlap_skip(replicas: Any, store_url: str) -> None:
    schedule = {"s": {"task": "proj.work", "schedule": 1.0, "on_overlap": "skip"}}
    r1, r2 = replicas("r1", schedule=schedule), replicas("r2", schedule=schedule)
    for n in range(3):
        r1._tick(sec(n))
        r2._tick(sec(n))
    finish(store_url, "s@2026-01-01T10:00:01")
    r1._tick(sec(3))
    r2._tick(sec(3))
    statuses = {k: (r.status, r.reason) for k, r in rows(store_url).items()}
    assert statuses == {
        "s@2026-01-01T10:00:01": ("succeeded", None),
        "s@2026-01-01T10:00:02": ("skipped", "overlap"),
        "s@2026-01-01T10:00:03": ("published", None),
    }
    assert len(drain(r1.app)) == 2


def test_overlap_queue_publishes_in_order_once_the_predecessor_ends(
    replicas: Any, store_url: str
) -> None:
    schedule = {"s": {"task": "proj.work", "schedule": 1.0, "on_overlap": "queue"}}
    r1, r2 = replicas("r1", schedule=schedule), replicas("r2", schedule=schedule)
    for n in range(4):
        r1._tick(sec(n))
        r2._tick(sec(n))
    key = "s@2026-01-01T10:00:0{}".format
    assert [r.status for r in rows(store_url).values()] == ["published", "queued", "queued"]
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key(1)]
    finish(store_url, key(1))
    r2._tick(sec(4.5))
    r1._tick(sec(4.5))
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key(2)]
    assert rows(store_url)[key(3)].status == "queued"
    finish(store_url, key(2), "failed")
    r1._tick(sec(4.7))
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key(3)]


def test_overlap_timeout_releases_a_stuck_run(replicas: Any, store_url: str) -> None:
    schedule = {
        "s": {"task": "proj.work", "schedule": 10.0, "on_overlap": "skip", "overlap_timeout": 15}
    }
    r1 = replicas("r1", schedule=schedule)
    r1._tick(sec(0))
    r1._tick(sec(10))  # published; no worker ever finishes it
    # published_at is stamped with the wall clock: put it on this test's clock.
    engine = sa.create_engine(store_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE _voltro_schedule_runs SET published_at = claimed_at"))
    engine.dispose()
    r1._tick(sec(20))  # 10 s old: still blocking
    r1._tick(sec(30))  # 20 s old: past the timeout
    found = rows(store_url)
    assert (found["s@2026-01-01T10:00:10"].status, found["s@2026-01-01T10:00:10"].reason) == (
        "published",
        "overlap_timeout",
    )
    assert found["s@2026-01-01T10:00:20"].status == "skipped"
    assert found["s@2026-01-01T10:00:30"].status == "published"


def test_overlap_queue_backlog_older_than_the_timeout(replicas: Any, store_url: str) -> None:
    # The overlap timeout (5 s) bounds how long a running run blocks, not how far back a
    # queue's backlog reaches: that is max_lateness. Runs queued longer than the timeout are
    # still promoted oldest first, and a promoted run that started recently still blocks.
    schedule = {
        "s": {"task": "proj.work", "schedule": 1.0, "on_overlap": "queue", "overlap_timeout": 5}
    }
    r1 = replicas("r1", schedule=schedule)
    key = "s@2026-01-01T10:00:{:02}".format
    for n in range(15):
        r1._tick(sec(n))  # s@1 published (stamped with the wall clock: never stale here)
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key(1)]
    finish(store_url, key(1))
    r1._tick(sec(15))
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key(2)]
    engine = sa.create_engine(store_url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE _voltro_schedule_runs SET status = 'started', started_at = :t WHERE id = :k"
            ),
            {"t": sec(15).replace(tzinfo=None), "k": key(2)},
        )
    engine.dispose()
    r1._tick(sec(16.5))  # s@2 started 1.5 s ago: it blocks, though scheduled 14.5 s ago
    assert drain(r1.app) == []
    finish(store_url, key(2))
    r1._tick(sec(17))
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key(3)]
    assert {r.status for k, r in rows(store_url).items() if k > key(3)} == {"queued"}


def test_catch_up_respects_the_overlap_policy(replicas: Any, store_url: str) -> None:
    schedule = {"s": {"task": "proj.work", "schedule": 5.0, "on_overlap": "skip"}}
    first = replicas("r1", schedule=schedule)
    first._tick(sec(0))
    first._tick(sec(5))  # published; its worker never reports back
    first.close()
    second = replicas("r2", schedule=schedule)
    second._tick(sec(22))
    statuses = {k: (r.status, r.reason) for k, r in rows(store_url).items()}
    assert statuses["s@2026-01-01T10:00:15"] == ("missed", "catch_up")
    assert statuses["s@2026-01-01T10:00:20"] == ("skipped", "overlap")


def test_occurrences_are_claimed_ahead_and_published_at_their_instant(
    replicas: Any, store_url: str
) -> None:
    r1, r2 = replicas("r1"), replicas("r2")
    for r in (r1, r2):
        r._tick(sec(0))
    lead = r1._lead.total_seconds()
    assert 0 < lead < 1
    r1._tick(sec(1 - lead / 2))  # within the lead: claimed, not yet published
    r2._tick(sec(1 - lead / 2))  # lost the claim: nothing to publish later
    assert drain(r1.app) == []
    (run,) = rows(store_url).values()
    assert (run.id, run.status, run.replica) == ("s@2026-01-01T10:00:01", "claimed", "r1")
    r2._tick(sec(1))
    assert drain(r1.app) == []
    r1._tick(sec(1))
    (headers,) = drain(r1.app)
    assert headers["voltro_occurrence"] == "s@2026-01-01T10:00:01"
    assert rows(store_url)["s@2026-01-01T10:00:01"].status == "published"


def test_a_run_claimed_ahead_is_not_recovered_before_its_instant(replicas: Any) -> None:
    r1 = replicas("r1")
    r1._tick(sec(0))
    r1._tick(sec(0.9))  # claims 10:00:01 ahead, then stops ticking (killed)
    timeout = r1._settings.publish_timeout
    store = r1._store
    assert store.release_stale(before=sec(0.95), now=sec(0.95) + timeout, limit=10) == []
    (run,) = store.release_stale(before=sec(1.05), now=sec(1.05) + timeout, limit=10)
    assert run.key == "s@2026-01-01T10:00:01"


def test_a_paused_replica_leaves_its_expired_claims_to_recovery(
    replicas: Any, store_url: str
) -> None:
    r1 = replicas("r1")
    r1._tick(sec(0))
    r1._tick(sec(0.9))  # claims 10:00:01 ahead, then is paused for six seconds
    r1._tick(sec(7))  # past its lease: 10:00:01 may have been taken over meanwhile
    r1._tick(sec(7))  # the backlog: 3..7 s
    published = [h["voltro_occurrence"] for h in drain(r1.app)]
    assert published == [f"s@2026-01-01T10:00:0{n}" for n in range(2, 8)]
    assert rows(store_url)["s@2026-01-01T10:00:01"].status == "claimed"
    (run,) = r1._store.release_stale(before=sec(1.5), now=sec(11.5), limit=10)
    assert run.key == "s@2026-01-01T10:00:01"


def test_a_publish_slower_than_the_lease_leaves_the_rest_to_recovery(
    replicas: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = {name: {"task": "proj.work", "schedule": "* * * * * *"} for name in "abc"}
    r1 = replicas("r1", schedule=schedule)
    r1._tick(sec(0))
    r1._tick(sec(0.9))  # claims a, b and c @ 10:00:01 ahead
    # One message per broker write, and each write seems to take three seconds: the lease
    # (half of the 10 s publish timeout) runs out after the first.
    monkeypatch.setattr("voltro_beat.scheduler.PUBLISH_CHUNK", 1)
    clock = itertools.count(step=3)
    fake_time = SimpleNamespace(monotonic=lambda: next(clock))
    monkeypatch.setattr("voltro_beat.scheduler.time", fake_time)
    r1._tick(sec(1))
    (headers,) = drain(r1.app)
    statuses = {k: r.status for k, r in rows(store_url).items() if k.endswith("10:00:01")}
    assert statuses[headers["voltro_occurrence"]] == "published"
    assert sorted(statuses.values()) == ["claimed", "claimed", "published"]


def test_close_publishes_the_occurrences_it_claimed_ahead(replicas: Any, store_url: str) -> None:
    r1 = replicas("r1")
    deadline = datetime.now(UTC) + timedelta(seconds=5)
    while not r1._ready and datetime.now(UTC) < deadline:
        r1._tick(datetime.now(UTC))
    (at, key, _, _), *_ = r1._ready
    assert at > datetime.now(UTC)  # claimed, its instant still to come
    r1.close()
    assert datetime.now(UTC) >= at
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key]
    assert rows(store_url)[key].status == "published"


def test_both_scheduler_paths_name_the_voltro_scheduler() -> None:
    from importlib.metadata import entry_points

    from voltro_beat.scheduler import Scheduler

    (voltro,) = entry_points(group="celery.beat_schedulers", name="voltro")
    assert voltro.load() is VoltroScheduler
    assert Scheduler is VoltroScheduler  # ``-S voltro_beat.scheduler:Scheduler`` still works
