"""Database round trips per tick of voltro_beat's firing path, for growing numbers of schedules.

    .venv/bin/python -m bench.roundtrips                        # S = 1,000 and 10,000, R = 3
    .venv/bin/python -m bench.roundtrips --sizes 100000 --replicas 1

R schedulers (replicas, in this process) of S ``crontab(minute='*')`` schedules share the
local PostgreSQL (database ``voltro_roundtrips``, tables dropped) and Redis (db 7, flushed). They
boot, then go through one minute boundary the way a beat does: each replica's claim tick
(at the boundary minus its claim lead) and its publish tick (at the boundary). Every statement
each replica's store sends is counted with SQLAlchemy's ``before_cursor_execute`` event: the
figure is statements per tick, i.e. database round trips, whatever S is. The ticks are driven
with fixed instants (the scheduler's local clock set to each; leases and deadlines stay the
database's), so the run takes seconds, not minutes;
the wall-clock benchmark of the same path is ``python -m bench --workloads burst``.

Prints a markdown table and writes ``bench/results/roundtrips.json``. Exits 1 if the queue
did not receive each of the S messages exactly once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from celery.schedules import crontab
from sqlalchemy import event

from bench.services import Services, clean, ensure_database
from voltro_beat.scheduler import VoltroScheduler

BROKER = "redis://127.0.0.1:6379/7"
#: A database and a Redis db of its own, so a ``python -m bench`` run is not disturbed.
SERVICES = Services(
    broker_url=BROKER,
    redbeat_url=BROKER,
    pg_db="voltro_roundtrips",
    voltro_store="postgresql+psycopg://root@127.0.0.1:5432/voltro_roundtrips",
)
RESULTS = Path(__file__).resolve().parent / "results"


def replica(name: str, size: int, counts: Counter[str]) -> VoltroScheduler:
    app = Celery(f"roundtrips-{name}", broker=BROKER, set_as_current=False)
    every = crontab(minute="*")
    app.conf.update(
        timezone="UTC",
        result_expires=None,
        voltro_beat_store_url=SERVICES.voltro_store,
        voltro_beat_replica=name,
        # Driven at fixed instants (see at()); leases and deadlines stay the database's.
        voltro_beat_clock="local",
        beat_schedule={
            f"s{i:06d}": {"task": "bench.noop", "schedule": every, "args": [i]} for i in range(size)
        },
    )
    scheduler = VoltroScheduler(app)
    engine = scheduler._store.database.engine

    @event.listens_for(engine, "before_cursor_execute")
    def _count(*_args: Any) -> None:
        counts[name] += 1

    return scheduler


def at(beat: VoltroScheduler, instant: datetime) -> float:
    """One tick of ``beat`` with its clock reading ``instant``."""
    beat._clock.local = lambda: instant
    return beat.tick()


def measure(size: int, replicas: int) -> dict[str, Any]:
    ensure_database(SERVICES)
    clean(SERVICES)
    broker = redis.Redis.from_url(BROKER)
    counts: Counter[str] = Counter()
    beats = [replica(f"r{i}", size, counts) for i in range(replicas)]
    boundary = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(minutes=10)
    try:
        for beat in beats:
            at(beat, boundary - timedelta(seconds=45))  # boot: schema, catch-up, templates
        lead = beats[0]._engine.timeline.lead
        booted = dict(counts)
        counts.clear()
        started = time.perf_counter()
        for beat in beats:
            at(beat, boundary - lead)  # claim tick
        claim_s = time.perf_counter() - started
        claimed = dict(counts)
        counts.clear()
        started = time.perf_counter()
        for beat in beats:
            at(beat, boundary)  # publish tick
        publish_s = time.perf_counter() - started
        published = dict(counts)
        messages = broker.llen("celery")
        bodies = broker.lrange("celery", 0, -1)
        keys = Counter(json.loads(b)["headers"]["voltro_occurrence"] for b in bodies)
    finally:
        for beat in beats:
            beat.close()
        broker.close()
        clean(SERVICES)
    return {
        "schedules": size,
        "replicas": replicas,
        "boot_statements": booted,
        "claim_tick_statements": claimed,
        "publish_tick_statements": published,
        "claim_tick_s": round(claim_s, 3),
        "publish_tick_s": round(publish_s, 3),
        "messages": messages,
        "duplicates": sum(n - 1 for n in keys.values()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="comma list of S")
    parser.add_argument("--replicas", type=int, default=3)
    args = parser.parse_args()
    rows = [measure(int(s), args.replicas) for s in args.sizes.split(",")]
    print(
        "| S | R | statements, claim tick (per replica) | statements, publish tick "
        "(per replica) | claim tick s (all) | publish tick s (all) | messages | dups |"
    )
    print("|---:|---:|---|---|---:|---:|---:|---:|")
    ok = True
    for row in rows:
        claim = ", ".join(f"{k} {v}" for k, v in sorted(row["claim_tick_statements"].items()))
        pub = ", ".join(f"{k} {v}" for k, v in sorted(row["publish_tick_statements"].items()))
        print(
            f"| {row['schedules']:,} | {row['replicas']} | {claim} | {pub} | "
            f"{row['claim_tick_s']} | {row['publish_tick_s']} | {row['messages']:,} | "
            f"{row['duplicates']} |"
        )
        ok &= row["messages"] == row["schedules"] and row["duplicates"] == 0
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "roundtrips.json"
    out.write_text(json.dumps(rows, indent=2))
    print(f"\nJSON: {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
