"""What both admins show the same way (voltro_beat.contrib.display / .overview), and the
``voltro-beat admin`` command without its extra."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from voltro_beat.cli import main
from voltro_beat.contrib import display, overview
from voltro_beat.status import Status

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def test_every_status_has_a_colour() -> None:
    assert set(display.COLOURS) == set(Status)
    assert display.colour("no-such-status") == display.colour(Status.SKIPPED)


def test_a_capped_count_compares_as_counted_and_reads_as_the_cap() -> None:
    assert display.capped(12) == 12 and str(display.capped(12)) == "12"
    over = display.capped(display.COUNT_CAP + 1)
    assert over > display.COUNT_CAP and str(over) == "10,000+"
    assert f"of {over} items" == "of 10,000+ items"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0.0123, "12 ms"),
        (-0.002, "-2 ms"),
        (4.5, "4.50 s"),
        (125, "2 min 5 s"),
        (7322, "2 h 2 min"),
    ],
)
def test_seconds_text(seconds: float | None, text: str) -> None:
    assert display.seconds_text(seconds) == text


def test_instant_text_keeps_milliseconds() -> None:
    assert display.instant_text(T0 + timedelta(microseconds=45_678)) == "2026-12-03 09:00:00.045"
    assert display.instant_text(None) == "-"


def recent(*statuses: str) -> list[overview.Recent]:
    """Runs a second apart, newest first, each published ``n`` ms late."""
    return [
        overview.Recent(
            f"s@{n}",
            status,
            "catch_up" if status == "missed" else None,
            T0 - timedelta(seconds=n),
            None if status == "missed" else T0 - timedelta(seconds=n) + timedelta(milliseconds=n),
        )
        for n, status in enumerate(statuses)
    ]


def test_a_line_of_the_overview() -> None:
    line = overview.line("s", recent("started", "succeeded", "failed", "missed", "succeeded"))
    assert [sq.key for sq in line.squares] == ["s@4", "s@3", "s@2", "s@1", "s@0"]  # oldest first
    assert line.squares[-1].colour == display.COLOURS[Status.STARTED]
    # Executed: succeeded, failed, succeeded; neither the missed nor the running one counts.
    assert line.tally.success_rate == 2 / 3 and line.tally.success_text == "67%"
    assert line.tally.outcomes_text == "2 succeeded, 1 failed, 1 missed (catch_up), 1 unfinished"
    assert line.last_run is not None and line.last_run.key == "s@0"
    assert line.median_lag == pytest.approx(0.0015) and line.median_lag_text == "2 ms"


def test_an_empty_line() -> None:
    line = overview.line("s", [])
    assert (line.tally.success_text, line.median_lag_text, line.last_run) == ("-", "-", None)


def test_upcoming_reads_the_apps_schedule_as_beat_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "overview_app.py").write_text(
        "from celery import Celery\n"
        "app = Celery('overview_app')\n"
        "app.conf.timezone = 'Europe/Berlin'\n"
        "app.conf.beat_schedule = {\n"
        "    'nine': {'task': 't', 'schedule': '0 9 * * *'},\n"
        "    'every-10s': {'task': 't', 'schedule': 10.0},\n"
        "}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    found = overview.upcoming("overview_app:app", now=T0)
    assert found.problem is None
    # 09:00 in Berlin is 08:00 UTC: the app's timezone applies, as in beat.
    assert found.by_schedule["nine"][0] == datetime(2026, 12, 4, 8, 0, tzinfo=UTC)
    assert found.by_schedule["every-10s"] == tuple(T0 + timedelta(seconds=s) for s in (10, 20, 30))
    assert overview.upcoming(None, now=T0).by_schedule == {}


def test_upcoming_reports_an_app_it_cannot_read() -> None:
    found = overview.upcoming("no_such_module_anywhere:app", now=T0)
    assert found.by_schedule == {} and found.problem and "no_such_module_anywhere" in found.problem


def test_the_admin_command_without_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "voltro_beat.contrib.sqladmin", None)
    result = CliRunner().invoke(main, ["admin", "--store", "sqlite:///x.sqlite3", "--no-auth"])
    assert result.exit_code != 0
    assert "pip install 'voltro-beat[sqladmin]'" in result.output


def test_overview_pages() -> None:
    names = [f"s{n:03d}" for n in range(overview.PAGE_SIZE * 2 + 1)]
    first = overview.page(names, None)
    assert (first.number, first.pages, first.total) == (1, 3, len(names))
    assert first.names == names[: overview.PAGE_SIZE]
    assert overview.page(names, "3").names == names[-1:]
    assert overview.page(names, "99").number == 3 and overview.page(names, "x").number == 1
    assert overview.page([], "2") == overview.Page([], 1, 1, 0)


def test_a_run_claimed_past_its_lease_is_late_one_running_too_long_stuck() -> None:
    def marker(status: str, **at: datetime | None) -> str | None:
        fields = {"published_at": None, "lease_until": None, "started_at": None, **at}
        return display.delay(status, now=T0, stuck_after=timedelta(hours=1), **fields)

    second = timedelta(seconds=1)
    assert marker("claimed", lease_until=T0 - second) == display.LATE
    assert marker("claimed", lease_until=T0 + second) is None
    # Published already (the status follows when the instant's writes are done): not late.
    assert marker("claimed", lease_until=T0 - second, published_at=T0 - 2 * second) is None
    for status in ("started", "retrying"):
        assert marker(status, started_at=T0 - timedelta(hours=1, seconds=1)) == display.STUCK
        assert marker(status, started_at=T0 - timedelta(minutes=59)) is None
    long_ago = T0 - timedelta(days=3)
    for status in ("published", "succeeded", "failed", "missed", "queued"):
        assert marker(status, lease_until=long_ago, started_at=long_ago) is None, status
