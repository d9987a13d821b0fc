"""SIGSTOP of the replica holding a claimed burst, just before its instant, for longer than
the takeover time (``voltro_beat_publish_timeout``), then SIGCONT: no duplicate, nothing lost.

300 schedules are due at one instant (every 15 s) beside an every-second one. The holder is
found from the run rows ``claimed`` ahead for that instant (column ``replica``); it is stopped
30 ms before the instant, while the others' recovery sweeps take its rows over, and resumed
past its lease. Again in ``cluster`` coordination: the burst is spread over the three shard
owners; the one holding most of it is stopped past its shards' lease (the others take its
shards, and their recovery sweeps its claimed runs), and its claims after SIGCONT are refused
by the epoch check.
"""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
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
    tally,
)
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
PAUSE = PUBLISH_TIMEOUT + timedelta(seconds=3)


@pytest.mark.parametrize("coordination", ["advisory_lock", "cluster"])
def test_pause_of_the_burst_holder_past_the_takeover(
    chaos: ChaosDeployments, chaos_results: Results, coordination: str
) -> None:
    redis = start_private_redis(chaos)
    dep = chaos(broker=redis.url)
    boot(dep, SCHEDULES, REPLICAS, voltro_beat_coordination=coordination)

    start = window_start()
    instant = next_boundary(now() + timedelta(seconds=2.5), EVERY, timedelta(0))
    held = dep.wait_for_claims(instant, until=instant - timedelta(milliseconds=40))
    name = holder(held)
    victim = dep.beats[name]
    sleep_until(instant - timedelta(milliseconds=30))
    victim.signal(signal.SIGSTOP)
    stopped = now()
    sleep_until(stopped + PAUSE)
    victim.signal(signal.SIGCONT)
    resumed = now()
    end = instant + timedelta(seconds=11)
    outcome = finish(dep, SCHEDULES, start, end)

    row = tally(
        "2. SIGSTOP of the burst holder past the takeover"
        + (", cluster coordination" if coordination == "cluster" else ""),
        outcome,
        accepted=redis_accepted(chaos.workdir),
    )
    burst_keys = keys_at(BURST, instant)
    left = victim.text().count("held past their lease left to recovery")
    row.notes += [
        f"{name} held {len(held[name] & set(burst_keys))} of the {len(BURST)} burst runs"
        f" (others: {', '.join(f'{k} {len(v)}' for k, v in held.items() if k != name) or '-'});"
        f" stopped {(stopped - instant).total_seconds():+.3f}s from the instant for"
        f" {(resumed - stopped).total_seconds():.1f}s (publish timeout"
        f" {PUBLISH_TIMEOUT.total_seconds():g}s)",
        "burst run rows ended with: "
        + ", ".join(f"{k} {v}" for k, v in executions_by_replica(outcome, burst_keys).items()),
        f"{name} logged 'held past their lease left to recovery' {left} time(s)",
    ]
    chaos_results.add(row)
    check(row.problems, f"{name} paused {stopped:%T.%f}..{resumed:%T.%f}")
