"""Schedule definitions: every form a ``beat_schedule`` entry may use, validated once into
frozen specs.

The specs are plain data (microseconds, cron text, zone names) so that every replica, started
at any time on any host, derives exactly the same instants from them. Celery is imported only
when a Celery schedule object is actually given, so the occurrence maths stays Celery-free.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, cast
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
#: Who fires an entry: beat's own timers, or ``voltro-beat trigger`` (a platform's scheduler).
TRIGGERS = ("beat", "external")

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


@dataclass(frozen=True, slots=True)
class CustomSpec:
    """A schedule class of the app's own (a ``celery.schedules.BaseSchedule`` subclass).

    ``definition`` (the object's ``repr``) is what replicas compare; ``walk(after)`` is the
    first instant strictly after ``after`` (aware UTC, whole milliseconds) or ``None``, from
    the class's ``next_after(after)`` or its ``remaining_estimate`` asked at ``after``.
    """

    definition: str
    walk: Callable[[datetime], datetime | None] = field(compare=False, repr=False)
    #: The gap between the first two instants the boot check walked (None: fewer than two).
    typical: timedelta | None = field(default=None, compare=False, repr=False)


#: The group of a replica or schedule that names none.
DEFAULT_GROUP = "default"

Spec = IntervalSpec | CronSpec | SolarSpec | ClockedSpec | CustomSpec
SPEC_TYPES = (IntervalSpec, CronSpec, SolarSpec, ClockedSpec, CustomSpec)


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
    #: ``beat`` or ``external``: an external entry is fired only by ``voltro-beat trigger``.
    trigger: str = "beat"
    #: The replicas that fire it: those of this group (``voltro_beat_group``).
    group: str = DEFAULT_GROUP
    #: The revision of the schedules table it was defined at (None: the app's own entry).
    revision: int | None = None


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


def _shared_spec(
    value: object,
    entry: str,
    tz: str | None,
    specs: dict[tuple[object, str | None], tuple[object, Spec]],
) -> Spec:
    """``to_spec``, once per schedule object (by identity) or cron string, and zone, among
    the entries ``specs`` is kept for. It keeps each object too: an identity is not reused
    while ``specs`` lives."""
    key = (value if isinstance(value, str) else id(value), tz)
    kept = specs.get(key)
    if kept is None:
        kept = specs[key] = (value, to_spec(value, entry=entry, tz=tz))
    return kept[1]


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
    if isinstance(spec, CustomSpec):
        return spec.typical
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
_VOLTRO_KEYS = {
    "tz",
    "anchor",
    "max_lateness",
    "catch_up",
    "on_overlap",
    "overlap_timeout",
    "trigger",
    "group",
}
#: What only beat's own firing does: refused on an external entry rather than ignored.
_BEAT_ONLY = ("catch_up", "on_overlap", "overlap_timeout")


def parse_entries(
    beat_schedule: Mapping[str, Mapping[str, Any]],
    *,
    tz: str | None,
    max_lateness: timedelta,
) -> tuple[Entry, ...]:
    """Validate Celery's ``beat_schedule`` into entries, raising on the first error.

    Celery's keys (``task``, ``schedule``, ``args``, ``kwargs``, ``options``, ``relative``)
    plus voltro's (``tz``, ``anchor``, ``max_lateness``, ``catch_up``, ``on_overlap``,
    ``overlap_timeout``, ``trigger``, ``group``); any other key is an error, so typos do not pass
    silently. ``tz`` is the app's timezone and ``max_lateness`` the default for entries that
    set none.

    Entries of one schedule object (or one cron string) in one zone share one spec: it is
    validated once, and a replica of 100,000 generated schedules holds a handful of specs.
    """
    specs: dict[tuple[object, str | None], tuple[object, Spec]] = {}
    return tuple(_entry(name, raw, tz, max_lateness, specs) for name, raw in beat_schedule.items())


def _entry(
    name: object,
    raw: object,
    app_tz: str | None,
    max_lateness: timedelta,
    specs: dict[tuple[object, str | None], tuple[object, Spec]],
) -> Entry:
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
    if not isinstance(raw.get("relative", False), bool):
        raise ConfigurationError(
            f"relative must be True or False, not {raw['relative']!r}", **_at(name, "relative")
        )
    # relative=True is accepted and has no effect: Celery ignores it on crontabs, and an
    # interval stays on its epoch (or anchor) grid, the same on every replica; where that
    # differs from Celery's rounding is in docs/schedules.md.
    args = raw.get("args") or ()
    if not isinstance(args, list | tuple):
        raise ConfigurationError(
            f"args must be a list or tuple, not {type(args).__name__}", **_at(name, "args")
        )
    entry_tz = app_tz if raw.get("tz") is None else raw["tz"]
    trigger = _choice(raw.get("trigger", "beat"), TRIGGERS, name, "trigger")
    if trigger == "external":
        for key in _BEAT_ONLY:
            if key in raw:
                raise ConfigurationError(
                    f"{key} applies to entries beat fires; this one has trigger='external'",
                    **_at(name, key),
                )
    anchor = raw.get("anchor")
    if anchor is None and isinstance(entry_tz, str | None):
        spec = _shared_spec(raw["schedule"], name, entry_tz, specs)
    else:
        spec = to_spec(raw["schedule"], entry=name, tz=entry_tz, anchor=anchor)
    return Entry(
        name=name,
        task=task,
        spec=spec,
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
        trigger=trigger,
        group=_group(raw.get("group", DEFAULT_GROUP), name),
    )


def _group(value: object, entry: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"a group name (non-empty string) is required, not {value!r}", **_at(entry, "group")
        )
    return value.strip()


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
    kind = _celery_kind(cls)
    if kind == "unknown":
        raise ConfigurationError(f"unknown schedule type {cls.__name__}", **_at(entry, "schedule"))
    if kind == "unsupported":
        raise ConfigurationError(
            f"unsupported Celery schedule type {cls.__name__}", **_at(entry, "schedule")
        )
    # Imported here only: a Celery object means Celery is loaded already, and the occurrence
    # maths must not import it.
    from celery import schedules

    if kind == "custom":
        return _custom_spec(value, schedules.BaseSchedule, entry)
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
    # schedule(relative=True) keeps the epoch grid, as the entry's relative key does.
    return IntervalSpec(_interval_us(cast(schedules.schedule, value).run_every, entry))


#: How a schedule class tells its own instants: the hook voltro_beat prefers, then Celery's.
_TIMING = ("next_after", "remaining_estimate", "is_due")

#: The instant the boot check walks a custom schedule from (pure code reads no clock).
_PROBE = datetime(2026, 1, 1, tzinfo=UTC)
_PROBE_STEPS = 3


#: Each schedule class met, and what it is (:func:`_celery_kind`).
_KINDS: dict[type, str] = {}


def _celery_kind(cls: type) -> str:
    """What a schedule class is to voltro_beat (found once per class: an app of 100,000
    schedules has a handful): ``unknown`` (not Celery's), ``unsupported``, ``custom`` (instants
    of its own), or Celery's ``crontab``, ``solar`` or ``schedule``."""
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _KINDS[cls] = _kind_of(cls)
    return kind


