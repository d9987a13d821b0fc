"""PostgreSQL (psycopg 3): the :class:`~voltro_beat.store.dialect.Dialect` of a store that
replicas on several hosts share, and the statements of beat's firing path written for it by
hand.

One statement, one round trip, whatever the batch size: the batch travels as one JSON
parameter (psycopg dumps a text parameter in C, while Python lists as arrays cost more than
the statement itself), and data-modifying CTEs make claims + runs + pruning one atomic
statement. Every instant a lease or a deadline is compared with is ``clock_timestamp()``: the
database's clock when the statement runs, never a value a replica computed before a pause
(guarantees 9 and 10).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL, Connection, Engine

from voltro_beat.clock import ClockMode
from voltro_beat.coordination import Outcome
from voltro_beat.runs import Run
from voltro_beat.shards import Tenure
from voltro_beat.status import Status
from voltro_beat.store.dialect import Dialect, chunks
from voltro_beat.store.tables import (
    CLAIMS,
    RUNS,
    SCHEDULE_CHANGES,
    SHARDS,
    WATERMARKS,
    replicas,
)

if TYPE_CHECKING:
    from voltro_beat.store.database import Database

#: Random 64-bit key of the advisory lock that serialises schema upgrades.
MIGRATION_LOCK = 0x766F6C74726F6D67
#: Random 64-bit key of the advisory lock that serialises changes of the schedules table.
EDITS_LOCK = 0x766F6C7472656474
#: Runs recorded ``published`` per :data:`SETTLE` statement, so that a worker's ledger write
#: never waits long on their row locks.
SETTLE_BATCH = 1_000

_CLOCK = sa.func.clock_timestamp(type_=sa.DateTime(timezone=True))

_CLAIMED = f"'{Status.CLAIMED}'"
_PUBLISHED = f"'{Status.PUBLISHED}'"

_INPUT = f"""
WITH input AS (
    SELECT e->>0 AS id, e->>1 AS schedule, e->>2 AS task, e->>3 AS task_id,
           CAST(e->>4 AS timestamptz) AS scheduled_at, e->>5 AS status, e->>6 AS reason,
           CAST(e->>7 AS timestamptz) AS prune_before, CAST(e->>8 AS timestamptz) AS deadline,
           CAST(e->>9 AS integer) AS shard, CAST(e->>10 AS integer) AS epoch,
           CAST(e->>11 AS integer) AS revision
    FROM json_array_elements(CAST(:rows AS json)) AS e
    -- Older than a run row the retention swept: refused (BeatStore.delete_expired).
    WHERE CAST(e->>4 AS timestamptz) >= COALESCE(
        (SELECT w.before FROM {WATERMARKS} w WHERE w.name = '{RUNS}'), '-infinity')
    -- Of a revision of the schedules table its schedule changed from before its instant:
    -- refused, the change decides from then on (docs/schedule-table.md).
      AND (e->>11 IS NULL OR NOT EXISTS (
        SELECT 1 FROM {SCHEDULE_CHANGES} c
        WHERE c.name = e->>1 AND c.revision > CAST(e->>11 AS integer)
          AND c.changed_at < CAST(e->>4 AS timestamptz)))
)"""

# A claimed row's lease runs from its instant (claimed ahead) or from now (claimed late).
_RUNS_INSERT = f"""
    INSERT INTO {RUNS}
        (id, schedule, task, task_id, scheduled_at, coordination_outcome, status, reason,
         replica, claimed_at, deadline, shard, epoch, revision, lease_until)
    SELECT i.id, i.schedule, i.task, i.task_id, i.scheduled_at, :outcome, i.status, i.reason,
           :replica, clock_timestamp(), i.deadline, i.shard, i.epoch, i.revision,
           CASE WHEN i.status = {_CLAIMED}
                THEN GREATEST(i.scheduled_at, clock_timestamp()) + make_interval(secs => :lease)
           END
    FROM input i {{join}}
    ON CONFLICT DO NOTHING
    RETURNING id"""

#: A shard owner claims only what it still owns: its shard at the epoch it holds, under a lease
#: that has not run out as the statement runs (guarantee 14). Parameter: group.
_OWNED = f"""
    WHERE EXISTS (
        SELECT 1 FROM {SHARDS} s
        WHERE s.shard_group = :group AND s.shard = i.shard AND s.epoch = i.epoch
          AND s.owner = :replica AND s.lease_until > clock_timestamp())"""


def _claim(owned: str) -> str:
    """Claims, then run rows for the claims that went in, then the winner's pruning of its
    schedules' older claims; returns the keys won. Parameters: rows (JSON), replica, outcome,
    lease (seconds), and those of ``owned`` (a condition on the input row ``i``)."""
    return (
        _INPUT
        + f""",
