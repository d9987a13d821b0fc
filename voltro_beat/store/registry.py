"""The replica registry table: who runs, since when, on which clock, with which schedules.

Each beat replica upserts its row at boot and refreshes ``last_seen`` with a heartbeat; the
heartbeat's answer is also a reading of the database's clock (:mod:`voltro_beat.clock`).
:mod:`voltro_beat.replicas` decides what the rows mean.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from voltro_beat.replicas import Replica
from voltro_beat.store.database import Database
from voltro_beat.store.tables import replicas

_SUMMARY = (
    replicas.c.name,
    replicas.c.host,
    replicas.c.pid,
    replicas.c.version,
    replicas.c.started_at,
    replicas.c.last_seen,
    replicas.c.clock_offset,
    replicas.c.settings,
    replicas.c.schedules_digest,
    replicas.c.schedules_revision,
)


class Registry:
    """The rows of ``_voltro_beat_replicas`` in ``database``."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def register(self, me: Replica, schedules: Mapping[str, str]) -> None:
        """Write (or replace) this replica's row; ``started_at`` and ``last_seen`` are now on
        the database's clock as the statement runs, and ``me``'s own are ignored."""
        now = self.database.statement_clock()
        row = {
            "name": me.name,
            "host": me.host,
            "pid": me.pid,
            "version": me.version,
            "started_at": now,
            "last_seen": now,
            "clock_offset": me.clock_offset,
            "settings": json.dumps(dict(me.settings), sort_keys=True),
            "schedules": json.dumps(dict(schedules), sort_keys=True),
            "schedules_digest": me.schedules_digest,
            "schedules_revision": me.schedules_revision,
        }
        stmt = self.database.dialect.insert(replicas).values(row)
        stmt = stmt.on_conflict_do_update(
            index_elements=[replicas.c.name],
            set_={k: stmt.excluded[k] for k in row if k != "name"},
        )
        with self.database.connect() as conn, conn.begin():
            conn.execute(stmt)

    def heartbeat(
        self, name: str, clock_offset: float | None, within: timedelta, revision: int = 0
    ) -> tuple[tuple[datetime, float, float], list[Replica]] | None:
        """Refresh ``last_seen`` and read who else is live (in one round trip on PostgreSQL).

        ``revision``: the newest revision of the schedules table this replica applied.
        Returns a reading of the database's clock (the instant and the monotonic instants
        around the round trip, see ``Database.read_clock``) and the replicas seen within
        ``within``, oldest start first (without their schedules); None if this replica's row
        is gone (swept while it was away: register again).
        """
        beat = (
            sa.update(replicas)
            .where(replicas.c.name == name)
            .values(
                last_seen=self.database.statement_clock(),
                clock_offset=clock_offset,
                schedules_revision=revision,
            )
        )
        found = self.database.dialect.heartbeat(beat, lambda now: _live(now, within))
        if found is None:
            return None
        reading, rows = found
        return reading, [Replica.of(row) for row in rows if row.name is not None]

    def live(self, within: timedelta) -> list[Replica]:
        """The replicas seen within ``within``, oldest start first (without their schedules)."""
        return self._read(_live(self.database.now(), within))

    def everyone(self) -> list[Replica]:
        """Every registered replica, the one seen last first."""
        return self._read(sa.select(*_SUMMARY).order_by(replicas.c.last_seen.desc()))

    def schedules(self, names: Sequence[str]) -> dict[str, dict[str, str]]:
        """The schedule definitions (name -> hash) of each replica in ``names``."""
        stmt = sa.select(replicas.c.name, replicas.c.schedules).where(
            replicas.c.name.in_(sa.bindparam("names", expanding=True))
        )
        with self.database.connect() as conn:
            return {
                name: json.loads(text) for name, text in conn.execute(stmt, {"names": list(names)})
            }

    def forget_one(self, name: str) -> None:
        """Delete replica ``name``'s row (it stopped)."""
        with self.database.connect() as conn, conn.begin():
            conn.execute(sa.delete(replicas).where(replicas.c.name == name))

    def forget(self, before: datetime) -> int:
        """Delete the rows of replicas not seen since ``before``."""
        with self.database.connect() as conn, conn.begin():
            return conn.execute(sa.delete(replicas).where(replicas.c.last_seen < before)).rowcount

    def _read(self, stmt: sa.Select[Any]) -> list[Replica]:
        with self.database.connect() as conn:
            return [Replica.of(row) for row in conn.execute(stmt)]


def _live(now: Any, within: timedelta) -> sa.Select[Any]:
    """The replicas seen within ``within`` before ``now``, oldest start first."""
    return (
        sa.select(*_SUMMARY)
        .where(replicas.c.last_seen >= now - within)
        .order_by(replicas.c.started_at, replicas.c.name)
    )
