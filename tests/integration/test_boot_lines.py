"""What beat says at boot about the app's schedule: the banner counts the app's own entries
(Celery's ``celery.backend_cleanup`` named apart), and a bad app time zone is the app's."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from celery import Celery

from voltro_beat.exceptions import ConfigurationError
from voltro_beat.scheduler import VoltroScheduler

SCHEDULE = {
    "a": {"task": "proj.a", "schedule": 5.0},
    "b": {"task": "proj.b", "schedule": "0 * * * *"},
}


def app_with_result_backend(tmp_path: Path, **conf: object) -> Celery:
    """An app whose result backend cannot expire results itself: Celery's beat adds its
    ``celery.backend_cleanup`` entry (daily at 04:00) for it."""
    app = Celery(
        "proj",
        broker="memory://",
        backend=f"db+sqlite:///{tmp_path / 'results.db'}",
        set_as_current=False,
    )
    app.conf.update(
        beat_schedule=SCHEDULE,
        voltro_beat_store_url=f"sqlite:///{tmp_path / 'store.sqlite3'}",
        **conf,
    )
    return app


def test_the_banner_counts_the_apps_schedules_and_names_celerys_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = app_with_result_backend(tmp_path)
    with caplog.at_level(logging.INFO, logger="voltro_beat.scheduler"):
        scheduler = VoltroScheduler(app)
    try:
        assert "celery.backend_cleanup" in scheduler._schedule.entries  # scheduled all the same
        assert scheduler.info.endswith(", 2 schedules (and Celery's celery.backend_cleanup)")
        (line,) = [r.getMessage() for r in caplog.records if "coordination" in r.getMessage()]
        assert line.endswith(", 2 schedules (and Celery's celery.backend_cleanup)")
    finally:
        scheduler.close()


def test_without_celerys_entries_the_banner_counts_the_apps(tmp_path: Path) -> None:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(
        beat_schedule=SCHEDULE,
        voltro_beat_store_url=f"sqlite:///{tmp_path / 'store.sqlite3'}",
        result_expires=None,  # nothing to clean up: Celery adds no entry
    )
    scheduler = VoltroScheduler(app, lazy=True)
    assert scheduler.info.endswith(", 2 schedules")


def test_a_typo_in_the_apps_time_zone_is_the_apps_setting_not_backend_cleanup(
    tmp_path: Path,
) -> None:
    app = app_with_result_backend(tmp_path, timezone="Europe/Pariss")
    with pytest.raises(ConfigurationError) as info:
        VoltroScheduler(app)
    assert (info.value.entry, info.value.field) == (None, "timezone")
    assert str(info.value).startswith("setting 'timezone': unknown time zone 'Europe/Pariss'")
    assert "backend_cleanup" not in str(info.value)
