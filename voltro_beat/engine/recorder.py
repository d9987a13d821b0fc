"""The gate's side of firing: occurrences sent through the coordination gate in one
statement, the ones this replica won kept for their instant, the others' fates logged; and
the catch-ups owed (at boot, or for a shard just taken), kept until recorded.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from voltro_beat import catchup, logs
from voltro_beat.coordination import Coordination
from voltro_beat.engine.guard import Guard
from voltro_beat.metrics import Metrics
from voltro_beat.occurrences import Occurrence
from voltro_beat.runs import Run
from voltro_beat.schedules import Entry, cadence
from voltro_beat.shards import Tenure
from voltro_beat.status import Reason, Status
from voltro_beat.store.beat import BeatStore

logger = logging.getLogger(__name__)

#: Occurrences per claim statement, and per step of the engine (:meth:`Timeline.due`): what a
#: statement won is published as its instant comes before the next statement, and the
#: heartbeat runs between them. In one statement of 100,000 (a cold start with the boundary
#: inside the claim lead, three replicas on two cores) the claim outlasted the leases,
#: counted from the instant, and all of it went through recovery; at a million schedules in
#: cluster coordination a step of every statement of a burst outlasted the shards' leases.
BATCH = 10_000
#: A claim's lease runs from the occurrence's instant for the publish timeout, and this much
#: longer for each occurrence the replica holds to publish before it (what it claimed ahead
#: and has not fenced yet, and the statement's own): the fence, write and mark of one
#: message with three replicas on two cores (a million schedules in cluster coordination:
#: about 15,000 a second for the three). With the lease alone, a replica's third of a
#: million burst met its leases at the fence 10 s after the instant, and the rest of it went
#: through recovery, at a third of the speed, while the replica was healthy and busy.
WRITE_COST = timedelta(microseconds=200)


class Since(Protocol):
    """Schedule -> an instant, for the names asked (a dict, or the registry's
    :class:`~voltro_beat.membership.Runners`)."""

    def get(self, name: str, /) -> datetime | None: ...


def run_of(entry: Entry, at: datetime, now: datetime, down: datetime | None) -> Run:
    """The run of ``entry``'s occurrence at ``at`` to record ``now``: ``claimed`` until its
    deadline, ``missed`` after it (guarantee 6), because the store was down since ``down``
    or late."""
    occurrence = Occurrence.of(entry.name, at)
    deadline = at + entry.max_lateness
    if now <= deadline:
        return Run(occurrence, entry.task, deadline=deadline)
    reason = (
        Reason.STORE_DOWN if down is not None and at >= down - entry.max_lateness else Reason.LATE
    )
    return Run(occurrence, entry.task, Status.MISSED, reason)


class Recorder:
    """Records occurrences of one replica's schedules in the store."""

    def __init__(
        self,
        store: BeatStore,
        entries: Mapping[str, Entry],
        guard: Guard,
        coordination: Coordination,
        lease: timedelta,
        graces: dict[str, timedelta],
        metrics: Metrics,
    ) -> None:
        self._store = store
        self._entries = entries
        self._guard = guard
        self._coordination = coordination
        self._lease = lease
        #: Per schedule: claims older than this much before a won occurrence are pruned.
        self._graces = graces  # its own from here on (:func:`graces` makes a new one)
        #: Per schedule of the schedules table: its last change, before which no catch-up
        #: looks (enabling it again fires nothing for the time it was disabled).
        self._floors: dict[str, datetime] = {}
        self._metrics = metrics
        #: Catch-ups owed (:meth:`owe`), oldest first, kept until recorded.
        self._owed: collections.deque[_Owed] = collections.deque()

    @property
    def batch(self) -> int:
        """Occurrences per claim statement (:data:`BATCH`)."""
        return BATCH

    def record(
        self, runs: list[Run], now: datetime, tenure: Tenure | None = None, behind: int = 0
    ) -> Iterator[list[Occurrence]]:
        """Send ``runs`` through the gate (as the shard owner ``tenure`` says, in ``cluster``
        coordination), a statement of :data:`BATCH` at a time (the engine hands it one
        statement's worth a step); yield the occurrences each statement won to publish, as it
        commits. ``behind``: the occurrences this replica holds to publish before these
        (their leases run :data:`WRITE_COST` longer for each, and for each of the
        statement's)."""
        # Sorted by key, every replica locks the keys of a statement in the same order: no
        # deadlock between claim statements (each is a transaction of its own).
        runs = sorted(self._guard.apply(_revised(runs, self._entries), now), key=_key)
        recorded: dict[tuple[str, str, str | None], list[datetime]] = collections.defaultdict(list)
        for i in range(0, len(runs), BATCH):
            batch = runs[i : i + BATCH]
            with self._metrics.claim_statement():
                won = self._store.claim(
                    batch,
                    coordination=self._coordination,
                    lease=self._lease + WRITE_COST * (behind + len(batch)),
                    prune=self._graces,
                    tenure=tenure,
                )
            self._metrics.recorded(batch, won)
            lost = len(batch) - len(won)
            if lost:
                logger.debug(
                    "voltro_beat: %d occurrences claimed by other replicas",
                    lost,
                    extra=logs.fields(count=lost),
                )
            won_claims: list[Occurrence] = []
            behind += len(won)
            for run in batch:
                o = run.occurrence
                if o.key not in won:
                    continue
                if run.status == Status.CLAIMED:
                    won_claims.append(o)
                else:
                    logger.debug(
                        "voltro_beat: %s recorded %s (%s)",
                        o.key,
                        run.status,
                        run.reason,
                        extra=logs.fields(
                            key=o.key, schedule=o.schedule, status=run.status, reason=run.reason
                        ),
                    )
                    recorded[o.schedule, run.status, run.reason].append(o.scheduled_at)
            yield won_claims
        self._summarise(recorded)

    def track(self, entry: Entry, floor: datetime) -> None:
        """Record ``entry`` (of the schedules table, changed at ``floor``) from now on."""
        self._graces.update(graces([entry]))
        self._floors[entry.name] = floor

    def owe(
        self,
        entries: list[Entry],
        now: datetime,
        live_since: Since,
        since: Since | None,
        live_until: Mapping[str, datetime],
    ) -> None:
        """Owe a catch-up of ``entries`` as things stand ``now`` (:meth:`catch_up`'s
        arguments): :meth:`settle` records it."""
        if entries:
            ordered = sorted(entries, key=lambda e: e.name)
            self._owed.append(_Owed(ordered, now, live_since, since, live_until))

    @property
    def owing(self) -> bool:
        """Whether a catch-up is owed still (:meth:`settle` records it a statement a step)."""
        return bool(self._owed)

    def settle(
        self, now: datetime, tenure: Tenure | None, start: float = 0.0, behind: int = 0
    ) -> list[Occurrence]:
        """Record the next statement's worth of the catch-ups owed, oldest first; return the
        occurrences won. The engine settles a statement a step, the heartbeat (and in
        ``cluster`` coordination the shards' leases) renewed between them: a replica taking
        a third of a million schedules' shards over does not outlast their leases doing it.

        A catch-up starts at fraction ``start`` of its schedules by name (the replica's rank
        among the live replicas), so that replicas that boot at once each win a share of it,
        and goes round from there. A step plans the runs of at most a statement's worth of
        schedules (one look-up of their last runs) and records at most one statement: a
        catch-up of a third of a million schedules with no history planned them all in one
        step, 34 look-ups, and outlasted the shards' leases. One that meets a store error
        stays owed and is tried again, as it stood when owed (the shard is no longer "just
        taken" by then). ``behind``: as :meth:`record`'s."""
        if not self._owed:
            return []
        c = self._owed[0]
        if not c.begun:
            first = int(start * len(c.entries))
            c.entries = c.entries[first:] + c.entries[:first]
            c.begun = True
        if len(c.runs) < BATCH and c.entries:
            c.runs += self.catch_up(c.entries[:BATCH], c.now, c.live_since, c.since, c.live_until)
            del c.entries[:BATCH]
        won = []
        if c.runs:
            won = [o for part in self.record(c.runs[:BATCH], now, tenure, behind) for o in part]
            del c.runs[:BATCH]
        if not c.runs and not c.entries:
            self._owed.popleft()
        return won

    def catch_up(
        self,
        entries: Sequence[Entry],
        now: datetime,
        live_since: Since,
        since: Since | None = None,
        live_until: Mapping[str, datetime] | None = None,
    ) -> list[Run]:
        """At boot (in ``cluster`` coordination, when this replica takes their shard): the
        runs of ``entries``' occurrences since their last recorded one (for a schedule with
        none, since ``since[name]``, else from now) that their ``catch_up`` policy asks to
        record
        (:mod:`voltro_beat.catchup`); the policy is for downtime, so not for the occurrences
        after ``live_since[name]``, when a live replica that runs the schedule (this one too)
        had started, nor for those up to ``live_until[name]``, when the live replica that
        owned the schedule's shard released it."""
        last = self._store.last_scheduled([e.name for e in entries])
        backfill: list[Run] = []
        for entry in entries:
            start = last.get(entry.name, None if since is None else since.get(entry.name))
            floor = self._floors.get(entry.name)
            if floor is not None and (start is None or start < floor):
                start = floor
            plan = catchup.plan(
                entry,
                start,
                now,
                on_time=self._lease,
                live_since=live_since.get(entry.name),
                live_until=(live_until or {}).get(entry.name),
            )
            backfill += plan.runs
            if plan.unrecorded_until is not None:
                logger.warning(
                    "voltro_beat: %s: occurrences at or before %s are beyond the catch-up cap "
                    "(%d per schedule) and are not recorded",
                    entry.name,
                    plan.unrecorded_until.isoformat(),
                    catchup.MAX_BACKFILL,
                    extra=logs.fields(schedule=entry.name),
                )
        return backfill

    def _summarise(self, recorded: Mapping[tuple[str, str, str | None], list[datetime]]) -> None:
        """One line per schedule and fate (a catch-up after a long downtime records
        hundreds)."""
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


