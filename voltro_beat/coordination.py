"""The coordination gate: how the replicas decide which of them publishes an occurrence.

``advisory_lock`` (the default) sends each key through the claims table: only the replica
whose INSERT went in publishes (guarantee 2). ``cluster`` splits each group's schedules into
shards and only a shard's owner claims their keys, still through the claims table and in a
statement that checks its ownership is current (:mod:`voltro_beat.shards`). ``single`` trusts
that one beat runs and skips the claims table; its run rows are still the last fence
(guarantee 4). Each mode names the
``coordination_outcome`` its run rows carry; an external trigger (``voltro-beat trigger``)
always goes through the claims table, whatever the mode, and records ``external``.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """The ``coordination_outcome`` of a run row: how the occurrence came to be recorded."""

    #: Recorded without claims (``single`` coordination).
    SINGLE = "single"
    #: Won in the claims table by a beat replica (``advisory_lock``).
    WON_LOCK = "won_lock"
    #: Won in the claims table by the owner of the schedule's shard (``cluster``).
    CLUSTER = "cluster"
    #: Won in the claims table by an external trigger (a platform's scheduler).
    EXTERNAL = "external"


class Coordination(StrEnum):
    """A coordination mode (``voltro_beat_coordination``)."""

    SINGLE = "single"
    ADVISORY_LOCK = "advisory_lock"
    CLUSTER = "cluster"

    @property
    def claims(self) -> bool:
        """Whether occurrences go through the claims table before their run row."""
        return self is not Coordination.SINGLE

    @property
    def outcome(self) -> Outcome:
        """The ``coordination_outcome`` of the run rows this mode records."""
        return _OUTCOMES[self]


_OUTCOMES = {
    Coordination.SINGLE: Outcome.SINGLE,
    Coordination.ADVISORY_LOCK: Outcome.WON_LOCK,
    Coordination.CLUSTER: Outcome.CLUSTER,
}

#: Spellings from the specification this project implements, accepted in settings.
ALIASES = {"advisoryLock": Coordination.ADVISORY_LOCK, "wonLock": Coordination.ADVISORY_LOCK}
