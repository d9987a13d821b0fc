"""A voltro_beat replica sends exactly the message Celery's own beat sends for the same entry.

Celery's ``Scheduler.apply_entry`` is the reference: for each entry of the table it sends one
message, the publisher sends one, and the two are read back from a real broker (Redis, then
RabbitMQ) with json and pickle bodies. They must agree header by header, property by property,
body byte by byte, and land on the same exchange, routing key and queue. The reference gets the
task id and the two voltro headers that voltro_beat sets on purpose, so nothing else may differ.
When a Celery release changes its beat message, this test fails rather than users.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from celery import Celery
from celery.beat import BeatLazyFunc, ScheduleEntry, Scheduler
from kombu import Exchange, Queue

from voltro_beat.messages import RedisPush, Template
from voltro_beat.occurrences import task_id_for
from voltro_beat.publisher import Publisher
from voltro_beat.schedules import parse_entries
from voltro_beat.templates import Prepared

AMQP_URL = os.environ.get("VOLTRO_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672//")
RUN = uuid.uuid4().hex[:8]
DEFAULT = f"bm_default_{RUN}"
OPTS = f"bm_opts_{RUN}"
ROUTED = f"bm_routed_{RUN}"
BOUND = f"bm_bound_{RUN}"
EXPIRING = f"bm_expiring_{RUN}"
EXCHANGE = f"bm_x_{RUN}"
QUEUES = (DEFAULT, OPTS, ROUTED, BOUND, EXPIRING)


def registered(*args: Any, **kwargs: Any) -> None:
    return None


#: A BeatLazyFunc is called at each send: a count shows it.
LAZY = BeatLazyFunc(next, itertools.count())

#: name -> (beat_schedule entry without its schedule, the queue its message lands in)
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "list_args": ({"task": "bm.registered", "args": [1, "x", {"n": None}]}, DEFAULT),
    "tuple_args": ({"task": "bm.registered", "args": (1, "x")}, DEFAULT),
    "kwargs": ({"task": "bm.unregistered", "kwargs": {"a": 1, "b": [1, 2]}}, DEFAULT),
    "queue": ({"task": "bm.registered", "args": [1], "options": {"queue": OPTS}}, OPTS),
    "exchange": (
        {"task": "bm.registered", "options": {"exchange": EXCHANGE, "routing_key": "rk"}},
        BOUND,
    ),
    "priority": ({"task": "bm.unregistered", "options": {"priority": 5}}, DEFAULT),
    "expires_at": (
        {"task": "bm.registered", "options": {"expires": datetime(2030, 1, 1, tzinfo=UTC)}},
        DEFAULT,
    ),
    "expires_in": ({"task": "bm.registered", "options": {"expires": 3600}}, DEFAULT),
    "headers": (
        {"task": "bm.registered", "args": [2], "options": {"headers": {"mine": "x"}}},
        DEFAULT,
    ),
    "task_routes": ({"task": "bm.routed", "args": [3]}, ROUTED),
    "expiring_queue": ({"task": "bm.registered", "options": {"queue": EXPIRING}}, EXPIRING),
    "lazy_args": (
        {"task": "bm.registered", "args": [BeatLazyFunc(len, "abc")], "kwargs": {"k": LAZY}},
        DEFAULT,
    ),
}

#: Only pickle carries Python objects; the issue's example (a list holding a timedelta).
PICKLE_ONLY = {"timedelta_args": ({"task": "bm.registered", "args": [timedelta(hours=1)]}, DEFAULT)}


def path_of(prepared: Prepared | None) -> str:
    """Which of the publisher's three paths an entry takes."""
    template = None if prepared is None else prepared.template
    if isinstance(template, RedisPush):
        return "redis payload"
    return "kombu replay" if isinstance(template, Template) else "celery"


def expected_path(broker: str, case: str) -> str:
    if case.startswith("expires") or case == "lazy_args":
        return "celery"  # the expiry, the lazy values are computed at send time
    if broker == "redis" and case != "expiring_queue":
        return "redis payload"
    return "kombu replay"


def make_app(url: str, serializer: str) -> Celery:
    app = Celery("bm", broker=url, set_as_current=False)
    app.conf.update(
        task_default_queue=DEFAULT,
        task_routes={"bm.routed": {"queue": ROUTED}},
        task_queues=[
            Queue(DEFAULT),
            Queue(OPTS),
            Queue(ROUTED),
            Queue(BOUND, Exchange(EXCHANGE, type="direct"), routing_key="rk"),
            Queue(EXPIRING, expires=600),
        ],
        task_serializer=serializer,
        accept_content=["json", "pickle"],
    )
    app.task(registered, name="bm.registered", time_limit=30)
    app.task(registered, name="bm.routed")
    return app


