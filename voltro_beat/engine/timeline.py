"""The timeline: every schedule by the time its next occurrences are to be claimed.

An occurrence is claimed a lead ahead of its instant (so that a burst is in the store before
its boundary), a schedule with an overlap policy at its instant (when its predecessor's state
is known), and a schedule another replica fires (yielded to a newer replica's definition, or
in a shard another replica owns) a lease after its instant, in case that replica is gone by
then (see :meth:`voltro_beat.engine.Engine.step`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from voltro_beat.occurrences import next_after
from voltro_beat.schedules import Entry

#: Occurrences of one schedule handled per tick when it is behind (after a pause or outage).
MAX_BACKLOG = 1000
#: How far ahead of its instant an occurrence is claimed: LEAD_MIN, plus CLAIM_COST per
#: schedule, so that a burst of every schedule at once is claimed before its boundary.
#: CLAIM_COST leaves room for three replicas claiming one burst on two cores (the burst
#: workload of bench/README.md).
LEAD_MIN = timedelta(milliseconds=250)
CLAIM_COST = timedelta(microseconds=300)
LEAD_MAX = timedelta(seconds=30)


@dataclass(slots=True)
class Pending:
    """A schedule on the timeline: the occurrences it has to record next, oldest first."""

    entry: Entry
    instants: list[datetime]
    #: Its definition's last instant is before this (it changed then: :meth:`Timeline.end`).
    until: datetime | None = None
    #: False once no instant of it is left: skipped.
    live: bool = True

    def advance(self, now: datetime) -> None:
        """Move past the occurrences just recorded: on to those due by ``now``, or the next."""
        instants: list[datetime] = []
        at = next_after(self.entry.spec, self.instants[-1])
        while at is not None and at <= now and len(instants) < MAX_BACKLOG:
            instants.append(at)
            at = next_after(self.entry.spec, at)
        if not instants and at is not None:
            instants.append(at)
        self.instants = self._before_until(instants)

    def _before_until(self, instants: list[datetime]) -> list[datetime]:
        return instants if self.until is None else [at for at in instants if at < self.until]


class Timeline:
    """Schedules by claim time, soonest first."""

    def __init__(
        self, lease: timedelta, guarded: Collection[str], deferred: Callable[[str], bool]
    ) -> None:
        #: How far ahead of its instant an occurrence is claimed (:meth:`lead_for`).
        self.lead = LEAD_MIN
        self._lease = lease
        #: Schedules with an overlap policy: claimed at their instant.
        self._guarded = guarded
        #: Whether a schedule is another replica's to fire, as far as this one knows now.
        self._deferred = deferred
        self._heap: list[tuple[datetime, int, Pending]] = []
        self._seq = itertools.count()
        #: Each schedule's pending, to drop it in place.
        self._by_name: dict[str, Pending] = {}

    def lead_for(self, ahead: int) -> None:
        """Claim ahead for ``ahead`` schedules claimed ahead (LEAD_MIN, CLAIM_COST)."""
        self.lead = min(LEAD_MAX, LEAD_MIN + CLAIM_COST * ahead)

    def __iter__(self) -> Iterator[Pending]:
        """Every schedule on the timeline, soonest claim time first."""
        return iter([pending for _, _, pending in sorted(self._heap) if pending.live])

    @property
    def next(self) -> datetime | None:
        """The soonest claim time."""
        while self._heap and not self._heap[0][2].live:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def push(self, pending: Pending) -> None:
        self._by_name[pending.entry.name] = pending
        heapq.heappush(self._heap, (self._claim_time(pending), next(self._seq), pending))

    def due(self, now: datetime) -> list[Pending]:
        """Take off the timeline the schedules whose claim time has come."""
        due: list[Pending] = []
        while self._heap and self._heap[0][0] <= now:
            pending = heapq.heappop(self._heap)[2]
            if pending.live:
                due.append(pending)
        return due

    def end(self, name: str, at: datetime) -> None:
        """Schedule ``name``'s definition changed at ``at``: its instants before then are
        still recorded (a step may come late), none after. In place: the rest is skipped
        when it comes up."""
        pending = self._by_name.pop(name, None)
        if pending is not None:
            pending.until = at
            pending.instants = pending._before_until(pending.instants)
            pending.live = bool(pending.instants)

    def requeue(self) -> None:
        """Give every schedule its claim time again (the schedules deferred changed)."""
        self._heap = [(self._claim_time(p), seq, p) for _, seq, p in self._heap if p.live]
        heapq.heapify(self._heap)

    def _claim_time(self, pending: Pending) -> datetime:
        name = pending.entry.name
        if self._deferred(name):
            lead = -self._lease
        elif name in self._guarded:
            lead = timedelta(0)
        else:
            lead = self.lead
        return pending.instants[0] - lead
