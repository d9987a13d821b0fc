"""What operators read from the store (the ``voltro-beat`` command, the admin views): never on
a firing path."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from voltro_beat.status import Status
from voltro_beat.store.database import Database
from voltro_beat.store.tables import RUNS, runs

#: The distinct schedule names of the run table, in order, by a loose index scan: one probe of
#: ``ix_voltro_runs_schedule_at`` per name instead of a DISTINCT over every row (a million
#: rows of a few schedules). Plain SQL that PostgreSQL and SQLite both run, so that the Django
#: admin can send it through Django's connection too.
SCHEDULE_NAMES_SQL = f"""
WITH RECURSIVE names(name) AS (
    SELECT MIN(schedule) FROM {RUNS}
    UNION ALL
    SELECT (SELECT MIN(schedule) FROM {RUNS} WHERE schedule > names.name)
    FROM names WHERE names.name IS NOT NULL
)
SELECT name FROM names WHERE name IS NOT NULL
"""


def recent_runs(
    database: Database,
    *,
    schedule: str | None = None,
    status: Status | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """The newest run rows (by scheduled instant), optionally of one schedule or status."""
    stmt = sa.select(runs).order_by(runs.c.scheduled_at.desc(), runs.c.id.desc()).limit(limit)
    if schedule is not None:
        stmt = stmt.where(runs.c.schedule == schedule)
    if status is not None:
        stmt = stmt.where(runs.c.status == status.value)
    with database.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(stmt)]


def schedule_names(database: Database) -> list[str]:
    """Every schedule that has a run row, in order (:data:`SCHEDULE_NAMES_SQL`)."""
    with database.connect() as conn:
        return list(conn.execute(sa.text(SCHEDULE_NAMES_SQL)).scalars())
