"""Run voltro_beat's Alembic migrations on a connection the database hands over."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection

SCRIPTS = str(Path(__file__).parent)


def upgrade(connection: Connection, revision: str = "head") -> None:
    """Upgrade to ``revision`` (the newest by default) inside the caller's transaction."""
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


def revisions(connection: Connection) -> tuple[str | None, str]:
    """The schema's current revision (None before the first upgrade) and the newest one."""
    with _alembic():
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        from voltro_beat.store.tables import VERSION_TABLE

        current = MigrationContext.configure(
            connection, opts={"version_table": VERSION_TABLE}
        ).get_current_revision()
        head = ScriptDirectory(SCRIPTS).get_current_head()
    assert head is not None
    return current, head