def _kind_of(cls: type) -> str:
    # The class itself first: the whole MRO only for subclasses defined elsewhere.
    if not cls.__module__.startswith("celery.") and not any(
        base.__module__.startswith("celery.") for base in cls.__mro__
    ):
        return "unknown"
    from celery import schedules

    if not issubclass(cls, schedules.BaseSchedule) or cls is schedules.BaseSchedule:
        return "unsupported"
    known = next(
        (
            base
            for base in (schedules.crontab, schedules.solar, schedules.schedule)
            if issubclass(cls, base)
        ),
        None,
    )
    if known is None or _own_timing(cls, known):
        return "custom"
    return str(known.__name__)


def _own_timing(cls: type, known: type) -> bool:
    """Whether a subclass of a Celery schedule computes its instants its own way."""
    return any(getattr(cls, name, None) is not getattr(known, name, None) for name in _TIMING)


def _custom_spec(value: Any, base: Any, entry: str) -> CustomSpec:
    """Walk a schedule class of the app's own, refused unless its instants are deterministic."""
    cls = type(value)
    if callable(getattr(value, "next_after", None)):
        step: Callable[[datetime], Any] = value.next_after
    elif getattr(cls, "remaining_estimate", None) is not base.remaining_estimate:
        step = functools.partial(_estimated_next, value)
    else:
        raise ConfigurationError(
            f"the schedule class {cls.__name__} implements neither next_after(after) nor "
            "remaining_estimate(last_run_at), so its instants cannot be computed",
            **_at(entry, "schedule"),
        )
    walk = functools.partial(_walk, step, entry, cls.__name__)
    try:
        first = step(_PROBE)
        walked = [walk(_PROBE)]
        while len(walked) < _PROBE_STEPS and walked[-1] is not None:
            walked.append(walk(walked[-1]))
        again = step(_PROBE)
        found = [instant for instant in walked if instant is not None]
        # Every replica walks from its own history: from anywhere between two instants the
        # walk must reach the same next one, or replicas started apart would disagree.
        midway = [
            (earlier + (later - earlier) / 2, later)
            for earlier, later in itertools.pairwise([_PROBE, *found])
        ]
        reached = [(between, later, walk(between)) for between, later in midway]
    except ConfigurationError:
        raise
    except Exception as exc:
        raise ConfigurationError(
            f"the schedule class {cls.__name__} failed when asked for its next instant: "
            f"{type(exc).__name__}: {exc}",
            **_at(entry, "schedule"),
        ) from None
    if again != first:
        # Asked twice about the same instant, it answered twice differently: its answer moves
        # with the wall clock, so two replicas would compute two different occurrences.
        raise ConfigurationError(
            f"the schedule class {cls.__name__} is not deterministic: asked twice for the "
            f"instant after {_PROBE.isoformat()} it answered {first!r}, then {again!r} "
            "(it reads the wall clock rather than its argument); give it a "
            "next_after(after) method that depends on `after` only",
            **_at(entry, "schedule"),
        )
    for between, later, got in reached:
        if got != later:
            raise ConfigurationError(
                f"the schedule class {cls.__name__} gives instants that depend on where the "
                f"walk starts: its next instant is {later.isoformat()}, but walked from "
                f"{between.isoformat()} it gives {got!r} (such as last_run_at + an interval); "
                "replicas started at different times would disagree. Use an interval with an "
                "anchor, or give it a next_after(after) method",
                **_at(entry, "schedule"),
            )
    typical = found[1] - found[0] if len(found) > 1 else None
    return CustomSpec(repr(value), walk, typical)