gated AS (
    INSERT INTO {CLAIMS} (id, schedule, scheduled_at, claimed_at, replica)
    SELECT i.id, i.schedule, i.scheduled_at, clock_timestamp(), :replica FROM input i {owned}
    ON CONFLICT DO NOTHING
    RETURNING id
),
recorded AS ("""
        + _RUNS_INSERT.format(join="JOIN gated g ON g.id = i.id")
        + f"""
),
pruned AS (
    DELETE FROM {CLAIMS} c
    USING recorded r JOIN input i ON i.id = r.id
    WHERE c.schedule = i.schedule AND c.scheduled_at < i.prune_before
)
SELECT id FROM recorded"""
    )


#: Through the claims table (``advisory_lock``, the external trigger, operators' commands).
CLAIM = _claim("")
#: Through the claims table, as a shard's owner (``cluster``); also parameter ``group``.
CLAIM_OWNED = _claim(_OWNED)

#: Run rows only (``single`` coordination); returns the keys recorded.
RECORD = (
    _INPUT
    + """,
recorded AS ("""
    + _RUNS_INSERT.format(join="")
    + """
)
SELECT id FROM recorded"""
)

# The two statements below find their rows with ``id = ANY(array)``, an index lookup per key
# whatever the planner thinks of the table: joined with a JSON function instead, a stale row
# estimate can make it rescan the keys for every row (quadratic in the chunk).

#: The publish fence: of the runs in ``keys`` (a text array), those this replica still
#: holds, whose lease has not run out and whose deadline has not passed, are leased until
#: ``hold`` seconds after ``start`` (their instant, when fenced ahead of it) or after now,
#: whichever is later, never sooner than their lease ran already (a claim behind a backlog
#: is leased longer, voltro_beat.engine.recorder.WRITE_COST); returns each with its lease and
#: the database's clock as the statement ran (a reading the dispatcher bounds its clock with).
#: A recovery takeover needs the lease run out, so of the two only one can win a row
#: (guarantee 10).
FENCE = f"""
UPDATE {RUNS} AS r
SET lease_until = GREATEST(
    r.lease_until,
    GREATEST(CAST(:start AS timestamptz), clock_timestamp()) + make_interval(secs => :hold))
WHERE r.id = ANY(CAST(:keys AS text[])) AND r.status = {_CLAIMED} AND r.replica = :replica
  AND r.lease_until > clock_timestamp()
  AND (r.deadline IS NULL OR r.deadline >= clock_timestamp())
