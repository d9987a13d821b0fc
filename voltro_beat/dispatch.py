"""Claimed runs -> broker, under the publish fence (guarantee 10): fence, write, mark.

The one sequence every publish goes through, whoever publishes (beat at an instant, its
recovery sweep, a queued run's promotion):

1. **fence** a chunk of at most :data:`CHUNK` runs: one statement confirms in the store that
   this replica still holds each run (its lease runs, its deadline has not passed) and leases
   it for :attr:`Dispatcher.hold` from its instant or from now, whichever is later; whatever
   the store refuses is not sent. The statement also reads the database's clock: the
   dispatcher's bounds on that clock (:meth:`voltro_beat.clock.Clock.bounds`) come from it;
2. **write** the chunk to the broker, only once the earliest the database's clock can read has
   reached the chunk's instant (never early, whatever the round trip of a reading), and only
   while at least a whole publish timeout of its lease is left on the latest the database's
   clock can read (else it is fenced again first): a pause of the whole process right before
   the write must outlast ``voltro_beat_publish_timeout`` for another replica to take the
   runs over. While the write is under way the leases are renewed in the background
   (:mod:`voltro_beat.runner`), so a broker that is merely slow keeps its runs (a paused
   process renews nothing);
3. **mark** the chunk once the broker confirmed it (its publish time stamped, its leases
   ended: no recovery takes it over any more), in the background while the next chunk is
   written: at most two chunks are ever written and unmarked at once. A mark that fails keeps
   its keys, and those of the chunk written meanwhile, for the next try (:meth:`flush`).
   Messages the broker refused (a RabbitMQ nack, a Redis command error) are not marked: their
   leases end at once, for recovery to send them again within their lateness;
4. **settle**: once every chunk is written and marked, the marked runs still ``claimed`` are
   recorded ``published`` (the status change costs the store more than the mark, and waits
   until the messages are out).

SIGTERM and SIGINT that arrive while a chunk is being written wait until its mark is under
way, and those that arrive while this thread waits for a mark (the last chunk's, the marks a
close finishes) wait until it is done: Celery's beat handles them by closing the scheduler and
raising ``SystemExit``, which in the middle of a write would leave a chunk the broker took
unmarked, for another replica to send again, and in the middle of the wait for a mark would
let the process end while the mark's statement runs (a second SIGTERM during the close, say).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from voltro_beat import logs
from voltro_beat.clock import Clock, Reading
from voltro_beat.exceptions import PublishError, StoreError
from voltro_beat.metrics import Metrics
from voltro_beat.occurrences import Occurrence
from voltro_beat.publisher import Publisher
from voltro_beat.runner import Runner, Threads
from voltro_beat.schedules import Entry
from voltro_beat.store.beat import BeatStore

logger = logging.getLogger(__name__)

#: Runs per fence and per broker write: a crash between a write and its mark leaves at most
#: two chunks (the one being marked, the one being written) to be sent again.
CHUNK = 1000


@dataclass(frozen=True, slots=True)
class Fenced:
    """The occurrences of a chunk whose runs the fence let through, to be written at
    ``instant`` (the latest of theirs), leased until ``held_until`` (None if none was let
    through), with the database's clock as the fence read it."""

    occurrences: list[Occurrence]
    instant: datetime
    held_until: datetime | None
    reading: Reading | None


