"""Claimed runs -> broker, under the publish fence (guarantee 10): fence, write, mark.

The one sequence every publish goes through, whoever publishes (beat at an instant, its
recovery sweep, a queued run's promotion):

1. **fence** a chunk of at most :data:`CHUNK` runs: one statement confirms in the store that
   this replica still holds each run (its lease runs, its deadline has not passed) and renews
   the lease; whatever the store refuses is not sent;
2. **write** the chunk to the broker; while the write is under way the leases are renewed from a
   thread of their own, so a broker that is merely slow keeps its runs (a paused process renews
   nothing, and loses them);
3. **mark** the chunk once the broker confirmed it (its publish time stamped, its leases
   ended: no recovery takes it over any more), on a thread of its own while the next chunk is
   written: at most two chunks are ever written and unmarked at once;
4. **settle**: once every chunk is written and marked, the marked runs still ``claimed`` are
   recorded ``published`` (the status change costs the store more than the mark, and waits
   until the messages are out).

Beat fences the runs of an instant a little before it, so that at the instant only writes and
marks are left; the pause between a fence and its write (a fraction of a second, unless the
process is paused) must stay shorter than the lease, which is the window guarantee 10 states.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from voltro_beat.exceptions import PublishError, StoreError
from voltro_beat.metrics import Metrics
from voltro_beat.occurrences import Occurrence
from voltro_beat.publisher import Publisher
from voltro_beat.schedules import Entry
from voltro_beat.store.beat import BeatStore

logger = logging.getLogger(__name__)

#: Runs per fence and per broker write: a crash between a write and its mark leaves at most
#: two chunks (the one being marked, the one being written) to be sent again.
CHUNK = 1000


@dataclass(frozen=True, slots=True)
class Fenced:
    """A chunk of runs the fence let through at ``fenced_at`` (this replica's clock)."""

    runs: list[Occurrence]
    fenced_at: datetime


class Dispatcher:
    """Fences, writes and marks runs for one replica, on its clock ``now``."""

    def __init__(
        self,
        store: BeatStore,
        publisher: Publisher,
        entries: Mapping[str, Entry],
        lease: timedelta,
        now: Callable[[], datetime],
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics or Metrics()
        self.publisher = publisher
        self.entries = entries
        self.lease = lease
        self.now = now
        #: Confirmed by the broker, not yet marked (the store failed): marked first thing.
        self.unmarked: list[str] = []
        self.broker_down = False
        #: Set by :meth:`close`, which Celery's SIGTERM handler may run in the middle of a tick:
        #: whatever that tick does next writes nothing to the broker.
        self.closed = False
        self._marker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="voltro-beat-mark")

    def fence(self, occurrences: Sequence[Occurrence]) -> Fenced:
        """The runs of ``occurrences`` this replica may still send, their leases renewed."""
        at = self.now()
        fenced = self.store.fence([o.key for o in occurrences], hold=self.lease)
        if len(fenced) < len(occurrences):
            logger.warning(
                "voltro_beat: %d claimed runs no longer held by this replica (paused past "
                "their lease, taken over, or past their deadline): not sent",
                len(occurrences) - len(fenced),
            )
        return Fenced([o for o in occurrences if o.key in fenced], at)

    def deliver(self, chunks: Sequence[Fenced]) -> bool:
        """Write fenced ``chunks`` in order, each marked as soon as the broker confirmed it,
        then settle them; False (and the rest left for recovery) once the broker fails.

        A chunk fenced half a lease ago or more (this process was paused or held up since) is
        fenced again first: the store decides again what is still this replica's.
        Raises :class:`StoreError` if a mark failed: those runs wait in :attr:`unmarked`.
        """
        marking: Future[None] | None = None
        marked: list[str] = []
        complete = True
        try:
            for fenced in chunks:
                if self.closed:
                    complete = False
                    break
                if self.now() - fenced.fenced_at >= self.lease / 2:
                    fenced = self.fence(fenced.runs)
                chunk = fenced.runs
                if not chunk:
                    continue
                with self._renewing([o.key for o in chunk]):
                    sent = self._write(chunk)
                if marking is not None:
                    marking.result()
                marking = self._start_mark(sent)
                marked += sent
                if len(sent) < len(chunk):
                    complete = False
                    break
        finally:
            if marking is not None:
                marking.result()
        self.store.settle(marked)
        return complete

    def send(self, occurrences: Sequence[Occurrence]) -> bool:
        """Fence and deliver ``occurrences`` now, a chunk at a time; False if the broker
        failed."""
        for start in range(0, len(occurrences), CHUNK):
            if not self.deliver([self.fence(occurrences[start : start + CHUNK])]):
                return False
        return True

    def mark_unmarked(self) -> None:
        """Mark what the broker confirmed while the store was failing."""
        if self.unmarked:
            keys, self.unmarked = self.unmarked, []
            self._mark(keys)
            self.store.settle(keys)

    def close(self) -> None:
        self.closed = True
        self._marker.shutdown(wait=True)

    # -- the steps --------------------------------------------------------------------------

    def _write(self, occurrences: Sequence[Occurrence]) -> list[str]:
        """Send ``occurrences``; return the keys the broker confirmed."""
        messages = []
        for o in occurrences:
            entry = self.entries[o.schedule]
            logger.info("Scheduler: Sending due task %s (%s) as %s", entry.name, entry.task, o.key)
            messages.append((entry, o.key, o.task_id))
        try:
            self.publisher.publish(messages)
            confirmed = [key for _, key, _ in messages]
        except PublishError as exc:
            # Fail closed: what the broker did not confirm stays ``claimed``; once its lease
            # runs out a recovery sweep republishes it with the same task ids.
            if not self.broker_down:
                logger.warning("voltro_beat: broker unreachable, will retry: %s", exc)
            self.broker_down = True
            self.metrics.broker_error()
            confirmed = [key for _, key, _ in messages[: exc.confirmed]]
        else:
            if self.broker_down:
                logger.warning("voltro_beat: broker is reachable again")
            self.broker_down = False
        if self.metrics.enabled:
            self.metrics.published(occurrences[: len(confirmed)], self.now())
        return confirmed

    def _start_mark(self, keys: list[str]) -> Future[None] | None:
        """Mark ``keys`` on the marker thread, or here if :meth:`close` already stopped it (a
        write that was under way when the process was told to stop is still marked)."""
        if not keys:
            return None
        try:
            return self._marker.submit(self._mark, keys)
        except RuntimeError:  # the marker was shut down
            self._mark(keys)
            return None

    def _mark(self, keys: list[str]) -> None:
        try:
            lost = self.store.mark_published(keys)
        except StoreError:
            self.unmarked.extend(keys)
            raise
        if lost:
            logger.warning(
                "voltro_beat: %d runs were sent after their lease ran out (this replica was "
                "paused between fence and broker write); another replica may send them too, "
                "with the same task ids: %s",
                len(lost),
                ", ".join(sorted(lost)[:5]),
            )

    @contextmanager
    def _renewing(self, keys: Collection[str]) -> Iterator[None]:
        """Renew the leases of ``keys`` every third of a lease until the block ends."""
        done = threading.Event()
        renewer = threading.Thread(
            target=_renew, args=(self.store, keys, self.lease, done), daemon=True
        )
        renewer.start()
        try:
            yield
        finally:
            done.set()
            renewer.join()


def _renew(
    store: BeatStore, keys: Collection[str], lease: timedelta, done: threading.Event
) -> None:
    while not done.wait(lease.total_seconds() / 3):
        try:
            store.fence(keys, hold=lease)
        except StoreError as exc:
            logger.debug("voltro_beat: could not renew leases: %s", exc)
