"""The health file (``voltro_beat_health_file``) that deploy/ recipes probe: touched with each
heartbeat the store took, left alone while the store is unreachable."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from beat_kit import sec, tick


def test_the_health_file_is_touched_by_each_heartbeat_and_not_while_the_store_is_down(
    replicas: Any, store_url: str, tmp_path: Path
) -> None:
    health = tmp_path / "health"
    scheduler = replicas("r1", voltro_beat_health_file=str(health))
    tick(scheduler, sec(0))  # boot: joins the registry; the first heartbeat comes later
    assert not health.exists()
    tick(scheduler, sec(2))
    assert health.exists()

    os.utime(health, (0, 0))
    tick(scheduler, sec(4))
    assert health.stat().st_mtime > 0

    os.utime(health, (0, 0))
    database = Path(store_url.removeprefix("sqlite:///"))
    scheduler._store.database.dispose()
    database.rename(database.with_suffix(".away"))
    database.mkdir()  # SQLite cannot open a directory: every statement fails
    scheduler._store.database.clock = lambda: sec(6)
    scheduler.tick()  # fails closed, never raises
    assert health.stat().st_mtime == 0
