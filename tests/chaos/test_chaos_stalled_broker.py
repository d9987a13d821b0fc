"""A broker write that stalls: each replica reaches Redis through a :mod:`tcp_proxy` proxy;
the proxy of the replica holding a 300-schedule burst holds that replica's writes from its
first LPUSH of the burst's instant for longer than the takeover time, then lets them through
(even if the replica gave up on them meanwhile). No duplicate, nothing lost.
"""

from __future__ import annotations

from datetime import timedelta

from chaos_harness import (
    PUBLISH_TIMEOUT,
    ChaosDeployments,
    Results,
    boot,
    burst,
    executions_by_replica,
    holder,
    keys_at,
    redis_accepted,
    republished,
    tally,
    utc,
)
from tcp_proxy import LPUSH, Mode, ProxyHub, Trap
from vbt_harness import (
    EVERY_SECOND,
    REPLICAS,
    check,
    finish,
    next_boundary,
    now,
    sleep_until,
    start_private_redis,
    window_start,
)

BURST = burst(300)
SCHEDULES = [*BURST, EVERY_SECOND]
EVERY = timedelta(seconds=15)
HOLD = PUBLISH_TIMEOUT + timedelta(seconds=3)


def test_stalled_broker_write_of_the_burst_holder(
    chaos: ChaosDeployments, proxies: ProxyHub, chaos_results: Results
) -> None:
    redis = start_private_redis(chaos)
    dep = chaos(broker=redis.url)
    dep.through_proxies(proxies, ("127.0.0.1", redis.port))
    boot(dep, SCHEDULES, REPLICAS)

    start = window_start()
    instant = next_boundary(now() + timedelta(seconds=2.5), EVERY, timedelta(0))
    held = dep.wait_for_claims(instant, until=instant - timedelta(milliseconds=60))
    sleep_until(instant - timedelta(milliseconds=50))
    trap = Trap(LPUSH, Mode.HOLD)
    # On a loaded host the claims ahead can land later than the poll looks: the trap then goes
    # on every proxy and fires on the first replica that writes at the instant.
    proxies.arm(trap, *([holder(held)] if held else []))
    assert trap.fired.wait(timeout=10), "nobody wrote to the broker after the instant"
    assert trap.fired_at is not None and trap.fired_by is not None
    name = trap.fired_by
    stalled = utc(trap.fired_at)
    sleep_until(stalled + HOLD)
    released = now()
    sent = proxies.proxies[name].release()
    end = instant + timedelta(seconds=12)
    outcome = finish(dep, SCHEDULES, start, end)

    row = tally(
        "3. stalled broker write of the burst holder",
        outcome,
        accepted=redis_accepted(chaos.workdir),
    )
    burst_keys = keys_at(BURST, instant)
    claimed = len(dep.claimed_keys(instant).get(name, ()))
    row.notes += [
        f"{name} claimed {claimed} of the {len(SCHEDULES)} runs of the instant;"
        f" its writes held from {(stalled - instant).total_seconds():+.3f}s for"
        f" {(released - stalled).total_seconds():.1f}s (publish timeout"
        f" {PUBLISH_TIMEOUT.total_seconds():g}s), {sent} bytes delivered on release",
        "burst run rows ended with: "
        + ", ".join(f"{k} {v}" for k, v in executions_by_replica(outcome, burst_keys).items()),
        "recovery republish attempts (beat logs): "
        + ", ".join(f"{k} {v}" for k, v in republished(dep).items()),
    ]
    chaos_results.add(row)
    check(row.problems, f"{name}'s writes held {stalled:%T.%f}..{released:%T.%f}")
