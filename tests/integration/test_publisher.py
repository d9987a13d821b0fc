"""The publisher's replayed templates produce exactly the message Celery itself would send."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from voltro_beat.publisher import Publisher, task_id_for
from voltro_beat.schedules import Entry, parse_entries


def registered(x: int) -> int:
    return x


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
        q = conn.SimpleQueue(queue)
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
    # Celery's own path, with the same ids and headers.
    options = dict(e.options)
    headers = {**options.pop("headers", {}), "voltro_occurrence": key, "periodic_task_name": "e"}
    task = app.tasks.get(e.task)
    sender = task.apply_async if task is not None else None
    if sender is not None:
        sender(e.args, dict(e.kwargs), task_id=tid, headers=headers, **options)
    else:
        app.send_task(e.task, e.args, dict(e.kwargs), task_id=tid, headers=headers, **options)
    (expected,) = received(app, queue)

    publisher = Publisher(app)
    publisher.prepare([e])
    publisher.publish([(e, key, tid), (e, "e@2026-01-01T10:01:00", task_id_for("x"))])
    first, second = received(app, queue)
    assert comparable(first) == comparable(expected)
    assert second.headers["id"] == second.headers["root_id"] == task_id_for("x")
    assert second.properties["correlation_id"] == task_id_for("x")
    assert second.headers["voltro_occurrence"] == "e@2026-01-01T10:01:00"
    publisher.reset()


def test_time_relative_options_take_celerys_path_each_time() -> None:
    app = make_app()
    e = entry("e", task="pub.registered", args=[1], options={"expires": 60})
    publisher = Publisher(app)
    publisher.publish([(e, "e@1", task_id_for("e@1"))])
    publisher.publish([(e, "e@2", task_id_for("e@2"))])
    first, second = received(app, "celery")
    assert first.headers["expires"] and second.headers["expires"]
    assert first.headers["id"] == task_id_for("e@1")
    assert second.headers["voltro_occurrence"] == "e@2"
    publisher.reset()
