"""The scheduler's tick against a real SQLite store and kombu's in-memory broker.

Replicas are VoltroScheduler instances in this process sharing one SQLite file (see
``beat_kit.py``); the clock, the scheduler's and the store's, is driven with fixed instants,
so each scenario is exact and fast. Several real ``celery beat`` processes are exercised in
tests/acceptance and tests/chaos.
"""

from __future__ import annotations

import itertools
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from beat_kit import EVERY_SECOND, drain, fail_once, recover, rows, sec, tick
from celery import Celery

from voltro_beat.engine import RETRY_DELAY
from voltro_beat.exceptions import ConfigurationError, StoreError
from voltro_beat.occurrences import task_id_for
from voltro_beat.scheduler import VoltroScheduler


def test_two_replicas_publish_each_occurrence_once(replicas: Any, store_url: str) -> None:
    r1, r2 = replicas("r1"), replicas("r2")
    for n in range(4):
        tick(r1, sec(n))
        tick(r2, sec(n))
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
        tick(r1, sec(n))
        tick(r2, sec(n))
    assert len(drain(r1.app)) == 2
    assert {r.coordination_outcome for r in rows(store_url).values()} == {"single"}


def test_entry_options_are_kept_and_not_mutated(replicas: Any) -> None:
    options = {"queue": "celery", "priority": 3, "headers": {"mine": "yes"}}
    schedule = {"s": {"task": "proj.work", "schedule": 1.0, "options": options}}
    r1 = replicas("r1", schedule=schedule)
    tick(r1, sec(0))
    tick(r1, sec(1))
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
    # One retry delay each (less the instants the tick itself took).
    assert all(0.5 < d <= RETRY_DELAY.total_seconds() for d in delays)
    assert drain(r1.app) == []
    warnings = [r for r in caplog.records if "store is down" in r.getMessage()]
    assert len(warnings) == 1


def test_late_occurrences_are_missed_not_published(replicas: Any, store_url: str) -> None:
    schedule = {"s": {"task": "proj.work", "schedule": 1.0, "max_lateness": 2}}
    r1 = replicas("r1", schedule=schedule)
    tick(r1, sec(0))
    # Nothing ran for 5 s: 1..2 s are more than 2 s late at 5 s, 3..5 are not.
    tick(r1, sec(5))  # handles 1 s, the first one still due
    tick(r1, sec(5))  # the backlog: 2..5 s in one batch
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
    tick(down, sec(0))
    tick(down, sec(1))
    key = "s@2026-01-01T10:00:01"
    assert rows(store_url)[key].status == "claimed"
    # Another replica's recovery sweep takes the row over once its lease ran out: the fence
    # before the failed write leased it for a publish timeout and a quarter (12.5 s) past its
    # instant.
    up = replicas("up")
    tick(up, sec(5))
    assert key not in [h["voltro_occurrence"] for h in drain(up.app)]
    tick(up, sec(14))
    (headers,) = [h for h in drain(up.app) if h["voltro_occurrence"] == key]
    assert headers["id"] == task_id_for(key)
    assert rows(store_url)[key].status == "published"
    assert rows(store_url)[key].replica == "up"