class Dispatcher:
    """Fences, writes and marks runs for one replica, on its ``clock``."""

    def __init__(
        self,
        store: BeatStore,
        publisher: Publisher,
        entries: Mapping[str, Entry],
        lease: timedelta,
        clock: Clock,
        metrics: Metrics | None = None,
        runner: Runner | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics or Metrics()
        self.publisher = publisher
        self.entries = entries
        self.lease = lease
        self.clock = clock
        #: How long past its instant a fence leases a chunk: a whole lease must be left when
        #: the chunk is written, and it may wait a quarter lease for the chunks before it.
        self.hold = lease + lease / 4
        #: Confirmed by the broker, not yet marked (the store failed): marked first thing.
        self.unmarked: list[str] = []
        #: Marked, not yet settled.
        self.unsettled: list[str] = []
        #: Both lists are kept by this thread and the marker's.
        self._lock = threading.Lock()
        self.broker_down = False
        #: The broker refused messages of the last write (a warning says so once).
        self.refusing = False
        #: Nothing more is written to the broker: set by :meth:`close`, and by the engine when
        #: a close is asked for in the middle of its step (the rest of the step writes nothing).
        self.halted = False
        #: Marks and lease renewals run here (threads, or a simulation's runner).
        self.runner = runner or Threads()
        #: Runs per fence and broker write (:data:`CHUNK`; a simulation makes it small).
        self.chunk = CHUNK

    def fence(self, occurrences: Sequence[Occurrence]) -> Fenced:
        """The runs of ``occurrences`` this replica may still send, their leases renewed."""
        instant = max(o.scheduled_at for o in occurrences)
        fence = self.store.fence([o.key for o in occurrences], hold=self.hold, start=instant)
        if len(fence.keys) < len(occurrences):
            lost = len(occurrences) - len(fence.keys)
            logger.warning(
                "voltro_beat: %d claimed runs no longer held by this replica (paused past "
                "their lease, taken over, or past their deadline): not sent",
                lost,
                extra=logs.fields(count=lost),
            )
        held = [o for o in occurrences if o.key in fence.keys]
        return Fenced(held, instant, fence.held_until, fence.reading)

    def until(self, fenced: Fenced) -> timedelta:
        """How long until ``fenced`` may be written: until the earliest the database's clock
        can read reaches its instant (zero or less: now)."""
        earliest, _ = self.clock.bounds(fenced.reading)
        return fenced.instant - earliest

    def deliver(self, chunks: Sequence[Fenced], *, settle: bool = True) -> bool:
        """Write fenced ``chunks`` in order (each due: :meth:`until`), each marked as soon as
        the broker confirmed it, then settle them (unless ``settle`` is False: the caller
        settles once the rest of the burst is written, :meth:`settle`); False (and the rest
        left for recovery) once the broker fails.

        A chunk with less than a whole lease left (this process was paused or held up since
        its fence) is fenced again first: the store decides again what is still this
        replica's. Raises :class:`StoreError` if a mark failed: those runs, and the ones
        written while it ran, wait in :attr:`unmarked`.
        """
        marking: Future[None] | None = None
        complete = True
        try:
            for fenced in chunks:
                if self.halted:
                    complete = False
                    break
                if not fenced.occurrences:  # its fence found none of them this replica's
                    continue
                if not self._holds(fenced):
                    fenced = self.fence(fenced.occurrences)
                chunk = fenced.occurrences
                if not chunk:
                    continue
                with self.runner.hold_signals(), self._renewing([o.key for o in chunk]):
                    sent, answered = self._write(chunk)
                    try:
                        _wait(marking)
                    except StoreError:
                        self._keep(self.unmarked, sent)  # its mark was never tried
                        marking = None
                        raise
                    marking = self._start_mark(sent)
                if not answered:
                    complete = False
                    break
        finally:
            with self.runner.hold_signals():
                _wait(marking)
        if settle:
            self.settle()
        return complete

    def send(self, occurrences: Sequence[Occurrence]) -> bool:
        """Fence and deliver ``occurrences`` now, a chunk at a time; False if the broker
        failed."""
        for start in range(0, len(occurrences), self.chunk):
            if not self.deliver([self.fence(occurrences[start : start + self.chunk])]):
                return False
        return True

    def flush(self, *, settle: bool = True) -> None:
        """Mark what the broker confirmed while the store was failing, and settle what was
        marked and not settled yet (unless ``settle`` is False: a burst is being written)."""
        with self._lock:
            keys, self.unmarked = self.unmarked, []
        if keys:
            with self.runner.hold_signals():
                self._mark(keys)
        if settle:
            self.settle()

    def close(self) -> None:
        """Write nothing more; finish the marks under way and settle what was marked."""
        self.halted = True
        with self.runner.hold_signals():
            self.runner.shutdown()
            try:
                self.flush()
            except StoreError as exc:  # what is left, another replica's recovery settles
                logger.debug("voltro_beat: could not settle at close: %s", exc)

    # -- the steps --------------------------------------------------------------------------

    def _write(self, occurrences: Sequence[Occurrence]) -> tuple[list[str], bool]:
        """Send ``occurrences``; return the keys the broker took, and whether it answered
        for every message (False: it failed, the rest stays for recovery)."""
        messages = [(self.entries[o.schedule], o.key, o.task_id) for o in occurrences]
        answered = len(messages)
        refused: dict[int, str] = {}
        try:
            refused = self.publisher.publish(messages)
        except PublishError as exc:
            # Fail closed: what the broker did not answer for stays ``claimed``; once its
            # lease runs out a recovery sweep republishes it with the same task ids.
            if not self.broker_down:
                logger.warning("voltro_beat: broker unreachable, will retry: %s", exc)
            self.broker_down = True
            self.metrics.broker_error()
            answered, refused = exc.confirmed, exc.refused
        else:
            if self.broker_down:
                logger.warning("voltro_beat: broker is reachable again")
            self.broker_down = False
        if refused:
            self._refuse([messages[i][1] for i in sorted(refused)], refused)
        elif self.refusing and answered == len(messages):
            logger.warning("voltro_beat: the broker takes every message again")
            self.refusing = False
        taken = [o for i, o in enumerate(occurrences[:answered]) if i not in refused]
        for o in taken:
            entry = self.entries[o.schedule]
            logger.info(
                "Scheduler: Sent due task %s (%s) as %s",
                entry.name,
                entry.task,
                o.key,
                extra=logs.fields(key=o.key, schedule=o.schedule),
            )
        if self.metrics.enabled:
            self.metrics.published(taken, self.clock.now())
        return [o.key for o in taken], answered == len(messages)

    def _refuse(self, keys: list[str], reasons: Mapping[int, str]) -> None:
        """Give the runs of ``keys``, refused by the broker, back to recovery at once."""
        by_reason: dict[str, list[str]] = {}
        for key, reason in zip(keys, (reasons[i] for i in sorted(reasons)), strict=True):
            by_reason.setdefault(reason, []).append(key)
        level = logging.DEBUG if self.refusing else logging.WARNING
        self.refusing = True
        for reason, refused in by_reason.items():
            logger.log(
                level,
                "voltro_beat: %s: %d messages not sent (%s); retried within their "
                "max_lateness, else recorded missed (broker_refused)",
                reason,
                len(refused),
                ", ".join(refused[:5]),
                extra=logs.fields(keys=refused[:5], count=len(refused), reason=reason),
            )
            try:
                self.store.refuse(refused, reason=reason)
            except StoreError as exc:  # their leases run out on their own
                logger.debug("voltro_beat: could not hand refused runs back: %s", exc)

    def _holds(self, fenced: Fenced) -> bool:
        """Whether at least a whole lease of ``fenced`` is left, on the latest the database's
        clock can read."""
        if fenced.held_until is None:
            return False
        _, latest = self.clock.bounds(fenced.reading)
        return fenced.held_until - latest >= self.lease

    def _start_mark(self, keys: list[str]) -> Future[None] | None:
        """Mark ``keys`` in the background (the runner), or here if :meth:`close` already
        stopped it (a write under way when the process was told to stop is still marked)."""
        if not keys:
            return None
        try:
            return self.runner.submit(lambda: self._mark(keys))
        except RuntimeError:  # the marker was shut down
            self._mark(keys)
            return None

    def _keep(self, kept: list[str], keys: Sequence[str]) -> None:
        with self._lock:
            kept.extend(keys)

    def settle(self) -> None:
        """Record the runs marked published as ``published`` (one statement per batch: off a
        burst's critical path, after its last write)."""
        with self._lock:
            keys, self.unsettled = self.unsettled, []
        try:
            self.store.settle(keys)
        except BaseException:  # a StoreError, or SystemExit from Celery's SIGTERM handler
            self._keep(self.unsettled, keys)
            raise

    def _mark(self, keys: list[str]) -> None:
        try:
            lost = self.store.mark_published(keys)
        except BaseException:  # a StoreError, or SystemExit from Celery's SIGTERM handler
            self._keep(self.unmarked, keys)
            raise
        self._keep(self.unsettled, keys)
        if lost:
            logger.warning(
                "voltro_beat: %d runs were sent after their lease ran out (this replica was "
                "paused between fence and broker write); another replica may send them too, "
                "with the same task ids: %s",
                len(lost),
                ", ".join(sorted(lost)[:5]),
                extra=logs.fields(keys=sorted(lost)[:5], count=len(lost)),
            )

    @contextmanager
    def _renewing(self, keys: Collection[str]) -> Iterator[None]:
        """Renew the leases of ``keys`` every quarter of the hold until the block ends."""

        def renew() -> None:
            try:
                self.store.fence(keys, hold=self.hold)
            except StoreError as exc:
                logger.debug("voltro_beat: could not renew leases: %s", exc)

        stop = self.runner.every(self.hold.total_seconds() / 4, renew)
        try:
            yield
        finally:
            stop()


def _wait(marking: Future[None] | None) -> None:
    """Wait for a mark under way (raises :class:`StoreError` if it failed)."""
    if marking is not None:
        marking.result()
