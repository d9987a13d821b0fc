"""Fixtures of the admin tests: a store filled by real beat replicas and a worker, a copy of
it on SQLite, headless Chromium.

One beat/worker scenario for the whole session (``seeded``): two ``celery beat -S voltro``
replicas and a prefork worker of ``tests/acceptance/vbt_admin_proj.py`` on PostgreSQL + Redis
(db 13) run four schedules for a few seconds, stop for a few, run again: succeeded, failed,
retried and missed rows, and claims. Two rows are added as a stalled deployment would leave
them: one claimed and unpublished past its lease (late), one started two hours ago and not
finished (stuck).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

# admin_sites puts tests/acceptance (vbt_harness) on the path.
from admin_sites import ROOT, DjangoSite
from vbt_harness import (
    POSTGRES_ADMIN_URL,
    REDIS_URL,
    Deployments,
    ProcessSet,
    Sched,
    fresh_database,
    require_binary,
    sqlalchemy_url,
    wait_until,
)

from voltro_beat.contrib.django.apps import ROUTER
from voltro_beat.replicas import Replica
from voltro_beat.status import UNFINISHED
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.database import Database
from voltro_beat.store.registry import Registry
from voltro_beat.store.tables import claims, replicas, runs, shards, singletons

#: The schedules of the scenario: one per outcome the admin shows.
SCHEDULES = (
    Sched("ok-1s", '"* * * * * *"', task="vbt_admin.ok"),
    Sched("boom-2s", "timedelta(seconds=2)", task="vbt_admin.boom"),
    Sched("flaky-3s", "timedelta(seconds=3)", task="vbt_admin.flaky"),
    # Its older occurrences fall past max_lateness while beat is down: missed, or no row.
    Sched("lateness-3s", '"* * * * * *"', extra={"max_lateness": "3"}, task="vbt_admin.ok"),
)
APP = "vbt_admin_proj:app"
#: The registry rows the replicas pages show (the scenario's replicas stopped, and a replica
#: that stops deletes its row): one live for the whole session, one gone a day ago.
LIVE = Replica(
    "beat-live",
    "host-a",
    101,
    "0.2.0",
    None,
    None,
    0.0042,
    {"clock": "database", "coordination": "advisory_lock", "publish_timeout": 86400.0},
    "d1g35t-l1v3",
)
GONE = Replica(
    "beat-gone",
    "host-b",
    202,
    "0.1.0",
    None,
    None,
    -2.5,
    {"clock": "local", "coordination": "advisory_lock", "publish_timeout": 10.0},
    "d1g35t-g0n3",
)
BROKER = REDIS_URL.rsplit("/", 1)[0] + "/13"


@dataclass(frozen=True)
class Seeded:
    """The store the scenario filled, and how to reach the app it ran."""

    store_url: str
    #: What the admin's processes need to load the app (for the next occurrences).
    env: dict[str, str]
    rows: list[dict[str, object]]
    #: The keys of the late row and of the stuck one.
    late: str
    stuck: str

    def row(self, key: str) -> dict[str, object]:
        return next(r for r in self.rows if r["id"] == key)

    def newest(self, **where: object) -> list[str]:
        """Keys of the rows matching ``where``, newest first (the admin's order)."""
        chosen = [r for r in self.rows if all(r[k] == v for k, v in where.items())]
        chosen.sort(key=lambda r: (r["scheduled_at"], r["id"]), reverse=True)
        return [str(r["id"]) for r in chosen]


def _settled(store_url: str) -> bool:
    with sa.create_engine(store_url, poolclass=sa.NullPool).connect() as conn:
        live = conn.execute(
            sa.select(sa.func.count()).where(runs.c.status.in_([s.value for s in UNFINISHED]))
        )
        return live.scalar_one() == 0


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="vbt-admin-"))
    yield path
    if os.environ.get("VBT_KEEP") == "1":
        print(f"kept {path}")
    else:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def seeded(workdir: Path, require_service: Callable[[str, str], str]) -> Iterator[Seeded]:
    require_service("PostgreSQL", POSTGRES_ADMIN_URL)
    require_service("Redis", BROKER)
    procs = ProcessSet()
    with fresh_database("vbt_admin") as exec_db:
        made = Deployments(workdir / "scenario", procs, exec_db)
        made.workdir.mkdir()
        try:
            dep = made(store=sqlalchemy_url(exec_db), broker=BROKER, app="vbt_admin_proj")
            # A short lease (the publish timeout, above twice the connection timeout): an
            # occurrence less than a lease old at boot is on time whatever the catch-up policy,
            # so the 4 s downtime leaves missed rows only past the lease.
            dep.configure(
                SCHEDULES,
                voltro_beat_coordination="advisory_lock",
                broker_connection_timeout=1,
                voltro_beat_publish_timeout=2.5,
            )
            dep.start_worker()
            dep.start_beats("r1", "r2")
            dep.wait_ready()
            # Run, stop every replica past the late schedule's max_lateness, run again.
            time.sleep(6)
            dep.stop_beats()
            time.sleep(4)
            dep.start_beats("r1", "r2")
            dep.wait_ready()
            time.sleep(4)
            dep.stop_beats()
            wait_until(lambda: _settled(dep.store_url), timeout=30)
        except BaseException:
            print(procs.tails())
            raise
        finally:
            made.close()
        register_replicas(dep.store_url)
        hold_shards(dep.store_url)
        late, stuck = stall_runs(dep.store_url)
        engine = sa.create_engine(dep.store_url, poolclass=sa.NullPool)
        with engine.connect() as conn:
            rows = [dict(r._mapping) for r in conn.execute(sa.select(runs))]
        yield Seeded(
            dep.store_url,
            env={"VBT_CONFIG_FILE": str(dep.config_file), "VBT_EXEC_DSN": exec_db},
            rows=rows,
            late=late,
            stuck=stuck,
        )


