"""voltro_beat's tables as mapped classes, which sqladmin's views need (the store itself
uses the tables of :mod:`voltro_beat.store.tables` through SQLAlchemy Core)."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, column_property

from voltro_beat import replicas as registry
from voltro_beat.contrib.display import lag
from voltro_beat.store.tables import (
    UTCDateTime,
    claims,
    replicas,
    runs,
    schedules,
    shards,
    singletons,
)


class _Base(DeclarativeBase):
    pass


def _database_now() -> Mapped[datetime]:
    """The database's clock, read with each row (a lease or a heartbeat is judged on the clock
    it was written on, not on the admin host's)."""
    return column_property(sa.func.current_timestamp(type_=UTCDateTime()))


class Run(_Base):
    """A row of ``_voltro_schedule_runs``, read with the database's clock."""

    __table__ = runs
    database_now: Mapped[datetime] = _database_now()
    # Typing only: the columns come from the table.
    status: Mapped[str]
    scheduled_at: Mapped[datetime]
    published_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    lease_until: Mapped[datetime | None]

    @property
    def publish_lag(self) -> float | None:
        """Seconds from the scheduled instant to the broker's confirmation."""
        return lag(self.scheduled_at, self.published_at)


class Claim(_Base):
    """A row of ``_voltro_schedule_claims``."""

    __table__ = claims


class Replica(_Base):
    """A row of ``_voltro_beat_replicas``, read with the database's clock."""

    __table__ = replicas
    database_now: Mapped[datetime] = _database_now()
    # Typing only: the columns come from the table.
    name: Mapped[str]
    host: Mapped[str]
    pid: Mapped[int]
    version: Mapped[str]
    started_at: Mapped[datetime]
    last_seen: Mapped[datetime]
    clock_offset: Mapped[float | None]
    settings: Mapped[str]
    schedules_digest: Mapped[str]
    schedules_revision: Mapped[int]

    @property
    def live(self) -> bool:
        """Its last heartbeat is younger than its publish timeout."""
        return registry.lives(registry.Replica.of(self), self.database_now)


class Shard(_Base):
    """A row of ``_voltro_beat_shards`` (cluster coordination), read with the database's
    clock."""

    __table__ = shards
    database_now: Mapped[datetime] = _database_now()
    owner: Mapped[str | None]
    lease_until: Mapped[datetime | None]


class SingletonState(_Base):
    """A row of ``_voltro_beat_singletons``: what became of a singleton where it last ran."""

    __table__ = singletons
    state: Mapped[str]
    error: Mapped[str | None]


class StoredSchedule(_Base):
    """A row of ``_voltro_beat_schedules``: a schedule kept in the database."""

    __table__ = schedules
    name: Mapped[str]
    definition: Mapped[str]
    enabled: Mapped[bool]
    revision: Mapped[int]
