"""A schedule written down: the JSON document a row of the schedules table holds, to and from
the ``beat_schedule`` entry it stands for.

A document has an entry's keys with JSON values; its ``schedule`` is one of::

    "*/5 * * * *"                                     a cron string (5 or 6 fields, @hourly)
    {"every": 30}                                     an interval in seconds (with "anchor")
    {"crontab": {"minute": "*/5", "hour": "9-17"}}    Celery's crontab fields
    {"solar": "sunset", "lat": 52.37, "lon": 4.9}     Celery's solar
    {"at": "2026-12-24T18:00:00+00:00"}               a one-off instant

and ``anchor`` is an ISO instant, ``max_lateness`` and ``overlap_timeout`` seconds. A
document is checked by turning it into its entry and parsing that as beat parses the app's
``beat_schedule`` (:func:`voltro_beat.schedules.parse_entries`): the same errors, naming the
schedule and the field, before anything is stored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from voltro_beat.exceptions import ConfigurationError
from voltro_beat.schedules import Entry, Spec, parse_entries

#: The fields of Celery's crontab, in the order of a cron line.
CRONTAB_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
#: The keys whose value is a duration (seconds in a document).
_DURATIONS = ("max_lateness", "overlap_timeout")


def to_entry(name: str, doc: Mapping[str, Any]) -> dict[str, Any]:
    """The ``beat_schedule`` entry ``doc`` stands for (Celery's objects where it has them).
    Raises :class:`ConfigurationError` naming ``name`` and the field at fault."""
    if not isinstance(doc, Mapping):
        raise ConfigurationError(
            f"a definition must be a JSON object, not {type(doc).__name__}", entry=name
        )
    raw = dict(doc)
    if "schedule" in raw:
        raw["schedule"] = _schedule(name, raw["schedule"])
    if raw.get("anchor") is not None:
        raw["anchor"] = _instant(name, "anchor", raw["anchor"])
    return raw


def check(name: str, doc: Mapping[str, Any], *, tz: str | None, max_lateness: timedelta) -> Entry:
    """The entry of ``doc``, validated as beat validates the app's entries; raises
    :class:`ConfigurationError` naming ``name`` and the field at fault. ``tz`` and
    ``max_lateness`` are the app's (the defaults of a document that sets neither)."""
    for key in ("args", "kwargs", "options"):
        try:
            json.dumps(doc.get(key))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"must be JSON (a row holds it as JSON): {exc}", entry=name, field=key
            ) from None
    zone = tz if doc.get("tz") is None else doc["tz"]
    key = json.dumps([doc.get("schedule"), doc.get("anchor"), zone], sort_keys=True)
    spec = _specs.get(key) if "schedule" in doc else None
    if spec is None:
        raw = to_entry(name, doc)
    else:  # checked before: the same schedule, anchor and zone give the same spec
        raw = {k: v for k, v in doc.items() if k != "anchor"}
        raw["schedule"] = spec
    (entry,) = parse_entries({name: raw}, tz=tz, max_lateness=max_lateness)
    if spec is None and "schedule" in doc:
        if len(_specs) >= MAX_SPECS:
            _specs.clear()
        _specs[key] = entry.spec
    return entry


#: Schedules checked before, by their document (schedule, anchor, zone): at 100,000 rows most
#: share a few, and building Celery's crontab for each would take most of a boot.
MAX_SPECS = 10_000
_specs: dict[str, Spec] = {}


def from_entry(name: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """The document of a ``beat_schedule`` entry (for ``import`` and the admins); raises
    :class:`ConfigurationError` for what cannot be written down (a schedule class of the
    app's own, arguments that are not JSON)."""
    doc: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "schedule":
            doc[key] = _written_schedule(name, value)
        elif key == "anchor" and isinstance(value, datetime):
            doc[key] = value.isoformat()
        elif key in _DURATIONS and isinstance(value, timedelta):
            doc[key] = value.total_seconds()
        elif key == "args":
            doc[key] = list(value)
        elif key in ("kwargs", "options"):
            doc[key] = dict(value)
        else:
            doc[key] = value
    try:
        json.dumps(doc)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"cannot be written down as JSON: {exc}", entry=name, field="args"
        ) from None
    return doc


