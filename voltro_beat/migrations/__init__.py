"""Alembic migrations of voltro_beat's own tables (version table ``_voltro_beat_alembic_version``)."""
