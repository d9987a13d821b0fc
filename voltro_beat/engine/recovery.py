"""Recovery: runs whose replica did not finish them, finished by another.

Runs left ``claimed`` past their deadline are recorded missed; the others whose lease ran out
(a crashed or paused replica, a broker outage) are taken over and republished with their own
task ids; runs a replica marked and stopped before settling are recorded published.
"""

from __future__ import annotations

import logging
from collections.abc import Set

from voltro_beat import logs
from voltro_beat.dispatch import Dispatcher
from voltro_beat.membership import Membership
from voltro_beat.metrics import Metrics
from voltro_beat.status import Status
from voltro_beat.store.beat import BeatStore

logger = logging.getLogger(__name__)


#: The longest a step spends on a recovery sweep, chunk after chunk (seconds, at most half a
#: lease): the rest of the sweep is the next step's, which comes at once. Half a lease (5 s)
#: a step, a backlog of a third of a million runs held a replica's steps past its shards'
#: leases, so they moved, and their runs came back to recovery.
SLICE = 1.0


def recover(
    store: BeatStore,
    dispatcher: Dispatcher,
    membership: Membership,
    schedules: Set[str],
    metrics: Metrics,
) -> bool:
    """Part of a recovery sweep of ``schedules`` (this replica's, less those yielded to a
    newer definition): a chunk at a time, each leased when taken; chunks follow one another
    until :data:`SLICE` has passed (on the dispatcher's clock), or the broker fails. Returns
    whether the sweep goes on (its time ran out with runs left to take)."""
    lease = dispatcher.lease
    settled = store.settle_abandoned(after=lease)
    if settled:
        logger.info(
            "voltro_beat: %d sent runs recorded published (their replica stopped between "
            "their mark and its settle)",
            settled,
            extra=logs.fields(count=settled),
        )
    if not store.any_lapsed():
        return False
    monotonic = dispatcher.clock.monotonic
    started = monotonic()
    budget = min(SLICE, lease.total_seconds() / 2)
    mine = schedules if not membership.yielded else set(schedules) - membership.yielded.keys()
    while True:
        expired = store.expire(known=membership.runners.known, limit=dispatcher.chunk)
        metrics.missed(expired)
        for reason in sorted({r.reason or "" for r in expired}):
            count = sum(1 for r in expired if r.reason == reason)
            logger.warning(
                "voltro_beat: %d unpublished runs past their deadline recorded missed (%s)",
                count,
                reason,
                extra=logs.fields(count=count, status=Status.MISSED, reason=reason),
            )
        taken = store.take_over(
            schedules=mine,
            hold=lease,
            limit=dispatcher.chunk,
        )
        if taken:
            logger.warning(
                "voltro_beat: republishing %d unconfirmed runs",
                len(taken),
                extra=logs.fields(count=len(taken)),
            )
            metrics.republished(taken)
            if not dispatcher.send(taken):
                return False
        if len(expired) < dispatcher.chunk and len(taken) < dispatcher.chunk:
            return False
        if monotonic() - started >= budget:
            return True
