"""Won occurrence -> broker message, with a deterministic task id and voltro headers.

Celery's ``apply_async``/``send_task`` does a lot of work per message (option merging,
routing, building the message, declaring the queue), which is what makes Celery's own beat
fall behind at a few thousand schedules (``python -m bench.publish`` measures it). The
message of one schedule differs from one occurrence to the next only in its task id and
occurrence key, so the publisher runs Celery's own send path **once per schedule** against a
recording producer, keeps the exact ``Producer.publish`` call it would have made, and replays
it for each occurrence with the ids patched in. Entries whose message depends on the publish
time (``expires``, ``countdown``, ``eta``, ``BeatLazyFunc`` arguments) and apps that listen
to the publish signals go through Celery's full path every time.

Even the replay costs kombu's per-message path (message preparation, routing, body encoding,
delivery tag, retry wrappers). On kombu's Redis transport the publisher therefore also lets
kombu build the final Redis payload once per schedule (caught at the channel's ``_put``,
rendered by kombu's own ``dumps``); per occurrence it only splices the task id, the key and a
fresh delivery tag into that text, and LPUSHes everything on one pipeline. Whatever that
capture cannot reproduce exactly (fanout, several bound queues, queue expiry, redis-py
retries, other transports) keeps the replay.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import operator
import os
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from celery import Celery, signals
from celery.beat import BeatLazyFunc
from kombu import Connection, Producer
from kombu.utils.json import dumps as kombu_dumps

from voltro_beat import logs
from voltro_beat.exceptions import PublishError

if TYPE_CHECKING:
    from voltro_beat.schedules import Entry

logger = logging.getLogger(__name__)

#: How kombu's JSON encoder (ensure_ascii, the C accelerator when present) writes a string.
_encode = json.encoder.encode_basestring_ascii

#: Placeholders for the task id, the occurrence key and the delivery tag: random per process,
#: so no message contains them (and the split checks that each one appears where expected).
_MARKS = tuple(f"voltro-{slot}-{uuid.uuid4().hex}" for slot in range(3))
_SPLIT = re.compile("(" + "|".join(re.escape(_encode(mark)) for mark in _MARKS) + ")")

#: The variant digit of a UUID (RFC 4122: the top two bits of byte 8 are ``10``).
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def uuid4_str(raw: bytes) -> str:
    """``str(uuid.UUID(bytes=raw, version=4))`` without building the object."""
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


def delivery_tags(count: int) -> Iterator[str]:
    """``count`` fresh delivery tags: the consumer's ack/restore key (the ``unacked`` hash),
    unique per message, uuid4 strings as kombu's own ``_next_delivery_tag`` makes them; the
    randomness of a whole chunk read at once (a system call per message costs more than the
    rest of its payload)."""
    raw = os.urandom(16 * count)
    return (uuid4_str(raw[i : i + 16]) for i in range(0, 16 * count, 16))


#: Bounded so that a broker outage cannot stall the tick: one quick reconnect, then give up
#: and leave the run ``claimed`` for the recovery sweep.
RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}

#: On AMQP, the publisher waits for the broker's confirms after this many messages: a
#: connection lost meanwhile leaves at most that many in doubt (sent again, same task ids),
#: and a thousand messages cost ten round trips, not a thousand.
CONFIRM_EVERY = 100

#: Options whose value Celery resolves against the clock at send time.
TIME_RELATIVE = ("expires", "countdown", "eta")


def _evaluated(value: Any) -> Any:
    return value() if isinstance(value, BeatLazyFunc) else value


def arguments(entry: Entry) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments a message of ``entry`` carries, as Celery's beat
    sends them: a list (whether the entry gave a list or a tuple), ``BeatLazyFunc`` values
    called at each send."""
    return (
        [_evaluated(value) for value in entry.args],
        {name: _evaluated(value) for name, value in entry.kwargs.items()},
    )


