"""The external trigger: a platform's scheduler (a Kubernetes CronJob, EventBridge) fires an
entry that says ``"trigger": "external"``, through ``voltro-beat trigger`` or its HTTP endpoint.

The arrival, on the database's clock, is snapped back to the newest occurrence of the entry's
own schedule at or before it (no further back than its ``max_lateness``); an arrival at most
``voltro_beat_max_clock_offset`` before an occurrence stands for it, and waits for its
instant. That occurrence is claimed through the claims table whatever the coordination,
``single`` included: the
duplicate comes from the platform (a CronJob may create two Jobs for one scheduled time, a
Job retries), not from a second replica. The winner publishes it through the dispatcher's
fence, write and mark, as beat does, with the same key, task id and headers; its run row's
outcome is ``external``. If the broker fails, the run stays ``claimed`` and a beat replica's
recovery sweep republishes it once its lease ran out, as for any run beat claimed.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime

from celery import Celery

from voltro_beat import catchup, logs
from voltro_beat.beat_schedule import load_schedule
from voltro_beat.config import Settings
from voltro_beat.exceptions import NotExternal, NotPublished, TooFar
from voltro_beat.occurrences import Occurrence
from voltro_beat.on_demand import OnDemand
from voltro_beat.runs import Run
from voltro_beat.store.database import Database

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Fired:
    """What a trigger did: ``published`` the ``occurrence``, or found it claimed already."""

    occurrence: Occurrence
    published: bool


class Trigger:
    """Fires the external entries of one Celery app's ``beat_schedule``.

    Thread-safe: the endpoint's requests fire one at a time (one broker connection).
    """

    def __init__(
        self, app: Celery, settings: Settings | None = None, *, on_demand: OnDemand | None = None
    ) -> None:
        """``settings``: the app's own (:meth:`Settings.resolve`) unless given; ``on_demand``:
        what publishes (a simulation's, tests/sim), else one on the settings' store and the
        app's broker."""
        settings = settings or Settings.resolve(app.conf)
        self.entries = load_schedule(app, settings).entries
        self._on_demand = on_demand or OnDemand.open(
            app, settings, Database.open(settings.store_url), self.entries
        )
        self.store = self._on_demand.store
        self._migrate = settings.migrate
        self._lease = settings.publish_timeout
        self._early = settings.max_clock_offset
        self._lock = threading.Lock()

    def fire(self, name: str, *, arrival: datetime | None = None) -> Fired:
        """Claim and publish the occurrence of ``name`` that ``arrival`` (default: now on the
        database's clock) stands for.

        Raises :class:`NotExternal`, :class:`TooFar`, :class:`NotPublished`, or
        :class:`~voltro_beat.exceptions.StoreError`.
        """
        entry = self.entries.get(name)
        if entry is None:
            raise NotExternal(f"no schedule {name!r} in beat_schedule")
        if entry.trigger != "external":
            raise NotExternal(
                f"schedule {name!r} is fired by beat; only entries with "
                '"trigger": "external" can be triggered'
            )
        with self._lock:
            if self._migrate:
                self.store.database.upgrade()
                self._migrate = False
            at = self.store.database.time() if arrival is None else arrival
            scheduled = catchup.last_due(entry, at, early=self._early)
            if scheduled is None:
                raise TooFar(
                    f"{name}: no occurrence within max_lateness ({entry.max_lateness}) at or "
                    f"before {at.isoformat()}"
                )
            occurrence = Occurrence.of(entry.name, scheduled)
            run = Run(occurrence, entry.task, deadline=scheduled + entry.max_lateness)
            if not self.store.claim_external(run, lease=self._lease):
                logger.info(
                    "voltro_beat: %s claimed already: nothing published",
                    occurrence.key,
                    extra=logs.fields(key=occurrence.key, schedule=occurrence.schedule),
                )
                return Fired(occurrence, published=False)
            fenced = self._on_demand.dispatch.fence([occurrence])
            if not fenced.occurrences:
                raise TooFar(f"{occurrence.key}: its deadline passed while it was being claimed")
            # An early arrival (see catchup.last_due) waits for the instant on the database's
            # clock: never published before it.
            dispatch = self._on_demand.dispatch
            dispatch.runner.sleep(max(0.0, dispatch.until(fenced).total_seconds()))
            if not self._on_demand.dispatch.deliver([fenced]):
                raise NotPublished(
                    f"{occurrence.key}: claimed, but the broker did not take it; a beat "
                    "replica's recovery sweep republishes it once its lease runs out"
                )
            logger.info(
                "voltro_beat: %s published (external trigger)",
                occurrence.key,
                extra=logs.fields(key=occurrence.key, schedule=occurrence.schedule),
            )
            return Fired(occurrence, published=True)

    def close(self) -> None:
        """Release the broker connection and the store."""
        self._on_demand.close()
        self.store.close()
