"""What this replica won ahead and holds until its instant: fenced shortly before it,
published at it (:mod:`voltro_beat.dispatch`), flushed at close.

The engine (:mod:`voltro_beat.engine.firing`) claims occurrences a lead ahead of their
instant and hands over the ones it won; this queue fences them half a claim lead before their
instant, so that at the instant only the broker writes and the marks are left, and says when
it next needs to run.
"""

from __future__ import annotations

import collections
import heapq
import logging
from datetime import UTC, datetime, timedelta

from voltro_beat import logs
from voltro_beat.clock import Clock
from voltro_beat.dispatch import Dispatcher, Fenced
from voltro_beat.engine.timeline import Timeline
from voltro_beat.occurrences import Occurrence

logger = logging.getLogger(__name__)

NEVER = datetime.max.replace(tzinfo=UTC)
#: The longest one call of :meth:`Ready.publish` goes on fencing and writing (seconds): the
#: rest is the next step's, which comes at once, after the heartbeat if one is due. A third of
#: a million occurrences published in one step (a replica's share of a million in cluster
#: coordination, three replicas on two cores) took longer than the shards' leases, renewed
#: by the heartbeat alone: the shards moved in the middle of the burst.
SLICE = 1.0
#: Fenced chunks written in one go, between two looks at the time: a slice runs over by at
#: most that many writes. Ten (10,000 messages, 2 s at a million schedules with three replicas
#: on two cores) let the three publish calls of a step outlast the shards' 10 s leases.
CHUNKS_AT_ONCE = 2


class Ready:
    """The occurrences one replica won ahead, until each is published at its instant."""

    def __init__(self, dispatch: Dispatcher, clock: Clock, timeline: Timeline) -> None:
        self._dispatch = dispatch
        self._clock = clock
        self._timeline = timeline
        #: Occurrences this replica won, by instant: fenced shortly before it, published at it.
        self._ready: list[tuple[datetime, str, Occurrence]] = []
        #: Fenced chunks, oldest instant first: published when their instant comes.
        self._armed: collections.deque[Fenced] = collections.deque()

    def push(self, o: Occurrence) -> None:
        """Hold ``o``, won ahead, for its instant."""
        heapq.heappush(self._ready, (o.scheduled_at, o.key, o))

    def publish(self) -> None:
        """Fence the occurrences won ahead whose instant is near, and publish those whose
        instant has come.

        The fence comes half a claim lead before the instant, so that at the instant only the
        broker writes and the marks are left; an occurrence the fence no longer finds this
        replica's (its lease ran out while this process was paused, another replica took it
        over) is not sent. Fencing stops once the oldest fenced chunk is due: that is written
        first, and the rest is fenced and written a chunk at a time (fencing a whole burst of
        100 chunks on a loaded host outlasted the first chunks' leases: they went to
        recovery). If the broker fails, what is left of the instant stays ``claimed`` and goes
        to recovery once its lease runs out. After :data:`SLICE` it returns, the rest due
        still (:meth:`next_publish`). What was written is settled once nothing is due (a
        settle statement between two slices of a burst held its last message by seconds).
        """
        started = self._clock.monotonic()

        def going() -> bool:
            return self._clock.monotonic() - started < SLICE

        while going():
            fence_until = self._clock.now() + self.fence_lead
            while (
                self._ready
                and self._ready[0][0] <= fence_until
                and not (self._armed and self._dispatch.until(self._armed[0]) <= timedelta(0))
                and going()
            ):
                at = self._ready[0][0]
                chunk: list[Occurrence] = []
                while len(chunk) < self._dispatch.chunk and self._ready and self._ready[0][0] == at:
                    chunk.append(heapq.heappop(self._ready)[2])
                self._armed.append(self._dispatch.fence(chunk))
            due: list[Fenced] = []
            while (
                self._armed
                and self._dispatch.until(self._armed[0]) <= timedelta(0)
                and len(due) < CHUNKS_AT_ONCE
            ):
                due.append(self._armed.popleft())
            if not due:
                self._dispatch.settle()
                return
            if not self._dispatch.deliver(due, settle=False):
                self._armed = collections.deque(
                    a for a in self._armed if self._dispatch.until(a) > timedelta(0)
                )
                self._dispatch.settle()
                return

    @property
    def waiting(self) -> int:
        """The occurrences won ahead and not written yet (fenced or not): what this replica
        holds to publish before whatever it claims next (the claims' leases run longer by
        it, :mod:`voltro_beat.engine.recorder`)."""
        return len(self._ready) + sum(len(fenced.occurrences) for fenced in self._armed)

    @property
    def fence_lead(self) -> timedelta:
        """How long before their instant the occurrences claimed ahead are fenced: half the
        claim lead. A fence ahead leases its runs from their instant (see
        Dispatcher.fence), so it holds them at the instant however early it came: a burst of
        100,000 (a claim lead of 30 s) is fenced 15 s ahead, and its boundary is left with
        the broker writes and the marks alone (fenced 2.5 s ahead, the fences of such a burst
        ran on past its boundary, between its writes)."""
        return self._timeline.lead / 2

    def next_publish(self) -> datetime:
        """When the occurrences won ahead next need a fence or a write."""
        wake = NEVER
        if self._ready:
            wake = min(wake, self._ready[0][0] - self.fence_lead)
        if self._armed:
            wake = min(wake, self._clock.now() + self._dispatch.until(self._armed[0]))
        return wake

    def flush(self, wait: timedelta) -> None:
        """Publish the occurrences claimed ahead, each at its instant, waiting at most
        ``wait``; what is left is republished by another replica's recovery sweep."""
        end = self._clock.monotonic() + wait.total_seconds()
        try:
            while self._ready or self._armed:
                # Not the engine's _next_due(): a claim time already past (no claims at close)
                # would make this loop spin without sleeping. Found by tests/sim (seed 18).
                until = (self.next_publish() - self._clock.now()).total_seconds()
                if until > end - self._clock.monotonic():
                    break
                self._dispatch.runner.sleep(max(0.0, until))
                self.publish()
        except Exception as exc:  # a stopping beat must still stop
            logger.warning("voltro_beat: could not publish claimed runs at close: %s", exc)
        left = self.waiting
        if left:
            logger.warning(
                "voltro_beat: %d claimed runs left for another replica's recovery sweep",
                left,
                extra=logs.fields(count=left),
            )
