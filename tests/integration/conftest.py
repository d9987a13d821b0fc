"""Fixtures of the integration tests: scheduler replicas on one SQLite store (beat_kit.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from beat_kit import EVERY_SECOND, drain
from celery import Celery

from voltro_beat.scheduler import VoltroScheduler
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.database import Database
from voltro_beat.store.tables import VERSION_TABLE, metadata


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'voltro.sqlite3'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store on each dialect: a SQLite file, and the module's PostgreSQL database (its
    tables dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.sqlite3'}"
        return
    base = request.getfixturevalue("postgres_url")
    yield base
    drop_tables(base)


@pytest.fixture
def stores(url: str) -> Iterator[Callable[..., BeatStore]]:
    """``stores(replica="r1")``: beat's store as that replica, on ``url`` (upgraded)."""
    made: list[BeatStore] = []

    def make(replica: str = "r1") -> BeatStore:
        store = BeatStore(Database.open(url), replica=replica)
        store.database.upgrade()
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def pg_url(postgres_url: str) -> Iterator[str]:
    """The module's PostgreSQL database, its tables dropped afterwards (for what only
    PostgreSQL has)."""
    yield postgres_url
    drop_tables(postgres_url)


def drop_tables(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for table in (*metadata.tables, VERSION_TABLE):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
    engine.dispose()


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
