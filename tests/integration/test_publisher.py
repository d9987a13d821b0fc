"""The publisher's replayed templates produce exactly the message Celery itself would send.

On the in-memory broker the replayed kombu call is compared with Celery's own message; on a real
Redis (database 8) the payload the fast path LPUSHes is compared with the one kombu's own path
pushes, and a real prefork worker consumes fast-path messages.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from celery import Celery
from kombu import Queue
from kombu.common import Broadcast

from voltro_beat.exceptions import PublishError
from voltro_beat.messages import RedisPush, uuid4_str
from voltro_beat.occurrences import task_id_for
from voltro_beat.publisher import Publisher
from voltro_beat.schedules import Entry, parse_entries

if TYPE_CHECKING:
    from conftest import Worker

#: This run's suffix: queue and key names never meet an earlier (aborted) run's messages.
RUN = uuid.uuid4().hex[:8]


def registered(x: int) -> int:
    return x


def anything(*args: Any, **kwargs: Any) -> None:
    return None


def make_app() -> Celery:
    app = Celery("pub", broker="memory://", set_as_current=False)
    app.conf.task_routes = {"pub.routed": {"queue": "routed"}}
    # Task-level execution options must reach the message as Celery would send them.
    app.task(registered, name="pub.registered", time_limit=30, soft_time_limit=20)
    return app


def entry(name: str, **raw: Any) -> Entry:
    (parsed,) = parse_entries({name: {"schedule": 60.0, **raw}}, tz=None, max_lateness=timedelta(1))
    return parsed


def received(app: Celery, queue: str) -> list[Any]:
    messages = []
    with app.connection_for_read() as conn:
        q = conn.SimpleQueue(queue, accept=["json", "pickle"])
        while True:
            try:
                message = q.get(timeout=0.05)
            except q.Empty:
                break
            messages.append(message)
            message.ack()
    return messages


def comparable(message: Any) -> dict[str, Any]:
    properties = dict(message.properties)
    properties.pop("delivery_tag", None)
    return {"headers": message.headers, "properties": properties, "body": message.body}


@pytest.mark.parametrize(
    ("raw", "queue"),
    [
        ({"task": "pub.registered", "args": [1]}, "celery"),
        ({"task": "pub.unregistered", "kwargs": {"a": 1}}, "celery"),
        ({"task": "pub.routed", "args": [2]}, "routed"),
        (
            {
                "task": "pub.registered",
                "args": [3],
                "options": {"queue": "opts", "priority": 7, "headers": {"mine": "x"}},
            },
            "opts",
        ),
    ],
)
def test_replayed_message_equals_celerys_own(raw: dict[str, Any], queue: str) -> None:
    app = make_app()
    e = entry("e", **raw)
    key = "e@2026-01-01T10:00:00"
    tid = task_id_for(key)
    # kombu's memory transport is one per process: leave nothing another test sent behind.
    received(app, queue)
    send_as_celery(app, e, key)
    (expected,) = received(app, queue)

    publisher = Publisher(app, write_timeout=timedelta(seconds=30))
    publisher.prepare([e])
    publisher.publish([(e, key, tid), (e, "e@2026-01-01T10:01:00", task_id_for("x"))])
    assert template_of(publisher, "e") is not None
    assert not isinstance(template_of(publisher, "e"), RedisPush)  # not Redis: kombu's path
    first, second = received(app, queue)
    assert comparable(first) == comparable(expected)
    assert second.headers["id"] == second.headers["root_id"] == task_id_for("x")
    assert second.properties["correlation_id"] == task_id_for("x")
    assert second.headers["voltro_occurrence"] == "e@2026-01-01T10:01:00"
    publisher.reset()


def template_of(publisher: Publisher, name: str) -> Any:
    prepared = publisher.templates.prepared[name]
    return None if prepared is None else prepared.template


#: Entries of one shape (task and options) with arguments of every kind JSON and pickle take,
#: empty ones included (Celery sends ``args or ()``).
ARGUMENTS = [
    {"args": [1]},
    {"args": [2.5, -0.0, None, True], "kwargs": {"b": 'é"x', "a": [1, (2, 3)]}},
    {"args": []},
    {"kwargs": {"n": 10**30}},
    {"args": [list(range(300))]},  # argsrepr cut short at Celery's maximum
    {},
]


@pytest.mark.parametrize("serializer", ["json", "pickle"])
def test_schedules_of_one_shape_share_a_template_and_send_celerys_own_messages(
    serializer: str,
) -> None:
    """A hundred thousand schedules generated for one task cost one template: the messages of
    one shape (task and options) differ only in ids, the schedule's name and its arguments."""
    app = make_app()
    app.conf.task_serializer = serializer
    app.conf.accept_content = ["json", "pickle"]
    entries = [
        entry(f"s{i}", task="pub.unregistered", options={"priority": 3}, **raw)
        for i, raw in enumerate(ARGUMENTS)
    ]
    keys = {e.name: f"{e.name}@2026-01-01T10:00:00" for e in entries}
    received(app, "celery")
    for e in entries:
        send_as_celery(app, e, keys[e.name])
    expected = received(app, "celery")

    publisher = Publisher(app, write_timeout=timedelta(seconds=30))
    publisher.prepare(entries)
    assert len({id(template_of(publisher, e.name)) for e in entries}) == 1
    assert template_of(publisher, "s0") is not None
    publisher.publish([(e, keys[e.name], task_id_for(keys[e.name])) for e in entries])
    got = received(app, "celery")
    assert [comparable(m) for m in got] == [comparable(m) for m in expected]
    # A changed definition forgets its schedule's message; the shape goes with its last user.
    for e in entries[1:]:
        publisher.forget(e.name)
    assert len(publisher.templates.shapes) == 1
    publisher.forget("s0")
    assert not publisher.templates.shapes and not publisher.templates.prepared
    publisher.reset()


