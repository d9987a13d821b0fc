"""What a store's dialect tells the rest of voltro_beat, without connecting: whose clock a
replica runs on, and the SQLite file a command must not create."""

from __future__ import annotations

from pathlib import Path

import pytest

from voltro_beat.clock import ClockMode
from voltro_beat.store.database import Database

PG = "postgresql://app@db.example:5432/app"


@pytest.mark.parametrize("setting", [None, ClockMode.DATABASE, ClockMode.LOCAL])
def test_sqlite_runs_on_the_local_clock_whatever_the_setting(
    tmp_path: Path, setting: ClockMode | None
) -> None:
    database = Database.open(f"sqlite:///{tmp_path / 'store.sqlite3'}")
    assert database.clock_mode(setting) is ClockMode.LOCAL


@pytest.mark.parametrize(
    ("setting", "mode"),
    [
        (None, ClockMode.DATABASE),
        (ClockMode.DATABASE, ClockMode.DATABASE),
        (ClockMode.LOCAL, ClockMode.LOCAL),
    ],
)
def test_postgresql_runs_on_its_clock_unless_the_setting_says_local(
    setting: ClockMode | None, mode: ClockMode
) -> None:
    assert Database.open(PG).clock_mode(setting) is mode


def test_the_file_of_a_store_is_sqlites_on_disk_only(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    assert Database.open(f"sqlite:///{path}").file == str(path)
    assert Database.open("sqlite:///:memory:").file is None
    assert Database.open("sqlite://").file is None
    assert Database.open(PG).file is None
