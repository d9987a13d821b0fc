"""Run as a script: make a django-celery-beat database with 60 periodic tasks (interval,
crontab, solar, clocked) and print, as JSON, the instants django-celery-beat's own schedule
objects give for each: from its reference instant, three times the next one after the last
(each run on time). A process of its own: Django is configured once per process.

    python tests/integration/dcb_tasks.py /tmp/dcb.sqlite3
"""

from __future__ import annotations

import copy
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import django
from django.conf import settings

settings.configure(
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]}},
    INSTALLED_APPS=["django_celery_beat"],
    USE_TZ=True,
    TIME_ZONE="UTC",
    DEFAULT_AUTO_FIELD="django.db.models.AutoField",
)
django.setup()

from django.core.management import call_command  # noqa: E402
from django_celery_beat import models  # noqa: E402

#: Around Europe's and America's changes to summer time (2026-03-08, 2026-03-29).
REFERENCE = datetime(2026, 3, 7, 22, 30, 15, tzinfo=UTC)
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Sydney"]
CRONTABS = [
    ("*/15", "*", "*", "*", "*"),
    ("0", "9-17", "mon-fri", "*", "*"),
    ("30", "2", "*", "*", "*"),
    ("0", "0", "*", "1", "*"),
    ("5", "*/3", "sat,sun", "*", "*"),
    ("0", "12", "*", "1-7", "*"),
    ("45", "23", "*", "*", "1,4,7,10"),
    ("0", "*/2", "*", "*", "*"),
    ("10", "1", "sun", "*", "*"),
    ("0,30", "6-8", "*", "15", "*"),
]
INTERVALS = [
    (30, "seconds"), (90, "seconds"), (5, "minutes"), (1, "hours"), (3, "hours"),
    (1, "days"), (2, "days"), (45, "minutes"), (10, "seconds"), (7, "days"),
    (15, "minutes"), (12, "hours"), (1, "minutes"), (4, "hours"), (20, "seconds"),
]  # fmt: skip
SOLAR = [
    ("sunrise", 52.37, 4.9), ("sunset", 52.37, 4.9), ("solar_noon", 40.71, -74.0),
    ("dawn_civil", -33.87, 151.21), ("dusk_nautical", 35.68, 139.69),
    ("sunset", 64.15, -21.94), ("dawn_astronomical", 48.85, 2.35),
    ("dusk_civil", -22.9, -43.2), ("sunrise", 1.29, 103.85), ("dawn_nautical", 55.75, 37.62),
]  # fmt: skip


def pinned(schedule: Any, at: datetime) -> Any:
    """The schedule with its clock standing at ``at`` (Celery's schedules read ``nowfun``)."""
    copied = copy.copy(schedule)
    copied.nowfun = lambda: at
    return copied


def next_three(schedule: Any, reference: datetime) -> list[str]:
    """django-celery-beat's next instants: after each run, its ``remaining_estimate`` from it
    (as its scheduler asks with ``last_run_at`` set to the run)."""
    found: list[str] = []
    last = reference
    for _ in range(3):
        at = last + pinned(schedule, last).remaining_estimate(last)
        at = at.astimezone(UTC)
        found.append(at.isoformat())
        last = at
    return found


def main() -> None:
    call_command("migrate", "django_celery_beat", verbosity=0)
    expected: dict[str, dict[str, Any]] = {}
    for i, (every, period) in enumerate(INTERVALS):
        interval = models.IntervalSchedule.objects.create(every=every, period=period)
        last = REFERENCE - timedelta(seconds=37 * i + 11)
        models.PeriodicTask.objects.create(
            name=f"interval-{i:02}", task="proj.work", interval=interval, last_run_at=last,
            args=json.dumps([i]), kwargs=json.dumps({"n": i}), queue="periodic",
        )  # fmt: skip
        expected[f"interval-{i:02}"] = {"after": last.isoformat(), "next": []}
    for n, (minute, hour, dow, dom, moy) in enumerate(CRONTABS * 2):
        crontab = models.CrontabSchedule.objects.create(
            minute=minute, hour=hour, day_of_week=dow, day_of_month=dom,
            month_of_year=moy, timezone=ZONES[n % len(ZONES)],
        )  # fmt: skip
        models.PeriodicTask.objects.create(
            name=f"crontab-{n:02}", task="proj.work", crontab=crontab
        )
        expected[f"crontab-{n:02}"] = {"after": REFERENCE.isoformat(), "next": []}
    for i, (event, lat, lon) in enumerate(SOLAR):
        solar = models.SolarSchedule.objects.create(event=event, latitude=lat, longitude=lon)
        models.PeriodicTask.objects.create(name=f"solar-{i:02}", task="proj.work", solar=solar)
        expected[f"solar-{i:02}"] = {"after": REFERENCE.isoformat(), "next": []}
    for i in range(15):
        at = REFERENCE + timedelta(hours=5 * i, minutes=7 * i, seconds=i + 1)
        clocked = models.ClockedSchedule.objects.create(clocked_time=at)
        models.PeriodicTask.objects.create(
            name=f"clocked-{i:02}", task="proj.work", clocked=clocked, one_off=True
        )
        expected[f"clocked-{i:02}"] = {"after": REFERENCE.isoformat(), "next": [at.isoformat()]}
    for task in models.PeriodicTask.objects.exclude(clocked__isnull=False):
        after = datetime.fromisoformat(expected[task.name]["after"])
        expected[task.name]["next"] = next_three(task.schedule, after)
    json.dump(expected, sys.stdout)


if __name__ == "__main__":
    main()
