"""A broker message of a schedule's occurrence: its arguments, its ids, and the template
that spares Celery's send path per occurrence.

Celery's ``apply_async``/``send_task`` does a lot of work per message (option merging,
routing, building the message, declaring the queue), which is what makes Celery's own beat
fall behind at a few thousand schedules (``python -m bench.publish`` measures it). The
message of one schedule differs from one occurrence to the next only in its task id and
occurrence key, and from the message of another schedule of the same task and options (the
same :func:`shape`) only in the schedule's name and arguments. So the publisher
(:mod:`voltro_beat.publisher`) runs Celery's own send path **once per shape** against a
recording producer (:class:`Recorder`), keeps the exact ``Producer.publish`` call it would
have made (:class:`Template`), and replays it for each occurrence with the ids, the name and
the schedule's :class:`Arguments` patched in: a hundred thousand schedules generated for one
task cost one template. Entries whose message depends on the publish time (``expires``,
``countdown``, ``eta``, ``BeatLazyFunc`` arguments) and apps that listen to the publish
signals go through Celery's full path every time (:func:`replayable`).

Even the replay costs kombu's per-message path (message preparation, routing, body encoding,
delivery tag, retry wrappers). On kombu's Redis transport the publisher therefore also lets
kombu build the final Redis payload once per shape (caught at the channel's ``_put``,
rendered by kombu's own ``dumps``: :class:`RedisPush`); per occurrence it only splices the
task id, the key, a fresh delivery tag, the schedule's name and its arguments (rendered once
per schedule) into that text, and LPUSHes everything on one pipeline. Whatever that capture
cannot reproduce exactly (fanout, several bound queues, queue expiry, redis-py retries, other
transports) keeps the replay.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from celery import Celery, signals
from celery.app.routes import MapRoute
from celery.app.task import Task
from celery.beat import BeatLazyFunc
from celery.utils.saferepr import saferepr
from kombu import Producer
from kombu.serialization import dumps as serialize
from kombu.utils.json import dumps as kombu_dumps

if TYPE_CHECKING:
    from voltro_beat.schedules import Entry

#: How kombu's JSON encoder (ensure_ascii, the C accelerator when present) writes a string.
_encode = json.encoder.encode_basestring_ascii

#: Placeholders for the task id, the occurrence key, the delivery tag, the schedule's name, the
#: body, ``argsrepr`` and ``kwargsrepr``: random per process, so no message contains them (and
#: the split checks that each one appears where expected).
_MARKS = tuple(f"voltro-{slot}-{uuid.uuid4().hex}" for slot in range(7))
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


#: Options whose value Celery resolves against the clock at send time.
TIME_RELATIVE = ("expires", "countdown", "eta")


class SendPath(NamedTuple):
    """What Celery's send path does alike for every schedule of an app, read once (its
    configuration is read through layers of mappings, microseconds a look-up)."""

    app: Celery
    #: Something listens to every send (the publish signals, sent events): each message takes
    #: Celery's full path.
    watched: bool
    #: Task protocol 2 and routes that are maps: a message depends on its arguments only
    #: through its body, ``argsrepr`` and ``kwargsrepr``.
    arguments_apart: bool
    argsrepr_maxsize: int
    kwargsrepr_maxsize: int
    repr_maxlevels: int

    @classmethod
    def of(cls, app: Celery) -> SendPath:
        conf = app.conf
        return cls(
            app,
            bool(
                conf.task_send_sent_event
                or signals.before_task_publish.receivers
                or signals.after_task_publish.receivers
            ),
            conf.task_protocol == 2 and all(isinstance(r, MapRoute) for r in app.amqp.routes),
            app.amqp.argsrepr_maxsize,
            app.amqp.kwargsrepr_maxsize,
            conf.task_repr_maxlevels,
        )


def replayable(path: SendPath, entry: Entry) -> bool:
    """Whether a message of ``entry`` can be replayed from a template: nothing in it
    depends on the publish time, and nothing listens to the publish signals."""
    task = path.app.tasks.get(entry.task)
    return not (
        path.watched
        or any(entry.options.get(name) is not None for name in TIME_RELATIVE)
        or any(isinstance(value, BeatLazyFunc) for value in (*entry.args, *entry.kwargs.values()))
        or getattr(task, "expires", None) is not None
    )


#: Option values whose equality is their serialisation's (a float by its repr, so that 0.0 and
#: -0.0, equal but written apart, do not share a shape).
_PLAIN = (str, int, bool, bytes, type(None))


class _Unshaped(Exception):
    """A value whose equality says nothing of how it is serialised."""


def _frozen(value: Any) -> Hashable:
    kind = type(value)
    if kind in _PLAIN:
        return (kind, value)
    if kind is float:
        return (kind, repr(value))
    if kind in (list, tuple):
        return (kind, tuple(_frozen(v) for v in value))
    if isinstance(value, Mapping) and kind in (dict, MappingProxyType):
        # In order: a message's mapping is written in its order.
        return (dict, tuple((_frozen(k), _frozen(v)) for k, v in value.items()))
    raise _Unshaped


def shape(path: SendPath, entry: Entry) -> Hashable | None:
    """The task and options of ``entry``, when Celery builds its message from them alone but
    for the arguments (the body, ``argsrepr``, ``kwargsrepr``): entries of one shape share one
    template, each filling in its own arguments (:class:`Arguments`).

    None (a template of the entry's own) when the message may depend on the arguments some
    other way: task protocol 1, a router function (it is given the arguments), a task class
    with its own ``apply_async`` or ``shadow_name``, pydantic arguments; or when an option is
    a value whose equality does not make its serialisation equal (an object of the app's own).
    """
    if not path.arguments_apart:
        return None
    task = path.app.tasks.get(entry.task)
    if task is not None and (
        type(task).apply_async is not Task.apply_async
        or type(task).shadow_name is not Task.shadow_name
        or getattr(task, "_dump_pydantic_arguments", None) is not None
    ):
        return None
    try:
        return (entry.task, _frozen(entry.options))
    except _Unshaped:
        return None


class Arguments(NamedTuple):
    """One schedule's arguments as its message carries them, apart from its shape's template:
    Celery's ``as_task_v2`` does ``args or ()`` and writes their ``saferepr``."""

    args: list[Any] | tuple[Any, ...]
    kwargs: dict[str, Any]
    argsrepr: str
    kwargsrepr: str

    @classmethod
    def of(cls, path: SendPath, entry: Entry) -> Arguments:
        """Raises what Celery's ``apply_async`` raises for arguments its task does not take."""
        listed, named = arguments(entry)
        args, kwargs = listed or (), named or {}
        task = path.app.tasks.get(entry.task)
        if task is not None and task.typing:
            check = getattr(task, "__header__", None)
            if check is not None:
                check(*args, **kwargs)
        levels = path.repr_maxlevels
        return cls(
            args,
            kwargs,
            saferepr(args, path.argsrepr_maxsize, maxlevels=levels),
            saferepr(kwargs, path.kwargsrepr_maxsize, maxlevels=levels),
        )


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


class Recorder(Producer):
    """A producer that keeps the publish call Celery makes instead of sending it."""

    call: tuple[Any, dict[str, Any]] | None = None

    def publish(self, body: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self.call = (body, kwargs)


class RedisPush(NamedTuple):
    """One shape's final Redis payload, pre-rendered around the values that change.

    kombu would encode the whole message again for every occurrence (tens of microseconds for
    a 1 kB message); only the task id (``id``, ``root_id``, ``correlation_id``), the occurrence
    key, the delivery tag, the schedule's name (``periodic_task_name``) and its arguments (the
    body, ``argsrepr``, ``kwargsrepr``) differ, so the JSON text is split around them once and
    each payload is a join of those parts with the JSON-encoded values: the arguments' encoded
    once per schedule (:meth:`fill`), the others per occurrence.
    """

    list_key: str
    parts: tuple[str, ...]
    #: Between ``parts[i]`` and ``parts[i + 1]``: 0 the task id, 1 the key, 2 the delivery tag,
    #: 3 the schedule's name, 4 the body, 5 ``argsrepr``, 6 ``kwargsrepr``.
    slots: tuple[int, ...]
    #: How kombu serialises the body (``(args, kwargs, embed)``) and encodes it for Redis.
    serializer: str
    embed: Any
    encode: Callable[[Any], str]
    #: The queues kombu would declare before the put (the recorded call's ``declare``).
    declare: Sequence[Any] = ()

    @classmethod
    def capture(cls, producer: Producer, recorded: Template, publish: Any) -> RedisPush | None:
        """Run ``publish()`` (``recorded``, replayed) with the channel's ``_put`` caught; None
        if not reproducible.

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
        encoding = message["properties"].get("body_encoding")
        codec = channel.codecs.get(encoding) if encoding and encoding.lower() != "utf-8" else None
        return cls.split(
            channel._q_for_pri(queue, priority),
            message,
            recorded,
            (lambda data: data) if codec is None else codec.encode,
        )

    @classmethod
    def split(
        cls,
        list_key: str,
        message: dict[str, Any],
        recorded: Template,
        encode: Callable[[Any], str],
    ) -> RedisPush | None:
        """Split kombu's JSON of ``message`` around its variable values (None if ambiguous,
        or if the values rendered as :meth:`fill` renders them do not give it back)."""
        task_id, key, tag, name, body, args, kwargs = _MARKS
        headers, properties = message["headers"], message["properties"]
        marked = dict(
            message,
            body=body,
            headers=dict(
                headers,
                id=task_id,
                root_id=task_id,
                voltro_occurrence=key,
                periodic_task_name=name,
                argsrepr=args,
                kwargsrepr=kwargs,
            ),
            properties=dict(properties, correlation_id=task_id, delivery_tag=tag),
        )
        # kombu.transport.redis's own ``dumps`` (kombu.utils.json), so custom types encode alike.
        pieces = _SPLIT.split(kombu_dumps(marked))
        slots = tuple(_MARKS.index(json.loads(mark)) for mark in pieces[1::2])
        if sorted(slots) != [0, 0, 0, 1, 2, 3, 4, 5, 6]:
            return None
        own_args, own_kwargs, embed = recorded.body
        push = cls(
            list_key,
            tuple(pieces[0::2]),
            slots,
            recorded.kwargs.get("serializer") or "json",
            embed,
            encode,
        )
        # Exactness check: spliced with the captured values, it is kombu's own payload.
        own = push.payload(
            headers["voltro_occurrence"],
            headers["id"],
            properties["delivery_tag"],
            headers["periodic_task_name"],
            push.fill(Arguments(own_args, own_kwargs, headers["argsrepr"], headers["kwargsrepr"])),
        )
        return push if own == kombu_dumps(message) else None

    def fill(self, arguments: Arguments) -> tuple[str, str, str]:
        """A schedule's arguments as its payloads carry them: the body serialised and encoded
        as kombu does it, ``argsrepr`` and ``kwargsrepr``, each JSON-encoded."""
        _, _, data = serialize(
            (arguments.args, arguments.kwargs, self.embed), serializer=self.serializer
        )
        return (
            _encode(self.encode(data)),
            _encode(arguments.argsrepr),
            _encode(arguments.kwargsrepr),
        )

    def payload(self, key: str, task_id: str, tag: str, name: str, fill: Sequence[str]) -> str:
        """The exact string kombu would LPUSH for the occurrence ``key`` of schedule ``name``
        (its arguments as :meth:`fill` rendered them), with delivery tag ``tag`` (see
        :func:`delivery_tags`)."""
        values = (_encode(task_id), _encode(key), _encode(tag), _encode(name), *fill)
        parts = self.parts
        out = [parts[0]]
        for slot, part in zip(self.slots, parts[1:], strict=True):
            out += (values[slot], part)
        return "".join(out)


class Template(NamedTuple):
    """A shape's recorded ``Producer.publish`` call, replayed where no payload was captured.

    A captured :class:`RedisPush` replaces it (it holds only the payload's text).
    """

    body: Any
    kwargs: dict[str, Any]
