"""Beat's side of the store: claims, run rows, the publish fence, recovery and retention.

Every write of the firing path is one statement or one short transaction per batch; every
driver error leaves here as :class:`~voltro_beat.exceptions.StoreError` (guarantee 5: the
scheduler fails closed on it). Leases and deadlines are compared with the store's own clock
as each statement runs (PostgreSQL's ``clock_timestamp()``, SQLite's process clock), never with
an instant a replica computed earlier (guarantees 9 and 10). What the dialects do differently,
the database's :class:`~voltro_beat.store.dialect.Dialect` does.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import sqlalchemy as sa

from voltro_beat.clock import Reading
from voltro_beat.coordination import Coordination, Outcome
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.occurrences import Occurrence
from voltro_beat.runs import Run
from voltro_beat.status import KEPT_BY_RETENTION, Reason, Status
from voltro_beat.store.database import Database
from voltro_beat.store.dialect import SQLITE_CHUNK, chunks
from voltro_beat.store.tables import (
    LIVE,
    RUNS,
    claims,
    instant,
    metadata,
    replicas,
    runs,
    watermarks,
)

#: Rows deleted per retention transaction: short enough that the claim path never waits long
#: behind it (SQLite has one writer at a time).
SWEEP_BATCH = 5_000


class Fence(NamedTuple):
    """What the publish fence let through: the keys, the earliest lease it granted them, and
    the database's clock as the statement read it (both None if it let none through)."""

    keys: set[str]
    held_until: datetime | None
    reading: Reading | None


