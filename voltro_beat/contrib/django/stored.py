"""The schedules table in the Django admin: listed, added, changed, enabled, disabled and
removed by whoever has the model's permissions (``voltro_beat.add_storedschedule`` ...).

Writes go through :mod:`voltro_beat.contrib.schedule_forms` (the checks of ``voltro-beat
schedules``, the revision the form was loaded at, a change row by the admin's user), never
through Django's ORM. The store is reached at ``settings.VOLTRO_BEAT_STORE_URL``, else at the
URL of the database alias that holds voltro_beat's tables; ``VOLTRO_BEAT_CELERY_APP`` gives
the app's zone and ``max_lateness`` defaults and its own entries' names.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from sqlalchemy.engine import URL

from voltro_beat.contrib import schedule_forms
from voltro_beat.contrib.django.apps import database
from voltro_beat.contrib.django.models import StoredSchedule
from voltro_beat.exceptions import ConfigurationError, EditRefused
from voltro_beat.schedule_table import ScheduleTable, change_lines

#: The submit button that shows the next instants instead of saving.
PREVIEW = "_preview"


def store_url() -> str:
    """``VOLTRO_BEAT_STORE_URL``, else the SQLAlchemy URL of voltro_beat's database alias."""
    explicit: str | None = getattr(settings, "VOLTRO_BEAT_STORE_URL", None)
    if explicit:
        return explicit
    db = settings.DATABASES[database()]
    engine = str(db["ENGINE"])
    if engine.endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    if "postgresql" in engine:
        return URL.create(
            "postgresql+psycopg",
            username=db.get("USER") or None,
            password=db.get("PASSWORD") or None,
            host=db.get("HOST") or None,
            port=int(db["PORT"]) if db.get("PORT") else None,
            database=db.get("NAME"),
        ).render_as_string(hide_password=False)
    raise ImproperlyConfigured(f"voltro_beat cannot write to {engine}: set VOLTRO_BEAT_STORE_URL")


@cache
def table() -> ScheduleTable:
    return schedule_forms.open_table(store_url(), getattr(settings, "VOLTRO_BEAT_CELERY_APP", None))


class StoredScheduleForm(forms.ModelForm):
    """Name (when adding), definition, enabled, and the revision the form was loaded at."""

    #: The user saving, set by the admin before the form is checked.
    user = "django"

    class Meta:
        model = StoredSchedule
        fields = ("name", "definition", "enabled", "revision")
        widgets = {
            "name": forms.TextInput(attrs={"size": 60}),
            "definition": forms.Textarea(attrs={"rows": 8, "cols": 80}),
            "revision": forms.HiddenInput(),
        }
        help_texts = {
            "definition": 'The entry as JSON: {"task": "proj.report", "schedule": '
            '"*/5 * * * *"} (docs/schedule-table.md).',
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "revision" in self.fields:  # the change form only
            self.fields["revision"].required = False
        self.saved: Any = None

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean()
        if self.errors:
            return data
        name = self.instance.name if self.instance.pk else data.get("name", "")
        edit = schedule_forms.Edit(
            name,
            data.get("definition", ""),
            bool(data.get("enabled")),
            data.get("revision") if self.instance.pk else None,
        )
        try:
            if PREVIEW in self.data:
                shown = schedule_forms.preview(table(), edit)
                raise ValidationError(schedule_forms.preview_text(shown))
            self.saved = schedule_forms.save(table(), edit, self.user)
        except ConfigurationError as exc:
            self.add_error("definition" if exc.field != "name" else "name", str(exc))
        except EditRefused as exc:
            raise ValidationError(str(exc)) from None
        return data

    def validate_unique(self) -> None:
        """The table refuses a name it has (EditRefused), in the same transaction."""


class StoredScheduleAdmin(admin.ModelAdmin):
    form = StoredScheduleForm
    change_form_template = "admin/voltro_beat/storedschedule/change_form.html"
    list_display = ("name", "schedule_group", "enabled", "revision", "schedule", "changed_by",
                    "changed_at")  # fmt: skip
    list_filter = ("enabled", "schedule_group")
    search_fields = ("name",)
    actions = None
    readonly_fields = ("next_instants", "applied", "changes")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return ["name", "definition", "enabled"]
        return ["definition", "enabled", "revision", "next_instants", "applied", "changes"]

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        form.user = request.user.get_username() or "django"
        return form

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Written already, by the form (:mod:`voltro_beat.contrib.schedule_forms`)."""
        obj.revision = form.saved.revision

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        table().remove(obj.name, revision=obj.revision, by=request.user.get_username())

    @admin.display(description="schedule")
    def schedule(self, obj: StoredSchedule) -> str:
        return str(schedule_forms.document(obj.name, obj.definition).get("schedule", ""))

    @admin.display(description="next instants")
    def next_instants(self, obj: StoredSchedule) -> str:
        edit = schedule_forms.Edit(obj.name, obj.definition, obj.enabled, obj.revision)
        try:
            shown = schedule_forms.preview(table(), edit)
        except ConfigurationError as exc:
            return str(exc)
        return ", ".join(f"{at:%Y-%m-%d %H:%M:%S} UTC" for at in shown) or "none"

    @admin.display(description="applied")
    def applied(self, obj: StoredSchedule) -> str:
        row = table().rows.get([obj.name]).get(obj.name)
        return "" if row is None else table().applied(row)

    @admin.display(description="changes")
    def changes(self, obj: StoredSchedule) -> SafeString:
        lines = change_lines(table().history(obj.name))
        return format_html(
            "<ul style='margin:0'>{}</ul>",
            format_html_join("", "<li><code>{}</code></li>", ((line,) for line in lines)),
        )