def stall_runs(store_url: str) -> tuple[str, str]:
    """Add a run claimed and unpublished past its lease (a replica that stopped between claim
    and publish, no other one running) and a run started two hours ago and not finished (a
    hung task); returns their keys. The database's clock, as beat and workers write."""
    database = Database.open(store_url)
    try:
        now = database.time().replace(microsecond=0)
        late_at, stuck_at = now - timedelta(minutes=3), now - timedelta(hours=2)
        late, stuck = f"boom-2s@{late_at:%Y-%m-%dT%H:%M:%S}", f"ok-1s@{stuck_at:%Y-%m-%dT%H:%M:%S}"
        common = {"coordination_outcome": "won_lock", "replica": "r1", "retries": 0}
        with database.engine.begin() as conn:
            for row in (
                {
                    **common,
                    "id": late,
                    "schedule": "boom-2s",
                    "task": "vbt_admin.boom",
                    "task_id": "late-task-id",
                    "scheduled_at": late_at,
                    "status": "claimed",
                    "claimed_at": late_at,
                    "lease_until": now - timedelta(minutes=2),
                },
                {
                    **common,
                    "id": stuck,
                    "schedule": "ok-1s",
                    "task": "vbt_admin.ok",
                    "task_id": "stuck-task-id",
                    "scheduled_at": stuck_at,
                    "status": "started",
                    "worker": "celery@hung-host",
                    "claimed_at": stuck_at,
                    "published_at": stuck_at,
                    "started_at": stuck_at,
                },
            ):
                conn.execute(runs.insert(), row)
    finally:
        database.dispose()
    return late, stuck


def register_replicas(store_url: str) -> None:
    """Register :data:`LIVE` and :data:`GONE` the way a replica registers (its heartbeat is
    ``last_seen``, on the database's clock); GONE's last heartbeat a day ago."""
    database = Database.open(store_url)
    try:
        registry = Registry(database)
        registry.register(LIVE, {"ok-1s": "0f0f0f0f0f0f0f0f", "boom-2s": "1e1e1e1e1e1e1e1e"})
        registry.register(GONE, {"ok-1s": "2d2d2d2d2d2d2d2d"})
        with database.engine.begin() as conn:
            conn.execute(
                replicas.update()
                .where(replicas.c.name == GONE.name)
                .values(last_seen=database.time() - timedelta(days=1))
            )
    finally:
        database.dispose()