class BeatStore:
    """What a beat replica reads and writes, as replica ``replica`` of ``database``."""

    def __init__(self, database: Database, *, replica: str) -> None:
        self.database = database
        self.replica = replica
        #: Tables of the app's retention policies, as read from the database.
        self._reflected: dict[str, sa.Table] = {}

    @property
    def display_url(self) -> str:
        return self.database.display_url

    # -- claim path --------------------------------------------------------------------

    def claim(
        self,
        runs: Sequence[Run],
        *,
        coordination: Coordination,
        lease: timedelta,
        prune: Mapping[str, timedelta] | None = None,
    ) -> set[str]:
        """Record ``runs``; return the keys of those this replica won.

        Under a coordination that claims, each key first goes through the claims table
        (guarantee 2); either way the run row's primary key is the last fence (guarantee 4).
        Claims and run rows are one transaction (guarantee 3). A ``claimed`` row is this
        replica's to publish for ``lease`` from its instant (or from now, if that is later).
        ``prune`` maps a schedule to how long its claims outlive a newer win: the winner
        deletes the older ones.
        """
        return self._claim(runs, coordination.claims, coordination.outcome, lease, prune or {})

    def claim_external(self, run: Run, *, lease: timedelta) -> bool:
        """Record ``run`` for an external trigger; True if this call won it.

        Always through the claims table, whatever the coordination: the duplicate comes from
        the platform that triggers (a CronJob may start twice), not from a second replica.
        The run row's outcome is ``external``.
        """
        return bool(self._claim([run], True, Outcome.EXTERNAL, lease, {}))

    def _claim(
        self,
        runs: Sequence[Run],
        gated: bool,
        outcome: Outcome,
        lease: timedelta,
        prune: Mapping[str, timedelta],
    ) -> set[str]:
        if not runs:
            return set()
        return self.database.dialect.claim(
            runs, gated=gated, outcome=outcome, lease=lease, prune=prune, replica=self.replica
        )

    def fence(
        self, keys: Iterable[str], *, hold: timedelta, start: datetime | None = None
    ) -> Fence:
        """The publish fence: of ``keys``, the runs this replica may send now.

        A run qualifies while it is ``claimed``, names this replica, its lease has not run out
        and its deadline has not passed; its lease then runs until ``hold`` after ``start``
        (the instant of runs fenced ahead of it) or after now, whichever is later. Recovery
        takes a row over only once its lease ran out, so for each row exactly one of the two
        wins (guarantee 10). Call it right before the broker write: whatever pause comes after
        it counts against the lease, which :class:`Fence` says the end of.
        """
        keys = list(keys)
        if not keys:
            return Fence(set(), None, None)
        rows, sent, received = self.database.dialect.fence(
            keys, replica=self.replica, hold=hold, start=start
        )
        if not rows:
            return Fence(set(), None, None)
        clock = [read for _, _, read in rows]
        return Fence(
            {key for key, _, _ in rows},
            min(until for _, until, _ in rows),
            Reading(min(clock), max(clock), sent, received),
        )

    def mark_published(self, keys: Iterable[str]) -> set[str]:
        """Stamp ``published_at`` and end the leases of ``keys``, whose messages the broker
        confirmed: from then on no recovery takes them over. Returns the keys whose row names
        another replica by now: sent after this replica lost them (see guarantee 10).

        The status moves in :meth:`settle`: a mark changes no indexed column, so on PostgreSQL
        it updates each row in place, cheap enough to come between two chunks of a burst.
        """
        keys = list(keys)
        if not keys:
            return set()
        marked = self.database.dialect.mark(keys)
        return {key for key, replica in marked if replica != self.replica}

    def refuse(self, keys: Iterable[str], *, reason: str) -> None:
        """End the leases of ``keys``, whose messages the broker refused (not sent), and
        note its ``reason`` in their ``error``: recovery sends them again at once, within
        their deadline; past it, :meth:`expire` records them missed (``broker_refused``)."""
        keys = list(keys)
        if not keys:
            return
        now = self.database.now()
        stmt = (
            sa.update(runs)
            .where(
                runs.c.id.in_(sa.bindparam("keys", expanding=True)),
                runs.c.status == Status.CLAIMED,
                runs.c.replica == self.replica,
                runs.c.published_at.is_(None),
            )
            .values(lease_until=now, error=reason)
        )
        self._write_in_chunks(stmt, keys)

    def settle(self, keys: Iterable[str]) -> None:
        """Record as ``published`` the marked runs of ``keys`` still ``claimed``. The worker
        may already have moved a row on (started, even succeeded): its status stays."""
        keys = list(keys)
        if not keys:
            return
        self.database.dialect.settle(keys)

    def settle_abandoned(self, *, after: timedelta) -> int:
        """Record as ``published`` the runs marked more than ``after`` ago and still
        ``claimed``: their replica stopped (or lost the store) between their mark and its
        :meth:`settle`. Returns how many."""
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

    # -- overlap ------------------------------------------------------------------------

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

    def _write_in_chunks(self, stmt: sa.Executable, keys: list[str]) -> None:
        batches = list(chunks(keys, SQLITE_CHUNK))
        if len(batches) == 1:
            with self.database.dialect.statement() as conn:
                conn.execute(stmt, {"keys": batches[0]})
            return
        with self.database.connect() as conn, conn.begin():
            for batch in batches:
                conn.execute(stmt, {"keys": batch})

    # -- recovery -----------------------------------------------------------------------

    def any_lapsed(self) -> bool:
        """Whether some ``claimed`` run's lease ran out (cheap: the lease index)."""
        with self.database.connect() as conn:
            stmt = sa.select(runs.c.id).where(_lapsed(self.database.now())).limit(1)
            return conn.execute(stmt).first() is not None

    def take_over(
        self, *, schedules: Collection[str], hold: timedelta, limit: int
    ) -> list[Occurrence]:
        """Take over at most ``limit`` ``claimed`` runs of ``schedules`` whose lease ran out
        (a replica crashed, stopped or lost the broker) and whose deadline has not passed:
        they are this replica's, leased for ``hold``, oldest lease first. Returns their
        occurrences.

        A conditional update: of several replicas at once, exactly one gets each row (SKIP
        LOCKED on PostgreSQL; SQLite serialises writers), and none while the holder's lease
        runs (guarantee 10).
        """
        with self.database.connect() as conn, conn.begin():
            now = self.database.now()
            lapsed = sa.and_(
                _lapsed(now),
                sa.or_(runs.c.deadline.is_(None), runs.c.deadline >= now),
                runs.c.schedule.in_(self.database.dialect.names()),
            )
            stale = self.database.dialect.skip_locked(
                sa.select(runs.c.id).where(lapsed).order_by(runs.c.scheduled_at).limit(limit)
            )
            stmt = (
                sa.update(runs)
                .where(runs.c.id.in_(stale.scalar_subquery()), _lapsed(now))
                .values(replica=self.replica, lease_until=now + hold)
                .returning(runs.c.schedule, runs.c.scheduled_at, runs.c.id, runs.c.task_id)
            )
            return [
                Occurrence(name, at, key, task_id)
                for name, at, key, task_id in conn.execute(
                    stmt, {"names": json.dumps(sorted(schedules))}
                )
            ]

    def expire(self, *, known: Collection[str], limit: int) -> list[Run]:
        """Record as ``missed`` at most ``limit`` ``claimed`` runs whose lease ran out and
        whose deadline passed (guarantee 6), whatever their schedule: reason
        ``broker_refused`` if the broker refused its last try (:meth:`refuse`), else
        ``publish_failed`` for a schedule in ``known`` (a live replica runs it), else
        ``unknown_schedule`` (removed or renamed: nobody could publish it). Returns them."""
        with self.database.connect() as conn, conn.begin():
            now = self.database.now()
            doomed = self.database.dialect.skip_locked(
                sa.select(runs.c.id)
                .where(_lapsed(now), runs.c.deadline < now)
                .order_by(runs.c.scheduled_at)
                .limit(limit)
            )
            reason = sa.case(
                (runs.c.error.is_not(None), Reason.BROKER_REFUSED.value),
                (runs.c.schedule.in_(self.database.dialect.names()), Reason.PUBLISH_FAILED.value),
                else_=Reason.UNKNOWN_SCHEDULE.value,
            )
            stmt = (
                sa.update(runs)
                .where(runs.c.id.in_(doomed.scalar_subquery()), _lapsed(now))
                .values(status=Status.MISSED.value, reason=reason, lease_until=None)
                .returning(
                    runs.c.schedule,
                    runs.c.scheduled_at,
                    runs.c.id,
                    runs.c.task_id,
                    runs.c.task,
                    runs.c.reason,
                )
            )
            return [
                Run(Occurrence(name, at, key, task_id), task, Status.MISSED, why)
                for name, at, key, task_id, task, why in conn.execute(
                    stmt, {"names": json.dumps(sorted(known))}
                )
            ]

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

    def row_estimates(self) -> dict[str, int]:
        """Rows in each of voltro_beat's tables, estimated without counting them: the
        planner's statistics on PostgreSQL, the rowid span on SQLite (rows deleted in between
        still count until the ids move on)."""
        return self.database.dialect.row_estimates([claims.name, runs.name, replicas.name])

    # -- retention -----------------------------------------------------------------------

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

    def close(self) -> None:
        self.database.dispose()


def _lapsed(now: Any) -> sa.ColumnElement[bool]:
    """A ``claimed`` row whose lease ran out by ``now``."""
    return sa.and_(runs.c.status == Status.CLAIMED, runs.c.lease_until < now)