def test_recovery_takes_chunks_each_within_its_lease(
    replicas: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = {name: {"task": "proj.work", "schedule": "* * * * * *"} for name in "abc"}
    down = replicas("down", broker="redis://127.0.0.1:1/0", schedule=schedule)
    tick(down, sec(0))
    tick(down, sec(1))  # a, b and c @ 10:00:01 stay claimed
    up = replicas("up", schedule=schedule)
    monkeypatch.setattr(up._engine.dispatch, "chunk", 1)
    recover(up, sec(14))  # one chunk after another: all three (leased until 13.5 s)
    assert {r.status for r in rows(store_url).values()} == {"published"}
    # Same again, but each chunk seems to take three seconds: after a slice of the sweep
    # (recovery.SLICE, at most half the publish timeout) it stops taking rows, so none is held
    # past its lease, and none holds the step (nor the shards' leases, renewed between steps),
    # and it goes on at the next step.
    tick(down, sec(2))
    clock = itertools.count(step=3)
    monkeypatch.setattr(up._clock, "monotonic", lambda: next(clock))
    statuses = []
    for _ in range(3):
        assert recover(up, sec(15))
        statuses.append(
            sorted(r.status for k, r in rows(store_url).items() if k.endswith("10:00:02"))
        )
    assert statuses == [
        ["claimed", "claimed", "published"],
        ["claimed", "published", "published"],
        ["published", "published", "published"],
    ]


def test_unpublished_run_past_lateness_is_recorded_missed(replicas: Any, store_url: str) -> None:
    schedule = {"s": {"task": "proj.work", "schedule": 1.0, "max_lateness": 5}}
    down = replicas("down", broker="redis://127.0.0.1:1/0", schedule=schedule)
    tick(down, sec(0))
    tick(down, sec(1))
    up = replicas("up", schedule=schedule)
    tick(up, sec(30))
    first = rows(store_url)["s@2026-01-01T10:00:01"]
    assert (first.status, first.reason) == ("missed", "publish_failed")


def test_catch_up_latest_after_downtime(replicas: Any, store_url: str) -> None:
    schedule = {"s": {"task": "proj.work", "schedule": 5.0}}
    first = replicas("r1", schedule=schedule)
    tick(first, sec(0))
    tick(first, sec(5))
    first.close()
    drain(first.app)
    # Down from 5 s to 27 s: 10 to 25 were never handled; 20 and 25, less than a lease (10 s)
    # old, may still be a live replica's and are published as it would; of the older ones
    # `latest` (the default) publishes none, since a newer one is published.
    second = replicas("r2", schedule=schedule)
    tick(second, sec(27))
    statuses = {k: (r.status, r.reason) for k, r in rows(store_url).items()}
    assert statuses == {
        "s@2026-01-01T10:00:05": ("published", None),
        "s@2026-01-01T10:00:10": ("missed", "catch_up"),
        "s@2026-01-01T10:00:15": ("missed", "catch_up"),
        "s@2026-01-01T10:00:20": ("published", None),
        "s@2026-01-01T10:00:25": ("published", None),
    }
    assert [h["voltro_occurrence"] for h in drain(second.app)] == [
        "s@2026-01-01T10:00:20",
        "s@2026-01-01T10:00:25",
    ]


def _after_downtime(replicas: Any) -> VoltroScheduler:
    """A ``skip`` schedule every second that ran at 0 and 1 s on a replica since stopped; a
    new replica of it, not booted yet."""
    schedule = {"s": {"task": "proj.work", "schedule": 1.0, "catch_up": "skip"}}
    first = replicas("r1", schedule=schedule)
    tick(first, sec(0))
    tick(first, sec(1))
    first.close()
    return replicas("r2", schedule=schedule)  # type: ignore[no-any-return]


def test_a_boot_whose_catch_up_failed_leaves_no_gap(
    replicas: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catch-up at boot meets a store error and the boot is retried 9 s later: the
    catch-up is the one owed at the first attempt, and the timeline starts where it ends, so
    the occurrences between the two attempts are recorded too (published within their
    lateness), none left without a row."""
    second = _after_downtime(replicas)
    failures = fail_once(monkeypatch, second._store, "last_scheduled")
    tick(second, sec(20.5))
    tick(second, sec(29.5))
    tick(second, sec(30.5))
    tick(second, sec(31.5))
    fates = {k: (r.status, r.reason) for k, r in rows(store_url).items()}
    assert failures
    missing = [n for n in range(2, 31) if f"s@2026-01-01T10:00:{n:02}" not in fates]
    assert not missing, fates
    # What fell before the first attempt, less a lease, is the downtime's; after it, not.
    assert fates["s@2026-01-01T10:00:05"] == ("missed", "catch_up")
    assert fates["s@2026-01-01T10:00:25"][0] == "published"


def test_catch_up_logs_one_line_per_schedule(
    replicas: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 19, item 8: 150 occurrences recorded missed make one INFO line, details at DEBUG.
    second = _after_downtime(replicas)
    with caplog.at_level(logging.DEBUG, logger="voltro_beat"):
        tick(second, sec(161))
    recorded = [r for r in caplog.records if " recorded " in r.getMessage()]
    summaries = [r.getMessage() for r in recorded if r.levelno == logging.INFO]
    assert summaries == [
        "voltro_beat: s: 150 occurrences recorded missed (catch_up), "
        "2026-01-01T10:00:02+00:00 .. 2026-01-01T10:02:31+00:00; catch_up=skip"
    ]
    assert len([r for r in recorded if r.levelno == logging.DEBUG]) == 150


def test_a_booting_replica_leaves_a_live_replicas_occurrence_on_time(
    replicas: Any, pg_url: str
) -> None:
    """Finding 8 of issue 18 (failed before the fix: the booting replica recorded the live
    one's next occurrence missed, reason catch_up). Real time on PostgreSQL's clock."""
    schedule = {
        "s": {
            "task": "proj.work",
            "schedule": "* * * * * *",
            "on_overlap": "skip",
            "catch_up": "skip",
        },
    }
    conf = {"voltro_beat_store_url": pg_url}
    live = replicas("live", schedule=schedule, **conf)
    deadline = time.monotonic() + 10
    while True:
        delay = live.tick()
        if [r for r in rows(pg_url).values() if r.status == "published"]:
            break
        assert time.monotonic() < deadline, "the live replica published nothing"
        time.sleep(min(delay, 0.02))
    (first,) = rows(pg_url).values()
    finish(pg_url, first.id)  # so that the overlap policy lets the next one go
    # The live replica claims an overlap schedule at its instant; it has not ticked yet when,
    # 0.3 s after that instant, another replica boots.
    following = first.scheduled_at.replace(tzinfo=UTC) + timedelta(seconds=1)
    time.sleep(max(0.0, (following - datetime.now(UTC)).total_seconds() + 0.3))
    booting = replicas("booting", schedule=schedule, **conf)
    booting.tick()
    live.tick()
    key = f"s@{following.strftime('%Y-%m-%dT%H:%M:%S')}"
    found = rows(pg_url)[key]
    assert (found.status, found.reason) == ("published", None)
    sent = [h["voltro_occurrence"] for h in drain(live.app)]
    assert sent.count(key) == 1


def test_a_booting_replica_does_not_catch_up_a_schedule_a_live_replica_runs(
    replicas: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the simulation (tests/sim, seed 9): catch-up is for downtime, but a replica
    that booted while the live one was held up (here its claims fail for 14 s; in the
    simulation a paused replica held SQLite's write lock) applied the entry's catch_up policy
    and recorded ``missed`` the occurrences the live one was about to publish late. A schedule
    another live replica runs has no downtime: its occurrences are published within their
    lateness, through the gate, as the live one would. Fails without it: s@2..s@5 missed."""
    live = replicas("live")
    tick(live, sec(0))
    tick(live, sec(0.9))
    tick(live, sec(1))  # s @ 10:00:01 published
    monkeypatch.setattr(live._store, "claim", _failing)
    tick(live, sec(15))  # its heartbeat goes through, its claims fail
    booting = replicas("booting")
    tick(booting, sec(16))  # catch_up = latest, publish timeout 10 s
    found = rows(store_url)
    held_up = [f"s@2026-01-01T10:00:{n:02d}" for n in range(2, 6)]
    assert [found[key].status for key in held_up] == ["published"] * 4
    sent = [h["voltro_occurrence"] for h in drain(booting.app)]
    assert set(held_up) <= set(sent)


def _failing(*_: Any, **__: Any) -> Any:
    raise StoreError("store: statement timed out")


def test_claims_are_pruned_on_win(replicas: Any, store_url: str) -> None:
    r1 = replicas("r1")
    tick(r1, sec(0))
    for n in range(1, 200):
        tick(r1, sec(n))
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
    tick(r1, sec(0))
    r1.close()
    r1.close()
    assert r1.tick() == r1.max_interval


def test_entry_lateness_must_be_shorter_than_runs_retention(replicas: Any) -> None:
    schedule = {"slow": {"task": "t", "schedule": 60.0, "max_lateness": 31 * 86400}}
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


def start(store_url: str, key: str, at: datetime) -> None:
    """What the worker's ledger would write when the run starts (again) at ``at``."""
    engine = sa.create_engine(store_url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE _voltro_schedule_runs SET status = 'started', started_at = :t WHERE id = :k"
            ),
            {"t": at.replace(tzinfo=None), "k": key},
        )
    engine.dispose()


def test_overlap_skip(replicas: Any, store_url: str) -> None:
    schedule = {"s": {"task": "proj.work", "schedule": 1.0, "on_overlap": "skip"}}
    r1, r2 = replicas("r1", schedule=schedule), replicas("r2", schedule=schedule)
    for n in range(3):
        tick(r1, sec(n))
        tick(r2, sec(n))
    finish(store_url, "s@2026-01-01T10:00:01")
    tick(r1, sec(3))
    tick(r2, sec(3))
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
        tick(r1, sec(n))
        tick(r2, sec(n))
    key = "s@2026-01-01T10:00:0{}".format
    assert [r.status for r in rows(store_url).values()] == ["published", "queued", "queued"]
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key(1)]
    finish(store_url, key(1))
    tick(r2, sec(4.5))
    tick(r1, sec(4.5))
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key(2)]
    assert rows(store_url)[key(3)].status == "queued"
    finish(store_url, key(2), "failed")
    tick(r1, sec(4.7))
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key(3)]


