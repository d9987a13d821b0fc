"""One store URL: its :class:`~voltro_beat.store.dialect.Dialect`, its engine, the schema, and
the error wrapping of every statement.

Each process side (beat's :class:`~voltro_beat.store.beat.BeatStore`, the worker's
:class:`~voltro_beat.store.run_writer.RunWriter`, the operator's reads) opens its own
:class:`Database`; nothing connects until the first statement.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from voltro_beat.clock import ClockMode
from voltro_beat.exceptions import ConfigurationError, StoreError
from voltro_beat.store.dialect import Dialect
from voltro_beat.store.postgresql import PostgreSQL
from voltro_beat.store.sqlite import SQLite
from voltro_beat.store.tables import instant

#: The setting every URL error names.
SETTING = "voltro_beat_store_url"


def hide_password(url: str) -> str:
    """``url`` as safe to log: the password replaced with ``***``."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparsable store URL>"


class Database:
    """A PostgreSQL (psycopg 3) or SQLite database holding voltro_beat's tables.

    ``clock`` (SQLite's clock, default the process's wall clock), ``monotonic`` (the clock
    that times a statement's round trip, default ``time.monotonic``) and ``sqlite_connection``
    (the ``sqlite3.Connection`` subclass SQLite's connections are made of) are seams: a
    simulation (tests/sim) runs replicas on a virtual timeline through them.
    """

    def __init__(
        self,
        url: URL,
        *,
        clock: Callable[[], datetime] | None = None,
        monotonic: Callable[[], float] | None = None,
        sqlite_connection: type[sqlite3.Connection] | None = None,
    ) -> None:
        self.display_url = url.render_as_string(hide_password=True)
        #: SQLite's clock (one host: the process's own), also inside statements as the SQL
        #: function ``voltro_now()``. PostgreSQL's is the server's ``clock_timestamp()``.
        self.clock: Callable[[], datetime] = clock or _utc_now
        #: Times the round trip of a statement that reads the database's clock.
        self.monotonic: Callable[[], float] = monotonic or time.monotonic
        #: Everything done differently on this kind of database.
        self.dialect: Dialect = (
            PostgreSQL(self)
            if url.get_backend_name() == PostgreSQL.name
            else SQLite(self, connection=sqlite_connection)
        )
        self.engine = self.dialect.create_engine(url)

    @classmethod
    def open(cls, url: str, **seams: Any) -> Database:
        """The database at ``url``, without connecting (``seams``: see :class:`Database`).

        Raises :class:`ConfigurationError` naming ``voltro_beat_store_url`` for a URL that
        cannot work: unparsable, an unknown dialect or driver, or a dialect voltro_beat does
        not support. ``postgresql://`` means psycopg 3.
        """
        if url.strip() == "memory://":
            raise ConfigurationError(
                "memory:// is not a store: beat replicas and workers share their runs through "
                "a database. Use sqlite:///path (one host; the default is "
                "sqlite:///voltro-beat.sqlite3) or postgresql+psycopg://... (several hosts)",
                field=SETTING,
            )
        try:
            parsed = make_url(url)
        except ArgumentError as exc:
            raise ConfigurationError(f"cannot parse store URL: {exc}", field=SETTING) from None
        backend = parsed.get_backend_name()
        if backend == PostgreSQL.name and parsed.drivername == PostgreSQL.name:
            parsed = parsed.set(drivername="postgresql+psycopg")
        if backend not in (PostgreSQL.name, SQLite.name):
            raise ConfigurationError(
                f"unsupported store {hide_password(url)!r}: use postgresql+psycopg://... "
                "or sqlite:///path",
                field=SETTING,
            )
        try:
            return cls(parsed, **seams)
        except (NoSuchModuleError, ImportError, ArgumentError) as exc:
            raise ConfigurationError(
                f"cannot load the driver for {hide_password(url)!r}: {exc}", field=SETTING
            ) from None

    @contextmanager
    def connect(self, *, autocommit: bool = False) -> Iterator[Connection]:
        """A pooled connection; any driver error inside becomes :class:`StoreError`."""
        try:
            with self.engine.connect() as conn:
                if autocommit:
                    conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                yield conn
        except SQLAlchemyError as exc:
            raise self.error(exc) from exc

    def error(self, exc: BaseException) -> StoreError:
        """``exc`` (a driver error) as the :class:`StoreError` voltro_beat raises, with what to
        check if it is permanent (:data:`PERMANENT`)."""
        line = first_line(exc)
        return StoreError(f"store {self.display_url}: {line}", check=_permanent(exc, line))

    def probe(self) -> None:
        """One statement: raises :class:`StoreError` (its ``check`` set if no retry would
        help) if the store cannot be used."""
        with self.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    def now(self) -> Any:
        """The store's clock for a statement: PostgreSQL's ``clock_timestamp()``, read as the
        statement runs; on SQLite the process clock, read now. Read inside a BEGIN IMMEDIATE
        transaction, SQLite's reading may be older than the statement (a pause in between)
        but no other writer can have acted meanwhile; where an old reading would let an
        expired lease pass, use :meth:`statement_clock` instead."""
        return self.dialect.now()

    def time(self) -> datetime:
        """The store's clock now (one round trip on PostgreSQL)."""
        return self.read_clock()[0]

    def read_clock(self) -> tuple[datetime, float, float]:
        """A reading of the store's clock, with the monotonic instants just before and just
        after its round trip: its error is half that round trip, so nothing else is timed (the
        connection's checkout and ping come before)."""
        with self.connect(autocommit=True) as conn:
            sent = self.monotonic()
            value = conn.execute(sa.select(self.statement_clock())).scalar_one()
            received = self.monotonic()
        return instant(value), sent, received

    def statement_clock(self) -> sa.ColumnElement[Any]:
        """The database's clock as a statement runs, as a column to select or return:
        PostgreSQL's ``clock_timestamp()``, SQLite's ``voltro_now()``."""
        return self.dialect.statement_clock()

    def clock_mode(self, setting: ClockMode | None = None) -> ClockMode:
        """Whose clock "now" is for a process of this store, given ``voltro_beat_clock``
        (``setting``, None if not set): on PostgreSQL the setting, by default the database's
        (guarantee 9); on SQLite the local one whatever the setting (one host: the database's
        clock is this host's)."""
        return self.dialect.clock_mode(setting)

    @property
    def file(self) -> str | None:
        """The SQLite file of the store (None on PostgreSQL, or in memory)."""
        return self.dialect.file

    def upgrade(self) -> None:
        """Bring the schema to the newest migration; safe when replicas boot together."""
        from voltro_beat.store.migrations.runner import upgrade

        with self.connect() as conn, conn.begin():
            self.dialect.lock_schema(conn)
            upgrade(conn)

    def dispose(self, *, close: bool = True) -> None:
        """Close the pool. ``close=False`` in a forked child: the sockets are the parent's."""
        self.engine.dispose(close=close)


