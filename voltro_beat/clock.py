"""The clock every comparison of instants goes through (guarantee 9).

Replicas on several hosts must agree on "now" without trusting their own clocks, so with the
``database`` clock (the default on PostgreSQL) a replica reads the database's clock
(``clock_timestamp()``) and keeps the answer as a point on its own monotonic clock: "now" is
that database instant plus the monotonic time elapsed since. Its error is half the round trip
of the reading, so a reading replaces it when it is about as precise, or once it is 30 s old;
each reading also gives the offset of the local wall clock, which the replica reports. With
the ``local`` clock (SQLite, always: one host) "now" is the local wall clock.

The monotonic clock only ever measures a duration inside this process; leases and deadlines
that other replicas enforce are compared by the database itself (see
:mod:`voltro_beat.store.beat`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

#: A reading whose round trip took longer than this says too little about the instant it read.
MAX_ROUND_TRIP = timedelta(milliseconds=500)
#: A reading is kept until a more precise one comes, or for this long: meanwhile the local
#: monotonic clock and the database's drift apart by microseconds at most.
KEEP = timedelta(seconds=30)
#: Readings at least this precise are all good enough to take.
PRECISE = timedelta(milliseconds=1)


class ClockMode(StrEnum):
    """Whose clock "now" is (``voltro_beat_clock``)."""

    DATABASE = "database"
    LOCAL = "local"


@dataclass(frozen=True, slots=True)
class Reading:
    """The database's clock as one statement read it: ``earliest`` and ``latest`` of the values
    it returned, the statement sent at monotonic ``sent`` and its answer received at
    ``received``.

    The database read them after the statement was sent and before its answer left, so at a
    later monotonic instant ``m`` its clock reads at least ``latest + (m - received)`` and at
    most ``earliest + (m - sent)``: bounds that hold whatever the round trip's two halves were.
    """

    earliest: datetime
    latest: datetime
    sent: float
    received: float


class Clock:
    """Now, on the database's clock (or the local one), for one replica."""

    def __init__(
        self,
        mode: ClockMode,
        local: Callable[[], datetime] | None = None,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self.mode = mode
        #: The local wall clock (SQLite's store shares it, so a test can drive both).
        self.local = local or _utc_now
        #: The local monotonic clock, in seconds (a simulation hands in a virtual one).
        self.monotonic = monotonic or time.monotonic
        #: The reading in use: a database instant and the monotonic time it stands for.
        self._base: tuple[datetime, float] | None = None
        #: Local wall clock minus the database's, at the last usable reading.
        self.offset: timedelta | None = None
        #: Half the round trip of the reading in use: how far off "now" can be.
        self.error: timedelta | None = None

    @property
    def synced(self) -> bool:
        """Whether "now" can be read: a local clock always, a database one after a reading."""
        return self.mode is ClockMode.LOCAL or self._base is not None

    def now(self) -> datetime:
        """The current instant, aware UTC."""
        base = self._base
        if self.mode is ClockMode.LOCAL or base is None:
            return self.local()
        instant, at = base
        return instant + timedelta(seconds=self.monotonic() - at)

    def bounds(self, reading: Reading | None = None) -> tuple[datetime, datetime]:
        """The earliest and the latest instant the database's clock can read now.

        From ``reading`` if given (a statement's own reading: bounds that never put the
        database ahead of itself), else from the reading in use, give or take its error. The
        local clock has no error: both are its time.
        """
        if self.mode is ClockMode.LOCAL or (reading is None and self._base is None):
            now = self.local()
            return now, now
        if reading is None:
            now = self.now()
            error = self.error or timedelta(0)
            return now - error, now + error
        at = self.monotonic()
        return (
            reading.latest + timedelta(seconds=at - reading.received),
            reading.earliest + timedelta(seconds=at - reading.sent),
        )

    def observe(self, database_now: datetime, sent: float, received: float) -> bool:
        """Take a reading of the database's clock, made between the monotonic instants ``sent``
        and ``received``; False if its round trip was too long to use."""
        round_trip = timedelta(seconds=received - sent)
        if round_trip > MAX_ROUND_TRIP:
            return False
        middle = (sent + received) / 2
        # The local wall clock at the middle of the round trip, read now and walked back.
        wall = self.local() - timedelta(seconds=self.monotonic() - middle)
        self.offset = wall - database_now
        error = round_trip / 2
        base = self._base
        if (
            base is None
            or self.error is None
            or error <= max(self.error, PRECISE)
            or timedelta(seconds=middle - base[1]) > KEEP
        ):
            self.error = error
            self._base = (database_now, middle)
        return True


def _utc_now() -> datetime:
    return datetime.now(UTC)