def test_overlap_timeout_releases_a_stuck_run(replicas: Any, store_url: str) -> None:
    schedule = {
        "s": {"task": "proj.work", "schedule": 10.0, "on_overlap": "skip", "overlap_timeout": 15}
    }
    r1 = replicas("r1", schedule=schedule)
    tick(r1, sec(0))
    tick(r1, sec(10))  # published; no worker ever finishes it
    # published_at is stamped with the wall clock: put it on this test's clock.
    engine = sa.create_engine(store_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE _voltro_schedule_runs SET published_at = claimed_at"))
    engine.dispose()
    tick(r1, sec(20))  # 10 s old: still blocking
    tick(r1, sec(30))  # 20 s old: past the timeout
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
        tick(r1, sec(n))
        if n:  # s@1 is published, then keeps running: a fresh start, never stale
            start(store_url, key(1), sec(n))
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key(1)]
    finish(store_url, key(1))
    tick(r1, sec(15))
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key(2)]
    start(store_url, key(2), sec(15))
    tick(r1, sec(16.5))  # s@2 started 1.5 s ago: it blocks, though scheduled 14.5 s ago
    assert drain(r1.app) == []
    finish(store_url, key(2))
    tick(r1, sec(17))
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key(3)]
    assert {r.status for k, r in rows(store_url).items() if k > key(3)} == {"queued"}