#: Errors no retry cures: (SQLSTATE, else a pattern of the message, what to check). libpq
#: refuses a connection without a SQLSTATE, so a refused connection is told by the server's
#: message (in English unless the server's lc_messages says otherwise: a message in another
#: language is taken for transient, retried and warned about).
PERMANENT: tuple[tuple[str | None, str, str], ...] = (
    ("28P01", r"password authentication failed", "the user name and password in the URL"),
    ("28000", r"role \S+ does not exist", "the user name in the URL (the role must exist)"),
    ("28000", r"no pg_hba\.conf entry", "pg_hba.conf on the server allows this role and host"),
    ("3D000", r"database \S+ does not exist", "the database name in the URL (create it first)"),
    (
        "42501",
        r"permission denied",
        "the role's grants (docs/deployment.md, least-privilege roles)",
    ),
    # A typo in the host name, most often; a DNS outage at boot is left to the supervisor's
    # restart (docs/operations.md).
    (None, r"failed to resolve host|could not translate host name", "the host name in the URL"),
    (None, r"unable to open database file", "the SQLite file's directory exists and is writable"),
)


def _permanent(exc: BaseException, line: str) -> str | None:
    """What to check, if ``exc`` is one of :data:`PERMANENT`; None for a transient error."""
    sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
    for code, pattern, check in PERMANENT:
        if (code is not None and sqlstate == code) or re.search(pattern, line):
            return check
    return None


def first_line(exc: BaseException) -> str:
    """The first line of a driver error's message (they run on over several lines)."""
    return str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]


def _utc_now() -> datetime:
    return datetime.now(UTC)
