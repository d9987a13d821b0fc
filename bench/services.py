"""The local services the benchmark uses, and cleaning them between runs.

Everything here is dedicated to the benchmark: Redis dbs 9 (broker) and 10 (RedBeat), and the
PostgreSQL database ``voltro_bench``, so tests running at the same time are not disturbed.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis

from voltro_beat.store.tables import VERSION_TABLE, metadata

#: Every table voltro_beat's migrations create, and their version table.
VOLTRO_TABLES = (*metadata.tables, VERSION_TABLE)


@dataclass(frozen=True)
class Services:
    broker_url: str = "redis://127.0.0.1:6379/9"
    redbeat_url: str = "redis://127.0.0.1:6379/10"
    queue: str = "celery"
    pg_admin: str = "postgresql://root@127.0.0.1:5432/postgres"
    pg_db: str = "voltro_bench"
    voltro_store: str = "postgresql+psycopg://root@127.0.0.1:5432/voltro_bench"

    @property
    def pg_url(self) -> str:
        """libpq URL of the bench database (for psycopg, without the SQLAlchemy driver)."""
        return self.pg_admin.rsplit("/", 1)[0] + "/" + self.pg_db

    @property
    def sqlite_path(self) -> Path | None:
        if self.voltro_store.startswith("sqlite"):
            return Path(self.voltro_store.split(":///", 1)[1])
        return None


def ensure_database(svc: Services) -> None:
    """Create the bench database once; never touches any other database."""
    with psycopg.connect(svc.pg_admin, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (svc.pg_db,))
        if found.fetchone() is None:
            conn.execute(f'CREATE DATABASE "{svc.pg_db}"')


def clean(svc: Services) -> None:
    """Empty the broker and RedBeat dbs and drop voltro_beat's tables (or its SQLite file)."""
    for url in (svc.broker_url, svc.redbeat_url):
        client = redis.Redis.from_url(url)
        try:
            client.flushdb()
        finally:
            client.close()
    if svc.sqlite_path is not None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{svc.sqlite_path}{suffix}").unlink(missing_ok=True)
        return
    with psycopg.connect(svc.pg_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {', '.join(VOLTRO_TABLES)} CASCADE")


def pg_transactions(svc: Services) -> tuple[int, int, float] | None:
    """Committed + rolled back transactions so far in the bench database (a round-trip
    proxy), rows written (inserted, updated or deleted), and milliseconds its backends spent
    executing statements (``active_time``)."""
    if svc.sqlite_path is not None:
        return None
    with psycopg.connect(svc.pg_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback, tup_inserted + tup_updated + tup_deleted,"
            " active_time FROM pg_stat_database WHERE datname = %s",
            (svc.pg_db,),
        ).fetchone()
    return (int(row[0]), int(row[1]), float(row[2])) if row else None


def voltro_scheduler() -> tuple[str | None, str]:
    """The ``-S`` value for voltro_beat, or None and the reason it cannot run yet."""
    try:
        importlib.import_module("voltro_beat.scheduler")
    except Exception as exc:  # any import failure means: skip the column, say why
        return None, f"import voltro_beat.scheduler failed: {type(exc).__name__}: {exc}"
    names = {ep.name for ep in importlib.metadata.entry_points(group="celery.beat_schedulers")}
    if "voltro" in names:
        return "voltro", "entry point voltro"
    return "voltro_beat.scheduler:VoltroScheduler", "dotted path (entry point not installed)"


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def python_path(*extra: Path) -> str:
    parts = [str(p) for p in extra] + [str(repo_root())]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(parts)