def test_a_queued_run_past_its_lateness_is_missed_while_its_predecessor_runs(
    replicas: Any, store_url: str
) -> None:
    # A task slower than its cadence: the backlog's runs older than max_lateness can never be
    # published. They are recorded missed once past it, not left queued until their turn.
    schedule = {
        "s": {"task": "proj.work", "schedule": 1.0, "on_overlap": "queue", "max_lateness": 3}
    }
    r1 = replicas("r1", schedule=schedule)
    key = "s@2026-01-01T10:00:{:02}".format
    for n in range(9):
        tick(r1, sec(n))
        if n:  # s@1 is published, then keeps running
            start(store_url, key(1), sec(n))
    found = rows(store_url)
    assert {k: (r.status, r.reason) for k, r in found.items() if k != key(1)} == {
        **{key(n): ("missed", "late") for n in range(2, 5)},
        **{key(n): ("queued", None) for n in range(5, 9)},
    }
    finish(store_url, key(1))
    tick(r1, sec(9))
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key(1), key(6)]
    assert rows(store_url)[key(5)].reason == "late"


def test_catch_up_respects_the_overlap_policy(replicas: Any, store_url: str) -> None:
    schedule = {"s": {"task": "proj.work", "schedule": 5.0, "on_overlap": "skip"}}
    first = replicas("r1", schedule=schedule)
    tick(first, sec(0))
    tick(first, sec(5))  # published; its worker never reports back
    first.close()
    second = replicas("r2", schedule=schedule)
    tick(second, sec(27))
    statuses = {k: (r.status, r.reason) for k, r in rows(store_url).items()}
    assert statuses["s@2026-01-01T10:00:15"] == ("missed", "catch_up")
    assert statuses["s@2026-01-01T10:00:20"] == ("skipped", "overlap")
    assert statuses["s@2026-01-01T10:00:25"] == ("skipped", "overlap")