def test_a_registered_tasks_schedules_share_a_template_and_bad_arguments_fail_as_in_celery() -> (
    None
):
    app = make_app()
    a, b = entry("a", task="pub.registered", args=[1]), entry("b", task="pub.registered", args=[2])
    publisher = Publisher(app, write_timeout=timedelta(seconds=30))
    publisher.prepare([a, b])
    assert template_of(publisher, "a") is template_of(publisher, "b") is not None
    wrong = entry("wrong", task="pub.registered", args=[1, 2])
    with pytest.raises(TypeError):
        app.tasks["pub.registered"].apply_async([1, 2])
    with pytest.raises(PublishError):
        publisher.publish([(wrong, "wrong@1", task_id_for("wrong@1"))])
    publisher.reset()


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ({"options": {"priority": 1}}, {"options": {"priority": 2}}),
        ({"options": {"priority": 1}}, {"options": {"priority": 1.0}}),
        ({"options": {"headers": {"a": 1, "b": 2}}}, {"options": {"headers": {"b": 2, "a": 1}}}),
        ({"task": "pub.registered", "args": [1]}, {"task": "pub.unregistered", "args": [1]}),
    ],
)
def test_schedules_whose_messages_differ_but_in_arguments_do_not_share_a_template(
    one: dict[str, Any], other: dict[str, Any]
) -> None:
    app = make_app()
    a = entry("a", **{"task": "pub.unregistered", **one})
    b = entry("b", **{"task": "pub.unregistered", **other})
    publisher = Publisher(app, write_timeout=timedelta(seconds=30))
    publisher.prepare([a, b])
    assert template_of(publisher, "a") is not template_of(publisher, "b")
    publisher.reset()


def test_a_router_function_gives_each_schedule_a_template_of_its_own() -> None:
    """A router function is given the arguments: the message may depend on them."""

    def by_argument(name: str, args: Any, kwargs: Any, options: Any, **rest: Any) -> Any:
        return {"queue": f"q{args[0]}"} if name == "pub.unregistered" else None

    app = make_app()
    app.conf.task_routes = (by_argument,)
    a = entry("a", task="pub.unregistered", args=[1])
    b = entry("b", task="pub.unregistered", args=[2])
    publisher = Publisher(app, write_timeout=timedelta(seconds=30))
    publisher.prepare([a, b])
    assert template_of(publisher, "a") is not template_of(publisher, "b")
    publisher.publish([(a, "a@1", task_id_for("a@1")), (b, "b@1", task_id_for("b@1"))])
    assert [m.headers["periodic_task_name"] for m in received(app, "q1")] == ["a"]
    assert [m.headers["periodic_task_name"] for m in received(app, "q2")] == ["b"]
    publisher.reset()


