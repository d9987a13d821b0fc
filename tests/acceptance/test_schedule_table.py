"""Schedules in the database with three real ``celery beat -S voltro`` replicas on PostgreSQL,
Redis and a real worker: edits made with ``voltro-beat schedules`` (and 100 more through the
Python API) are applied by every replica, each from the first occurrence of its new
definition after its commit, and every occurrence runs once.

Prints the time from each commit to the moment every live replica's registry row shows the
revision applied (both on the database's clock): p50, p99 and the worst of 105 edits.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from datetime import timedelta

import sqlalchemy as sa
from test_cli import VOLTRO_BEAT, ok
from vbt_harness import (
    REPLICAS,
    TASK,
    Deployment,
    Deployments,
    Sched,
    check,
    problems_exactly_once,
    problems_no_duplicates,
    problems_revisions,
    read_changes,
    read_revisions,
    read_runs,
    sleep_until,
    table_keys,
    wait_until,
)

from voltro_beat.config import Settings
from voltro_beat.schedule_table import ScheduleTable
from voltro_beat.store.database import Database
from voltro_beat.store.schedule_rows import ScheduleRow
from voltro_beat.store.tables import replicas

#: The app's own entry, out of the way of the table's.
HOURLY = Sched("hourly", '"0 * * * *"')
#: Edits made through the Python API to measure propagation (of a schedule that never fires
#: during the test: hourly at a minute that stays ahead).
EDITS = 100


def cli(dep: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [VOLTRO_BEAT, "schedules", *args, "-A", dep.app],
        capture_output=True,
        text=True,
        timeout=120,
        env=dep.env(USER="acceptance"),
        cwd=dep.workdir,
    )


def applied_after(dep: Deployment, row: ScheduleRow) -> float:
    """Seconds from ``row``'s commit until every live replica's registry row shows its
    revision (polled every 10 ms, on the database's clock)."""
    engine = sa.create_engine(dep.store_url, poolclass=sa.NullPool)
    query = sa.select(sa.func.clock_timestamp(), sa.func.min(replicas.c.schedules_revision))
    found: list[float] = []

    def applied() -> bool:
        with engine.connect() as conn:
            clock, revision = conn.execute(query).one()
        if revision is not None and revision >= row.revision:
            found.append((clock - row.changed_at).total_seconds())
        return bool(found)

    try:
        assert wait_until(applied, timeout=30, interval=0.01), f"revision {row.revision}"
    finally:
        engine.dispose()
    return found[0]


def test_edits_apply_on_every_replica_from_their_commit(deployment: Deployments) -> None:
    dep = deployment()
    dep.configure([HOURLY])
    dep.start_worker()
    dep.start_beats(*REPLICAS)
    dep.wait_ready()
    database = Database.open(dep.store_url)
    table = ScheduleTable(database, Settings.resolve({}, environ={}))
    lags: list[float] = []

    def row() -> ScheduleRow:
        return table.rows.get(["live"])["live"]

    # Each edit through the command; each applied by all three replicas, then left to fire.
    ok(cli(dep, "add", "live", "--task", TASK, "--schedule", "* * * * * *"))
    lags.append(applied_after(dep, row()))
    time.sleep(4)
    ok(cli(dep, "set", "live", "--revision", "1", "--task", TASK, "--schedule", "*/2 * * * * *"))
    lags.append(applied_after(dep, row()))
    time.sleep(4)
    ok(cli(dep, "disable", "live", "--revision", "2"))
    lags.append(applied_after(dep, row()))
    time.sleep(5)
    ok(cli(dep, "enable", "live", "--revision", "3"))
    lags.append(applied_after(dep, row()))
    time.sleep(4)

    # Refused: a stale revision, a bad expression; neither is stored.
    stale = cli(dep, "set", "live", "--revision", "2", "--task", TASK, "--schedule", "* * * * *")
    assert stale.returncode == 1 and "at revision 4, not 2" in stale.stderr, stale.stderr
    bad = cli(dep, "set", "live", "--revision", "4", "--task", TASK, "--schedule", "* 25 * * *")
    assert bad.returncode == 1 and "schedule 'live', field 'schedule'" in bad.stderr, bad.stderr

    ok(cli(dep, "rm", "live", "--revision", "4"))
    removed_at = table.history("live")[-1].changed_at
    engine_lag_start = time.monotonic()
    # 100 edits of a schedule that stays ahead of the clock: the propagation, measured.
    paced = table.add("paced", {"task": TASK, "schedule": "59 23 31 12 *"})
    for i in range(EDITS):
        minute = (i % 50) + 5
        paced = table.set(
            "paced",
            {"task": TASK, "schedule": f"{minute} 23 31 12 *"},
            revision=paced.revision,
            by="acceptance",
        )
        lags.append(applied_after(dep, paced))
    print(f"100 edits measured in {time.monotonic() - engine_lag_start:.1f}s")
    sleep_until(removed_at + timedelta(seconds=2))
    dep.stop_beats()

    changes = read_changes(dep.store_url)["live"]
    runs = {k: r for k, r in read_runs(dep.store_url).items() if r.schedule == "live"}
    # Owed: each definition's instants from one second after its commit to the next change
    # (none while disabled, none after the removal).
    keys = table_keys("live", changes, removed_at)
    dep.drain(keys)
    executions = dep.executions()
    check(problems_exactly_once(keys, runs, executions), "each instant after an edit ran once")
    check(problems_no_duplicates(executions), "no occurrence executed twice")
    # Every run: fired by the definition live at its instant (or when it was claimed ahead),
    # at an instant of that definition.
    check(
        problems_revisions("live", changes, runs, read_revisions(dep.store_url)),
        "each run of the definition live at its instant",
    )

    history = ok(cli(dep, "history", "live"))
    actions = [line.split()[3] for line in history.splitlines() if line.startswith("  r")]
    assert actions == ["add", "set", "disable", "enable", "remove"], history

    lags.sort()
    p50, p99 = statistics.median(lags), lags[int(len(lags) * 0.99) - 1]
    print(
        f"commit to applied by 3 of 3 replicas over {len(lags)} edits: p50 {p50:.3f}s, "
        f"p99 {p99:.3f}s, max {lags[-1]:.3f}s"
    )
    database.dispose()