def _key(run: Run) -> str:
    return run.occurrence.key


def _revised(runs: list[Run], entries: Mapping[str, Entry]) -> list[Run]:
    """``runs`` with the revision of the schedules table that fires them, if any."""
    return [
        run
        if (revision := entries[run.occurrence.schedule].revision) is None
        else dataclasses.replace(run, revision=revision)
        for run in runs
    ]


def graces(entries: Iterable[Entry]) -> dict[str, timedelta]:
    """Per schedule, how long its claims outlive a newer win: about sixty predecessors,
    1 min..1 h (none for a schedule without a cadence)."""
    found = {}
    # Entries of one expression share their spec: one grace per spec, one object per grace.
    of_spec: dict[int, timedelta | None] = {}
    for entry in entries:
        key = id(entry.spec)
        if key not in of_spec:
            step = cadence(entry.spec)
            of_spec[key] = (
                None
                if step is None
                else min(max(step * 60, timedelta(minutes=1)), timedelta(hours=1))
            )
        grace = of_spec[key]
        if grace is not None:
            found[entry.name] = grace
    return found


@dataclass(slots=True)
class _Owed:
    """A catch-up owed: of ``entries`` (by name), as of ``now``, with what the registry and
    the shards said then (:meth:`Recorder.owe`); then, as :meth:`Recorder.settle` goes, the
    schedules not planned yet and the runs planned and not recorded yet."""

    entries: list[Entry]
    now: datetime
    live_since: Since
    since: Since | None
    live_until: Mapping[str, datetime]
    runs: list[Run] = field(default_factory=list)
    #: Whether :meth:`Recorder.settle` began it (from its ``start``).
    begun: bool = False
