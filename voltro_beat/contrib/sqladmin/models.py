"""voltro_beat's tables as mapped classes, which sqladmin's views need (the store itself
uses the tables of :mod:`voltro_beat.store.tables` through SQLAlchemy Core)."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, column_property

from voltro_beat import replicas as registry
from voltro_beat.contrib.display import lag
from voltro_beat.store.tables import UTCDateTime, claims, replicas, runs


class _Base(DeclarativeBase):
    pass


class Run(_Base):
    """A row of ``_voltro_schedule_runs``."""

    __table__ = runs
    # Typing only: the columns come from the table.
    scheduled_at: Mapped[datetime]
    published_at: Mapped[datetime | None]

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
    #: The database's clock, read with the row: liveness is judged on the clock the heartbeats
    #: were written on, not on the admin host's.
    database_now: Mapped[datetime] = column_property(sa.func.current_timestamp(type_=UTCDateTime()))
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

    @property
    def live(self) -> bool:
        """Its last heartbeat is younger than its publish timeout."""
        return registry.lives(registry.Replica.of(self), self.database_now)
