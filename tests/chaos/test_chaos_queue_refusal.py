"""A RabbitMQ queue that refuses messages in the middle of a burst.

The deployment's queue gets a policy (``rabbitmqctl set_policy``, as an operator would set it)
of ``max-length`` 300 with ``overflow: reject-publish``, and its worker is stopped: of a
1,000-schedule burst the broker takes 300 and nacks the rest (publisher confirms). Each
delivery tag counts: the 300 taken are marked and never sent again; the refused ones are not
marked, their leases end at once and recovery tries them again (refused again while the queue
is full). Then the policy is cleared and the worker started: every refused run goes out once,
within its lateness. Nothing is lost, nothing runs twice, no second message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from chaos_harness import (
    PUBLISH_TIMEOUT,
    ChaosDeployment,
    ChaosDeployments,
    Results,
    boot,
    burst,
    republished,
    tally,
)
from vbt_harness import (
    REPLICAS,
    check,
    finish,
    next_boundary,
    now,
    require_binary,
    run_checked,
    sleep_until,
)

EVERY = timedelta(seconds=15)
SIZE = 1000
ROOM = 300


@pytest.fixture
def full_queue() -> Iterator[list[str]]:
    """Set a reject-publish length limit on a queue by name; cleared afterwards."""
    require_binary("rabbitmqctl")
    names: list[str] = []
    yield names
    for name in names:
        run_checked(["rabbitmqctl", "-q", "clear_policy", name])


def limit(full_queue: list[str], queue: str) -> None:
    definition = json.dumps({"max-length": ROOM, "overflow": "reject-publish"})
    run_checked(
        ["rabbitmqctl", "-q", "set_policy", "--apply-to", "queues", queue, f"^{queue}$", definition]
    )
    full_queue.append(queue)


def refused_rows(dep: ChaosDeployment) -> int:
    with psycopg.connect(dep.libpq_store, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT count(*) FROM _voltro_schedule_runs WHERE status = 'claimed' AND error LIKE %s",
            ("%basic.nack%",),
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_queue_refusing_messages_mid_burst(
    chaos: ChaosDeployments, chaos_results: Results, full_queue: list[str]
) -> None:
    schedules = burst(SIZE)
    dep = chaos(broker="rabbitmq")
    boot(dep, schedules, REPLICAS)
    assert dep.worker is not None
    # Stop the worker and limit the queue between two bursts, the worker done with the one
    # before: a burst between the limit and the measured one would fill the queue first (the
    # CI-mode run of 2026-12-06 counted 1,700 refused runs, two bursts' worth).
    stopped = next_boundary(now(), EVERY, timedelta(seconds=4))
    sleep_until(stopped)
    dep.worker.stop()
    limit(full_queue, dep.queue)

    instant = next_boundary(now() + timedelta(seconds=3), EVERY, timedelta(0))
    assert instant - EVERY < stopped, "stopping the worker and limiting the queue took 8 s"
    # The burst meets the full queue; recovery tries the refused runs again meanwhile.
    sleep_until(instant + PUBLISH_TIMEOUT * 1.5)
    waiting = refused_rows(dep)
    queued = dep.queue_length()
    run_checked(["rabbitmqctl", "-q", "clear_policy", dep.queue])
    full_queue.remove(dep.queue)
    dep.start_worker()
    end = instant + PUBLISH_TIMEOUT * 3  # before the next burst
    outcome = finish(dep, schedules, instant, end)

    row = tally("10. a RabbitMQ queue refusing messages mid-burst (reject-publish)", outcome)
    row.notes += [
        f"queue limited to {ROOM} messages, worker stopped: {queued} queued and {waiting}"
        f" runs refused (claimed, the broker's nack noted) at"
        f" +{(PUBLISH_TIMEOUT * 1.5).total_seconds():g}s; then the limit cleared and the"
        " worker started",
        f"second messages: {row.second_messages} (bound: 0)",
        "recovery republish attempts (beat logs): "
        + ", ".join(f"{k} {v}" for k, v in republished(dep).items()),
    ]
    if queued != ROOM:
        row.problems.append(f"{queued} messages queued while the limit was {ROOM}")
    if waiting != SIZE - ROOM:
        row.problems.append(f"{waiting} runs waiting as refused, not {SIZE - ROOM}")
    if row.second_messages:
        row.problems.append(f"{row.second_messages} second messages")
    chaos_results.add(row)
    check(row.problems, f"queue {dep.queue} full from {instant:%T}")
