"""Where a replica's boot goes at S schedules: a profile and a memory snapshot of one replica
built and ticked once in this process, on a fresh store. The schedules are the bench's burst
app's: ``crontab(minute='*')`` (one object, shared), each with its own ``args``.

    .venv/bin/python -m bench.profile                      # 100,000 schedules
    .venv/bin/python -m bench.profile --size 10000 --store sqlite:////tmp/vb.sqlite3
    .venv/bin/python -m bench.profile --source table       # the same, from the schedules table
    .venv/bin/python -m bench.profile --run 75 --store sqlite:////tmp/vb.sqlite3  # 75 s of beat
    .venv/bin/python -m bench.profile --size 333000 --coordination cluster --run 150

With ``--run SECONDS`` the timed replica then ticks as beat's loop would for that long (a minute
boundary or more: every schedule fires each minute), and the longest tick and the runs its
publish fence no longer found this replica's (their leases ran out first: recovery sends them)
are printed: what a cold start costs the first bursts.

On PostgreSQL it uses the bench's database (``voltro_bench``), emptied before each step.

Steps, each timed: ``app`` = building the app's ``beat_schedule`` (Celery's ``crontab``, the
application's cost); ``scheduler`` = ``VoltroScheduler(app)`` (Celery builds it at beat's
start: settings, entries, the engine); ``first tick`` = its first ``tick()`` (schema, registry,
catch-up, the timeline; beat's "ready"); ``second tick``. With ``--source table`` the schedules
are rows of the schedules table instead (written in one transaction, as that many adds would
leave them: a row and a change row each; the app's ``beat_schedule`` is empty), and one more
step: ``one change`` = the engine reading and applying a change of one row.
Then the functions that took the most time (cProfile, cumulative and own), and the lines that
hold the most memory after the first tick (tracemalloc, which slows the run: its timings are
printed apart, without it). The broker is kombu's in-memory one: nothing is published unless
an occurrence falls due meanwhile.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import pstats
import resource
import time
import tracemalloc
from typing import Any

from celery import Celery
from celery.schedules import crontab

from bench.services import Services, clean, ensure_database


def _fresh(store: str) -> Services:
    """The bench's own database (or the SQLite file given), emptied."""
    svc = Services(voltro_store=store)
    if svc.sqlite_path is None:
        ensure_database(svc)
    clean(svc)
    return svc


def _steps(
    size: int, store: str, source: str, coordination: str | None = None
) -> tuple[dict[str, float], Any]:
    from voltro_beat.scheduler import VoltroScheduler

    times: dict[str, float] = {}
    t = time.perf_counter()
    every = crontab(minute="*")
    app = Celery("profile", broker="memory://", set_as_current=False)
    app.conf.update(voltro_beat_store_url=store, voltro_beat_replica="profile", result_expires=None)
    if coordination:
        app.conf.voltro_beat_coordination = coordination
    if source == "code":
        app.conf.beat_schedule = {
            f"s{i:06d}": {"task": "bench.noop", "schedule": every, "args": [i]} for i in range(size)
        }
    else:
        _fill_table(store, size)
    times["app" if source == "code" else "table rows written"] = time.perf_counter() - t
    t = time.perf_counter()
    scheduler = VoltroScheduler(app)
    times["scheduler"] = time.perf_counter() - t
    t = time.perf_counter()
    scheduler.tick()
    times["first tick"] = time.perf_counter() - t
    t = time.perf_counter()
    scheduler.tick()
    times["second tick"] = time.perf_counter() - t
    if source == "table":
        times["one change"] = _one_change(scheduler, store)
    return times, scheduler


#: A row of the schedules table as the bench writes it (the burst app's entry, written down).
_DEFINITION = {"task": "bench.noop", "schedule": {"crontab": {"minute": "*"}}}


def _fill_table(store: str, size: int) -> None:
    """``size`` schedules in the schedules table, as ``size`` adds would leave them."""
    import json

    from voltro_beat.store.database import Database
    from voltro_beat.store.tables import schedule_changes, schedules

    database = Database.open(store)
    database.upgrade()
    now = database.time()
    rows, changes = [], []
    for i in range(size):
        doc = json.dumps({**_DEFINITION, "args": [i]})
        after = json.dumps({"group": "default", "definition": json.loads(doc), "enabled": True})
        rows.append(
            {"name": f"s{i:06d}", "schedule_group": "default", "definition": doc,
             "enabled": True, "revision": i + 1, "changed_by": "bench", "changed_at": now}
        )  # fmt: skip
        changes.append(
            {"revision": i + 1, "name": f"s{i:06d}", "action": "add", "before": None,
             "after": after, "changed_by": "bench", "changed_at": now}
        )  # fmt: skip
    with database.engine.begin() as conn:
        for i in range(0, size, 10_000):
            conn.execute(schedules.insert(), rows[i : i + 10_000])
            conn.execute(schedule_changes.insert(), changes[i : i + 10_000])
    # Added as beat starts, as the app's entries are: a catch-up looks back to a row's change,
    # and the minutes since the first insert would be owed.
    now = database.time()
    with database.engine.begin() as conn:
        conn.execute(schedules.update().values(changed_at=now))
        conn.execute(schedule_changes.update().values(changed_at=now))
    database.dispose()


