"""The schedules table, followed live: what changed since the revision this replica applied,
and each change applied to the engine's parts.

Every :data:`POLL` the engine asks the store for the changes numbered after the revision it
applied (one indexed read, empty while nobody edits) and the rows they touched as they stand
(:meth:`~voltro_beat.store.schedule_rows.ScheduleRows.changed_since`). Each changed schedule
becomes the entry to fire from its change on, or None: removed, disabled, another group's,
shadowed by the app's own entry (``voltro_beat_schedule_conflicts``), or a row that does not
check (written around the API: logged at ERROR, once per revision). An edit takes effect from
the first occurrence of the new definition after its commit, on the database's clock
(docs/schedule-table.md). Applying one costs the changed schedule only: its pending instants
ended in place (those before the change are still recorded), its template forgotten, its
shard, overlap timeout and catch-up floor set.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from voltro_beat import definitions, logs
from voltro_beat.clock import Clock
from voltro_beat.config import Settings
from voltro_beat.engine.ownership import Ownership
from voltro_beat.engine.recorder import Recorder
from voltro_beat.engine.timeline import Pending, Timeline
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.membership import Membership
from voltro_beat.occurrences import next_after
from voltro_beat.publisher import Publisher
from voltro_beat.schedules import Entry
from voltro_beat.store.database import Database
from voltro_beat.store.schedule_rows import ScheduleRow, ScheduleRows

logger = logging.getLogger(__name__)

#: How often a replica reads what changed: an edit is applied by every live replica within
#: about this long plus a step.
POLL = timedelta(milliseconds=500)


@dataclass(frozen=True, slots=True)
class Change:
    """What a replica fires of schedule ``name`` from ``since`` on: ``entry`` (None: nothing)."""

    name: str
    entry: Entry | None
    #: The change's commit, on the database's clock (None for a removed row).
    since: datetime | None


class Live:
    """The schedules table of ``database`` as one replica (``settings``) follows it; ``code``
    holds the app's own entries (every group's). A change is applied to ``entries`` (this
    group's, shared with the engine's parts), ``overlap`` (the ``skip`` / ``queue``
    schedules' timeouts, from ``overlap_timeout``), the timeline, the publisher's templates,
    the registry's view, the recorder and, in ``cluster`` coordination, the shard map."""

    def __init__(
        self,
        database: Database,
        settings: Settings,
        code: Mapping[str, Entry],
        *,
        entries: dict[str, Entry],
        overlap: dict[str, timedelta],
        overlap_timeout: Callable[[Entry], timedelta],
        timeline: Timeline,
        publisher: Publisher,
        membership: Membership,
        recorder: Recorder,
        ownership: Ownership | None,
        clock: Clock,
    ) -> None:
        self.rows = ScheduleRows(database)
        self._settings = settings
        self._code = code  # read only (a copy costs megabytes at 100,000 schedules)
        self._entries = entries
        self._overlap = overlap
        self._overlap_timeout = overlap_timeout
        self._timeline = timeline
        self._publisher = publisher
        self._membership = membership
        self._recorder = recorder
        self._ownership = ownership
        self._clock = clock
        #: The newest revision applied (0: none yet).
        self.applied = 0
        #: Whether the table was read once (an empty one too: later reads ask what changed).
        self._read = False
        #: Schedules of the table that no longer fire here (removed, disabled, moved to
        #: another group): known still, for the runs they have claimed already.
        self.silent: set[str] = set()
        #: (schedule, revision) of rows already said not to check.
        self._said: set[tuple[str, int]] = set()

    def follow(self, *, boot: bool) -> bool:
        """Read and apply what changed; return whether anything did (raises
        :class:`~voltro_beat.exceptions.StoreError`). At boot the catch-up and the timeline
        take the table's schedules after this, as the app's; later each one is pushed from
        the first occurrence of its new definition after its change."""
        newest, changes = self.changes()
        for change in changes:
            self._apply(change, boot=boot)
        self.applied = self._membership.revision = newest
        self._membership.follow(c.name for c in changes if c.name in self._membership.table)
        return bool(changes)

    def _apply(self, change: Change, *, boot: bool) -> None:
        name, entry = change.name, change.entry
        # A removed row's change is not read: now is after it, and the claim refuses what the
        # old definition would fire after the change.
        since = change.since or self._clock.now()
        self._timeline.end(name, since)
        self._publisher.forget(name)
        self._membership.table.discard(name)
        self._overlap.pop(name, None)
        if entry is None or entry.group != self._settings.group:
            # Its last definition stays known: runs claimed already publish and are recovered.
            if name in self._entries:
                self.silent.add(name)
            return
        self._entries[name] = entry
        self.silent.discard(name)
        self._membership.table.add(name)
        self._recorder.track(entry, since)
        if self._ownership is not None:
            self._ownership.track(name)
        if entry.on_overlap != "allow":
            self._overlap[name] = self._overlap_timeout(entry)
        first = next_after(entry.spec, since)
        if not boot and entry.trigger == "beat" and first is not None:
            self._timeline.push(Pending(entry, [first]))

    def changes(self) -> tuple[int, list[Change]]:
        """The newest revision and what changed after :attr:`applied` (raises
        :class:`~voltro_beat.exceptions.StoreError`): at the first read every row as it
        stands, not the whole history (:meth:`follow` applies them)."""
        if not self._read:
            newest = self.rows.revision()
            rows: Mapping[str, ScheduleRow | None] = {r.name: r for r in self.rows.all()}
            self._read = True
        else:
            newest, rows = self.rows.changed_since(self.applied)
        return newest, [self._change(name, row) for name, row in rows.items()]

    def check(self) -> None:
        """At boot: raise :class:`ConfigurationError` for a schedule that both the app and
        the table define, unless ``voltro_beat_schedule_conflicts`` says which wins (raises
        :class:`~voltro_beat.exceptions.StoreError` if the table cannot be read)."""
        if self._settings.schedule_conflicts != "error" or not self._code:
            return
        both = sorted(self.rows.get(sorted(self._code)))
        if both:
            raise ConfigurationError(
                "defined both in the app's beat_schedule and in the schedules table; remove "
                "one, or set voltro_beat_schedule_conflicts to 'code' or 'table' to say which "
                "wins",
                entry=both[0],
                field="name",
            )

    def _change(self, name: str, row: ScheduleRow | None) -> Change:
        if row is None:  # removed: the app's entry of that name fires again, if any
            return Change(name, self._code.get(name), None)
        if name in self._code and self._settings.schedule_conflicts != "table":
            self._say(
                name,
                row.revision,
                "voltro_beat: schedule %s is defined by the app and in the schedules table "
                "(revision %d): the app's definition fires (voltro_beat_schedule_conflicts)",
            )
            return Change(name, self._code[name], row.changed_at)
        if not row.enabled:
            return Change(name, None, row.changed_at)
        try:
            entry = definitions.check(
                name,
                row.definition,
                tz=self._settings.timezone,
                max_lateness=self._settings.max_lateness,
            )
        except ConfigurationError as exc:
            self._say(
                name,
                row.revision,
                "voltro_beat: the schedules table's row %s (revision %d) does not check, and "
                "does not fire: %s",
                exc,
            )
            return Change(name, None, row.changed_at)
        return Change(name, dataclasses.replace(entry, revision=row.revision), row.changed_at)

    def _say(self, name: str, revision: int, message: str, *args: object) -> None:
        """Log ``message`` at ERROR, once per schedule and revision."""
        if (name, revision) not in self._said:
            self._said.add((name, revision))
            logger.error(message, name, revision, *args, extra=logs.fields(schedule=name))
