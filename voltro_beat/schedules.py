"""Schedule definitions: every form a ``beat_schedule`` entry may use, validated once into
frozen specs.

The specs are plain data (microseconds, cron text, zone names) so that every replica, started
at any time on any host, derives exactly the same instants from them. Celery is imported only
when a Celery schedule object is actually given, so the occurrence maths stays Celery-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from voltro_beat import cron
from voltro_beat.cron import CronSpec
from voltro_beat.exceptions import ConfigurationError

MAX_NAME_LENGTH = 200
#: Names of voltro_beat's own jobs (the retention sweep's claims) start with this; no
#: schedule's may, so that their keys never meet.
RESERVED_PREFIX = "voltro-beat:"
CATCH_UP_MODES = ("latest", "skip", "all")
OVERLAP_MODES = ("allow", "skip", "queue")

# Celery's solar tables (celery.schedules.solar._methods/_horizons/_use_center_l), copied so
# the occurrence maths needs no Celery import; a unit test fails if Celery's ever change.
# event -> (ephem Observer method, horizon, use the sun's centre rather than its upper limb)
SOLAR_EVENTS: Mapping[str, tuple[str, str, bool]] = MappingProxyType(
    {
        "dawn_astronomical": ("next_rising", "-18", True),
        "dawn_nautical": ("next_rising", "-12", True),
        "dawn_civil": ("next_rising", "-6", True),
        "sunrise": ("next_rising", "-0:34", False),
        "solar_noon": ("next_transit", "0", False),
        "sunset": ("next_setting", "-0:34", False),
        "dusk_civil": ("next_setting", "-6", True),
        "dusk_nautical": ("next_setting", "-12", True),
        "dusk_astronomical": ("next_setting", "-18", True),
    }
)

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class IntervalSpec:
    """Every ``every_us`` microseconds: occurrence k is at ``anchor_us + k * every_us``.

    Both are microseconds since the Unix epoch; ``every_us`` is a whole number of milliseconds.
    """

    every_us: int
    anchor_us: int = 0


@dataclass(frozen=True, slots=True)
class SolarSpec:
    """A solar event (a key of :data:`SOLAR_EVENTS`) at a latitude/longitude in degrees."""

    event: str
    lat: float
    lon: float


@dataclass(frozen=True, slots=True)
class ClockedSpec:
    """A one-off instant (aware, UTC, whole milliseconds)."""

    at: datetime


Spec = IntervalSpec | CronSpec | SolarSpec | ClockedSpec
SPEC_TYPES = (IntervalSpec, CronSpec, SolarSpec, ClockedSpec)


@dataclass(frozen=True, slots=True)
class Entry:
    """One validated ``beat_schedule`` entry. The mappings are read-only copies."""

    name: str
    task: str
    spec: Spec
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    options: Mapping[str, Any]
    max_lateness: timedelta
    catch_up: str
    on_overlap: str
    overlap_timeout: timedelta | None


def to_spec(
    value: object,
    *,
    entry: str = "<schedule>",
    tz: str | None = None,
    anchor: datetime | None = None,
) -> Spec:
    """Validate one schedule definition into a frozen spec.

    Accepts a ``timedelta``, int/float seconds, ``celery.schedules.schedule``, a Celery
    ``crontab``, a cron string (5 fields, 6 with seconds first, or an ``@hourly``-style macro),
    a Celery ``solar``, an aware ``datetime`` (one-off) or a spec (returned as is). ``tz`` is
    the zone cron schedules run in (UTC if ``None``); ``anchor`` shifts an interval's grid.
    Raises :class:`ConfigurationError` naming ``entry`` and the field at fault.
    """
    zone = _zone_name(tz, entry)
    spec: Spec
    if isinstance(value, SPEC_TYPES):
        spec = value
    elif isinstance(value, str):
        spec = _cron_string(value, zone, entry)
    elif isinstance(value, datetime):
        spec = _clocked(value, entry)
    elif isinstance(value, timedelta | int | float) and not isinstance(value, bool):
        spec = IntervalSpec(_interval_us(value, entry))
    else:
        spec = _celery_spec(value, zone, entry)
    if anchor is None:
        return spec
    if not isinstance(spec, IntervalSpec):
        raise ConfigurationError(
            "an anchor applies only to interval schedules", **_at(entry, "anchor")
        )
    return IntervalSpec(spec.every_us, _aware_ms_us(anchor, entry, "anchor"))


def cadence(spec: Spec) -> timedelta | None:
    """Typical spacing between occurrences (``None`` for a one-off).

    For cron it is the gap between the first two occurrences after a fixed reference, which
    is exact for regular expressions and a fair estimate for irregular ones.
    """
    if isinstance(spec, IntervalSpec):
        return timedelta(microseconds=spec.every_us)
    if isinstance(spec, CronSpec):
        return cron.cadence(spec)
    if isinstance(spec, SolarSpec):
        return timedelta(days=1)
    return None


def check_name(name: object) -> str:
    """Return ``name`` if it can be a schedule name (used verbatim in occurrence keys)."""
    if not isinstance(name, str):
        raise ConfigurationError(
            f"the name must be a string, not {type(name).__name__}", **_at(repr(name), "name")
        )
    if not name:
        raise ConfigurationError("the name must not be empty", **_at(name, "name"))
    if "@" in name:
        raise ConfigurationError(
            "the name must not contain '@' (it separates the name from the instant in keys)",
            **_at(name, "name"),
        )
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"the name is {len(name)} characters long, at most {MAX_NAME_LENGTH} are allowed",
            **_at(name, "name"),
        )
    return name


_CELERY_KEYS = {"task", "schedule", "args", "kwargs", "options", "relative"}
_VOLTRO_KEYS = {"tz", "anchor", "max_lateness", "catch_up", "on_overlap", "overlap_timeout"}


def parse_entries(
    beat_schedule: Mapping[str, Mapping[str, Any]],
    *,
    tz: str | None,
    max_lateness: timedelta,
) -> tuple[Entry, ...]:
    """Validate Celery's ``beat_schedule`` into entries, raising on the first error.

    Celery's keys (``task``, ``schedule``, ``args``, ``kwargs``, ``options``, ``relative``)
    plus voltro's (``tz``, ``anchor``, ``max_lateness``, ``catch_up``, ``on_overlap``,
    ``overlap_timeout``); any other key is an error, so typos do not pass silently. ``tz`` is
    the app's timezone and ``max_lateness`` the default for entries that set none.
    """
    return tuple(_entry(name, raw, tz, max_lateness) for name, raw in beat_schedule.items())


def _entry(name: object, raw: object, app_tz: str | None, max_lateness: timedelta) -> Entry:
    name = check_name(name)
    if name.startswith(RESERVED_PREFIX):
        raise ConfigurationError(
            f"names starting with {RESERVED_PREFIX!r} are reserved for voltro_beat's own jobs",
            **_at(name, "name"),
        )
    if not isinstance(raw, Mapping):
        raise ConfigurationError(
            f"an entry must be a mapping, not {type(raw).__name__}", entry=name
        )
    for key in raw:
        if key not in _CELERY_KEYS and key not in _VOLTRO_KEYS:
            known = ", ".join(sorted(_CELERY_KEYS | _VOLTRO_KEYS))
            raise ConfigurationError(
                f"unknown key {key!r}; known keys: {known}", entry=name, field=str(key)
            )
    task = raw.get("task")
    if not isinstance(task, str) or not task:
        raise ConfigurationError("a task name (non-empty string) is required", **_at(name, "task"))
    if "schedule" not in raw:
        raise ConfigurationError("a schedule is required", **_at(name, "schedule"))
    if raw.get("relative", False) is not False:
        raise ConfigurationError(
            "relative=True is not supported: intervals are anchored to the Unix epoch "
            "(or the entry's anchor), which already gives clock-aligned instants",
            **_at(name, "relative"),
        )
    args = raw.get("args") or ()
    if not isinstance(args, list | tuple):
        raise ConfigurationError(
            f"args must be a list or tuple, not {type(args).__name__}", **_at(name, "args")
        )
    entry_tz = app_tz if raw.get("tz") is None else raw["tz"]
    return Entry(
        name=name,
        task=task,
        spec=to_spec(raw["schedule"], entry=name, tz=entry_tz, anchor=raw.get("anchor")),
        args=tuple(args),
        kwargs=_read_only(raw.get("kwargs"), name, "kwargs"),
        options=_read_only(raw.get("options"), name, "options"),
        max_lateness=_duration(raw.get("max_lateness", max_lateness), name, "max_lateness"),
        catch_up=_choice(raw.get("catch_up", "latest"), CATCH_UP_MODES, name, "catch_up"),
        on_overlap=_choice(raw.get("on_overlap", "allow"), OVERLAP_MODES, name, "on_overlap"),
        overlap_timeout=(
            None
            if raw.get("overlap_timeout") is None
            else _duration(raw["overlap_timeout"], name, "overlap_timeout")
        ),
    )


def _at(entry: str, field: str) -> dict[str, str]:
    return {"entry": entry, "field": field}


def _zone_name(tz: object, entry: str) -> str:
    if tz is None:
        return "UTC"
    if not isinstance(tz, str):
        raise ConfigurationError(
            f"a zone name is required, not {type(tz).__name__}", **_at(entry, "tz")
        )
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ConfigurationError(f"unknown time zone {tz!r}", **_at(entry, "tz")) from None
    return tz


def _interval_us(value: timedelta | float, entry: str) -> int:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigurationError(
            f"the interval must be finite, not {value!r}", **_at(entry, "schedule")
        )
    try:
        # timedelta rounds float seconds to microseconds exactly as Celery's maybe_timedelta does.
        every = value if isinstance(value, timedelta) else timedelta(seconds=value)
    except OverflowError:
        raise ConfigurationError(
            f"the interval {value!r} is too large", **_at(entry, "schedule")
        ) from None
    every_us = every // cron.MICROSECOND
    if every_us <= 0:
        raise ConfigurationError(
            f"the interval must be positive, not {every}", **_at(entry, "schedule")
        )
    if every_us % 1000:
        # Keys carry milliseconds at most; a finer grid could give two occurrences one key.
        raise ConfigurationError(
            f"the interval {every} is not a whole number of milliseconds", **_at(entry, "schedule")
        )
    return every_us


def _aware_ms_us(value: object, entry: str, field: str) -> int:
    """Microseconds since the epoch of an aware datetime, truncated to whole milliseconds."""
    if not isinstance(value, datetime):
        raise ConfigurationError(
            f"an aware datetime is required, not {type(value).__name__}", **_at(entry, field)
        )
    if value.utcoffset() is None:
        raise ConfigurationError(
            f"the datetime {value.isoformat()} is naive; give it a timezone", **_at(entry, field)
        )
    us = (value - cron.EPOCH) // cron.MICROSECOND
    return us - us % 1000


def _clocked(value: datetime, entry: str) -> ClockedSpec:
    us = _aware_ms_us(value, entry, "schedule")
    return ClockedSpec(cron.EPOCH + timedelta(microseconds=us))


def _cron_string(text: str, tz: str, entry: str) -> CronSpec:
    parsed = cron.parse_text(text)
    if isinstance(parsed, str):
        raise ConfigurationError(parsed, **_at(entry, "schedule"))
    expr, seconds_first, wildcard = parsed
    return _checked_cron(expr, tz, True, seconds_first, wildcard, entry)


def _checked_cron(
    expr: str, tz: str, day_or: bool, second_at_beginning: bool, wildcard: bool, entry: str
) -> CronSpec:
    spec = cron.checked(expr, tz, day_or, second_at_beginning, wildcard)
    if isinstance(spec, str):
        raise ConfigurationError(spec, **_at(entry, "schedule"))
    return spec


def _celery_spec(value: object, tz: str, entry: str) -> Spec:
    cls = type(value)
    # The class itself first: the whole MRO only for subclasses defined elsewhere.
    if not cls.__module__.startswith("celery.") and not any(
        base.__module__.startswith("celery.") for base in cls.__mro__
    ):
        raise ConfigurationError(
            f"unknown schedule type {type(value).__name__}", **_at(entry, "schedule")
        )
    # Imported here only: a Celery object means Celery is loaded already, and the occurrence
    # maths must not import it.
    from celery import schedules

    if isinstance(value, schedules.crontab):
        minutes, hours, days, months, weekdays = _CRONTAB_FULL
        expr = (
            f"{_cron_field(value.minute, minutes)} {_cron_field(value.hour, hours)} "
            f"{_cron_field(value.day_of_month, days)} {_cron_field(value.month_of_year, months)} "
            f"{_cron_field(value.day_of_week, weekdays)}"
        )
        wildcard = _starts_with_star(value._orig_minute) or _starts_with_star(value._orig_hour)
        return _checked_cron(expr, tz, False, False, wildcard, entry)
    if isinstance(value, schedules.solar):
        return SolarSpec(value.event, float(value.lat), float(value.lon))
    if isinstance(value, schedules.schedule):
        if value.relative:
            raise ConfigurationError(
                "schedule(relative=True) is not supported: intervals are anchored to the Unix "
                "epoch (or the entry's anchor), which already gives clock-aligned instants",
                **_at(entry, "schedule"),
            )
        return IntervalSpec(_interval_us(value.run_every, entry))
    raise ConfigurationError(
        f"unsupported Celery schedule type {type(value).__name__}", **_at(entry, "schedule")
    )


# Every value of a crontab field (minute, hour, day of month, month, day of week): "*".
_CRONTAB_FULL = tuple(
    frozenset(full) for full in (range(60), range(24), range(1, 32), range(1, 13), range(7))
)


def _cron_field(values: set[int], full: frozenset[int]) -> str:
    return "*" if values == full else ",".join(map(str, sorted(values)))


def _starts_with_star(orig: object) -> bool:
    return isinstance(orig, str) and orig.strip().startswith("*")


def _read_only(value: object, entry: str, field: str) -> Mapping[str, Any]:
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"{field} must be a mapping, not {type(value).__name__}", **_at(entry, field)
        )
    return MappingProxyType(dict(value))


def _duration(value: object, entry: str, field: str) -> timedelta:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        value = timedelta(seconds=value)
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise ConfigurationError(
            f"a positive timedelta or number of seconds is required, not {value!r}",
            **_at(entry, field),
        )
    return value


def _choice(value: object, allowed: tuple[str, ...], entry: str, field: str) -> str:
    if value not in allowed:
        raise ConfigurationError(
            f"{value!r} is not one of {', '.join(allowed)}", **_at(entry, field)
        )
    return str(value)