def test_an_option_of_the_apps_own_type_gets_a_template_of_its_own() -> None:
    """Equality of an object says nothing of how it is serialised: no shape, no sharing."""

    class Same(dict[str, str]):
        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return 0

    app = make_app()
    a = entry("a", task="pub.unregistered", options={"headers": Same(x="1")})
    b = entry("b", task="pub.unregistered", options={"headers": Same(x="2")})
    publisher = Publisher(app, write_timeout=timedelta(seconds=30))
    publisher.prepare([a, b])
    assert template_of(publisher, "a") is not None
    assert template_of(publisher, "a") is not template_of(publisher, "b")
    publisher.reset()


def test_time_relative_options_take_celerys_path_each_time() -> None:
    app = make_app()
    e = entry("e", task="pub.registered", args=[1], options={"expires": 60})
    publisher = Publisher(app, write_timeout=timedelta(seconds=30))
    publisher.publish([(e, "e@1", task_id_for("e@1"))])
    publisher.publish([(e, "e@2", task_id_for("e@2"))])
    first, second = received(app, "celery")
    assert first.headers["expires"] and second.headers["expires"]
    assert first.headers["id"] == task_id_for("e@1")
    assert second.headers["voltro_occurrence"] == "e@2"
    publisher.reset()


# -- the Redis fast path ---------------------------------------------------------------------


@pytest.fixture
def broker(redis_url: str) -> Iterator[str]:
    """Redis database 8; this run's keys are deleted afterwards."""
    url = f"{redis_url}/8"
    yield url
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"*{RUN}*"))
    if keys:
        client.delete(*keys)
    client.close()


def redis_app(url: str, **conf: Any) -> Celery:
    app = Celery("pub", broker=url, set_as_current=False)
    app.conf.task_default_queue = f"default_{RUN}"
    app.conf.task_routes = {"pub.routed": {"queue": f"routed_{RUN}"}}
    app.conf.update(conf)
    app.task(registered, name="pub.registered", time_limit=30, soft_time_limit=20)
    return app


def pop_lists(url: str) -> dict[bytes, list[Any]]:
    """Every list of this run (priority lists included): key -> JSON documents, oldest first."""
    client = redis.Redis.from_url(url)
    lists = {}
    for key in client.scan_iter(match=f"*{RUN}*"):
        if client.type(key) == b"list":
            raw = client.lrange(key, 0, -1)[::-1]
            client.delete(key)
            lists[key] = [json.loads(item) for item in raw]
    client.close()
    return lists


def send_as_celery(app: Celery, e: Entry, key: str) -> None:
    """Celery's own send path as its beat takes it (arguments as a list, the
    ``celery_beat_task`` header), with the ids and headers the publisher gives this occurrence.
    test_beat_message compares with Celery's beat itself."""
    options = dict(e.options)
    headers = {
        **options.pop("headers", {}),
        "celery_beat_task": True,
        "voltro_occurrence": key,
        "periodic_task_name": e.name,
    }
    task = app.tasks.get(e.task)
    tid = task_id_for(key)
    args = list(e.args)
    if task is not None:
        task.apply_async(args, dict(e.kwargs), task_id=tid, headers=headers, **options)
    else:
        app.send_task(e.task, args, dict(e.kwargs), task_id=tid, headers=headers, **options)


