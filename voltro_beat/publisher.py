"""Won occurrence -> broker message, over one reused connection: pipelined on Redis,
confirmed by the broker on AMQP.

What each message holds, and the templates that spare Celery's send path per occurrence,
are :mod:`voltro_beat.messages`; here they are sent, and the broker's answer collected.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from celery import Celery
from kombu import Connection, Producer

from voltro_beat import logs
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
    shape,
)

if TYPE_CHECKING:
    from voltro_beat.schedules import Entry

logger = logging.getLogger(__name__)

#: Bounded so that a broker outage cannot stall the tick: one quick reconnect, then give up
#: and leave the run ``claimed`` for the recovery sweep.
RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}

#: On AMQP, the publisher waits for the broker's confirms after this many messages: a
#: connection lost meanwhile leaves at most that many in doubt (sent again, same task ids),
#: and a thousand messages cost ten round trips, not a thousand.
CONFIRM_EVERY = 100


class _Confirms:
    """RabbitMQ's publisher confirms on one channel, waited for a batch at a time.

    The channel is in confirm mode: the broker answers each message with an ack (it took it)
    or a nack (it refused it: a queue at ``x-max-length`` with ``reject-publish``, an internal
    queue error), by delivery tag (1, 2, ... in publish order), several at once when
    ``multiple``. Waiting for the last tag of a batch (:data:`CONFIRM_EVERY` messages) costs
    about one round trip for the whole batch, where waiting for each message (kombu's
    ``confirm_publish``) costs one per message.
    """

    def __init__(self, channel: Any) -> None:
        channel.confirm_select()
        #: The tags handed out on this channel so far (one per basic.publish).
        self.published = 0
        #: The broker answered for every tag up to this one.
        self.answered = 0
        #: The answered tags it refused (until the publisher collects them).
        self.refused: set[int] = set()
        #: Answers beyond ``answered`` (tag -> refused), out of order.
        self._early: dict[int, bool] = {}
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self._answer(tag, multiple, refused=False)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self._answer(tag, multiple, refused=True)

    def _answer(self, tag: int, multiple: bool, *, refused: bool) -> None:
        for t in range(self.answered + 1, tag + 1) if multiple else (tag,):
            self._early.setdefault(t, refused)
        while self.answered + 1 in self._early:
            self.answered += 1
            if self._early.pop(self.answered):
                self.refused.add(self.answered)

    def wait(self, connection: Connection, timeout: float) -> None:
        """Until the broker answered every message published so far; raises if the answers
        do not come within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.answered < self.published:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no publisher confirm within {timeout:g} s")
            connection.drain_events(timeout=remaining)

    def collect(self, first: int) -> dict[int, str]:
        """The refused messages published after tag ``first``, by their index from it."""
        refused = {
            tag - first - 1: "refused by the broker (basic.nack)"
            for tag in self.refused
            if tag > first
        }
        self.refused.clear()
        return refused


class Prepared(NamedTuple):
    """One schedule's message: a template (its own, or its shape's) and what the schedule fills
    in: for a :class:`RedisPush` its arguments' JSON (:meth:`RedisPush.fill`), for a
    :class:`Template` its :class:`Arguments` (None: the template's own)."""

    template: RedisPush | Template
    fill: Any


@dataclass(slots=True)
class _Shared:
    """The template of one shape (None: Celery's full path), and how many schedules use it."""

    #: The shape, one object for all its schedules (a schedule's own copy would cost a hundred
    #: bytes or so each).
    key: Hashable
    template: RedisPush | Template | None
    users: int = 0


class Publisher:
    """Publishes occurrences through one reused broker connection and producer."""

    def __init__(self, app: Celery, *, write_timeout: timedelta) -> None:
        self.app = app
        self.write_timeout = write_timeout
        self._connection: Connection | None = None
        self._producer: Producer | None = None
        #: Per schedule: its captured Redis payload, else its recorded publish call, with what
        #: it fills in; or None for Celery's full path. One template for all the schedules of a
        #: shape (:func:`voltro_beat.messages.shape`).
        self._messages: dict[str, Prepared | None] = {}
        #: Per shape in use: its template, and how many schedules use it.
        self._shapes: dict[Hashable, _Shared] = {}
        #: Per schedule with a shape: that shape.
        self._shape_of: dict[str, Hashable] = {}
        self._send_path: SendPath | None = None
        self._declared: set[str] = set()
        #: On AMQP, the producer channel's publisher confirms.
        self._confirms: _Confirms | None = None

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
        confirms: _Confirms | None = None
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
        :meth:`prepare` prepares it again, by its new shape. A shape no schedule uses any more
        is dropped."""
        self._messages.pop(name, None)
        kind = self._shape_of.pop(name, None)
        if kind is not None:
            shared = self._shapes[kind]
            shared.users -= 1
            if not shared.users:
                del self._shapes[kind]

    def _prepared(self, producer: Producer, entry: Entry) -> Prepared | None:
        try:
            return self._messages[entry.name]
        except KeyError:
            pass
        path = self._path()
        kind = shape(path, entry) if replayable(path, entry) else None
        shared = None if kind is None else self._shapes.get(kind)
        prepared: Prepared | None
        if shared is not None:
            prepared = None
            if shared.template is not None:
                prepared = _filled(shared.template, Arguments.of(path, entry))
        else:
            prepared = self._build(producer, entry)
            if kind is not None and (prepared is None or _shareable(path, entry, prepared)):
                template = None if prepared is None else prepared.template
                shared = self._shapes[kind] = _Shared(kind, template)
        if shared is not None:
            shared.users += 1
            self._shape_of[entry.name] = shared.key
        self._messages[entry.name] = prepared
        return prepared

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
        return _filled(push._replace(declare=declare), _recorded_arguments(recorded))

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
                self._confirms = _Confirms(producer.channel)
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


def _recorded_arguments(recorded: Template) -> Arguments:
    """The arguments of the message Celery's send path made for ``recorded``."""
    args, kwargs, _ = recorded.body
    headers = recorded.kwargs["headers"]
    return Arguments(args, kwargs, headers["argsrepr"], headers["kwargsrepr"])


def _filled(template: RedisPush | Template, arguments: Arguments) -> Prepared:
    if isinstance(template, RedisPush):
        return Prepared(template, template.fill(arguments))
    return Prepared(template, arguments)


def _shareable(path: SendPath, entry: Entry, prepared: Prepared) -> bool:
    """Whether the arguments of ``entry`` as :meth:`Arguments.of` makes them are the ones
    Celery's send path wrote in its message: if so, the other schedules of its shape fill in
    theirs the same way; if not, each builds a template of its own."""
    mine = Arguments.of(path, entry)
    if isinstance(prepared.template, RedisPush):
        return bool(prepared.fill == prepared.template.fill(mine))
    return _recorded_arguments(prepared.template) == mine
