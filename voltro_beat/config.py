"""Settings: what voltro_beat reads from a flag, the environment and the Celery config, parsed
once into a frozen dataclass.

Each setting is described once, in :data:`SETTINGS`: its ``Settings`` field, its
``voltro_beat_*`` key in the app's config, its environment variable, its default and its
parser. :meth:`Settings.resolve` takes, for each, the first of: an explicit value (a command's
flag), the environment variable, the app's setting, the default; and remembers which
(:class:`Source`). Bad values raise :class:`ConfigurationError` naming the setting.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from voltro_beat.clock import ClockMode
from voltro_beat.coordination import ALIASES, Coordination
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.schedules import DEFAULT_GROUP

#: The embedded default: a SQLite file next to where beat runs.
DEFAULT_STORE_URL = "sqlite:///voltro-beat.sqlite3"
#: Shards per group in ``cluster`` coordination: enough that three to ten replicas share them
#: within a few percent of evenly, few enough that each heartbeat renews them in one statement.
DEFAULT_SHARDS = 64
MAX_SHARDS = 4096


class Origin(StrEnum):
    """Where a setting's value came from, in the order :meth:`Settings.resolve` looks."""

    FLAG = "flag"
    ENVIRONMENT = "environment"
    APP = "app setting"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class Source:
    """Where one setting's value came from: ``origin``, and the variable or key it names."""

    origin: Origin
    #: The environment variable or the app's key (None for a flag or the default).
    name: str | None = None

    def __str__(self) -> str:
        return f"{self.origin} {self.name}" if self.name else str(self.origin)


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything voltro_beat reads from a command's flags, the environment and the Celery
    config (see :meth:`resolve`)."""

    store_url: str
    coordination: Coordination
    max_lateness: timedelta
    replica: str
    claims_ttl: timedelta
    runs_ttl: timedelta
    migrate: bool
    #: A ``claimed`` run row untouched this long is taken over and republished.
    publish_timeout: timedelta
    #: Skip the task body of a second delivery of an occurrence (worker side): one that
    #: already succeeded, or whose earlier execution is still live.
    duplicate_guard: bool
    #: The app's ``timezone`` (None: UTC), the default for every entry.
    timezone: str | None
    #: Whose clock decides "now": None for the store's default (``database`` on
    #: PostgreSQL; SQLite is one host, so its clock is the local one).
    clock: ClockMode | None
    #: A replica whose local clock is further than this from the database's says so.
    max_clock_offset: timedelta
    #: Serve Prometheus metrics on this port (None: off; needs the ``metrics`` extra).
    metrics_port: int | None = None
    #: Beat's log lines as JSON objects, one per line.
    log_json: bool = False
    #: A file beat touches after each heartbeat it wrote to the store (liveness probes).
    health_file: str | None = None
    #: How long a worker's start claim holds a run row without a renewal (worker side): a
    #: second delivery of a started occurrence runs once the first's lease has lapsed.
    worker_lease: timedelta = timedelta(seconds=30)
    #: The replica's group: it fires only the schedules of this group.
    group: str = DEFAULT_GROUP
    #: Shards per group in ``cluster`` coordination (the same on every replica of a group).
    shards: int = DEFAULT_SHARDS
    #: A schedule named both in the app's ``beat_schedule`` and in the schedules table:
    #: ``error`` (refused at boot and by an edit), or which of ``code`` and ``table`` wins.
    schedule_conflicts: str = "error"
    #: Where each value came from, by field name (empty when built by hand).
    sources: Mapping[str, Source] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def resolve(
        cls,
        conf: Mapping[str, Any],
        *,
        overrides: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Settings:
        """The settings, each from the first of: ``overrides`` (explicit values by field
        name, a command's flags), its environment variable (``environ``, default
        ``os.environ``), the app's ``voltro_beat_*`` key in ``conf``, its default.

        A field present in ``overrides`` is explicit, whatever the environment and the app
        say; None there turns off a setting that is off by default (``metrics_port``,
        ``health_file``, ``clock``). ``timezone`` is the app's as Celery resolves it. Raises
        :class:`ConfigurationError` naming the setting (and the variable or flag, when the
        value came from one).
        """
        given = dict(overrides or {})
        unknown = sorted(set(given) - {s.field for s in SETTINGS})
        if unknown:
            raise ValueError(f"no setting named {', '.join(unknown)}")
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        sources: dict[str, Source] = {}
        for setting in SETTINGS:
            values[setting.field], sources[setting.field] = setting.resolve(given, env, conf)
        values["timezone"], sources["timezone"] = _timezone(conf)
        settings = cls(**values, sources=sources)
        _check(settings, conf)
        return settings

    def described(self) -> list[tuple[str, Any, Source]]:
        """Every setting as ``(key, value, source)``: its ``voltro_beat_*`` key (``timezone``
        for the app's zone), its value, and where the value came from."""
        default = Source(Origin.DEFAULT)
        rows = [
            (s.key, getattr(self, s.field), self.sources.get(s.field, default)) for s in SETTINGS
        ]
        return [*rows, ("timezone", self.timezone, self.sources.get("timezone", default))]


@dataclass(frozen=True, slots=True)
class Setting:
    """One row of :data:`SETTINGS`: a ``Settings`` field, its key in the app's config, its
    environment variable, its default (a function is called: a default computed per process)
    and the parser of a given value (``parse(key, value)``, raising ConfigurationError)."""

    field: str
    key: str
    env: str
    default: Any
    parse: Callable[[str, Any], Any]

    def resolve(
        self, overrides: Mapping[str, Any], environ: Mapping[str, str], conf: Mapping[str, Any]
    ) -> tuple[Any, Source]:
        """The value and its source, from the first of the four that gives one."""
        if self.field in overrides:
            value, source = overrides[self.field], Source(Origin.FLAG)
            if value is None and self.default is None:
                return None, source  # explicitly off
        elif environ.get(self.env) is not None:
            value, source = environ[self.env], Source(Origin.ENVIRONMENT, self.env)
        elif conf.get(self.key) is not None:
            value, source = conf.get(self.key), Source(Origin.APP, self.key)
        else:
            default = self.default() if callable(self.default) else self.default
            return default, Source(Origin.DEFAULT)
        try:
            return self.parse(self.key, value), source
        except ConfigurationError as exc:
            if source.origin is Origin.APP:
                raise
            # The app's config may hold a good value that this one outranks: say which won.
            raise ConfigurationError(f"{exc.message} (from {source})", field=self.key) from None


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"expected a non-empty string, got {value!r}", field=key)
    return value.strip()


