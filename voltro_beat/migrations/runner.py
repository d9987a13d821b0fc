"""Run voltro_beat's Alembic migrations on a connection the store hands over."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection


def _config(**kwargs: object) -> Config:
    config = Config(**kwargs)  # type: ignore[arg-type]
    config.set_main_option("script_location", str(Path(__file__).parent))
    return config


def upgrade(connection: Connection) -> None:
    """Upgrade to the newest revision inside the caller's transaction."""
    config = _config()
    config.attributes["connection"] = connection
    with _quiet_alembic():
        command.upgrade(config, "head")


@contextmanager
def _quiet_alembic() -> Iterator[None]:
    # Alembic narrates every plugin at INFO, which would flood beat's log at each boot.
    log = logging.getLogger("alembic")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def sql(url: str) -> str:
    """The DDL of every migration for ``url``'s dialect, as a DBA would run it."""
    out = io.StringIO()
    config = _config(output_buffer=out)
    config.set_main_option("sqlalchemy.url", url)
    command.upgrade(config, "head", sql=True)
    return out.getvalue()
