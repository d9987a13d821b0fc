"""Settings: ``voltro_beat_*`` keys of the Celery config, parsed once into a frozen dataclass.

Each setting is read from the app's config first, then from its environment variable, then
falls back to its default. Bad values raise :class:`ConfigurationError` naming the setting.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from voltro_beat.clock import ClockMode
from voltro_beat.coordination import ALIASES, Coordination
from voltro_beat.exceptions import ConfigurationError

T = TypeVar("T")

#: The embedded default: a SQLite file next to where beat runs.
DEFAULT_STORE_URL = "sqlite:///voltro-beat.sqlite3"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything voltro_beat reads from the Celery config and the environment."""

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

    @classmethod
    def from_config(
        cls, conf: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> Settings:
        env = os.environ if environ is None else environ

        def get(key: str, env_key: str | None, default: T, parse: Callable[[str, Any], T]) -> T:
            value = conf.get(key)
            if value is None and env_key is not None:
                value = env.get(env_key)
            if value is None:
                return default
            return parse(key, value)

        settings = cls(
            store_url=get(
                "voltro_beat_store_url", "VOLTRO_BEAT_STORE_URL", DEFAULT_STORE_URL, _text
            ),
            coordination=get(
                "voltro_beat_coordination",
                "VOLTRO_BEAT_COORDINATION",
                Coordination.ADVISORY_LOCK,
                _coordination,
            ),
            max_lateness=get(
                "voltro_beat_max_lateness",
                "VOLTRO_BEAT_MAX_LATENESS",
                timedelta(days=1),
                _duration,
            ),
            replica=get(
                "voltro_beat_replica",
                "VOLTRO_BEAT_REPLICA",
                f"{socket.gethostname()}:{os.getpid()}",
                _text,
            ),
            claims_ttl=get(
                "voltro_beat_claims_ttl_hours",
                "VOLTRO_SCHEDULE_CLAIMS_TTL_HOURS",
                timedelta(hours=24),
                _hours,
            ),
            runs_ttl=get(
                "voltro_beat_runs_ttl_hours",
                "VOLTRO_SCHEDULE_RUNS_TTL_HOURS",
                timedelta(days=30),
                _hours,
            ),
            migrate=get("voltro_beat_migrate", "VOLTRO_BEAT_MIGRATE", True, _flag),
            publish_timeout=get(
                "voltro_beat_publish_timeout",
                "VOLTRO_BEAT_PUBLISH_TIMEOUT",
                timedelta(seconds=10),
                _duration,
            ),
            duplicate_guard=get(
                "voltro_beat_duplicate_guard", "VOLTRO_BEAT_DUPLICATE_GUARD", True, _flag
            ),
            timezone=_timezone(conf),
            clock=get("voltro_beat_clock", "VOLTRO_BEAT_CLOCK", None, _clock),
            max_clock_offset=get(
                "voltro_beat_max_clock_offset",
                "VOLTRO_BEAT_MAX_CLOCK_OFFSET",
                timedelta(seconds=1),
                _duration,
            ),
            metrics_port=get("voltro_beat_metrics_port", "VOLTRO_BEAT_METRICS_PORT", None, _port),
            log_json=get("voltro_beat_log_json", "VOLTRO_BEAT_LOG_JSON", False, _flag),
            health_file=get("voltro_beat_health_file", "VOLTRO_BEAT_HEALTH_FILE", None, _text),
            worker_lease=get(
                "voltro_beat_worker_lease",
                "VOLTRO_BEAT_WORKER_LEASE",
                timedelta(seconds=30),
                _duration,
            ),
        )
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
        return settings


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"expected a non-empty string, got {value!r}", field=key)
    return value.strip()


def _coordination(key: str, value: Any) -> Coordination:
    if value == "cluster":
        raise ConfigurationError(
            "coordination 'cluster' is not available yet; use 'advisory_lock' or 'single'",
            field=key,
        )
    try:
        return ALIASES.get(str(value)) or Coordination(value)
    except ValueError:
        raise ConfigurationError(
            f"unknown coordination {value!r}; expected one of 'advisory_lock', 'single'",
            field=key,
        ) from None


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


def _timezone(conf: Mapping[str, Any]) -> str | None:
    """The app's zone as ``Celery.timezone`` resolves it, by name (``None``: UTC).

    Celery's ``conf.timezone`` accessor falls back to Django's ``TIME_ZONE``; with neither set
    Celery uses UTC, or the host's local zone when ``enable_utc`` is off.
    """
    # A plain mapping (tests, tools) has no accessor: its own key is all there is.
    value = getattr(conf, "timezone", None) or conf.get("timezone")
    if not value:
        if conf.get("enable_utc", True):
            return None
        # Celery's LocalTimezone has no name; tzlocal (a Celery dependency) reads the host's.
        import tzlocal

        return str(tzlocal.get_localzone_name())
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
    return name