@pytest.mark.redis
@pytest.mark.parametrize(
    ("raw", "conf", "name"),
    [
        ({"task": "pub.registered", "args": [1]}, {}, "e"),
        ({"task": "pub.unregistered", "kwargs": {"a": 'é"x'}}, {}, 'sché"dule'),
        ({"task": "pub.routed", "args": [2]}, {}, "e"),
        (
            {
                "task": "pub.registered",
                "args": [3],
                "options": {"queue": f"opts_{RUN}", "priority": 7, "headers": {"mine": "x"}},
            },
            {},
            "e",
        ),
        (
            {"task": "pub.unregistered", "args": [4]},
            {"broker_transport_options": {"global_keyprefix": f"pfx_{RUN}:"}},
            "e",
        ),
    ],
)
def test_fast_path_pushes_kombus_own_payload(
    broker: str, raw: dict[str, Any], conf: dict[str, Any], name: str
) -> None:
    app = redis_app(broker, **conf)
    e = entry(name, **raw)
    key = f"{name}@2026-01-01T10:00:00"
    send_as_celery(app, e, key)
    expected = pop_lists(broker)
    (documents,) = expected.values()
    assert len(documents) == 1

    publisher = Publisher(app, write_timeout=timedelta(seconds=30))
    publisher.prepare([e])
    template = template_of(publisher, name)
    assert isinstance(template, RedisPush)
    other = f"{name}@2026-01-01T10:01:00"
    publisher.publish([(e, key, task_id_for(key)), (e, other, task_id_for(other))])
    publisher.reset()
    pushed = pop_lists(broker)
    assert pushed.keys() == expected.keys()  # the same list: priority step and key prefix
    (first, second) = next(iter(pushed.values()))
    tags = {first["properties"].pop("delivery_tag"), second["properties"].pop("delivery_tag")}
    assert len(tags) == 2 and all(uuid.UUID(tag).version == 4 for tag in tags)
    documents[0]["properties"].pop("delivery_tag")
    assert first == documents[0]
    assert second["headers"]["id"] == second["headers"]["root_id"] == task_id_for(other)
    assert second["properties"]["correlation_id"] == task_id_for(other)
    assert second["headers"]["voltro_occurrence"] == other


@pytest.mark.redis
@pytest.mark.parametrize("serializer", ["json", "pickle"])
def test_fast_path_splices_each_schedules_name_and_arguments_into_its_shapes_payload(
    broker: str, serializer: str
) -> None:
    app = redis_app(broker, task_serializer=serializer)
    entries = [
        entry(f'sché"dule-{i}', task="pub.unregistered", **raw) for i, raw in enumerate(ARGUMENTS)
    ]
    keys = [f"{e.name}@2026-01-01T10:00:00" for e in entries]
    for e, key in zip(entries, keys, strict=True):
        send_as_celery(app, e, key)
    (expected,) = pop_lists(broker).values()

    publisher = Publisher(app, write_timeout=timedelta(seconds=30))
    publisher.prepare(entries)
    assert isinstance(template_of(publisher, entries[0].name), RedisPush)
    assert len({id(template_of(publisher, e.name)) for e in entries}) == 1
    publisher.publish([(e, key, task_id_for(key)) for e, key in zip(entries, keys, strict=True)])
    publisher.reset()
    (pushed,) = pop_lists(broker).values()
    for document in (*expected, *pushed):
        document["properties"].pop("delivery_tag")
    assert pushed == expected


def test_uuid4_str_is_uuids_own_rendering() -> None:
    samples = [bytes(16), b"\xff" * 16, *(os.urandom(16) for _ in range(2000))]
    for raw in samples:
        assert uuid4_str(raw) == str(uuid.UUID(bytes=raw, version=4))


@pytest.mark.redis
def test_expiring_queue_keeps_kombus_path(broker: str) -> None:
    queue = f"exp_{RUN}"
    app = redis_app(broker, task_queues=[Queue(queue, expires=60)])
    e = entry("e", task="pub.registered", args=[1], options={"queue": queue})
    publisher = Publisher(app, write_timeout=timedelta(seconds=30))
    publisher.publish([(e, "e@1", task_id_for("e@1"))])
    publisher.reset()
    template = template_of(publisher, "e")
    assert template is not None and not isinstance(template, RedisPush)
    client = redis.Redis.from_url(broker)
    assert 0 < client.pttl(queue) <= 60_000  # kombu's _put refreshed the queue's expiry
    client.close()
    ((document,),) = pop_lists(broker).values()
    assert document["headers"]["voltro_occurrence"] == "e@1"


