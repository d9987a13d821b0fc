"""The status vocabulary: named sets that agree with each other, and SQL derived from them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from voltro_beat import status as statuses
from voltro_beat.status import Status, sql_in
from voltro_beat.store import tables

MIGRATIONS = Path(statuses.__file__).parent / "store" / "migrations" / "versions"


def test_every_status_is_terminal_in_flight_or_queued() -> None:
    assert statuses.TERMINAL | statuses.IN_FLIGHT | {Status.QUEUED} == set(Status)
    assert not statuses.TERMINAL & statuses.UNFINISHED
    assert statuses.IN_FLIGHT == statuses.BEFORE_START | statuses.ON_WORKER
    assert statuses.UNPUBLISHED <= statuses.UNFINISHED
    assert statuses.KEPT_BY_RETENTION <= statuses.UNFINISHED


def test_sql_lists_statuses_in_declaration_order() -> None:
    assert sql_in({Status.QUEUED, Status.CLAIMED}) == "status IN ('claimed', 'queued')"
    assert sql_in([Status.FAILED], column="r.status") == "r.status IN ('failed')"


def test_the_index_predicates_keep_their_migrated_text() -> None:
    # Partial index predicates are compared as text: the derived ones must read as migrated.
    assert tables.LIVE == "status IN ('claimed', 'published', 'started', 'retrying', 'queued')"
    assert tables.LEASED == "status IN ('claimed')"


def test_the_newest_status_check_migration_lists_every_status() -> None:
    """A status added to the enum needs a migration of the table's check."""
    (path,) = MIGRATIONS.glob("0002_*.py")
    spec = importlib.util.spec_from_file_location("status_check", path)
    assert spec is not None and spec.loader is not None
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    assert sql_in(Status) == migration.STATUSES
    (check,) = [c for c in tables.runs.constraints if c.name == "ck_voltro_runs_status"]
    assert str(check.sqltext) == sql_in(Status)
