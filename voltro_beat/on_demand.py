"""Occurrences published outside beat: ``voltro-beat backfill`` and ``voltro-beat run`` (an
operator asks), and the external trigger (:mod:`voltro_beat.trigger`: a platform asks).

They take the path every publish of beat takes: the coordination gate (claims table and run
row, in one transaction), then the dispatcher's fence, broker write and mark. An occurrence
that already has a run row is never published again, whoever asks and however often; a run
the command claimed but could not send (the broker failed, the command was killed) stays
``claimed`` without a deadline, and a beat replica that runs its schedule republishes it once
its lease ran out, with the same task id.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from celery import Celery
from celery.app.utils import find_app

from voltro_beat.clock import Clock
from voltro_beat.config import Settings
from voltro_beat.dispatch import Dispatcher
from voltro_beat.exceptions import ConfigurationError, PublishError
from voltro_beat.occurrences import Occurrence
from voltro_beat.publisher import Publisher
from voltro_beat.runner import Runner
from voltro_beat.runs import Run
from voltro_beat.schedules import Entry
from voltro_beat.status import Reason
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.database import Database


def load_app(path: str) -> Celery:
    """The Celery app at ``path`` (what ``celery -A`` accepts: ``proj``, ``proj.celery:app``)."""
    try:
        app = find_app(path)
    except Exception as exc:  # whatever importing the user's module raised
        raise ConfigurationError(
            f"cannot import the Celery app {path!r}: {type(exc).__name__}: {exc}",
            field="celery_app",
        ) from None
    if not isinstance(app, Celery):
        raise ConfigurationError(f"{path!r} is not a Celery app", field="celery_app")
    return app


class OnDemand:
    """Publishes chosen occurrences of ``entries`` through ``store`` and ``publisher``.

    ``clock`` (the dispatcher's; by default the database's, whatever ``voltro_beat_clock``
    says: each fence reads it) and ``runner`` (the dispatcher's marks, renewals and waits) are
    seams for a simulation (tests/sim); :meth:`open` builds one for a command.
    """

    def __init__(
        self,
        settings: Settings,
        store: BeatStore,
        publisher: Publisher,
        entries: Mapping[str, Entry],
        *,
        clock: Clock | None = None,
        runner: Runner | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.publisher = publisher
        database = store.database
        self.dispatch = Dispatcher(
            store,
            publisher,
            entries,
            settings.publish_timeout,
            clock or Clock(database.clock_mode(), local=lambda: database.clock()),
            runner=runner,
        )

    @classmethod
    def open(
        cls, app: Celery, settings: Settings, database: Database, entries: Mapping[str, Entry]
    ) -> OnDemand:
        """One for this process, as replica ``cli:<host>:<pid>``, publishing to ``app``'s
        broker."""
        return cls(
            settings,
            BeatStore(database, replica=f"cli:{socket.gethostname()}:{os.getpid()}"),
            Publisher(app, write_timeout=settings.publish_timeout * 3),
            entries,
        )

    def publish(
        self,
        entry: Entry,
        instants: Sequence[datetime],
        reason: Reason,
        progress: Callable[[int], None] = lambda done: None,
    ) -> list[str]:
        """Claim and publish the occurrences of ``entry`` at ``instants``, a chunk at a time;
        return the keys published. Those another replica or an earlier command recorded are
        left alone. ``progress`` is told how many instants each chunk handled.

        Raises PublishError if the broker failed (what it did not take stays claimed, for
        recovery), StoreError if the store did.
        """
        published: list[str] = []
        size = self.dispatch.chunk
        for start in range(0, len(instants), size):
            chunk = instants[start : start + size]
            occurrences = [Occurrence.of(entry.name, at) for at in chunk]
            won = self.store.claim(
                [Run(o, entry.task, reason=reason) for o in occurrences],
                coordination=self.settings.coordination,
                lease=self.settings.publish_timeout,
            )
            mine = [o for o in occurrences if o.key in won]
            if mine and not self.dispatch.send(mine):
                raise PublishError(
                    f"the broker did not take every message; {len(published)} published, "
                    "the rest of this chunk is left claimed for a beat replica's recovery",
                    confirmed=len(published),
                )
            published += (o.key for o in mine)
            progress(len(chunk))
        return published

    def close(self) -> None:
        self.dispatch.close()
        self.publisher.reset()
