"""Alembic migrations of voltro_beat's own tables (version table in tables.VERSION_TABLE)."""
