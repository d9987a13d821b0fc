"""Cluster coordination's gate: the shards of its group this replica owns, kept in step with
the live members at every heartbeat.

Every replica computes the same assignment from the registry's live members of its group
(:func:`voltro_beat.shards.assign`). At each heartbeat a replica gives up the shards no longer
assigned to it, renews those it keeps, and takes those assigned to it that are free: a shard
moves only once its previous owner released it (a rolling deploy leaves no gap) or that
owner's lease ran out (a crash or a pause). The engine claims only its own shards' occurrences,
and each claim carries the epoch it holds the shard at, which the store checks (guarantee 14).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from voltro_beat import logs
from voltro_beat.config import Settings
from voltro_beat.coordination import Coordination
from voltro_beat.metrics import Metrics
from voltro_beat.replicas import Replica
from voltro_beat.schedules import DEFAULT_GROUP, Entry
from voltro_beat.shards import Tenure, assign, shard_of
from voltro_beat.store.beat import BeatStore

logger = logging.getLogger(__name__)


class Ownership:
    """The shards of ``settings.group`` this replica owns, and what it may claim with them."""

    def __init__(
        self,
        store: BeatStore,
        settings: Settings,
        entries: Mapping[str, Entry],
        metrics: Metrics,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self.group = settings.group
        self.count = settings.shards
        self._me = settings.replica
        self._lease = settings.publish_timeout
        #: Schedule -> its shard.
        self.shard_of = {name: shard_of(self.group, name, self.count) for name in entries}
        #: Shard -> its schedules: what changes with the shards held costs what they hold,
        #: not every schedule (a million, in a group of many replicas).
        self._names: dict[int, list[str]] = {}
        for name, shard in self.shard_of.items():
            self._names.setdefault(shard, []).append(name)
        #: Shard -> the epoch this replica holds it at.
        self.held: dict[int, int] = {}
        #: What this replica's claims carry: per schedule of a shard held, the shard and epoch.
        self._claimable: dict[str, tuple[int, int]] = {}
        self.tenure = Tenure(self.group, self._claimable)
        #: Schedule -> when the replica that owned its shard released it, for the shards just
        #: taken that way: what fell before then was that live replica's to fire.
        self.released: dict[str, datetime] = {}
        self._said: set[tuple[str, int]] = set()

    def track(self, name: str) -> None:
        """Give schedule ``name`` (new from the schedules table) its shard."""
        if name not in self.shard_of:
            shard = self.shard_of[name] = shard_of(self.group, name, self.count)
            self._names.setdefault(shard, []).append(name)
            if shard in self.held:
                self._claimable[name] = (shard, self.held[shard])

    def schedules(self) -> list[str]:
        """The schedules of the shards this replica owns."""
        return self._of(self.held)

    def holds(self, name: str) -> bool:
        """Whether this replica owns the shard of schedule ``name``."""
        return self.shard_of[name] in self.held

    def members(self, live: Iterable[Replica]) -> list[str]:
        """The live members of this replica's group in cluster coordination, this one too."""
        found = {self._me}
        for r in live:
            if r.settings.get("coordination") != Coordination.CLUSTER:
                continue
            if r.settings.get("group", DEFAULT_GROUP) != self.group:
                continue
            found.add(r.name)
            count = r.settings.get("shards", self.count)
            if count != self.count and ("shards", count) not in self._said:
                self._said.add(("shards", count))
                logger.error(
                    "voltro_beat: voltro_beat_shards is %s here and %s on replica %s of group "
                    "%s: their shards are not the same schedules (each claim is still checked "
                    "in the claims table, so nothing runs twice, but set one value)",
                    self.count,
                    count,
                    r.name,
                    self.group,
                    extra=logs.fields(replica=r.name),
                )
        return sorted(found)

    def refresh(self, live: Sequence[Replica]) -> tuple[bool, list[str]]:
        """Bring the shards held in step with the assignment among ``live``: release, renew,
        acquire. Returns whether the shards held changed, and the schedules of the shards
        just taken (to catch up on what fell between their previous owner and this one)."""
        assigned = assign(self.count, self.members(live)).get(self._me, frozenset())
        keep = {s: e for s, e in self.held.items() if s in assigned}
        acquire = assigned - keep.keys()
        released = self._store.released_shards(self.group, acquire) if acquire else {}
        held, gained = self._store.exchange_shards(
            self.group,
            keep=keep,
            release=self.held.keys() - assigned,
            acquire=acquire,
            lease=self._lease,
        )
        self.released = {
            name: released[s] for s in gained if s in released for name in self._names.get(s, ())
        }
        lost = sorted(keep.keys() - held.keys())
        given = sorted(self.held.keys() - assigned)
        if self._metrics.enabled:
            self._metrics.shards(
                self.group,
                owned=len(held),
                unowned=self.count - self._store.owned_shards(self.group),
                taken=len(gained),
                given=len(given),
                lost=len(lost),
            )
        if lost:
            logger.warning(
                "voltro_beat: lost shards %s of group %s (their lease ran out: this replica "
                "was paused or cut off from the store); their new owners fire them",
                _ranges(lost),
                self.group,
                extra=logs.fields(count=len(lost)),
            )
        changed = held != self.held
        if changed:
            logger.info(
                "voltro_beat: group %s: %d of %d shards owned here (taken %s, given up %s)",
                self.group,
                len(held),
                self.count,
                _ranges(sorted(gained)) or "none",
                _ranges(given) or "none",
                extra=logs.fields(count=len(held)),
            )
            self.held = held
            self._claimable = {
                name: (s, e) for s, e in held.items() for name in self._names.get(s, ())
            }
            self.tenure = Tenure(self.group, self._claimable)
        return changed, self._of(gained)

    def _of(self, shards: Iterable[int]) -> list[str]:
        return [name for s in sorted(shards) for name in self._names.get(s, ())]

    def release(self) -> None:
        """Give up every shard (a graceful stop): the others take them at once. Also those
        this replica holds without knowing it (an exchange whose answer was lost)."""
        self._store.release_shards(self.group)
        self.forget()

    def forget(self) -> None:
        """Hold no shard any more, here: claim nothing with them (their leases lapse)."""
        self.held = {}
        self._claimable = {}
        self.tenure = Tenure(self.group, self._claimable)


def _ranges(shards: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    runs: list[list[int]] = []
    for s in shards:
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
