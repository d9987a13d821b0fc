"""The schedule beat runs: the app's ``beat_schedule`` and the entries Celery's own beat adds to
it, parsed once, the same for beat, the ``voltro-beat`` commands, the trigger, the admins and
the pytest plugin.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery import Celery, beat

from voltro_beat.config import Settings
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.schedules import Entry, parse_entries


@dataclass(frozen=True, slots=True)
class BeatSchedule:
    """The parsed entries by name, and which of them Celery's beat added."""

    entries: Mapping[str, Entry]
    #: Names of the entries Celery's beat adds that the app's ``beat_schedule`` does not
    #: define itself (``celery.backend_cleanup``).
    celery_entries: tuple[str, ...] = ()

    def counted(self) -> str:
        """``2 schedules (and Celery's celery.backend_cleanup)``: the app's own entries
        counted as its ``beat_schedule`` lists them, Celery's named apart."""
        own = len(self.entries) - len(self.celery_entries)
        added = ", ".join(self.celery_entries)
        return f"{own} schedules" + (f" (and Celery's {added})" if added else "")


def load_schedule(app: Celery, settings: Settings) -> BeatSchedule:
    """``app``'s ``beat_schedule`` plus the entries Celery's beat would add, parsed with
    ``settings`` (the app's zone, the default ``max_lateness``) as beat parses them.

    Raises ConfigurationError naming the entry, or ``result_backend`` when the result
    backend (which decides whether Celery adds its cleanup entry) cannot be loaded.
    """
    schedule = dict(app.conf.beat_schedule or {})
    added = _celery_entries(app, schedule)
    entries = parse_entries(
        {**added, **schedule}, tz=settings.timezone, max_lateness=settings.max_lateness
    )
    return BeatSchedule({e.name: e for e in entries}, tuple(sorted(added)))


class _Collector:
    """What Celery's ``Scheduler.install_default_entries`` uses of a scheduler: ``app``, and
    ``update_from_dict``, to which it hands the entries it adds."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.added: dict[str, Mapping[str, Any]] = {}

    def update_from_dict(self, entries: Mapping[str, Mapping[str, Any]]) -> None:
        self.added.update(entries)


def _celery_entries(
    app: Celery, schedule: Mapping[str, Mapping[str, Any]]
) -> dict[str, Mapping[str, Any]]:
    """The entries Celery's beat adds to ``schedule`` (today ``celery.backend_cleanup``, daily
    at 04:00, when ``result_expires`` is set and the result backend does not expire results
    itself), minus those the app defines itself."""
    # Celery's own method rather than a copy of its condition, so that we add whatever the
    # installed Celery adds. Called on a stand-in: a real Scheduler's update_from_dict turns
    # the entries into its own ScheduleEntry objects, and we parse the raw ones like the app's.
    collector = _Collector(app)
    try:
        beat.Scheduler.install_default_entries(collector, schedule)
    except Exception as exc:  # whatever loading the app's result backend raised
        raise ConfigurationError(
            f"cannot load the result backend (Celery's beat asks it whether to add "
            f"celery.backend_cleanup): {type(exc).__name__}: {exc}",
            field="result_backend",
        ) from exc
    return collector.added
