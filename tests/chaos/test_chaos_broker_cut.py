"""The broker connection cut in the middle of a burst, on Redis and on RabbitMQ.

Every replica reaches the broker through a :mod:`tcp_proxy` proxy; the proxy of the replica
holding a 2,500-schedule burst cuts its connection in the middle of the burst's writes (the
rest of the write never reaches the broker). A run is marked ``published`` only once the broker
confirmed it; whatever was not confirmed is republished, once its lease ran out, with the same
task id. On Redis a chunk is one ``MULTI``/``EXEC``: nothing of a cut chunk was executed, so
every occurrence is executed exactly once. On RabbitMQ the publisher waits for confirms every
``CONFIRM_EVERY`` messages: the messages of the batch the cut fell into may have reached the
broker unconfirmed, and only those may run twice (the documented window), same task ids.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from chaos_harness import (
    PUBLISH_TIMEOUT,
    ChaosDeployments,
    Results,
    boot,
    burst,
    executions_by_replica,
    keys_at,
    redis_accepted,
    republished,
    tally,
    utc,
)
from tcp_proxy import BASIC_PUBLISH, LPUSH, Mode, Proxy, ProxyHub, Trap
from vbt_harness import (
    REPLICAS,
    check,
    finish,
    next_boundary,
    now,
    sleep_until,
    start_private_redis,
)

from voltro_beat.confirms import CONFIRM_EVERY

EVERY = timedelta(seconds=15)
SIZE = 2500


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_broker_connection_cut_mid_burst(
    chaos: ChaosDeployments, proxies: ProxyHub, chaos_results: Results, broker: str
) -> None:
    schedules = burst(SIZE)
    if broker == "redis":
        redis = start_private_redis(chaos)
        dep = chaos(broker=redis.url)
        target = ("127.0.0.1", redis.port)
        # A chunk is one MULTI, one LPUSH of its payloads, one EXEC: the second chunk's LPUSH.
        marker, nth = LPUSH, 2

        def url(proxy: Proxy) -> str:
            return proxy.url()

        accepted = redis_accepted(chaos.workdir)
    else:
        dep = chaos(broker="rabbitmq")
        target = ("127.0.0.1", 5672)
        # Publishes go out a confirm batch at a time, a few per read: well into the burst.
        marker, nth = BASIC_PUBLISH, 8

        def url(proxy: Proxy) -> str:
            return f"amqp://guest:guest@127.0.0.1:{proxy.port}//"

        accepted = None
    dep.through_proxies(proxies, target, url)
    boot(dep, schedules, REPLICAS)

    instant = next_boundary(now() + timedelta(seconds=3), EVERY, timedelta(0))
    # Only the burst is due at that instant, and one replica holds it (the one that claimed
    # it): the trap goes on every proxy and fires on that replica's.
    sleep_until(instant - timedelta(milliseconds=300))
    trap = Trap(marker, Mode.CUT, nth=nth)
    proxies.arm(trap)
    assert trap.fired.wait(timeout=30), f"no replica wrote {nth} times to the broker"
    name = trap.fired_by
    assert name is not None
    end = instant + PUBLISH_TIMEOUT + timedelta(seconds=8)
    outcome = finish(dep, schedules, instant, end)

    row = tally(f"6. broker connection cut mid-burst ({broker})", outcome, accepted=accepted)
    burst_keys = keys_at(schedules, instant)
    cut = f"{(utc(trap.acted_at) - instant).total_seconds():+.3f}s" if trap.acted_at else "?"
    claimed = len(dep.claimed_keys(instant).get(name, ()))
    row.notes += [
        f"{name} claimed {claimed} of the {SIZE:,} burst runs; its connection cut {cut}"
        f" from the instant, in its write {nth} of the burst",
        "burst run rows ended with: "
        + ", ".join(f"{k} {v}" for k, v in executions_by_replica(outcome, burst_keys).items()),
        "recovery republish attempts (beat logs): "
        + ", ".join(f"{k} {v}" for k, v in republished(dep).items()),
    ]
    allowed = CONFIRM_EVERY if broker == "rabbitmq" else 0
    row.notes.append(
        f"second messages: {row.second_messages}, none executed (bound: {allowed}, same task ids)"
    )
    if row.second_messages > allowed:
        row.problems.append(f"{row.second_messages} second messages, more than {allowed}")
    chaos_results.add(row)
    check(row.problems, f"{name}'s broker connection cut {cut} from {instant:%T}")
