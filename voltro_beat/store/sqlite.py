"""SQLite: the :class:`~voltro_beat.store.dialect.Dialect` of a store on one host.

Its clock is the process's (``database.clock``), inside statements as the SQL function
``voltro_now()``. Writers take the database in turn (``BEGIN IMMEDIATE``, waiting up to a busy
timeout), so the firing path runs its steps as SQLAlchemy Core statements in one transaction,
a chunk of rows per statement: no other writer acts between them.
"""

from __future__ import annotations

import collections
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL, Connection, Engine

from voltro_beat.clock import ClockMode
from voltro_beat.coordination import Outcome
from voltro_beat.runs import Run
from voltro_beat.shards import Tenure
from voltro_beat.status import Status
from voltro_beat.store.dialect import SQLITE_CHUNK, Dialect, chunks
from voltro_beat.store.tables import (
    RUNS,
    claims,
    instant,
    replicas,
    runs,
    schedule_changes,
    shards,
    watermarks,
)

if TYPE_CHECKING:
    from voltro_beat.store.database import Database

#: How long a writer waits for another replica's transaction before giving up.
SQLITE_BUSY_MS = 30_000

#: The clock as the statement runs.
_NOW: sa.ColumnElement[Any] = sa.func.voltro_now()


class SQLite(Dialect):
    """SQLite, its connections made of ``connection`` (a ``sqlite3.Connection`` subclass) if
    given."""

    name = "sqlite"

    def __init__(
        self, database: Database, *, connection: type[sqlite3.Connection] | None = None
    ) -> None:
        super().__init__(database)
        self._connection = connection

    def create_engine(self, url: URL) -> Engine:
        connect_args = {} if self._connection is None else {"factory": self._connection}
        engine = sa.create_engine(url, pool_pre_ping=True, connect_args=connect_args)
        _configure(engine, lambda: self.database.clock())
        return engine

    @contextmanager
    def statement(self) -> Iterator[Connection]:
        # A transaction even for one statement: BEGIN IMMEDIATE makes writers queue on the
        # busy timeout instead of failing.
        with self.database.connect() as conn, conn.begin():
            yield conn

    def lock_schema(self, conn: Connection) -> None:
        """Nothing to take: ``BEGIN IMMEDIATE`` already lets one writer in at a time."""

    def lock_edits(self, conn: Connection) -> None:
        """Nothing to take: ``BEGIN IMMEDIATE`` already lets one writer in at a time."""

    @property
    def file(self) -> str | None:
        path = self.database.engine.url.database
        return path if path and path != ":memory:" else None

    def clock_mode(self, setting: ClockMode | None) -> ClockMode:
        # One host: the database's clock is this host's, whatever the setting.
        return ClockMode.LOCAL

    def now(self) -> Any:
        return self.database.clock()

    def statement_clock(self) -> sa.ColumnElement[Any]:
        return _NOW

    def insert(self, table: sa.Table) -> sqlite.Insert:
        return sqlite.insert(table)

    def greatest(self, *values: Any) -> sa.ColumnElement[Any]:
        # SQLite's max() of several arguments is a scalar function, not the aggregate.
        return sa.func.max(*values)

    def names(self) -> sa.TextClause:
        return sa.text("SELECT value AS name FROM json_each(:names)")

    def skip_locked(self, select: sa.Select[Any]) -> sa.Select[Any]:
        return select

    def row_estimates(self, tables: Sequence[str]) -> dict[str, int]:
        # The rowid span: rows deleted in between still count until the ids move on.
        with self.database.connect() as conn:
            return {
                name: int(
                    conn.execute(
                        sa.text(f"SELECT coalesce(max(rowid) - min(rowid) + 1, 0) FROM {name}")
                    ).scalar_one()
                )
                for name in tables
            }

    def claim(
        self,
        batch: Sequence[Run],
        *,
        gated: bool,
        outcome: Outcome,
        lease: timedelta,
        prune: Mapping[str, timedelta],
        replica: str,
        tenure: Tenure | None,
    ) -> set[str]:
        won: set[str] = set()
        held = {} if tenure is None else tenure.held
        with self.statement() as conn:
            # Read at BEGIN: no other writer acts before the commit, and a pause since only
            # shortens the leases.
            now = self.database.clock()
            floor = conn.execute(
                sa.select(watermarks.c.before).where(watermarks.c.name == RUNS)
            ).scalar()
            if floor is not None:  # see BeatStore.delete_expired
                batch = [r for r in batch if r.occurrence.scheduled_at >= floor]
            if tenure is not None:  # guarantee 14
                current = {
                    (shard, epoch)
                    for shard, epoch in conn.execute(
                        sa.select(shards.c.shard, shards.c.epoch).where(
                            shards.c.shard_group == tenure.group,
                            shards.c.owner == replica,
                            shards.c.lease_until > now,
                        )
                    )
                }
                batch = [r for r in batch if held.get(r.occurrence.schedule) in current]
            batch = _current(conn, batch)
            for chunk in chunks(batch, SQLITE_CHUNK):
                if gated:
                    rows = [
                        {
                            "id": r.occurrence.key,
                            "schedule": r.occurrence.schedule,
                            "scheduled_at": r.occurrence.scheduled_at,
                            "claimed_at": now,
                            "replica": replica,
                        }
                        for r in chunk
                    ]
                    inserted = {row[0] for row in conn.execute(_CLAIM, rows)}
                    chunk = [r for r in chunk if r.occurrence.key in inserted]
                    if not chunk:
                        continue
                recorded = {
                    row[0]
                    for row in conn.execute(
                        _RECORD, [_run_row(r, outcome, replica, now, lease, held) for r in chunk]
                    )
                }
                won |= recorded
                prunes = [
                    {"s": o.schedule, "b": o.scheduled_at - prune[o.schedule]}
                    for o in (r.occurrence for r in chunk)
                    if o.key in recorded and o.schedule in prune
                ]
                if gated and prunes:
                    conn.execute(
                        sa.delete(claims).where(
                            claims.c.schedule == sa.bindparam("s"),
                            claims.c.scheduled_at
                            < sa.bindparam("b", type_=claims.c.claimed_at.type),
                        ),
                        prunes,
                    )
        return won

    def fence(
        self, keys: Sequence[str], *, replica: str, hold: timedelta, start: datetime | None
    ) -> tuple[list[tuple[str, datetime, datetime]], float, float]:
        fenced: list[tuple[str, datetime, datetime]] = []
        with self.statement() as conn:
            # The comparisons read the clock as the statement runs: a pause between a clock
            # read in Python and the statement would let an expired lease pass. The lease
            # granted counts from the reading at BEGIN (no other writer acts in between, and
            # a pause since only shortens it).
            now = self.database.clock()
            stmt = (
                sa.update(runs)
                .where(
                    runs.c.id.in_(sa.bindparam("keys", expanding=True)),
                    runs.c.status == Status.CLAIMED,
                    runs.c.replica == replica,
                    runs.c.lease_until > _NOW,
                    sa.or_(runs.c.deadline.is_(None), runs.c.deadline >= _NOW),
                )
                .values(
                    lease_until=sa.func.max(
                        runs.c.lease_until,
                        sa.literal(max(now, start or now) + hold, runs.c.lease_until.type),
                    )
                )
                .returning(runs.c.id, runs.c.lease_until, _NOW)
            )
            sent = self.database.monotonic()
            for chunk in chunks(keys, SQLITE_CHUNK):
                rows = conn.execute(stmt, {"keys": list(chunk)})
                fenced.extend((key, until, instant(read)) for key, until, read in rows)
            received = self.database.monotonic()
        return fenced, sent, received

    def mark(self, keys: Sequence[str]) -> list[tuple[str, str | None]]:
        marked: list[tuple[str, str | None]] = []
        with self.statement() as conn:
            stmt = (
                sa.update(runs)
                .where(runs.c.id.in_(sa.bindparam("keys", expanding=True)))
                .values(published_at=self.database.clock(), lease_until=None)
                .returning(runs.c.id, runs.c.replica)
            )
            for chunk in chunks(keys, SQLITE_CHUNK):
                rows = conn.execute(stmt, {"keys": list(chunk)})
                marked.extend((key, replica) for key, replica in rows)
        return marked

    def settle(self, keys: Sequence[str]) -> None:
        stmt = (
            sa.update(runs)
            .where(
                runs.c.id.in_(sa.bindparam("keys", expanding=True)),
                runs.c.status == Status.CLAIMED,
                runs.c.published_at.is_not(None),
            )
            .values(status=Status.PUBLISHED.value, error=None)
        )
        with self.statement() as conn:
            for chunk in chunks(keys, SQLITE_CHUNK):
                conn.execute(stmt, {"keys": list(chunk)})

    def heartbeat(
        self, beat: sa.Update, live: Callable[[Any], sa.Select[Any]]
    ) -> tuple[tuple[datetime, float, float], Sequence[sa.Row[Any]]] | None:
        with self.statement() as conn:
            sent = self.database.monotonic()
            found = conn.execute(beat.returning(_NOW, replicas.c.last_seen)).first()
            received = self.database.monotonic()
        if found is None:
            return None
        now, seen = found
        # Who was live as of this heartbeat (as PostgreSQL's one statement reads it): judged
        # at a later reading, a pause in between would leave even this replica out.
        with self.database.connect() as conn:
            rows = conn.execute(live(seen)).all()
        return (instant(now), sent, received), rows

    def ledger_connection(self, conn: Connection) -> None:
        # As PostgreSQL's synchronous_commit=off: a power loss may lose the last status
        # updates, never a claim (beat's commits stay FULL).
        driver = conn.connection.dbapi_connection
        assert driver is not None, "a new connection has a driver connection"
        driver.execute("PRAGMA synchronous=NORMAL")

    def ledger_execute(
        self, conn: Connection, stmt: sa.Select[Any] | sa.Update, params: Mapping[str, Any]
    ) -> Any:
        # A transaction of its own: BEGIN IMMEDIATE makes writers queue on the busy timeout.
        with conn.begin():
            return conn.execute(stmt, params).first()

    def ledger_clock(self) -> sa.ColumnElement[Any]:
        # This host's, read in Python and bound: one host, one clock.
        return sa.bindparam("l_clock", type_=runs.c.worker_lease_until.type)

    def ledger_lease_until(self) -> sa.ColumnElement[Any]:
        return sa.bindparam("l_lease_until", type_=runs.c.worker_lease_until.type)

    def seconds_between(self, later: Any, earlier: Any) -> sa.ColumnElement[Any]:
        # julianday() is a double of days: about 10 us of noise, so keep milliseconds.
        return sa.func.round((sa.func.julianday(later) - sa.func.julianday(earlier)) * 86400.0, 3)


