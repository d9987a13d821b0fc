"""Groups no live replica serves: their occurrences are recorded ``missed`` (reason
``no_replica``) by the replicas of the other groups, once past their lateness.

A replica fires only its group's schedules, but the app's ``beat_schedule`` names every
group's, so every replica knows them all. At each heartbeat it looks at the registry: a group
with schedules and no live replica (in any coordination) fires nothing, and that is loud: an
error in the log, the ``voltro_beat_group_unserved`` gauge, and a ``missed`` row for each of
its occurrences once it is past its ``max_lateness`` and a lease more (the registry may lag
by that much behind a replica of that group that just booted, whose catch-up looks back
``max_lateness``; once it sees that replica, it records what falls before that catch-up's
window). Every replica of the other groups does it; the claims table (or the run row's
key) lets one row in. Occurrences are walked from the newest one the store has of the schedule
(else from when this replica saw the group unserved), at most
:data:`~voltro_beat.catchup.MAX_BACKFILL` per schedule at a time.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from voltro_beat import logs
from voltro_beat.catchup import MAX_BACKFILL, newest
from voltro_beat.coordination import Coordination
from voltro_beat.metrics import Metrics
from voltro_beat.occurrences import Occurrence
from voltro_beat.replicas import Replica
from voltro_beat.runs import Run
from voltro_beat.schedules import DEFAULT_GROUP, Entry
from voltro_beat.status import Reason, Status
from voltro_beat.store.beat import BeatStore

logger = logging.getLogger(__name__)

#: When a replica of the group joins again, its catch-up looks back ``max_lateness`` from a
#: clock reading taken just after its registry row's ``started_at``: the occurrences up to
#: that reading less ``max_lateness``, and this margin (the join's round trip), are recorded
#: here, so that none falls between. One that could still be published is then this margin
#: short of its lateness.
JOIN_MARGIN = timedelta(seconds=1)


class Unserved:
    """The other groups' schedules, and what to record of those no live replica serves."""

    def __init__(
        self,
        store: BeatStore,
        others: Iterable[Entry],
        coordination: Coordination,
        lease: timedelta,
        metrics: Metrics,
    ) -> None:
        self._store = store
        self._coordination = coordination
        self._lease = lease
        self._metrics = metrics
        #: Group -> its schedules that fire on beat (an external one has no cadence to miss).
        self.groups: dict[str, list[Entry]] = defaultdict(list)
        for entry in others:
            if entry.trigger == "beat":
                self.groups[entry.group].append(entry)
        #: Schedule -> the newest instant already recorded or looked at, for the groups
        #: unserved now.
        self._after: dict[str, datetime] = {}

    def record(self, live: Iterable[Replica], now: datetime) -> None:
        """Record the :meth:`runs` due now; one replica's row goes in."""
        runs = self.runs(live, now)
        if runs:
            won = self._store.claim(runs, coordination=self._coordination, lease=self._lease)
            self._metrics.missed([r for r in runs if r.occurrence.key in won])

    def runs(self, live: Iterable[Replica], now: datetime) -> list[Run]:
        """The ``missed`` runs to record now of the groups no replica in ``live`` serves."""
        if not self.groups:
            return []
        started: dict[str, datetime] = {}
        for r in live:
            group = str(r.settings.get("group", DEFAULT_GROUP))
            if r.started_at is not None:
                started[group] = min(started.get(group, r.started_at), r.started_at)
            else:
                started.setdefault(group, now)
        runs: list[Run] = []
        for group, entries in self.groups.items():
            gone = group not in started
            if self._metrics.enabled:
                self._metrics.group_unserved(group, gone)
            if gone:
                if entries[0].name not in self._after:
                    self._start(group, entries, now)
                runs += self._missed(entries, now - self._lease)
            elif entries[0].name in self._after:
                # Served again: up to where the catch-up of its replica looks back from.
                runs += self._missed(entries, started[group] + JOIN_MARGIN)
                for entry in entries:
                    del self._after[entry.name]
                logger.info(
                    "voltro_beat: group %s has a live replica again",
                    group,
                    extra=logs.fields(group=group),
                )
        return runs

    def _missed(self, entries: list[Entry], until: datetime) -> list[Run]:
        """The runs of ``entries``' occurrences since the last looked at, up to ``until`` less
        each one's ``max_lateness``."""
        runs: list[Run] = []
        for entry in entries:
            end, after = until - entry.max_lateness, self._after[entry.name]
            if end <= after:
                continue
            instants, _ = newest(entry, after, end, MAX_BACKFILL)
            runs += [
                Run(Occurrence.of(entry.name, at), entry.task, Status.MISSED, Reason.NO_REPLICA)
                for at in instants
            ]
            self._after[entry.name] = end
        return runs

    def _start(self, group: str, entries: list[Entry], now: datetime) -> None:
        last: Mapping[str, datetime] = self._store.last_scheduled([e.name for e in entries])
        for entry in entries:
            self._after[entry.name] = last.get(entry.name, now)
        logger.error(
            "voltro_beat: group %s: %d schedules and NO LIVE REPLICA: nothing fires them; "
            "their occurrences are recorded missed (no_replica) once past their lateness. "
            "Start a replica with voltro_beat_group=%s",
            group,
            len(entries),
            group,
            extra=logs.fields(group=group, count=len(entries)),
        )
