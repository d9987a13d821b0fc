"""Schedules kept in the database: the Python API behind ``voltro-beat schedules`` and the
admins.

Every edit is validated as beat validates the app's ``beat_schedule`` (the same errors,
naming the schedule and the field) before anything is stored, and is based on the revision
the editor saw: an edit of a schedule that changed since is refused
(:class:`~voltro_beat.exceptions.EditRefused`), so two operators cannot overwrite each other
silently. Each edit leaves a change row (before and after, who, when on the database's
clock): :meth:`ScheduleTable.history`.

    table = ScheduleTable(Database.open(url), settings, code=load_schedule(app, settings).entries)
    row = table.add("report", {"task": "proj.report", "schedule": "*/5 * * * *"}, by="ana")
    table.disable("report", revision=row.revision, by="ana")
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from voltro_beat import definitions
from voltro_beat.config import Settings
from voltro_beat.exceptions import ConfigurationError, EditRefused
from voltro_beat.occurrences import next_instants
from voltro_beat.replicas import lives
from voltro_beat.schedules import Entry
from voltro_beat.store.database import Database
from voltro_beat.store.registry import Registry
from voltro_beat.store.schedule_rows import ScheduleChange, ScheduleRow, ScheduleRows

#: What an edit records as its author when none is given.
NOBODY = "unknown"


class ScheduleTable:
    """Validated, revisioned edits of the schedules table in ``database``, with ``settings``'
    defaults (the app's zone and ``max_lateness``); ``code`` names the app's own entries, which
    a table schedule may not shadow unless ``voltro_beat_schedule_conflicts`` says which wins."""

    def __init__(
        self, database: Database, settings: Settings, *, code: Collection[str] = ()
    ) -> None:
        self.database = database
        self.settings = settings
        self.code = frozenset(code)
        self.rows = ScheduleRows(database)

    def entry(self, name: str, definition: Mapping[str, Any]) -> Entry:
        """``definition`` checked into the entry beat would fire; raises
        :class:`ConfigurationError` naming ``name`` and the field at fault."""
        return definitions.check(
            name, definition, tz=self.settings.timezone, max_lateness=self.settings.max_lateness
        )

    def add(
        self, name: str, definition: Mapping[str, Any], *, by: str = NOBODY, enabled: bool = True
    ) -> ScheduleRow:
        """Add schedule ``name``; refused if it exists (or the app defines it, see above)."""
        if name in self.code and self.settings.schedule_conflicts == "error":
            raise ConfigurationError(
                "the app's beat_schedule defines this name already (set "
                "voltro_beat_schedule_conflicts to 'code' or 'table' to say which wins)",
                entry=name,
                field="name",
            )
        entry = self.entry(name, definition)
        row = self.rows.write(
            name, "add", expected=None, after=_after(entry, definition, enabled), by=by
        )
        assert row is not None
        return row

    def set(
        self, name: str, definition: Mapping[str, Any], *, revision: int, by: str = NOBODY
    ) -> ScheduleRow:
        """Replace the definition of ``name`` (at ``revision``); it stays enabled or not."""
        entry = self.entry(name, definition)
        enabled = self._current(name).enabled
        row = self.rows.write(
            name, "set", expected=revision, after=_after(entry, definition, enabled), by=by
        )
        assert row is not None
        return row

    def enable(self, name: str, *, revision: int, by: str = NOBODY) -> ScheduleRow:
        """Let ``name`` fire again, from its first instant after this change: the time it was
        disabled gets no run rows, and no catch-up."""
        return self._switch(name, True, revision, by)

    def disable(self, name: str, *, revision: int, by: str = NOBODY) -> ScheduleRow:
        """Stop ``name`` firing (its row and history stay)."""
        return self._switch(name, False, revision, by)

    def remove(self, name: str, *, revision: int, by: str = NOBODY) -> None:
        """Remove ``name`` (its history stays, and runs already claimed still run)."""
        self.rows.write(name, "remove", expected=revision, after=None, by=by)

    def history(self, name: str) -> list[ScheduleChange]:
        """The changes of ``name``, oldest first."""
        return self.rows.history(name)

    def next_instants(self, name: str, definition: Mapping[str, Any], count: int) -> list[datetime]:
        """The next ``count`` instants of ``definition`` after now on the database's clock (the
        one the change would be committed on); raises :class:`ConfigurationError` as saving
        it would."""
        return next_instants(self.entry(name, definition).spec, self.database.time(), count)

    def applied(self, row: ScheduleRow) -> str:
        """``applied by 3 of 3 live replicas``, or which live replicas are behind ``row``
        (the registry's ``schedules_revision``, liveness on the database's clock)."""
        now = self.database.time()
        live = [r for r in Registry(self.database).everyone() if lives(r, now)]
        behind = sorted(r.name for r in live if r.schedules_revision < row.revision)
        text = f"applied by {len(live) - len(behind)} of {len(live)} live replicas"
        return text + (f" (behind: {', '.join(behind)})" if behind else "")

    def _switch(self, name: str, enabled: bool, revision: int, by: str) -> ScheduleRow:
        current = self._current(name)
        entry = self.entry(name, current.definition)
        after = _after(entry, current.definition, enabled)
        action = "enable" if enabled else "disable"
        row = self.rows.write(name, action, expected=revision, after=after, by=by)
        assert row is not None
        return row

    def _current(self, name: str) -> ScheduleRow:
        found = self.rows.get([name]).get(name)
        if found is None:
            raise EditRefused(f"no schedule {name!r} in the schedules table", name=name)
        return found


def change_lines(changes: Sequence[ScheduleChange]) -> list[str]:
    """One line per change, oldest first: revision, when, action, who, and the row after it."""
    lines = []
    for c in changes:
        state = "" if c.after is None else (" enabled" if c.after["enabled"] else " disabled")
        after = "" if c.after is None else " " + json.dumps(c.after["definition"])
        when = f"{c.changed_at:%Y-%m-%d %H:%M:%S}"
        lines.append(f"r{c.revision} {when} {c.action} by {c.changed_by}{state}{after}")
    return lines


def _after(entry: Entry, definition: Mapping[str, Any], enabled: bool) -> dict[str, Any]:
    return {"group": entry.group, "definition": dict(definition), "enabled": enabled}
