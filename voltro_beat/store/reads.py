"""What operators read from the store (the ``voltro-beat`` command, the admin views): never on
a firing path."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from voltro_beat.exceptions import StoreError
from voltro_beat.status import Reason, Status, sql_in
from voltro_beat.store.database import Database
from voltro_beat.store.dialect import SQLITE_CHUNK, chunks
from voltro_beat.store.migrations import runner as migrations
from voltro_beat.store.tables import (
    CLAIMS,
    REPLICAS,
    RUNS,
    claims,
    runs,
    shards,
    singletons,
    watermarks,
)
from voltro_beat.tally import Tally, tally

#: The tables every command reads; a store without them needs ``voltro-beat db upgrade``.
TABLES = (CLAIMS, RUNS, REPLICAS)
#: The reasons of runs an operator published (``voltro-beat backfill``, ``voltro-beat run``).
ON_DEMAND = (Reason.BACKFILL.value, Reason.MANUAL.value)
#: The median publish lag of ``voltro-beat status`` is over this many newest published runs
#: of each schedule (read by the schedule's index, however long the retention).
LAG_SAMPLE = 1000

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
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[dict[str, Any]]:
    """The newest run rows (by scheduled instant), optionally of one schedule or status,
    scheduled in ``[since, until)``."""
    stmt = sa.select(runs).order_by(runs.c.scheduled_at.desc(), runs.c.id.desc()).limit(limit)
    if since is not None:
        stmt = stmt.where(runs.c.scheduled_at >= since)
    if until is not None:
        stmt = stmt.where(runs.c.scheduled_at < until)
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


def missing_tables(database: Database) -> list[str]:
    """Which of :data:`TABLES` the store lacks (raises StoreError if it is unreachable)."""
    with database.connect() as conn:
        present = set(sa.inspect(conn).get_table_names())
    return [name for name in TABLES if name not in present]


@dataclass(frozen=True, slots=True)
class SchemaCheck:
    """What ``voltro-beat db check`` reports."""

    current: str | None
    head: str
    #: Table name -> None if this role can read it, else the store's error.
    tables: dict[str, str | None]

    @property
    def ok(self) -> bool:
        return self.current == self.head and not any(self.tables.values())


def check_schema(database: Database) -> SchemaCheck:
    """The schema's revision against the newest one, and whether each table can be read."""
    with database.connect() as conn:
        current, head = migrations.revisions(conn)
    tables: dict[str, str | None] = {}
    for name in TABLES:
        try:
            # A transaction of its own: on PostgreSQL a failed statement aborts the rest.
            with database.connect() as conn:
                conn.execute(sa.select(sa.literal(1)).select_from(sa.table(name)).limit(1))
            tables[name] = None
        except StoreError as exc:
            tables[name] = str(exc)
    return SchemaCheck(current, head, tables)


@dataclass(slots=True)
class Summary:
    """One schedule's history in the run table, as ``voltro-beat status`` shows it."""

    last_at: datetime | None = None
    last_status: str | None = None
    #: Its retained rows by outcome (:mod:`voltro_beat.tally`).
    tally: Tally = field(default_factory=Tally)
    #: Publish lags (published_at - scheduled_at, seconds) of the newest runs beat published.
    lags: list[float] = field(default_factory=list)

    @property
    def median_lag(self) -> float | None:
        return statistics.median(self.lags) if self.lags else None


#: The reason column where it tells outcomes apart (missed, skipped); elsewhere it is a worker's
#: free text (a retry's), which would split the counts by status into a group per message.
#: Literal statuses (no bound parameters), so that GROUP BY repeats the SELECT's expression.
_OUTCOME_REASON = sa.case(
    (sa.text(sql_in({Status.MISSED, Status.SKIPPED}, f"{RUNS}.status")), runs.c.reason),
    else_=None,
)


