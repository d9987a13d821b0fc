"""The worker's side of the store: one conditional UPDATE per run-ledger event.

:mod:`voltro_beat.ledger` decides what an event does (a :class:`~voltro_beat.ledger.Transition`),
:mod:`voltro_beat.signals` calls :meth:`RunWriter.advance` from the worker's signals, and this
module turns the transition into SQL. Workers run these on every task, often in parallel, so
each is one statement on a connection kept per thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from voltro_beat.ledger import RunState, Stamp, Transition
from voltro_beat.status import Status
from voltro_beat.store.database import Database
from voltro_beat.store.tables import runs

logger = logging.getLogger(__name__)

#: A statement of the writer: one of the named ones below, or (stamp, by key, from, attempt
#: from, held from) for a transition.
_Shape = tuple[Any, ...]
_STATE: _Shape = ("state",)
_RENEW: _Shape = ("renew",)
_DUPLICATE: _Shape = ("duplicate",)


class RunWriter:
    """Applies ledger transitions to the runs table of ``database`` from one process."""

    def __init__(self, database: Database, *, local: Callable[[], Any] = threading.local) -> None:
        self.database = database
        #: Makes the per-thread holder of the connection (a simulation, whose "threads" are
        #: greenlets, hands in a greenlet-local one).
        self._new_local = local
        self._local = local()
        # Built once per shape: a worker runs the same few statements all day.
        self._statements: dict[_Shape, sa.Select[Any] | sa.Update] = {}

    def advance(
        self,
        move: Transition,
        *,
        now: datetime,
        key: str | None = None,
        task_id: str | None = None,
        attempt: int = 0,
        worker: str | None = None,
        started_at: datetime | None = None,
        reason: str | None = None,
        error: str | None = None,
        lease: timedelta | None = None,
    ) -> bool:
        """Apply ``move`` for an event of ``attempt`` as a single conditional UPDATE; True if
        the row moved.

        The row is found by ``key``, else by ``task_id``. Nothing moves when the row is missing
        or its status is not one ``move`` leaves, so duplicate and late events are no-ops and
        concurrent writers need no read-then-write (PostgreSQL re-checks the WHERE clause
        against the row a concurrent writer just committed). A start holds the row for
        ``lease`` on the database's clock (the worker's start claim; None: not held).
        """
        if key is None and task_id is None:
            raise ValueError("advance needs a key or a task id")
        shape = (
            move.stamp,
            key is not None,
            move.from_statuses,
            move.attempt_statuses,
            move.held_statuses,
        )
        params = {
            "l_key": key,
            "l_task_id": task_id,
            "l_status": move.status.value,
            "l_attempt": attempt,
            "l_retries": move.retries_written(attempt),
            "l_now": now,
            "l_worker": worker,
            "l_started_at": started_at,
            "l_reason": reason,
            "l_error": error,
            **self._lease_params(lease),
        }
        return self._execute(shape, params) is not None

    def state(self, key: str) -> RunState | None:
        """Run ``key`` as the state machine sees it (held: its worker lease has not lapsed on
        the database's clock), or None if there is no such row."""
        row = self._execute(_STATE, {"l_key": key, **self._lease_params(None)})
        return None if row is None else RunState(Status(row[0]), row[1] or 0, bool(row[2]))

    def renew(self, key: str, *, worker: str, lease: timedelta) -> bool:
        """Hold run ``key`` for ``lease`` more, if it is still ``started`` by ``worker``."""
        params = {"l_key": key, "l_worker": worker, **self._lease_params(lease)}
        return self._execute(_RENEW, params) is not None

    def count_duplicate(self, key: str) -> None:
        """Count one delivery of ``key`` whose body the worker did not run."""
        self._execute(_DUPLICATE, {"l_key": key})

    def discard(self) -> None:
        """Forget the connections without closing them: this process is a forked child, and
        the sockets belong to the parent, which still uses them."""
        self._local = self._new_local()
        self.database.dispose(close=False)

    def close(self) -> None:
        self._drop()
        self.database.dispose()

    # -- plumbing ------------------------------------------------------------------------

    def _lease_params(self, lease: timedelta | None) -> dict[str, Any]:
        """The parameters of the worker lease, for the dialect's statements to take what they
        need: ``l_clock`` and ``l_lease_until`` (read on ``database.clock``: SQLite's, one
        host) or ``l_lease`` (an interval from the database's clock: PostgreSQL's)."""
        clock = self.database.clock()
        return {
            "l_clock": clock,
            "l_lease": lease,
            "l_lease_until": None if lease is None else clock + lease,
        }

    def _execute(self, shape: _Shape, params: Mapping[str, Any]) -> Any:
        """Run the statement ``shape`` on this thread's connection.

        Returns the first row (None if no row). The worker writes twice
        per task, so the connection is checked out once and kept (per thread), not taken from
        the pool per write: a checkout's pre-ping and reset cost more than the UPDATE. A
        connection the server dropped is replaced and the statement retried once (every
        statement here is safe to repeat).
        """
        for attempt in (1, 2):
            conn = self._connection()
            try:
                return self.database.dialect.ledger_execute(conn, self._statement(shape), params)
            except SQLAlchemyError as exc:
                self._drop()
                lost = isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated
                if attempt == 1 and lost:
                    continue
                raise self.database.error(exc) from exc
            except Exception as exc:
                # The driver's own errors, where the dialect runs the statement on the driver.
                driver = conn.connection.dbapi_connection
                lost = driver is None or driver.closed or getattr(driver, "broken", False)
                self._drop()
                if attempt == 1 and lost:
                    continue
                raise self.database.error(exc) from exc
        raise AssertionError("unreachable")

    def _connection(self) -> Connection:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is not None and not conn.closed and not conn.invalidated:
            return conn
        conn = None
        try:
            conn = self.database.engine.connect()
            # Out of the pool for good: its session settings (the dialect's) never reach another
            # user of the pool, and no pool finalizer can touch it after a fork (the driver
            # itself closes a connection only in the process that opened it).
            conn.detach()
            self.database.dialect.ledger_connection(conn)
        except Exception as exc:
            if conn is not None:
                self._local.conn = conn
                self._drop()
            raise self.database.error(exc) from exc
        self._local.conn = conn
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            try:
                conn.invalidate()
                conn.close()
            except Exception:
                # A broken connection may fail to close; it is being replaced either way.
                logger.debug("closing a broken ledger connection failed", exc_info=True)

    def _statement(self, shape: _Shape) -> sa.Select[Any] | sa.Update:
        stmt = self._statements.get(shape)
        if stmt is None:
            by_key = runs.c.id == sa.bindparam("l_key", type_=sa.Text)
            if shape == _STATE:
                stmt = sa.select(runs.c.status, runs.c.retries, self._held()).where(by_key)
            elif shape == _RENEW:
                stmt = (
                    sa.update(runs)
                    .where(
                        by_key,
                        runs.c.status == sa.literal_column(f"'{Status.STARTED.value}'"),
                        runs.c.worker == sa.bindparam("l_worker", type_=sa.Text),
                    )
                    .values(worker_lease_until=self.database.dialect.ledger_lease_until())
                    .returning(runs.c.id)
                )
            elif shape == _DUPLICATE:
                stmt = (
                    sa.update(runs)
                    .where(by_key)
                    .values(
                        duplicates=sa.func.coalesce(runs.c.duplicates, sa.literal_column("0"))
                        + sa.literal_column("1")
                    )
                    .returning(runs.c.id)
                )
            else:
                stmt = self._update(*shape)
            self._statements[shape] = stmt
        return stmt

    def _held(self) -> sa.ColumnElement[bool]:
        """Whether the row's worker lease runs (a start claim that has not lapsed)."""
        until = runs.c.worker_lease_until
        return sa.and_(until.is_not(None), until >= self.database.dialect.ledger_clock())

    def _update(
        self,
        stamp: Stamp,
        by_key: bool,
        from_statuses: frozenset[Status],
        attempt_statuses: frozenset[Status],
        held_statuses: frozenset[Status],
    ) -> sa.Update:
        """The UPDATE of one transition shape: the columns its :class:`Stamp` names."""
        when = runs.c.started_at.type
        now = sa.bindparam("l_now", type_=when)
        started = sa.func.coalesce(runs.c.started_at, sa.bindparam("l_started_at", type_=when))

        def among(statuses: frozenset[Status]) -> sa.ColumnElement[bool]:
            # Inlined: the sets are constants of the state machine, so the SQL text is fixed.
            listed: list[sa.ColumnElement[Any]] = [
                sa.literal_column(f"'{s.value}'") for s in Status if s in statuses
            ]
            return runs.c.status.in_(listed)

        attempt = sa.bindparam("l_attempt", type_=sa.Integer)
        moves = among(from_statuses)
        if attempt_statuses:
            moves = sa.or_(moves, sa.and_(among(attempt_statuses), runs.c.retries <= attempt))
        if held_statuses:
            moves = sa.or_(
                moves,
                sa.and_(
                    among(held_statuses),
                    sa.or_(
                        runs.c.retries < attempt,
                        sa.and_(runs.c.retries == attempt, sa.not_(self._held())),
                    ),
                ),
            )
        target = (
            runs.c.id == sa.bindparam("l_key", type_=sa.Text)
            if by_key
            else runs.c.task_id == sa.bindparam("l_task_id", type_=sa.Text)
        )
        values: dict[str, Any] = {"status": sa.bindparam("l_status", type_=sa.Text)}
        if stamp is Stamp.START:
            values.update(
                started_at=now,
                worker=sa.bindparam("l_worker", type_=sa.Text),
                retries=sa.bindparam("l_retries", type_=sa.Integer),
                worker_lease_until=self.database.dialect.ledger_lease_until(),
            )
        elif stamp is Stamp.RETRY:
            values.update(
                retries=sa.bindparam("l_retries", type_=sa.Integer),
                reason=sa.bindparam("l_reason", type_=sa.Text),
            )
        else:
            seconds = self.database.dialect.seconds_between(now, started)
            values.update(
                finished_at=now,
                started_at=started,
                duration=sa.cast(seconds, sa.Float),
                error=sa.bindparam("l_error", type_=sa.Text),
                reason=sa.func.coalesce(sa.bindparam("l_reason", type_=sa.Text), runs.c.reason),
                worker=sa.func.coalesce(runs.c.worker, sa.bindparam("l_worker", type_=sa.Text)),
            )
        return sa.update(runs).where(target, moves).values(**values).returning(runs.c.id)
