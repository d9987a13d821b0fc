"""Singleton declarations: validated at boot, errors that name the singleton and the field."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from voltro_beat.config import Settings
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.singletons import Context, load_singletons, singleton

CLUSTER = Settings.resolve({"voltro_beat_coordination": "cluster"}, environ={})


def poll(context: Context) -> None:
    context.stop.wait(1)


def app(**singletons: Any) -> Celery:
    made = Celery("t", set_as_current=False)
    made.conf.voltro_beat_singletons = singletons
    return made


def test_a_declaration_by_path_or_function() -> None:
    found = load_singletons(
        app(
            a={"run": "tests.unit.test_singletons:poll", "group": "billing", "grace": 3},
            b={"run": poll, "restart": True},
        ),
        CLUSTER,
    )
    # (the module imported by path is another copy of this one under pytest)
    assert [(s.name, s.group, s.run.__qualname__, s.restart, s.grace) for s in found] == [
        ("a", "billing", "poll", False, timedelta(seconds=3)),
        ("b", "default", "poll", True, timedelta(seconds=10)),
    ]
    assert found[0].where == "tests.unit.test_singletons:poll"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"run": "tests.unit.test_singletons:nothing"}, "run"),
        ({"run": "no_such_module:fn"}, "run"),
        ({"run": "not a path"}, "run"),
        ({"run": poll, "group": ""}, "group"),
        ({"run": poll, "restart": "yes"}, "restart"),
        ({"run": poll, "grace": 0}, "grace"),
        ({"run": poll, "every": 5}, "every"),
    ],
)
def test_bad_declarations_name_the_singleton_and_the_field(
    spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_singletons(app(inbox=spec), CLUSTER)
    assert (info.value.entry, info.value.field) == ("inbox", field)
    assert str(info.value).startswith(f"singleton 'inbox', field '{field}': ")


def test_singletons_need_cluster_coordination() -> None:
    settings = Settings.resolve({}, environ={})
    with pytest.raises(ConfigurationError) as info:
        load_singletons(app(inbox={"run": poll}), settings)
    assert info.value.field == "voltro_beat_coordination"
    assert "inbox" in str(info.value)
    assert load_singletons(app(), settings) == []


def test_the_decorator_declares_and_a_duplicate_names_both_places() -> None:
    made = app(inbox={"run": "tests.unit.test_singletons:poll"})

    @singleton(made, "reconcile", group="billing")
    def reconcile(context: Context) -> None:
        pass

    assert [s.name for s in load_singletons(made, CLUSTER)] == ["inbox", "reconcile"]
    with pytest.raises(ConfigurationError) as info:

        @singleton(made, "inbox")
        def other(context: Context) -> None:
            pass

    message = str(info.value)
    assert "tests.unit.test_singletons:poll" in message
    assert "test_the_decorator_declares_and_a_duplicate_names_both_places.<locals>.other" in message
