"""The timeline: every schedule this replica fires by the time its next occurrences are to be
claimed.

An occurrence is claimed a lead ahead of its instant (so that a burst is in the store before
its boundary), a schedule with an overlap policy at its instant (when its predecessor's state
is known), and a schedule yielded to a newer replica's definition a lease after its instant,
in case that replica is gone by then (see :meth:`voltro_beat.engine.Engine.step`). In
``cluster`` coordination the timeline holds the schedules of the shards this replica owns
alone: the others' are their owners' to fire, and whoever takes a shard over catches up on
it and puts its schedules on its own timeline (at a million schedules, stepping past the
others' occurrences cost each replica more than its own).
"""

from __future__ import annotations

import bisect
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

    def advance(self, now: datetime, nexts: dict[tuple[int, datetime], datetime | None]) -> None:
        """Move past the occurrences just recorded: on to those due by ``now``, or the next.
        ``nexts`` keeps the instants found, per spec and instant, for the other schedules of
        a burst (those of one expression share their spec: a burst of a million schedules
        of one expression finds its next instant once)."""
        spec = self.entry.spec
        instants: list[datetime] = []
        at = shared_next(spec, self.instants[-1], nexts)
        while at is not None and at <= now and len(instants) < MAX_BACKLOG:
            instants.append(at)
            at = shared_next(spec, at, nexts)
        if not instants and at is not None:
            instants.append(at)
        self.instants = self._before_until(instants)

    def _before_until(self, instants: list[datetime]) -> list[datetime]:
        return instants if self.until is None else [at for at in instants if at < self.until]


def shared_next(
    spec: object, after: datetime, nexts: dict[tuple[int, datetime], datetime | None]
) -> datetime | None:
    """``next_after(spec, after)``, kept in ``nexts`` for the other schedules of one step that
    share ``spec`` (the entries of one expression share it)."""
    key = (id(spec), after)
    if key not in nexts:
        nexts[key] = next_after(spec, after)
    return nexts[key]


class Timeline:
    """Schedules by claim time, soonest first."""

    def __init__(
        self,
        lease: timedelta,
        guarded: Collection[str],
        deferred: Callable[[str], bool],
        held: Callable[[str], bool],
    ) -> None:
        #: How far ahead of its instant an occurrence is claimed (:meth:`lead_for`).
        self.lead = LEAD_MIN
        self._lease = lease
        #: Schedules with an overlap policy: claimed at their instant.
        self._guarded = guarded
        #: Whether a schedule is yielded to another replica, as far as this one knows now.
        self._deferred = deferred
        #: Whether a schedule is this replica's at all (``cluster``: its shard is held here).
        self._held = held
        self._heap: list[tuple[datetime, int, Pending]] = []
        self._seq = itertools.count()
        #: Schedules whose claim time has come, by name, beyond what :meth:`due` handed out
        #: (a burst larger than one claim statement), and the claim time of the first of them.
        self._late: list[Pending] = []
        self._late_since: datetime | None = None
        #: The last schedule :meth:`due` handed out of them: the next part goes on from there.
        self._cursor: str | None = None
        #: Each schedule's pending, to drop it in place.
        self._by_name: dict[str, Pending] = {}

    def lead_for(self, ahead: int) -> None:
        """Claim ahead for ``ahead`` schedules claimed ahead (LEAD_MIN, CLAIM_COST)."""
        self.lead = min(LEAD_MAX, LEAD_MIN + CLAIM_COST * ahead)

    def __iter__(self) -> Iterator[Pending]:
        """Every schedule on the timeline, soonest claim time first."""
        heap = [pending for _, _, pending in sorted(self._heap) if pending.live]
        return iter([pending for pending in self._late if pending.live] + heap)

    @property
    def next(self) -> datetime | None:
        """The soonest claim time."""
        while self._heap and not self._heap[0][2].live:
            heapq.heappop(self._heap)
        soonest = self._heap[0][0] if self._heap else None
        if self._late_since is not None and (soonest is None or self._late_since < soonest):
            return self._late_since
        return soonest

    @property
    def behind(self) -> bool:
        """Whether schedules due are left for the next steps (:meth:`due`)."""
        return bool(self._late)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def push(self, pending: Pending) -> None:
        """Put ``pending`` on the timeline, unless its schedule is not this replica's."""
        if not self._held(pending.entry.name):
            return
        self._by_name[pending.entry.name] = pending
        heapq.heappush(self._heap, (self._claim_time(pending), next(self._seq), pending))

    def due(self, now: datetime, limit: int, start: float = 0.0) -> list[Pending]:
        """Take off the timeline the schedules whose claim time has come, up to ``limit``
        occurrences (one claim statement): a step of a larger burst claims part of it and
        runs again at once, its heartbeat between the statements (at a million schedules
        in cluster coordination a whole burst's claims outlast the shards' leases). The
        part is the one at fraction ``start`` of them by name (the replica's rank among the
        live replicas), so that replicas claiming one burst at once start apart and each
        wins a share of it, and the next steps go on from there; the rest waits here, due."""
        late = self._late
        added = False
        while self._heap and self._heap[0][0] <= now:
            claim_time, _, pending = heapq.heappop(self._heap)
            if pending.live:
                late.append(pending)
                added = True
                if self._late_since is None:
                    self._late_since = claim_time
        late = [p for p in late if p.live]
        if sum(len(p.instants) for p in late) <= limit:
            self._late, self._late_since, self._cursor = [], None, None
            return late
        if added:
            late.sort(key=_name)
        if self._cursor is None:
            first = int(start * len(late))
        else:
            first = bisect.bisect_right(late, self._cursor, key=_name) % len(late)
        late = late[first:] + late[:first]
        n = taken = 0
        while n < len(late) and (not taken or taken + len(late[n].instants) <= limit):
            taken += len(late[n].instants)
            n += 1
        self._late = sorted(late[n:], key=_name)
        self._cursor = late[n - 1].entry.name
        return late[:n]

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
        """Give every schedule its claim time again, and drop those no longer this
        replica's (the schedules deferred, or the shards held, changed)."""
        kept = []
        for p in [p for _, _, p in self._heap] + self._late:
            if not p.live:
                continue
            name = p.entry.name
            if self._held(name):
                kept.append((self._claim_time(p), next(self._seq), p))
            elif self._by_name.get(name) is p:
                del self._by_name[name]
        heapq.heapify(kept)
        self._heap = kept
        self._late, self._late_since, self._cursor = [], None, None

    def _claim_time(self, pending: Pending) -> datetime:
        name = pending.entry.name
        if self._deferred(name):
            lead = -self._lease
        elif name in self._guarded:
            lead = timedelta(0)
        else:
            lead = self.lead
        return pending.instants[0] - lead


def _name(pending: Pending) -> str:
    return pending.entry.name
