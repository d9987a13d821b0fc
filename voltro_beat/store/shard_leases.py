"""Cluster coordination's shard leases: which replica owns each shard of a group, at which
epoch, until when; and what became of the singletons the owners ran.

A replica holds a shard under a lease on the database's clock, renewed with its heartbeat. It
takes a shard only when the shard is free: released by its owner, or its owner's lease ran out
(a crash, a pause, a lost store); each change of owner adds one to the shard's epoch. Every
claim of a shard owner names the epoch it holds the shard at, and the claim statement checks
the shard's row (``BeatStore.claim``, guarantee 14): an owner that lost its shard, paused past
its lease or not, cannot record an occurrence of it, whatever it believes.

Each exchange is one transaction; of two replicas after one free shard, the row's lock (one
writer at a time on SQLite) lets exactly one through.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime, timedelta

import sqlalchemy as sa

from voltro_beat.store.database import Database
from voltro_beat.store.tables import shards, singletons


class ShardLeases:
    """The shard leases of one replica; a base of :class:`~voltro_beat.store.beat.BeatStore`,
    which holds the state."""

    database: Database
    replica: str

    def exchange_shards(
        self,
        group: str,
        *,
        keep: Mapping[int, int],
        release: Collection[int],
        acquire: Collection[int],
        lease: timedelta,
    ) -> tuple[dict[int, int], dict[int, int]]:
        """In one transaction: give up the shards ``release``; renew for ``lease`` those of
        ``keep`` (shard -> epoch) this replica still holds at that epoch under a running
        lease; take those of ``acquire`` that are free, each at its next epoch (or that it
        holds already, at their epoch). Returns the shards held now and those of them just
        taken, each as shard -> epoch."""
        with self.database.connect() as conn, conn.begin():
            now = self.database.now()
            mine = sa.and_(shards.c.shard_group == group, shards.c.owner == self.replica)
            if release:
                conn.execute(
                    sa.update(shards)
                    .where(mine, shards.c.shard.in_(list(release)))
                    .values(owner=None, lease_until=None, changed_at=now)
                )
            held: dict[int, int] = {}
            if keep:
                renewed = conn.execute(
                    sa.update(shards)
                    .where(mine, shards.c.shard.in_(list(keep)), shards.c.lease_until > now)
                    .values(lease_until=now + lease)
                    .returning(shards.c.shard, shards.c.epoch)
                )
                held = {s: e for s, e in renewed if keep.get(s) == e}
            gained: dict[int, int] = {}
            if acquire:
                wanted = sorted(acquire)  # the same lock order on every replica
                conn.execute(
                    self.database.dialect.insert(shards)
                    .values([{"shard_group": group, "shard": s, "epoch": 0} for s in wanted])
                    .on_conflict_do_nothing()
                )
                # A shard this replica holds without knowing it (the answer of the exchange
                # that took it was lost) it takes back at the same epoch: nobody else had it.
                own = sa.and_(shards.c.owner == self.replica, shards.c.lease_until > now)
                taken = conn.execute(
                    sa.update(shards)
                    .where(
                        shards.c.shard_group == group,
                        shards.c.shard.in_(wanted),
                        sa.or_(shards.c.owner.is_(None), shards.c.lease_until <= now, own),
                    )
                    .values(
                        owner=self.replica,
                        epoch=sa.case((own, shards.c.epoch), else_=shards.c.epoch + 1),
                        lease_until=now + lease,
                        changed_at=sa.case((own, shards.c.changed_at), else_=now),
                    )
                    .returning(shards.c.shard, shards.c.epoch)
                )
                gained = {s: e for s, e in taken}
        return held | gained, gained

    def released_shards(self, group: str, candidates: Collection[int]) -> dict[int, datetime]:
        """Of ``candidates``, the shards free because their owner released them (a graceful
        stop or a rebalance), each with when."""
        with self.database.connect() as conn:
            rows = conn.execute(
                sa.select(shards.c.shard, shards.c.changed_at).where(
                    shards.c.shard_group == group,
                    shards.c.shard.in_(sorted(candidates)),
                    shards.c.owner.is_(None),
                    shards.c.changed_at.is_not(None),
                )
            )
            return {shard: at for shard, at in rows}

    def owned_shards(self, group: str) -> int:
        """How many shards of ``group`` some replica owns under a running lease."""
        with self.database.connect() as conn:
            return conn.execute(
                sa.select(sa.func.count()).where(
                    shards.c.shard_group == group,
                    shards.c.owner.is_not(None),
                    shards.c.lease_until > self.database.now(),
                )
            ).scalar_one()

    def record_singleton(
        self, group: str, name: str, *, token: int, state: str, error: str | None = None
    ) -> None:
        """Note singleton ``name``'s ``state`` on this replica at ``token`` (its shard's
        epoch); a row of a newer token (a newer owner's) is left as it is."""
        with self.database.connect() as conn, conn.begin():
            now = self.database.now()
            row = {
                "singleton_group": group,
                "name": name,
                "replica": self.replica,
                "token": token,
                "state": state,
                "since": now,
                "error": error,
            }
            insert = self.database.dialect.insert(singletons).values(row)
            conn.execute(
                insert.on_conflict_do_update(
                    index_elements=[singletons.c.singleton_group, singletons.c.name],
                    set_={k: v for k, v in row.items() if k not in ("singleton_group", "name")},
                    where=singletons.c.token <= token,
                )
            )

    def release_shards(self, group: str) -> int:
        """Give up every shard of ``group`` this replica holds (a graceful stop): the others
        take them at their next heartbeat. Returns how many."""
        with self.database.connect() as conn, conn.begin():
            return conn.execute(
                sa.update(shards)
                .where(shards.c.shard_group == group, shards.c.owner == self.replica)
                .values(owner=None, lease_until=None, changed_at=self.database.now())
            ).rowcount
