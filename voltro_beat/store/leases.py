"""What a run's lease comes to when its first try does not end it: recovery's writes.

A replica claims a run with a lease and, once the broker took the message, marks and settles
it (:mod:`voltro_beat.store.beat`; a message the broker refused ends its lease there at once).
Whatever else happens to the row is written here, by another replica's recovery
(:mod:`voltro_beat.engine.recovery`): a run whose lease ran out is taken over (a retry writes
only its new holder and lease; it is then published through the same fence, mark and settle
as a first try, with the same task id); past its deadline it is recorded ``missed``; marked
but never settled, it is recorded ``published``. A queued run (an overlap policy) is promoted
to a claimed one with a lease, or recorded missed. Leases and deadlines are compared with the
store's own clock as each statement runs (guarantee 10).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from voltro_beat.occurrences import Occurrence
from voltro_beat.runs import Run
from voltro_beat.status import Reason, Status
from voltro_beat.store.database import Database
from voltro_beat.store.dialect import SQLITE_CHUNK, chunks
from voltro_beat.store.tables import LIVE, instant, runs


class Leases:
    """Recovery's and the overlap guard's writes; a base of
    :class:`~voltro_beat.store.beat.BeatStore`, which holds the state."""

    database: Database
    replica: str

    # -- recovery -----------------------------------------------------------------------

    def settle_abandoned(self, *, after: timedelta) -> int:
        """Record as ``published`` the runs marked more than ``after`` ago and still
        ``claimed``: their replica stopped (or lost the store) between their mark and its
        :meth:`~voltro_beat.store.beat.BeatStore.settle`. Returns how many."""
        with self.database.connect() as conn, conn.begin():
            stmt = (
                sa.update(runs)
                .where(
                    runs.c.status == Status.CLAIMED,
                    runs.c.published_at < self.database.now() - after,
                )
                .values(status=Status.PUBLISHED.value, error=None)
            )
            return conn.execute(stmt).rowcount

    def any_lapsed(self) -> bool:
        """Whether some ``claimed`` run's lease ran out (cheap: the lease index)."""
        with self.database.connect() as conn:
            stmt = sa.select(runs.c.id).where(_lapsed(self.database.now())).limit(1)
            return conn.execute(stmt).first() is not None

    def take_over(
        self, *, schedules: Container[str], hold: timedelta, limit: int
    ) -> list[Occurrence]:
        """Take over at most ``limit`` ``claimed`` runs of ``schedules`` whose lease ran out
        (a replica crashed, stopped or lost the broker) and whose deadline has not passed:
        they are this replica's, leased for ``hold``, oldest first. Returns their
        occurrences.

        A conditional update: of several replicas at once, exactly one gets each row (SKIP
        LOCKED on PostgreSQL; SQLite serialises writers), and none while the holder's lease
        runs (guarantee 10).
        """
        with self.database.connect() as conn, conn.begin():
            now = self.database.now()
            due = sa.or_(runs.c.deadline.is_(None), runs.c.deadline >= now)
            found = self._oldest_lapsed(conn, now, due, limit, lambda name, _: name in schedules)
            if not found:
                return []
            stmt = (
                sa.update(runs)
                .where(runs.c.id.in_([key for key, _, _ in found]), _lapsed(now))
                .values(replica=self.replica, lease_until=now + hold)
                .returning(runs.c.schedule, runs.c.scheduled_at, runs.c.id, runs.c.task_id)
            )
            taken = [Occurrence(*row) for row in conn.execute(stmt)]
            return sorted(taken, key=lambda o: (o.scheduled_at, o.key))

    def expire(self, *, known: Container[str], limit: int) -> list[Run]:
        """Record as ``missed`` at most ``limit`` ``claimed`` runs whose lease ran out and
        whose deadline passed (guarantee 6), whatever their schedule: reason
        ``broker_refused`` if the broker refused its last try
        (:meth:`~voltro_beat.store.beat.BeatStore.refuse`), else ``publish_failed`` for a
        schedule in ``known`` (a live replica runs it), else ``unknown_schedule`` (removed or
        renamed: nobody could publish it). Returns them."""
        with self.database.connect() as conn, conn.begin():
            now = self.database.now()
            by_reason: dict[Reason, list[str]] = {}
            for key, name, error in self._oldest_lapsed(conn, now, runs.c.deadline < now, limit):
                reason = (
                    Reason.BROKER_REFUSED
                    if error is not None
                    else Reason.PUBLISH_FAILED
                    if name in known
                    else Reason.UNKNOWN_SCHEDULE
                )
                by_reason.setdefault(reason, []).append(key)
            expired: list[Run] = []
            for reason, keys in by_reason.items():
                stmt = (
                    sa.update(runs)
                    .where(runs.c.id.in_(keys), _lapsed(now))
                    .values(status=Status.MISSED.value, reason=reason.value, lease_until=None)
                    .returning(
                        runs.c.schedule, runs.c.scheduled_at, runs.c.id, runs.c.task_id, runs.c.task
                    )
                )
                expired += [
                    Run(Occurrence(name, at, key, task_id), task, Status.MISSED, reason.value)
                    for name, at, key, task_id, task in conn.execute(stmt)
                ]
            return sorted(expired, key=lambda r: (r.occurrence.scheduled_at, r.occurrence.key))

    # -- queued runs (overlap) ----------------------------------------------------------

    def mark_missed(self, keys: Iterable[str], *, reason: Reason, waiting: Status) -> None:
        """Record runs still ``waiting`` (queued, say) as missed, saying why."""
        keys = list(keys)
        if not keys:
            return
        stmt = (
            sa.update(runs)
            .where(runs.c.id.in_(sa.bindparam("keys", expanding=True)), runs.c.status == waiting)
            .values(status=Status.MISSED.value, reason=reason.value, lease_until=None)
        )
        self._write_in_chunks(stmt, keys)

    def live_runs(self, schedules: Sequence[str], *, since: datetime) -> list[Run]:
        """Unfinished runs (in flight or queued) of ``schedules`` scheduled at or after
        ``since``, each with when it last moved."""
        stmt = sa.select(
            runs.c.schedule,
            runs.c.scheduled_at,
            runs.c.id,
            runs.c.task_id,
            runs.c.task,
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
        found: list[Run] = []
        with self.database.connect() as conn:
            for chunk in chunks(list(schedules), SQLITE_CHUNK):
                for name, at, key, task_id, task, status, reason, moved in conn.execute(
                    stmt, {"names": chunk}
                ):
                    occurrence = Occurrence(name, at, key, task_id)
                    # coalesce() loses the column type on SQLite: parse the text back.
                    moved_at = instant(moved)
                    found.append(Run(occurrence, task, Status(status), reason, since=moved_at))
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

    def promote(self, key: str, *, lease: timedelta) -> bool:
        """Turn the ``queued`` run ``key`` into a claimed one of this replica, leased for
        ``lease``; False if another replica did first."""
        with self.database.connect() as conn, conn.begin():
            now = self.database.now()
            stmt = (
                sa.update(runs)
                .where(runs.c.id == key, runs.c.status == Status.QUEUED)
                .values(
                    status=Status.CLAIMED.value,
                    claimed_at=now,
                    replica=self.replica,
                    lease_until=now + lease,
                )
            )
            return bool(conn.execute(stmt).rowcount)

    def _oldest_lapsed(
        self,
        conn: sa.Connection,
        now: Any,
        where: sa.ColumnElement[bool],
        limit: int,
        keep: Callable[[str, str | None], bool] = lambda _name, _error: True,
    ) -> list[tuple[str, str, str | None]]:
        """At most ``limit`` ``claimed`` runs whose lease ran out by ``now``, also ``where``, that
        ``keep`` (given the schedule and the error) keeps: (key, schedule, error), oldest first,
        locked for this transaction (rows another one locked are skipped).

        Read a page of ``limit`` at a time, in order, until ``limit`` were kept: recovery passes
        the schedules it may publish as a set to test here, where a statement carrying them (a
        million names in cluster coordination) cost a second per chunk to send and join.
        """
        found: list[tuple[str, str, str | None]] = []
        page = sa.select(runs.c.id, runs.c.schedule, runs.c.error, runs.c.scheduled_at).where(
            _lapsed(now), where
        )
        after: tuple[datetime, str] | None = None
        while len(found) < limit:
            stmt = page
            if after is not None:
                at, key = after
                stmt = stmt.where(
                    sa.or_(
                        runs.c.scheduled_at > at,
                        sa.and_(runs.c.scheduled_at == at, runs.c.id > key),
                    )
                )
            ordered = stmt.order_by(runs.c.scheduled_at, runs.c.id).limit(limit)
            rows = conn.execute(self.database.dialect.skip_locked(ordered)).all()
            found += [(key, name, error) for key, name, error, _ in rows if keep(name, error)]
            if len(rows) < limit:
                break
            after = (rows[-1].scheduled_at, rows[-1].id)
        return found[:limit]

    def _write_in_chunks(self, stmt: sa.Executable, keys: list[str]) -> None:
        batches = list(chunks(keys, SQLITE_CHUNK))
        if len(batches) == 1:
            with self.database.dialect.statement() as conn:
                conn.execute(stmt, {"keys": batches[0]})
            return
        with self.database.connect() as conn, conn.begin():
            for batch in batches:
                conn.execute(stmt, {"keys": batch})


def _lapsed(now: Any) -> sa.ColumnElement[bool]:
    """A ``claimed`` row whose lease ran out by ``now``."""
    return sa.and_(runs.c.status == Status.CLAIMED, runs.c.lease_until < now)
