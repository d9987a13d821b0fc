"""Three ``celery beat -S voltro`` replicas and one prefork worker, on each store and broker:
every occurrence of the observed window is published and executed exactly once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
from vbt_harness import (
    EVERY_2S,
    EVERY_MINUTE,
    EVERY_SECOND,
    REPLICAS,
    Deployments,
    check,
    finish,
    problems_exactly_once,
    problems_no_duplicates,
    window_start,
)


@dataclass(frozen=True)
class Variant:
    store: str
    broker: str
    #: Length of the observed window; 62 s always holds a crontab minute boundary.
    seconds: int
    #: Whether the window must contain a crontab occurrence (sanity check of the test).
    needs_minute: bool


VARIANTS = {
    "postgresql-redis-70s": Variant("postgresql", "redis", 62, needs_minute=True),
    "sqlite-redis-30s": Variant("sqlite", "redis", 25, needs_minute=False),
    "postgresql-rabbitmq-30s": Variant("postgresql", "rabbitmq", 25, needs_minute=False),
}


@pytest.mark.parametrize("variant", list(VARIANTS.values()), ids=list(VARIANTS))
def test_three_replicas_publish_every_occurrence_exactly_once(
    deployment: Deployments, variant: Variant
) -> None:
    schedules = [EVERY_SECOND, EVERY_2S, EVERY_MINUTE]
    dep = deployment(store=variant.store, broker=variant.broker)
    dep.configure(schedules)
    dep.start_worker()
    dep.start_beats(*REPLICAS)
    dep.wait_ready()

    start = window_start()
    end = start + timedelta(seconds=variant.seconds)
    outcome = finish(dep, schedules, start, end)

    if variant.needs_minute:
        assert outcome.keys_of(EVERY_MINUTE.name), "the window holds no crontab occurrence"
    assert len(outcome.keys_of(EVERY_SECOND.name)) == variant.seconds
    check(
        problems_exactly_once(outcome.keys, outcome.runs, outcome.executions),
        f"occurrences in [{start:%H:%M:%S}, {end:%H:%M:%S})",
    )
    check(problems_no_duplicates(outcome.executions), "executions")
    winners = {outcome.runs[k].replica for k in outcome.keys}
    assert len(winners) > 1, f"one replica won every occurrence: {winners}"
    assert winners <= set(REPLICAS)
