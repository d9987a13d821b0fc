"""One failed mark statement in the middle of a multi-chunk delivery.

Each replica reaches the store (PostgreSQL) through a :mod:`tcp_proxy` proxy of its own; the
broker is a private Redis reached directly. The proxy of the replica holding a 2,500-schedule
burst (three chunks) cuts its connection on the first mark statement of the instant (a blip: a
reset connection, a failover), so that statement never reaches the database. The chunk it
marked and the chunk written meanwhile are kept and marked at the next tick; the third chunk
stays claimed until its lease runs out and is sent then. Nothing is sent twice, nothing lost.
"""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from chaos_harness import (
    PUBLISH_TIMEOUT,
    ChaosDeployments,
    Results,
    boot,
    burst,
    executions_by_replica,
    keys_at,
    redis_accepted,
    tally,
    utc,
)
from tcp_proxy import Mode, ProxyHub, Trap
from vbt_harness import (
    REPLICAS,
    check,
    finish,
    next_boundary,
    now,
    sleep_until,
    start_private_redis,
)

EVERY = timedelta(seconds=15)
SIZE = 2500
#: The mark statement's text (voltro_beat.store.postgresql.MARK_PUBLISHED) as it travels.
MARK = b"SET published_at = clock_timestamp()"


def test_one_failed_mark_statement_in_a_multi_chunk_delivery(
    chaos: ChaosDeployments, proxies: ProxyHub, chaos_results: Results
) -> None:
    schedules = burst(SIZE)
    redis = start_private_redis(chaos)
    dep = chaos(broker=redis.url)
    store = sa.make_url(dep.store_url)
    target = (store.host or "127.0.0.1", store.port or 5432)
    for name in REPLICAS:
        proxy = proxies.add(name, target)
        proxied = store.set(host="127.0.0.1", port=proxy.port)
        dep.wrap[name] = {"VOLTRO_BEAT_STORE_URL": proxied.render_as_string(hide_password=False)}
    boot(dep, schedules, REPLICAS)

    instant = next_boundary(now() + timedelta(seconds=3), EVERY, timedelta(0))
    # Only the burst is due then: the first replica to mark is its holder.
    sleep_until(instant - timedelta(milliseconds=300))
    trap = Trap(MARK, Mode.CUT)
    proxies.arm(trap)
    assert trap.fired.wait(timeout=15), "no replica marked anything after the instant"
    name = trap.fired_by
    assert name is not None
    end = instant + PUBLISH_TIMEOUT * 3
    outcome = finish(dep, schedules, instant, end)

    row = tally(
        "9. one failed mark statement in a 2,500 burst (three chunks)",
        outcome,
        accepted=redis_accepted(chaos.workdir),
    )
    burst_keys = keys_at(schedules, instant)
    logged = dep.beats[name].text()
    row.notes += [
        f"{name}'s store connection cut on its first mark statement, at"
        f" {(utc(trap.fired_at) - instant).total_seconds():+.3f}s",
        f"second messages: {row.second_messages} (bound: 0)",
        "burst run rows ended with: "
        + ", ".join(f"{k} {v}" for k, v in executions_by_replica(outcome, burst_keys).items()),
    ]
    if "store" not in logged:
        row.notes.append(f"{name} logged nothing about the store")
    if row.second_messages:
        row.problems.append(f"{row.second_messages} second messages after one failed mark")
    chaos_results.add(row)
    check(row.problems, f"{name}'s mark cut at {utc(trap.fired_at):%T.%f}")
