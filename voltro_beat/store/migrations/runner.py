"""Run voltro_beat's Alembic migrations on a connection the database hands over.

A schema at :data:`HEAD` is read with SQLAlchemy alone: Alembic (about 11 MB of modules in a
beat that stays up) is loaded only when there is a migration to run or to print.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from voltro_beat.store.tables import VERSION_TABLE

SCRIPTS = str(Path(__file__).parent)
#: The newest migration's revision (a test holds it to the scripts).
HEAD = "0008"


def upgrade(connection: Connection, revision: str = "head") -> None:
    """Upgrade to ``revision`` (the newest by default) inside the caller's transaction."""
    if revision == "head" and current(connection) == HEAD:
        return
    with _alembic() as (Config, command):
        config = Config()
        config.set_main_option("script_location", SCRIPTS)
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def sql(url: str) -> str:
    """The DDL of every migration for ``url``'s dialect, as a DBA would run it."""
    out = io.StringIO()
    with _alembic() as (Config, command):
        config = Config(output_buffer=out)
        config.set_main_option("script_location", SCRIPTS)
        config.set_main_option("sqlalchemy.url", url)
        command.upgrade(config, "head", sql=True)
    return out.getvalue()


@contextmanager
def _alembic() -> Iterator[tuple[Any, Any]]:
    # Alembic narrates its plugin set-up (at import) and every step at INFO, which would
    # flood beat's log at each boot: import and run it with its loggers at WARNING.
    log = logging.getLogger("alembic")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        from alembic import command
        from alembic.config import Config

        yield Config, command
    finally:
        log.setLevel(level)


def current(connection: Connection) -> str | None:
    """The schema's revision (None before the first upgrade), as Alembic records it."""
    if not sa.inspect(connection).has_table(VERSION_TABLE):
        return None
    version = sa.table(VERSION_TABLE, sa.column("version_num"))
    return connection.execute(sa.select(version.c.version_num)).scalar_one_or_none()


def revisions(connection: Connection) -> tuple[str | None, str]:
    """The schema's current revision (None before the first upgrade) and the newest one."""
    return current(connection), HEAD
