"""The schedules table edited from an admin (Django's or sqladmin): one form, the checks of
``voltro-beat schedules``, the next instants before saving, the revision the edit is based on.

A form holds the schedule's name, its definition as JSON (docs/schedule-table.md), whether it
is enabled and the revision it was loaded at. Saving checks the definition as beat checks the
app's ``beat_schedule`` and writes through :class:`~voltro_beat.schedule_table.ScheduleTable`:
an edit of a schedule that changed since it was loaded is refused, and every change leaves its
change row, by the admin's user.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from voltro_beat.beat_schedule import load_schedule
from voltro_beat.config import Settings
from voltro_beat.exceptions import ConfigurationError, EditRefused
from voltro_beat.on_demand import load_app
from voltro_beat.schedule_table import ScheduleTable
from voltro_beat.store.database import Database
from voltro_beat.store.schedule_rows import ScheduleRow

#: Instants a preview shows.
PREVIEW = 5
#: The field a definition's errors are shown at.
DEFINITION = "definition"


@dataclass(frozen=True)
class Edit:
    """What a form asks for: ``revision`` is the one it was loaded at (None: a new one)."""

    name: str
    definition: str
    enabled: bool
    revision: int | None


def open_table(store_url: str, celery_app: str | None) -> ScheduleTable:
    """The table of the store at ``store_url``, with the settings and the entries of the app
    (``"proj.celery:app"``, optional: the zone and ``max_lateness`` defaults, and the names a
    row may not shadow)."""
    app = None if celery_app is None else load_app(celery_app)
    settings = Settings.resolve({} if app is None else app.conf, overrides={"store_url": store_url})
    code = [] if app is None else list(load_schedule(app, settings).entries)
    return ScheduleTable(Database.open(store_url), settings, code=code)


def document(name: str, text: str) -> dict[str, Any]:
    """The definition typed in the form, as a JSON object; raises :class:`ConfigurationError`
    naming the schedule and the field otherwise."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"not JSON: {exc}", entry=name, field=DEFINITION) from None
    if not isinstance(doc, dict):
        raise ConfigurationError("a JSON object is required", entry=name, field=DEFINITION)
    return doc


def preview(table: ScheduleTable, edit: Edit) -> list[datetime]:
    """The next :data:`PREVIEW` instants of the definition typed, after now on the database's
    clock (raises :class:`ConfigurationError` as saving would)."""
    return table.next_instants(edit.name, document(edit.name, edit.definition), PREVIEW)


def preview_text(instants: Sequence[datetime]) -> str:
    if not instants:
        return "Not saved. This definition has no instant ahead."
    shown = ", ".join(f"{at:%Y-%m-%d %H:%M:%S} UTC" for at in instants)
    return f"Not saved. Next instants: {shown}."


def save(table: ScheduleTable, edit: Edit, by: str) -> ScheduleRow:
    """Write ``edit`` (checked, based on its revision); raises :class:`ConfigurationError` or
    :class:`EditRefused`."""
    doc = document(edit.name, edit.definition)
    if edit.revision is None:
        return table.add(edit.name, doc, by=by, enabled=edit.enabled)
    current = table.rows.get([edit.name]).get(edit.name)
    if current is None:
        raise EditRefused(f"no schedule {edit.name!r} in the schedules table", name=edit.name)
    row, revision = current, edit.revision
    if doc != current.definition or revision != current.revision:
        row = table.set(edit.name, doc, revision=revision, by=by)
        revision = row.revision
    if edit.enabled != row.enabled:
        switch = table.enable if edit.enabled else table.disable
        row = switch(edit.name, revision=revision, by=by)
    return row
