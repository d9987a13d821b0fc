"""Upkeep between firings: the retention sweep, the health file and the metrics' gauges.

Each runs only while nothing is due soon, so that it never holds an occurrence back.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from voltro_beat import logs, retention
from voltro_beat.clock import Clock
from voltro_beat.config import Settings
from voltro_beat.exceptions import ConfigurationError, StoreError
from voltro_beat.membership import FORGET_AFTER, Membership
from voltro_beat.metrics import Metrics
from voltro_beat.schedules import Entry
from voltro_beat.store import sweeps
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.tables import CLAIMS, RUNS

logger = logging.getLogger(__name__)

#: While the store stays unreachable, the warning is repeated this often (seconds).
STORE_DOWN_REPEAT = 30.0


def policies(settings: Settings, entries: Iterable[Entry]) -> list[retention.Policy]:
    """The retention policies of the framework's tables and the registered ones; raises
    :class:`ConfigurationError` for an entry whose lateness the runs' retention would cut
    short (the run row is the long fence: it must outlive any occurrence still due)."""
    found = retention.resolve(
        [
            retention.Registration(CLAIMS, "claimed_at", settings.claims_ttl, "framework"),
            retention.Registration(RUNS, "scheduled_at", settings.runs_ttl, "framework"),
            *retention.registered(),
        ]
    )
    runs = next(p for p in found if p.table == RUNS)
    bound = (
        "voltro_beat_runs_ttl_hours"
        if runs.kept.source == "framework"
        else f"register_retention(source={runs.kept.source!r})"
    )
    for entry in entries:
        if entry.max_lateness >= runs.ttl:
            raise ConfigurationError(
                f"max_lateness ({entry.max_lateness}) must be shorter than the runs "
                f"retention ({runs.ttl}, {bound})",
                entry=entry.name,
                field="max_lateness",
            )
    return found


@dataclass(slots=True)
class _Sweep:
    """A retention policy being applied: rows older than ``before`` go, a batch at a time."""

    policy: retention.Policy
    before: datetime
    removed: int = 0


class Sweeper:
    """The retention sweep: one replica per slot wins it, and deletes batch by batch."""

    def __init__(
        self, store: BeatStore, membership: Membership, policies: Sequence[retention.Policy]
    ) -> None:
        self._store = store
        self._membership = membership
        self.policies = policies
        #: The sweep this replica won and has not finished, policy by policy.
        self._sweeping: collections.deque[_Sweep] = collections.deque()

    @property
    def busy(self) -> bool:
        """Whether batches of a sweep are left."""
        return bool(self._sweeping)

    def start(self, now: datetime) -> None:
        """Take on the sweep of the slot ``now`` falls in, if this replica wins its claim (one
        replica per slot). A sweep cut short (the replica stopped) is made up by the next
        slot's."""
        at = retention.slot(now)
        if not self._store.claim_job(retention.SWEEP_JOB, at, retention.slot_key(at)):
            logger.debug("voltro_beat: the retention sweep of %s is another replica's", at)
            return
        self._sweeping = collections.deque(_Sweep(p, now - p.ttl) for p in self.policies)
        self._membership.registry.forget(now - FORGET_AFTER)

    def step(self) -> bool:
        """One delete statement of the sweep under way; True if it removed a whole batch
        (the policy has more), False once that policy is done."""
        job = self._sweeping[0]
        policy = job.policy
        try:
            removed = self._store.delete_expired(policy.table, policy.time_column, job.before)
        except ConfigurationError as exc:
            logger.error("voltro_beat: retention of %s not applied: %s", policy.table, exc)
            self._sweeping.popleft()
            return False
        job.removed += removed
        if removed == sweeps.SWEEP_BATCH:
            return True
        self._sweeping.popleft()
        if job.removed:
            logger.info(
                "voltro_beat: retention removed %d rows of %s (%s older than %s)",
                job.removed,
                policy.table,
                policy.time_column,
                job.before.isoformat(),
                extra=logs.fields(count=job.removed),
            )
        return False


class Health:
    """One replica's health: the health file, the metrics' gauges, store outages."""

    def __init__(self, path: str | None, metrics: Metrics, store: BeatStore, clock: Clock):
        self._path = path
        self._metrics = metrics
        self._store = store
        self._clock = clock
        self._warned = False
        #: Since when the store has failed every step (None: it answers).
        self.down_since: datetime | None = None
        #: When the store-down warning was last logged (the clock's monotonic seconds).
        self._down_warned = 0.0

    def store_down(self, exc: StoreError) -> None:
        """A step failed on the store: warn at once, then every STORE_DOWN_REPEAT seconds."""
        self._metrics.store_error()
        # A duration inside this process: the monotonic clock.
        at = self._clock.monotonic()
        if self.down_since is None:
            self.down_since = self._clock.now()
            self._down_warned = at
            logger.warning("voltro_beat: publishing nothing while the store is down: %s", exc)
        elif at - self._down_warned >= STORE_DOWN_REPEAT:
            self._down_warned = at
            logger.warning(
                "voltro_beat: store still down since %s, publishing nothing, retrying: %s",
                self.down_since.isoformat(timespec="seconds"),
                exc,
            )
        else:
            logger.debug("voltro_beat: store still down: %s", exc)

    def store_up(self) -> None:
        """A step went through: say so if the store was down."""
        if self.down_since is not None:
            logger.warning("voltro_beat: store %s is reachable again", self._store.display_url)
            self.down_since = None
            self._metrics.store_up(True)

    def touch(self) -> None:
        """Freshen the health file: done after each heartbeat the store took, so fresh only
        while the loop runs and the replica takes part (deploy/kubernetes/beat.yaml)."""
        if self._path is None:
            return
        try:
            Path(self._path).touch()
        except OSError as exc:
            if not self._warned:
                self._warned = True
                logger.warning("voltro_beat: cannot touch the health file %s: %s", self._path, exc)

    def measure(self) -> None:
        """The gauges: this replica's clock offset and the tables' row estimates."""
        offset = self._clock.offset
        self._metrics.clock_offset(None if offset is None else offset.total_seconds())
        self._metrics.rows(self._store.row_estimates())
