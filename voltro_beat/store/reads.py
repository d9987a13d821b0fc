"""What operators read from the store (the ``voltro-beat`` command): never on a firing path."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from voltro_beat.status import Status
from voltro_beat.store.database import Database
from voltro_beat.store.tables import runs


def recent_runs(
    database: Database,
    *,
    schedule: str | None = None,
    status: Status | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """The newest run rows (by scheduled instant), optionally of one schedule or status."""
    stmt = sa.select(runs).order_by(runs.c.scheduled_at.desc(), runs.c.id).limit(limit)
    if schedule is not None:
        stmt = stmt.where(runs.c.schedule == schedule)
    if status is not None:
        stmt = stmt.where(runs.c.status == status.value)
    with database.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(stmt)]
