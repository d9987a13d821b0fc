"""Retention as beat runs it, on SQLite and PostgreSQL: the default horizons (runs 30 days by
scheduled_at, claims 24 hours by claimed_at), ``queued`` kept, a crashed ``started`` row aged
out, an app's registration applied, the boot lines, and one sweep per slot among replicas."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from beat_kit import T0, sec, tick

from voltro_beat import register_retention, retention
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.scheduler import VoltroScheduler
from voltro_beat.store.tables import CLAIMS, RUNS, claims, runs

PRECEDENCE = "An app registration wins over a plugin's, and a plugin's over a framework default."


@pytest.fixture(autouse=True)
def no_registrations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from a process where nothing called register_retention."""
    monkeypatch.setattr(retention, "_REGISTERED", [])


def sweep(replica: VoltroScheduler, now: datetime) -> bool:
    """Run the retention job of ``now``'s slot on ``replica`` to its end; whether it won."""
    sweeper = replica._engine.upkeep.sweeper
    sweeper.start(now)
    won = sweeper.busy
    while sweeper.busy:
        sweeper.step()
    return won


def run_row(key: str, at: datetime, status: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": key,
        "schedule": key.split("@")[0],
        "task": "t",
        "task_id": f"id-{key}",
        "scheduled_at": at,
        "coordination_outcome": "won_lock",
        "status": status,
        **fields,
    }


def claim_row(key: str, scheduled_at: datetime, claimed_at: datetime) -> dict[str, Any]:
    return {
        "id": key,
        "schedule": key.split("@")[0],
        "scheduled_at": scheduled_at,
        "claimed_at": claimed_at,
        "replica": "gone",
    }


def left(url: str, table: sa.Table) -> list[str]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        found = list(conn.execute(sa.select(table.c.id).order_by(table.c.id)).scalars())
    engine.dispose()
    return found


def fill(url: str, rows: dict[sa.Table, list[dict[str, Any]]]) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for table, values in rows.items():
            conn.execute(table.insert(), values)
    engine.dispose()


def test_default_horizons(replicas: Any, url: str) -> None:
    r1 = replicas("r1", voltro_beat_store_url=url)
    r1._store.database.upgrade()
    now = datetime.now(UTC)
    month, day, hour = timedelta(days=30), timedelta(hours=24), timedelta(hours=1)
    fill(
        url,
        {
            runs: [
                run_row("old@1", now - month - hour, "succeeded"),
                # A worker crashed mid-run: never finished, it still ages out.
                run_row("crashed@1", now - month - hour, "started"),
                # Waiting behind a predecessor: never swept.
                run_row("queued@1", now - 2 * month, "queued"),
                # Runs age by scheduled_at, not by when they were claimed.
                run_row("young@1", now - month + hour, "failed", claimed_at=now - 2 * month),
            ],
            claims: [
                claim_row("old@1", now, now - day - hour),
                # Claims age by claimed_at, not by their instant.
                claim_row("young@1", now - month, now - day + hour),
            ],
        },
    )
    assert sweep(r1, now)
    assert left(url, runs) == ["queued@1", "young@1"]
    assert [k for k in left(url, claims) if "@1" in k] == ["young@1"]


def test_an_app_registration_outranks_the_framework(replicas: Any, url: str) -> None:
    # As the Celery app module would, before beat boots.
    register_retention(table=CLAIMS, time_column="claimed_at", ttl=1)
    r1 = replicas("r1", voltro_beat_store_url=url)
    r1._store.database.upgrade()
    now = datetime.now(UTC)
    fill(
        url,
        {
            claims: [
                claim_row("a@1", now, now - timedelta(minutes=70)),
                claim_row("a@2", now, now - timedelta(minutes=50)),
            ]
        },
    )
    assert sweep(r1, now)
    assert [k for k in left(url, claims) if k.startswith("a@")] == ["a@2"]


def test_boot_lines(replicas: Any, caplog: pytest.LogCaptureFixture) -> None:
    register_retention(table=CLAIMS, time_column="claimed_at", ttl=1)
    with caplog.at_level(logging.INFO, logger="voltro_beat"):
        replicas("r1")
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    start = said.index(("INFO", "retention: 2 policy(ies) armed"))
    assert said[start : start + 4] == [
        ("INFO", "retention: 2 policy(ies) armed"),
        ("INFO", f"  {CLAIMS}: 1h by claimed_at (app)"),
        (
            "WARNING",
            f"! {CLAIMS}: two registrations — kept the app's 1h, dropped the framework's 24h. "
            f"{PRECEDENCE}",
        ),
        ("INFO", f"  {RUNS}: 30d by scheduled_at (framework)"),
    ]


def test_a_runs_registration_must_outlive_max_lateness(replicas: Any) -> None:
    register_retention(table=RUNS, time_column="scheduled_at", ttl=12)
    with pytest.raises(ConfigurationError) as info:
        replicas("r1")
    assert (info.value.entry, info.value.field) == ("s", "max_lateness")
    assert "register_retention(source='app')" in str(info.value)


def test_one_sweep_per_slot_among_three_replicas(replicas: Any, url: str) -> None:
    made = [replicas(name, voltro_beat_store_url=url) for name in ("r1", "r2", "r3")]
    made[0]._store.database.upgrade()
    slot = datetime(2026, 1, 1, 10, tzinfo=UTC)
    for n in range(3):
        at = slot + n * retention.SWEEP_EVERY
        # Every replica tries each slot, at different instants within it.
        won = [sweep(r, at + timedelta(minutes=i)) for i, r in enumerate(made)]
        assert won.count(True) == 1
    jobs = [k for k in left(url, claims) if k.startswith(retention.SWEEP_JOB)]
    assert jobs == [retention.slot_key(slot + n * retention.SWEEP_EVERY) for n in range(3)]
    # The sweep's claims never show as runs.
    assert left(url, runs) == []


def test_ticking_replicas_sweep_once_per_slot(replicas: Any, store_url: str) -> None:
    every = {"s": {"task": "proj.work", "schedule": 600.0}}
    made = [replicas(name, schedule=every) for name in ("r1", "r2", "r3")]
    for n in range(0, 7200, 600):  # two hours, every ten minutes, on each replica
        for r in made:
            tick(r, sec(n))
    engine = sa.create_engine(store_url)
    with engine.connect() as conn:
        jobs = conn.execute(
            sa.select(claims.c.id, claims.c.replica)
            .where(claims.c.schedule == retention.SWEEP_JOB)
            .order_by(claims.c.id)
        ).all()
    engine.dispose()
    assert [key for key, _ in jobs] == [
        retention.slot_key(T0),
        retention.slot_key(T0 + retention.SWEEP_EVERY),
    ]


def test_a_sweep_yields_to_occurrences_due_soon(replicas: Any, store_url: str) -> None:
    """Batches run in the idle time between occurrences: none while one is due soon."""
    r1 = replicas("r1")
    r1._store.database.upgrade()
    fill(store_url, {runs: [run_row("old@1", T0 - timedelta(days=31), "succeeded")]})
    tick(r1, sec(0.9))  # boots, wins the slot's sweep; 10:00:01 is due within the margin
    assert r1._engine.upkeep.sweeper.busy
    assert "old@1" in left(store_url, runs)
    tick(r1, sec(1))  # publishes 10:00:01; 10:00:02 is far enough for a batch
    assert "old@1" not in left(store_url, runs)