def _one_change(scheduler: Any, store: str) -> float:
    """Change one row through the API; the engine's step that reads and applies it (alone:
    a tick may hold a burst)."""
    from voltro_beat.config import Settings
    from voltro_beat.schedule_table import ScheduleTable
    from voltro_beat.store.database import Database

    table = ScheduleTable(Database.open(store), Settings.resolve({}, environ={}))
    (row,) = table.rows.get(["s000000"]).values()
    table.set("s000000", {**_DEFINITION, "schedule": "30 * * * *"}, revision=row.revision)
    applied = scheduler._engine.live.applied
    t = time.perf_counter()
    scheduler._engine._follow_table(boot=False)
    took = time.perf_counter() - t
    assert scheduler._engine.live.applied > applied, "the change was not applied"
    table.database.dispose()
    return took


class _Unheld(logging.Handler):
    """Counts the runs the publish fence no longer found this replica's."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.runs = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "no longer held" in record.getMessage():
            self.runs += int(getattr(record, "voltro_count", 0))


def _run(scheduler: Any, seconds: float) -> dict[str, float]:
    """Tick ``scheduler`` as beat's loop would for ``seconds``."""
    unheld = _Unheld()
    logging.getLogger("voltro_beat.dispatch").addHandler(unheld)
    longest, end = 0.0, time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            t = time.perf_counter()
            wait = scheduler.tick()
            longest = max(longest, time.perf_counter() - t)
            time.sleep(max(0.0, min(wait, end - time.monotonic())))
    finally:
        logging.getLogger("voltro_beat.dispatch").removeHandler(unheld)
    return {f"longest tick in {seconds:g} s": longest, "runs not held at their fence": unheld.runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--store", default=Services().voltro_store)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--source", choices=("code", "table"), default="code",
        help="The schedules in the app's beat_schedule, or rows of the schedules table.",
    )  # fmt: skip
    parser.add_argument(
        "--coordination", choices=("advisory_lock", "cluster", "single"),
        help="voltro_beat_coordination (default: the store's default); with cluster, the "
        "one replica owns every shard.",
    )  # fmt: skip
    parser.add_argument(
        "--run", type=float, default=0.0, metavar="SECONDS",
        help="Then tick as beat would for SECONDS, and skip the profile and memory runs.",
    )  # fmt: skip
    args = parser.parse_args(argv)

    _fresh(args.store)
    times, scheduler = _steps(args.size, args.store, args.source, args.coordination)
    if args.run:
        times.update(_run(scheduler, args.run))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    scheduler.close()
    print(f"## {args.size:,} schedules from the {args.source}, store {args.store.split('://')[0]}")
    print("\n".join(f"- {step}: {s:.2f} s" for step, s in times.items() if "runs" not in step))
    print("\n".join(f"- {step}: {n:,.0f}" for step, n in times.items() if "runs" in step))
    print(f"- peak RSS: {rss:.0f} MB")
    if args.run:
        return 0

    _fresh(args.store)
    profile = cProfile.Profile()
    profile.enable()
    _, scheduler = _steps(args.size, args.store, args.source, args.coordination)
    profile.disable()
    scheduler.close()
    for order in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(args.top)
        print(f"\n## profile, by {order}\n```\n{out.getvalue().strip()}\n```")

    _fresh(args.store)
    tracemalloc.start(1)
    _, scheduler = _steps(args.size, args.store, args.source, args.coordination)
    snapshot = tracemalloc.take_snapshot()
    tracemalloc.stop()
    scheduler.close()
    top = snapshot.statistics("lineno")
    total = sum(s.size for s in top) / 2**20
    print(f"\n## memory held after the first ticks: {total:.0f} MB traced, the largest lines\n")
    for stat in top[: args.top]:
        print(f"- {stat.size / 2**20:7.1f} MB {stat.count:>9,} blocks  {stat.traceback[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
