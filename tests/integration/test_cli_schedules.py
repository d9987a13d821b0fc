"""``voltro-beat schedules`` on both dialects: edits by revision, refusals that say why, the
table listed, shown with its changes and the replicas that applied it, exported and imported."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from voltro_beat.cli import main
from voltro_beat.store.database import Database


@pytest.fixture
def cli(url: str) -> Iterator[CliRunner]:
    database = Database.open(url)
    database.upgrade()
    database.dispose()
    yield CliRunner()


def run(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["schedules", *args, "--store", url], env={"USER": "ana"})


def test_add_change_disable_and_show(cli: CliRunner, url: str) -> None:
    added = run(
        url,
        "add",
        "report",
        "--task",
        "proj.report",
        "--schedule",
        "*/5 * * * *",
        "--field",
        'kwargs={"team": "ops"}',
        "--by",
        "ana",
    )
    assert added.exit_code == 0, added.output
    assert added.output == "report: added at revision 1\n"
    changed = run(
        url,
        "set",
        "report",
        "--revision",
        "1",
        "--task",
        "proj.report",
        "--every",
        "60",
        "--by",
        "bo",
    )
    assert changed.output == "report: changed, now at revision 2\n"
    stale = run(url, "set", "report", "--revision", "1", "--task", "proj.report", "--every", "30")
    assert stale.exit_code == 1
    assert "at revision 2, not 1" in stale.output and "by bo" in stale.output
    assert run(url, "disable", "report", "--revision", "2").exit_code == 0
    listed = run(url, "ls")
    assert listed.exit_code == 0, listed.output
    assert "report" in listed.output and "every" in listed.output
    shown = run(url, "show", "report")
    assert shown.exit_code == 0, shown.output
    assert "revision 3  disabled" in shown.output
    assert "applied by 0 of 0 live replicas" in shown.output
    assert [line.split()[0] for line in shown.output.splitlines() if line.startswith("  r")] == [
        "r1",
        "r2",
        "r3",
    ]


def test_a_bad_definition_names_the_field_and_stores_nothing(cli: CliRunner, url: str) -> None:
    out = run(url, "add", "bad", "--task", "t", "--schedule", "61 * * * *")
    assert out.exit_code == 1
    assert "schedule 'bad', field 'schedule'" in out.output
    assert "out of range" in out.output
    assert run(url, "history", "bad").exit_code == 1
    assert "not JSON" in run(url, "add", "x", "--task", "t", "--field", "kwargs={").output


def test_export_gives_back_what_was_added(cli: CliRunner, url: str) -> None:
    run(url, "add", "a", "--task", "t.a", "--schedule", "0 * * * *")
    run(
        url,
        "add",
        "b",
        "--definition",
        '{"task": "t.b", "schedule": {"crontab": {"minute": "*/15"}}, "catch_up": "all"}',
    )
    exported = json.loads(run(url, "export").output)
    assert exported == {
        "a": {"task": "t.a", "schedule": "0 * * * *"},
        "b": {"task": "t.b", "schedule": {"crontab": {"minute": "*/15"}}, "catch_up": "all"},
    }
    python = run(url, "export", "--python").output
    namespace: dict[str, object] = {}
    exec(python, namespace)  # the Python export is a beat_schedule Celery's beat takes
    assert set(namespace["beat_schedule"]) == {"a", "b"}  # type: ignore[arg-type]


def test_import_copies_the_apps_beat_schedule(
    cli: CliRunner, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"import_app_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        "from datetime import timedelta\n"
        "from celery import Celery\n"
        "from celery.schedules import crontab, solar\n"
        f"app = Celery({name!r})\n"
        "app.conf.beat_schedule = {\n"
        "  'cron': {'task': 't', 'schedule': crontab(minute='*/10', hour='9-17')},\n"
        "  'every': {'task': 't', 'schedule': timedelta(seconds=90), 'args': (1, 2)},\n"
        "  'sun': {'task': 't', 'schedule': solar('sunset', 52.37, 4.9)},\n"
        "}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        out = CliRunner().invoke(main, ["schedules", "import", "-A", name, "--store", url])
        assert out.exit_code == 0, out.output
        assert out.output.endswith("3 schedules added\n")
        exported = json.loads(run(url, "export").output)
    finally:
        sys.modules.pop(name, None)
    assert exported["cron"]["schedule"] == {
        "crontab": {
            "minute": "*/10",
            "hour": "9-17",
            "day_of_month": "*",
            "month_of_year": "*",
            "day_of_week": "*",
        }
    }
    assert exported["every"] == {"task": "t", "schedule": {"every": 90.0}, "args": [1, 2]}
    assert exported["sun"]["schedule"] == {"solar": "sunset", "lat": 52.37, "lon": 4.9}
