"""The store: the only module that runs SQL.

Two implementations of one contract:

* :class:`SqlStore` (PostgreSQL through psycopg 3, or SQLite) -- claims and runs tables, one
  transaction per batch, dialect differences kept here;
* :class:`MemoryStore` (``memory://``) -- one process only, for tests and trying things out.

Every driver error is wrapped in :class:`~voltro_beat.exceptions.StoreError` here and nowhere
else.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from voltro_beat.exceptions import ConfigurationError, StoreError
from voltro_beat.overlap import QUEUED, RUNNING, LiveRun
from voltro_beat.tables import LIVE, claims, runs

logger = logging.getLogger(__name__)

#: Rows per statement on SQLite, which caps bound parameters per statement.
SQLITE_CHUNK = 2000
#: How long a SQLite writer waits for another replica's transaction before giving up.
SQLITE_BUSY_MS = 30_000
#: Rows deleted per retention transaction.
SWEEP_BATCH = 10_000
#: Random 64-bit key of the PostgreSQL advisory lock that serialises schema upgrades.
MIGRATION_LOCK = 0x766F6C74726F6D67


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One occurrence a replica wants recorded: its key, what it runs and its first status.

    ``status`` is ``claimed`` for an occurrence to publish, or ``missed`` / ``skipped`` /
    ``queued`` for one that is recorded without publishing (``reason`` says why).
    ``prune_before`` asks the winner to delete this schedule's claims older than that instant.
    """

    key: str
    schedule: str
    task: str
    task_id: str
    scheduled_at: datetime
    status: str = "claimed"
    reason: str | None = None
    prune_before: datetime | None = None

    def __post_init__(self) -> None:
        if self.scheduled_at.tzinfo is None:
            raise ValueError(f"{self.key}: scheduled_at must be an aware datetime (invariant 8)")


@dataclass(frozen=True, slots=True)
class PendingRun:
    """A ``claimed`` run row whose publish was never confirmed, re-leased to this replica."""

    key: str
    schedule: str
    task_id: str
    scheduled_at: datetime


@dataclass(frozen=True, slots=True)
class RunChange:
    """One run-ledger transition for :meth:`SqlStore.advance_run` (see :mod:`voltro_beat.ledger`).

    The row -- found by ``key``, else by ``task_id`` -- moves to ``status`` if its status is in
    ``from_statuses``, or in ``attempt_statuses`` with ``retries <= attempt``. ``stamp`` names
    the columns the move writes: ``start`` (started_at = now, worker, retries = attempt),
    ``retry`` (retries = attempt + 1, reason) or ``finish`` (finished_at = now, duration,
    error, reason; ``started_at`` and ``worker`` only fill in what was never recorded).
    """

    status: str
    stamp: str
    from_statuses: frozenset[str]
    attempt_statuses: frozenset[str]
    now: datetime
    key: str | None = None
    task_id: str | None = None
    attempt: int = 0
    worker: str | None = None
    started_at: datetime | None = None
    reason: str | None = None
    error: str | None = None


