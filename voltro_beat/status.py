"""The run statuses: one vocabulary, and the named sets every policy and SQL fragment uses.

A run row (one per occurrence, see docs/guarantees.md) moves through these statuses; beat
writes the first ones, workers the rest (:mod:`voltro_beat.ledger` holds their state machine).
The table's check constraint, the partial indexes and every status a query compares with are
derived from this module, so a new status is added here or nowhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class Status(StrEnum):
    """Where the run of one occurrence stands. The order is the table's and the docs'."""

    #: Claimed by a replica; its message is not confirmed by the broker yet, unless its
    #: ``published_at`` is stamped (the status follows once the instant's writes are done).
    CLAIMED = "claimed"
    #: The broker took the message.
    PUBLISHED = "published"
    STARTED = "started"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REVOKED = "revoked"
    REJECTED = "rejected"
    #: Never published: too late, or a catch-up policy left it out (the reason says which).
    MISSED = "missed"
    #: Never published: a ``skip`` schedule's predecessor was still running.
    SKIPPED = "skipped"
    #: Waiting behind a running predecessor (``queue`` schedules); published when it ends.
    QUEUED = "queued"


class Reason(StrEnum):
    """Why beat recorded a run as it did (the ``reason`` column of beat's own rows).

    Workers write free text there too (a retry's or a revoke's reason).
    """

    #: Past its ``max_lateness`` when it came up.
    LATE = "late"
    #: Past its ``max_lateness`` because the store was unreachable.
    STORE_DOWN = "store_down"
    #: Never confirmed by the broker within its ``max_lateness``.
    PUBLISH_FAILED = "publish_failed"
    #: Refused by the broker (a RabbitMQ nack, a Redis command error) at every try within
    #: its ``max_lateness``; the run's ``error`` holds the broker's last answer.
    BROKER_REFUSED = "broker_refused"
    #: Left claimed by a replica and past its ``max_lateness``, of a schedule no live replica
    #: runs any more (removed or renamed in a deploy).
    UNKNOWN_SCHEDULE = "unknown_schedule"
    #: Of a schedule yielded to a newer replica (its changed definition) that did not claim
    #: it within a lease of its instant: that replica died or hangs, while the registry
    #: still counts it live.
    YIELDED = "yielded"
    #: Left out by the entry's catch-up policy after downtime.
    CATCH_UP = "catch_up"
    #: Skipped because its predecessor was still running.
    OVERLAP = "overlap"
    #: A live run that stopped blocking its schedule after the overlap timeout.
    OVERLAP_TIMEOUT = "overlap_timeout"
    #: Of a schedule whose group had no live replica, past its ``max_lateness`` (recorded by
    #: a replica of another group).
    NO_REPLICA = "no_replica"
    #: Published by ``voltro-beat backfill`` (an occurrence of a past window with no run row).
    BACKFILL = "backfill"
    #: Published by ``voltro-beat run`` (an operator asked for it now).
    MANUAL = "manual"


#: Statuses no event ever leaves.
TERMINAL = frozenset(
    {
        Status.SUCCEEDED,
        Status.FAILED,
        Status.REVOKED,
        Status.REJECTED,
        Status.MISSED,
        Status.SKIPPED,
    }
)
#: On its way to a worker: a worker event moves these whatever attempt it reports.
BEFORE_START = frozenset({Status.CLAIMED, Status.PUBLISHED})
#: Some attempt of the run is (or was) on a worker.
ON_WORKER = frozenset({Status.STARTED, Status.RETRYING})
#: Published or about to be, and not finished: every status a worker event may move, and
#: what blocks the next occurrence of a ``skip`` / ``queue`` schedule.
IN_FLIGHT = BEFORE_START | ON_WORKER
#: Not finished: in flight or queued (the partial index of live runs).
UNFINISHED = IN_FLIGHT | {Status.QUEUED}
#: Waiting for beat to publish it (the partial index the recovery sweep reads).
UNPUBLISHED = frozenset({Status.CLAIMED, Status.QUEUED})
#: Never deleted by retention: a queued run still has to be published or recorded missed.
KEPT_BY_RETENTION = frozenset({Status.QUEUED})


def sql_in(statuses: Iterable[Status], column: str = "status") -> str:
    """``status IN ('a', 'b')`` for ``statuses``, in :class:`Status` order (a stable text, as
    partial index predicates and check constraints must be)."""
    wanted = set(statuses)
    listed = ", ".join(f"'{s.value}'" for s in Status if s in wanted)
    return f"{column} IN ({listed})"