def hold_shards(store_url: str) -> None:
    """Cluster coordination's rows, as the store writes them: :data:`LIVE` holds shards 0 and
    1 of group ``default`` (1 at epoch 2: it moved once), shard 2's owner let its lease run
    out; singleton ``inbox`` runs on LIVE, ``reconcile`` failed on GONE."""
    live, gone = (BeatStore(Database.open(store_url), replica=r.name) for r in (LIVE, GONE))
    try:
        hour, moment = timedelta(hours=1), timedelta(milliseconds=1)
        gone.exchange_shards("default", keep={}, release=(), acquire=[1, 2], lease=moment)
        time.sleep(0.01)
        live.exchange_shards("default", keep={}, release=(), acquire=[0, 1], lease=hour)
        live.record_singleton("default", "inbox", token=1, state="running")
        error = "Traceback (most recent call last):\nRuntimeError: ledger unreachable"
        gone.record_singleton("default", "reconcile", token=2, state="failed", error=error)
    finally:
        live.close()
        gone.close()


def failed_run(seeded: Seeded) -> dict[str, object]:
    """The newest failed run (the Django sites have a task result stored for it)."""
    return seeded.row(seeded.newest(status="failed")[0])


@contextlib.contextmanager
def fired_by_revision(store_url: str, key: str, revision: int) -> Iterator[None]:
    """Run ``key`` of the store at ``store_url`` as if revision ``revision`` of the schedules
    table had fired it."""
    engine = sa.create_engine(store_url, poolclass=sa.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(runs.update().where(runs.c.id == key).values(revision=revision))
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(runs.update().where(runs.c.id == key).values(revision=None))
        engine.dispose()


def django_site(seeded: Seeded, root: Path, procs: ProcessSet, kind: str) -> DjangoSite:
    """A Django project over the seeded store: its tables in the project's PostgreSQL
    ``default`` database (``kind="postgresql"``, UTC), or copied to a SQLite file under a second
    alias with the router (``kind="sqlite"``, Europe/Berlin)."""
    root.mkdir()
    settings: dict[str, object] = {"VOLTRO_BEAT_CELERY_APP": APP}
    if kind == "postgresql":
        url = sa.make_url(seeded.store_url)
        databases = {
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": url.database,
                "USER": url.username,
                "HOST": url.host,
                "PORT": url.port,
            }
        }
    else:
        store = copy_to_sqlite(seeded.store_url, root / "store.sqlite3")
        databases = {
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(root / "dj.sqlite3")},
            "voltro": {"ENGINE": "django.db.backends.sqlite3", "NAME": store},
        }
        settings.update(
            VOLTRO_BEAT_DATABASE="voltro",
            DATABASE_ROUTERS=[ROUTER],
            TIME_ZONE="Europe/Berlin",
            # Under the stuck run's two hours, and not the default.
            VOLTRO_BEAT_ADMIN_STUCK_AFTER=6960,
        )
    site = DjangoSite.create(
        root / "project", procs, databases=databases, settings=settings, env=seeded.env
    )
    site.store_url = seeded.store_url if kind == "postgresql" else f"sqlite:///{store}"
    site.shell(
        "from django_celery_results.models import TaskResult\n"
        f"TaskResult.objects.get_or_create(task_id={failed_run(seeded)['task_id']!r},"
        " defaults=dict(status='FAILURE', task_name='vbt_admin.boom'))"
    )
    return site


def copy_to_sqlite(store_url: str, path: Path) -> str:
    """A SQLite store (made by voltro_beat's migrations) holding the rows of ``store_url``;
    returns the file's path."""
    target = Database.open(f"sqlite:///{path}")
    target.upgrade()
    source = sa.create_engine(store_url, poolclass=sa.NullPool)
    with source.connect() as read, target.engine.begin() as write:
        for table in (runs, claims, replicas, shards, singletons):
            rows = [dict(r._mapping) for r in read.execute(sa.select(table))]
            if rows:
                write.execute(table.insert(), rows)
    target.dispose()
    return str(path)


@pytest.fixture(scope="session")
def screenshots(workdir: Path) -> Path:
    """Where the browser tests save their screenshots: ``VBT_SCREENSHOTS`` if set (the docs
    refresh theirs with ``VBT_SCREENSHOTS=docs/images``), else a temporary directory."""
    chosen = os.environ.get("VBT_SCREENSHOTS")
    path = Path(chosen) if chosen else workdir / "screenshots"
    if not path.is_absolute():
        path = ROOT / path
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def browser(workdir: Path) -> Iterator[object]:
    """Headless Chromium from Debian's packages, driven by Selenium through chromedriver."""
    require_binary("chromium", "chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    profile = tempfile.mkdtemp(prefix="chromium-", dir=workdir)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1600,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    try:
        yield driver
    finally:
        driver.quit()
