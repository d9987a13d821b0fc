"""The overlap guard: occurrences of ``skip`` / ``queue`` schedules with a live predecessor
become ``skipped`` / ``queued`` rows, and queued runs are published once it ended.

The decisions are :mod:`voltro_beat.overlap`'s; this reads the live runs they need from the
store (noting the stale ones there on the way).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from voltro_beat import overlap
from voltro_beat.dispatch import Dispatcher
from voltro_beat.metrics import Metrics
from voltro_beat.runs import Run
from voltro_beat.schedules import Entry
from voltro_beat.status import Reason, Status
from voltro_beat.store.beat import BeatStore

#: How long a live run blocks the next one of a ``skip`` / ``queue`` schedule by default.
DEFAULT_OVERLAP_TIMEOUT = timedelta(hours=1)


class Guard:
    """The overlap policies of one replica's schedules."""

    def __init__(
        self,
        store: BeatStore,
        entries: Mapping[str, Entry],
        timeouts: Mapping[str, timedelta],
        metrics: Metrics,
    ) -> None:
        self._store = store
        self._entries = entries
        #: Per ``skip`` / ``queue`` schedule: how long a live run blocks the next one.
        self.timeouts = timeouts
        self._metrics = metrics

    @property
    def queues(self) -> list[str]:
        """The ``queue`` schedules, whose queued runs wait for their predecessor."""
        return [name for name in self.timeouts if self._entries[name].on_overlap == "queue"]

    def apply(self, runs: list[Run], now: datetime) -> list[Run]:
        """``runs`` with those of guarded schedules that have a live predecessor turned
        ``skipped`` / ``queued``."""
        guarded = sorted(
            {r.occurrence.schedule for r in runs if r.occurrence.schedule in self.timeouts}
        )
        if not guarded:
            return runs
        views = self._live_views(guarded, now)
        decided = []
        for run in sorted(runs, key=lambda r: r.occurrence.scheduled_at):
            name = run.occurrence.schedule
            entry = self._entries[name]
            if entry.on_overlap == "allow" or run.status != Status.CLAIMED:
                decided.append(run)
                continue
            status, reason = overlap.decide(
                entry.on_overlap, run.occurrence.scheduled_at, views[name]
            )
            if status == Status.CLAIMED:
                # Whatever of this schedule follows in the same tick waits behind this one.
                views[name] = overlap.with_claimed(views[name], replace(run, since=now))
            decided.append(replace(run, status=status, reason=reason))
        return decided

    def promote(self, now: datetime, dispatch: Dispatcher, lease: timedelta) -> None:
        """Record the queued runs past their lateness missed, and publish the oldest other
        queued run of each ``queue`` schedule whose predecessor ended."""
        views = self._live_views(self.queues, now)
        for name, view in views.items():
            overdue, run = overlap.promotion(view, now, self._entries[name].max_lateness)
            if overdue:
                keys = [r.occurrence.key for r in overdue]
                self._store.mark_missed(keys, reason=Reason.LATE, waiting=Status.QUEUED)
                self._metrics.missed(
                    [replace(r, status=Status.MISSED, reason=Reason.LATE) for r in overdue]
                )
            if run is not None and self._store.promote(run.occurrence.key, lease=lease):
                dispatch.send([run.occurrence])

    def _live_views(self, names: list[str], now: datetime) -> dict[str, overlap.View]:
        """Each schedule's live runs; stale ones are marked in their rows on the way."""
        since = now - max(self._live_window(n) for n in names)
        live: dict[str, list[Run]] = {name: [] for name in names}
        for run in self._store.live_runs(names, since=since):
            live[run.occurrence.schedule].append(run)
        views = {
            name: overlap.view(runs, now=now, timeout=self.timeouts[name])
            for name, runs in live.items()
        }
        stale = [run.occurrence.key for v in views.values() for run in v.stale]
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
        window = self.timeouts[name] * 2
        entry = self._entries[name]
        return window + entry.max_lateness if entry.on_overlap == "queue" else window
