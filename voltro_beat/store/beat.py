"""Beat's side of the store: claims, run rows, recovery and retention.

Every write of the firing path is one statement or one short transaction per batch; every
driver error leaves here as :class:`~voltro_beat.exceptions.StoreError` (guarantee 5: the
scheduler fails closed on it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from voltro_beat.coordination import Coordination
from voltro_beat.occurrences import Occurrence
from voltro_beat.status import KEPT_BY_RETENTION, Reason, Status
from voltro_beat.store import postgresql
from voltro_beat.store.database import SQLITE_CHUNK, Database, chunks
from voltro_beat.store.tables import LIVE, claims, runs

#: Rows deleted per retention transaction.
SWEEP_BATCH = 10_000


class BeatStore:
    """What a beat replica reads and writes, as replica ``replica`` of ``database``."""

    def __init__(self, database: Database, *, replica: str) -> None:
        self.database = database
        self.replica = replica

    @property
    def display_url(self) -> str:
        return self.database.display_url

    # -- claim path --------------------------------------------------------------------

    def claim(
        self,
        occurrences: Sequence[Occurrence],
        *,
        coordination: Coordination,
        now: datetime,
        prune: Mapping[str, timedelta] | None = None,
    ) -> set[str]:
        """Record ``occurrences``; return the keys this replica won.

        Under a coordination that claims, each key first goes through the claims table
        (guarantee 2); either way the run row's primary key is the last fence (guarantee 4).
        Claims and run rows are one transaction (guarantee 3). ``prune`` maps a schedule to
        how long its claims outlive a newer win: the winner deletes the older ones.
        """
        if not occurrences:
            return set()
        prune = prune or {}
        if self.database.dialect == "postgresql":
            return self._claim_postgresql(occurrences, coordination, now, prune)
        return self._claim_sqlite(occurrences, coordination, now, prune)

    def _claim_postgresql(
        self,
        occurrences: Sequence[Occurrence],
        coordination: Coordination,
        now: datetime,
        prune: Mapping[str, timedelta],
    ) -> set[str]:
        rows = []
        for o in occurrences:
            grace = prune.get(o.schedule)
            rows.append(
                [
                    o.key,
                    o.schedule,
                    o.task,
                    o.task_id,
                    o.scheduled_at.isoformat(),
                    o.status,
                    o.reason,
                    None if grace is None else (o.scheduled_at - grace).isoformat(),
                ]
            )
        params = {
            "rows": json.dumps(rows),
            "now": now,
            "replica": self.replica,
            "outcome": coordination.outcome,
        }
        sql = postgresql.CLAIM if coordination.claims else postgresql.RECORD
        # Autocommit: one statement needs no BEGIN and COMMIT round trips.
        with self.database.connect(autocommit=True) as conn:
            return {row[0] for row in conn.execute(sa.text(sql), params)}

    def _claim_sqlite(
        self,
        occurrences: Sequence[Occurrence],
        coordination: Coordination,
        now: datetime,
        prune: Mapping[str, timedelta],
    ) -> set[str]:
        won: set[str] = set()
        with self.database.connect() as conn, conn.begin():
            for chunk in chunks(occurrences, SQLITE_CHUNK):
                if coordination.claims:
                    rows = [
                        {
                            "id": o.key,
                            "schedule": o.schedule,
                            "scheduled_at": o.scheduled_at,
                            "claimed_at": now,
                            "replica": self.replica,
                        }
                        for o in chunk
                    ]
                    stmt = (
                        sqlite_insert(claims)
                        .values(rows)
                        .on_conflict_do_nothing()
                        .returning(claims.c.id)
                    )
                    gated = {row[0] for row in conn.execute(stmt)}
                    chunk = [o for o in chunk if o.key in gated]
                    if not chunk:
                        continue
                stmt = (
                    sqlite_insert(runs)
                    .values([self._run_row(o, coordination, now) for o in chunk])
                    .on_conflict_do_nothing()
                    .returning(runs.c.id)
                )
                recorded = {row[0] for row in conn.execute(stmt)}
                won |= recorded
                prunes = [
                    {"s": o.schedule, "b": o.scheduled_at - prune[o.schedule]}
                    for o in chunk
                    if o.key in recorded and o.schedule in prune
                ]
                if coordination.claims and prunes:
                    conn.execute(
                        sa.delete(claims).where(
                            claims.c.schedule == sa.bindparam("s"),
                            claims.c.scheduled_at
                            < sa.bindparam("b", type_=claims.c.claimed_at.type),
                        ),
                        prunes,
                    )
        return won

    def _run_row(self, o: Occurrence, coordination: Coordination, now: datetime) -> dict[str, Any]:
        return {
            "id": o.key,
            "schedule": o.schedule,
            "task": o.task,
            "task_id": o.task_id,
            "scheduled_at": o.scheduled_at,
            "coordination_outcome": coordination.outcome,
            "status": o.status,
            "reason": o.reason,
            "replica": self.replica,
            "claimed_at": now,
        }

    def mark_published(self, keys: Iterable[str], *, now: datetime) -> None:
        """Stamp ``published_at``; a row still ``claimed`` becomes ``published``.

        The worker may already have moved the row on (started, even succeeded): its status
        stays.
        """
        keys = list(keys)
        if not keys:
            return
        if self.database.dialect == "postgresql":
            with self.database.connect(autocommit=True) as conn:
                conn.execute(
                    sa.text(postgresql.MARK_PUBLISHED), {"keys": json.dumps(keys), "now": now}
                )
            return
        stmt = (
            sa.update(runs)
            .where(runs.c.id.in_(sa.bindparam("keys", expanding=True)))
            .values(
                published_at=now,
                status=sa.case(
                    (runs.c.status == Status.CLAIMED, Status.PUBLISHED.value),
                    else_=runs.c.status,
                ),
            )
        )
        self._write_in_chunks(stmt, keys)

    def mark_missed(
        self, keys: Iterable[str], *, reason: Reason, waiting: Status = Status.CLAIMED
    ) -> None:
        """Record runs still ``waiting`` (claimed or queued) as missed, saying why."""
        keys = list(keys)
        if not keys:
            return
        stmt = (
            sa.update(runs)
            .where(runs.c.id.in_(sa.bindparam("keys", expanding=True)), runs.c.status == waiting)
            .values(status=Status.MISSED.value, reason=reason.value)
        )
        self._write_in_chunks(stmt, keys)

    # -- overlap ------------------------------------------------------------------------

    def live_runs(self, schedules: Sequence[str], *, since: datetime) -> list[Occurrence]:
        """Unfinished runs (in flight or queued) of ``schedules`` scheduled at or after
        ``since``, each with when it last moved."""
        stmt = sa.select(
            runs.c.id,
            runs.c.schedule,
            runs.c.task,
            runs.c.task_id,
            runs.c.scheduled_at,
            runs.c.status,
            runs.c.reason,
            sa.func.coalesce(runs.c.started_at, runs.c.published_at, runs.c.claimed_at),
        ).where(
            runs.c.schedule.in_(sa.bindparam("names", expanding=True)),
            runs.c.scheduled_at >= since,
            # The index predicate's own text, so that the planner can use the partial index
            # even with a generic plan.
            sa.text(LIVE),
        )
        found: list[Occurrence] = []
        with self.database.connect() as conn:
            for chunk in chunks(list(schedules), SQLITE_CHUNK):
                for key, name, task, task_id, at, status, reason, moved in conn.execute(
                    stmt, {"names": chunk}
                ):
                    # coalesce() loses the column type on SQLite: parse the text back.
                    since_ = _instant(moved)
                    found.append(
                        Occurrence(key, name, task, task_id, at, Status(status), reason, since_)
                    )
        return found

    def note_overlap_timeout(self, keys: Iterable[str]) -> None:
        """Say in these live rows that they stopped blocking their schedule."""
        keys = list(keys)
        if keys:
            stmt = (
                sa.update(runs)
                .where(runs.c.id.in_(sa.bindparam("keys", expanding=True)), runs.c.reason.is_(None))
                .values(reason=Reason.OVERLAP_TIMEOUT.value)
            )
            self._write_in_chunks(stmt, keys)

    def promote(self, key: str, *, now: datetime) -> bool:
        """Turn the ``queued`` run ``key`` into a claimed one of this replica; False if lost."""
        stmt = (
            sa.update(runs)
            .where(runs.c.id == key, runs.c.status == Status.QUEUED)
            .values(status=Status.CLAIMED.value, claimed_at=now, replica=self.replica)
        )
        with self.database.connect() as conn, conn.begin():
            return bool(conn.execute(stmt).rowcount)

    def _write_in_chunks(self, stmt: sa.Executable, keys: list[str]) -> None:
        batches = list(chunks(keys, SQLITE_CHUNK))
        if self.database.dialect == "postgresql" and len(batches) == 1:
            # One statement needs no transaction of its own: autocommit saves the BEGIN and
            # COMMIT round trips on the firing path.
            with self.database.connect(autocommit=True) as conn:
                conn.execute(stmt, {"keys": batches[0]})
            return
        with self.database.connect() as conn, conn.begin():
            for batch in batches:
                conn.execute(stmt, {"keys": batch})

    # -- recovery -----------------------------------------------------------------------

    def release_stale(self, *, before: datetime, now: datetime, limit: int) -> list[Occurrence]:
        """Take over ``claimed`` rows untouched since ``before`` and scheduled before it
        (crashed or failed publishes): they are this replica's now."""
        # A conditional update is the lease: of several replicas sweeping at once, exactly
        # one gets each row back (SKIP LOCKED on PostgreSQL; SQLite serialises writers).
        stale = (
            sa.select(runs.c.id)
            # A run claimed ahead of its instant is not stale before its instant either.
            .where(
                runs.c.status == Status.CLAIMED,
                runs.c.claimed_at < before,
                runs.c.scheduled_at < before,
            )
            .order_by(runs.c.claimed_at)
            .limit(limit)
        )
        if self.database.dialect == "postgresql":
            stale = stale.with_for_update(skip_locked=True)
        stmt = (
            sa.update(runs)
            .where(runs.c.id.in_(stale.scalar_subquery()), runs.c.status == Status.CLAIMED)
            .values(claimed_at=now, replica=self.replica)
            .returning(runs.c.id, runs.c.schedule, runs.c.task, runs.c.task_id, runs.c.scheduled_at)
        )
        with self.database.connect() as conn, conn.begin():
            return [Occurrence(*row) for row in conn.execute(stmt)]

    # -- reads ---------------------------------------------------------------------------

    def last_scheduled(self, schedules: Sequence[str]) -> dict[str, datetime]:
        """The newest recorded occurrence of each schedule that has any history."""
        found: dict[str, datetime] = {}
        stmt = (
            sa.select(runs.c.schedule, sa.func.max(runs.c.scheduled_at))
            .where(runs.c.schedule.in_(sa.bindparam("names", expanding=True)))
            .group_by(runs.c.schedule)
        )
        with self.database.connect() as conn:
            for chunk in chunks(list(schedules), SQLITE_CHUNK):
                found.update((name, at) for name, at in conn.execute(stmt, {"names": chunk}))
        return found

    # -- retention -----------------------------------------------------------------------

    def sweep(self, *, claims_before: datetime, runs_before: datetime) -> tuple[int, int]:
        """Delete claims and runs older than the cut-offs, but for the statuses retention
        keeps (``queued``); return how many of each went."""
        return (
            self._delete_in_batches(claims, claims.c.claimed_at < claims_before),
            self._delete_in_batches(
                runs,
                sa.and_(
                    runs.c.scheduled_at < runs_before,
                    runs.c.status.not_in([s.value for s in KEPT_BY_RETENTION]),
                ),
            ),
        )

    def _delete_in_batches(self, table: sa.Table, condition: sa.ColumnElement[bool]) -> int:
        # Short transactions: a sweep over millions of rows must not hold locks for minutes.
        doomed = sa.select(table.c.id).where(condition).limit(SWEEP_BATCH).scalar_subquery()
        stmt = sa.delete(table).where(table.c.id.in_(doomed))
        total = 0
        while True:
            with self.database.connect() as conn, conn.begin():
                deleted = conn.execute(stmt).rowcount
            total += deleted
            if deleted < SWEEP_BATCH:
                return total

    def close(self) -> None:
        self.database.dispose()


def _instant(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value if value.tzinfo else value.replace(tzinfo=UTC)