@pytest.mark.redis
def test_fanout_queue_keeps_kombus_path(broker: str) -> None:
    queue = f"bcast_{RUN}"
    app = redis_app(broker, task_queues=[Broadcast(queue)])
    e = entry("e", task="pub.registered", args=[1], options={"queue": queue})
    listener = redis.Redis.from_url(broker).pubsub(ignore_subscribe_messages=True)
    listener.psubscribe(f"*{queue}*")
    try:
        publisher = Publisher(app, write_timeout=timedelta(seconds=30))
        # As a worker consuming it would: the exchange becomes fanout on the publisher's channel.
        publisher._get_producer().maybe_declare(Broadcast(queue))
        publisher.publish([(e, "e@1", task_id_for("e@1"))])
        publisher.reset()
        template = template_of(publisher, "e")
        assert template is not None and not isinstance(template, RedisPush)
        deadline = time.monotonic() + 5
        message = None
        while message is None and time.monotonic() < deadline:
            message = listener.get_message(timeout=0.1)
        assert message is not None, "the fanout message never reached a subscriber"
        assert json.loads(message["data"])["headers"]["voltro_occurrence"] == "e@1"
    finally:
        listener.close()


WORKER_APP = """
import json
import os

import redis
from celery import Celery

app = Celery("pub_e2e", broker=os.environ["PUB_E2E_BROKER"])
app.conf.task_default_queue = os.environ["PUB_E2E_QUEUE"]
sink = redis.Redis.from_url(os.environ["PUB_E2E_BROKER"])


def record(self, *args, **kwargs):
    sink.rpush(os.environ["PUB_E2E_SINK"], json.dumps({
        "name": self.name,
        "id": self.request.id,
        "args": list(args),
        "kwargs": kwargs,
        "occurrence": getattr(self.request, "voltro_occurrence", None),
        "periodic": getattr(self.request, "periodic_task_name", None),
    }))


app.task(record, bind=True, name="pub_e2e.registered")
app.task(record, bind=True, name="pub_e2e.unregistered")
"""


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
    return value


@pytest.mark.redis
@pytest.mark.timeout(120)
def test_worker_consumes_fast_path_messages(
    broker: str, tmp_path: Path, celery_worker: Callable[..., Worker]
) -> None:
    queue, sink = f"e2e_{RUN}", f"e2e_sink_{RUN}"
    (tmp_path / "pub_e2e_app.py").write_text(textwrap.dedent(WORKER_APP))
    env = {"PUB_E2E_BROKER": broker, "PUB_E2E_QUEUE": queue, "PUB_E2E_SINK": sink}
    worker = celery_worker("pub_e2e_app", app_dir=tmp_path, name=f"pub-{RUN}", env=env)

    app = Celery("pub", broker=broker, set_as_current=False)
    app.conf.task_default_queue = queue
    # One task known to the publishing app (apply_async), one only by name (send_task).
    app.task(anything, name="pub_e2e.registered")
    entries = [
        entry("a", task="pub_e2e.registered", args=[1, "x"]),
        entry("b", task="pub_e2e.unregistered", kwargs={"k": [1, {"n": None}]}),
        entry("c", task="pub_e2e.unregistered", args=[3], kwargs={"z": "é"}),
    ]
    messages = [
        (e, f"{e.name}@{i}", task_id_for(f"{e.name}@{i}")) for i in range(20) for e in entries
    ]
    publisher = Publisher(app, write_timeout=timedelta(seconds=30))
    publisher.prepare(entries)
    for e in entries:
        template = template_of(publisher, e.name)
        assert isinstance(template, RedisPush)
    publisher.publish(messages)
    publisher.reset()

    client = redis.Redis.from_url(broker)
    try:
        records = wait_for(
            "every message to run",
            lambda: len(got := client.lrange(sink, 0, -1)) >= len(messages) and got,
            timeout=60,
        )
        time.sleep(0.5)  # a duplicate delivery would show up by now
        runs = [json.loads(r) for r in client.lrange(sink, 0, -1)]
        assert len(runs) == len(records) == len(messages)
        by_id = {r["id"]: r for r in runs}
        assert len(by_id) == len(messages)  # each task id ran exactly once
        for e, key, task_id in messages:
            run = by_id[task_id]
            assert run["name"] == e.task
            assert run["args"] == list(e.args)
            assert run["kwargs"] == dict(e.kwargs)
            assert run["occurrence"] == key
            assert run["periodic"] == e.name
        assert client.llen(queue) == 0
        # Acked: nothing left for kombu's visibility-timeout restore.
        wait_for("the acks", lambda: client.hlen("unacked") == 0, timeout=10)
        assert client.zcard("unacked_index") == 0
    finally:
        client.close()
    assert "ERROR" not in worker.output()
