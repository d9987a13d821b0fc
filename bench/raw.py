"""Raw limits of this machine, measured in the same run as the schedulers.

- ``redis_lpush``: pipelined LPUSH of real Celery messages (1,000 per pipeline), msgs/s;
- ``redis_lpush_multi``: one LPUSH carrying 1,000 messages, msgs/s;
- ``kombu_publish``: ``kombu.Producer.publish`` from one process, one connection, msgs/s;
- ``celery_send_task``: ``app.send_task`` from one process (beat's own path), msgs/s;
- ``observer_drain``: the observer emptying a pre-filled queue, msgs/s;
- ``pg_unnest_insert``: ``INSERT ... SELECT unnest(...) ON CONFLICT DO NOTHING``, 1,000 rows
  a statement, autocommit, rows/s;
- ``pg_single_insert``: one row per autocommit ``INSERT ... ON CONFLICT DO NOTHING``, rows/s.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import redis
from celery import Celery
from kombu import Connection, Producer, Queue

from bench import observer
from bench.procs import Processes
from bench.services import Services, clean, ensure_database

RAW_QUEUE = "bench_raw"
RAW_TABLE = "_bench_raw_claims"


def _rate(count: int, fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return count / (time.perf_counter() - start)


def _sample_message(svc: Services) -> bytes:
    """One real Celery message, as beat would put it on the queue."""
    app = Celery("bench_raw", broker=svc.broker_url)
    app.send_task("bench.noop", args=[0], queue=RAW_QUEUE)
    client = redis.Redis.from_url(svc.broker_url)
    raw = client.rpop(RAW_QUEUE)
    client.close()
    assert isinstance(raw, bytes)
    return raw


def redis_lpush(svc: Services, n: int) -> float:
    client = redis.Redis.from_url(svc.broker_url)
    raw = _sample_message(svc)

    def push() -> None:
        for start in range(0, n, 1000):
            pipe = client.pipeline(transaction=False)
            for _ in range(min(1000, n - start)):
                pipe.lpush(RAW_QUEUE, raw)
            pipe.execute()

    rate = _rate(n, push)
    client.delete(RAW_QUEUE)
    client.close()
    return rate


def redis_lpush_multi(svc: Services, n: int) -> float:
    client = redis.Redis.from_url(svc.broker_url)
    raw = _sample_message(svc)

    def push() -> None:
        for start in range(0, n, 1000):
            client.lpush(RAW_QUEUE, *([raw] * min(1000, n - start)))

    rate = _rate(n, push)
    client.delete(RAW_QUEUE)
    client.close()
    return rate


def kombu_publish(svc: Services, n: int) -> float:
    queue = Queue(RAW_QUEUE, routing_key=RAW_QUEUE)
    with Connection(svc.broker_url) as conn:
        producer = Producer(conn)
        producer.publish({"i": -1}, routing_key=RAW_QUEUE, declare=[queue])

        def publish() -> None:
            for i in range(n):
                producer.publish(
                    [[i], {}, {}], routing_key=RAW_QUEUE, headers={"task": "bench.noop"}
                )

        return _rate(n, publish)


def celery_send_task(svc: Services, n: int) -> float:
    app = Celery("bench_raw", broker=svc.broker_url)
    app.send_task("bench.noop", args=[-1], queue=RAW_QUEUE)  # connect before timing

    def send() -> None:
        for i in range(n):
            app.send_task("bench.noop", args=[i], queue=RAW_QUEUE)

    return _rate(n, send)


def observer_drain(svc: Services, n: int) -> float:
    raw = _sample_message(svc)
    client = redis.Redis.from_url(svc.broker_url)
    for start in range(0, n, 1000):
        pipe = client.pipeline(transaction=False)
        for _ in range(min(1000, n - start)):
            pipe.lpush(RAW_QUEUE, raw)
        pipe.execute()
    client.close()
    with (
        tempfile.TemporaryDirectory(prefix="voltro-bench-raw-") as tmp,
        Processes(Path(tmp)) as procs,
    ):
        out = Path(tmp) / "drain.json"
        proc = observer.start(procs, svc.broker_url, RAW_QUEUE, time.time() + 60, out)
        client = redis.Redis.from_url(svc.broker_url)
        deadline = time.time() + 60
        while client.llen(RAW_QUEUE) and time.time() < deadline:
            time.sleep(0.01)
        client.close()
        time.sleep(0.2)
        observer.finish(proc, out)
        times = [t for t, *_ in observer.load(out)]
    # From the observer's first receive to its last: its own start-up is not counted.
    return (len(times) - 1) / max(times[-1] - times[0], 1e-9)


def _pg_table(conn: psycopg.Connection) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
    conn.execute(
        f"CREATE TABLE {RAW_TABLE} (id text PRIMARY KEY, schedule text NOT NULL,"
        " scheduled_at timestamptz NOT NULL, claimed_at timestamptz NOT NULL DEFAULT now(),"
        " replica text NOT NULL)"
    )


def pg_unnest_insert(svc: Services, n: int, batch: int = 1000) -> float:
    base = datetime(2030, 1, 1, tzinfo=UTC)
    with psycopg.connect(svc.pg_url, autocommit=True) as conn:
        _pg_table(conn)
        batches = []
        for start in range(0, n, batch):
            idx = range(start, min(n, start + batch))
            at = [base + timedelta(seconds=i) for i in idx]
            batches.append(
                (
                    [f"s{i:06d}@{a:%Y-%m-%dT%H:%M:%S}" for i, a in zip(idx, at, strict=True)],
                    [f"s{i:06d}" for i in idx],
                    at,
                )
            )
        sql = (
            f"INSERT INTO {RAW_TABLE} (id, schedule, scheduled_at, replica)"
            " SELECT k, s, a, 'r0' FROM unnest(%s::text[], %s::text[], %s::timestamptz[])"
            " AS u(k, s, a) ON CONFLICT DO NOTHING RETURNING id"
        )

        def insert() -> None:
            for keys, names, at in batches:
                conn.execute(sql, (keys, names, at)).fetchall()

        rate = _rate(n, insert)
        conn.execute(f"DROP TABLE {RAW_TABLE}")
    return rate


def pg_single_insert(svc: Services, n: int) -> float:
    base = datetime(2030, 1, 1, tzinfo=UTC)
    with psycopg.connect(svc.pg_url, autocommit=True) as conn:
        _pg_table(conn)
        sql = (
            f"INSERT INTO {RAW_TABLE} (id, schedule, scheduled_at, replica)"
            " VALUES (%s, %s, %s, 'r0') ON CONFLICT DO NOTHING RETURNING id"
        )

        def insert() -> None:
            for i in range(n):
                at = base + timedelta(seconds=i)
                conn.execute(sql, (f"s{i:06d}@{at:%Y-%m-%dT%H:%M:%S}", f"s{i:06d}", at)).fetchall()

        rate = _rate(n, insert)
        conn.execute(f"DROP TABLE {RAW_TABLE}")
    return rate


def run(svc: Services, quick: bool) -> dict[str, float]:
    """All raw limits; small counts in quick mode."""
    scale = 0.1 if quick else 1.0
    n = {
        "redis_lpush": 100_000,
        "redis_lpush_multi": 200_000,
        "kombu_publish": 10_000,
        "celery_send_task": 10_000,
        "observer_drain": 100_000,
        "pg_unnest_insert": 200_000,
        "pg_single_insert": 5_000,
    }
    fns: dict[str, Callable[[Services, int], float]] = {
        "redis_lpush": redis_lpush,
        "redis_lpush_multi": redis_lpush_multi,
        "kombu_publish": kombu_publish,
        "celery_send_task": celery_send_task,
        "observer_drain": observer_drain,
        "pg_unnest_insert": pg_unnest_insert,
        "pg_single_insert": pg_single_insert,
    }
    ensure_database(svc)
    out: dict[str, float] = {}
    for name, fn in fns.items():
        clean(svc)
        out[name] = round(fn(svc, max(1000, int(n[name] * scale))), 1)
        print(f"  raw {name}: {out[name]:,.0f}/s", flush=True)
    clean(svc)
    return out


if __name__ == "__main__":
    print(json.dumps(run(Services(), quick=True), indent=2))
