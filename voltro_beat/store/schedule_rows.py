"""The schedules table and its changes: schedules kept in the database, edited by revision.

Every change is one transaction: it takes the edits lock (one edit at a time, so that
revisions commit in the order they are numbered and a replica reading "changed since my
revision" never skips one committed late), checks the revision the editor based the change
on, writes the row and one change row with the row before and after. The change's revision is
one more than the last change of any schedule; the schedule's row carries it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from voltro_beat.exceptions import EditRefused
from voltro_beat.store.database import Database
from voltro_beat.store.tables import schedule_changes, schedules

#: The newest revision (0 before the first change).
_NEWEST = sa.select(sa.func.coalesce(sa.func.max(schedule_changes.c.revision), 0))


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """A schedule of the table as it stands."""

    name: str
    group: str
    #: Its definition: a JSON document (:mod:`voltro_beat.definitions`).
    definition: Mapping[str, Any]
    enabled: bool
    revision: int
    changed_by: str
    changed_at: datetime

    def written(self) -> dict[str, Any]:
        """The row as a change records it (before or after)."""
        return {"group": self.group, "definition": self.definition, "enabled": self.enabled}


@dataclass(frozen=True, slots=True)
class ScheduleChange:
    """One change of the table (``action``: add, set, enable, disable, remove)."""

    revision: int
    name: str
    action: str
    before: Mapping[str, Any] | None
    after: Mapping[str, Any] | None
    changed_by: str
    changed_at: datetime


class ScheduleRows:
    """The rows of ``_voltro_beat_schedules`` and ``_voltro_beat_schedule_changes``."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def all(self) -> list[ScheduleRow]:
        """Every schedule of the table, by name."""
        with self.database.connect() as conn:
            return [_row(r) for r in conn.execute(sa.select(schedules).order_by(schedules.c.name))]

    def get(self, names: Sequence[str]) -> dict[str, ScheduleRow]:
        """The rows of ``names`` that exist."""
        stmt = sa.select(schedules).where(schedules.c.name.in_(self.database.dialect.names()))
        with self.database.connect() as conn:
            return {r.name: _row(r) for r in conn.execute(stmt, {"names": json.dumps(list(names))})}

    def changed_since(self, revision: int) -> tuple[int, dict[str, ScheduleRow | None]]:
        """The newest revision, and each schedule changed after ``revision`` as it stands
        now (None: removed); one read of the changes' index and one of their rows."""
        with self.database.connect() as conn:
            found = conn.execute(
                sa.select(schedule_changes.c.revision, schedule_changes.c.name).where(
                    schedule_changes.c.revision > revision
                )
            ).all()
            if not found:
                return revision, {}
            names = sorted({name for _, name in found})
            rows = {
                r.name: _row(r)
                for r in conn.execute(
                    sa.select(schedules).where(schedules.c.name.in_(self.database.dialect.names())),
                    {"names": json.dumps(names)},
                )
            }
        return max(rev for rev, _ in found), {name: rows.get(name) for name in names}

    def revision(self) -> int:
        """The newest revision (0: no change yet)."""
        with self.database.connect() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.coalesce(sa.func.max(schedule_changes.c.revision), 0))
                ).scalar_one()
            )

    def history(self, name: str) -> list[ScheduleChange]:
        """The changes of schedule ``name``, oldest first."""
        stmt = (
            sa.select(schedule_changes)
            .where(schedule_changes.c.name == name)
            .order_by(schedule_changes.c.revision)
        )
        with self.database.connect() as conn:
            return [
                ScheduleChange(
                    r.revision,
                    r.name,
                    r.action,
                    _json(r.before),
                    _json(r.after),
                    r.changed_by,
                    r.changed_at,
                )
                for r in conn.execute(stmt)
            ]

    def write(
        self,
        name: str,
        action: str,
        *,
        expected: int | None,
        after: Mapping[str, Any] | None,
        by: str,
    ) -> ScheduleRow | None:
        """Change schedule ``name`` to ``after`` (``group``, ``definition``, ``enabled``;
        None removes it), based on revision ``expected`` (None: the schedule must not exist).
        Returns the row as written (None once removed). Raises :class:`EditRefused` if the
        schedule's revision is not ``expected``."""
        with self.database.connect() as conn, conn.begin():
            self.database.dialect.lock_edits(conn)
            current = conn.execute(sa.select(schedules).where(schedules.c.name == name)).first()
            before = None if current is None else _row(current)
            _check(name, before, expected)
            revision = (
                1
                + conn.execute(
                    sa.select(sa.func.coalesce(sa.func.max(schedule_changes.c.revision), 0))
                ).scalar_one()
            )
            conn.execute(
                sa.insert(schedule_changes).values(
                    revision=revision,
                    name=name,
                    action=action,
                    before=None if before is None else json.dumps(before.written()),
                    after=None if after is None else json.dumps(dict(after)),
                    changed_by=by,
                    changed_at=self.database.statement_clock(),
                )
            )
            now = conn.execute(
                sa.select(schedule_changes.c.changed_at).where(
                    schedule_changes.c.revision == revision
                )
            ).scalar_one()
            if after is None:
                conn.execute(sa.delete(schedules).where(schedules.c.name == name))
                return None
            values = {
                "schedule_group": after["group"],
                "definition": json.dumps(after["definition"]),
                "enabled": after["enabled"],
                "revision": revision,
                "changed_by": by,
                "changed_at": now,
            }
            _upsert(conn, name, before, values)
        return ScheduleRow(
            name, after["group"], after["definition"], after["enabled"], revision, by, now
        )


def _check(name: str, before: ScheduleRow | None, expected: int | None) -> None:
    if expected is None and before is not None:
        raise EditRefused(
            f"schedule {name!r} exists already (revision {before.revision})", name=name
        )
    if expected is not None and before is None:
        raise EditRefused(f"no schedule {name!r} in the schedules table", name=name)
    if before is not None and expected != before.revision:
        raise EditRefused(
            f"schedule {name!r} is at revision {before.revision}, not {expected}: it changed "
            f"since (by {before.changed_by} at {before.changed_at.isoformat()}); "
            "look at it again and base the change on its revision",
            name=name,
        )


def _upsert(
    conn: Connection, name: str, before: ScheduleRow | None, values: dict[str, Any]
) -> None:
    if before is None:
        conn.execute(sa.insert(schedules).values(name=name, **values))
    else:
        conn.execute(sa.update(schedules).where(schedules.c.name == name).values(**values))


def _row(r: Any) -> ScheduleRow:
    return ScheduleRow(
        r.name,
        r.schedule_group,
        json.loads(r.definition),
        bool(r.enabled),
        r.revision,
        r.changed_by,
        r.changed_at,
    )


def _json(text: str | None) -> Mapping[str, Any] | None:
    return None if text is None else json.loads(text)
