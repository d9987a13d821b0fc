"""The ``celery.beat.Scheduler`` subclass behind ``celery beat -S voltro``: glue and timing.

Each tick sends the occurrences due within the claim lead through the coordination gate (one
statement), keeps the ones this replica won until their instant, then publishes them and marks
them published. Claiming ahead leaves only the publish for the instant itself, so a burst of
ten thousand schedules reaches the broker within a fraction of a second of its boundary.
Schedules with an overlap policy are claimed at their instant, when their predecessor's state
is known. Store errors fail closed: nothing is published, the occurrences stay due and are
tried again next tick while they are within ``max_lateness``. Nothing escapes :meth:`tick`.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import beat

from voltro_beat import catchup, overlap
from voltro_beat.config import Settings
from voltro_beat.exceptions import ConfigurationError, PublishError, StoreError
from voltro_beat.occurrences import Occurrence, next_after
from voltro_beat.publisher import Publisher
from voltro_beat.schedules import Entry, cadence, parse_entries
from voltro_beat.status import Reason, Status
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.database import Database

logger = logging.getLogger(__name__)

#: Seconds between attempts while the store is unreachable.
RETRY_DELAY = 1.0
#: Occurrences per claim statement: a tick claims everything due in one round trip up to this.
BATCH = 100_000
#: Messages per broker write when publishing an instant's occurrences: between two writes the
#: claims' leases are checked, so a slow publish stops before recovery takes the rest over.
PUBLISH_CHUNK = 1000
#: How far ahead of its instant an occurrence is claimed: LEAD_MIN, plus CLAIM_COST per
#: schedule, so that a burst of every schedule at once is claimed before its boundary.
#: CLAIM_COST leaves room for three replicas claiming one burst on two cores
#: (``python -m bench --workloads burst`` measures the claim time in its logs).
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
#: Message templates are built only while the next occurrence is at least this far away.
PREPARE_MARGIN = timedelta(milliseconds=200)
#: How often a replica deletes claims and runs past their retention.
RETENTION_EVERY = timedelta(hours=1)


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
    _publisher: Publisher

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self._configured = False
        self._closed = False
        self._booted = False
        #: Schedules by the time their next occurrences are to be claimed.
        self._queue: list[tuple[datetime, int, _Due]] = []
        #: Occurrences this replica won, by instant: published when it comes, unless their
        #: lease (the last item) ran out while this process was paused.
        self._ready: list[tuple[datetime, str, Occurrence, datetime]] = []
        self._lead = LEAD_MIN
        self._seq = itertools.count()
        self._store_down_since: datetime | None = None
        #: The entries Celery's ``install_default_entries`` adds (see ``update_from_dict``).
        self._default_entries: dict[str, Mapping[str, Any]] = {}
        self._broker_down = False
        #: Published, but the store failed before they were marked: retried first thing.
        self._unmarked: list[str] = []
        #: Heap items whose message templates are not built yet, soonest first.
        self._unprepared: list[tuple[datetime, int, _Due]] = []
        self._next_recovery = datetime.min.replace(tzinfo=UTC)
        self._next_retention = datetime.min.replace(tzinfo=UTC)
        # Celery builds a lazy instance for the banner: it must do no I/O.
        super().__init__(app, *args, **kwargs)

    # -- set-up ---------------------------------------------------------------------------

    def setup_schedule(self) -> None:
        """Parse settings and entries (raising ConfigurationError at boot) and open the store.

        No connection is made here: the first tick upgrades the schema and catches up, and
        retries both while the store is unreachable.
        """
        self._configure()
        logger.info(
            "voltro_beat: replica %s, store %s, coordination %s, %d schedules",
            self._settings.replica,
            self._store.display_url,
            self._settings.coordination,
            len(self._entries),
        )

    def _configure(self) -> None:
        if self._configured:
            return
        settings = Settings.from_config(self.app.conf)
        entries = parse_entries(
            self._beat_schedule(), tz=settings.timezone, max_lateness=settings.max_lateness
        )
        for entry in entries:
            if entry.max_lateness >= settings.runs_ttl:
                # The run row is the long fence: it must outlive any occurrence still due.
                raise ConfigurationError(
                    f"max_lateness ({entry.max_lateness}) must be shorter than the runs "
                    f"retention ({settings.runs_ttl}, voltro_beat_runs_ttl_hours)",
                    entry=entry.name,
                    field="max_lateness",
                )
        store = BeatStore(Database.open(settings.store_url), replica=settings.replica)
        self._settings = settings
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
        self._publisher = Publisher(self.app)
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
            f"coordination {self._settings.coordination}, "
            f"replica {self._settings.replica}, {len(self._entries)} schedules"
        )

    # -- the loop -------------------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Record and publish what is due; return the seconds to sleep. Never raises."""
        if self._closed:
            return float(self.max_interval)
        try:
            return self._tick(_now())
        except StoreError as exc:
            self._on_store_error(exc)
            return RETRY_DELAY
        except Exception:
            logger.exception("voltro_beat: unexpected error in tick; retrying")
            return RETRY_DELAY

    def _tick(self, now: datetime) -> float:
        if self._unmarked:
            self._store.mark_published(self._unmarked, now=now)
            self._unmarked = []
        if not self._booted:
            self._boot(now)
        if now >= self._next_recovery:
            self._recover(now)
            self._next_recovery = now + self._settings.publish_timeout / 2
        if now >= self._next_retention:
            self._sweep(now)
            self._next_retention = now + RETENTION_EVERY
        self._publish_ready(now)
        self._fire_due(now)
        self._publish_ready(now)
        if self._queue_policy:
            self._promote_queued(now)
        if self._store_down_since is not None:
            logger.warning("voltro_beat: store %s is reachable again", self._store.display_url)
            self._store_down_since = None
        if self._unprepared:
            self._prepare_messages()
        return self._delay(_now())

    def _prepare_messages(self) -> None:
        """Build message templates, soonest schedules first, while nothing is due.

        At 100,000 schedules building them all takes minutes: done at boot it would hold the
        first occurrences back, so it runs in the idle time between ticks instead.
        """
        while self._unprepared:
            if self._next_wake() - _now() < PREPARE_MARGIN:
                return
            chunk, self._unprepared = self._unprepared[:100], self._unprepared[100:]
            self._publisher.prepare([due.entry for _, _, due in chunk])

    def _boot(self, now: datetime) -> None:
        """Upgrade the schema, record catch-up per entry, and fill the heap."""
        if self._settings.migrate:
            self._store.database.upgrade()
        entries = list(self._entries.values())
        last = self._store.last_scheduled([e.name for e in entries])
        backfill = [
            occurrence
            for entry in entries
            for occurrence in catchup.plan(entry, last.get(entry.name), now)
        ]
        self._record(backfill, now)
        for entry in entries:
            first = next_after(entry.spec, now)
            if first is not None:
                self._push(_Due(entry, [first]))
        self._booted = True
        self._unprepared = sorted(self._queue)

    def _publish_ready(self, now: datetime) -> None:
        """Publish the occurrences won ahead whose instant has come, then mark them.

        They go out in chunks, and an occurrence whose lease ran out (this process was paused,
        or publishing took that long) is not sent: it belongs to the recovery sweeps now,
        which may already have republished it. If the broker fails, what is left of this
        instant stays ``claimed`` for the recovery sweep, as any unconfirmed publish does.
        """
        published: list[str] = []
        expired = 0
        started = time.monotonic()
        try:
            while self._ready and self._ready[0][0] <= now:
                clock = now + timedelta(seconds=time.monotonic() - started)
                chunk: list[Occurrence] = []
                while len(chunk) < PUBLISH_CHUNK and self._ready and self._ready[0][0] <= now:
                    _, _, occurrence, lease = heapq.heappop(self._ready)
                    if clock < lease:
                        chunk.append(occurrence)
                    else:
                        expired += 1
                sent = self._publish(chunk)
                published += sent
                if len(sent) < len(chunk):
                    while self._ready and self._ready[0][0] <= now:
                        heapq.heappop(self._ready)
        finally:
            if expired:
                logger.warning(
                    "voltro_beat: %d claimed runs held past their lease left to recovery",
                    expired,
                )
            self._mark(published)

    def _fire_due(self, now: datetime) -> None:
        """Claim the occurrences whose claim time has come (their instant minus the lead)."""
        due: list[_Due] = []
        while self._queue and self._queue[0][0] <= now:
            due.append(heapq.heappop(self._queue)[2])
        if not due:
            return
        try:
            self._record([self._occurrence(d.entry, at, now) for d in due for at in d.pending], now)
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
            elif self._store.promote(run.key, now=now):
                self._publish_and_mark([run])

    def _occurrence(self, entry: Entry, at: datetime, now: datetime) -> Occurrence:
        """The occurrence of ``entry`` at ``at`` to record now: ``claimed``, or ``missed`` once
        past its ``max_lateness`` (guarantee 6)."""
        if now - at <= entry.max_lateness:
            return Occurrence.of(entry.name, entry.task, at)
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
        lease = self._lease
        for i in range(0, len(occurrences), BATCH):
            batch = occurrences[i : i + BATCH]
            won = self._store.claim(
                batch, coordination=self._settings.coordination, now=now, prune=self._graces
            )
            lost = len(batch) - len(won)
            if lost:
                logger.debug("voltro_beat: %d occurrences claimed by other replicas", lost)
            for o in batch:
                if o.key not in won:
                    continue
                if o.status == Status.CLAIMED:
                    expires = max(o.scheduled_at, now) + lease
                    heapq.heappush(self._ready, (o.scheduled_at, o.key, o, expires))
                else:
                    logger.info("voltro_beat: %s recorded %s (%s)", o.key, o.status, o.reason)

    def _publish_and_mark(self, occurrences: Sequence[Occurrence]) -> None:
        self._mark(self._publish(occurrences))

    def _publish(self, occurrences: Sequence[Occurrence]) -> list[str]:
        """Send ``occurrences``; return the keys the broker confirmed."""
        messages = []
        for o in occurrences:
            entry = self._entries[o.schedule]
            logger.info("Scheduler: Sending due task %s (%s) as %s", entry.name, entry.task, o.key)
            messages.append((entry, o.key, o.task_id))
        if not messages:
            return []
        try:
            self._publisher.publish(messages)
            published = [key for _, key, _ in messages]
        except PublishError as exc:
            # Fail closed: what the broker did not confirm stays ``claimed``; the recovery
            # sweep republishes it with the same task ids once the broker answers.
            if not self._broker_down:
                logger.warning("voltro_beat: broker unreachable, will retry: %s", exc)
            self._broker_down = True
            published = [key for _, key, _ in messages[: exc.confirmed]]
        else:
            if self._broker_down:
                logger.warning("voltro_beat: broker is reachable again")
            self._broker_down = False
        return published

    def _mark(self, published: list[str]) -> None:
        if published:
            try:
                self._store.mark_published(published, now=_now())
            except StoreError:
                self._unmarked.extend(published)
                raise

    # -- maintenance ----------------------------------------------------------------------

    def _recover(self, now: datetime) -> None:
        """Republish runs left ``claimed`` (crashed replica, broker outage) or mark them missed.

        A chunk at a time, each leased (``claimed_at``) when taken, so that every republish
        ends well within its lease even when there are many; chunks follow one another for
        at most half the publish timeout, or until the broker fails.
        """
        started = time.monotonic()
        while True:
            clock = now + timedelta(seconds=time.monotonic() - started)
            if clock - now >= self._lease:
                return
            stale = self._store.release_stale(
                before=clock - self._settings.publish_timeout, now=clock, limit=PUBLISH_CHUNK
            )
            republish: list[Occurrence] = []
            expired: list[str] = []
            for run in stale:
                entry = self._entries.get(run.schedule)
                if entry is None:
                    continue  # a schedule this replica does not know (rolling deploy)
                if clock - run.scheduled_at > entry.max_lateness:
                    expired.append(run.key)
                else:
                    republish.append(run)
            if expired:
                self._store.mark_missed(expired, reason=Reason.PUBLISH_FAILED)
                logger.warning("voltro_beat: %d unpublished runs expired as missed", len(expired))
            if republish:
                logger.warning("voltro_beat: republishing %d unconfirmed runs", len(republish))
                self._publish_and_mark(republish)
            if len(stale) < PUBLISH_CHUNK or self._broker_down:
                return

    def _sweep(self, now: datetime) -> None:
        claims, runs = self._store.sweep(
            claims_before=now - self._settings.claims_ttl,
            runs_before=now - self._settings.runs_ttl,
        )
        if claims or runs:
            logger.info("voltro_beat: retention removed %d claims and %d runs", claims, runs)

    # -- plumbing -------------------------------------------------------------------------

    @property
    def _lease(self) -> timedelta:
        """How long a replica may still publish a run it holds (from its instant or claim).

        Recovery sweeps take a ``claimed`` row over once both its instant and its claim are
        ``publish_timeout`` old: the holder's lease ends well before that.
        """
        return self._settings.publish_timeout / 2

    def _push(self, due: _Due) -> None:
        # Overlap-guarded schedules are decided at their instant, the rest claimed ahead.
        lead = timedelta(0) if due.entry.name in self._overlap_timeouts else self._lead
        heapq.heappush(self._queue, (due.pending[0] - lead, next(self._seq), due))

    def _next_wake(self) -> datetime:
        """The next claim time or instant to publish, whichever comes first."""
        wake = datetime.max.replace(tzinfo=UTC)
        if self._queue:
            wake = self._queue[0][0]
        if self._ready:
            wake = min(wake, self._ready[0][0])
        return wake

    def _delay(self, now: datetime) -> float:
        wake = min(self._next_recovery, self._next_retention, self._next_wake())
        if self._queue_policy:
            # A queued run starts within a second of its predecessor finishing, whichever
            # replica queued it (that one may be gone).
            wake = min(wake, now + QUEUE_POLL)
        return max(0.0, min((wake - now).total_seconds(), float(self.max_interval)))

    def _on_store_error(self, exc: StoreError) -> None:
        # Runs published just before the outage may still be unmarked by their owners (this
        # replica's are in _unmarked): give every owner a full publish_timeout with the store
        # back before any recovery sweep republishes a run it did publish.
        self._next_recovery = max(self._next_recovery, _now() + self._settings.publish_timeout)
        if self._store_down_since is None:
            self._store_down_since = _now()
            logger.warning("voltro_beat: publishing nothing while the store is down: %s", exc)
        else:
            logger.debug("voltro_beat: store still down: %s", exc)

    def close(self) -> None:
        """Publish what is claimed and due within CLOSE_WAIT, then release the broker
        connection and the store; safe to call more than once."""
        if self._closed or not self._configured:
            self._closed = True
            return
        self._closed = True
        try:
            self._flush_ready()
        finally:
            self._publisher.reset()
            self._store.close()

    def _flush_ready(self) -> None:
        """Publish the occurrences claimed ahead, each at its instant, waiting at most
        CLOSE_WAIT; what is left is republished by another replica's recovery sweep."""
        if not self._ready:
            return
        until = _now() + CLOSE_WAIT
        try:
            while self._ready and self._ready[0][0] <= until:
                time.sleep(max(0.0, (self._ready[0][0] - _now()).total_seconds()))
                self._publish_ready(_now())
        except Exception as exc:  # a stopping beat must still stop
            logger.warning("voltro_beat: could not publish claimed runs at close: %s", exc)
        if self._ready:
            logger.warning(
                "voltro_beat: %d claimed runs left for another replica's recovery sweep",
                len(self._ready),
            )


def _grace(entry: Entry) -> timedelta | None:
    """How long a schedule's claims outlive a newer win: about sixty predecessors, 1 min..1 h."""
    step = cadence(entry.spec)
    if step is None:
        return None
    return min(max(step * 60, timedelta(minutes=1)), timedelta(hours=1))


def _now() -> datetime:
    return datetime.now(UTC)


#: The name ``-S voltro_beat.scheduler:Scheduler`` has always meant.
Scheduler = VoltroScheduler
