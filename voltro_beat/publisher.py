"""Won occurrence -> broker message, with a deterministic task id and voltro headers."""

from __future__ import annotations

import contextlib
import uuid
from typing import TYPE_CHECKING, Any

from celery import Celery
from kombu import Connection, Producer

if TYPE_CHECKING:
    from voltro_beat.schedules import Entry

#: Fixed forever: task ids are uuid5(NAMESPACE, occurrence key) on every replica (invariant 7).
NAMESPACE = uuid.UUID("5d3b9c1e-8f0a-5b6e-9a57-766f6c74726f")

#: Bounded so that a broker outage cannot stall the tick: one quick reconnect, then give up
#: and leave the run ``claimed`` for the recovery sweep.
RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}


def task_id_for(key: str) -> str:
    """The task id of the occurrence ``key``: the same on every replica and every republish."""
    return str(uuid.uuid5(NAMESPACE, key))


class Publisher:
    """Publishes occurrences through one reused broker connection and producer."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._connection: Connection | None = None
        self._producer: Producer | None = None

    def publish(self, entry: Entry, key: str, task_id: str) -> None:
        """Send ``entry``'s task for occurrence ``key``; raises if the broker did not take it."""
        # A fresh dict per message: the entry's own options are never mutated.
        options: dict[str, Any] = dict(entry.options)
        headers = dict(options.pop("headers", None) or {})
        headers["voltro_occurrence"] = key
        headers["periodic_task_name"] = entry.name
        options["headers"] = headers
        options["task_id"] = task_id
        options.setdefault("retry", True)
        options.setdefault("retry_policy", RETRY_POLICY)
        producer = self._get_producer()
        task = self.app.tasks.get(entry.task)
        if task is not None:
            task.apply_async(entry.args, dict(entry.kwargs), producer=producer, **options)
        else:
            self.app.send_task(
                entry.task, entry.args, dict(entry.kwargs), producer=producer, **options
            )

    def _get_producer(self) -> Producer:
        if self._producer is None:
            self._connection = self.app.connection_for_write()
            self._producer = self.app.amqp.Producer(self._connection, auto_declare=False)
        return self._producer

    def reset(self) -> None:
        """Drop the connection (after a failure, or at close); the next publish reconnects."""
        connection, self._connection, self._producer = self._connection, None, None
        if connection is not None:
            # A broken connection may fail to close; it is being dropped either way.
            with contextlib.suppress(Exception):
                connection.release()
