"""The broker stops for 10 s under three running replicas: one scenario, several checks.

The broker is a ``redis-server`` of the test's own (on a free port, with an fsync-always
append-only file, so that a restart loses nothing it had accepted), never the shared one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from vbt_harness import (
    REPLICAS,
    Deployments,
    Outcome,
    Sched,
    check,
    finish,
    keys_in,
    now,
    problems_exactly_once,
    problems_missed_or_once,
    problems_no_duplicates,
    problems_not_before,
    sleep_until,
    start_private_redis,
    wait_until,
    window_start,
)

OUTAGE = timedelta(seconds=10)
#: Late enough for every occurrence of the outage: republished once the broker is back.
PATIENT = Sched("patient", '"* * * * * *"', {"max_lateness": "120"})
#: Shorter than the publish timeout (10 s): a run the broker refused can only become missed.
SHORT = Sched("short", "timedelta(seconds=1)", {"max_lateness": "2"})
MAX_LATENESS = {s.name: s.entry().max_lateness for s in (PATIENT, SHORT)}
HALF = timedelta(milliseconds=500)


@dataclass(frozen=True)
class Scenario:
    outcome: Outcome
    start: datetime
    stopping: datetime
    down: datetime
    starting: datetime
    up: datetime
    end: datetime

    def __str__(self) -> str:
        return (
            f"broker down {self.stopping:%T.%f}..{self.down:%T.%f}, "
            f"up {self.starting:%T.%f}..{self.up:%T.%f}"
        )


@pytest.fixture(scope="module")
def scenario(module_deployment: Deployments) -> Scenario:
    redis = start_private_redis(module_deployment)
    dep = module_deployment(broker=redis.url)
    # The default publish timeout (10 s): a claimed run is republished 10 s after its last try.
    dep.configure([PATIENT, SHORT])
    dep.start_worker()
    dep.start_beats(*REPLICAS)
    dep.wait_ready()

    # Half a second past an occurrence, when no message is on its way to the worker.
    start = window_start()
    sleep_until(start + timedelta(seconds=6) + HALF)
    stopping = now()
    redis.stop()
    down = now()
    sleep_until(stopping + OUTAGE)
    starting = now()
    redis.start()
    up = now()

    # The recovery sweep republishes (or expires) every run the broker refused.
    def settled() -> bool:
        return not [r for r in dep.runs().values() if r.status == "claimed" and r.scheduled_at < up]

    wait_until(settled, timeout=40, interval=0.5)
    end = now() + timedelta(seconds=1)
    outcome = finish(dep, [PATIENT, SHORT], start, end)
    return Scenario(outcome, start, stopping, down, starting, up, end)


def test_broker_down_for_10s_loses_nothing_within_max_lateness(scenario: Scenario) -> None:
    s, outcome = scenario, scenario.outcome
    patient, short = outcome.keys_of(PATIENT.name), outcome.keys_of(SHORT.name)
    assert len(keys_in(patient, s.down, s.starting)) >= 8
    problems = problems_no_duplicates(outcome.executions)
    # Every occurrence inside its max_lateness ran once; those of the outage, with the same
    # task id (checked against uuid5(key)), only after the broker came back.
    problems += problems_exactly_once(patient, outcome.runs, outcome.executions)
    problems += problems_not_before(keys_in(patient, s.down, s.starting), outcome, s.starting)
    problems += problems_exactly_once(
        keys_in(short, s.start, s.stopping - HALF), outcome.runs, outcome.executions
    )
    problems += problems_missed_or_once(
        keys_in(short, s.stopping - HALF, s.end), outcome, {"publish_failed", "late"}
    )
    check(problems, str(s))


def test_broker_down_publishes_nothing_past_max_lateness(scenario: Scenario) -> None:
    """Invariant 6: no occurrence is published later than its max_lateness (give or take the
    half second between the publish and the stamp of ``published_at``)."""
    problems = [
        f"{key}: published {(run.published_at - run.scheduled_at).total_seconds():.2f}s late"
        for key, run in scenario.outcome.runs.items()
        if run.published_at is not None
        and run.published_at - run.scheduled_at > MAX_LATENESS[run.schedule] + HALF
    ]
    check(problems, str(scenario))
