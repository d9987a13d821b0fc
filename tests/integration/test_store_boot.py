"""A store URL that cannot work stops beat at boot with one line; a store that is down is
retried, and said so again at a steady interval.

Real ``celery beat -S voltro`` subprocesses against the real PostgreSQL: a database that does
not exist, a role that does not exist, a role without the grant to create the tables, a host
that does not resolve; and a port nothing listens on for the transient case. (The server
trusts local connections, so a wrong password cannot be refused here: its SQLSTATE, 28P01, is
in the same table, voltro_beat.store.database.PERMANENT.)
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from celery import Celery
from click.testing import CliRunner

from voltro_beat.cli import main
from voltro_beat.engine import upkeep
from voltro_beat.scheduler import EX_CONFIG, VoltroScheduler

pytestmark = pytest.mark.postgres

PROJ = """
import os
from celery import Celery
app = Celery("proj", broker="memory://")
app.conf.voltro_beat_store_url = os.environ["STORE"]
app.conf.result_expires = None
app.conf.beat_schedule = {"a": {"task": "proj.a", "schedule": 5.0}}
"""
#: A TCP port on 127.0.0.1 that nothing listens on (tcpmux, never served here).
NOTHING_LISTENS = 1


def beat(tmp_path: Path, store: str) -> subprocess.Popen[str]:
    (tmp_path / "proj.py").write_text(PROJ)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOLTRO_")}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "proj",
            "beat",
            "-S",
            "voltro",
            "-l",
            "info",
            "-s",
            str(tmp_path / "celerybeat"),
        ],
        cwd=tmp_path,
        env={**env, "STORE": store},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture
def role_without_grants(postgres_url: str) -> Iterator[str]:
    """The module's database as a role that may connect but not create tables (PostgreSQL
    15 and later grant no CREATE on the public schema)."""
    name = f"vt_nogrant_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {name} LOGIN")
        conn.exec_driver_sql("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    yield sa.make_url(postgres_url).set(username=name).render_as_string(hide_password=False)
    with engine.connect() as conn:
        conn.exec_driver_sql(f"DROP OWNED BY {name}")
        conn.exec_driver_sql(f"DROP ROLE {name}")
    engine.dispose()


@pytest.mark.parametrize(
    ("store", "failed", "check"),
    [
        (
            "postgresql+psycopg://root:s3cret@127.0.0.1:5432/vt_no_such_database",
            'database "vt_no_such_database" does not exist',
            "check the database name in the URL",
        ),
        (
            "postgresql+psycopg://vt_no_such_role:s3cret@127.0.0.1:5432/postgres",
            'role "vt_no_such_role" does not exist',
            "check the user name in the URL",
        ),
        (
            "postgresql+psycopg://root:s3cret@vt-no-such-host.invalid:5432/postgres",
            "failed to resolve host 'vt-no-such-host.invalid'",
            "check the host name in the URL",
        ),
    ],
)
def test_a_store_that_cannot_work_exits_at_boot_with_one_line(
    tmp_path: Path, store: str, failed: str, check: str
) -> None:
    proc = beat(tmp_path, store)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == EX_CONFIG, output
    errors = [line for line in output.splitlines() if "ERROR" in line or "CRITICAL" in line]
    assert len(errors) == 1, output
    (line,) = errors
    assert "voltro_beat: cannot use the store, exiting: store " in line
    assert sa.make_url(store).render_as_string(hide_password=True) in line
    assert failed in line and check in line
    assert "s3cret" not in output
    assert "Traceback" not in output


def test_a_role_without_the_grant_to_create_the_tables_exits_at_boot(
    tmp_path: Path, role_without_grants: str
) -> None:
    proc = beat(tmp_path, role_without_grants)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == EX_CONFIG, output
    assert "permission denied for schema public" in output
    assert "check the role's grants" in output


def test_a_store_that_is_down_is_retried_and_said_so(tmp_path: Path) -> None:
    proc = beat(tmp_path, f"postgresql+psycopg://root@127.0.0.1:{NOTHING_LISTENS}/postgres")
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "publishing nothing while the store is down" in line:
                break
        else:
            pytest.fail("beat exited without saying the store is down")
        assert "Connection refused" in line
        assert proc.poll() is None  # still running: retrying
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def down_scheduler(tmp_path: Path) -> VoltroScheduler:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(
        voltro_beat_store_url=f"postgresql+psycopg://root@127.0.0.1:{NOTHING_LISTENS}/postgres",
        result_expires=None,
        beat_schedule={"a": {"task": "proj.a", "schedule": 5.0}},
    )
    scheduler = VoltroScheduler(app)
    scheduler._metrics.enable()
    return scheduler


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "store" in r.getMessage()
    ]


def test_the_outage_is_warned_about_again_at_a_steady_interval_and_in_the_metrics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = down_scheduler(tmp_path)
    try:
        with caplog.at_level(logging.DEBUG, logger="voltro_beat.scheduler"):
            scheduler.tick()
            scheduler.tick()  # within STORE_DOWN_REPEAT of the first warning: DEBUG only
            assert len(warnings(caplog)) == 1
            assert "publishing nothing while the store is down" in warnings(caplog)[0]
            monkeypatch.setattr(upkeep, "STORE_DOWN_REPEAT", 0.0)
            scheduler.tick()
            scheduler.tick()
        again = warnings(caplog)[1:]
        assert len(again) == 2
        assert all("store still down since " in line for line in again)
        assert all("Connection refused" in line for line in again)
        registry = scheduler._metrics.registry
        assert registry.get_sample_value("voltro_beat_store_up") == 0
        assert registry.get_sample_value("voltro_beat_store_errors_total") == 4
    finally:
        scheduler.close()


@pytest.mark.parametrize(
    ("store", "says"),
    [
        (
            "postgresql+psycopg://root:s3cret@127.0.0.1:5432/vt_no_such_database",
            'database "vt_no_such_database" does not exist; check the database name in the URL',
        ),
        (f"postgresql+psycopg://root@127.0.0.1:{NOTHING_LISTENS}/postgres", "Connection refused"),
    ],
)
def test_voltro_beat_status_says_what_failed_and_what_to_check(store: str, says: str) -> None:
    result = CliRunner().invoke(main, ["status", "--store", store])
    assert result.exit_code == 1, result.output
    (line,) = result.output.splitlines()
    assert line.startswith("Error: store ") and says in line
    assert "s3cret" not in line
    if "Connection refused" in says:
        assert "check" not in line  # down: nothing to fix in the URL
