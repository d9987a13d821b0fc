"""A pytest plugin for testing an app's ``beat_schedule`` in its own test suite: no broker, no
database server, no Docker.

Opt in with ``-p voltro_beat.testing`` (or ``pytest_plugins = ["voltro_beat.testing"]`` in a
``conftest.py``); it only adds fixtures. Name the app with the ``voltro_beat_app`` ini option
(``proj.celery:app``, what ``celery -A`` takes) or override the :func:`voltro_app` fixture.

* :func:`voltro_occurrences`: the next occurrences of a named entry, as
  ``voltro-beat preview`` computes them (the same maths beat fires by).
* :func:`voltro_tick`: beat's own scheduler, in this process, on a temporary SQLite store and
  a clock the test sets: each call is one tick at the instant given, and returns the messages
  that tick would have sent to the broker (a recording publisher stands in for it).

See docs/testing.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from voltro_beat.beat_schedule import load_schedule
from voltro_beat.config import Settings
from voltro_beat.exceptions import ConfigurationError, NaiveDatetimeError
from voltro_beat.messages import arguments
from voltro_beat.occurrences import Occurrence, next_after
from voltro_beat.on_demand import load_app
from voltro_beat.publisher import Publisher
from voltro_beat.scheduler import VoltroScheduler
from voltro_beat.schedules import Entry

#: The ini option naming the app.
APP_OPTION = "voltro_beat_app"
#: Settings a test's beat must not take from the app or the environment (explicit values
#: outrank both): no server on a port, no file outside the test's directory, the process's
#: logging left alone.
_NO_SIDE_EFFECTS = {"metrics_port": None, "health_file": None, "log_json": False}


@dataclass(frozen=True, slots=True)
class Published:
    """One message beat would have sent: the occurrence, and the task call it carries."""

    schedule: str
    task: str
    #: ``name@YYYY-MM-DDTHH:MM:SS`` (UTC), the run row's id and the message's
    #: ``voltro_occurrence`` header.
    key: str
    #: The deterministic task id, ``uuid5`` of the key.
    task_id: str
    #: The occurrence's instant (UTC).
    scheduled_at: datetime
    args: list[Any]
    kwargs: dict[str, Any]
    #: The entry's ``options`` (queue, priority, ...), as given.
    options: Mapping[str, Any]


class _RecordingPublisher(Publisher):
    """A publisher that keeps each message instead of writing it to a broker."""

    def __init__(self, app: Celery, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.sent: list[Published] = []

    def publish(self, messages: Sequence[tuple[Entry, str, str]]) -> dict[int, str]:
        for entry, key, task_id in messages:
            args, kwargs = arguments(entry)
            self.sent.append(
                Published(
                    entry.name,
                    entry.task,
                    key,
                    task_id,
                    _instant_of(key),
                    args,
                    kwargs,
                    entry.options,
                )
            )
        return {}  # the broker took every message

    def prepare(self, entries: Sequence[Entry]) -> None:
        """Nothing to build: no broker."""


class _RecordingScheduler(VoltroScheduler):
    """Beat's scheduler on a clock the test sets, publishing into a :class:`_RecordingPublisher`."""

    publisher_class = _RecordingPublisher
    #: The test's beat stops at its last tick: what it claimed ahead of a later instant is
    #: not sent (a real beat waits up to CLOSE_WAIT for it).
    close_wait = timedelta(0)

    def tick_at(self, at: datetime) -> list[Published]:
        """One tick with the scheduler's clock (and the SQLite store's) reading ``at``;
        the messages it sent. The first tick boots beat at ``at``."""
        if at.utcoffset() is None:
            raise NaiveDatetimeError(f"tick at {at.isoformat()}: give the instant a timezone")
        self._store.database.clock = lambda: at
        recorder = self._engine.publisher
        assert isinstance(recorder, _RecordingPublisher)
        before = len(recorder.sent)
        # Not tick(): it logs and swallows every error, which a test wants to see.
        self._engine.attempt()
        return recorder.sent[before:]


def _instant_of(key: str) -> datetime:
    """The UTC instant in an occurrence key (names never contain ``@``)."""
    return datetime.fromisoformat(key.partition("@")[2]).replace(tzinfo=UTC)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(APP_OPTION, "The Celery app whose beat_schedule voltro_beat's fixtures read")


@pytest.fixture
def voltro_app(pytestconfig: pytest.Config) -> Celery:
    """The app under test: the ``voltro_beat_app`` ini option (``proj.celery:app``).

    Override this fixture to build the app another way.
    """
    name = pytestconfig.getini(APP_OPTION)
    if not name:
        raise pytest.UsageError(
            f"voltro_beat.testing: set the {APP_OPTION} ini option (proj.celery:app) or "
            "override the voltro_app fixture"
        )
    try:
        return load_app(str(name))
    except ConfigurationError as exc:
        raise pytest.UsageError(f"voltro_beat.testing: {exc}") from None


@pytest.fixture
def voltro_occurrences(voltro_app: Celery) -> Callable[..., list[Occurrence]]:
    """``voltro_occurrences(name, n=10, after=now)``: the next ``n`` occurrences of the app's
    entry ``name`` strictly after ``after`` (aware), as beat computes them, with their keys
    and task ids (``Occurrence``; ``scheduled_at`` is UTC)."""

    def occurrences(name: str, n: int = 10, *, after: datetime | None = None) -> list[Occurrence]:
        entries = load_schedule(voltro_app, Settings.resolve(voltro_app.conf)).entries
        entry = _named(entries, name)
        at: datetime | None = datetime.now(UTC) if after is None else after
        found: list[Occurrence] = []
        while len(found) < n and at is not None:
            at = next_after(entry.spec, at)
            if at is not None:
                found.append(Occurrence.of(entry.name, at))
        return found

    return occurrences


@pytest.fixture
def voltro_tick(
    voltro_app: Celery, tmp_path: Path
) -> Iterator[Callable[[datetime], list[Published]]]:
    """``voltro_tick(at)``: one tick of beat at the aware instant ``at``; returns what it
    would have published.

    The app's own settings and schedule, with the store a fresh SQLite file under the test's
    ``tmp_path`` (and no metrics server, health file or JSON logging). The first call boots
    beat at ``at``: as on a real first boot, nothing at or before it fires, so tick once
    before the instant under test. Later calls move the clock on (or leave it).
    """
    overrides = {
        "store_url": f"sqlite:///{tmp_path / 'voltro-beat.sqlite3'}",
        "migrate": True,
        **_NO_SIDE_EFFECTS,
    }
    scheduler: _RecordingScheduler | None = None

    def tick(at: datetime) -> list[Published]:
        nonlocal scheduler
        if scheduler is None:
            scheduler = _RecordingScheduler(voltro_app, overrides=overrides)
        return scheduler.tick_at(at)

    yield tick
    if scheduler is not None:
        scheduler.close()


def _named(entries: Mapping[str, Entry], name: str) -> Entry:
    if name not in entries:
        known = ", ".join(sorted(entries)) or "none"
        raise LookupError(f"no beat_schedule entry {name!r} (beat runs: {known})")
    return entries[name]