def _current(conn: Connection, batch: Sequence[Run]) -> Sequence[Run]:
    """``batch`` less the runs of a revision of the schedules table whose schedule changed
    before their instant: the change decides from then on (docs/schedule-table.md)."""
    revisions = [r.revision for r in batch if r.revision is not None]
    if not revisions:
        return batch
    revised = {r.occurrence.schedule for r in batch if r.revision is not None}
    changed: dict[str, list[tuple[int, datetime]]] = collections.defaultdict(list)
    stmt = sa.select(
        schedule_changes.c.name, schedule_changes.c.revision, schedule_changes.c.changed_at
    ).where(
        schedule_changes.c.name.in_(sa.bindparam("names", expanding=True)),
        schedule_changes.c.revision > min(revisions),
    )
    for names in chunks(sorted(revised), SQLITE_CHUNK):
        for name, revision, at in conn.execute(stmt, {"names": list(names)}):
            changed[name].append((revision, at))
    return [
        r
        for r in batch
        if r.revision is None
        or not any(
            revision > r.revision and at < r.occurrence.scheduled_at
            for revision, at in changed[r.occurrence.schedule]
        )
    ]


# Executed with a list of rows: compiled once, sent as multi-row VALUES batches (SQLAlchemy's
# "insertmanyvalues"). A statement built with .values(rows) instead is compiled again for every
# chunk, a bind parameter per column and row: at 100,000 schedules a burst's claim took most
# of a minute and outlasted its runs' leases (python -m bench.profile --run 75 --store ...).
_CLAIM = sqlite.insert(claims).on_conflict_do_nothing().returning(claims.c.id)
_RECORD = sqlite.insert(runs).on_conflict_do_nothing().returning(runs.c.id)


