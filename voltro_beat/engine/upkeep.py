"""Upkeep between firings: recovery sweeps, the retention sweep, the health file, the
metrics' gauges and the message templates.

Each runs only while nothing is due soon, so that it never holds an occurrence back (a
recovery sweep, a step at a time: it republishes what is already late).
"""

from __future__ import annotations

import collections
import heapq
import logging
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from voltro_beat import logs, retention
from voltro_beat.clock import Clock
from voltro_beat.config import Settings
from voltro_beat.dispatch import Dispatcher
from voltro_beat.engine import recovery
from voltro_beat.engine.timeline import Pending
from voltro_beat.exceptions import ConfigurationError, StoreError
from voltro_beat.membership import FORGET_AFTER, Membership
from voltro_beat.metrics import Metrics
from voltro_beat.publisher import Publisher
from voltro_beat.schedules import Entry
from voltro_beat.store import sweeps
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.tables import CLAIMS, RUNS

logger = logging.getLogger(__name__)

#: While the store stays unreachable, the warning is repeated this often (seconds).
STORE_DOWN_REPEAT = 30.0
#: How often the metrics' gauges (clock offset, table sizes) are read, when metrics are on.
MEASURE_EVERY = timedelta(seconds=15)
#: The longest a step spends building message templates (seconds): the rest waits for the
#: next steps, which come at once. Built all in one step, 100,000 templates hold beat's loop
#: (its first tick: beat's "ready") for ten seconds or more.
PREPARE_SLICE = 0.05
#: A schedule's message template is built once its first occurrence is this close (and kept):
#: a replica holding 100,000 schedules of which few are due soon builds few of them, and
#: spends neither the CPU nor the memory on the rest until their day comes.
PREPARE_AHEAD = timedelta(minutes=10)
#: A time every clock reading is after: what is due "at" it is due at once.
LONG_AGO = datetime.min.replace(tzinfo=UTC)


class Upkeep:
    """A step's upkeep, once what is due went out: each part when its time has come, and
    only while ``room()`` says nothing is due soon where it could take long."""

    def __init__(
        self,
        *,
        settings: Settings,
        entries: Mapping[str, Entry],
        store: BeatStore,
        dispatch: Dispatcher,
        publisher: Publisher,
        membership: Membership,
        clock: Clock,
        metrics: Metrics,
    ) -> None:
        self._entries = entries
        self._store = store
        self._dispatch = dispatch
        self._publisher = publisher
        self._membership = membership
        self._clock = clock
        self._metrics = metrics
        self.sweeper = Sweeper(store, membership, policies(settings, entries.values()))
        self.health = Health(settings.health_file, metrics, store, clock)
        self.next_recovery = LONG_AGO
        self.next_retention = LONG_AGO
        self._next_measure = LONG_AGO
        #: Schedules whose message templates are not built yet, by their first instant,
        #: soonest first.
        self._unprepared: collections.deque[tuple[datetime, Pending]] = collections.deque()

    def prepare(self, pending: Sequence[Pending]) -> None:
        """Build the message templates of ``pending``'s schedules (at boot, or of a shard
        taken over; soonest first) as their first instant comes within PREPARE_AHEAD and room
        allows: at 100,000 schedules building them all takes seconds, and done at boot it
        would hold the first occurrences back."""
        if not pending:
            return  # (a heartbeat that took no shard over: the queue stays as it is)
        firsts = [(p.instants[0], p) for p in pending]
        if self._unprepared:  # (at boot it is empty: no merge of 100,000)
            firsts = list(heapq.merge(self._unprepared, firsts, key=operator.itemgetter(0)))
        self._unprepared = collections.deque(firsts)

    def run(self, room: Callable[[], bool]) -> None:
        clock = self._clock
        if clock.now() >= self.next_recovery:
            going = self.recover()
            self.next_recovery = clock.now() + (timedelta(0) if going else self._dispatch.lease / 2)
        if clock.now() >= self.next_retention:
            now = clock.now()
            self.sweeper.start(now)
            self.next_retention = retention.slot(now) + retention.SWEEP_EVERY
        while self.sweeper.busy and room():
            if self.sweeper.step():
                break  # the step returns between whole batches: a long sweep holds back nothing
        if self._metrics.enabled and clock.now() >= self._next_measure:
            self.health.measure()
            self._next_measure = clock.now() + MEASURE_EVERY
        self.health.store_up()
        # One template at a time: on a loaded host a batch could run into a claim.
        until = clock.monotonic() + PREPARE_SLICE
        while self._to_prepare(clock.now()) and room():
            _, pending = self._unprepared.popleft()
            entry = pending.entry
            # A definition changed since (its pending ended, replaced by the new one's) is
            # not built: its template would be kept under the schedule's name.
            if pending.live and self._entries.get(entry.name) is entry:
                self._publisher.prepare([entry])
            if clock.monotonic() >= until:
                break

    def _to_prepare(self, now: datetime) -> bool:
        """Whether the next template to build is due (PREPARE_AHEAD)."""
        return bool(self._unprepared) and self._unprepared[0][0] - PREPARE_AHEAD <= now

    def wake(self, now: datetime, room: bool) -> datetime:
        """When upkeep next wants a step (``room``: whether it may run at ``now``)."""
        if (self.sweeper.busy or self._to_prepare(now)) and room:
            return now  # the next batch of the retention sweep, the next templates
        wake = min(self.next_recovery, self.next_retention)
        if self._unprepared and not self._to_prepare(now):
            wake = min(wake, self._unprepared[0][0] - PREPARE_AHEAD)
        return wake

    def recover(self) -> bool:
        """A recovery sweep's slice (:mod:`voltro_beat.engine.recovery`); returns whether the
        sweep goes on at the next step."""
        if self._dispatch.halted:  # close() was asked for in the middle of this step
            return False
        return recovery.recover(
            self._store, self._dispatch, self._membership, self._entries.keys(), self._metrics
        )

    def store_down(self, exc: StoreError) -> None:
        """A step failed on the store. Runs published just before the outage may still be
        unmarked by their owners (this replica's wait in its dispatcher): every owner gets a
        full lease with the store back before a recovery sweep of this replica republishes a
        run it did publish."""
        lease = self._dispatch.lease
        self.next_recovery = max(self.next_recovery, self._clock.now() + lease)
        self.health.store_down(exc)


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
