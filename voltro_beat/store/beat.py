"""Beat's side of the store: claims, run rows and the publish fence, the writes of the firing
path. :class:`BeatStore` is the one object a replica holds; what recovery writes comes from
:mod:`voltro_beat.store.leases`, what retention writes from :mod:`voltro_beat.store.sweeps`, and
a cluster replica's shard leases from :mod:`voltro_beat.store.shard_leases`.

Every write of the firing path is one statement or one short transaction per batch; every
driver error leaves here as :class:`~voltro_beat.exceptions.StoreError` (guarantee 5: the
scheduler fails closed on it). Leases and deadlines are compared with the store's own clock
as each statement runs (PostgreSQL's ``clock_timestamp()``, SQLite's process clock), never with
an instant a replica computed earlier (guarantees 9 and 10). What the dialects do differently,
the database's :class:`~voltro_beat.store.dialect.Dialect` does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

import sqlalchemy as sa

from voltro_beat.clock import Reading
from voltro_beat.coordination import Coordination, Outcome
from voltro_beat.runs import Run
from voltro_beat.shards import Tenure
from voltro_beat.status import Status
from voltro_beat.store.database import Database
from voltro_beat.store.leases import Leases
from voltro_beat.store.shard_leases import ShardLeases
from voltro_beat.store.sweeps import Sweeps
from voltro_beat.store.tables import claims, replicas, runs


class Fence(NamedTuple):
    """What the publish fence let through: the keys, the earliest lease it granted them, and
    the database's clock as the statement read it (both None if it let none through)."""

    keys: set[str]
    held_until: datetime | None
    reading: Reading | None


class BeatStore(Leases, Sweeps, ShardLeases):
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
        tenure: Tenure | None = None,
    ) -> set[str]:
        """Record ``runs``; return the keys of those this replica won.

        Under a coordination that claims, each key first goes through the claims table
        (guarantee 2); either way the run row's primary key is the last fence (guarantee 4).
        A shard owner (``cluster``) passes its ``tenure``: a run whose shard it no longer holds
        at the epoch the tenure says, under a lease still running, is refused (guarantee 14).
        Claims and run rows are one transaction (guarantee 3). A ``claimed`` row is this
        replica's to publish for ``lease`` from its instant (or from now, if that is later).
        ``prune`` maps a schedule to how long its claims outlive a newer win: the winner
        deletes the older ones.
        """
        return self._claim(
            runs, coordination.claims, coordination.outcome, lease, prune or {}, tenure
        )

    def claim_external(self, run: Run, *, lease: timedelta) -> bool:
        """Record ``run`` for an external trigger; True if this call won it.

        Always through the claims table, whatever the coordination: the duplicate comes from
        the platform that triggers (a CronJob may start twice), not from a second replica.
        The run row's outcome is ``external``.
        """
        return bool(self._claim([run], True, Outcome.EXTERNAL, lease, {}, None))

    def _claim(
        self,
        runs: Sequence[Run],
        gated: bool,
        outcome: Outcome,
        lease: timedelta,
        prune: Mapping[str, timedelta],
        tenure: Tenure | None,
    ) -> set[str]:
        if not runs:
            return set()
        return self.database.dialect.claim(
            runs,
            gated=gated,
            outcome=outcome,
            lease=lease,
            prune=prune,
            replica=self.replica,
            tenure=tenure,
        )

    def fence(
        self, keys: Iterable[str], *, hold: timedelta, start: datetime | None = None
    ) -> Fence:
        """The publish fence: of ``keys``, the runs this replica may send now.

        A run qualifies while it is ``claimed``, names this replica, its lease has not run out
        and its deadline has not passed; its lease then runs until ``hold`` after ``start``
        (the instant of runs fenced ahead of it) or after now, whichever is later, and never
        ends sooner than it did. Recovery takes a row over only once its lease ran out, so
        for each row exactly one of the two wins (guarantee 10). Call it right before the
        broker write: whatever pause comes after it counts against the lease, which
        :class:`Fence` says the end of.
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

    # -- reads ---------------------------------------------------------------------------

    def last_scheduled(self, schedules: Sequence[str]) -> dict[str, datetime]:
        """The newest recorded occurrence of each schedule that has any history: one
        statement, one look-up of the newest end of the schedule's index per name (not every
        row of the schedule a day of retention holds)."""
        names = self.database.dialect.names().columns(sa.column("name", sa.String)).subquery()
        newest = (
            sa.select(sa.func.max(runs.c.scheduled_at))
            .where(runs.c.schedule == names.c.name)
            .scalar_subquery()
        )
        with self.database.connect() as conn:
            rows = conn.execute(
                sa.select(names.c.name, newest), {"names": json.dumps(list(schedules))}
            )
            return {name: at for name, at in rows if at is not None}

    def row_estimates(self) -> dict[str, int]:
        """Rows in each of voltro_beat's tables, estimated without counting them: the
        planner's statistics on PostgreSQL, the rowid span on SQLite (rows deleted in between
        still count until the ids move on)."""
        return self.database.dialect.row_estimates([claims.name, runs.name, replicas.name])

    def close(self) -> None:
        self.database.dispose()
