"""A Django project's ``TIME_ZONE`` moves crontabs exactly as it does under Celery's beat.

The project is real: a Django settings module set up by ``django.setup()`` and a Celery app
reading it with ``config_from_object("django.conf:settings", namespace="CELERY")``, as Celery's
Django guide writes it. It runs in a subprocess, since Django settings are per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SETTINGS = """
SECRET_KEY = "tz"
INSTALLED_APPS = []
USE_TZ = True
TIME_ZONE = "US/Pacific"
{extra}
"""

SCRIPT = """
import json
from datetime import UTC, datetime, timedelta

import django

django.setup()

from celery import Celery
from celery.schedules import crontab

from voltro_beat.config import Settings
from voltro_beat.occurrences import next_after
from voltro_beat.schedules import parse_entries

app = Celery("tzproj", set_as_current=False)
app.config_from_object("django.conf:settings", namespace="CELERY")
settings = Settings.resolve(app.conf, environ={})
schedule = {
    "nightly": {"task": "t", "schedule": crontab(hour=21, minute=0)},
    "nightly_text": {"task": "t", "schedule": "0 21 * * *"},
}
entries = parse_entries(schedule, tz=settings.timezone, max_lateness=timedelta(days=1))
after = datetime(2026, 7, 1, 12, tzinfo=UTC)
# Celery's own answer: its crontab, bound to the app, asked at `after` about a run at `after`.
reference = crontab(hour=21, minute=0, app=app, nowfun=lambda: after)
print(json.dumps({
    "timezone": settings.timezone,
    "celery": (after + reference.remaining_estimate(after)).astimezone(UTC).isoformat(),
    "ours": {e.name: next_after(e.spec, after).isoformat() for e in entries},
}))
"""


@pytest.mark.parametrize(
    ("extra", "zone", "instant"),
    [
        # TIME_ZONE alone: Celery's conf.timezone falls back to it. 21:00 PDT is 04:00 UTC.
        ("", "US/Pacific", "2026-07-02T04:00:00+00:00"),
        # CELERY_TIMEZONE wins over TIME_ZONE, as under Celery.
        ('CELERY_TIMEZONE = "Europe/Berlin"', "Europe/Berlin", "2026-07-01T19:00:00+00:00"),
        # enable_utc only decides when no zone is set at all.
        ("CELERY_ENABLE_UTC = False", "US/Pacific", "2026-07-02T04:00:00+00:00"),
    ],
)
def test_django_time_zone_resolves_as_celery(
    tmp_path: Path, extra: str, zone: str, instant: str
) -> None:
    (tmp_path / "tzproj_settings.py").write_text(textwrap.dedent(SETTINGS.format(extra=extra)))
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="tzproj_settings",
        PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]),
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["timezone"] == zone
    assert result["celery"] == instant
    assert result["ours"] == {"nightly": instant, "nightly_text": instant}