def test_occurrences_are_claimed_ahead_and_published_at_their_instant(
    replicas: Any, store_url: str
) -> None:
    r1, r2 = replicas("r1"), replicas("r2")
    for r in (r1, r2):
        tick(r, sec(0))
    lead = r1._engine.timeline.lead.total_seconds()
    assert 0 < lead < 1
    tick(r1, sec(1 - lead / 2))  # within the lead: claimed, not yet published
    tick(r2, sec(1 - lead / 2))  # lost the claim: nothing to publish later
    assert drain(r1.app) == []
    (run,) = rows(store_url).values()
    assert (run.id, run.status, run.replica) == ("s@2026-01-01T10:00:01", "claimed", "r1")
    tick(r2, sec(1))
    assert drain(r1.app) == []
    tick(r1, sec(1))
    (headers,) = drain(r1.app)
    assert headers["voltro_occurrence"] == "s@2026-01-01T10:00:01"
    assert rows(store_url)["s@2026-01-01T10:00:01"].status == "published"


def test_a_run_claimed_ahead_is_not_recovered_before_its_lease_ends(replicas: Any) -> None:
    r1, up = replicas("r1"), replicas("up")
    tick(r1, sec(0))
    # Claims and fences 10:00:01 ahead: leased for a publish timeout and a quarter past its
    # instant, until 10:00:13.5; then killed.
    tick(r1, sec(0.9))
    recover(up, sec(13.45))
    assert drain(up.app) == []
    recover(up, sec(13.55))
    assert [h["voltro_occurrence"] for h in drain(up.app)] == ["s@2026-01-01T10:00:01"]


