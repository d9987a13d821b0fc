"""kill -9 of a replica mid-burst: 1,000 schedules are due at one instant; each replica reaches
Redis through a :mod:`tcp_proxy` proxy, and the first holder of that burst to write to the
broker is SIGKILLed as soon as Redis answered its first write (the messages are in Redis, the
replica never learns it). Every occurrence must be executed; the second messages, if any, are
counted and must fit the documented window: at most one publish chunk
(``voltro_beat.scheduler.PUBLISH_CHUNK``) of the killed replica, each with the task id of its
occurrence (uuid5 of the key).
"""

from __future__ import annotations

import signal
from collections import Counter
from datetime import timedelta

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
from tcp_proxy import LPUSH, Mode, ProxyHub, Trap
from vbt_harness import (
    REPLICAS,
    check,
    finish,
    next_boundary,
    now,
    sleep_until,
    start_private_redis,
    window_start,
)

from voltro_beat.scheduler import PUBLISH_CHUNK

BURST = burst(1000)
EVERY = timedelta(seconds=15)


def test_kill_minus_nine_right_after_the_first_broker_write(
    chaos: ChaosDeployments, proxies: ProxyHub, chaos_results: Results
) -> None:
    redis = start_private_redis(chaos)
    dep = chaos(broker=redis.url)
    for name in REPLICAS:
        dep.overrides[name] = {"broker_url": proxies.add(name, ("127.0.0.1", redis.port)).url()}
    boot(dep, BURST, REPLICAS)

    start = window_start()
    instant = next_boundary(now() + timedelta(seconds=3), EVERY, timedelta(0))
    held = dep.wait_for_claims(instant, until=instant - timedelta(milliseconds=200))
    assert held, "no claim ahead of the burst was seen before its instant"
    sleep_until(instant - timedelta(milliseconds=150))
    trap = Trap(LPUSH, Mode.KILL_AFTER_REPLY, action=lambda n: dep.beats[n].signal(signal.SIGKILL))
    proxies.arm(trap, *held)
    assert trap.fired.wait(timeout=10), f"no holder of {sorted(held)} wrote to the broker"
    assert trap.fired_by is not None
    name = trap.fired_by
    assert trap.acted.wait(timeout=30), f"Redis never answered {name}'s write"
    victim = dep.beats[name]
    victim.kill9()
    end = instant + timedelta(seconds=12)
    outcome = finish(dep, BURST, start, end)

    row = tally(
        "4. kill -9 right after the first broker write of a burst",
        outcome,
        accepted=redis_accepted(chaos.workdir),
    )
    burst_keys = keys_at(BURST, instant)
    counts = Counter(e.occurrence for e in outcome.executions)
    twice = {k for k in burst_keys if counts[k] > 1}
    acted = f"{(utc(trap.acted_at) - instant).total_seconds():+.3f}s" if trap.acted_at else "?"
    row.notes += [
        f"burst of {len(BURST)} held by "
        + ", ".join(f"{k} {len(v & set(burst_keys))}" for k, v in held.items())
        + f"; {name} killed {acted} from the instant, after Redis answered its first write",
        f"second messages: {row.duplicates} (bound: one publish chunk, PUBLISH_CHUNK ="
        f" {PUBLISH_CHUNK}, of the killed replica's {len(held[name])} runs)",
        "burst run rows ended with: "
        + ", ".join(f"{k} {v}" for k, v in executions_by_replica(outcome, burst_keys).items()),
        "recovery republish attempts (beat logs): "
        + ", ".join(f"{k} {v}" for k, v in republished(dep).items()),
        f"publish timeout {PUBLISH_TIMEOUT.total_seconds():g}s",
    ]
    if len(held[name]) <= PUBLISH_CHUNK:
        row.notes.append(
            f"{name}'s {len(held[name])} runs fit in one chunk: this run cannot tell marks per"
            " chunk from one mark per instant"
        )
    # The documented window allows second messages: they are not problems while they fit it.
    row.problems = [p for p in row.problems if "(2 messages)" not in p]
    if row.duplicates > PUBLISH_CHUNK:
        row.problems.append(f"{row.duplicates} second messages, more than one chunk")
    if twice - held[name]:
        row.problems.append(f"second messages of runs {name} did not hold: {sorted(twice)[:5]}")
    if any(counts[k] > 2 for k in burst_keys):
        row.problems.append("an occurrence executed three times or more")
    assert victim.popen.returncode == -9
    chaos_results.add(row)
    check(row.problems, f"{name} killed")
