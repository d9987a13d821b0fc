"""The schedules table in sqladmin: listed, and edited when the admin knows the store
(:func:`voltro_beat.contrib.sqladmin.views.add_views` with ``store_url``).

Writes go through :mod:`voltro_beat.contrib.schedule_forms` (the checks of ``voltro-beat
schedules``, the revision the form was loaded at, a change row by the logged-in user), never
through sqladmin's own session; *Preview next instants* shows them without saving.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import anyio
from sqladmin import ModelView
from starlette.requests import Request
from wtforms import HiddenField, StringField, TextAreaField
from wtforms.validators import Optional

from voltro_beat.contrib.display import instant_text
from voltro_beat.contrib.schedule_forms import (
    Edit,
    preview,
    preview_text,
    save,
)
from voltro_beat.contrib.sqladmin.models import StoredSchedule
from voltro_beat.schedule_table import ScheduleTable, change_lines

#: The form's button that shows the next instants instead of saving.
PREVIEW_BUTTON = "Preview next instants"


class NotSaved(Exception):
    """Shown above the form (sqladmin shows an error raised while saving): a preview."""


class StoredScheduleAdmin(ModelView, model=StoredSchedule):
    name = "Schedule in the database"
    name_plural = "Schedules in the database"
    identity = "stored-schedule"
    icon = "fa-solid fa-pen-to-square"
    create_template = "voltro_beat/stored_create.html"
    edit_template = "voltro_beat/stored_edit.html"
    can_export = False
    # Set by add_views: editing needs the store's URL.
    table: ClassVar[ScheduleTable | None] = None
    column_list = ["name", "schedule_group", "enabled", "revision", "changed_by", "changed_at"]
    column_labels = {"schedule_group": "group", "changed_by": "changed by"}
    column_details_list = [
        "name",
        "schedule_group",
        "enabled",
        "revision",
        "definition",
        "changed_by",
        "changed_at",
    ]
    column_formatters = {"changed_at": lambda row, _a: instant_text(row.changed_at)}
    column_sortable_list = ["name"]
    column_default_sort = [("name", False)]
    column_searchable_list = ["name"]
    form_columns = ["name", "definition", "enabled", "revision"]
    form_create_rules: ClassVar[list[str]] = ["name", "definition", "enabled"]
    form_edit_rules: ClassVar[list[str]] = ["definition", "enabled", "revision"]
    form_include_pk = True
    form_overrides: ClassVar[dict[str, Any]] = {
        "name": StringField,
        "definition": TextAreaField,
        "revision": HiddenField,
    }
    form_args: ClassVar[dict[str, dict[str, Any]]] = {
        "definition": {
            "description": 'The entry as JSON: {"task": "proj.report", "schedule": '
            '"*/5 * * * *"} (docs/schedule-table.md).',
            "render_kw": {"rows": 8, "class": "form-control"},
        },
        "enabled": {"default": True},
        "revision": {"validators": [Optional()]},
    }

    async def get_form_data_for_edit(self, obj: Any) -> dict[str, Any]:
        data = await super().get_form_data_for_edit(obj)
        data["definition"] = json.dumps(json.loads(obj.definition), indent=2)
        return data

    async def insert_model(self, request: Request, data: dict[str, Any]) -> Any:
        return await self._write(request, data, None)

    async def update_model(self, request: Request, pk: str, data: dict[str, Any]) -> Any:
        return await self._write(request, {**data, "name": pk}, data.get("revision"))

    async def delete_model(self, request: Request, pk: Any) -> None:
        table = self._table()
        row = table.rows.get([pk]).get(pk)
        if row is not None:
            await anyio.to_thread.run_sync(
                lambda: table.remove(pk, revision=row.revision, by=_user(request))
            )

    async def _write(self, request: Request, data: dict[str, Any], revision: Any) -> Any:
        table = self._table()
        edit = Edit(
            str(data.get("name") or "").strip(),
            str(data.get("definition") or ""),
            bool(data.get("enabled")),
            int(revision) if revision not in (None, "") else None,
        )
        form = await request.form()
        if form.get("save") == PREVIEW_BUTTON:
            shown = await anyio.to_thread.run_sync(lambda: preview(table, edit))
            raise NotSaved(preview_text(shown))
        row = await anyio.to_thread.run_sync(lambda: save(table, edit, _user(request)))
        return StoredSchedule(name=row.name, revision=row.revision)

    def _table(self) -> ScheduleTable:
        if self.table is None:
            raise NotSaved("editing needs the store: add_views(admin, store_url=...)")
        return self.table

    def changes(self, name: str) -> list[str]:
        """The schedule's changes, oldest first (the edit page shows them)."""
        return [] if self.table is None else change_lines(self.table.history(name))


def _user(request: Request) -> str:
    """The logged-in user (``voltro-beat admin --no-auth`` has no session: "sqladmin")."""
    session = request.scope.get("session") or {}
    return str(session.get("user") or "sqladmin")
