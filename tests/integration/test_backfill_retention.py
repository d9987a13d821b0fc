"""A backfill never publishes an occurrence twice, even once the runs retention swept its row
(issue 18, finding 5), and a replica with a longer retention or lateness than the sweeper's
never claims an occurrence older than a swept row. Real PostgreSQL and Redis; the command
through click's runner."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from voltro_beat.cli import main
from voltro_beat.occurrences import Occurrence
from voltro_beat.runs import Run
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.database import Database
from voltro_beat.store.tables import RUNS

BROKER_DB = 11


@pytest.fixture
def broker_url(redis_url: str) -> str:
    return f"{redis_url}/{BROKER_DB}"


@pytest.fixture
def broker(broker_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(broker_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def app_module(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pg_url: str,
    broker_url: str,
    broker: redis.Redis,
) -> Iterator[str]:
    """A Celery app on the PostgreSQL store keeping run rows for an hour."""
    name = f"backfill_app_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        "from celery import Celery\n"
        f"app = Celery({name!r}, broker={broker_url!r})\n"
        f"app.conf.voltro_beat_store_url = {pg_url!r}\n"
        "app.conf.voltro_beat_runs_ttl_hours = 1\n"
        "app.conf.voltro_beat_max_lateness = 1800\n"
        "app.conf.beat_schedule = {'m': {'task': 'proj.work', 'schedule': '* * * * *'}}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    database = Database.open(pg_url)
    database.upgrade()
    database.dispose()
    yield name
    sys.modules.pop(name, None)


def backfill(app: str, since: datetime, until: datetime) -> Result:
    window = ["--since", since.isoformat(), "--until", until.isoformat()]
    return CliRunner().invoke(main, ["backfill", "m", *window, "--yes", "-A", app])


def test_a_backfill_rerun_after_the_sweep_publishes_nothing(
    app_module: str, pg_url: str, broker: redis.Redis
) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    since, until = now - timedelta(minutes=50), now - timedelta(minutes=45)
    first = backfill(app_module, since, until)
    assert first.exit_code == 0, first.output
    assert broker.llen("celery") == 5
    # Ten minutes on, the hourly sweep (runs kept 1 h) removes these five rows.
    database = Database.open(pg_url)
    store = BeatStore(database, replica="sweeper")
    assert store.delete_expired(RUNS, "scheduled_at", until) == 5
    again = backfill(app_module, since, until)
    database.dispose()
    # Before the fix: "5 to publish", published again.
    assert again.exit_code == 1, again.output
    assert "older than the run table keeps its rows" in again.output
    assert broker.llen("celery") == 5


def test_a_backfill_older_than_the_retention_is_refused(
    app_module: str, broker: redis.Redis
) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    out = backfill(app_module, now - timedelta(minutes=70), now - timedelta(minutes=65))
    assert out.exit_code == 1
    assert "voltro_beat_runs_ttl_hours = 1" in out.output
    assert broker.llen("celery") == 0


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_no_claim_older_than_a_swept_run_goes_in(
    dialect: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A sweeper with a shorter runs retention removed a row; a replica whose lateness reaches
    further back must not claim that occurrence again (it failed before the watermark)."""
    url = (
        f"sqlite:///{tmp_path / 'store.sqlite3'}"
        if dialect == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    database = Database.open(url)
    database.upgrade()
    store = BeatStore(database, replica="late")
    now = datetime.now(UTC)
    old, young = now - timedelta(hours=3), now - timedelta(hours=1)
    first = Run(Occurrence.of("s", old), "t")
    assert store.claim_external(first, lease=timedelta(seconds=10))
    assert store.delete_expired(RUNS, "scheduled_at", now - timedelta(hours=2)) == 1
    older = Run(Occurrence.of("s", old - timedelta(minutes=1)), "t")
    assert not store.claim_external(
        Run(Occurrence.of("s", old), "t", reason="backfill"), lease=timedelta(seconds=10)
    )
    assert not store.claim_external(older, lease=timedelta(seconds=10))
    assert store.claim_external(Run(Occurrence.of("s", young), "t"), lease=timedelta(seconds=10))
    database.dispose()
