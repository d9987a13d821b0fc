"""The ``celery.beat.Scheduler`` subclass behind ``celery beat -S voltro``: glue and timing.

Each tick sends the occurrences due within the claim lead through the coordination gate (one
statement), keeps the ones this replica won until their instant, then publishes them: per
chunk, the publish fence (a statement confirming in the store that this replica still holds
them), the broker write, and the mark. Claiming ahead leaves only that for the instant itself,
so a burst of ten thousand schedules reaches the broker within a fraction of a second of its
boundary. Schedules with an overlap policy are claimed at their instant, when their
predecessor's state is known. "Now" is the database's clock (:mod:`voltro_beat.clock`). Store
errors fail closed: nothing is published, the occurrences stay due and are tried again next
tick while they are within ``max_lateness``. Nothing escapes :meth:`tick`.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

from celery import beat

from voltro_beat import catchup, dispatch, logs, overlap, retention
from voltro_beat.clock import Clock, ClockMode
from voltro_beat.config import Settings
from voltro_beat.dispatch import Dispatcher, Fenced
from voltro_beat.exceptions import ConfigurationError, StoreError
from voltro_beat.membership import FORGET_AFTER, Membership
from voltro_beat.metrics import Metrics
from voltro_beat.occurrences import Occurrence, next_after
from voltro_beat.publisher import Publisher
from voltro_beat.schedules import Entry, cadence, parse_entries
from voltro_beat.status import Reason, Status
from voltro_beat.store import beat as store_beat
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.database import Database
from voltro_beat.store.registry import Registry
from voltro_beat.store.tables import CLAIMS, RUNS

logger = logging.getLogger(__name__)

#: Seconds between attempts while the store is unreachable.
RETRY_DELAY = 1.0
#: While the store stays unreachable, the warning is repeated this often (seconds).
STORE_DOWN_REPEAT = 30.0
#: The exit status of a beat whose store can never work (sysexits.h's EX_CONFIG).
EX_CONFIG = 78
#: Occurrences per claim statement: a tick claims everything due in one round trip up to this.
BATCH = 100_000
#: How far ahead of its instant an occurrence is claimed: LEAD_MIN, plus CLAIM_COST per
#: schedule, so that a burst of every schedule at once is claimed before its boundary.
#: CLAIM_COST leaves room for three replicas claiming one burst on two cores (the burst
#: workload of bench/README.md).
LEAD_MIN = timedelta(milliseconds=250)
CLAIM_COST = timedelta(microseconds=300)
LEAD_MAX = timedelta(seconds=30)
#: At close, occurrences claimed ahead and due within this long are published on time; later
#: ones are left to another replica's recovery sweep (``publish_timeout`` after their instant).
CLOSE_WAIT = timedelta(seconds=3)
#: Occurrences of one schedule handled per tick when it is behind (after a pause or outage).
MAX_BACKLOG = 1000
#: How long a live run blocks the next one of a ``skip`` / ``queue`` schedule by default.
DEFAULT_OVERLAP_TIMEOUT = timedelta(hours=1)
#: Seconds between checks for queued runs whose predecessor finished.
QUEUE_POLL = timedelta(seconds=1)
#: Message templates are built, and retention batches deleted, only while the next
#: occurrence is at least this far away.
PREPARE_MARGIN = timedelta(milliseconds=200)
#: How often the metrics' gauges (clock offset, table sizes) are read, when metrics are on.
MEASURE_EVERY = timedelta(seconds=15)


@dataclass(slots=True)
class _Sweep:
    """A retention policy being applied: rows older than ``before`` go, a batch per tick."""

    policy: retention.Policy
    before: datetime
    removed: int = 0


@dataclass(slots=True)
class _Due:
    """A schedule in the heap: the occurrences it has to record next, oldest first."""

    entry: Entry
    pending: list[datetime]

    def advance(self, now: datetime) -> None:
        """Move past the occurrences just recorded: on to those due by ``now``, or the next."""
        pending: list[datetime] = []
        at = next_after(self.entry.spec, self.pending[-1])
        while at is not None and at <= now and len(pending) < MAX_BACKLOG:
            pending.append(at)
            at = next_after(self.entry.spec, at)
        if not pending and at is not None:
            pending.append(at)
        self.pending = pending


class VoltroScheduler(beat.Scheduler):
    """Active-active beat scheduler: every occurrence claimed in the store, published once."""

    _settings: Settings
    _entries: dict[str, Entry]
    #: Per schedule: claims older than this much before a won occurrence are pruned.
    _graces: dict[str, timedelta]
    #: Per ``skip`` / ``queue`` schedule: how long a live run blocks the next one.
    _overlap_timeouts: dict[str, timedelta]
    _queue_policy: list[str]
    _store: BeatStore
    _retention: list[retention.Policy]
    _publisher: Publisher
    _dispatch: Dispatcher
    _clock: Clock
    _membership: Membership
    #: What writes won occurrences to the broker (voltro_beat.testing records them instead).
    publisher_class: type[Publisher] = Publisher

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self._configured = False
        self._closed = False
        self._booted = False
        #: Schedules by the time their next occurrences are to be claimed.
        self._queue: list[tuple[datetime, int, _Due]] = []
        #: Occurrences this replica won, by instant: fenced shortly before it, published at it.
        self._ready: list[tuple[datetime, str, Occurrence]] = []
        #: Fenced chunks, oldest instant first: published when their instant comes.
        self._armed: collections.deque[Fenced] = collections.deque()
        self._lead = LEAD_MIN
        self._seq = itertools.count()
        self._store_down_since: datetime | None = None
        #: When the store-down warning was last logged (time.monotonic()).
        self._store_down_warned = 0.0
        #: The entries Celery's ``install_default_entries`` adds (see ``update_from_dict``).
        self._default_entries: dict[str, Mapping[str, Any]] = {}
        #: Heap items whose message templates are not built yet, soonest first.
        self._unprepared: collections.deque[tuple[datetime, int, _Due]] = collections.deque()
        self._next_recovery = datetime.min.replace(tzinfo=UTC)
        self._next_retention = datetime.min.replace(tzinfo=UTC)
        #: The retention sweep this replica won and has not finished, policy by policy.
        self._sweeping: collections.deque[_Sweep] = collections.deque()
        self._next_heartbeat = datetime.min.replace(tzinfo=UTC)
        self._next_measure = datetime.min.replace(tzinfo=UTC)
        self._metrics = Metrics()
        self._health_file_warned = False
        # Celery builds a lazy instance for the banner: it must do no I/O.
        super().__init__(app, *args, **kwargs)

    # -- set-up ---------------------------------------------------------------------------

    def setup_schedule(self) -> None:
        """Parse settings and entries (raising ConfigurationError at boot), open the store
        and try it once (exiting if no retry can help it).

        A store that is down (or restarting) is not waited for: the first tick upgrades the
        schema and catches up, and retries both while the store is unreachable.
        """
        self._configure()
        if self._settings.log_json:
            logs.use_json()
        if self._settings.metrics_port is not None:
            self._serve_metrics(self._settings.metrics_port)
        logger.info(
            "voltro_beat: replica %s, store %s, coordination %s, %s",
            self._settings.replica,
            self._store.display_url,
            self._settings.coordination,
            self._schedules_counted(),
            extra=logs.fields(replica=self._settings.replica),
        )
        for warning, line in retention.announce(self._retention):
            (logger.warning if warning else logger.info)("%s", line)
        self._try_store()

    def _try_store(self) -> None:
        """Exit (EX_CONFIG) on a store error no retry cures: a wrong password, an unknown
        database, host or role, a missing grant (with migrate, the schema upgrade is tried
        too). Any other error is left to the first tick's fail-closed retry."""
        database = self._store.database
        try:
            if self._settings.migrate:
                database.upgrade()
            else:
                database.probe()
        except StoreError as exc:
            if exc.check is None:
                return
            logger.error("voltro_beat: cannot use the store, exiting: %s; check %s", exc, exc.check)
            self.close()
            raise SystemExit(EX_CONFIG) from None

    def _configure(self) -> None:
        if self._configured:
            return
        settings = Settings.from_config(self.app.conf)
        entries = parse_entries(
            self._beat_schedule(), tz=settings.timezone, max_lateness=settings.max_lateness
        )
        policies = retention.resolve(
            [
                retention.Registration(CLAIMS, "claimed_at", settings.claims_ttl, "framework"),
                retention.Registration(RUNS, "scheduled_at", settings.runs_ttl, "framework"),
                *retention.registered(),
            ]
        )
        runs_policy = next(p for p in policies if p.table == RUNS)
        bound = (
            "voltro_beat_runs_ttl_hours"
            if runs_policy.kept.source == "framework"
            else f"register_retention(source={runs_policy.kept.source!r})"
        )
        for entry in entries:
            if entry.max_lateness >= runs_policy.ttl:
                # The run row is the long fence: it must outlive any occurrence still due.
                raise ConfigurationError(
                    f"max_lateness ({entry.max_lateness}) must be shorter than the runs "
                    f"retention ({runs_policy.ttl}, {bound})",
                    entry=entry.name,
                    field="max_lateness",
                )
        database = Database.open(settings.store_url)
        store = BeatStore(database, replica=settings.replica)
        self._settings = settings
        self._retention = policies
        self._entries = {entry.name: entry for entry in entries}
        self._graces = {
            entry.name: grace for entry in entries if (grace := _grace(entry)) is not None
        }
        self._overlap_timeouts = {
            entry.name: self._overlap_timeout(entry)
            for entry in entries
            if entry.on_overlap != "allow"
        }
        self._queue_policy = [entry.name for entry in entries if entry.on_overlap == "queue"]
        ahead = len(entries) - len(self._overlap_timeouts)
        self._lead = min(LEAD_MAX, LEAD_MIN + CLAIM_COST * ahead)
        self._store = store
        if database.dialect == "postgresql":
            self._clock = Clock(settings.clock or ClockMode.DATABASE)
        else:  # one host: SQLite's clock is the local one
            self._clock = Clock(ClockMode.LOCAL, local=lambda: database.clock())
        self._membership = Membership(
            Registry(database), self._clock, settings, self._entries, version("voltro-beat")
        )
        self._publisher = self.publisher_class(self.app, write_timeout=self._write_timeout)
        self._dispatch = Dispatcher(
            store, self._publisher, self._entries, self._lease, self._clock, self._metrics
        )
        self._configured = True

    def _overlap_timeout(self, entry: Entry) -> timedelta:
        """The entry's own, else the task's hard time limit, else one hour."""
        if entry.overlap_timeout is not None:
            return entry.overlap_timeout
        task = self.app.tasks.get(entry.task)
        limit = getattr(task, "time_limit", None) or self.app.conf.task_time_limit
        return timedelta(seconds=limit) if limit else DEFAULT_OVERLAP_TIMEOUT

    def _beat_schedule(self) -> Mapping[str, Mapping[str, Any]]:
        """The app's ``beat_schedule`` plus the entries Celery's own beat adds to it."""
        schedule = dict(self.app.conf.beat_schedule or {})
        self.install_default_entries(schedule)
        return {**self._default_entries, **schedule}

    def update_from_dict(self, dict_: Mapping[str, Mapping[str, Any]]) -> None:
        """Where Celery's ``install_default_entries`` hands its entries (``backend_cleanup``
        when results need cleaning up): kept as entries like the app's own."""
        self._default_entries.update(dict_)

    @property
    def info(self) -> str:
        """The banner's scheduler line (built without I/O)."""
        self._configure()
        return (
            f"voltro_beat: store {self._store.display_url}, "
            f"coordination {self._settings.coordination}, clock {self._clock.mode}, "
            f"replica {self._settings.replica}, {self._schedules_counted()}"
        )

    def _schedules_counted(self) -> str:
        """The app's schedules, counted as its ``beat_schedule`` lists them; the entries
        Celery adds (``celery.backend_cleanup``) named apart."""
        own = len(self._entries) - len(self._default_entries)
        added = ", ".join(sorted(self._default_entries))
        return f"{own} schedules" + (f" (and Celery's {added})" if added else "")

    # -- the loop -------------------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Record and publish what is due; return the seconds to sleep. Never raises."""
        if self._closed:
            return float(self.max_interval)
        try:
            return self._tick()
        except StoreError as exc:
            self._on_store_error(exc)
            return RETRY_DELAY
        except Exception:
            logger.exception("voltro_beat: unexpected error in tick; retrying")
            return RETRY_DELAY

    def _tick(self) -> float:
        clock = self._clock
        self._dispatch.flush()
        if not self._booted:
            self._boot()
        # What is due first (the heartbeat before claims: it says which schedules are
        # yielded to a newer replica); the rest of the tick is upkeep.
        self._publish_ready()
        if clock.now() >= self._next_heartbeat:
            if self._membership.beat():
                self._requeue()
            self._touch_health_file()
            self._next_heartbeat = clock.now() + self._membership.interval
        self._fire_due(clock.now())
        self._publish_ready()
        if self._queue_policy:
            self._promote_queued(clock.now())
        if clock.now() >= self._next_recovery:
            self._recover()
            self._next_recovery = clock.now() + self._lease / 2
        if clock.now() >= self._next_retention:
            now = clock.now()
            self._sweep(now)
            self._next_retention = retention.slot(now) + retention.SWEEP_EVERY
        if self._sweeping:
            self._sweep_batch()
        if self._metrics.enabled and clock.now() >= self._next_measure:
            self._measure()
            self._next_measure = clock.now() + MEASURE_EVERY
        if self._store_down_since is not None:
            logger.warning("voltro_beat: store %s is reachable again", self._store.display_url)
            self._store_down_since = None
            self._metrics.store_up(True)
        if self._unprepared:
            self._prepare_messages()
        return self._delay(clock.now())

    def _prepare_messages(self) -> None:
        """Build message templates, soonest schedules first, while nothing is due.

        At 100,000 schedules building them all takes minutes: done at boot it would hold the
        first occurrences back, so it runs in the idle time between ticks instead.
        """
        # One at a time: a template costs little, but on a loaded host a batch of them could
        # run into the next claim.
        while self._unprepared:
            if self._next_wake() - self._clock.now() < PREPARE_MARGIN:
                return
            self._publisher.prepare([self._unprepared.popleft()[2].entry])

    def _boot(self) -> None:
        """Upgrade the schema, join the registry (a first reading of the database's clock),
        record catch-up per entry, and fill the heap."""
        if self._settings.migrate:
            self._store.database.upgrade()
        self._membership.join()
        self._next_heartbeat = self._clock.now() + self._membership.interval
        now = self._clock.now()
        # An external entry is fired by `voltro-beat trigger` alone: no timer, no catch-up
        # (its untriggered occurrences stay gaps in the ledger).
        entries = [e for e in self._entries.values() if e.trigger == "beat"]
        last = self._store.last_scheduled([e.name for e in entries])
        backfill: list[Occurrence] = []
        for entry in entries:
            plan = catchup.plan(entry, last.get(entry.name), now, on_time=self._lease)
            backfill += plan.occurrences
            if plan.unrecorded_until is not None:
                logger.warning(
                    "voltro_beat: %s: occurrences at or before %s are beyond the catch-up cap "
                    "(%d per schedule) and are not recorded",
                    entry.name,
                    plan.unrecorded_until.isoformat(),
                    catchup.MAX_BACKFILL,
                    extra=logs.fields(schedule=entry.name),
                )
        self._record(backfill, now)
        for entry in entries:
            first = next_after(entry.spec, now)
            if first is not None:
                self._push(_Due(entry, [first]))
        self._booted = True
        self._unprepared = collections.deque(sorted(self._queue))

    def _publish_ready(self) -> None:
        """Fence the occurrences won ahead whose instant is near, and publish those whose
        instant has come.

        The fence comes half a claim lead before the instant, so that at the instant only the
        broker writes and the marks are left; an occurrence the fence no longer finds this
        replica's (its lease ran out while this process was paused, another replica took it
        over) is not sent. If the broker fails, what is left of the instant stays ``claimed``
        and goes to recovery once its lease runs out.
        """
        fence_until = self._clock.now() + self._fence_lead
        while self._ready and self._ready[0][0] <= fence_until:
            at = self._ready[0][0]
            chunk: list[Occurrence] = []
            while len(chunk) < dispatch.CHUNK and self._ready and self._ready[0][0] == at:
                chunk.append(heapq.heappop(self._ready)[2])
            self._armed.append(self._dispatch.fence(chunk))
        due: list[Fenced] = []
        while self._armed and self._dispatch.until(self._armed[0]) <= timedelta(0):
            due.append(self._armed.popleft())
        if due and not self._dispatch.deliver(due):
            self._armed = collections.deque(
                a for a in self._armed if self._dispatch.until(a) > timedelta(0)
            )

    def _fire_due(self, now: datetime) -> None:
        """Claim the occurrences whose claim time has come (their instant minus the lead).

        A schedule whose changed definition fires on a more recently started replica is not
        claimed here while that replica lives; its entries come up a lease after their
        instant, so that they are claimed late if it died meanwhile (the registry no longer
        counts it), and recorded ``missed`` (reason ``yielded``) through the gate if the
        registry still counts it live: it would have claimed them long before, so it died or
        hangs, and this replica's older definition is not the one to send. If it did claim
        them, the gate finds their rows and records nothing.
        """
        due: list[_Due] = []
        while self._queue and self._queue[0][0] <= now:
            due.append(heapq.heappop(self._queue)[2])
        if not due:
            return
        yielded = self._membership.yielded
        try:
            self._record(
                [
                    self._occurrence(d.entry, at, now)
                    if d.entry.name not in yielded
                    else Occurrence.of(
                        d.entry.name, d.entry.task, at, Status.MISSED, Reason.YIELDED
                    )
                    for d in due
                    for at in d.pending
                ],
                now,
            )
            for d in due:
                d.advance(now)
        finally:
            # On a store error the occurrences stay due and are tried again next tick.
            for d in due:
                if d.pending:
                    self._push(d)

    def _apply_overlap(self, occurrences: list[Occurrence], now: datetime) -> list[Occurrence]:
        """Turn occurrences of ``skip`` / ``queue`` schedules with a live predecessor into
        ``skipped`` / ``queued`` rows."""
        guarded = sorted({o.schedule for o in occurrences if o.schedule in self._overlap_timeouts})
        if not guarded:
            return occurrences
        views = self._live_views(guarded, now)
        decided = []
        for o in sorted(occurrences, key=lambda o: o.scheduled_at):
            entry = self._entries[o.schedule]
            if entry.on_overlap == "allow" or o.status != Status.CLAIMED:
                decided.append(o)
                continue
            status, reason = overlap.decide(entry.on_overlap, o.scheduled_at, views[o.schedule])
            if status == Status.CLAIMED:
                # Whatever of this schedule follows in the same tick waits behind this one.
                run = replace(o, since=now)
                views[o.schedule] = overlap.with_claimed(views[o.schedule], run)
            decided.append(replace(o, status=status, reason=reason))
        return decided

    def _live_views(self, names: list[str], now: datetime) -> dict[str, overlap.View]:
        """Each schedule's live runs; stale ones are marked in their rows on the way."""
        since = now - max(self._live_window(n) for n in names)
        live: dict[str, list[Occurrence]] = {name: [] for name in names}
        for run in self._store.live_runs(names, since=since):
            live[run.schedule].append(run)
        views = {
            name: overlap.view(runs, now=now, timeout=self._overlap_timeouts[name])
            for name, runs in live.items()
        }
        stale = [run.key for v in views.values() for run in v.stale]
        if stale:
            self._store.note_overlap_timeout(stale)
        return views

    def _live_window(self, name: str) -> timedelta:
        """How far back the live runs of a ``skip`` / ``queue`` schedule can be scheduled.

        A run blocks for the overlap timeout counted from its start, which is soon after its
        instant, unless it waited in a ``queue`` backlog: that reaches back ``max_lateness``.
        A run outside this window is not seen at all: the next one would be promoted while it
        runs, and a queued one would be neither promoted nor recorded missed.
        """
        window = self._overlap_timeouts[name] * 2
        entry = self._entries[name]
        return window + entry.max_lateness if entry.on_overlap == "queue" else window

    def _promote_queued(self, now: datetime) -> None:
        """Publish the oldest queued run of each ``queue`` schedule whose predecessor ended."""
        views = self._live_views(self._queue_policy, now)
        for name, view in views.items():
            run = overlap.next_to_promote(view)
            if run is None:
                continue
            entry = self._entries[name]
            if now - run.scheduled_at > entry.max_lateness:
                self._store.mark_missed([run.key], reason=Reason.LATE, waiting=Status.QUEUED)
                self._metrics.missed([replace(run, status=Status.MISSED, reason=Reason.LATE)])
            elif self._store.promote(run.key, lease=self._lease):
                self._dispatch.send([run])

    def _occurrence(self, entry: Entry, at: datetime, now: datetime) -> Occurrence:
        """The occurrence of ``entry`` at ``at`` to record now: ``claimed`` until its
        deadline, ``missed`` after it (guarantee 6)."""
        deadline = at + entry.max_lateness
        if now <= deadline:
            return Occurrence.of(entry.name, entry.task, at, deadline=deadline)
        down = self._store_down_since
        reason = (
            Reason.STORE_DOWN
            if down is not None and at >= down - entry.max_lateness
            else Reason.LATE
        )
        return Occurrence.of(entry.name, entry.task, at, Status.MISSED, reason)

    def _record(self, occurrences: list[Occurrence], now: datetime) -> None:
        """Send ``occurrences`` through the gate; keep the ones won for their instant."""
        # Sorted by key, every replica locks the keys in the same order: no deadlock between
        # claim statements.
        occurrences = sorted(self._apply_overlap(occurrences, now), key=lambda o: o.key)
        recorded: dict[tuple[str, str, str | None], list[datetime]] = collections.defaultdict(list)
        for i in range(0, len(occurrences), BATCH):
            batch = occurrences[i : i + BATCH]
            with self._metrics.claim_statement():
                won = self._store.claim(
                    batch,
                    coordination=self._settings.coordination,
                    lease=self._lease,
                    prune=self._graces,
                )
            self._metrics.recorded(batch, won)
            lost = len(batch) - len(won)
            if lost:
                logger.debug(
                    "voltro_beat: %d occurrences claimed by other replicas",
                    lost,
                    extra=logs.fields(count=lost),
                )
            for o in batch:
                if o.key not in won:
                    continue
                if o.status == Status.CLAIMED:
                    heapq.heappush(self._ready, (o.scheduled_at, o.key, o))
                else:
                    logger.debug(
                        "voltro_beat: %s recorded %s (%s)",
                        o.key,
                        o.status,
                        o.reason,
                        extra=logs.fields(
                            key=o.key, schedule=o.schedule, status=o.status, reason=o.reason
                        ),
                    )
                    recorded[o.schedule, o.status, o.reason].append(o.scheduled_at)
        # One line per schedule and fate (a catch-up after a long downtime records hundreds).
        for (name, status, reason), instants in sorted(recorded.items()):
            entry = self._entries[name]
            policy = (
                f"catch_up={entry.catch_up}"
                if reason == Reason.CATCH_UP
                else f"on_overlap={entry.on_overlap}"
                if reason == Reason.OVERLAP or status == Status.QUEUED
                else f"max_lateness={entry.max_lateness.total_seconds():g}s"
            )
            window = (
                instants[0].isoformat()
                if len(instants) == 1
                else f"{min(instants).isoformat()} .. {max(instants).isoformat()}"
            )
            logger.info(
                "voltro_beat: %s: %d %s recorded %s (%s), %s; %s",
                name,
                len(instants),
                "occurrence" if len(instants) == 1 else "occurrences",
                status,
                reason,
                window,
                policy,
                extra=logs.fields(schedule=name, count=len(instants), status=status, reason=reason),
            )

    # -- maintenance ----------------------------------------------------------------------

    def _recover(self) -> None:
        """Record runs left ``claimed`` past their deadline as missed, and take over and
        republish the others whose lease ran out (crashed or paused replica, broker outage);
        first, record as published the runs a replica marked and stopped before settling.

        A chunk at a time, each leased when taken; chunks follow one another for at most half
        a lease, or until the broker fails.
        """
        if self._closed:  # close() ran from Celery's SIGTERM handler in the middle of this tick
            return
        settled = self._store.settle_abandoned(after=self._lease)
        if settled:
            logger.info(
                "voltro_beat: %d sent runs recorded published (their replica stopped between "
                "their mark and its settle)",
                settled,
                extra=logs.fields(count=settled),
            )
        if not self._store.any_lapsed():
            return
        started = time.monotonic()
        while time.monotonic() - started < self._lease.total_seconds() / 2:
            expired = self._store.expire(known=self._membership.known, limit=dispatch.CHUNK)
            self._metrics.missed(expired)
            for reason in sorted({o.reason or "" for o in expired}):
                count = sum(1 for o in expired if o.reason == reason)
                logger.warning(
                    "voltro_beat: %d unpublished runs past their deadline recorded missed (%s)",
                    count,
                    reason,
                    extra=logs.fields(count=count, status=Status.MISSED, reason=reason),
                )
            taken = self._store.take_over(
                schedules=self._entries.keys() - self._membership.yielded.keys(),
                hold=self._lease,
                limit=dispatch.CHUNK,
            )
            if taken:
                logger.warning(
                    "voltro_beat: republishing %d unconfirmed runs",
                    len(taken),
                    extra=logs.fields(count=len(taken)),
                )
                self._metrics.republished(taken)
                if not self._dispatch.send(taken):
                    return
            if len(expired) < dispatch.CHUNK and len(taken) < dispatch.CHUNK:
                return

    def _sweep(self, now: datetime) -> None:
        """Take on the retention sweep of the slot ``now`` falls in, if this replica wins its
        claim (one replica per slot); its batches follow in the idle time of the next ticks.
        A sweep cut short (the replica stopped) is made up by the next slot's."""
        at = retention.slot(now)
        if not self._store.claim_job(retention.SWEEP_JOB, at, retention.slot_key(at)):
            logger.debug("voltro_beat: the retention sweep of %s is another replica's", at)
            return
        self._sweeping = collections.deque(_Sweep(p, now - p.ttl) for p in self._retention)
        self._membership.registry.forget(now - FORGET_AFTER)

    def _serve_metrics(self, port: int) -> None:
        try:
            self._metrics.serve(port)
        except OSError as exc:
            # Publishing matters more than its metrics: run without them, and say so.
            logger.error(
                "voltro_beat: cannot serve metrics on port %d, running without them: %s",
                port,
                exc,
            )

    def _measure(self) -> None:
        """The gauges: this replica's clock offset and the tables' row estimates."""
        offset = self._clock.offset
        self._metrics.clock_offset(None if offset is None else offset.total_seconds())
        self._metrics.rows(self._store.row_estimates())

    def _sweep_batch(self) -> None:
        """Delete one full batch of the sweep under way (and finish the policies with less
        than a batch left), unless an occurrence is due soon: the tick returns between
        batches, so a long sweep never holds back what is due."""
        while self._sweeping:
            if self._next_wake() - self._clock.now() < PREPARE_MARGIN:
                return
            job = self._sweeping[0]
            policy = job.policy
            try:
                removed = self._store.delete_expired(policy.table, policy.time_column, job.before)
            except ConfigurationError as exc:
                logger.error("voltro_beat: retention of %s not applied: %s", policy.table, exc)
                self._sweeping.popleft()
                continue
            job.removed += removed
            if removed == store_beat.SWEEP_BATCH:
                return
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

    # -- plumbing -------------------------------------------------------------------------

    @property
    def _lease(self) -> timedelta:
        """How long a claim (or a fenced publish) is this replica's alone: after it, recovery
        may take the run over (``voltro_beat_publish_timeout``)."""
        return self._settings.publish_timeout

    @property
    def _fence_lead(self) -> timedelta:
        """How long before their instant the occurrences claimed ahead are fenced: half the
        claim lead, and never so long that the fence is done again at the instant (see
        Dispatcher.deliver)."""
        return min(self._lead / 2, self._lease / 4)

    @property
    def _write_timeout(self) -> timedelta:
        """How long one broker write may take before it is abandoned (and its runs left to
        recovery): meanwhile its leases are renewed, so a slow broker is waited for."""
        return self._settings.publish_timeout * 3

    def _push(self, due: _Due) -> None:
        heapq.heappush(self._queue, (self._claim_time(due), next(self._seq), due))

    def _requeue(self) -> None:
        """Give every schedule its claim time again (the schedules yielded changed)."""
        self._queue = [(self._claim_time(due), seq, due) for _, seq, due in self._queue]
        heapq.heapify(self._queue)

    def _claim_time(self, due: _Due) -> datetime:
        name = due.entry.name
        if name in self._membership.yielded:
            lead = -self._lease  # see _fire_due
        elif name in self._overlap_timeouts:
            lead = timedelta(0)  # decided at its instant, when its predecessor's state is known
        else:
            lead = self._lead
        return due.pending[0] - lead

    def _next_wake(self) -> datetime:
        """The next claim time or instant to publish, whichever comes first."""
        wake = datetime.max.replace(tzinfo=UTC)
        if self._queue:
            wake = self._queue[0][0]
        if self._ready:
            wake = min(wake, self._ready[0][0] - self._fence_lead)
        if self._armed:
            wake = min(wake, self._clock.now() + self._dispatch.until(self._armed[0]))
        return wake

    def _delay(self, now: datetime) -> float:
        wake = min(
            self._next_recovery, self._next_retention, self._next_heartbeat, self._next_wake()
        )
        if self._sweeping and self._next_wake() - now >= PREPARE_MARGIN:
            wake = now  # the next batch of the retention sweep
        if self._queue_policy:
            # A queued run starts within a second of its predecessor finishing, whichever
            # replica queued it (that one may be gone).
            wake = min(wake, now + QUEUE_POLL)
        return max(0.0, min((wake - now).total_seconds(), float(self.max_interval)))

    def _touch_health_file(self) -> None:
        # Fresh only while the loop runs and the store took this replica's heartbeat: what a
        # probe should mean by "this replica takes part" (deploy/kubernetes/beat.yaml).
        path = self._settings.health_file
        if path is None:
            return
        try:
            Path(path).touch()
        except OSError as exc:
            if not self._health_file_warned:
                self._health_file_warned = True
                logger.warning("voltro_beat: cannot touch the health file %s: %s", path, exc)

    def _on_store_error(self, exc: StoreError) -> None:
        # Runs published just before the outage may still be unmarked by their owners (this
        # replica's wait in its dispatcher): give every owner a full lease with the store back
        # before any recovery sweep of this replica republishes a run it did publish.
        now = self._clock.now()
        self._next_recovery = max(self._next_recovery, now + self._lease)
        self._metrics.store_error()
        # A duration inside this process: the local monotonic clock.
        if self._store_down_since is None:
            self._store_down_since = now
            self._store_down_warned = time.monotonic()
            logger.warning("voltro_beat: publishing nothing while the store is down: %s", exc)
        elif time.monotonic() - self._store_down_warned >= STORE_DOWN_REPEAT:
            self._store_down_warned = time.monotonic()
            logger.warning(
                "voltro_beat: store still down since %s, publishing nothing, retrying: %s",
                self._store_down_since.isoformat(timespec="seconds"),
                exc,
            )
        else:
            logger.debug("voltro_beat: store still down: %s", exc)

    def close(self) -> None:
        """Publish what is claimed and due within CLOSE_WAIT, leave the registry, then
        release the broker connection and the store; safe to call more than once."""
        if self._closed or not self._configured:
            self._closed = True
            return
        self._closed = True
        try:
            self._flush_ready()
            if self._booted:
                self._membership.leave()
        except Exception as exc:  # a stopping beat must still stop
            logger.warning("voltro_beat: could not finish cleanly: %s", exc)
        finally:
            self._dispatch.close()
            self._publisher.reset()
            self._store.close()
            self._metrics.close()

    def _flush_ready(self) -> None:
        """Publish the occurrences claimed ahead, each at its instant, waiting at most
        CLOSE_WAIT; what is left is republished by another replica's recovery sweep."""
        end = time.monotonic() + CLOSE_WAIT.total_seconds()
        try:
            while self._ready or self._armed:
                wait = (self._next_wake() - self._clock.now()).total_seconds()
                if wait > end - time.monotonic():
                    break
                time.sleep(max(0.0, wait))
                self._publish_ready()
        except Exception as exc:  # a stopping beat must still stop
            logger.warning("voltro_beat: could not publish claimed runs at close: %s", exc)
        left = len(self._ready) + sum(len(fenced.runs) for fenced in self._armed)
        if left:
            logger.warning(
                "voltro_beat: %d claimed runs left for another replica's recovery sweep",
                left,
                extra=logs.fields(count=left),
            )


