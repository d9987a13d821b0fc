"""The app's configuration and its system checks."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS

#: The app label: permissions read ``voltro_beat.view_run``, URLs ``admin/voltro_beat/run/``.
LABEL = "voltro_beat"
ROUTER = "voltro_beat.contrib.django.routers.VoltroBeatRouter"


def database() -> str:
    """The database alias that holds voltro_beat's tables (``VOLTRO_BEAT_DATABASE``)."""
    alias: str = getattr(settings, "VOLTRO_BEAT_DATABASE", None) or DEFAULT_DB_ALIAS
    return alias


class VoltroBeatConfig(AppConfig):
    name = "voltro_beat.contrib.django"
    label = LABEL
    verbose_name = "voltro_beat"

    def ready(self) -> None:
        checks.register(check_database)


def check_database(**_: Any) -> list[checks.CheckMessage]:
    """The alias exists, and the router sends the models there."""
    alias = database()
    if alias not in settings.DATABASES:
        return [
            checks.Error(
                f"VOLTRO_BEAT_DATABASE names {alias!r}, which is not in DATABASES",
                id="voltro_beat.E001",
            )
        ]
    if alias != DEFAULT_DB_ALIAS and ROUTER not in settings.DATABASE_ROUTERS:
        return [
            checks.Error(
                f"VOLTRO_BEAT_DATABASE is {alias!r} but DATABASE_ROUTERS lacks {ROUTER!r}: "
                "the admin would read voltro_beat's tables from the default database",
                hint=f"DATABASE_ROUTERS = [{ROUTER!r}, ...]",
                id="voltro_beat.E002",
            )
        ]
    return []
