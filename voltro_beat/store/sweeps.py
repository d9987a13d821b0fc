"""Retention's writes: the sweep's turn in the claims table, and its batched deletes.

A sweep of the runs raises the watermark below which claims are refused, in the same
transaction (guarantee 4).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa

from voltro_beat.exceptions import ConfigurationError
from voltro_beat.status import KEPT_BY_RETENTION
from voltro_beat.store.database import Database
from voltro_beat.store.tables import RUNS, claims, metadata, runs, watermarks

#: Rows deleted per retention transaction: short enough that the claim path never waits long
#: behind it (SQLite has one writer at a time).
SWEEP_BATCH = 5_000


class Sweeps:
    """Retention's writes; a base of :class:`~voltro_beat.store.beat.BeatStore`, which holds
    the state."""

    database: Database
    replica: str
    #: Tables of the app's retention policies, as read from the database.
    _reflected: dict[str, sa.Table]

    def claim_job(self, job: str, at: datetime, key: str) -> bool:
        """Claim ``key``, the run of voltro_beat's own ``job`` (the retention sweep) at
        ``at``, in the claims table alone: the gate every occurrence goes through decides
        which replica does it, and no run row is written (it is not a task)."""
        stmt = (
            self.database.dialect.insert(claims)
            .values(
                id=key,
                schedule=job,
                scheduled_at=at,
                claimed_at=self.database.now(),
                replica=self.replica,
            )
            .on_conflict_do_nothing()
            .returning(claims.c.id)
        )
        with self.database.connect() as conn, conn.begin():
            return conn.execute(stmt).first() is not None

    def delete_expired(self, table: str, time_column: str, before: datetime) -> int:
        """Delete at most :data:`SWEEP_BATCH` rows of ``table`` whose ``time_column`` is older
        than ``before``, in one short transaction; return how many went (fewer than a batch:
        none is left). The runs table keeps its ``queued`` rows whatever the bound: they still
        have to be published or recorded missed."""
        with self.database.connect() as conn, conn.begin():
            target = self._table(conn, table)
            column = target.c.get(time_column)
            if column is None:
                raise ConfigurationError(
                    f"table {table!r} has no column {time_column!r}", field="time_column"
                )
            condition = column < sa.bindparam("before", before, type_=column.type)
            if target is runs:
                condition = sa.and_(
                    condition, runs.c.status.not_in([s.value for s in KEPT_BY_RETENTION])
                )
            key = list(target.primary_key.columns)
            if not key:
                raise ConfigurationError(
                    f"table {table!r} has no primary key to delete by in batches", field="table"
                )
            doomed = sa.select(*key).where(condition).limit(SWEEP_BATCH)
            where = (
                key[0].in_(doomed.scalar_subquery())
                if len(key) == 1
                else sa.tuple_(*key).in_(doomed)
            )
            if target is not runs:
                return int(conn.execute(sa.delete(target).where(where)).rowcount)
            # The run row is the long fence (guarantee 4): in the same transaction, no claim
            # of an occurrence as old as one swept goes in any more, whatever the time column
            # and the retention of the replica that claims.
            swept = list(
                conn.execute(sa.delete(runs).where(where).returning(runs.c.scheduled_at)).scalars()
            )
            if swept:
                self._raise_watermark(conn, max(swept) + timedelta(microseconds=1))
            return len(swept)

    def _raise_watermark(self, conn: sa.Connection, before: datetime) -> None:
        """Refuse from now on the claims of occurrences older than ``before`` (never lowered)."""
        insert = self.database.dialect.insert(watermarks).values(name=RUNS, before=before)
        newer = self.database.dialect.greatest(watermarks.c.before, insert.excluded.before)
        conn.execute(insert.on_conflict_do_update(index_elements=["name"], set_={"before": newer}))

    def _table(self, conn: sa.Connection, name: str) -> sa.Table:
        """voltro_beat's own table ``name``, or an app's, read from the database once."""
        found = metadata.tables.get(name)
        if found is None:
            found = self._reflected.get(name)
        if found is None:
            try:
                found = sa.Table(name, sa.MetaData(), autoload_with=conn)
            except sa.exc.NoSuchTableError:
                raise ConfigurationError(f"no table {name!r} in the store", field="table") from None
            self._reflected[name] = found
        return found