RETURNING r.id, r.lease_until, clock_timestamp()"""

#: Stamp the publish time of the runs in ``keys`` (a text array) and end their leases; returns
#: each key and the replica its row names now. No indexed column changes (the status waits for
#: :data:`SETTLE`), so on a page with room PostgreSQL updates each row in place: the mark is on
#: the critical path of a burst, between one chunk's broker write and the next.
MARK_PUBLISHED = f"""
UPDATE {RUNS} AS r
SET published_at = clock_timestamp(), lease_until = NULL
WHERE r.id = ANY(CAST(:keys AS text[]))
RETURNING r.id, r.replica"""

#: The marked runs in ``keys`` (a text array) still ``claimed`` become ``published`` (a
#: refusal noted at an earlier try is cleared). The worker may already have moved a row on
#: (started, even succeeded): its status stays.
SETTLE = f"""
UPDATE {RUNS} AS r
SET status = {_PUBLISHED}, error = NULL
WHERE r.id = ANY(CAST(:keys AS text[])) AND r.status = {_CLAIMED}
  AND r.published_at IS NOT NULL"""


class PostgreSQL(Dialect):
    """PostgreSQL through psycopg 3: the database's clock is the server's, which every replica
    reads (guarantee 9)."""

    name = "postgresql"

    def __init__(self, database: Database) -> None:
        super().__init__(database)
        #: The ledger's statements compiled to SQL, once each.
        self._compiled: dict[sa.Select[Any] | sa.Update, str] = {}

    def create_engine(self, url: URL) -> Engine:
        return sa.create_engine(
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

    @contextmanager
    def statement(self) -> Iterator[Connection]:
        # Autocommit: one statement needs no BEGIN and COMMIT round trips.
        with self.database.connect(autocommit=True) as conn:
            yield conn

    def lock_schema(self, conn: Connection) -> None:
        # Transaction-scoped, so a crash mid-upgrade cannot leave the lock held.
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})

    def lock_edits(self, conn: Connection) -> None:
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": EDITS_LOCK})

    def clock_mode(self, setting: ClockMode | None) -> ClockMode:
        return setting or ClockMode.DATABASE

    def now(self) -> Any:
        return _CLOCK

    def statement_clock(self) -> sa.ColumnElement[Any]:
        return _CLOCK

    def insert(self, table: sa.Table) -> postgresql.Insert:
        return postgresql.insert(table)

    def greatest(self, *values: Any) -> sa.ColumnElement[Any]:
        return sa.func.greatest(*values)

    def names(self) -> sa.TextClause:
        return sa.text("SELECT json_array_elements_text(CAST(:names AS json)) AS name")

    def skip_locked(self, select: sa.Select[Any]) -> sa.Select[Any]:
        return select.with_for_update(skip_locked=True)

    def row_estimates(self, tables: Sequence[str]) -> dict[str, int]:
        # reltuples is -1 before the first VACUUM or ANALYZE: not known yet.
        stmt = sa.text("SELECT relname, reltuples FROM pg_class WHERE relname IN :names")
        stmt = stmt.bindparams(sa.bindparam("names", expanding=True))
        with self.database.connect() as conn:
            rows = conn.execute(stmt, {"names": list(tables)})
            return {name: max(0, int(n)) for name, n in rows}

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
        held = {} if tenure is None else tenure.held
        rows = []
        for run in batch:
            o = run.occurrence
            grace = prune.get(o.schedule)
            rows.append(
                [
                    o.key,
                    o.schedule,
                    run.task,
                    o.task_id,
                    o.scheduled_at.isoformat(),
                    run.status,
                    run.reason,
                    None if grace is None else (o.scheduled_at - grace).isoformat(),
                    None if run.deadline is None else run.deadline.isoformat(),
                    *held.get(o.schedule, (None, None)),
                    run.revision,
                ]
            )
        params: dict[str, Any] = {
            "rows": json.dumps(rows),
            "replica": replica,
            "outcome": outcome.value,
            "lease": lease.total_seconds(),
        }
        statement = RECORD
        if tenure is not None:
            statement, params["group"] = CLAIM_OWNED, tenure.group
        elif gated:
            statement = CLAIM
        revised = any(run.revision is not None for run in batch)
        with self._between_edits() if revised else self.statement() as conn:
            return {row[0] for row in conn.execute(sa.text(statement), params)}

    @contextmanager
    def _between_edits(self) -> Iterator[Connection]:
        """A transaction holding the edits lock shared. A claim of schedules-table runs needs
        it: an edit under way has stamped its change and not committed it, and the claim's
        check cannot see it yet. The claim waits for it, and holds the next edit off until it
        commits (that edit's changed_at then comes after it)."""
        with self.database.connect() as conn, conn.begin():
            conn.execute(sa.text("SELECT pg_advisory_xact_lock_shared(:k)"), {"k": EDITS_LOCK})
            yield conn

    def fence(
        self, keys: Sequence[str], *, replica: str, hold: timedelta, start: datetime | None
    ) -> tuple[list[tuple[str, datetime, datetime]], float, float]:
        params = {
            "keys": list(keys),
            "replica": replica,
            "hold": hold.total_seconds(),
            "start": start,
        }
        with self.statement() as conn:
            sent = self.database.monotonic()
            rows = conn.execute(sa.text(FENCE), params).all()
            received = self.database.monotonic()
        return [(key, until, clock) for key, until, clock in rows], sent, received

    def mark(self, keys: Sequence[str]) -> list[tuple[str, str | None]]:
        with self.statement() as conn:
            rows = conn.execute(sa.text(MARK_PUBLISHED), {"keys": list(keys)})
            return [(key, replica) for key, replica in rows]

    def settle(self, keys: Sequence[str]) -> None:
        with self.statement() as conn:
            for batch in chunks(keys, SETTLE_BATCH):
                conn.execute(sa.text(SETTLE), {"keys": list(batch)})

    def heartbeat(
        self, beat: sa.Update, live: Callable[[Any], sa.Select[Any]]
    ) -> tuple[tuple[datetime, float, float], Sequence[sa.Row[Any]]] | None:
        # One statement: the update's CTE, then the live rows as they were before it (this
        # replica's own row then shows its previous heartbeat, which is live anyway). The
        # outer join keeps the clock's reading when no row is live. A lateral subquery is
        # joined by a nested loop, here over the CTE's one row: its rows keep ``live``'s order.
        cte = beat.returning(replicas.c.last_seen.label("now")).cte("beat")
        seen = live(cte.c.now).lateral("live")
        stmt = sa.select(cte.c.now, seen).select_from(cte.outerjoin(seen, sa.true()))
        with self.statement() as conn:
            sent = self.database.monotonic()
            rows = conn.execute(stmt).all()
            received = self.database.monotonic()
        if not rows:
            return None
        now = rows[0].now
        assert isinstance(now, datetime)
        return (now, sent, received), rows

    def ledger_connection(self, conn: Connection) -> None:
        driver = conn.connection.dbapi_connection
        assert driver is not None, "a new connection has a driver connection"
        # Autocommit: each write is one round trip, no BEGIN/COMMIT.
        driver.autocommit = True
        # Status updates do not wait for the WAL flush: a database crash may lose the last
        # fraction of a second of them (a row then shows an earlier status; claims and run
        # rows, written by beat, stay fully durable). This halves the ledger's cost per task
        # and keeps it flat while other writers keep the disk busy. The statement timeout
        # bounds how long a task can wait on a ledger write (a row locked by a stuck
        # transaction).
        driver.execute("SET synchronous_commit = off; SET statement_timeout = 5000")

    def ledger_execute(
        self, conn: Connection, stmt: sa.Select[Any] | sa.Update, params: Mapping[str, Any]
    ) -> Any:
        # The statement is compiled to SQL once; each write then goes to psycopg directly, in
        # autocommit: one round trip, and none of SQLAlchemy's per-execution work, which on
        # a busy worker costs about as much as the UPDATE itself. Parameters are our own
        # aware datetimes, strings and ints, which psycopg adapts as SQLAlchemy would.
        sql = self._compiled.get(stmt)
        if sql is None:
            sql = str(stmt.compile(dialect=self.database.engine.dialect))
            self._compiled[stmt] = sql
        # psycopg 3 is not an asyncio driver: its DB-API connection is the driver's own.
        driver = conn.connection.dbapi_connection
        assert driver is not None, "a live connection has a driver connection"
        return driver.execute(sql, params).fetchone()

    def ledger_clock(self) -> sa.ColumnElement[Any]:
        return _CLOCK

    def ledger_lease_until(self) -> sa.ColumnElement[Any]:
        return _CLOCK + sa.bindparam("l_lease", type_=sa.Interval)

    def seconds_between(self, later: Any, earlier: Any) -> sa.ColumnElement[Any]:
        return sa.extract("epoch", sa.cast(later, sa.DateTime(timezone=True)) - earlier)