def _grace(entry: Entry) -> timedelta | None:
    """How long a schedule's claims outlive a newer win: about sixty predecessors, 1 min..1 h."""
    step = cadence(entry.spec)
    if step is None:
        return None
    return min(max(step * 60, timedelta(minutes=1)), timedelta(hours=1))


#: The exit code of a beat whose configuration is invalid (``EX_CONFIG`` of sysexits.h).
EXIT_CONFIGURATION = 78


class Scheduler(VoltroScheduler):
    """The scheduler a ``celery beat`` process builds: ``-S voltro`` (the entry point) or
    ``-S voltro_beat.scheduler:Scheduler``.

    A configuration error at boot ends the process with exit code 78 and one block on the log
    naming what to fix; its traceback is logged at DEBUG. :class:`VoltroScheduler` itself
    raises the :class:`~voltro_beat.exceptions.ConfigurationError`.
    """

    def setup_schedule(self) -> None:
        try:
            super().setup_schedule()
        except ConfigurationError as exc:
            logger.critical(
                "voltro_beat: beat did not start: the configuration is invalid.\n"
                "    ConfigurationError: %s\n"
                "    Fix the entry or setting it names; run beat with --loglevel debug for the "
                "traceback.",
                exc,
            )
            logger.debug("voltro_beat: the configuration error's traceback", exc_info=exc)
            raise SystemExit(EXIT_CONFIGURATION) from None

    @property
    def info(self) -> str:
        """The banner's line: Celery prints it before logging is set up, so a configuration
        error waits for :meth:`setup_schedule`, which reports it."""
        try:
            return super().info
        except ConfigurationError:
            return "voltro_beat: invalid configuration (beat will not start, see below)"
