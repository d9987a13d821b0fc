"""Fixtures of the integration tests: scheduler replicas on one SQLite store (beat_kit.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from beat_kit import EVERY_SECOND, drain
from celery import Celery

from voltro_beat.scheduler import VoltroScheduler


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
        scheduler._store.database.clock = lambda: datetime.now(UTC)
        scheduler.close()
