"""The external trigger: a platform's scheduler (a Kubernetes CronJob, EventBridge) fires an
entry that says ``"trigger": "external"``, through ``voltro-beat trigger`` or its HTTP endpoint.

The arrival, on the database's clock, is snapped back to the newest occurrence of the entry's
own schedule at or before it (no further back than its ``max_lateness``). That occurrence is
claimed through the claims table whatever the coordination, ``single`` included: the
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
from datetime import UTC, datetime

from celery import Celery
from celery.app.utils import find_app

from voltro_beat import catchup
from voltro_beat.config import Settings
from voltro_beat.dispatch import Dispatcher
from voltro_beat.exceptions import ConfigurationError, VoltroBeatError
from voltro_beat.occurrences import Occurrence
from voltro_beat.publisher import Publisher
from voltro_beat.schedules import parse_entries
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.database import Database

logger = logging.getLogger(__name__)


class NotExternal(VoltroBeatError):
    """No entry of that name, or one that beat fires itself."""


class TooFar(VoltroBeatError):
    """The arrival is further than the entry's ``max_lateness`` from any occurrence before it
    (or the occurrence's deadline passed while it was being claimed)."""


class NotPublished(VoltroBeatError):
    """Claimed, but the broker did not take the message: recovery republishes it."""


@dataclass(frozen=True, slots=True)
class Fired:
    """What a trigger did: ``published`` the ``occurrence``, or found it claimed already."""

    occurrence: Occurrence
    published: bool


class Trigger:
    """Fires the external entries of one Celery app's ``beat_schedule``.

    Thread-safe: the endpoint's requests fire one at a time (one broker connection).
    """

    def __init__(self, app: Celery) -> None:
        settings = Settings.from_config(app.conf)
        entries = parse_entries(
            app.conf.beat_schedule or {}, tz=settings.timezone, max_lateness=settings.max_lateness
        )
        self.entries = {entry.name: entry for entry in entries}
        self.store = BeatStore(Database.open(settings.store_url), replica=settings.replica)
        self._migrate = settings.migrate
        self._lease = settings.publish_timeout
        # As beat's: a write may take three leases, renewed meanwhile (scheduler._write_timeout).
        self._publisher = Publisher(app, write_timeout=settings.publish_timeout * 3)
        # The dispatcher's clock only measures how long ago a chunk was fenced, in this process.
        self._dispatch = Dispatcher(
            self.store, self._publisher, self.entries, self._lease, lambda: datetime.now(UTC)
        )
        self._lock = threading.Lock()

    @classmethod
    def for_app(cls, app_path: str) -> Trigger:
        """The trigger of the Celery app at ``app_path`` (what ``celery -A`` accepts)."""
        try:
            app = find_app(app_path)
        except (ImportError, AttributeError) as exc:
            raise ConfigurationError(
                f"cannot load the Celery app {app_path!r}: {exc}", field="celery_app"
            ) from None
        if not isinstance(app, Celery):
            raise ConfigurationError(f"{app_path!r} is not a Celery app", field="celery_app")
        return cls(app)

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
            scheduled = catchup.last_due(entry, at)
            if scheduled is None:
                raise TooFar(
                    f"{name}: no occurrence within max_lateness ({entry.max_lateness}) at or "
                    f"before {at.isoformat()}"
                )
            occurrence = Occurrence.of(
                entry.name, entry.task, scheduled, deadline=scheduled + entry.max_lateness
            )
            if not self.store.claim_external(occurrence, lease=self._lease):
                logger.info("voltro_beat: %s claimed already: nothing published", occurrence.key)
                return Fired(occurrence, published=False)
            fenced = self._dispatch.fence([occurrence])
            if not fenced.runs:
                raise TooFar(f"{occurrence.key}: its deadline passed while it was being claimed")
            if not self._dispatch.deliver([fenced]):
                raise NotPublished(
                    f"{occurrence.key}: claimed, but the broker did not take it; a beat "
                    "replica's recovery sweep republishes it once its lease runs out"
                )
            logger.info("voltro_beat: %s published (external trigger)", occurrence.key)
            return Fired(occurrence, published=True)

    def close(self) -> None:
        """Release the broker connection and the store."""
        self._dispatch.close()
        self._publisher.reset()
        self.store.close()
