"""The database router for voltro_beat's tables outside the default database."""

from __future__ import annotations

from typing import Any

from voltro_beat.contrib.django.apps import LABEL, database


class VoltroBeatRouter:
    """Reads voltro_beat's models from ``VOLTRO_BEAT_DATABASE``; leaves other models alone.

    Writes go there too, though the admin never writes: Django's own code paths (a shell, a
    data migration of yours) then find the same rows.
    """

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return database() if model._meta.app_label == LABEL else None

    db_for_write = db_for_read
