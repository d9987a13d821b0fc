"""deploy/postgresql/roles.sql on the real PostgreSQL: the migrator upgrades the schema, the
beat role reads and writes voltro_beat's rows and can do nothing else."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from voltro_beat.store.tables import claims, replicas, runs

pytestmark = pytest.mark.postgres

VOLTRO_BEAT = Path(sys.executable).parent / "voltro-beat"
TABLES = [runs.name, claims.name, replicas.name, "_voltro_beat_alembic_version"]


def voltro_beat(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VOLTRO_BEAT), *args], capture_output=True, text=True, timeout=60, check=False
    )


def execute(url: str, statement: str) -> None:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def test_the_beat_role_may_touch_rows_of_voltro_tables_only(
    postgres_url: str, least_privilege_roles: Callable[[str], Any]
) -> None:
    # Tables beat made at boot as the app's role, before the script: the migrator takes them.
    assert voltro_beat("db", "upgrade", "--store", postgres_url).returncode == 0
    execute(postgres_url, "CREATE TABLE host_orders (id int PRIMARY KEY)")
    roles = least_privilege_roles(postgres_url)
    beat_url, migrator_url = roles.url(roles.beat), roles.url(roles.migrator)

    upgrade = voltro_beat("db", "upgrade", "--store", migrator_url)
    assert upgrade.returncode == 0, upgrade.stderr

    engine = sa.create_engine(beat_url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        for table in TABLES[:3]:
            conn.exec_driver_sql(f"SELECT count(*) FROM {table}")
            conn.exec_driver_sql(f"DELETE FROM {table}")
        conn.exec_driver_sql(
            f"INSERT INTO {claims.name} (id, schedule, scheduled_at, claimed_at, replica)"
            " VALUES ('s@2026-01-01T00:00:00', 's', now(), now(), 'r1')"
        )
        conn.exec_driver_sql(f"UPDATE {claims.name} SET replica = 'r2'")
    engine.dispose()

    forbidden = [
        "CREATE TABLE sneaky (id int)",
        f"DROP TABLE {runs.name}",
        f"TRUNCATE {claims.name}",
        f"ALTER TABLE {runs.name} ADD COLUMN sneaky int",
        f"CREATE INDEX sneaky ON {runs.name} (task)",
        "SELECT * FROM host_orders",
        "INSERT INTO host_orders VALUES (1)",
    ]
    for statement in forbidden:
        with pytest.raises(sa.exc.ProgrammingError, match=r"permission denied|must be owner"):
            execute(beat_url, statement)
    with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
        execute(migrator_url, "SELECT * FROM host_orders")


def test_the_script_can_run_again_after_an_upgrade(
    postgres_url: str, least_privilege_roles: Callable[[str], Any]
) -> None:
    roles = least_privilege_roles(postgres_url)
    assert voltro_beat("db", "upgrade", "--store", roles.url(roles.migrator)).returncode == 0
    roles.apply()
    execute(roles.url(roles.beat), f"DELETE FROM {runs.name}")
