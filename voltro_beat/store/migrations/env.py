"""Alembic environment: always driven by :mod:`voltro_beat.store` with a live connection."""

from __future__ import annotations

from alembic import context

from voltro_beat.store.tables import VERSION_TABLE, metadata

config = context.config
connection = config.attributes.get("connection")

if connection is None:
    # Offline mode (``voltro-beat db sql``): render the DDL for a DBA.
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
    )
    with context.begin_transaction():
        context.run_migrations()
