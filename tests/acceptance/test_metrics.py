"""Prometheus metrics of three real beat replicas (PostgreSQL, Redis, a worker), scraped over
HTTP while they run: summed over the replicas, each schedule's published and missed counters
equal its rows in the run table.

The schedules fire in the first 25 seconds of each minute only, so that the scrape and the
read of the table happen in a quiet spell, when nothing is in flight between the broker write
and the mark.
"""

from __future__ import annotations

import urllib.request
from collections import Counter
from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families
from vbt_harness import (
    PUBLISHED_OR_LATER,
    REPLICAS,
    Deployments,
    Sched,
    free_port,
    now,
    sleep_until,
)

SCHEDULES = [
    Sched("early-seconds", '"0-24 * * * * *"'),
    Sched("early-2s", '"0-24/2 * * * * *"'),
]
#: Quiet from the 25th second of each minute on; the scrape comes at the 35th.
QUIET_AT = 35


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def per_schedule(scrapes: list[dict], name: str, **labels: str) -> Counter[str]:
    total: Counter[str] = Counter()
    for samples in scrapes:
        for (sample, sample_labels), value in samples.items():
            found = dict(sample_labels)
            if sample == name and all(found.get(k) == v for k, v in labels.items()):
                total[found["schedule"]] += int(value)
    return total


def test_counters_of_three_replicas_match_the_run_table(deployment: Deployments) -> None:
    dep = deployment(store="postgresql", broker="redis")
    dep.configure(SCHEDULES)
    dep.start_worker()
    ports = {name: free_port() for name in REPLICAS}
    for name in REPLICAS:
        dep.beats[name] = dep.procs.start(
            name,
            dep.beat_argv(name),
            env=dep.env(VOLTRO_BEAT_REPLICA=name, VOLTRO_BEAT_METRICS_PORT=str(ports[name])),
            cwd=dep.workdir,
            log=dep.workdir / f"{name}.log",
        )
    dep.wait_ready()

    # The next quiet spell that follows some firing since the replicas started.
    minute = now().replace(second=0, microsecond=0)
    scrape_at = minute + timedelta(seconds=QUIET_AT)
    if now().second >= 20:
        scrape_at += timedelta(minutes=1)
    sleep_until(scrape_at)
    scrapes = [scrape(ports[name]) for name in REPLICAS]
    runs = dep.runs().values()

    published = per_schedule(scrapes, "voltro_beat_occurrences_published_total")
    missed = per_schedule(scrapes, "voltro_beat_occurrences_missed_total")
    for sched in SCHEDULES:
        rows = [r for r in runs if r.schedule == sched.name]
        assert rows, f"{sched.name} never fired"
        assert published[sched.name] == sum(r.status in PUBLISHED_OR_LATER for r in rows)
        assert missed[sched.name] == sum(r.status == "missed" for r in rows)
    claimed = per_schedule(scrapes, "voltro_beat_occurrences_claimed_total")
    assert claimed == published, "every occurrence claimed was published"
    # Each replica won some and lost some to the others.
    for samples in scrapes:
        assert per_schedule([samples], "voltro_beat_occurrences_claimed_total").total() > 0
        assert per_schedule([samples], "voltro_beat_occurrences_lost_total").total() > 0
    # The gauges and histograms are there.
    names = {sample for samples in scrapes for sample, _ in samples}
    for name in (
        "voltro_beat_claim_statement_seconds_count",
        "voltro_beat_publish_lag_seconds_count",
        "voltro_beat_store_errors_total",
        "voltro_beat_broker_errors_total",
        "voltro_beat_clock_offset_seconds",
        "voltro_beat_table_rows",
    ):
        assert name in names, name
    tables = {
        dict(labels)["table"]
        for samples in scrapes
        for (n, labels) in samples
        if n == "voltro_beat_table_rows"
    }
    assert tables == {"_voltro_schedule_claims", "_voltro_schedule_runs", "_voltro_beat_replicas"}