@pytest.fixture(params=["redis", "rabbitmq"])
def broker(
    request: pytest.FixtureRequest, redis_url: str, need: Callable[..., None]
) -> Iterator[tuple[str, str]]:
    if request.param == "redis":
        url = f"{redis_url}/8"
        yield "redis", url
        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(match=f"*{RUN}*"))
        if keys:
            client.delete(*keys)
        client.close()
        return
    need("rabbitmq")
    yield "rabbitmq", AMQP_URL
    app = Celery("bm-clean", broker=AMQP_URL, set_as_current=False)
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for queue in QUEUES:
            channel.queue_delete(queue)
        channel.exchange_delete(EXCHANGE)


def take(app: Celery, queue: str) -> Any:
    """The one message waiting in ``queue`` (acknowledged), failing if none comes."""
    with app.connection_for_read() as conn:
        bound = Queue(queue, no_declare=True)(conn.default_channel)
        deadline = time.monotonic() + 10
        while (message := bound.get(no_ack=True)) is None:
            if time.monotonic() > deadline:
                pytest.fail(f"no message in {queue}")
            time.sleep(0.02)
        assert bound.get(no_ack=True) is None, f"more than one message in {queue}"
        return message


def seen(message: Any) -> dict[str, Any]:
    """Everything a worker or a monitor can see of a message, but its per-delivery tag."""
    properties = dict(message.properties)
    properties.pop("delivery_tag", None)
    # AMQP repeats the headers among the properties.
    assert properties.pop("application_headers", message.headers) == message.headers
    info = message.delivery_info
    return {
        "headers": dict(message.headers),
        "properties": properties,
        "content_type": message.content_type,
        "content_encoding": message.content_encoding,
        "body": message.body,
        "route": (info.get("exchange"), info.get("routing_key")),
    }


@pytest.mark.redis
@pytest.mark.rabbitmq
@pytest.mark.parametrize(
    ("case", "serializer"),
    [(case, "json") for case in CASES] + [(case, "pickle") for case in [*CASES, *PICKLE_ONLY]],
)
def test_message_equals_celery_beats_own(
    broker: tuple[str, str], case: str, serializer: str
) -> None:
    kind, url = broker
    raw, queue = {**CASES, **PICKLE_ONLY}[case]
    app = make_app(url, serializer)
    with app.connection_for_write() as conn:
        for declared in app.amqp.queues.values():
            declared(conn.default_channel).declare()

    key = f"{case}@2026-01-01T10:00:00"
    task_id = task_id_for(key)
    options = dict(raw.get("options", {}))
    options["headers"] = {
        **options.get("headers", {}),
        "voltro_occurrence": key,
        "periodic_task_name": case,
    }
    beat = Scheduler(app, lazy=True)
    beat.apply_entry(
        ScheduleEntry(
            name=case,
            task=raw["task"],
            schedule=timedelta(minutes=1),
            args=raw.get("args", ()),
            kwargs=raw.get("kwargs"),
            options={**options, "task_id": task_id},
            app=app,
        )
    )
    reference = seen(take(app, queue))

    # A schedule of the same task and options, other arguments, prepared first: the case's
    # message is its template's, with the case's name and arguments filled in.
    sibling = {**raw, "args": ["another", 2.5], "kwargs": {"other": (1, None)}}
    other, entry = parse_entries(
        {"sibling": {**sibling, "schedule": 60}, case: {**raw, "schedule": 60}},
        tz=None,
        max_lateness=timedelta(1),
    )
    publisher = Publisher(app, write_timeout=timedelta(seconds=30))
    try:
        publisher.prepare([other, entry])
        assert path_of(publisher.templates.prepared[case]) == expected_path(kind, case)
        if expected_path(kind, case) != "celery":
            shared = publisher.templates.prepared[case], publisher.templates.prepared["sibling"]
            assert shared[0] is not None and shared[1] is not None
            assert shared[0].template is shared[1].template
        publisher.publish([(entry, key, task_id)])
    finally:
        publisher.reset()
    ours = seen(take(app, queue))

    assert ours["headers"]["celery_beat_task"] is True
    if case.startswith("expires"):
        # kombu's ``expiration`` property counts milliseconds from each one's send time.
        for message in (reference, ours):
            assert int(message["properties"].pop("expiration")) > 0
    if case == "expires_in":
        # Both are "now + 1 h" at their own send time.
        for message in (reference, ours):
            assert datetime.fromisoformat(message["headers"].pop("expires")).tzinfo is not None
    if case == "lazy_args":
        # Called again for our message: the next count.
        assert ours.pop("body") != reference.pop("body")
        sent = reference["headers"].pop("kwargsrepr")
        count = int(sent.removeprefix("{'k': ").removesuffix("}"))
        assert ours["headers"].pop("kwargsrepr") == f"{{'k': {count + 1}}}"
        assert ours["headers"]["argsrepr"] == "[3]"
    assert ours == reference
