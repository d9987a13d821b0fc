"""Won occurrence -> broker message, over one reused connection: pipelined on Redis,
confirmed by the broker on AMQP.

What each message holds is :mod:`voltro_beat.messages`, and which template each schedule
fills in :mod:`voltro_beat.templates`; here the templates are built from Celery's send path,
the messages sent, and the broker's answer collected (on AMQP, :mod:`voltro_beat.confirms`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from celery import Celery
from kombu import Connection, Producer

from voltro_beat import logs
from voltro_beat.confirms import CONFIRM_EVERY, Confirms
from voltro_beat.exceptions import PublishError
from voltro_beat.messages import (
    Arguments,
    Recorder,
    RedisPush,
    SendPath,
    Template,
    arguments,
    delivery_tags,
    replayable,
)
from voltro_beat.templates import Prepared, Templates, filled, recorded_arguments

if TYPE_CHECKING:
    from voltro_beat.schedules import Entry

logger = logging.getLogger(__name__)

#: Bounded so that a broker outage cannot stall the tick: one quick reconnect, then give up
#: and leave the run ``claimed`` for the recovery sweep.
RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}


class Publisher:
    """Publishes occurrences through one reused broker connection and producer."""

    def __init__(self, app: Celery, *, write_timeout: timedelta) -> None:
        self.app = app
        self.write_timeout = write_timeout
        self._connection: Connection | None = None
        self._producer: Producer | None = None
        #: Per schedule, its message template (:mod:`voltro_beat.templates`).
        self.templates = Templates()
        self._send_path: SendPath | None = None
        self._declared: set[str] = set()
        #: On AMQP, the producer channel's publisher confirms.
        self._confirms: Confirms | None = None

    def publish(self, messages: Sequence[tuple[Entry, str, str]]) -> dict[int, str]:
        """Send each ``(entry, occurrence key, task id)``; return the messages the broker
        refused (by index in ``messages``, with its reason): it took all the others.

        Where the transport supports it (Redis) the messages go out pipelined: the captured
        payloads on one redis-py transaction, the rest through kombu's ``Producer.batch``, so
        a 10,000-schedule minute costs a few round trips rather than 10,000. On AMQP the call
        returns once the broker answered every message (publisher confirms: a nack is a
        refusal). On Redis a command of the transaction that fails (``WRONGTYPE`` on one
        queue's key) refuses the messages it carried; the others went in. Raises
        :class:`PublishError` if the broker failed; its ``confirmed`` counts the leading
        messages it answered for (none, once anything was pipelined).
        """
        sent = 0
        batched = False
        pushes: list[tuple[str, str, int]] = []
        confirms: Confirms | None = None
        first = 0
        try:
            producer = self._get_producer()
            batched = producer.supports_batch_publish
            confirms = self._confirms
            first = 0 if confirms is None else confirms.published
            prepared = [self._prepared(producer, entry) for entry, _, _ in messages]
            tags = delivery_tags(sum(isinstance(p and p.template, RedisPush) for p in prepared))
            with producer.batch(max_size=max(1, len(messages))):
                for (entry, key, task_id), p in zip(messages, prepared, strict=True):
                    if p is None:
                        self._send(producer, entry, key, task_id)
                    elif isinstance(p.template, RedisPush):
                        self._declare(producer, p.template.declare)
                        payload = p.template.payload(key, task_id, next(tags), entry.name, p.fill)
                        pushes.append((p.template.list_key, payload, sent))
                    else:
                        retry = not batched and confirms is None
                        self._replay(producer, p.template, entry.name, key, task_id, p.fill, retry)
                    sent += 1
                    if confirms is not None:
                        confirms.published += 1
                        if confirms.published % CONFIRM_EVERY == 0:
                            confirms.wait(producer.connection, self.write_timeout.total_seconds())
            refused = self._lpush(producer, pushes) if pushes else {}
            if confirms is not None:
                confirms.wait(producer.connection, self.write_timeout.total_seconds())
                refused.update(confirms.collect(first))
        except Exception as exc:
            self.reset()
            if confirms is not None:
                answered = max(0, confirms.answered - first)
                raise PublishError(
                    str(exc), confirmed=answered, refused=confirms.collect(first)
                ) from exc
            raise PublishError(str(exc), confirmed=0 if batched or pushes else sent) from exc
        return refused

    @staticmethod
    def _lpush(producer: Producer, pushes: Sequence[tuple[str, str, int]]) -> dict[int, str]:
        """LPUSH the payloads; return the messages (by index) of any command Redis refused."""
        # The client as kombu's own PublishBatch takes it, so a global_keyprefix still applies.
        channel = producer.channel
        carried: list[list[int]] = []
        # MULTI/EXEC: Redis runs the whole chunk or none of it, so a connection cut mid-chunk
        # leaves nothing half-sent; only a reply lost after EXEC leaves the chunk in doubt.
        with channel.conn_or_acquire() as client, client.pipeline(transaction=True) as pipe:
            # One LPUSH of many values leaves the list exactly as that many single LPUSHes.
            for list_key, group in itertools.groupby(pushes, key=operator.itemgetter(0)):
                values = list(group)
                pipe.lpush(list_key, *(payload for _, payload, _ in values))
                carried.append([index for _, _, index in values])
            # A command that fails inside EXEC fails alone: the others ran.
            results = pipe.execute(raise_on_error=False)
        return {
            index: f"refused by the broker: {result}"
            for result, indices in zip(results, carried, strict=True)
            if isinstance(result, Exception)
            for index in indices
        }

    def _send(self, producer: Producer, entry: Entry, key: str, task_id: str) -> None:
        """Celery's own path: ``apply_async`` for registered tasks, ``send_task`` otherwise."""
        # A fresh dict per message: the entry's own options are never mutated.
        options: dict[str, Any] = dict(entry.options)
        headers = dict(options.pop("headers", None) or {})
        # As celery.beat.Scheduler.apply_async marks what beat sends.
        headers["celery_beat_task"] = True
        headers["voltro_occurrence"] = key
        headers["periodic_task_name"] = entry.name
        options["headers"] = headers
        options["task_id"] = task_id
        # kombu's retry publishes again on a new connection, whose confirms nobody waits for.
        options.setdefault("retry", self._confirms is None)
        options.setdefault("retry_policy", RETRY_POLICY)
        args, kwargs = arguments(entry)
        task = self.app.tasks.get(entry.task)
        if task is not None:
            task.apply_async(args, kwargs, producer=producer, **options)
        else:
            self.app.send_task(entry.task, args, kwargs, producer=producer, **options)

    def prepare(self, entries: Sequence[Entry]) -> None:
        """Build the message templates ahead of the first occurrence, off the firing path.

        Best effort: with the broker down they are built at the first publish instead.
        """
        try:
            producer = self._get_producer()
            for entry in entries:
                self._prepared(producer, entry)
        except Exception:
            self.reset()

    def forget(self, name: str) -> None:
        """Forget schedule ``name``'s message (its definition changed): the next publish or
        :meth:`prepare` prepares it again, by its new shape."""
        self.templates.forget(name)

    def _prepared(self, producer: Producer, entry: Entry) -> Prepared | None:
        return self.templates.of(self._path(), entry, lambda: self._build(producer, entry))

    def _path(self) -> SendPath:
        """The app's send path as it stood at the first message prepared."""
        if self._send_path is None:
            self._send_path = SendPath.of(self.app)
        return self._send_path

    def _build(self, producer: Producer, entry: Entry) -> Prepared | None:
        """Run Celery's send path for ``entry`` against a recorder (None: not replayable)."""
        if not replayable(self._path(), entry):
            return None
        recorder = Recorder(producer.channel, auto_declare=False)
        self._send(recorder, entry, "", "")
        if recorder.call is None:
            return None
        recorded = Template(*recorder.call)
        try:
            push = RedisPush.capture(
                producer,
                recorded,
                lambda: self._replay(producer, recorded, entry.name, "", "", None, False),
            )
        except producer.connection.connection_errors:
            raise  # the broker is down: try again at the next publish
        except Exception:
            logger.debug(
                "voltro_beat: %s keeps kombu's publish path",
                entry.name,
                extra=logs.fields(schedule=entry.name),
            )
            push = None
        if push is None:
            return Prepared(recorded, None)
        declare = recorded.kwargs.get("declare") or ()
        return filled(push._replace(declare=declare), recorded_arguments(recorded))

    def _replay(
        self,
        producer: Producer,
        template: Template,
        name: str,
        key: str,
        task_id: str,
        arguments: Arguments | None,
        retry: bool,
    ) -> None:
        """Publish ``template`` for occurrence ``key`` of schedule ``name``, with its
        ``arguments`` where the template is its shape's."""
        # In a batch nothing reaches the broker before the flush, so a per-message retry
        # wrapper would only cost time; errors surface at the flush.
        kwargs = dict(template.kwargs, retry=retry)
        headers = kwargs["headers"] = dict(template.kwargs["headers"])
        headers["id"] = headers["root_id"] = kwargs["correlation_id"] = task_id
        headers["voltro_occurrence"] = key
        headers["periodic_task_name"] = name
        body = template.body
        if arguments is not None:
            body = (arguments.args, arguments.kwargs, body[2])
            headers["argsrepr"], headers["kwargsrepr"] = arguments.argsrepr, arguments.kwargsrepr
        self._declare(producer, kwargs.pop("declare", None))
        producer.publish(body, **kwargs)

    def _declare(self, producer: Producer, entities: Sequence[Any] | None) -> None:
        """Declare each queue once per connection, not once per message."""
        for entity in entities or ():
            if entity.name not in self._declared:
                producer.maybe_declare(entity)
                self._declared.add(entity.name)

    def _get_producer(self) -> Producer:
        if self._producer is None:
            # kombu's own connection retries (broker_connection_timeout, every 2 s) would hold a
            # tick for seconds while the broker is down: one quick attempt, then fail closed.
            # A write is bounded (no transport bounds it by default). Each transport reads
            # only the options it knows.
            seconds = self.write_timeout.total_seconds()
            options = dict(
                self.app.conf.broker_transport_options or {},
                **RETRY_POLICY,
                socket_timeout=seconds,
                read_timeout=seconds,
                write_timeout=seconds,
            )
            connection = self.app.connection_for_write(transport_options=options)
            producer = self.app.amqp.Producer(connection, auto_declare=False)
            if connection.transport.driver_type == "amqp":
                # A message counts as sent once RabbitMQ confirmed it.
                self._confirms = Confirms(producer.channel)
            self._connection, self._producer = connection, producer
        return self._producer

    def reset(self) -> None:
        """Drop the connection (after a failure, or at close); the next publish reconnects."""
        connection, self._connection, self._producer = self._connection, None, None
        self._confirms = None
        self._declared.clear()
        if connection is not None:
            # A broken connection may fail to close; it is being dropped either way.
            with contextlib.suppress(Exception):
                connection.release()
