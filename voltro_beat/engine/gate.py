"""The coordination gate, on the engine's side: which of its due occurrences this replica
records, and with what, as the registry and (in ``cluster`` coordination) the shards it owns
say. The store's claim statement is the other side: it lets one replica record each
occurrence (guarantees 2 and 14).

- Every schedule of the replica's group is recorded, except:
- in ``advisory_lock`` and ``single``, a schedule whose changed definition fires on a more
  recently started replica (yielded, :mod:`voltro_beat.replicas`). Its occurrences come up a
  lease after their instant, so that they are claimed late if that replica died meanwhile
  (the registry no longer counts it), and recorded ``missed`` (reason ``yielded``) through
  the gate if the registry still counts it live: it would have claimed them long before, so
  it died or hangs, and this replica's older definition is not the one to send. If it did
  claim them, the gate finds their rows and records nothing;
- in ``cluster``, a schedule of a shard another replica owns: it is not on this replica's
  timeline at all. Its occurrences are its owner's (it fires them, or whoever takes the shard
  next catches up on them); when its shard comes here, this replica catches up on it and puts
  it on its timeline from then on. The shards and the singletons on them follow the registry
  at every heartbeat
  (:mod:`~voltro_beat.engine.ownership`, :mod:`~voltro_beat.engine.singletons`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from voltro_beat.engine.ownership import Ownership
from voltro_beat.engine.recorder import run_of
from voltro_beat.engine.singletons import Singletons
from voltro_beat.engine.timeline import Pending
from voltro_beat.membership import Membership
from voltro_beat.occurrences import Occurrence
from voltro_beat.runs import Run
from voltro_beat.shards import Tenure
from voltro_beat.status import Reason, Status


class Gate:
    """What one replica records of its due occurrences."""

    def __init__(
        self,
        membership: Membership,
        ownership: Ownership | None,
        singletons: Singletons | None,
    ) -> None:
        self.membership = membership
        #: The shards this replica owns (``cluster`` coordination).
        self.ownership = ownership
        #: The singletons of this replica's group, run where it owns their shard.
        self.singletons = singletons

    @property
    def tenure(self) -> Tenure | None:
        """What this replica's claims carry in ``cluster`` coordination (None otherwise)."""
        return None if self.ownership is None else self.ownership.tenure

    @property
    def released(self) -> dict[str, datetime]:
        """Schedule -> when the replica that owned its shard released it, for the shards just
        taken that way (``cluster`` coordination)."""
        return {} if self.ownership is None else self.ownership.released

    def deferred(self, name: str) -> bool:
        """Whether schedule ``name`` is yielded to a newer replica, as far as this one knows."""
        return name in self.membership.yielded

    def holds(self, name: str) -> bool:
        """Whether schedule ``name`` is this replica's to fire at all: in ``cluster``
        coordination, whether it owns its shard; otherwise always."""
        return self.ownership is None or self.ownership.holds(name)

    def runs(self, due: Sequence[Pending], now: datetime, down: datetime | None) -> list[Run]:
        """The runs to record of the ``due`` occurrences (the store down since ``down``)."""
        yielded = self.membership.yielded
        return [
            run_of(p.entry, at, now, down)
            if p.entry.name not in yielded
            else Run(Occurrence.of(p.entry.name, at), p.entry.task, Status.MISSED, Reason.YIELDED)
            for p in due
            if self.holds(p.entry.name)
            for at in p.instants
        ]

    def join(self) -> list[str] | None:
        """Join the registry (and take the free shards assigned to this replica); returns the
        schedules to catch up on: those of the shards taken, or None for every one."""
        self.membership.join()
        return None if self.ownership is None else self._follow()[1]

    def beat(self) -> tuple[bool, list[str]]:
        """Heartbeat. Returns whether the schedules deferred changed, and the schedules of
        the shards just taken (to catch up on)."""
        changed = self.membership.beat()
        if self.ownership is None:
            return changed, []
        moved, gained = self._follow()
        return changed or moved, gained

    def step_aside(self) -> bool:
        """Let go of the shards held without a statement (the store fails this replica's
        steps: their leases lapse to the others) and ask their singletons to stop; returns
        whether any shard was held."""
        if self.ownership is None or not self.ownership.held:
            return False
        self.ownership.forget()
        if self.singletons:
            self.singletons.follow(self.ownership.held)
        return True

    def leave(self) -> None:
        """Stop the singletons, release the shards (the others take them at once) and leave
        the registry."""
        if self.singletons:  # stopped before their shards go to another replica
            self.singletons.stop_all()
        if self.ownership is not None:
            self.ownership.release()
        self.membership.leave()

    def _follow(self) -> tuple[bool, list[str]]:
        assert self.ownership is not None
        moved, gained = self.ownership.refresh(self.membership.live)
        if self.singletons:
            self.singletons.follow(self.ownership.held)
        return moved, gained