def _coordination(key: str, value: Any) -> Coordination:
    try:
        return ALIASES.get(str(value)) or Coordination(value)
    except ValueError:
        raise ConfigurationError(
            f"unknown coordination {value!r}; expected one of 'advisory_lock', 'cluster', 'single'",
            field=key,
        ) from None


def _shards(key: str, value: Any) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit():
        raise ConfigurationError(f"expected a whole number of shards, got {value!r}", field=key)
    count = int(text)
    if not 1 <= count <= MAX_SHARDS:
        raise ConfigurationError(f"expected 1 to {MAX_SHARDS} shards, got {value!r}", field=key)
    return count


#: The values of ``voltro_beat_schedule_conflicts``.
CONFLICT_RULES = ("error", "code", "table")


def _conflicts(key: str, value: Any) -> str:
    if value not in CONFLICT_RULES:
        raise ConfigurationError(
            f"expected one of {', '.join(map(repr, CONFLICT_RULES))}, got {value!r}", field=key
        )
    return str(value)


def _clock(key: str, value: Any) -> ClockMode:
    try:
        return ClockMode(str(value).strip().lower())
    except ValueError:
        raise ConfigurationError(
            f"unknown clock {value!r}; expected 'database' or 'local'", field=key
        ) from None


def _duration(key: str, value: Any) -> timedelta:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    else:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"expected seconds or a timedelta, got {value!r}", field=key
            ) from None
    if seconds <= 0:
        raise ConfigurationError(f"must be positive, got {value!r}", field=key)
    return timedelta(seconds=seconds)


def _hours(key: str, value: Any) -> timedelta:
    try:
        hours = float(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"expected a number of hours, got {value!r}", field=key) from None
    if hours <= 0:
        raise ConfigurationError(f"must be positive, got {value!r}", field=key)
    return timedelta(hours=hours)


def _port(key: str, value: Any) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"expected a port number, got {value!r}", field=key) from None
    if not 0 < port < 65536:
        raise ConfigurationError(f"expected a port number (1-65535), got {value!r}", field=key)
    return port


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"expected true or false, got {value!r}", field=key)


def _timezone(conf: Mapping[str, Any]) -> tuple[str | None, Source]:
    """The app's zone as ``Celery.timezone`` resolves it, by name (``None``: UTC), and where
    it came from. It is Celery's setting: no flag or variable of voltro_beat's sets it.

    Celery's ``conf.timezone`` accessor falls back to Django's ``TIME_ZONE``; with neither set
    Celery uses UTC, or the host's local zone when ``enable_utc`` is off.
    """
    # A plain mapping (tests, tools) has no accessor: its own key is all there is.
    value = getattr(conf, "timezone", None) or conf.get("timezone")
    if not value:
        if conf.get("enable_utc", True):
            return None, Source(Origin.DEFAULT)
        # Celery's LocalTimezone has no name; tzlocal (a Celery dependency) reads the host's.
        import tzlocal

        return str(tzlocal.get_localzone_name()), Source(Origin.DEFAULT)
    name = str(getattr(value, "key", value))
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # Checked here, once: every entry without a zone of its own would otherwise be
        # blamed for it, the first one (often Celery's celery.backend_cleanup) at boot.
        raise ConfigurationError(
            f"unknown time zone {name!r} (the app's timezone, the zone of every entry "
            "without a tz of its own)",
            field="timezone",
        ) from None
    return name, Source(Origin.APP, "timezone")


