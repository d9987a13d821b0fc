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
import threading
import time
from datetime import datetime, timedelta

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
)

from voltro_beat.config import Settings
from voltro_beat.schedule_table import ScheduleTable
from voltro_beat.store.database import Database
from voltro_beat.store.schedule_rows import ScheduleRow
from voltro_beat.store.tables import replicas

#: The app's own entry, out of the way of the table's.
HOURLY = Sched("hourly", '"0 * * * *"')
#: Edits made through the Python API, one every 100 ms, to measure propagation (of a schedule
#: that never fires during the test: yearly).
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


class Applied:
    """Polls the registry every 10 ms: when (on the database's clock) every live replica's
    row first showed each revision of the schedules table."""

    def __init__(self, dep: Deployment) -> None:
        self._engine = sa.create_engine(dep.store_url, poolclass=sa.NullPool)
        self._seen: list[tuple[datetime, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> Applied:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._engine.dispose()

    def _poll(self) -> None:
        query = sa.select(sa.func.clock_timestamp(), sa.func.min(replicas.c.schedules_revision))
        while not self._stop.wait(0.01):
            with self._engine.connect() as conn:
                clock, revision = conn.execute(query).one()
            if revision is not None:
                self._seen.append((clock, revision))

    def after(self, row: ScheduleRow, timeout: float = 30) -> float:
        """Seconds from ``row``'s commit until every live replica had applied it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for clock, revision in list(self._seen):
                if revision >= row.revision:
                    return (clock - row.changed_at).total_seconds()
            time.sleep(0.05)
        raise AssertionError(f"revision {row.revision} not applied by every replica")


def test_edits_apply_on_every_replica_from_their_commit(deployment: Deployments) -> None:
    dep = deployment()
    dep.configure([HOURLY])
    dep.start_worker()
    dep.start_beats(*REPLICAS)
    dep.wait_ready()
    database = Database.open(dep.store_url)
    table = ScheduleTable(database, Settings.resolve({}, environ={}))
    lags: list[float] = []

    def applied_after(row: ScheduleRow) -> float:
        with Applied(dep) as applied:
            return applied.after(row)

    def row() -> ScheduleRow:
        return table.rows.get(["live"])["live"]

    # Each edit through the command; each applied by all three replicas, then left to fire.
    ok(cli(dep, "add", "live", "--task", TASK, "--schedule", "* * * * * *"))
    lags.append(applied_after(row()))
    time.sleep(4)
    ok(cli(dep, "set", "live", "--revision", "1", "--task", TASK, "--schedule", "*/2 * * * * *"))
    lags.append(applied_after(row()))
    time.sleep(4)
    ok(cli(dep, "disable", "live", "--revision", "2"))
    lags.append(applied_after(row()))
    time.sleep(5)
    ok(cli(dep, "enable", "live", "--revision", "3"))
    lags.append(applied_after(row()))
    time.sleep(4)

    # Refused: a stale revision, a bad expression; neither is stored.
    stale = cli(dep, "set", "live", "--revision", "2", "--task", TASK, "--schedule", "* * * * *")
    assert stale.returncode == 1 and "at revision 4, not 2" in stale.stderr, stale.stderr
    bad = cli(dep, "set", "live", "--revision", "4", "--task", TASK, "--schedule", "* 25 * * *")
    assert bad.returncode == 1 and "schedule 'live', field 'schedule'" in bad.stderr, bad.stderr

    ok(cli(dep, "rm", "live", "--revision", "4"))
    removed_at = table.history("live")[-1].changed_at
    # 100 edits, one every 100 ms (faster than a replica reads), of a schedule that stays ahead
    # of the clock: each one's time from commit to applied by all three, measured.
    paced = [table.add("paced", {"task": TASK, "schedule": "59 23 31 12 *"})]
    with Applied(dep) as applied:
        for i in range(EDITS):
            time.sleep(0.1)
            paced.append(
                table.set(
                    "paced",
                    {"task": TASK, "schedule": f"{i % 50 + 5} 23 31 12 *"},
                    revision=paced[-1].revision,
                    by="acceptance",
                )
            )
        lags += [applied.after(row) for row in paced[1:]]
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