def python_entry(doc: Mapping[str, Any]) -> str:
    """``doc`` as Python source of a ``beat_schedule`` entry (``voltro-beat schedules export
    --python``): Celery's ``crontab``/``solar`` and ``timedelta`` where it uses them."""
    parts = []
    for key, value in doc.items():
        if key == "schedule":
            parts.append(f"{key!r}: {_python_schedule(value)}")
        elif key in _DURATIONS:
            parts.append(f"{key!r}: timedelta(seconds={value!r})")
        elif key == "anchor":
            parts.append(f"{key!r}: datetime.fromisoformat({value!r})")
        else:
            parts.append(f"{key!r}: {value!r}")
    return "{" + ", ".join(parts) + "}"


def _python_schedule(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if "every" in value:
        return f"timedelta(seconds={value['every']!r})"
    if "crontab" in value:
        fields = ", ".join(f"{k}={v!r}" for k, v in value["crontab"].items())
        return f"crontab({fields})"
    if "solar" in value:
        return f"solar({value['solar']!r}, {value['lat']!r}, {value['lon']!r})"
    return f"datetime.fromisoformat({value['at']!r})"


def _schedule(name: str, value: Any) -> Any:
    if isinstance(value, str):
        return value
    if not isinstance(value, Mapping) or len(value.keys() & _FORMS) != 1:
        raise ConfigurationError(
            f"a cron string or an object with one of every, crontab, solar, at; not {value!r}",
            entry=name,
            field="schedule",
        )
    from celery import schedules  # the entry parser reads Celery's objects

    if "every" in value:
        every = value["every"]
        if (
            isinstance(every, bool)
            or not isinstance(every, int | float)
            or not math.isfinite(every)
        ):
            raise ConfigurationError(
                f"every is a number of seconds, not {every!r}", entry=name, field="schedule"
            )
        return every  # the entry parser refuses one that is not positive
    if "crontab" in value:
        fields = value["crontab"]
        if not isinstance(fields, Mapping) or not set(fields) <= set(CRONTAB_FIELDS):
            raise ConfigurationError(
                f"crontab takes the fields {', '.join(CRONTAB_FIELDS)}, not {fields!r}",
                entry=name,
                field="schedule",
            )
        try:
            return schedules.crontab(**{k: str(v) for k, v in fields.items()})
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"crontab: {exc}", entry=name, field="schedule") from None
    if "solar" in value:
        try:
            return schedules.solar(value["solar"], float(value["lat"]), float(value["lon"]))
        except (KeyError, ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"solar needs an event, lat and lon: {exc}", entry=name, field="schedule"
            ) from None
    return _instant(name, "schedule", value["at"])


_FORMS = {"every", "crontab", "solar", "at"}


def _instant(name: str, field: str, value: Any) -> datetime:
    try:
        return datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"an ISO instant with its offset is required, not {value!r}", entry=name, field=field
        ) from None


def _written_schedule(name: str, value: Any) -> Any:
    from celery import schedules

    if isinstance(value, str):
        return value
    if isinstance(value, timedelta):
        return {"every": value.total_seconds()}
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"every": value}
    if isinstance(value, datetime):
        return {"at": value.isoformat()}
    if type(value) is schedules.crontab:
        return {"crontab": {f: str(getattr(value, f"_orig_{f}")) for f in CRONTAB_FIELDS}}
    if type(value) is schedules.solar:
        return {"solar": value.event, "lat": value.lat, "lon": value.lon}
    if type(value) is schedules.schedule:
        return {"every": value.run_every.total_seconds()}
    raise ConfigurationError(
        f"a {type(value).__name__} cannot be written down (a cron string, an interval, "
        "crontab, solar or a one-off instant can)",
        entry=name,
        field="schedule",
    )
