"""voltro_beat's tables as mapped classes, which sqladmin's views need (the store itself
uses the tables of :mod:`voltro_beat.store.tables` through SQLAlchemy Core)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import DeclarativeBase, Mapped

from voltro_beat.contrib.display import lag
from voltro_beat.store.tables import claims, runs


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
