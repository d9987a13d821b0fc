"""What differs between PostgreSQL and SQLite, behind one interface: :class:`Dialect`.

:class:`~voltro_beat.store.database.Database` chooses the implementation from its URL
(:mod:`~voltro_beat.store.postgresql`, :mod:`~voltro_beat.store.sqlite`) once; beat's store, the
registry, the worker's run writer and the operator's reads call it and compare no dialect
names. Methods that run statements connect through the database and read its clocks
(``database.clock``, ``database.monotonic``): a simulation hands those in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine

from voltro_beat.clock import ClockMode
from voltro_beat.coordination import Outcome
from voltro_beat.runs import Run
from voltro_beat.shards import Tenure

if TYPE_CHECKING:
    from voltro_beat.store.database import Database

T = TypeVar("T")

#: Rows per statement, on either dialect: SQLite caps the bound parameters of a statement.
SQLITE_CHUNK = 2000


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Dialect(ABC):
    """Everything voltro_beat does differently on one kind of database, for ``database``."""

    #: SQLAlchemy's name of the dialect.
    name: ClassVar[str]

    def __init__(self, database: Database) -> None:
        self.database = database

    # -- connections -----------------------------------------------------------------------

    @abstractmethod
    def create_engine(self, url: URL) -> Engine:
        """The engine (pool, driver options, session set-up) for ``url``."""

    @abstractmethod
    def statement(self) -> AbstractContextManager[Connection]:
        """A connection for one statement, or for a few that need not be atomic together,
        committed at the end of the block."""

    @abstractmethod
    def lock_schema(self, conn: Connection) -> None:
        """Serialise schema upgrades of replicas that boot together, until ``conn``'s
        transaction ends."""

    @abstractmethod
    def lock_edits(self, conn: Connection) -> None:
        """Serialise changes of the schedules table, until ``conn``'s transaction ends."""

    @property
    def file(self) -> str | None:
        """The database's file, for a database that is one (and is not in memory)."""
        return None

    # -- the clock -------------------------------------------------------------------------

    @abstractmethod
    def clock_mode(self, setting: ClockMode | None) -> ClockMode:
        """Whose clock "now" is for a process of this store, given ``voltro_beat_clock``
        (None: not set)."""

    @abstractmethod
    def now(self) -> Any:
        """The database's clock for a statement (see ``Database.now``)."""

    @abstractmethod
    def statement_clock(self) -> sa.ColumnElement[Any]:
        """The database's clock as a statement runs, as a column to select or return."""

    # -- SQL that differs ------------------------------------------------------------------

    @abstractmethod
    def insert(self, table: sa.Table) -> postgresql.Insert | sqlite.Insert:
        """An INSERT into ``table`` that takes ``ON CONFLICT`` clauses."""

    @abstractmethod
    def greatest(self, *values: Any) -> sa.ColumnElement[Any]:
        """The largest of ``values``."""

    @abstractmethod
    def names(self) -> sa.TextClause:
        """The ``names`` parameter (a JSON list) as rows of one column, ``name``: one
        parameter however many names (an expanding ``IN`` renders a placeholder each, which
        SQLAlchemy and psycopg then spend microseconds apiece on)."""

    @abstractmethod
    def skip_locked(self, select: sa.Select[Any]) -> sa.Select[Any]:
        """``select`` locking the rows it finds, skipping those another transaction locked,
        where the database locks rows (one SQLite writer at a time needs no lock)."""

    @abstractmethod
    def row_estimates(self, tables: Sequence[str]) -> dict[str, int]:
        """Rows in each of ``tables``, estimated without counting them."""

    # -- beat's firing path ----------------------------------------------------------------

    @abstractmethod
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
        """Record the runs of ``batch`` for ``replica`` (through the claims table first if
        ``gated`` or given a ``tenure``), refusing those older than the runs watermark, and,
        given a ``tenure``, those whose shard ``replica`` does not hold at the epoch it says
        under a lease still running; the keys recorded. See ``BeatStore.claim``."""

    @abstractmethod
    def fence(
        self, keys: Sequence[str], *, replica: str, hold: timedelta, start: datetime | None
    ) -> tuple[list[tuple[str, datetime, datetime]], float, float]:
        """The publish fence on ``keys`` (see ``BeatStore.fence``): each run let through as
        (key, its new lease, the database's clock as the statement read it), and the
        monotonic instants just before and just after the statement."""

    @abstractmethod
    def mark(self, keys: Sequence[str]) -> list[tuple[str, str | None]]:
        """Stamp the publish time of the runs ``keys`` and end their leases; each as (key, the
        replica its row names)."""

    @abstractmethod
    def settle(self, keys: Sequence[str]) -> None:
        """The marked runs of ``keys`` still ``claimed`` become ``published``."""

    # -- the replica registry --------------------------------------------------------------

    @abstractmethod
    def heartbeat(
        self, beat: sa.Update, live: Callable[[Any], sa.Select[Any]]
    ) -> tuple[tuple[datetime, float, float], Sequence[sa.Row[Any]]] | None:
        """Run ``beat`` (an update of one registry row) and read ``live(now)`` (the live
        replicas by the database's clock ``now``). Returns a reading of the database's clock
        with the monotonic instants just before and just after its statement, and the rows of
        ``live`` (those whose ``name`` is None are no replica); None if ``beat`` found no
        row."""

    # -- the worker's run ledger -----------------------------------------------------------

    @abstractmethod
    def ledger_connection(self, conn: Connection) -> None:
        """Set up ``conn``, a connection a worker keeps for its ledger writes."""

    @abstractmethod
    def ledger_execute(
        self, conn: Connection, stmt: sa.Select[Any] | sa.Update, params: Mapping[str, Any]
    ) -> Any:
        """Run ``stmt`` on a ledger connection and commit; its first row (None if none)."""

    @abstractmethod
    def ledger_clock(self) -> sa.ColumnElement[Any]:
        """The database's clock in a ledger statement (parameter ``l_clock``, see
        ``RunWriter``)."""

    @abstractmethod
    def ledger_lease_until(self) -> sa.ColumnElement[Any]:
        """The end of a worker lease taken in a ledger statement (parameters ``l_lease``,
        ``l_lease_until``)."""

    @abstractmethod
    def seconds_between(self, later: Any, earlier: Any) -> sa.ColumnElement[Any]:
        """The seconds from instant ``earlier`` to instant ``later``."""