def _run_row(
    run: Run,
    outcome: Outcome,
    replica: str,
    now: datetime,
    lease: timedelta,
    held: Mapping[str, tuple[int, int]],
) -> dict[str, Any]:
    # A claimed row's lease runs from its instant (claimed ahead) or from now (claimed late).
    o = run.occurrence
    shard, epoch = held.get(o.schedule, (None, None))
    return {
        "shard": shard,
        "epoch": epoch,
        "revision": run.revision,
        "id": o.key,
        "schedule": o.schedule,
        "task": run.task,
        "task_id": o.task_id,
        "scheduled_at": o.scheduled_at,
        "coordination_outcome": outcome.value,
        "status": run.status,
        "reason": run.reason,
        "replica": replica,
        "claimed_at": now,
        "deadline": run.deadline,
        "lease_until": (max(o.scheduled_at, now) + lease if run.status == Status.CLAIMED else None),
    }


def _configure(engine: Engine, clock: Callable[[], datetime]) -> None:
    """WAL, a busy timeout, ``BEGIN IMMEDIATE`` so that writers queue instead of failing, and
    ``voltro_now()``: the clock as the statement runs, as SQLAlchemy stores instants there
    (naive UTC text with six fraction digits, which compares with stored instants)."""

    def voltro_now() -> str:
        return clock().astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.create_function("voltro_now", 0, voltro_now)
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
        # FULL: a commit is on disk before beat sends the messages it claimed. NORMAL would
        # let a power loss roll back claims whose messages went out, and catch-up at reboot
        # would send them again. (The workers' ledger writes relax it: RunWriter.)
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    def _on_close(dbapi_conn: Any, *_: Any) -> None:
        # A connection closed in the middle of its transaction (SQLAlchemy drops one that an
        # exception such as SystemExit left mid-statement) whose cursors live on, in the
        # exception's traceback, stays open inside sqlite3 until they are collected: with its
        # write lock, which every other writer, this process's next connection included,
        # waits for (the busy timeout). Rolled back first, it holds nothing. Found by
        # tests/sim (seed 16).
        try:
            if dbapi_conn.in_transaction:
                dbapi_conn.rollback()
        except sqlite3.Error:
            pass  # closing it is all that is left to do

    event.listen(engine, "close", _on_close)
    event.listen(engine, "close_detached", _on_close)
