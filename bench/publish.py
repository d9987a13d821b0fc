"""Publish throughput to a local Redis: Celery's send_task vs template replay vs the fast path.

    .venv/bin/python -m bench.publish [--broker redis://127.0.0.1:6379/11] [--repeat 3]

For S in {10,000, 1,000} schedules, one occurrence of each is published from one process,
in the scheduler's batches of 1,000, by
(a) Celery's own ``send_task`` through one reused producer (what Celery's beat does),
(b) the publisher's kombu template replay (the Redis payload capture switched off),
(c) the publisher's Redis fast path (captured payload, patched ids, one pipeline a batch).
Templates are built before the clock starts (the scheduler builds them in idle time); their
one-off cost is printed separately. Every run checks that exactly S messages reached the queue.
Medians of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from unittest import mock

import redis
from celery import Celery

from voltro_beat.dispatch import CHUNK
from voltro_beat.messages import RedisPush
from voltro_beat.occurrences import task_id_for
from voltro_beat.publisher import Publisher
from voltro_beat.schedules import Entry, parse_entries

QUEUE = "bench_publish"


def make_entries(count: int) -> list[Entry]:
    raw = {
        f"s{i:06d}": {"schedule": 60.0, "task": "bench.noop", "args": [i], "options": {}}
        for i in range(count)
    }
    return list(parse_entries(raw, tz=None, max_lateness=timedelta(days=1)))


def occurrences(entries: Sequence[Entry], run: int) -> list[tuple[Entry, str, str]]:
    keys = [f"{e.name}@2026-01-01T10:{run:02d}:00" for e in entries]
    return [(e, key, task_id_for(key)) for e, key in zip(entries, keys, strict=True)]


def celery_send_task(app: Celery, messages: Sequence[tuple[Entry, str, str]]) -> float:
    with app.connection_for_write() as conn:
        producer = app.amqp.Producer(conn, auto_declare=False)
        start = time.perf_counter()
        for entry, key, task_id in messages:
            headers = {"voltro_occurrence": key, "periodic_task_name": entry.name}
            app.send_task(
                entry.task, entry.args, task_id=task_id, headers=headers, producer=producer
            )
        return time.perf_counter() - start


def publisher_run(
    app: Celery, entries: Sequence[Entry], messages: Sequence[tuple[Entry, str, str]], fast: bool
) -> tuple[float, float]:
    """(seconds to build the templates, seconds to publish) with a fresh publisher."""
    publisher = Publisher(app, write_timeout=timedelta(seconds=30))
    # (b) is the same publisher with the Redis payload capture finding nothing to reuse.
    off = mock.patch.object(RedisPush, "capture", return_value=None)
    with contextlib.nullcontext() if fast else off:
        start = time.perf_counter()
        publisher.prepare(entries)
        prepared = time.perf_counter()
        for i in range(0, len(messages), CHUNK):
            publisher.publish(messages[i : i + CHUNK])
        done = time.perf_counter()
    pushed = sum(isinstance(p and p.template, RedisPush) for p in publisher._messages.values())
    assert pushed == (len(entries) if fast else 0), pushed
    publisher.reset()
    return prepared - start, done - prepared


def measure(client: redis.Redis, count: int, repeat: int, fn: Callable[[int], float]) -> float:
    """Median seconds of ``fn(run)`` over ``repeat`` runs, each checked to queue ``count``."""
    seconds = []
    for run in range(repeat):
        seconds.append(fn(run))
        assert client.llen(QUEUE) == count, client.llen(QUEUE)
        client.delete(QUEUE)
    return statistics.median(seconds)


def compare(app: Celery, client: redis.Redis, count: int, repeat: int) -> None:
    entries = make_entries(count)
    builds: dict[bool, list[float]] = {False: [], True: []}

    def replay(run: int, fast: bool) -> float:
        build, seconds = publisher_run(app, entries, occurrences(entries, run), fast)
        builds[fast].append(build)
        return seconds

    rows = [
        (
            "(a) Celery send_task",
            measure(
                client, count, repeat, lambda run: celery_send_task(app, occurrences(entries, run))
            ),
            None,
        ),
        (
            "(b) template replay",
            measure(client, count, repeat, lambda run: replay(run, False)),
            False,
        ),
        (
            "(c) Redis fast path",
            measure(client, count, repeat, lambda run: replay(run, True)),
            True,
        ),
    ]
    for label, seconds, fast in rows:
        build = "" if fast is None else f"{statistics.median(builds[fast]) / count * 1e6:.0f}"
        rate, cost = count / seconds, seconds / count * 1e6
        print(f"| {count:,} | {label} | {rate:,.0f} | {cost:.1f} | {build} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/11")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000])
    args = parser.parse_args(argv)

    app = Celery("bench_publish", broker=args.broker, set_as_current=False)
    app.conf.task_default_queue = QUEUE
    client = redis.Redis.from_url(args.broker)
    client.delete(QUEUE)
    print(f"broker {args.broker}, one process, median of {args.repeat} runs\n")
    print("| schedules | path | msgs/s | µs/msg | template build µs/schedule |")
    print("|---:|---|---:|---:|---:|")
    for count in args.sizes:
        compare(app, client, count, args.repeat)
    client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
