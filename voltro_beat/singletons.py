"""Singletons: a named function that runs on exactly one live beat replica of its group at a
time (``cluster`` coordination), declared beside the schedules::

    app.conf.voltro_beat_singletons = {
        "poll-inbox": {"run": "proj.jobs:poll_inbox", "group": "billing"},
    }

or with the decorator :func:`singleton`. Its owner is the owner of its name's shard; it gets a
:class:`Context`: a fencing token (the shard's epoch, growing with every handoff) for its own
writes to check, a stop event set when ownership moves or beat stops, and a logger. This module
reads and validates the declarations; :mod:`voltro_beat.engine.singletons` runs them.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import Celery

from voltro_beat.config import Settings
from voltro_beat.coordination import Coordination
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.schedules import DEFAULT_GROUP, check_name

#: The app's setting that declares singletons.
SETTING = "voltro_beat_singletons"
#: How long a singleton has to return after its stop event is set before it is logged as stuck.
DEFAULT_GRACE = timedelta(seconds=10)
_KEYS = {"run", "group", "restart", "grace"}


@dataclass(frozen=True)
class Context:
    """What a singleton's function is called with."""

    name: str
    group: str
    #: The fencing token: the epoch its replica owns the singleton's shard at. It grows with
    #: every change of owner: a write that checks it (``WHERE token <= :token``, under a lock)
    #: refuses an owner that lost the singleton and has not noticed yet.
    token: int
    #: The replica it runs on.
    replica: str
    #: Set when ownership moves or beat stops: return soon after (``stop.wait(seconds)`` is
    #: a sleep that ends early).
    stop: threading.Event
    logger: logging.Logger


@dataclass(frozen=True, slots=True)
class Singleton:
    """One validated singleton declaration."""

    name: str
    group: str
    run: Callable[[Context], object]
    #: Start it again (with backoff) after a failure that escaped it, while this replica
    #: still owns it; otherwise a failure is recorded and it stays stopped until ownership
    #: moves.
    restart: bool
    grace: timedelta
    #: Where it was declared (``module:function``), for errors.
    where: str


def load_singletons(app: Celery, settings: Settings) -> list[Singleton]:
    """The app's singletons. Raises ConfigurationError naming the singleton and the field at
    fault, or the coordination if it is not ``cluster`` (a singleton's owner is its shard's)."""
    raw = app.conf.get(SETTING) or {}
    if not isinstance(raw, Mapping):
        raise ConfigurationError(
            f"expected a mapping of names to singletons, got {type(raw).__name__}", field=SETTING
        )
    found = [_singleton(name, spec) for name, spec in raw.items()]
    if found and settings.coordination is not Coordination.CLUSTER:
        raise ConfigurationError(
            f"singletons ({', '.join(s.name for s in found)}) run on the owner of their shard: "
            f"they need voltro_beat_coordination = 'cluster', not {settings.coordination!r}",
            field="voltro_beat_coordination",
        )
    return found


def singleton(
    app: Celery,
    name: str,
    *,
    group: str = DEFAULT_GROUP,
    restart: bool = False,
    grace: float | timedelta = DEFAULT_GRACE,
) -> Callable[[Callable[[Context], object]], Callable[[Context], object]]:
    """Declare the decorated function as singleton ``name`` of ``app``. Raises
    ConfigurationError if ``app`` already has a singleton of that name, naming both places."""

    def declare(fn: Callable[[Context], object]) -> Callable[[Context], object]:
        declared = dict(app.conf.get(SETTING) or {})
        if name in declared:
            theirs = _singleton(name, declared[name])
            raise ConfigurationError(
                f"singleton {name!r} is declared twice: {theirs.where} and {_where(fn)}",
                entry=name,
                kind="singleton",
                field="name",
            )
        declared[name] = {"run": fn, "group": group, "restart": restart, "grace": grace}
        _singleton(name, declared[name])
        app.conf[SETTING] = declared
        return fn

    return declare


def _singleton(name: object, spec: object) -> Singleton:
    name = check_name(name)
    if not isinstance(spec, Mapping):
        raise ConfigurationError(
            f"a singleton must be a mapping, not {type(spec).__name__}",
            entry=name,
            kind="singleton",
            field=SETTING,
        )
    for key in spec:
        if key not in _KEYS:
            raise ConfigurationError(
                f"unknown key {key!r}; known keys: {', '.join(sorted(_KEYS))}",
                entry=name,
                kind="singleton",
                field=str(key),
            )
    run = _callable(name, spec.get("run"))
    group = spec.get("group", DEFAULT_GROUP)
    if not isinstance(group, str) or not group.strip():
        raise ConfigurationError(
            f"a group name (non-empty string) is required, not {group!r}",
            entry=name,
            kind="singleton",
            field="group",
        )
    restart = spec.get("restart", False)
    if not isinstance(restart, bool):
        raise ConfigurationError(
            f"restart must be True or False, not {restart!r}",
            entry=name,
            kind="singleton",
            field="restart",
        )
    return Singleton(
        name,
        group.strip(),
        run,
        restart,
        _grace(name, spec.get("grace", DEFAULT_GRACE)),
        _where(run),
    )


def _callable(name: str, run: Any) -> Callable[[Context], object]:
    if callable(run):
        return run  # type: ignore[no-any-return]
    if not isinstance(run, str) or ":" not in run:
        raise ConfigurationError(
            f"run must be a function or 'module:function', not {run!r}",
            entry=name,
            kind="singleton",
            field="run",
        )
    module, _, attr = run.partition(":")
    try:
        found = importlib.import_module(module)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"cannot import {run!r}: {type(exc).__name__}: {exc}",
            entry=name,
            kind="singleton",
            field="run",
        ) from None
    if not callable(found):
        raise ConfigurationError(
            f"{run!r} is not callable", entry=name, kind="singleton", field="run"
        )
    return found


def _grace(name: str, value: Any) -> timedelta:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        raise ConfigurationError(
            f"grace must be positive seconds or a timedelta, not {value!r}",
            entry=name,
            kind="singleton",
            field="grace",
        )
    return timedelta(seconds=seconds)


def _where(fn: Callable[..., object]) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
