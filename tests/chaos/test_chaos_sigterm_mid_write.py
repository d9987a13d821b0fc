"""SIGTERM to the burst's holder in the middle of its broker write, as in a rolling deploy.

Each replica reaches Redis through a :mod:`tcp_proxy` proxy. The proxy of the replica holding
a 2,500-schedule burst (three chunks) holds its first write of the instant: the bytes are on
their way, the replica waits for Redis's reply. The replica then gets SIGTERM, which Celery's
beat handles with its own handler (the scheduler's close(), then ``SystemExit``); then the
held bytes reach Redis. The signal waits until the chunk being written is answered and its
mark is under way, so that chunk is never sent again (second messages 0); the chunks not yet
written stay claimed and another replica sends them once their leases ran out.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
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
)

EVERY = timedelta(seconds=15)
SIZE = 2500
#: How long the write stays held after the signal: the replica is waiting for its reply.
HELD = timedelta(seconds=1.5)


def test_sigterm_to_the_holder_in_the_middle_of_its_write(
    chaos: ChaosDeployments, proxies: ProxyHub, chaos_results: Results
) -> None:
    schedules = burst(SIZE)
    redis = start_private_redis(chaos)
    dep = chaos(broker=redis.url)
    dep.through_proxies(proxies, ("127.0.0.1", redis.port))
    boot(dep, schedules, REPLICAS)

    instant = next_boundary(now() + timedelta(seconds=3), EVERY, timedelta(0))
    # Only the burst is due then: the first replica to write is its holder.
    sleep_until(instant - timedelta(milliseconds=300))
    trap = Trap(LPUSH, Mode.HOLD)
    proxies.arm(trap)
    assert trap.fired.wait(timeout=15), "no replica wrote to the broker after the instant"
    name = trap.fired_by
    assert name is not None
    victim = dep.beats[name]
    victim.signal(signal.SIGTERM)
    signalled = now()
    time.sleep(HELD.total_seconds())
    assert victim.alive(), f"{name} exited with its write unanswered:\n{victim.tail()}"
    proxies.proxies[name].release()
    with contextlib.suppress(subprocess.TimeoutExpired):
        victim.popen.wait(timeout=20)  # it stops on its own once the write is answered
    code = victim.popen.returncode
    victim.stop()
    end = instant + PUBLISH_TIMEOUT * 3
    outcome = finish(dep, schedules, instant, end)

    row = tally(
        "8. SIGTERM to the burst holder in the middle of its write (Celery's handler)",
        outcome,
        accepted=redis_accepted(chaos.workdir),
    )
    burst_keys = keys_at(schedules, instant)
    row.notes += [
        f"{name} held its first write from {(utc(trap.fired_at) - instant).total_seconds():+.3f}s"
        f", got SIGTERM at {(signalled - instant).total_seconds():+.3f}s, the write released"
        f" {HELD.total_seconds():g}s later; it exited with {code}",
        f"second messages: {row.second_messages} (bound: 0, the write under way was marked)",
        "burst run rows ended with: "
        + ", ".join(f"{k} {v}" for k, v in executions_by_replica(outcome, burst_keys).items()),
    ]
    if code is None:
        row.problems.append(f"{name} did not stop within 20 s of its write's answer")
    if row.second_messages:
        row.problems.append(f"{row.second_messages} second messages: a written chunk was unmarked")
    chaos_results.add(row)
    check(row.problems, f"{name} got SIGTERM mid-write at {signalled:%T.%f}")
