"""One schedule loader: the app's ``beat_schedule`` plus the entries Celery's own beat adds
(``celery.backend_cleanup`` for a result backend that does not expire results itself), for
beat and for ``voltro-beat status`` alike (a database result backend, a SQLite store, click's
runner)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from celery import Celery
from click.testing import CliRunner

from voltro_beat.beat_schedule import load_schedule
from voltro_beat.cli import main
from voltro_beat.config import Settings
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.occurrences import next_after
from voltro_beat.schedules import CronSpec

SCHEDULE = {"poll": {"task": "proj.poll", "schedule": 10.0}}


def app_with(tmp_path: Path, **conf: object) -> Celery:
    app = Celery(
        "proj",
        broker="memory://",
        backend=f"db+sqlite:///{tmp_path / 'results.db'}",
        set_as_current=False,
    )
    app.conf.update({"beat_schedule": SCHEDULE, "result_expires": 3600, **conf})
    return app


def test_a_database_result_backend_with_result_expires_gets_celerys_cleanup(
    tmp_path: Path,
) -> None:
    app = app_with(tmp_path, timezone="Europe/Paris")
    schedule = load_schedule(app, Settings.resolve(app.conf, environ={}))
    assert list(schedule.entries) == ["celery.backend_cleanup", "poll"]
    assert schedule.celery_entries == ("celery.backend_cleanup",)
    assert schedule.counted() == "1 schedules (and Celery's celery.backend_cleanup)"
    cleanup = schedule.entries["celery.backend_cleanup"]
    # Celery's entry as Celery's beat writes it: daily at 04:00 in the app's zone, its
    # messages expiring after 12 hours.
    assert cleanup.task == "celery.backend_cleanup"
    assert cleanup.options == {"expires": 12 * 3600}
    assert isinstance(cleanup.spec, CronSpec)
    after = datetime(2026, 7, 1, 12, tzinfo=UTC)
    assert next_after(cleanup.spec, after) == datetime(2026, 7, 2, 2, tzinfo=UTC)  # 04:00 CEST


def test_no_cleanup_without_result_expires_nor_over_the_apps_own(tmp_path: Path) -> None:
    app = app_with(tmp_path, result_expires=None)
    assert load_schedule(app, Settings.resolve(app.conf, environ={})).celery_entries == ()
    own = {"task": "celery.backend_cleanup", "schedule": "30 5 * * *"}
    app = app_with(tmp_path, beat_schedule={**SCHEDULE, "celery.backend_cleanup": own})
    schedule = load_schedule(app, Settings.resolve(app.conf, environ={}))
    # The app's entry stands, counted as the app's.
    assert schedule.celery_entries == ()
    assert schedule.counted() == "2 schedules"
    assert schedule.entries["celery.backend_cleanup"].options == {}


def test_a_result_backend_that_cannot_load_is_named(tmp_path: Path) -> None:
    app = Celery("proj", broker="memory://", backend="nosuch://", set_as_current=False)
    app.conf.update(beat_schedule=SCHEDULE)
    with pytest.raises(ConfigurationError) as info:
        load_schedule(app, Settings.resolve(app.conf, environ={}))
    assert info.value.field == "result_backend"
    assert "cannot load the result backend" in str(info.value)


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An importable app with a database result backend, ``result_expires`` and a SQLite
    store in ``tmp_path``."""
    name = f"cleanup_app_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        "from celery import Celery\n"
        f"app = Celery({name!r}, backend='db+sqlite:///{tmp_path / 'results.db'}')\n"
        "app.conf.result_expires = 3600\n"
        f"app.conf.voltro_beat_store_url = 'sqlite:///{tmp_path / 'store.db'}'\n"
        f"app.conf.beat_schedule = {SCHEDULE!r}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_status_knows_celerys_cleanup_as_beat_fires_it(app_module: str) -> None:
    env = {"VOLTRO_BEAT_STORE_URL": None, "VOLTRO_BEAT_CELERY_APP": None}
    upgraded = CliRunner().invoke(main, ["db", "upgrade", "-A", app_module], env=env)
    assert upgraded.exit_code == 0, upgraded.output
    out = CliRunner().invoke(main, ["status", "-A", app_module], env=env)
    assert out.exit_code == 0, out.output
    assert "schedules (2)" in out.output
    (line,) = [row for row in out.output.splitlines() if "celery.backend_cleanup" in row]
    # Its next occurrence: 04:00 UTC (the app's zone), today or tomorrow.
    assert " 04:00:00.000 " in line
