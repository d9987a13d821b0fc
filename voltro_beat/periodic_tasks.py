"""django-celery-beat's periodic tasks as schedules of the table (``voltro-beat schedules
import --django-celery-beat URL``), read from its tables with SQL: no Django needed.

Each ``PeriodicTask`` becomes a document (:mod:`voltro_beat.definitions`) that fires at the
instants django-celery-beat's scheduler would, had each run been on time:

- an ``IntervalSchedule`` is an interval anchored at the task's ``last_run_at`` (else its
  ``date_changed``, where django-celery-beat starts counting too);
- a ``CrontabSchedule`` keeps its fields and its ``timezone`` (the entry's ``tz``), with
  Celery's day matching;
- a ``SolarSchedule`` is ``solar``; a ``ClockedSchedule`` a one-off instant.

Its ``args``, ``kwargs`` and ``headers`` (JSON text there), ``queue``, ``exchange``,
``routing_key``, ``priority`` and ``expires`` / ``expire_seconds`` become the entry's, and
``enabled`` the row's. What has no equivalent is reported, not imported: a ``start_time``
still ahead, ``one_off`` on anything but a clocked schedule.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

#: django-celery-beat's tables.
PREFIX = "django_celery_beat_"
#: An IntervalSchedule's periods, as timedelta's keywords.
PERIODS = ("days", "hours", "minutes", "seconds", "microseconds")


@dataclass(frozen=True, slots=True)
class Imported:
    """One periodic task: its document and whether it is enabled, or why it was left out."""

    name: str
    definition: dict[str, Any] | None
    enabled: bool
    skipped: str | None = None


def read(url: str, *, now: datetime) -> Iterator[Imported]:
    """Every periodic task of the django-celery-beat database at ``url`` (a SQLAlchemy URL),
    by name; ``now`` decides whether a ``start_time`` is still ahead."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            tasks = conn.execute(sa.text(f"SELECT * FROM {PREFIX}periodictask ORDER BY name"))
            rows = [r._mapping for r in tasks]
            kinds = {
                kind: {r.id: r._mapping for r in conn.execute(sa.text(f"SELECT * FROM {table}"))}
                for kind, table in _KINDS.items()
            }
    finally:
        engine.dispose()
    for row in rows:
        yield _imported(row, kinds, now)


_KINDS = {
    "interval": f"{PREFIX}intervalschedule",
    "crontab": f"{PREFIX}crontabschedule",
    "solar": f"{PREFIX}solarschedule",
    "clocked": f"{PREFIX}clockedschedule",
}


def _imported(row: Any, kinds: dict[str, dict[int, Any]], now: datetime) -> Imported:
    name = row["name"]
    kind = next((k for k in _KINDS if row.get(f"{k}_id") is not None), None)
    if kind is None:
        return Imported(name, None, False, "no schedule")
    schedule = kinds[kind][row[f"{kind}_id"]]
    start = _aware(row.get("start_time"))
    if start is not None and start > now:
        return Imported(name, None, False, f"start_time {start.isoformat()} is ahead")
    if row.get("one_off") and kind != "clocked":
        return Imported(name, None, False, f"one_off on a {kind} schedule")
    doc: dict[str, Any] = {"task": row["task"]}
    if kind == "interval":
        every = timedelta(**{schedule["period"]: schedule["every"]})
        doc["schedule"] = {"every": every.total_seconds()}
        anchor = _aware(row.get("last_run_at")) or _aware(row.get("date_changed"))
        if anchor is not None:
            doc["anchor"] = anchor.isoformat()
    elif kind == "crontab":
        fields = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")
        doc["schedule"] = {"crontab": {f: schedule[f] for f in fields}}
        doc["tz"] = str(schedule["timezone"])
    elif kind == "solar":
        doc["schedule"] = {
            "solar": schedule["event"],
            "lat": float(schedule["latitude"]),
            "lon": float(schedule["longitude"]),
        }
    else:
        clocked = _aware(schedule["clocked_time"])
        assert clocked is not None
        doc["schedule"] = {"at": clocked.isoformat()}
    for key in ("args", "kwargs"):
        value = json.loads(row.get(key) or "null")
        if value:
            doc[key] = value
    options = _options(row)
    if options:
        doc["options"] = options
    return Imported(name, doc, bool(row["enabled"]))


def _options(row: Any) -> dict[str, Any]:
    options = {k: row[k] for k in ("queue", "exchange", "routing_key", "priority") if row.get(k)}
    expires = _aware(row.get("expires"))
    if expires is not None:
        options["expires"] = expires.isoformat()
    elif row.get("expire_seconds"):
        options["expires"] = row["expire_seconds"]
    headers = json.loads(row.get("headers") or "null")
    if headers:
        options["headers"] = headers
    return options


def _aware(value: Any) -> datetime | None:
    """A stored instant, aware (django-celery-beat stores UTC with USE_TZ; SQLite as text)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime), value
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
