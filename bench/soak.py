"""A simulated soak: do the claims stay bounded when replicas run for a day?

    .venv/bin/python -m bench.soak                      # 20 one-second schedules, 3 replicas, 24 h
    .venv/bin/python -m bench.soak --hours 2 --schedules 20 --replicas 3

Three real :class:`~voltro_beat.scheduler.VoltroScheduler` replicas share one SQLite store and
kombu's in-memory broker in this process, on a driven clock: each replica ticks at the instant
its previous tick asked to be woken at (a discrete-event simulation: a simulated day takes
about 45 minutes on two busy cores, not a day). SQLite's store reads the same driven clock, so
the claims' ``claimed_at``, the pruning and the hourly retention sweep (24 h claims, 30 d
runs) all see simulated time. Every simulated minute the claims table is counted and the
broker drained.

Prints one JSON object (also written to ``bench/results/soak.json``): the claims count
(maximum, per simulated hour, final, and as a multiple of the number of schedules), the run
rows, the messages published and the duplicates among them (by occurrence key), the sweeps
(one per hourly slot), this process's resident memory (RSS, the three replicas together) at the
end of each simulated hour, and the wall time. Exits 1 if a message was published twice or an
occurrence has no run row.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import sqlalchemy as sa
from celery import Celery

from voltro_beat import retention
from voltro_beat.scheduler import VoltroScheduler

RESULTS = Path(__file__).resolve().parent / "results"
T0 = datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)
#: Beat's own loop sleeps at least this long between ticks (a tick that asks for 0 s, say a
#: retention batch, is followed by another one this much later).
MIN_SLEEP = 0.005


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24.0, help="simulated hours (default 24)")
    ap.add_argument("--schedules", type=int, default=20, help="one-second schedules (20)")
    ap.add_argument("--replicas", type=int, default=3, help="beat replicas (3)")
    return ap.parse_args(argv)


def replica(name: str, url: str, schedules: int) -> VoltroScheduler:
    app = Celery(f"soak-{name}", broker="memory://", set_as_current=False)
    app.conf.update(
        voltro_beat_store_url=url,
        voltro_beat_replica=name,
        result_expires=None,
        beat_schedule={
            f"s{i:03d}": {"task": "soak.noop", "schedule": timedelta(seconds=1)}
            for i in range(schedules)
        },
    )
    return VoltroScheduler(app)


class Published:
    """How many times each occurrence went out, one byte per schedule and second of the soak,
    allocated at the start: the harness's memory stays flat, so the RSS measured is the
    replicas' (a Counter of every key grew by 7 MB a simulated hour)."""

    def __init__(self, schedules: int, seconds: int) -> None:
        self._seconds = seconds
        self._counts = bytearray(schedules * seconds)
        self.messages = 0

    def add(self, key: str) -> None:
        name, _, instant = key.partition("@")
        second = int((datetime.fromisoformat(instant).replace(tzinfo=UTC) - T0).total_seconds())
        i = int(name[1:]) * self._seconds + second
        self._counts[i] = min(255, self._counts[i] + 1)
        self.messages += 1

    @property
    def duplicates(self) -> int:
        return self.messages - (len(self._counts) - self._counts.count(0))


def drain(app: Celery, published: Published) -> None:
    """Count the messages waiting on the in-memory broker by occurrence key."""
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue("celery")
        while True:
            try:
                message = queue.get(block=False)
            except queue.Empty:
                return
            published.add(message.headers["voltro_occurrence"])
            message.ack()


def count(engine: sa.Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(sql)).scalar_one())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # On tmpfs where there is one: the commits' fsyncs would cost more than the soak itself.
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        url = f"sqlite:///{Path(tmp) / 'soak.sqlite3'}"
        result = soak(url, args)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["duplicates"] == 0 and result["unrecorded"] == 0 else 1


def soak(url: str, args: argparse.Namespace) -> dict[str, Any]:
    replicas = [replica(f"r{i + 1}", url, args.schedules) for i in range(args.replicas)]
    # kombu's in-memory broker is one per process: start from an empty queue.
    with replicas[0].app.connection_for_write() as conn:
        conn.SimpleQueue("celery").clear()
    engine = sa.create_engine(url)
    end = T0 + timedelta(hours=args.hours)
    # (when it wakes, its index): every replica starts at T0, a few ms apart.
    wakes = [(T0 + timedelta(milliseconds=3 * i), i) for i in range(len(replicas))]
    seconds = int(args.hours * 3600)
    # And a minute past the end: what was claimed ahead goes out at close.
    published = Published(args.schedules, seconds + 60)
    samples: list[int] = []
    rss_mb: list[int] = []
    process = psutil.Process()
    next_sample = T0
    ticks = 0
    started = time.monotonic()
    try:
        while wakes[0][0] < end:
            at, i = heapq.heappop(wakes)
            r = replicas[i]
            r._store.database.clock = lambda at=at: at
            delay = r.tick()
            ticks += 1
            heapq.heappush(wakes, (at + timedelta(seconds=max(delay, MIN_SLEEP)), i))
            if at >= next_sample:
                samples.append(count(engine, "SELECT count(*) FROM _voltro_schedule_claims"))
                drain(r.app, published)
                next_sample += timedelta(minutes=1)
                if len(samples) % 60 == 0:  # each simulated hour
                    rss_mb.append(process.memory_info().rss >> 20)
                    print(
                        f"hour {len(samples) // 60}: {samples[-1]} claims, {rss_mb[-1]} MB",
                        file=sys.stderr,
                    )
    finally:
        for r in replicas:
            r._store.database.clock = lambda: end
            r.close()
    drain(replicas[0].app, published)
    claims = count(engine, "SELECT count(*) FROM _voltro_schedule_claims")
    runs = count(engine, "SELECT count(*) FROM _voltro_schedule_runs")
    sweeps = count(
        engine,
        f"SELECT count(*) FROM _voltro_schedule_claims WHERE schedule = '{retention.SWEEP_JOB}'",
    )
    engine.dispose()
    expected = args.schedules * seconds
    return {
        "simulated_hours": args.hours,
        "schedules": args.schedules,
        "replicas": args.replicas,
        "ticks": ticks,
        "claims_max": max(samples),
        "claims_final": claims,
        "claims_max_per_schedule": round(max(samples) / args.schedules, 1),
        # The largest count within each simulated hour: flat once the pruning has caught up.
        "claims_max_by_hour": [max(samples[h : h + 60]) for h in range(0, len(samples), 60)],
        "sweep_claims": sweeps,
        # Flat once every replica's state has settled: nothing a replica holds grows with time.
        "rss_mb_by_hour": rss_mb,
        "runs": runs,
        "occurrences_expected": expected,
        "unrecorded": max(0, expected - runs),
        "messages": published.messages,
        "duplicates": published.duplicates,
        "wall_seconds": round(time.monotonic() - started, 1),
    }


if __name__ == "__main__":
    sys.exit(main())
