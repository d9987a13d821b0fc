"""The firing engine: given the schedules, the store, the publisher and a clock, it decides
and performs what is due, and says when it next needs to run.

Each step sends the occurrences due within the claim lead through the coordination gate (one
statement; the rest of a larger burst in the next steps), keeps the ones this replica won
until their instant (:mod:`voltro_beat.engine.ready`), then publishes them: per chunk, the
publish fence (a statement confirming in the store that this replica still holds them), the
broker write, and the mark (:mod:`voltro_beat.dispatch`). Claiming ahead leaves only that for
the instant itself, so a burst of ten thousand schedules reaches the broker within a fraction
of a second of its boundary. Schedules with an overlap policy are claimed at their instant,
when their predecessor's state is known. "Now" is the clock handed in (the database's,
:mod:`voltro_beat.clock`). Store errors fail closed: nothing is published, the
occurrences stay due and are tried again next step while they are within ``max_lateness``.

The engine reads no clock but its own, and starts no thread, sleeps and holds no signal but
through its runner (:mod:`voltro_beat.runner`): a simulation drives it on a virtual timeline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from importlib.metadata import version

from voltro_beat.clock import Clock
from voltro_beat.config import Settings
from voltro_beat.coordination import Coordination
from voltro_beat.dispatch import Dispatcher
from voltro_beat.engine.gate import Gate
from voltro_beat.engine.guard import Guard
from voltro_beat.engine.live import POLL, Live
from voltro_beat.engine.ownership import Ownership
from voltro_beat.engine.ready import NEVER, Ready
from voltro_beat.engine.recorder import Recorder, graces
from voltro_beat.engine.singletons import Singletons
from voltro_beat.engine.timeline import Pending, Timeline, shared_next
from voltro_beat.engine.unserved import Unserved
from voltro_beat.engine.upkeep import LONG_AGO, Upkeep
from voltro_beat.exceptions import StoreError
from voltro_beat.membership import Membership
from voltro_beat.metrics import Metrics
from voltro_beat.publisher import Publisher
from voltro_beat.runner import Runner
from voltro_beat.runs import Run
from voltro_beat.schedules import Entry
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.registry import Registry

logger = logging.getLogger(__name__)

#: How long after a failed step the engine wants to run again.
RETRY_DELAY = timedelta(seconds=1)
#: At close, occurrences claimed ahead and due within this long are published on time; later
#: ones are left to another replica's recovery sweep (``publish_timeout`` after their instant).
CLOSE_WAIT = timedelta(seconds=3)
#: Seconds between checks for queued runs whose predecessor finished.
QUEUE_POLL = timedelta(seconds=1)
#: Message templates are built, and retention batches deleted, only while the next
#: occurrence is at least this far away.
PREPARE_MARGIN = timedelta(milliseconds=200)


class Engine:
    """Fires one replica's schedules: every occurrence claimed in the store, published once."""

    def __init__(
        self,
        *,
        settings: Settings,
        entries: Mapping[str, Entry],
        store: BeatStore,
        publisher: Publisher,
        clock: Clock,
        overlap_timeout: Callable[[Entry], timedelta],
        metrics: Metrics | None = None,
        runner: Runner | None = None,
        singletons: Singletons | None = None,
    ) -> None:
        """Raises :class:`~voltro_beat.exceptions.ConfigurationError` for settings or entries
        the retention policies contradict (:func:`voltro_beat.engine.upkeep.policies`).
        Of ``entries`` (the app's) and the schedules table's, it fires those of its group
        (``settings.group``); ``overlap_timeout`` is how long a run of a ``skip`` or ``queue``
        entry blocks the next one."""
        code = entries
        others = [e for e in entries.values() if e.group != settings.group]
        entries = {n: e for n, e in entries.items() if e.group == settings.group}
        self.settings = settings
        self.entries = entries
        self.store = store
        self.publisher = publisher
        self.clock = clock
        self.membership = membership = Membership(
            Registry(store.database), clock, settings, entries, version("voltro-beat")
        )
        self.metrics = metrics or Metrics()
        #: How long a claim (or a fenced publish) is this replica's alone: after it, recovery
        #: may take the run over (``voltro_beat_publish_timeout``).
        self.lease = settings.publish_timeout
        self.dispatch = Dispatcher(
            store, publisher, entries, self.lease, clock, self.metrics, runner=runner
        )
        #: Per ``skip`` / ``queue`` schedule: how long a live run blocks the next one.
        self.overlap = {
            e.name: overlap_timeout(e) for e in entries.values() if e.on_overlap != "allow"
        }
        self.guard = Guard(store, entries, self.overlap, self.metrics)
        self.recorder = Recorder(
            store,
            entries,
            self.guard,
            settings.coordination,
            self.lease,
            graces(entries.values()),
            self.metrics,
        )
        cluster = settings.coordination is Coordination.CLUSTER
        self.ownership = Ownership(store, settings, entries, self.metrics) if cluster else None
        self.gate = Gate(membership, self.ownership, singletons)
        self.timeline = Timeline(
            self.lease, self.overlap.keys(), self.gate.deferred, self.gate.holds
        )
        self.live = Live(
            store.database,
            settings,
            code,
            entries=entries,
            overlap=self.overlap,
            overlap_timeout=overlap_timeout,
            timeline=self.timeline,
            publisher=publisher,
            membership=membership,
            recorder=self.recorder,
            ownership=self.ownership,
            clock=clock,
        )
        self._lead()
        self.unserved = Unserved(store, others, settings.coordination, self.lease, self.metrics)
        self.upkeep = Upkeep(
            settings=settings,
            entries=entries,
            store=store,
            dispatch=self.dispatch,
            publisher=publisher,
            membership=membership,
            clock=clock,
            metrics=self.metrics,
        )
        self.booted = False
        #: Set by :meth:`close`.
        self.closed = False
        #: Whether a step is under way (a close() asked for meanwhile waits for its end).
        self._stepping = False
        #: What this replica won ahead: fenced shortly before its instant, published at it.
        self.ready = Ready(self.dispatch, clock, self.timeline)
        self._next_heartbeat = LONG_AGO
        self._next_poll = LONG_AGO
        #: When this replica first joined the registry (a boot retried joins again).
        self._started: datetime | None = None

    # -- the loop -------------------------------------------------------------------------

    def step(self) -> datetime:
        """Record and publish what is due now; return when to run again. Never raises."""
        if self.closed:
            return NEVER
        try:
            return self.attempt()
        except StoreError as exc:
            self.upkeep.store_down(exc)
        except Exception:
            logger.exception("voltro_beat: unexpected error in tick; retrying")
        return self.clock.now() + RETRY_DELAY

    def attempt(self) -> datetime:
        """:meth:`step`, raising what it would log (the test plugin wants to see it)."""
        self._stepping = True
        try:
            return self._attempt()
        finally:
            self._stepping = False

    def _attempt(self) -> datetime:
        clock = self.clock
        # In the middle of a burst (what is due to publish now), the settle waits for its end.
        self.dispatch.flush(settle=self.ready.next_publish() > clock.now())
        if not self.booted:
            self._boot()
        # What is due first (the heartbeat before claims: it says which schedules are
        # yielded to a newer replica); the rest of the step is upkeep.
        self.ready.publish()
        self._heartbeat()
        self._catch_up()
        self._fire_due(clock.now())
        # After what is due: an occurrence of a definition that changed since, due before the
        # change, is claimed still (a step late after a pause, say); the store refuses the ones
        # after it.
        if clock.now() >= self._next_poll:
            self._follow_table(boot=False)
        self.ready.publish()
        # Again if the claims and publishing took longer than the heartbeat's interval: the
        # registry row and the shards' leases are renewed before the upkeep (a recovery slice).
        self._heartbeat()
        if self.guard.queues:
            self.guard.promote(clock.now(), self.dispatch, self.lease)
        self.upkeep.run(self._room)
        return self._wake(clock.now())

    def _heartbeat(self) -> None:
        """Heartbeat, if one is due: the registry row, the replicas live, and in ``cluster``
        coordination the shards (a catch-up owed of those taken)."""
        clock = self.clock
        if clock.now() < self._next_heartbeat or self._step_aside():
            return
        changed, gained = self.gate.beat()
        if changed:
            self.timeline.requeue()
        now = clock.now()
        self._owe(gained, now, taken_over=True)
        self.upkeep.prepare(self._start(gained, now))
        self.unserved.record(self.membership.live, clock.now())
        self.upkeep.health.touch()
        self._next_heartbeat = clock.now() + self.membership.interval

    def _step_aside(self) -> bool:
        """In ``cluster`` coordination, once the store has failed every step for a lease (a
        deploy whose claims are broken while its heartbeats go through, say): renew nothing at
        the heartbeat and let go of the shards held, here, without a statement. The replica
        then looks gone to the others; its shards' leases lapse to the live replicas, which
        catch up on them within their lateness. A replica that kept renewing them would fire
        none of their schedules. Its first step that succeeds takes part again (the heartbeat
        after it takes shards back as newly taken: their catch-up covers the gap). Returns
        whether the replica stands aside."""
        down = self.upkeep.health.down_since
        if self.ownership is None or down is None or self.clock.now() - down < self.lease:
            return False
        if self.gate.step_aside():
            self.timeline.requeue()
            logger.warning(
                "voltro_beat: the store has failed every step since %s: letting go of this "
                "replica's shards for the live replicas to fire; taking part again once a "
                "step succeeds",
                down.isoformat(timespec="seconds"),
            )
        return True

    def _boot(self) -> None:
        """Upgrade the schema, join the registry (a first reading of the database's clock),
        owe the catch-up, and fill the timeline."""
        if self.settings.migrate:
            self.store.database.upgrade()
        self._follow_table(boot=True)
        taken = self.gate.join()
        self._next_heartbeat = self.clock.now() + self.membership.interval
        # A schedule with no history starts from now: nothing historical fires on a first boot.
        # A boot retried after a store error owes that catch-up already, holds the shards it
        # took, and starts its timeline where the catch-up ends.
        if self._started is None:
            self._started = self.clock.now()
            self._owe(self.entries if taken is None else taken, self._started, taken_over=False)
        elif taken:
            self._owe(taken, self.clock.now(), taken_over=False)
        # The catch-up owed is recorded by the steps, a statement each, starting with this one.
        held = self.entries if self.ownership is None else self.ownership.schedules()
        self.upkeep.prepare(self._start(held, self._started))
        self.booted = True

    def _start(self, names: Iterable[str], since: datetime) -> list[Pending]:
        """Put schedules ``names`` on the timeline from their first occurrence after
        ``since`` (a catch-up owed covers what fell until then): at boot, and in ``cluster``
        coordination as their shard is taken over (the timeline keeps the schedules of this
        replica's shards alone). Returns what it put there, soonest first."""
        started = []
        nexts: dict[tuple[int, datetime], datetime | None] = {}
        for name in names:
            entry = self.entries[name]
            if entry.trigger != "beat" or name in self.live.silent or name in self.timeline:
                continue
            first = shared_next(entry.spec, since, nexts)
            if first is not None:
                pending = Pending(entry, [first])
                self.timeline.push(pending)
                if name in self.timeline:  # not left out: a schedule of a shard held
                    started.append(pending)
        return sorted(started, key=lambda p: p.instants[0])

    def _follow_table(self, *, boot: bool) -> None:
        """Apply what changed in the schedules table (:mod:`voltro_beat.engine.live`)."""
        if self.live.follow(boot=boot):
            self._lead()
            self._next_heartbeat = self.clock.now()  # the registry says so at once
        self._next_poll = self.clock.now() + POLL

    def _lead(self) -> None:
        """Claim ahead as the schedules claimed ahead ask (:meth:`Timeline.lead_for`)."""
        self.timeline.lead_for(len(self.entries) - len(self.overlap) - len(self.live.silent))

    def _fire_due(self, now: datetime) -> None:
        """Record the occurrences whose claim time has come (their instant minus the lead),
        as the gate says (:mod:`voltro_beat.engine.gate`): one claim statement's worth a
        step, the rest in the next steps, a heartbeat between them when one is due."""
        due = self.timeline.due(now, self.recorder.batch, self.membership.rank)
        if not due:
            return
        try:
            self._record(self.gate.runs(due, now, self.upkeep.health.down_since), now)
            nexts: dict[tuple[int, datetime], datetime | None] = {}
            for p in due:
                p.advance(now, nexts)
        finally:
            # On a store error the occurrences stay due and are tried again next step.
            for p in due:
                if p.instants:
                    self.timeline.push(p)

    def _record(self, runs: list[Run], now: datetime) -> None:
        for won in self.recorder.record(runs, now, self.gate.tenure, self.ready.waiting):
            for o in won:
                self.ready.push(o)
            # What the claim won is fenced and published as its instant comes, before the
            # step's upkeep (a claim that ran late must not outlast the first leases).
            self.ready.publish()

    def _owe(self, names: Iterable[str], now: datetime, *, taken_over: bool) -> None:
        """Owe a catch-up of schedules ``names``, at boot or as their shard is ``taken_over``
        by this replica, as things stand ``now``: the catch-up policies apply to what fell
        until then, and a schedule that has no run yet (its owner stalled before the first)
        starts when the longest-running live replica that runs it (this one too) started:
        what fell since, fell while a replica was live; what fell before a shard's previous
        owner released it was that live replica's. An external entry is fired by
        `voltro-beat trigger` alone: no catch-up (its untriggered occurrences stay gaps)."""
        live = self.membership.runners
        self.recorder.owe(
            [
                self.entries[n]
                for n in names
                if self.entries[n].trigger == "beat" and n not in self.live.silent
            ],
            now,
            live,
            live if taken_over else None,
            self.gate.released,
        )

    def _catch_up(self) -> None:
        """Record a statement's worth of the catch-ups owed (the rest in the next steps)."""
        rank, waiting = self.membership.rank, self.ready.waiting
        for o in self.recorder.settle(self.clock.now(), self.gate.tenure, rank, waiting):
            self.ready.push(o)

    @property
    def behind(self) -> bool:
        """Whether part of what is due now is left for the next steps (a statement a step)."""
        return self.recorder.owing or self.timeline.behind

    # -- timing ---------------------------------------------------------------------------

    def _next_due(self) -> datetime:
        """The next claim time or instant to publish, whichever comes first: now while a
        catch-up is owed still."""
        if self.recorder.owing:
            return self.clock.now()
        return min(self.timeline.next or NEVER, self.ready.next_publish())

    def _room(self) -> bool:
        """Whether upkeep may run now: nothing is due within PREPARE_MARGIN."""
        return self._next_due() - self.clock.now() >= PREPARE_MARGIN

    def _wake(self, now: datetime) -> datetime:
        wake = min(
            self.upkeep.wake(now, self._room()),
            self._next_heartbeat,
            self._next_poll,
            self._next_due(),
        )
        if self.guard.queues:
            # A queued run starts within a second of its predecessor finishing, whichever
            # replica queued it (that one may be gone).
            wake = min(wake, now + QUEUE_POLL)
        return wake

    # -- stopping -------------------------------------------------------------------------

    def close(self, wait: timedelta = CLOSE_WAIT) -> bool:
        """Publish what is claimed and due within ``wait`` (waiting on the runner), leave
        the registry, then stop the dispatcher; safe to call more than once. The publisher
        and the store are the caller's to release. Returns whether it closed.

        Called in the middle of a step (Celery's SIGTERM handler runs the scheduler's close()
        on top of whatever the main thread is doing, then raises ``SystemExit``), it only
        halts the dispatcher, so that the rest of the step writes nothing to the broker, and
        returns False: beat's service closes the scheduler again once the step unwound.
        Closing on top of the step would wait on what the step holds: its open transaction
        (on SQLite every process then waits behind it for the busy timeout) and its marks.
        """
        if self.closed:
            return True
        if self._stepping:
            self.dispatch.halted = True
            return False
        self.closed = True
        # The step a deferred close() interrupted has unwound: what is due now goes out.
        self.dispatch.halted = False
        try:
            self.ready.flush(wait)
            if self.booted:
                self.gate.leave()
        except Exception as exc:  # a stopping beat must still stop
            logger.warning("voltro_beat: could not finish cleanly: %s", exc)
        finally:
            self.dispatch.close()
        return True
