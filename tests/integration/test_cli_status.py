"""``voltro-beat status`` over a PostgreSQL store (click's runner): the success rate is over the
runs that executed, and the outcomes show by kind, missed by reason, skipped by policy."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from voltro_beat.cli import main
from voltro_beat.coordination import Outcome
from voltro_beat.store.database import Database
from voltro_beat.store.tables import runs

#: (schedule, status, reason, how many): a healthy `skip` schedule after a downtime, and one
#: whose task fails once in four.
ROWS = [
    ("healthy", "succeeded", None, 6),
    ("healthy", "skipped", "overlap", 5),
    ("healthy", "missed", "catch_up", 4),
    ("healthy", "missed", "late", 1),
    ("flaky", "succeeded", None, 3),
    ("flaky", "failed", None, 1),
    ("flaky", "retrying", "Retry in 1s: boom", 1),
]


@pytest.fixture
def store(pg_url: str) -> Iterator[str]:
    database = Database.open(pg_url)
    database.upgrade()
    now = database.time()
    values = []
    for schedule, status, reason, count in ROWS:
        for n in range(count):
            at = now - timedelta(minutes=len(values) + 1)
            values.append(
                {
                    "id": f"{schedule}@{at:%Y-%m-%dT%H:%M:%S}",
                    "schedule": schedule,
                    "task": "t",
                    "task_id": f"{schedule}-{status}-{n}",
                    "scheduled_at": at,
                    "coordination_outcome": Outcome.WON_LOCK.value,
                    "status": status,
                    "reason": reason,
                    "published_at": None if status in ("missed", "skipped") else at,
                }
            )
    with database.engine.begin() as conn:
        conn.execute(sa.insert(runs), values)
    database.dispose()
    yield pg_url


def cells(output: str) -> dict[str, list[str]]:
    """The status table's rows, by schedule."""
    found = {}
    for line in output.splitlines():
        line = line.replace("┃", "│")  # the heading's rule is heavier
        if line.count("│") > 3:
            row = [c.strip() for c in line.split("│")[1:-1]]
            found[row[0]] = row
    return found


def test_status_rates_executed_runs_and_counts_outcomes_by_kind(store: str) -> None:
    out = CliRunner().invoke(main, ["status", "--store", store])
    assert out.exit_code == 0, out.output
    table = cells(out.output)
    head = table["schedule"]
    assert head == [
        "schedule",
        "next",
        "last run",
        "status",
        "success",
        "runs",
        "median lag s",
        "outcomes",
    ], head
    healthy, flaky = (dict(zip(head, table[name], strict=True)) for name in ("healthy", "flaky"))
    # Skipped by the overlap policy and missed by catch-up are not failures.
    assert (healthy["success"], healthy["runs"]) == ("100.0%", "16")
    assert healthy["outcomes"] == (
        "6 succeeded, 4 missed (catch_up), 1 missed (late), 5 skipped (overlap)"
    )
    assert (flaky["success"], flaky["runs"]) == ("75.0%", "5")
    assert flaky["outcomes"] == "3 succeeded, 1 failed, 1 unfinished"
