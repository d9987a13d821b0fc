"""``voltro-beat schedules import --django-celery-beat URL``: 60 periodic tasks of a real
django-celery-beat database (made by its own models, in a process of its own) give schedules
whose next instants are the ones django-celery-beat's schedule objects give."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from click.testing import CliRunner

from voltro_beat.cli import main
from voltro_beat.config import Settings
from voltro_beat.occurrences import next_after
from voltro_beat.schedule_table import ScheduleTable
from voltro_beat.store.database import Database

MAKER = Path(__file__).with_name("dcb_tasks.py")
#: Where voltro_beat differs on purpose (docs/schedules.md): a fixed-time job in the hour
#: skipped by daylight saving time runs at the end of the gap (Debian cron's rule), where
#: Celery, and so django-celery-beat, runs it an hour after its time. Here "30 2 * * *" in
#: New York on 2026-03-08: 03:00 EDT here, 03:30 EDT there.
SPRING_FORWARD = {"2026-03-08T07:30:00+00:00": "2026-03-08T07:00:00+00:00"}


def voltro_beats(instant: str, kind: str) -> str:
    """django-celery-beat's ``instant`` as voltro_beat documents it: solar events to the whole
    second (docs/schedules.md), the skipped hour as above."""
    if kind == "solar":
        return instant[:19] + instant[-6:]
    return SPRING_FORWARD.get(instant, instant)


def test_imported_tasks_fire_when_django_celery_beat_would(tmp_path: Path) -> None:
    dcb = tmp_path / "dcb.sqlite3"
    made = subprocess.run(
        [sys.executable, str(MAKER), str(dcb)], capture_output=True, text=True, check=True
    )
    expected = json.loads(made.stdout)
    assert len(expected) == 60
    store = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    database = Database.open(store)
    database.upgrade()
    out = CliRunner().invoke(
        main, ["schedules", "import", "--django-celery-beat", f"sqlite:///{dcb}", "--store", store]
    )
    assert out.exit_code == 0, out.output
    assert out.output.endswith("60 schedules added\n"), out.output
    table = ScheduleTable(database, Settings.resolve({}, environ={}))
    rows = {r.name: r for r in table.rows.all()}
    assert set(rows) == set(expected)
    wrong = []
    for name, want in sorted(expected.items()):
        want["next"] = [voltro_beats(at, name.split("-")[0]) for at in want["next"]]
        entry = table.entry(name, rows[name].definition)
        got: list[str] = []
        at: datetime | None = datetime.fromisoformat(want["after"])
        for _ in want["next"]:
            at = next_after(entry.spec, at) if at is not None else None
            got.append("none" if at is None else at.isoformat())
        if got != want["next"]:
            wrong.append(f"{name} {rows[name].definition['schedule']}: {got} != {want['next']}")
    assert wrong == [], "\n".join(wrong)
    interval = rows["interval-03"].definition
    assert (interval["args"], interval["kwargs"], interval["options"]) == (
        [3],
        {"n": 3},
        {"queue": "periodic"},
    )
    database.dispose()