class _Recorder(Producer):
    """A producer that keeps the publish call Celery makes instead of sending it."""

    call: tuple[Any, dict[str, Any]] | None = None

    def publish(self, body: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self.call = (body, kwargs)


class _RedisPush(NamedTuple):
    """One schedule's final Redis payload, pre-rendered around the values that change.

    kombu would encode the whole message again for every occurrence (tens of microseconds for
    a 1 kB message); only the task id (``id``, ``root_id``, ``correlation_id``), the occurrence
    key and the delivery tag differ, so the JSON text is split around them once and each
    payload is a join of those parts with the JSON-encoded values.
    """

    list_key: str
    parts: tuple[str, ...]
    #: Between ``parts[i]`` and ``parts[i + 1]``: 0 the task id, 1 the key, 2 the delivery tag.
    slots: tuple[int, ...]
    #: The queues kombu would declare before the put (the recorded call's ``declare``).
    declare: Sequence[Any] = ()

    @classmethod
    def capture(cls, producer: Producer, publish: Any) -> _RedisPush | None:
        """Run ``publish()`` with the channel's ``_put`` caught; None if not reproducible.

        Only the plain Redis channel (not Sentinel, not a subclass) and only when kombu itself
        would batch (no redis-py retries that could replay a pipeline) qualify.
        """
        channel = producer.channel
        # kombu.transport.redis imports only where redis-py is installed (the redis extra):
        # a channel of any other transport never needs it.
        if type(channel).__module__ != "kombu.transport.redis":
            return None
        from kombu.transport import redis as kombu_redis

        if type(channel) is not kombu_redis.Channel or not producer.supports_batch_publish:
            return None
        # Both of the channel's write paths are caught, so the capture itself sends nothing.
        puts: list[tuple[str, dict[str, Any]]] = []
        fanouts: list[Any] = []

        def put(queue: str, message: dict[str, Any], **kwargs: Any) -> None:
            puts.append((queue, message))

        def put_fanout(*args: Any, **kwargs: Any) -> None:
            fanouts.append(args)

        channel._put, channel._put_fanout = put, put_fanout  # type: ignore[method-assign]
        try:
            publish()
        finally:
            # Instance attributes over the class's methods: deleting them restores kombu's.
            del channel._put, channel._put_fanout
        if fanouts or len(puts) != 1:
            return None  # fanout, several bound queues, or unroutable
        queue, message = puts[0]
        if channel._expires and queue in channel._expires:
            return None  # kombu also refreshes the queue's expiry on every put
        priority = channel._get_message_priority(message, reverse=False)
        return cls.split(channel._q_for_pri(queue, priority), message)

    @classmethod
    def split(cls, list_key: str, message: dict[str, Any]) -> _RedisPush | None:
        """Split kombu's JSON of ``message`` around its variable values (None if ambiguous)."""
        task_id, key, tag = _MARKS
        marked = dict(
            message,
            headers=dict(message["headers"], id=task_id, root_id=task_id, voltro_occurrence=key),
            properties=dict(message["properties"], correlation_id=task_id, delivery_tag=tag),
        )
        # kombu.transport.redis's own ``dumps`` (kombu.utils.json), so custom types encode alike.
        pieces = _SPLIT.split(kombu_dumps(marked))
        slots = tuple(_MARKS.index(json.loads(mark)) for mark in pieces[1::2])
        if sorted(slots) != [0, 0, 0, 1, 2]:
            return None
        push = cls(list_key, tuple(pieces[0::2]), slots)
        # Exactness check: spliced with the captured values, it is kombu's own payload.
        headers, properties = message["headers"], message["properties"]
        own = push.render(headers["id"], headers["voltro_occurrence"], properties["delivery_tag"])
        return push if own == kombu_dumps(message) else None

    def payload(self, key: str, task_id: str, tag: str) -> str:
        """The exact string kombu would LPUSH for this occurrence, with delivery tag ``tag``
        (see :func:`delivery_tags`)."""
        return self.render(task_id, key, tag)

    def render(self, task_id: str, key: str, tag: str) -> str:
        values = (_encode(task_id), _encode(key), _encode(tag))
        parts = self.parts
        out = [parts[0]]
        for slot, part in zip(self.slots, parts[1:], strict=True):
            out += (values[slot], part)
        return "".join(out)


class _Template(NamedTuple):
    """A schedule's recorded ``Producer.publish`` call, replayed where no payload was captured.

    A captured :class:`_RedisPush` replaces it (it holds only the payload's text).
    """

    body: Any
    kwargs: dict[str, Any]


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


class Publisher:
    """Publishes occurrences through one reused broker connection and producer."""

    def __init__(self, app: Celery, *, write_timeout: timedelta) -> None:
        self.app = app
        self.write_timeout = write_timeout
        self._connection: Connection | None = None
        self._producer: Producer | None = None
        #: Per schedule: the captured Redis payload, else the recorded publish call, or None
        #: for Celery's full path.
        self._templates: dict[str, _RedisPush | _Template | None] = {}
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
            templates = [self._template(producer, entry) for entry, _, _ in messages]
            tags = delivery_tags(sum(isinstance(t, _RedisPush) for t in templates))
            with producer.batch(max_size=max(1, len(messages))):
                for (entry, key, task_id), template in zip(messages, templates, strict=True):
                    if template is None:
                        self._send(producer, entry, key, task_id)
                    elif isinstance(template, _RedisPush):
                        self._declare(producer, template.declare)
                        payload = template.payload(key, task_id, next(tags))
                        pushes.append((template.list_key, payload, sent))
                    else:
                        retry = not batched and confirms is None
                        self._replay(producer, template, key, task_id, retry=retry)
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
                self._template(producer, entry)
        except Exception:
            self.reset()

    def _template(self, producer: Producer, entry: Entry) -> _RedisPush | _Template | None:
        try:
            return self._templates[entry.name]
        except KeyError:
            pass
        template: _RedisPush | _Template | None = None
        if self._replayable(entry):
            recorder = _Recorder(producer.channel, auto_declare=False)
            self._send(recorder, entry, "", "")
            if recorder.call is not None:
                recorded = _Template(*recorder.call)
                try:
                    push = _RedisPush.capture(
                        producer, lambda: self._replay(producer, recorded, "", "", retry=False)
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
                declare = recorded.kwargs.get("declare") or ()
                template = recorded if push is None else push._replace(declare=declare)
        self._templates[entry.name] = template
        return template

    def _replayable(self, entry: Entry) -> bool:
        task = self.app.tasks.get(entry.task)
        return not (
            any(entry.options.get(name) is not None for name in TIME_RELATIVE)
            or any(
                isinstance(value, BeatLazyFunc) for value in (*entry.args, *entry.kwargs.values())
            )
            or getattr(task, "expires", None) is not None
            or self.app.conf.task_send_sent_event
            or signals.before_task_publish.receivers
            or signals.after_task_publish.receivers
        )

    def _replay(
        self,
        producer: Producer,
        template: _Template,
        key: str,
        task_id: str,
        *,
        retry: bool,
    ) -> None:
        # In a batch nothing reaches the broker before the flush, so a per-message retry
        # wrapper would only cost time; errors surface at the flush.
        kwargs = dict(template.kwargs, retry=retry)
        headers = kwargs["headers"] = dict(template.kwargs["headers"])
        headers["id"] = headers["root_id"] = kwargs["correlation_id"] = task_id
        headers["voltro_occurrence"] = key
        self._declare(producer, kwargs.pop("declare", None))
        producer.publish(template.body, **kwargs)

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