def test_a_replica_stopped_between_mark_and_settle_is_settled_not_resent(
    replicas: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after its marks and before its settle, a replica leaves its sent runs
    ``claimed`` with a publish time: the others' recovery never sends them again, and records
    them ``published`` once a lease passed since the mark."""
    r1, up = replicas("r1"), replicas("up")
    tick(r1, sec(0))
    tick(r1, sec(0.9))
    monkeypatch.setattr(r1._store, "settle", lambda keys: None)  # killed right before it
    tick(r1, sec(1))
    key = "s@2026-01-01T10:00:01"
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key]
    assert rows(store_url)[key].status == "claimed" and rows(store_url)[key].published_at
    recover(up, sec(10.5))  # a lease after the claim, less than a lease after the mark
    assert rows(store_url)[key].status == "claimed"
    recover(up, sec(11.5))
    assert drain(up.app) == []
    assert rows(store_url)[key].status == "published"


def test_a_paused_replica_does_not_send_what_was_taken_over(replicas: Any, store_url: str) -> None:
    r1, up = replicas("r1"), replicas("up")
    tick(r1, sec(0))
    tick(r1, sec(0.9))  # claims 10:00:01 ahead, then is paused for thirteen seconds
    recover(up, sec(14))  # its lease (until 13.5 s) ran out: another replica sends it
    assert [h["voltro_occurrence"] for h in drain(up.app)] == ["s@2026-01-01T10:00:01"]
    tick(r1, sec(14.5))  # resumes: the fence refuses 10:00:01
    tick(r1, sec(14.5))  # the backlog, 2..14 s
    published = [h["voltro_occurrence"] for h in drain(r1.app)]
    assert published == [f"s@2026-01-01T10:00:{n:02}" for n in range(2, 15)]
    assert rows(store_url)["s@2026-01-01T10:00:01"].replica == "up"


def test_a_slow_tick_does_not_publish_what_was_taken_over(
    replicas: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 9, hole 1: time spent earlier in the tick (here a retention sweep of 12 s, during
    which another replica's recovery republishes the run) must not count as inside the lease."""
    r1, up = replicas("r1"), replicas("up")
    tick(r1, sec(0))
    tick(r1, sec(0.9))  # claims 10:00:01 ahead: leased until 10:00:13.5

    def slow_sweep(now: datetime) -> None:
        r1._store.database.clock = lambda: sec(15)  # the sweep took 14 s...
        recover(up, sec(14.5))  # ...and meanwhile the run was taken over and sent

    monkeypatch.setattr(r1._engine.upkeep.sweeper, "start", slow_sweep)
    r1._engine.upkeep.next_retention = sec(1)
    tick(r1, sec(1))
    sent = [h["voltro_occurrence"] for h in drain(r1.app)]
    assert sent.count("s@2026-01-01T10:00:01") == 1


def three_fenced_ahead(replicas: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A replica holding a, b and c @ 10:00:01, claimed and fenced ahead (leased until
    10:00:13.5), that writes one message per broker write."""
    schedule = {name: {"task": "proj.work", "schedule": "* * * * * *"} for name in "abc"}
    r1 = replicas("r1", schedule=schedule)
    monkeypatch.setattr(r1._engine.dispatch, "chunk", 1)
    tick(r1, sec(0))
    tick(r1, sec(0.9))
    return r1


def test_a_publish_slower_than_the_lease_leaves_the_rest_to_recovery(
    replicas: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The first write ends 13 s later: the others' leases (until 13.5) ran out meanwhile, so
    # the fence keeps them for recovery.
    r1 = three_fenced_ahead(replicas, monkeypatch)
    publish = r1._engine.publisher.publish

    def slow(messages: Any) -> dict[int, str]:
        refused = publish(messages)
        r1._store.database.clock = lambda: sec(14)
        return refused

    monkeypatch.setattr(r1._engine.publisher, "publish", slow)
    with caplog.at_level(logging.WARNING, logger="voltro_beat"):
        tick(r1, sec(1))
    said = [r.getMessage() for r in caplog.records]
    assert sum("1 claimed runs no longer held by this replica" in m for m in said) == 2
    # The recovery sweep of the same tick took them over: each went out once.
    sent = [h["voltro_occurrence"] for h in drain(r1.app) if h["voltro_occurrence"].endswith("01")]
    assert sorted(sent) == [f"{name}@2026-01-01T10:00:01" for name in "abc"]


def test_each_chunk_is_marked_once_the_broker_took_it(
    replicas: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 9, hole 2: a chunk is marked right after its write, not at the end of the
    instant, so a later chunk's slow write leaves nothing sent for recovery to resend."""
    r1 = three_fenced_ahead(replicas, monkeypatch)
    publish = r1._engine.publisher.publish
    seen: list[int] = []

    def watching(messages: Any) -> dict[int, str]:
        now = rows(store_url)
        marked = [k for k, r in now.items() if k.endswith("10:00:01") and r.published_at]
        # A mark stamps the publish time and ends the lease (no recovery takes the run over);
        # the status follows once the instant's writes are done.
        assert all(now[k].lease_until is None and now[k].status == "claimed" for k in marked)
        seen.append(len(marked))
        return publish(messages)

    monkeypatch.setattr(r1._engine.publisher, "publish", watching)
    tick(r1, sec(1))
    # Before each write, every chunk but the one still being marked was marked: at most two
    # are ever written and unmarked.
    assert len(seen) == 3
    assert all(count >= n - 1 for n, count in enumerate(seen))
    assert (
        sorted(rows(store_url)[f"{x}@2026-01-01T10:00:01"].status for x in "abc")
        == ["published"] * 3
    )


def test_close_in_the_middle_of_a_write_marks_it_and_writes_nothing_more(
    replicas: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery's SIGTERM handler runs the scheduler's close() wherever the tick happens to be
    (then raises SystemExit; beat's service closes again once the tick unwound). The write
    under way is still marked (else recovery sends it again), and the tick, should it go on,
    writes nothing more: the rest stays claimed until the close that follows the tick."""
    r1 = three_fenced_ahead(replicas, monkeypatch)
    publish = r1._engine.publisher.publish

    def stopped_while_writing(messages: Any) -> dict[int, str]:
        refused = publish(messages)
        r1.close()
        return refused

    monkeypatch.setattr(r1._engine.publisher, "publish", stopped_while_writing)
    tick(r1, sec(1))
    sent = [h["voltro_occurrence"] for h in drain(r1.app)]
    assert len(sent) == 1
    now = {k: r for k, r in rows(store_url).items() if k.endswith("10:00:01")}
    assert now[sent[0]].status == "published"
    left = [r for k, r in now.items() if k != sent[0]]
    assert [(r.status, r.published_at) for r in left] == [("claimed", None)] * 2


def test_close_asked_in_the_middle_of_a_tick_waits_for_its_end(
    replicas: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the simulation (tests/sim, seeds 16 and 24 before the fix): Celery's SIGTERM
    handler ran the whole close() on top of the tick, here in the middle of the claim's
    transaction. On SQLite its own statements then waited for the write lock the tick held,
    for the busy timeout, and every other replica and worker waited behind it (a worker's
    ledger write failed). close() now only halts the tick's writes; the close that comes once
    the tick unwound (beat's service, after SystemExit) does the rest."""
    monkeypatch.setattr("voltro_beat.store.sqlite.SQLITE_BUSY_MS", 2_000)
    r1 = replicas("r1")
    claim = r1._store.claim
    waited: list[float] = []

    def stopped_while_claiming(*args: Any, **kwargs: Any) -> Any:
        with r1._store.database.connect() as conn, conn.begin():
            conn.execute(sa.text("UPDATE _voltro_beat_replicas SET pid = pid"))  # the lock
            started = time.monotonic()
            r1.close()  # Celery's handler; SystemExit would follow
            waited.append(time.monotonic() - started)
            raise SystemExit()

    tick(r1, sec(0))  # boots; the occurrence at 10:00:01 is claimed at the next tick
    monkeypatch.setattr(r1._store, "claim", stopped_while_claiming)
    with pytest.raises(SystemExit):
        tick(r1, sec(0.9))
    assert waited[0] < 1.0
    assert "r1" in replicas_in(store_url)  # not closed yet
    monkeypatch.setattr(r1._store, "claim", claim)
    r1.close()  # beat's service, once the tick unwound
    assert "r1" not in replicas_in(store_url)


def test_close_sleeps_until_its_claimed_runs_are_due(
    replicas: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the simulation (tests/sim, seed 18): close() waited for the runs it claimed
    ahead in a loop that slept until the next thing due, claim times included, which close
    makes none of: with one already past it slept 0 s again and again until close_wait ran
    out, a busy loop (and on the simulation's virtual clock, one that never ended)."""
    r1 = replicas("r1")
    tick(r1, sec(0))
    tick(r1, sec(0.9))  # s @ 10:00:01 claimed ahead
    now = [sec(0.95)]
    r1._store.database.clock = lambda: now[0]
    monkeypatch.setattr(type(r1._engine.timeline), "next", property(lambda _: sec(0.5)))
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += timedelta(seconds=seconds)

    monkeypatch.setattr(r1._engine.dispatch.runner, "sleep", sleep)
    r1.close()
    assert 0 < len(slept) <= 2
    assert sum(slept) == pytest.approx(0.05, abs=0.01)
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == ["s@2026-01-01T10:00:01"]


def replicas_in(store_url: str) -> list[str]:
    engine = sa.create_engine(store_url)
    with engine.connect() as conn:
        found = list(conn.execute(sa.text("SELECT name FROM _voltro_beat_replicas")).scalars())
    engine.dispose()
    return found


def test_close_publishes_the_occurrences_it_claimed_ahead(replicas: Any, store_url: str) -> None:
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    r1 = replicas("r1", schedule={"once": {"task": "proj.work", "schedule": at}})
    tick(r1, at - timedelta(seconds=0.2))  # claimed ahead, its instant still to come
    key = "once@" + at.strftime("%Y-%m-%dT%H:%M:%S")
    assert rows(store_url)[key].status == "claimed"
    r1._store.database.clock = lambda: datetime.now(UTC)
    r1.close()
    assert datetime.now(UTC) >= at
    assert [h["voltro_occurrence"] for h in drain(r1.app)] == [key]
    assert rows(store_url)[key].status == "published"


def test_both_scheduler_paths_name_the_voltro_scheduler() -> None:
    from importlib.metadata import entry_points

    from voltro_beat.scheduler import Scheduler

    (voltro,) = entry_points(group="celery.beat_schedulers", name="voltro")
    # ``-S voltro`` and ``-S voltro_beat.scheduler:Scheduler``: the one that exits at boot on
    # a configuration error (tests/acceptance/test_bad_configuration.py).
    assert voltro.load() is Scheduler
    assert issubclass(Scheduler, VoltroScheduler)


def test_a_burst_larger_than_a_claim_statement_is_claimed_a_statement_a_tick(
    replicas: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cold start's burst is claimed late: a tick claims one statement's worth, publishes
    # what it won as its instant has come, and asks to run again at once, its heartbeat
    # between the statements. In one tick, a claim of 100,000 at three replicas outlasted the
    # first leases; at a million schedules in cluster coordination, the shards' leases.
    from voltro_beat.engine import recorder

    monkeypatch.setattr(recorder, "BATCH", 2)
    schedule = {f"s{n}": {"task": "proj.work", "schedule": 1.0} for n in range(6)}
    r1 = replicas("r1", schedule=schedule)
    tick(r1, sec(0.5))
    calls: list[str] = []
    for name in ("claim", "fence"):
        method = getattr(r1._store, name)

        def traced(*args: Any, _name: str = name, _method: Any = method, **kw: Any) -> Any:
            calls.append(_name)
            return _method(*args, **kw)

        monkeypatch.setattr(r1._store, name, traced)
    waits = []
    for _ in range(3):
        waits.append(tick(r1, sec(1.2)))
        assert calls[-2:] == ["claim", "fence"]
    assert calls == ["claim", "fence"] * 3
    assert waits[:2] == [0, 0] and waits[2] > 0
    assert sorted(h["voltro_occurrence"] for h in drain(r1.app)) == [
        f"s{n}@2026-01-01T10:00:01" for n in range(6)
    ]


def test_a_catch_up_larger_than_a_claim_statement_is_recorded_a_statement_a_tick(
    replicas: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A catch-up goes a claim statement a tick, as a burst does. In one tick, a replica
    # taking a third of a million schedules' shards over (in cluster coordination) recorded
    # every statement of their catch-up and outlasted the shards' leases: they moved on.
    from voltro_beat.engine import recorder

    schedule = {f"s{n}": {"task": "proj.work", "schedule": 5.0} for n in range(6)}
    first = replicas("r1", schedule=schedule)
    tick(first, sec(0))
    tick(first, sec(5))
    first.close()
    drain(first.app)
    monkeypatch.setattr(recorder, "BATCH", 2)
    second = replicas("r2", schedule=schedule)
    claims: list[int] = []
    claim = second._store.claim

    def traced(runs: Any, **kw: Any) -> Any:
        claims.append(len(runs))
        return claim(runs, **kw)

    monkeypatch.setattr(second._store, "claim", traced)
    # Down from 5 s to 22 s: 10, 15 and 20 of each of six schedules, 18 runs; 15 and 20, less
    # than a lease (10 s) old, are published as a live replica would.
    waits = []
    for n in range(9):
        waits.append(tick(second, sec(22)))
        assert claims == [2] * (n + 1)
    assert waits[:8] == [0] * 8 and waits[8] > 0
    fates = {k: r.status for k, r in rows(store_url).items()}
    for n in range(6):
        assert [fates[f"s{n}@2026-01-01T10:00:{at:02}"] for at in (10, 15, 20)] == [
            "missed",
            "published",
            "published",
        ]
    assert sorted(h["voltro_occurrence"] for h in drain(second.app)) == [
        f"s{n}@2026-01-01T10:00:{at}" for n in range(6) for at in (15, 20)
    ]


def test_message_templates_are_built_a_slice_at_a_time(
    replicas: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Built in one step, 100,000 templates held beat's first tick (its "ready") for seconds:
    # a step builds them for at most PREPARE_SLICE and asks for the next step at once.
    from voltro_beat.engine import upkeep

    monkeypatch.setattr(upkeep, "PREPARE_SLICE", 0.0)
    schedule = {f"s{n}": {"task": "proj.work", "schedule": 60.0} for n in range(3)}
    r1 = replicas("r1", schedule=schedule)
    built = r1._engine.publisher.templates.prepared
    assert [tick(r1, sec(0.5)), len(built)] == [0, 1]
    assert [tick(r1, sec(0.6)), len(built)] == [0, 2]
    assert tick(r1, sec(0.7)) > 0
    assert sorted(built) == ["s0", "s1", "s2"]


def test_a_message_template_is_built_once_its_schedule_is_due_within_prepare_ahead(
    replicas: Any,
) -> None:
    # A replica holding 100,000 schedules of which few are due soon spent seconds of CPU and
    # the memory of every template at boot: the hourly one's waits for its hour to be near.
    from voltro_beat.engine.upkeep import PREPARE_AHEAD

    schedule = {
        "minutely": {"task": "proj.work", "schedule": 60.0},
        "hourly": {"task": "proj.work", "schedule": "0 * * * *"},
    }
    r1 = replicas("r1", schedule=schedule)
    built = r1._engine.publisher.templates.prepared
    for n in range(4):
        tick(r1, sec(0.5 + n))
    assert sorted(built) == ["minutely"]
    near = (sec(3600) - PREPARE_AHEAD).timestamp() - sec(0).timestamp()
    for n in range(10):  # (what the minutely one missed meanwhile is recorded first)
        tick(r1, sec(near - 5 + n / 2))
    assert sorted(built) == ["minutely"]
    tick(r1, sec(near))
    assert sorted(built) == ["hourly", "minutely"]