def _estimated_next(schedule: Any, after: datetime) -> datetime:
    """``after`` plus the schedule's ``remaining_estimate(after)``, with its clock at ``after``.

    Celery's schedules read "now" through ``self.now()`` (``nowfun``): a copy whose clock
    stands at ``after`` answers what the schedule would say at that instant.
    """
    pinned = copy.copy(schedule)
    pinned.nowfun = lambda: after
    remaining = pinned.remaining_estimate(after)
    if not isinstance(remaining, timedelta):
        raise TypeError(f"remaining_estimate returned {remaining!r}, not a timedelta")
    return after + remaining


def _walk(
    step: Callable[[datetime], Any], entry: str, cls: str, after: datetime
) -> datetime | None:
    """``step(after)`` checked: aware, strictly later, raised to the whole millisecond."""
    found = step(after)
    if found is None:
        return None
    if not isinstance(found, datetime) or found.utcoffset() is None:
        raise ConfigurationError(
            f"the schedule class {cls} gave {found!r}, not an aware datetime or None",
            **_at(entry, "schedule"),
        )
    us = (found - cron.EPOCH) // cron.MICROSECOND
    us += -us % 1000  # up, not down: the instant must stay after `after`
    instant = cron.EPOCH + timedelta(microseconds=us)
    if instant <= after:
        raise ConfigurationError(
            f"the schedule class {cls} gave {found.isoformat()}, not after "
            f"{after.isoformat()}: its next instant must be strictly later",
            **_at(entry, "schedule"),
        )
    return instant.astimezone(UTC)


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