def _check(settings: Settings, conf: Mapping[str, Any]) -> None:
    """The checks across settings, whichever source each came from."""
    connect = float(conf.get("broker_connection_timeout") or 4.0)
    if settings.publish_timeout.total_seconds() <= 2 * connect:
        # A publish attempt can take two connection timeouts; a shorter lease would let
        # another replica republish a run whose first attempt is still under way.
        raise ConfigurationError(
            f"must be longer than twice broker_connection_timeout ({connect:g} s), "
            f"got {settings.publish_timeout.total_seconds():g} s",
            field="voltro_beat_publish_timeout",
        )
    if settings.runs_ttl <= settings.max_lateness:
        # The run row is the long fence (guarantee 6): it must outlive every occurrence
        # that could still be published.
        raise ConfigurationError(
            f"the runs retention ({settings.runs_ttl}) must be longer than "
            f"voltro_beat_max_lateness ({settings.max_lateness})",
            field="voltro_beat_runs_ttl_hours",
        )


def _this_process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


#: Every setting but the app's ``timezone``, once. The retention variables are the
#: specification's names.
# fmt: off
SETTINGS: tuple[Setting, ...] = (
    #       field               key in the app's config         environment variable
    #       default                     parser
    Setting("store_url",        "voltro_beat_store_url",        "VOLTRO_BEAT_STORE_URL",
            DEFAULT_STORE_URL,          _text),
    Setting("coordination",     "voltro_beat_coordination",     "VOLTRO_BEAT_COORDINATION",
            Coordination.ADVISORY_LOCK, _coordination),
    Setting("max_lateness",     "voltro_beat_max_lateness",     "VOLTRO_BEAT_MAX_LATENESS",
            timedelta(days=1),          _duration),
    Setting("replica",          "voltro_beat_replica",          "VOLTRO_BEAT_REPLICA",
            _this_process,              _text),
    Setting("claims_ttl",       "voltro_beat_claims_ttl_hours", "VOLTRO_SCHEDULE_CLAIMS_TTL_HOURS",
            timedelta(hours=24),        _hours),
    Setting("runs_ttl",         "voltro_beat_runs_ttl_hours",   "VOLTRO_SCHEDULE_RUNS_TTL_HOURS",
            timedelta(days=30),         _hours),
    Setting("migrate",          "voltro_beat_migrate",          "VOLTRO_BEAT_MIGRATE",
            True,                       _flag),
    Setting("publish_timeout",  "voltro_beat_publish_timeout",  "VOLTRO_BEAT_PUBLISH_TIMEOUT",
            timedelta(seconds=10),      _duration),
    Setting("duplicate_guard",  "voltro_beat_duplicate_guard",  "VOLTRO_BEAT_DUPLICATE_GUARD",
            True,                       _flag),
    Setting("clock",            "voltro_beat_clock",            "VOLTRO_BEAT_CLOCK",
            None,                       _clock),
    Setting("max_clock_offset", "voltro_beat_max_clock_offset", "VOLTRO_BEAT_MAX_CLOCK_OFFSET",
            timedelta(seconds=1),       _duration),
    Setting("metrics_port",     "voltro_beat_metrics_port",     "VOLTRO_BEAT_METRICS_PORT",
            None,                       _port),
    Setting("log_json",         "voltro_beat_log_json",         "VOLTRO_BEAT_LOG_JSON",
            False,                      _flag),
    Setting("health_file",      "voltro_beat_health_file",      "VOLTRO_BEAT_HEALTH_FILE",
            None,                       _text),
    Setting("worker_lease",     "voltro_beat_worker_lease",     "VOLTRO_BEAT_WORKER_LEASE",
            timedelta(seconds=30),      _duration),
    Setting("group",            "voltro_beat_group",            "VOLTRO_BEAT_GROUP",
            DEFAULT_GROUP,              _text),
    Setting("shards",           "voltro_beat_shards",           "VOLTRO_BEAT_SHARDS",
            DEFAULT_SHARDS,             _shards),
    Setting("schedule_conflicts", "voltro_beat_schedule_conflicts",
            "VOLTRO_BEAT_SCHEDULE_CONFLICTS", "error", _conflicts),
)
# fmt: on
