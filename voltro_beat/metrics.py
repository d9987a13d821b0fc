"""Prometheus metrics of a beat replica (the ``metrics`` extra: prometheus-client).

Off unless ``voltro_beat_metrics_port`` is set: then beat serves them on that port from boot
(:meth:`Metrics.serve`), from a registry of its own (never the process's global
one, which the app may use). Every counter is this replica's: sum over replicas for the
cluster. The scheduler and the dispatcher report what happened; while metrics are off every
report is a no-op.

Beat-only: the workers' ledger (started, succeeded, failed) is in the run table, not here
(prefork workers would need prometheus-client's multiprocess mode and a directory shared by
the pool processes).
"""

from __future__ import annotations

import logging
import time
from collections import Counter as Tally
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from voltro_beat.exceptions import ConfigurationError
from voltro_beat.occurrences import Occurrence
from voltro_beat.runs import Run
from voltro_beat.status import Status

logger = logging.getLogger(__name__)

#: Seconds: from a millisecond (one statement on a quiet store) to tens of seconds.
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: Seconds after the instant: on time is well under one; late is up to max_lateness.
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)


class Metrics:
    """One replica's counters; no-ops until :meth:`serve`."""

    def __init__(self) -> None:
        self._on: _Instruments | None = None
        self._server: Any = None
        #: The prometheus-client registry of the instruments, once enabled.
        self.registry: Any = None

    @property
    def enabled(self) -> bool:
        return self._on is not None

    def enable(self) -> None:
        """Count from now on, in a registry of this replica's own."""
        try:
            from prometheus_client import CollectorRegistry
        except ImportError:
            raise ConfigurationError(
                "metrics need prometheus-client: pip install 'voltro-beat[metrics]'",
                field="voltro_beat_metrics_port",
            ) from None

        self.registry = CollectorRegistry()
        self._on = _Instruments(self.registry)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Count, and serve ``/metrics`` on ``port`` (a thread of prometheus-client's own).

        Raises ConfigurationError without the ``metrics`` extra, OSError if the port is taken.
        """
        self.enable()
        from prometheus_client import start_http_server

        self._server, _ = start_http_server(port, addr=addr, registry=self.registry)
        logger.info("voltro_beat: metrics on http://%s:%d/metrics", addr, port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self._server = self._on = self.registry = None

    # -- what the scheduler and the dispatcher report ---------------------------------------

    def recorded(self, batch: Sequence[Run], won: Collection[str]) -> None:
        """A claim statement's answer: what this replica won (to publish, or recorded missed)
        and what another replica had claimed already."""
        if self._on is None:
            return
        claimed: Tally[str] = Tally()
        lost: Tally[str] = Tally()
        missed: Tally[tuple[str, str]] = Tally()
        for run in batch:
            name = run.occurrence.schedule
            if run.occurrence.key not in won:
                lost[name] += 1
            elif run.status == Status.CLAIMED:
                claimed[name] += 1
            elif run.status == Status.MISSED:
                missed[name, run.reason or ""] += 1
        for name, n in claimed.items():
            self._on.claimed.labels(name).inc(n)
        for name, n in lost.items():
            self._on.lost.labels(name).inc(n)
        self._count_missed(missed)

    def missed(self, runs: Sequence[Run]) -> None:
        """Runs this replica recorded missed after they were claimed (past their deadline)."""
        if self._on is not None:
            self._count_missed(Tally((r.occurrence.schedule, r.reason or "") for r in runs))

    def published(self, occurrences: Sequence[Occurrence], at: datetime) -> None:
        """The broker confirmed ``occurrences`` at ``at`` (this replica's clock)."""
        if self._on is None:
            return
        for name, n in Tally(o.schedule for o in occurrences).items():
            self._on.published.labels(name).inc(n)
        for o in occurrences:
            self._on.lag.observe(max(0.0, (at - o.scheduled_at).total_seconds()))

    def republished(self, occurrences: Sequence[Occurrence]) -> None:
        """Runs this replica's recovery sweep took over, to send again."""
        if self._on is not None:
            for name, n in Tally(o.schedule for o in occurrences).items():
                self._on.republished.labels(name).inc(n)

    @contextmanager
    def claim_statement(self) -> Iterator[None]:
        """Time one claim statement."""
        started = time.perf_counter()
        try:
            yield
        finally:
            if self._on is not None:
                self._on.claim_seconds.observe(time.perf_counter() - started)

    def store_error(self) -> None:
        if self._on is not None:
            self._on.store_errors.inc()
            self._on.store_up.set(0)

    def store_up(self, up: bool) -> None:
        """The store answered again (``True``) after errors."""
        if self._on is not None:
            self._on.store_up.set(1 if up else 0)

    def broker_error(self) -> None:
        if self._on is not None:
            self._on.broker_errors.inc()

    def clock_offset(self, seconds: float | None) -> None:
        if self._on is not None and seconds is not None:
            self._on.clock_offset.set(seconds)

    def rows(self, estimates: Mapping[str, int]) -> None:
        if self._on is not None:
            for table, n in estimates.items():
                self._on.rows.labels(table).set(n)

    def shards(
        self, group: str, *, owned: int, unowned: int, taken: int, given: int, lost: int
    ) -> None:
        """Cluster coordination, at a heartbeat: the shards of ``group`` this replica owns,
        those nobody owns, and how many it just took, gave up and lost (its lease ran out)."""
        if self._on is not None:
            self._on.shards_owned.labels(group).set(owned)
            self._on.shards_unowned.labels(group).set(unowned)
            for change, n in (("taken", taken), ("given", given), ("lost", lost)):
                if n:
                    self._on.shard_handoffs.labels(group, change).inc(n)

    def group_unserved(self, group: str, unserved: bool) -> None:
        """At a heartbeat: whether another group, ``group``, has no live replica."""
        if self._on is not None:
            self._on.group_unserved.labels(group).set(int(unserved))

    def _count_missed(self, missed: Mapping[tuple[str, str], int]) -> None:
        assert self._on is not None
        for (name, reason), n in missed.items():
            self._on.missed.labels(name, reason).inc(n)


class _Instruments:
    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        def per_schedule(name: str, doc: str) -> Counter:
            return Counter(f"voltro_beat_occurrences_{name}", doc, ["schedule"], registry=registry)

        self.claimed = per_schedule("claimed", "Occurrences this replica won, to publish.")
        self.lost = per_schedule("lost", "Occurrences another replica had claimed first.")
        self.published = per_schedule("published", "Occurrences the broker confirmed.")
        self.republished = per_schedule(
            "republished", "Runs taken over by this replica's recovery sweep, sent again."
        )
        self.missed = Counter(
            "voltro_beat_occurrences_missed",
            "Runs this replica recorded missed, by reason.",
            ["schedule", "reason"],
            registry=registry,
        )
        self.claim_seconds = Histogram(
            "voltro_beat_claim_statement_seconds",
            "Duration of one claim statement.",
            buckets=CLAIM_BUCKETS,
            registry=registry,
        )
        self.lag = Histogram(
            "voltro_beat_publish_lag_seconds",
            "Broker confirmation minus the occurrence's instant.",
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        self.store_errors = Counter(
            "voltro_beat_store_errors", "Ticks that failed on a store error.", registry=registry
        )
        self.store_up = Gauge(
            "voltro_beat_store_up",
            "1 while this replica's last tick reached the store, 0 while it fails (retrying).",
            registry=registry,
        )
        self.store_up.set(1)
        self.broker_errors = Counter(
            "voltro_beat_broker_errors", "Broker writes that failed.", registry=registry
        )
        self.clock_offset = Gauge(
            "voltro_beat_clock_offset_seconds",
            "This replica's wall clock minus the database's, at its last heartbeat.",
            registry=registry,
        )
        self.shards_owned = Gauge(
            "voltro_beat_shards_owned",
            "Shards of the group this replica owns (cluster coordination).",
            ["group"],
            registry=registry,
        )
        self.shards_unowned = Gauge(
            "voltro_beat_shards_unowned",
            "Shards of the group no replica owns, as this replica saw at its last heartbeat.",
            ["group"],
            registry=registry,
        )
        self.group_unserved = Gauge(
            "voltro_beat_group_unserved",
            "1 while a group of schedules (another than this replica's) has no live replica.",
            ["group"],
            registry=registry,
        )
        self.shard_handoffs = Counter(
            "voltro_beat_shard_handoffs",
            "Shards this replica took, gave up, or lost when its lease ran out.",
            ["group", "change"],
            registry=registry,
        )
        self.rows = Gauge(
            "voltro_beat_table_rows",
            "Rows in each of voltro_beat's tables (the store's cheap estimate).",
            ["table"],
            registry=registry,
        )
