"""Scheduler replicas in one process for the integration tests, on a clock the test drives.

The ``replicas`` fixture (tests/integration/conftest.py) builds :class:`VoltroScheduler`
instances on one SQLite file and kombu's in-memory broker; :func:`tick` runs one of them at a
fixed instant: SQLite's store shares the scheduler's local clock, so both read that instant.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery

from voltro_beat.exceptions import StoreError
from voltro_beat.scheduler import VoltroScheduler

T0 = datetime(2026, 1, 1, 10, 0, 0, tzinfo=UTC)
EVERY_SECOND = {"s": {"task": "proj.work", "schedule": "* * * * * *"}}


def sec(n: float) -> datetime:
    return T0 + timedelta(seconds=n)


def tick(scheduler: VoltroScheduler, at: datetime) -> float:
    """One tick of ``scheduler`` at ``at``: its clock, and its SQLite store's, read ``at``."""
    scheduler._store.database.clock = lambda: at
    return scheduler.tick()


def fail_once(monkeypatch: pytest.MonkeyPatch, target: Any, method: str) -> list[bool]:
    """Make ``target.method``'s next call raise :class:`StoreError`, and only that one; the
    list returned holds True once it did."""
    real = getattr(target, method)
    failed: list[bool] = []

    def once(*args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(True)
            raise StoreError(f"{method} fails once")
        return real(*args, **kwargs)

    monkeypatch.setattr(target, method, once)
    return failed


def recover(scheduler: VoltroScheduler, at: datetime) -> bool:
    """A recovery sweep's slice of ``scheduler`` at ``at``; whether the sweep goes on."""
    scheduler._store.database.clock = lambda: at
    return scheduler._engine.upkeep.recover()


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