def summaries(database: Database, names: Sequence[str], *, now: datetime) -> dict[str, Summary]:
    """Each schedule's :class:`Summary`: its newest run at or before ``now``, its rows by
    outcome, and the lags of its :data:`LAG_SAMPLE` newest runs beat published (not an
    operator's backfill or run)."""
    found = {name: Summary() for name in names}
    by_outcome = (
        sa.select(runs.c.schedule, runs.c.status, _OUTCOME_REASON, sa.func.count())
        .where(runs.c.schedule.in_(sa.bindparam("names", expanding=True)))
        .group_by(runs.c.schedule, runs.c.status, _OUTCOME_REASON)
    )
    last = (
        sa.select(runs.c.scheduled_at, runs.c.status)
        .where(runs.c.schedule == sa.bindparam("name"), runs.c.scheduled_at <= now)
        .order_by(runs.c.scheduled_at.desc())
        .limit(1)
    )
    lags = (
        sa.select(runs.c.scheduled_at, runs.c.published_at)
        .where(
            runs.c.schedule == sa.bindparam("name"),
            runs.c.published_at.is_not(None),
            # Beat's own lag: an operator's backfill or run is late on purpose.
            sa.or_(runs.c.reason.is_(None), runs.c.reason.not_in(ON_DEMAND)),
        )
        .order_by(runs.c.scheduled_at.desc())
        .limit(LAG_SAMPLE)
    )
    with database.connect() as conn:
        counted: dict[str, list[tuple[str, str | None, int]]] = {name: [] for name in names}
        for chunk in chunks(list(names), SQLITE_CHUNK):
            for name, status, reason, count in conn.execute(by_outcome, {"names": list(chunk)}):
                counted[name].append((status, reason, count))
        for name, rows in counted.items():
            found[name].tally = tally(rows)
        for name, summary in found.items():
            row = conn.execute(last, {"name": name}).first()
            if row is not None:
                summary.last_at, summary.last_status = row
            summary.lags = [
                (published - at).total_seconds()
                for at, published in conn.execute(lags, {"name": name})
            ]
    return found


def recorded_keys(
    database: Database, schedule: str, *, since: datetime, until: datetime
) -> set[str]:
    """The keys of ``schedule``'s run rows scheduled in ``[since, until)``."""
    stmt = sa.select(runs.c.id).where(
        runs.c.schedule == schedule, runs.c.scheduled_at >= since, runs.c.scheduled_at < until
    )
    with database.connect() as conn:
        return set(conn.execute(stmt).scalars())


def swept_before(database: Database) -> datetime | None:
    """The instant before which the runs retention may have removed run rows (claims of older
    occurrences are refused, see BeatStore.delete_expired); None while it removed none."""
    stmt = sa.select(watermarks.c.before).where(watermarks.c.name == RUNS)
    with database.connect() as conn:
        return conn.execute(stmt).scalar()


def recent_claims(
    database: Database, *, since: datetime | None = None, limit: int = 50
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The newest claims (by claim time), and how many claims each replica holds, since
    ``since`` if given."""
    newest = sa.select(claims).order_by(claims.c.claimed_at.desc(), claims.c.id).limit(limit)
    per_replica = sa.select(claims.c.replica, sa.func.count()).group_by(claims.c.replica)
    if since is not None:
        newest = newest.where(claims.c.claimed_at >= since)
        per_replica = per_replica.where(claims.c.claimed_at >= since)
    with database.connect() as conn:
        rows = [dict(row._mapping) for row in conn.execute(newest)]
        counts = {replica: count for replica, count in conn.execute(per_replica)}
    return rows, counts


@dataclass(frozen=True, slots=True)
class Shard:
    """One shard lease (cluster coordination), as the database's clock reads it now."""

    group: str
    shard: int
    #: Its owner while the owner's lease runs (None: free, or the lease ran out).
    owner: str | None
    epoch: int
    #: Seconds left of the owner's lease.
    lease_left: float | None
    #: When the owner last changed.
    since: datetime | None


def shard_leases(database: Database, *, now: datetime) -> list[Shard]:
    """Every shard lease, by group and shard (empty outside cluster coordination)."""
    with database.connect() as conn:
        rows = conn.execute(sa.select(shards).order_by(shards.c.shard_group, shards.c.shard))
        found = []
        for r in rows:
            left = None if r.lease_until is None else (r.lease_until - now).total_seconds()
            held = left is not None and left > 0 and r.owner is not None
            found.append(
                Shard(
                    r.shard_group,
                    r.shard,
                    r.owner if held else None,
                    r.epoch,
                    left if held else None,
                    r.changed_at,
                )
            )
        return found


@dataclass(frozen=True, slots=True)
class SingletonState:
    """What became of a singleton on the replica that last ran it."""

    group: str
    name: str
    replica: str
    token: int
    #: ``running``, ``returned``, ``failed`` or ``stopped``.
    state: str
    since: datetime
    error: str | None


def singleton_states(database: Database) -> list[SingletonState]:
    """Every singleton that ran, by group and name."""
    with database.connect() as conn:
        rows = conn.execute(
            sa.select(singletons).order_by(singletons.c.singleton_group, singletons.c.name)
        )
        return [
            SingletonState(r.singleton_group, r.name, r.replica, r.token, r.state, r.since, r.error)
            for r in rows
        ]