class Store(Protocol):
    """What the scheduler needs from a store."""

    @property
    def display_url(self) -> str: ...

    @property
    def shared(self) -> bool:
        """True if several processes can coordinate through this store."""
        ...

    def upgrade(self) -> None: ...

    def claim(
        self, occurrences: Sequence[Occurrence], *, outcome: str, gate: bool, now: datetime
    ) -> set[str]:
        """Record ``occurrences``; return the keys this replica won.

        With ``gate`` the key first goes through the claims table (invariant 2); either way
        the run row's primary key is the last fence (invariant 4). Claims and run rows are one
        transaction (invariant 3).
        """
        ...

    def mark_published(self, keys: Iterable[str], *, now: datetime) -> None: ...

    def mark_missed(self, keys: Iterable[str], *, reason: str, waiting: str = "claimed") -> None:
        """Record runs still ``waiting`` (claimed or queued) as missed, saying why."""
        ...

    def live_runs(self, schedules: Sequence[str], *, since: datetime) -> list[LiveRun]:
        """Unfinished runs (claimed to retrying, or queued) scheduled at or after ``since``."""
        ...

    def note_overlap_timeout(self, keys: Iterable[str]) -> None:
        """Say in these live rows that they stopped blocking their schedule."""
        ...

    def promote(self, key: str, *, now: datetime) -> bool:
        """Turn the ``queued`` run ``key`` into a claimed one of this replica; False if lost."""
        ...

    def release_stale(self, *, before: datetime, now: datetime, limit: int) -> list[PendingRun]:
        """Take over ``claimed`` rows untouched since ``before`` and scheduled before it
        (crashed or failed publishes)."""
        ...

    def last_scheduled(self, schedules: Sequence[str]) -> dict[str, datetime]: ...

    def recent_runs(
        self, *, schedule: str | None = None, status: str | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        """The newest run rows (by scheduled instant), optionally of one schedule or status."""
        ...

    def sweep(self, *, claims_before: datetime, runs_before: datetime) -> tuple[int, int]: ...

    def close(self) -> None: ...


def hide_password(url: str) -> str:
    """``url`` as safe to log: the password replaced with ``***``."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparsable store URL>"


def open_store(url: str, *, replica: str) -> Store:
    """Build the store for ``url`` without connecting (connections open on first use).

    Raises :class:`ConfigurationError` naming ``voltro_beat_store_url`` for a URL that cannot
    work: unparsable, an unknown dialect or driver, or a dialect voltro_beat does not support.
    """
    if url.strip() == "memory://":
        return MemoryStore(replica=replica)
    setting = "voltro_beat_store_url"
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigurationError(f"cannot parse store URL: {exc}", field=setting) from None
    backend = parsed.get_backend_name()
    if backend == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if backend not in ("postgresql", "sqlite"):
        raise ConfigurationError(
            f"unsupported store {hide_password(url)!r}: use postgresql+psycopg://..., "
            "sqlite:///path or memory://",
            field=setting,
        )
    try:
        return SqlStore(parsed, replica=replica)
    except (NoSuchModuleError, ImportError, ArgumentError) as exc:
        raise ConfigurationError(
            f"cannot load the driver for {hide_password(url)!r}: {exc}", field=setting
        ) from None


class SqlStore:
    """Claims and runs in PostgreSQL or SQLite through SQLAlchemy Core."""

    shared = True

    def __init__(self, url: URL, *, replica: str) -> None:
        self.replica = replica
        self.dialect = url.get_backend_name()
        self.display_url = url.render_as_string(hide_password=True)
        if self.dialect == "postgresql":
            self.engine = sa.create_engine(
                url,
                pool_pre_ping=True,
                pool_size=2,
                max_overflow=2,
                connect_args={
                    "connect_timeout": 5,
                    "application_name": "voltro_beat",
                    # A dead network must fail a statement within seconds (fail closed and
                    # retry) rather than hang the tick for the kernel's default of minutes.
                    "keepalives": 1,
                    "keepalives_idle": 5,
                    "keepalives_interval": 2,
                    "keepalives_count": 3,
                    "tcp_user_timeout": 10_000,
                },
            )
        else:
            self.engine = sa.create_engine(url, pool_pre_ping=True)
            _configure_sqlite(self.engine)

    # -- schema ------------------------------------------------------------------------

    def upgrade(self) -> None:
        """Bring the schema to the newest migration; safe when replicas boot together."""
        from voltro_beat.migrations.runner import upgrade

        with self._connect() as conn, conn.begin():
            if self.dialect == "postgresql":
                # Transaction-scoped, so a crash mid-upgrade cannot leave the lock held.
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
            upgrade(conn)

    # -- claim path --------------------------------------------------------------------

    def claim(
        self, occurrences: Sequence[Occurrence], *, outcome: str, gate: bool, now: datetime
    ) -> set[str]:
        if not occurrences:
            return set()
        if self.dialect == "postgresql":
            return self._claim_postgresql(occurrences, outcome=outcome, gate=gate, now=now)
        return self._claim_sqlite(occurrences, outcome=outcome, gate=gate, now=now)

    def _claim_postgresql(
        self, occurrences: Sequence[Occurrence], *, outcome: str, gate: bool, now: datetime
    ) -> set[str]:
        # One statement, one round trip whatever the batch size: the batch travels as one
        # JSON parameter (psycopg dumps a text parameter in C, while eight Python lists as
        # arrays cost more than the statement itself), data-modifying CTEs make claims + runs
        # + pruning one atomic statement, and autocommit saves the separate COMMIT.
        rows = [
            [
                o.key,
                o.schedule,
                o.task,
                o.task_id,
                o.scheduled_at.isoformat(),
                o.status,
                o.reason,
                None if o.prune_before is None else o.prune_before.isoformat(),
            ]
            for o in occurrences
        ]
        params = {
            "rows": json.dumps(rows),
            "now": now,
            "replica": self.replica,
            "outcome": outcome,
        }
        sql = _PG_CLAIM if gate else _PG_RECORD
        with self._connect(autocommit=True) as conn:
            return {row[0] for row in conn.execute(sa.text(sql), params)}

    def _claim_sqlite(
        self, occurrences: Sequence[Occurrence], *, outcome: str, gate: bool, now: datetime
    ) -> set[str]:
        won: set[str] = set()
        with self._connect() as conn, conn.begin():
            for chunk in _chunks(occurrences, SQLITE_CHUNK):
                if gate:
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
                    .values([_run_row(o, outcome, self.replica, now) for o in chunk])
                    .on_conflict_do_nothing()
                    .returning(runs.c.id)
                )
                recorded = {row[0] for row in conn.execute(stmt)}
                won |= recorded
                prunes = [
                    {"s": o.schedule, "b": o.prune_before}
                    for o in chunk
                    if o.key in recorded and o.prune_before is not None
                ]
                if gate and prunes:
                    conn.execute(
                        sa.delete(claims).where(
                            claims.c.schedule == sa.bindparam("s"),
                            claims.c.scheduled_at
                            < sa.bindparam("b", type_=claims.c.claimed_at.type),
                        ),
                        prunes,
                    )
        return won

    def mark_published(self, keys: Iterable[str], *, now: datetime) -> None:
        keys = list(keys)
        if not keys:
            return
        # The worker may already have moved the row on (started, even succeeded): keep its
        # status and only stamp the publish time.
        if self.dialect == "postgresql":
            with self._connect(autocommit=True) as conn:
                conn.execute(sa.text(_PG_MARK_PUBLISHED), {"keys": json.dumps(keys), "now": now})
            return
        stmt = (
            sa.update(runs)
            .where(runs.c.id.in_(sa.bindparam("keys", expanding=True)))
            .values(
                published_at=now,
                status=sa.case((runs.c.status == "claimed", "published"), else_=runs.c.status),
            )
        )
        self._write_in_chunks(stmt, keys)

    def mark_missed(self, keys: Iterable[str], *, reason: str, waiting: str = "claimed") -> None:
        keys = list(keys)
        if not keys:
            return
        stmt = (
            sa.update(runs)
            .where(
                runs.c.id.in_(sa.bindparam("keys", expanding=True)),
                runs.c.status == waiting,
            )
            .values(status="missed", reason=reason)
        )
        self._write_in_chunks(stmt, keys)

    def live_runs(self, schedules: Sequence[str], *, since: datetime) -> list[LiveRun]:
        stmt = sa.select(
            runs.c.id,
            runs.c.schedule,
            runs.c.status,
            runs.c.scheduled_at,
            sa.func.coalesce(runs.c.started_at, runs.c.published_at, runs.c.claimed_at).label(
                "since"
            ),
        ).where(
            runs.c.schedule.in_(sa.bindparam("names", expanding=True)),
            runs.c.scheduled_at >= since,
            # The index predicate's own text, so that the planner can use the partial index
            # even with a generic plan.
            sa.text(LIVE),
        )
        found: list[LiveRun] = []
        with self._connect() as conn:
            for chunk in _chunks(list(schedules), SQLITE_CHUNK):
                for key, name, status, at, started in conn.execute(stmt, {"names": chunk}):
                    # coalesce() loses the column type on SQLite: parse the text back.
                    found.append(LiveRun(key, name, status, at, _instant(started)))
        return found

    def note_overlap_timeout(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if keys:
            stmt = (
                sa.update(runs)
                .where(runs.c.id.in_(sa.bindparam("keys", expanding=True)), runs.c.reason.is_(None))
                .values(reason="overlap_timeout")
            )
            self._write_in_chunks(stmt, keys)

    def promote(self, key: str, *, now: datetime) -> bool:
        stmt = (
            sa.update(runs)
            .where(runs.c.id == key, runs.c.status == QUEUED)
            .values(status="claimed", claimed_at=now, replica=self.replica)
        )
        with self._connect() as conn, conn.begin():
            return bool(conn.execute(stmt).rowcount)

    def _write_in_chunks(self, stmt: sa.Executable, keys: list[str]) -> None:
        chunks = list(_chunks(keys, SQLITE_CHUNK))
        if self.dialect == "postgresql" and len(chunks) == 1:
            # One statement needs no transaction of its own: autocommit saves the BEGIN and
            # COMMIT round trips on the firing path.
            with self._connect(autocommit=True) as conn:
                conn.execute(stmt, {"keys": chunks[0]})
            return
        with self._connect() as conn, conn.begin():
            for chunk in chunks:
                conn.execute(stmt, {"keys": chunk})

    def release_stale(self, *, before: datetime, now: datetime, limit: int) -> list[PendingRun]:
        # A conditional update is the lease: of several replicas sweeping at once, exactly
        # one gets each row back (SKIP LOCKED on PostgreSQL; SQLite serialises writers).
        stale = (
            sa.select(runs.c.id)
            # A run claimed ahead of its instant is not stale before its instant either.
            .where(
                runs.c.status == "claimed",
                runs.c.claimed_at < before,
                runs.c.scheduled_at < before,
            )
            .order_by(runs.c.claimed_at)
            .limit(limit)
        )
        if self.dialect == "postgresql":
            stale = stale.with_for_update(skip_locked=True)
        stmt = (
            sa.update(runs)
            .where(runs.c.id.in_(stale.scalar_subquery()), runs.c.status == "claimed")
            .values(claimed_at=now, replica=self.replica)
            .returning(runs.c.id, runs.c.schedule, runs.c.task_id, runs.c.scheduled_at)
        )
        with self._connect() as conn, conn.begin():
            return [PendingRun(*row) for row in conn.execute(stmt)]

    # -- reads ---------------------------------------------------------------------------

    def last_scheduled(self, schedules: Sequence[str]) -> dict[str, datetime]:
        """The newest recorded occurrence of each schedule that has any history."""
        found: dict[str, datetime] = {}
        stmt = (
            sa.select(runs.c.schedule, sa.func.max(runs.c.scheduled_at))
            .where(runs.c.schedule.in_(sa.bindparam("names", expanding=True)))
            .group_by(runs.c.schedule)
        )
        with self._connect() as conn:
            for chunk in _chunks(list(schedules), SQLITE_CHUNK):
                found.update((name, at) for name, at in conn.execute(stmt, {"names": chunk}))
        return found

    def recent_runs(
        self, *, schedule: str | None = None, status: str | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        stmt = sa.select(runs).order_by(runs.c.scheduled_at.desc(), runs.c.id).limit(limit)
        if schedule is not None:
            stmt = stmt.where(runs.c.schedule == schedule)
        if status is not None:
            stmt = stmt.where(runs.c.status == status)
        with self._connect() as conn:
            return [dict(row._mapping) for row in conn.execute(stmt)]

    # -- retention -----------------------------------------------------------------------

    def sweep(self, *, claims_before: datetime, runs_before: datetime) -> tuple[int, int]:
        """Delete claims and finished runs older than the cut-offs; ``queued`` rows stay."""
        return (
            self._delete_in_batches(claims, claims.c.claimed_at < claims_before),
            self._delete_in_batches(
                runs, sa.and_(runs.c.scheduled_at < runs_before, runs.c.status != "queued")
            ),
        )

    def _delete_in_batches(self, table: sa.Table, condition: sa.ColumnElement[bool]) -> int:
        # Short transactions: a sweep over millions of rows must not hold locks for minutes.
        doomed = sa.select(table.c.id).where(condition).limit(SWEEP_BATCH).scalar_subquery()
        stmt = sa.delete(table).where(table.c.id.in_(doomed))
        total = 0
        while True:
            with self._connect() as conn, conn.begin():
                deleted = conn.execute(stmt).rowcount
            total += deleted
            if deleted < SWEEP_BATCH:
                return total

    def close(self) -> None:
        self._ledger_drop()
        self.engine.dispose()

    # -- plumbing ------------------------------------------------------------------------

    @contextmanager
    def _connect(self, *, autocommit: bool = False) -> Iterator[Connection]:
        engine = self.engine
        try:
            with engine.connect() as conn:
                if autocommit:
                    conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                yield conn
        except SQLAlchemyError as exc:
            raise StoreError(f"store {self.display_url}: {_first_line(exc)}") from exc

    # -- ledger --------------------------------------------------------------------------
    # Worker-side writes of the run ledger (voltro_beat.ledger decides, voltro_beat.signals
    # calls). Each is one statement: workers run them on every task, often in parallel.

    _ledger_statements: dict[tuple[Any, ...], sa.Select[Any] | sa.Update] | None = None
    _ledger_sql: dict[tuple[Any, ...], str] | None = None
    _ledger_local: threading.local | None = None

    def advance_run(self, change: RunChange) -> bool:
        """Apply one ledger transition as a single conditional UPDATE; True if the row moved.

        Nothing moves when the row is missing or its status is not one the transition moves
        from, so duplicate and late events are no-ops and concurrent writers need no
        read-then-write (PostgreSQL re-checks the WHERE clause against the row a concurrent
        writer just committed).
        """
        if change.key is None and change.task_id is None:
            raise ValueError("advance_run needs a key or a task id")
        shape = (
            change.stamp,
            change.key is not None,
            change.from_statuses,
            change.attempt_statuses,
        )
        params = {
            "l_key": change.key,
            "l_task_id": change.task_id,
            "l_status": change.status,
            "l_attempt": change.attempt,
            "l_retries": change.attempt + 1 if change.stamp == "retry" else change.attempt,
            "l_now": change.now,
            "l_worker": change.worker,
            "l_started_at": change.started_at,
            "l_reason": change.reason,
            "l_error": change.error,
        }
        return self._ledger_execute(shape, params) is not None

    def run_status(self, key: str) -> str | None:
        """The status of run ``key``, or None if there is no such row."""
        status = self._ledger_execute(("status",), {"l_key": key})
        return None if status is None else str(status)

    def _ledger_execute(self, shape: tuple[Any, ...], params: dict[str, Any]) -> Any:
        """Run the ledger statement ``shape`` on this thread's ledger connection.

        Returns the first column of the first row (None if no row). The worker writes twice
        per task, so the connection is checked out once and kept (per thread), not taken from
        the pool per write: a checkout's pre-ping and reset cost more than the UPDATE. A
        connection the server dropped is replaced and the statement retried once (every
        ledger statement is safe to repeat).
        """
        for attempt in (1, 2):
            conn = self._ledger_connection()
            try:
                if self.dialect == "postgresql":
                    return self._ledger_execute_pg(conn, shape, params)
                # SQLite keeps its BEGIN IMMEDIATE so that writers queue on the busy timeout.
                with conn.begin():
                    return conn.execute(self._ledger_statement(shape), params).scalar()
            except SQLAlchemyError as exc:
                self._ledger_drop()
                lost = isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated
                if attempt == 1 and lost:
                    continue
                raise StoreError(f"store {self.display_url}: {_first_line(exc)}") from exc
            except Exception as exc:
                # psycopg's own errors, from the fast path below.
                driver = conn.connection.dbapi_connection
                lost = driver is None or driver.closed or getattr(driver, "broken", False)
                self._ledger_drop()
                if attempt == 1 and lost:
                    continue
                raise StoreError(f"store {self.display_url}: {_first_line(exc)}") from exc
        raise AssertionError("unreachable")

    def _ledger_execute_pg(
        self, conn: Connection, shape: tuple[Any, ...], params: dict[str, Any]
    ) -> Any:
        # The statement is compiled to SQL once; each write then goes to psycopg directly, in
        # autocommit: one round trip, and none of SQLAlchemy's per-execution work, which on
        # a busy worker costs about as much as the UPDATE itself. Parameters are our own
        # aware datetimes, strings and ints, which psycopg adapts as SQLAlchemy would.
        if self._ledger_sql is None:
            self._ledger_sql = {}
        sql = self._ledger_sql.get(shape)
        if sql is None:
            sql = str(self._ledger_statement(shape).compile(dialect=self.engine.dialect))
            self._ledger_sql[shape] = sql
        # psycopg 3 is not an asyncio driver: its DB-API connection is the driver's own.
        driver = conn.connection.dbapi_connection
        assert driver is not None, "a live ledger connection has a driver connection"
        row = driver.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def _ledger_connection(self) -> Connection:
        if self._ledger_local is None:
            self._ledger_local = threading.local()
        conn: Connection | None = getattr(self._ledger_local, "conn", None)
        if conn is None or conn.closed or conn.invalidated:
            conn = None
            try:
                conn = self.engine.connect()
                # Out of the pool for good: its session settings (below) never reach another
                # user of the pool, and no pool finalizer can touch it after a fork (the
                # driver itself closes a connection only in the process that opened it).
                conn.detach()
                if self.dialect == "postgresql":
                    driver = conn.connection.dbapi_connection
                    assert driver is not None, "a new connection has a driver connection"
                    # Autocommit: each ledger write is one round trip, no BEGIN/COMMIT.
                    driver.autocommit = True
                    # Status updates do not wait for the WAL flush: a database crash may lose
                    # the last fraction of a second of them (a row then shows an earlier
                    # status; rows and claims, written by beat, stay fully durable). This
                    # halves the ledger's cost per task and keeps it flat while other writers
                    # keep the disk busy. The statement timeout bounds how long a task can
                    # wait on a ledger write (a row locked by a stuck transaction).
                    driver.execute("SET synchronous_commit = off; SET statement_timeout = 5000")
            except Exception as exc:
                if conn is not None:
                    self._ledger_local.conn = conn
                    self._ledger_drop()
                raise StoreError(f"store {self.display_url}: {_first_line(exc)}") from exc
            self._ledger_local.conn = conn
        return conn

    def _ledger_drop(self) -> None:
        conn = getattr(self._ledger_local, "conn", None)
        if self._ledger_local is not None:
            self._ledger_local.conn = None
        if conn is not None:
            try:
                conn.invalidate()
                conn.close()
            except Exception:
                # A broken connection may fail to close; it is being replaced either way.
                logger.debug("closing a broken ledger connection failed", exc_info=True)

    def _ledger_statement(self, shape: tuple[Any, ...]) -> sa.Select[Any] | sa.Update:
        """The statement of ``shape``: ``("status",)`` or (stamp, by_key, from, attempt_from)."""
        # Built once per shape: a worker runs the same few statements all day.
        if self._ledger_statements is None:
            self._ledger_statements = {}
        cache = self._ledger_statements
        stmt = cache.get(shape)
        if stmt is not None:
            return stmt
        if shape == ("status",):
            stmt = sa.select(runs.c.status).where(runs.c.id == sa.bindparam("l_key", type_=sa.Text))
        else:
            stmt = self._ledger_update(*shape)
        cache[shape] = stmt
        return stmt

    def _ledger_update(
        self,
        stamp: str,
        by_key: bool,
        from_statuses: frozenset[str],
        attempt_statuses: frozenset[str],
    ) -> sa.Update:
        when = runs.c.started_at.type
        now = sa.bindparam("l_now", type_=when)
        started = sa.func.coalesce(runs.c.started_at, sa.bindparam("l_started_at", type_=when))

        def among(statuses: frozenset[str]) -> sa.ColumnElement[bool]:
            # Inlined: the sets are constants of the state machine, so the SQL text is fixed.
            return runs.c.status.in_([sa.literal_column(f"'{s}'") for s in sorted(statuses)])

        moves = among(from_statuses)
        if attempt_statuses:
            moves = sa.or_(
                moves,
                sa.and_(
                    among(attempt_statuses),
                    runs.c.retries <= sa.bindparam("l_attempt", type_=sa.Integer),
                ),
            )
        target = (
            runs.c.id == sa.bindparam("l_key", type_=sa.Text)
            if by_key
            else runs.c.task_id == sa.bindparam("l_task_id", type_=sa.Text)
        )
        values: dict[str, Any] = {"status": sa.bindparam("l_status", type_=sa.Text)}
        if stamp == "start":
            values.update(
                started_at=now,
                worker=sa.bindparam("l_worker", type_=sa.Text),
                retries=sa.bindparam("l_retries", type_=sa.Integer),
            )
        elif stamp == "retry":
            values.update(
                retries=sa.bindparam("l_retries", type_=sa.Integer),
                reason=sa.bindparam("l_reason", type_=sa.Text),
            )
        elif stamp == "finish":
            if self.dialect == "postgresql":
                seconds: Any = sa.extract(
                    "epoch", sa.cast(now, sa.DateTime(timezone=True)) - started
                )
            else:
                # julianday() is a double of days: about 10 us of noise, so keep milliseconds.
                seconds = sa.func.round(
                    (sa.func.julianday(now) - sa.func.julianday(started)) * 86400.0, 3
                )
            values.update(
                finished_at=now,
                started_at=started,
                duration=sa.cast(seconds, sa.Float),
                error=sa.bindparam("l_error", type_=sa.Text),
                reason=sa.func.coalesce(sa.bindparam("l_reason", type_=sa.Text), runs.c.reason),
                worker=sa.func.coalesce(runs.c.worker, sa.bindparam("l_worker", type_=sa.Text)),
            )
        else:
            raise ValueError(f"unknown ledger stamp {stamp!r}")
        return sa.update(runs).where(target, moves).values(**values).returning(runs.c.id)


def _configure_sqlite(engine: Engine) -> None:
    """WAL, a busy timeout, and ``BEGIN IMMEDIATE`` so that writers queue instead of failing."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's begin event emit BEGIN itself (pysqlite's own handling defers it).
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
        # Turning a new file to WAL takes an exclusive lock and SQLite answers "database is
        # locked" at once, without its busy handler, when replicas open the file together:
        # retry for as long as the busy timeout would have waited. (WAL is persistent, so
        # this only ever contends on a brand-new file.)
        deadline = time.monotonic() + SQLITE_BUSY_MS / 1000
        while True:
            try:
                cursor.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _run_row(o: Occurrence, outcome: str, replica: str, now: datetime) -> dict[str, Any]:
    return {
        "id": o.key,
        "schedule": o.schedule,
        "task": o.task,
        "task_id": o.task_id,
        "scheduled_at": o.scheduled_at,
        "coordination_outcome": outcome,
        "status": o.status,
        "reason": o.reason,
        "replica": replica,
        "claimed_at": now,
    }


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _instant(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _first_line(exc: BaseException) -> str:
    return str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]


_PG_INPUT = """
WITH input AS (
    SELECT e->>0 AS id, e->>1 AS schedule, e->>2 AS task, e->>3 AS task_id,
           CAST(e->>4 AS timestamptz) AS scheduled_at, e->>5 AS status, e->>6 AS reason,
           CAST(e->>7 AS timestamptz) AS prune_before
    FROM json_array_elements(CAST(:rows AS json)) AS e
)"""

_PG_MARK_PUBLISHED = """
UPDATE _voltro_schedule_runs AS r
SET published_at = :now,
    status = CASE WHEN r.status = 'claimed' THEN 'published' ELSE r.status END
FROM json_array_elements_text(CAST(:keys AS json)) AS k(id)
WHERE r.id = k.id"""

_PG_RUNS_INSERT = """
    INSERT INTO _voltro_schedule_runs
        (id, schedule, task, task_id, scheduled_at, coordination_outcome, status, reason,
         replica, claimed_at)
    SELECT i.id, i.schedule, i.task, i.task_id, i.scheduled_at, :outcome, i.status, i.reason,
           :replica, :now
    FROM input i {join}
    ON CONFLICT DO NOTHING
    RETURNING id"""

_PG_CLAIM = (
    _PG_INPUT
    + """,
gated AS (
    INSERT INTO _voltro_schedule_claims (id, schedule, scheduled_at, claimed_at, replica)
    SELECT id, schedule, scheduled_at, :now, :replica FROM input
    ON CONFLICT DO NOTHING
    RETURNING id
),
recorded AS ("""
    + _PG_RUNS_INSERT.format(join="JOIN gated g ON g.id = i.id")
    + """
),
pruned AS (
    DELETE FROM _voltro_schedule_claims c
    USING recorded r JOIN input i ON i.id = r.id
    WHERE c.schedule = i.schedule AND c.scheduled_at < i.prune_before
)
SELECT id FROM recorded"""
)

_PG_RECORD = (
    _PG_INPUT
    + """,
recorded AS ("""
    + _PG_RUNS_INSERT.format(join="")
    + """
)
SELECT id FROM recorded"""
)


class MemoryStore:
    """The store contract in one process's memory: nothing is shared or kept."""

    shared = False
    display_url = "memory://"

    def __init__(self, *, replica: str) -> None:
        self.replica = replica
        self._lock = threading.Lock()
        self.runs: dict[str, dict[str, Any]] = {}

    def upgrade(self) -> None:
        pass

    def claim(
        self, occurrences: Sequence[Occurrence], *, outcome: str, gate: bool, now: datetime
    ) -> set[str]:
        won = set()
        with self._lock:
            for o in occurrences:
                if o.key not in self.runs:
                    self.runs[o.key] = _run_row(o, outcome, self.replica, now)
                    won.add(o.key)
        return won

    def mark_published(self, keys: Iterable[str], *, now: datetime) -> None:
        with self._lock:
            for key in keys:
                row = self.runs[key]
                row["published_at"] = now
                if row["status"] == "claimed":
                    row["status"] = "published"

    def mark_missed(self, keys: Iterable[str], *, reason: str, waiting: str = "claimed") -> None:
        with self._lock:
            for key in keys:
                if self.runs[key]["status"] == waiting:
                    self.runs[key].update(status="missed", reason=reason)

    def live_runs(self, schedules: Sequence[str], *, since: datetime) -> list[LiveRun]:
        wanted = set(schedules)
        with self._lock:
            return [
                LiveRun(
                    r["id"],
                    r["schedule"],
                    r["status"],
                    r["scheduled_at"],
                    r.get("started_at") or r.get("published_at") or r["claimed_at"],
                )
                for r in self.runs.values()
                if r["schedule"] in wanted
                and r["scheduled_at"] >= since
                and r["status"] in (*RUNNING, QUEUED)
            ]

    def note_overlap_timeout(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                if self.runs[key].get("reason") is None:
                    self.runs[key]["reason"] = "overlap_timeout"

    def promote(self, key: str, *, now: datetime) -> bool:
        with self._lock:
            row = self.runs[key]
            if row["status"] != QUEUED:
                return False
            row.update(status="claimed", claimed_at=now, replica=self.replica)
            return True

    def release_stale(self, *, before: datetime, now: datetime, limit: int) -> list[PendingRun]:
        with self._lock:
            stale = [
                r
                for r in self.runs.values()
                if r["status"] == "claimed"
                and r["claimed_at"] < before
                and r["scheduled_at"] < before
            ][:limit]
            for row in stale:
                row["claimed_at"] = now
            return [
                PendingRun(r["id"], r["schedule"], r["task_id"], r["scheduled_at"]) for r in stale
            ]

    def last_scheduled(self, schedules: Sequence[str]) -> dict[str, datetime]:
        wanted = set(schedules)
        found: dict[str, datetime] = {}
        with self._lock:
            for row in self.runs.values():
                name = row["schedule"]
                if name in wanted and (name not in found or row["scheduled_at"] > found[name]):
                    found[name] = row["scheduled_at"]
        return found

    def recent_runs(
        self, *, schedule: str | None = None, status: str | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        with self._lock:
            rows = [
                dict(r)
                for r in self.runs.values()
                if schedule in (None, r["schedule"]) and status in (None, r["status"])
            ]
        rows.sort(key=lambda r: (-r["scheduled_at"].timestamp(), r["id"]))
        return rows[:limit]

    def sweep(self, *, claims_before: datetime, runs_before: datetime) -> tuple[int, int]:
        with self._lock:
            old = [
                k
                for k, r in self.runs.items()
                if r["scheduled_at"] < runs_before and r["status"] != "queued"
            ]
            for key in old:
                del self.runs[key]
        return 0, len(old)

    def close(self) -> None:
        pass
