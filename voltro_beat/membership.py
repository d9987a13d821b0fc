"""A replica's membership of the registry: its row, its heartbeat, and what it learns.

Each heartbeat is also a reading of the database's clock (guarantee 9). From the live
replicas' rows the replica learns which schedules it leaves to a more recently started replica
(a changed definition in a rolling deploy), which schedules some live replica runs (for
recovery), and where the replicas disagree (logged; see :mod:`voltro_beat.replicas`).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from voltro_beat import logs, replicas
from voltro_beat.clock import Clock, ClockMode
from voltro_beat.config import Settings
from voltro_beat.coordination import Coordination
from voltro_beat.exceptions import StoreError
from voltro_beat.replicas import Replica
from voltro_beat.schedules import DEFAULT_GROUP, Entry
from voltro_beat.store.registry import Registry

logger = logging.getLogger(__name__)

#: Registry rows not seen for this long are deleted by the retention sweep.
FORGET_AFTER = timedelta(days=1)
#: How often a replica heartbeats (at most; a quarter of the publish timeout if shorter): how
#: soon the others see it start, stop or change a schedule's definition.
HEARTBEAT = timedelta(seconds=1)


class Membership:
    """This replica's row in the registry, and its view of the others."""

    def __init__(
        self,
        registry: Registry,
        clock: Clock,
        settings: Settings,
        entries: Mapping[str, Entry],
        version: str,
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.settings = settings
        self.schedules = {name: replicas.definition_hash(e) for name, e in entries.items()}
        #: The digest of :attr:`schedules`: a live replica with the same one runs the same
        #: definitions, so its map is not read (at a million schedules, 48 MB of JSON each).
        self.digest = replicas.digest(self.schedules)
        self.version = version
        #: Between heartbeats; a replica not seen for :attr:`liveness` is gone.
        self.interval = min(settings.publish_timeout / 4, HEARTBEAT)
        self.liveness = settings.publish_timeout
        #: Schedule -> the more recently started replica that fires it instead of this one.
        self.yielded: dict[str, str] = {}
        #: This group's schedules of the schedules table: every live replica of the group
        #: runs them (they are not in the definition map, which is for deploys).
        self.table: set[str] = set()
        #: Schedule -> when the longest-running live replica that runs it (this one too)
        #: started; and which schedules some live replica runs (:attr:`Runners.known`).
        self.runners = Runners([], [self.schedules], (), None)
        #: The newest revision of the schedules table applied, reported at each heartbeat.
        self.revision = 0
        self.live: list[Replica] = []
        self._maps: dict[str, tuple[str, dict[str, str]]] = {}
        self._said: set[tuple[Any, ...]] = set()
        self._far = False

    @property
    def rank(self) -> float:
        """This replica's place among the live replicas (itself too), as a fraction in
        ``[0, 1)``: where in a burst it starts claiming (:meth:`Recorder.record`)."""
        me = self.settings.replica
        names = sorted({r.name for r in self.live} | {me})
        return names.index(me) / len(names)

    def join(self) -> None:
        """Take a first clock reading, register (replacing an earlier row of this name) and
        look at the others."""
        self._read_clock()
        if not self.clock.synced:
            # Deciding on the local clock meanwhile is what guarantee 9 rules out: fail
            # closed, and the next tick reads the clock again.
            raise StoreError(
                f"store {self.registry.database.display_url}: no usable reading of the "
                "database's clock yet (round trip too slow)"
            )
        self.registry.register(self._me(), self.schedules)
        self.beat()
        self._adopt_clock()

    def leave(self) -> None:
        """Drop this replica's row, so that the others stop deferring to it at once."""
        self.registry.forget_one(self.settings.replica)

    def beat(self) -> bool:
        """Heartbeat: refresh ``last_seen``, read the clock, and look at the live replicas.

        Returns whether the schedules this replica yields changed.
        """
        offset = None if self.clock.offset is None else self.clock.offset.total_seconds()
        answer = self.registry.heartbeat(
            self.settings.replica, offset, self.liveness, self.revision
        )
        if answer is None:  # swept while this replica was away
            self.registry.register(self._me(), self.schedules)
            return False
        reading, live = answer
        self._observe(reading)
        before = self.yielded
        changed = _who(live) != _who(self.live)
        self.live = live
        if changed:  # what follows reads every schedule of every replica: only when needed
            self._learn()
        return self.yielded.keys() != before.keys()

    def follow(self, names: Iterable[str]) -> None:
        """Schedules ``names`` of the table now fire in this replica's group: every live
        replica of the group runs them since the group's longest-running one started."""
        self.runners.follow(names)

    def _read_clock(self) -> None:
        self._observe(self.registry.database.read_clock())

    def _observe(self, reading: tuple[datetime, float, float]) -> None:
        if self.clock.observe(*reading):
            self._check_offset()

    def _me(self) -> Replica:
        offset = self.clock.offset
        return Replica(
            name=self.settings.replica,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=self.version,
            started_at=None,
            last_seen=None,
            clock_offset=None if offset is None else offset.total_seconds(),
            settings=self._settings(),
            schedules_digest=self.digest,
            schedules_revision=self.revision,
        )

    def _settings(self) -> dict[str, Any]:
        s = self.settings
        return {
            "clock": str(self.clock.mode),
            "coordination": str(s.coordination),
            "publish_timeout": s.publish_timeout.total_seconds(),
            "max_lateness": s.max_lateness.total_seconds(),
            "group": s.group,
            "shards": s.shards,
        }

    def _adopt_clock(self) -> None:
        """Run on the clock of the oldest live replica: mixing clocks would break guarantee
        9 (a replica on a skewed local clock claims early). Changing the clock therefore
        takes stopping every replica."""
        others = [r for r in self.live if r.name != self.settings.replica]
        if not others:
            return
        theirs = others[0].settings.get("clock")
        if theirs in {m.value for m in ClockMode} and theirs != self.clock.mode:
            logger.warning(
                "voltro_beat: voltro_beat_clock is %r here but %r on the oldest live replica "
                "%s: adopting %r (stop every replica to change it)",
                self.clock.mode.value,
                theirs,
                others[0].name,
                theirs,
                extra=logs.fields(replica=others[0].name),
            )
            self.clock.mode = ClockMode(theirs)
            self.registry.register(self._me(), self.schedules)

    def _check_offset(self) -> None:
        offset = self.clock.offset
        far = offset is not None and abs(offset) > self.settings.max_clock_offset
        if far and not self._far:
            logger.warning(
                "voltro_beat: this host's clock is %+.3f s from the database's (more than "
                "voltro_beat_max_clock_offset, %g s); %s",
                offset.total_seconds() if offset is not None else 0.0,
                self.settings.max_clock_offset.total_seconds(),
                "decisions use the database's clock"
                if self.clock.mode is ClockMode.DATABASE
                else "this replica runs on its local clock (voltro_beat_clock = 'local')",
            )
        elif self._far and not far:
            logger.warning("voltro_beat: this host's clock is back near the database's")
        self._far = far

    def _learn(self) -> None:
        me = self.settings.replica
        others = [r for r in self.live if r.name != me]
        wanted = [
            r.name
            for r in others
            if r.schedules_digest != self.digest
            and self._maps.get(r.name, ("",))[0] != r.schedules_digest
        ]
        if wanted:
            for name, schedules in self.registry.schedules(wanted).items():
                self._maps[name] = (replicas.digest(schedules), schedules)
        maps = {
            r.name: self.schedules if r.schedules_digest == self.digest else self._maps[r.name][1]
            for r in others
            if r.schedules_digest == self.digest or r.name in self._maps
        }
        maps[me] = self.schedules
        group = [
            r.started_at
            for r in self.live
            if r.started_at is not None and _group(r) == self.settings.group
        ]
        # This replica too: in cluster coordination it catches up on a shard it takes long
        # after its boot, and what fell since its boot fell while it was live (at boot, its
        # own start is now).
        self.runners = Runners(
            [(r.started_at, maps[r.name]) for r in self.live if r.name in maps],
            list(maps.values()),
            self.table,
            min(group) if group else None,
        )
        mine = next((r for r in self.live if r.name == me), None)
        newer = [
            (r.name, maps.get(r.name, {}))
            for r in reversed(others)
            if mine is not None
            and r.started_at is not None
            and mine.started_at is not None
            and (r.started_at, r.name) > (mine.started_at, me)
        ]
        # In cluster coordination a schedule fires on its shard's owner, with that replica's
        # definition: the shards move to the new replicas as the old ones stop.
        yielded = (
            {}
            if self.settings.coordination is Coordination.CLUSTER
            else replicas.stand_down(me, self.schedules, newer)
        )
        for name in yielded.keys() - self.yielded.keys():
            logger.warning(
                "voltro_beat: schedule %s changed on the newer replica %s: it fires there, "
                "not here",
                name,
                yielded[name],
                extra=logs.fields(schedule=name, replica=yielded[name]),
            )
        for name in self.yielded.keys() - yielded.keys():
            logger.warning(
                "voltro_beat: schedule %s fires here again", name, extra=logs.fields(schedule=name)
            )
        self.yielded = yielded
        for name, replica, other_name, other in replicas.renames(maps):
            self._once(
                ("rename", name, replica, other_name, other),
                "voltro_beat: schedules %s (on %s) and %s (on %s) have one definition: a "
                "rename in flight runs the task under both names until the older replicas stop",
                name,
                replica,
                other_name,
                other,
                extra=logs.fields(schedule=name, replica=replica),
            )
        for key, value, replica, theirs in replicas.disagreements(self._settings(), others):
            self._once(
                ("setting", key, replica, theirs),
                "voltro_beat: %s is %r here and %r on replica %s (each run row carries its "
                "holder's lease and deadline, so this is safe, but probably not meant)",
                key,
                value,
                theirs,
                replica,
                extra=logs.fields(replica=replica),
            )

    def _once(
        self, key: tuple[Any, ...], message: str, *args: Any, extra: dict[str, object]
    ) -> None:
        if key not in self._said:
            self._said.add(key)
            logger.warning(message, *args, extra=extra)


class Runners:
    """:meth:`get`: when the longest-running live replica that runs a schedule started (a
    schedule of the group's table: when the group's longest-running replica did), from the
    live replicas' definition maps as the registry gave them; and :attr:`known`, the
    schedules some live replica runs.

    Each name is looked up when asked, in the few maps: built for every schedule at each
    change of the live replicas, a million schedules on three replicas took seconds, the
    heartbeat came late, the others counted the replica gone and changed too. Not a mapping,
    so that nothing walks it by accident.
    """

    def __init__(
        self,
        started: list[tuple[datetime | None, Mapping[str, str]]],
        every: list[Mapping[str, str]],
        table: Iterable[str],
        group_since: datetime | None,
    ) -> None:
        """``started``: each live replica's start and definition map; ``every``: the maps of
        the live replicas whose map is known, this one's too; ``table``: the group's
        schedules of the schedules table, run by every live replica of the group since
        ``group_since``."""
        #: Oldest start first (a replica with no start says nothing of when).
        self._maps = sorted(
            ((at, schedules) for at, schedules in started if at is not None), key=lambda m: m[0]
        )
        #: The table's schedules, and those that came into it since (:meth:`follow`).
        self._table = set(table)
        self._group_since = group_since
        self.known = _Known([*every, self._table])

    def follow(self, names: Iterable[str]) -> None:
        """Schedules ``names`` of the table now fire in this group: every live replica of
        the group runs them since the group's longest-running one started."""
        self._table.update(names)

    def get(self, name: str, /) -> datetime | None:
        if self._group_since is not None and name in self._table:
            return self._group_since
        for started, schedules in self._maps:
            if name in schedules:
                return started
        return None


class _Known:
    """The schedules in any of a few sets, looked up when asked."""

    def __init__(self, sets: list[Mapping[str, str] | set[str]]) -> None:
        self._sets = sets

    def __contains__(self, name: object) -> bool:
        return any(name in s for s in self._sets)


def _group(replica: Replica) -> str:
    return str(replica.settings.get("group", DEFAULT_GROUP))


def _who(live: list[Replica]) -> list[tuple[str, Any, str]]:
    """What the lessons of :meth:`Membership._learn` depend on."""
    return [(r.name, r.started_at, r.schedules_digest) for r in live]
