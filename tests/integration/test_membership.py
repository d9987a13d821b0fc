"""The replica registry at work: rolling deploys, renames, settings, unknown schedules, and
the database clock (issue 9, holes 4, 6 and 8).

Replicas are schedulers in this process (beat_kit.py) on one SQLite store with a driven
clock, or on PostgreSQL where the database's own clock matters.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from beat_kit import drain, recover, rows, sec, tick

from voltro_beat.store.database import Database
from voltro_beat.store.registry import Registry
from voltro_beat.store.sqlite import SQLite


def every_second(**extra: Any) -> dict[str, Any]:
    return {"task": "proj.work", "schedule": 1.0, **extra}


def test_a_changed_definition_fires_on_the_newest_replica_only(
    replicas: Any, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    old = replicas("old", schedule={"s": every_second(args=[1]), "t": every_second()})
    new = replicas("new", schedule={"s": every_second(args=[2]), "t": every_second()})
    tick(old, sec(0))
    tick(new, sec(0.1))  # started later: its definition of s wins
    with caplog.at_level(logging.WARNING, logger="voltro_beat"):
        for n in range(1, 6):
            tick(old, sec(n + 0.2))
            tick(new, sec(n + 0.3))
    assert any(
        "schedule s changed on the newer replica new" in r.getMessage() for r in caplog.records
    )
    runs = rows(store_url)
    assert {runs[f"s@2026-01-01T10:00:0{n}"].replica for n in range(1, 6)} == {"new"}
    assert {runs[f"t@2026-01-01T10:00:0{n}"].replica for n in range(1, 6)} >= {"old"}
    sent = drain(old.app)
    assert all("2" in h["argsrepr"] for h in sent if h["periodic_task_name"] == "s")
    # The newer replica stops: the older one fires s again, on its own definition.
    new._store.database.clock = lambda: sec(6)
    new.close()
    for n in range(7, 12):
        tick(old, sec(n + 0.2))
    assert rows(store_url)["s@2026-01-01T10:00:10"].replica == "old"


def test_a_schedule_the_newer_replica_lacks_keeps_firing(replicas: Any, store_url: str) -> None:
    old = replicas("old", schedule={"s": every_second(), "gone": every_second()})
    new = replicas("new", schedule={"s": every_second()})
    tick(old, sec(0))
    tick(new, sec(0.1))
    for n in range(1, 4):
        tick(old, sec(n + 0.2))
        tick(new, sec(n + 0.3))
    assert rows(store_url)["gone@2026-01-01T10:00:03"].status == "published"


def test_a_rename_in_flight_is_reported(replicas: Any, caplog: pytest.LogCaptureFixture) -> None:
    old = replicas("old", schedule={"report": every_second()})
    new = replicas("new", schedule={"daily-report": every_second()})
    tick(old, sec(0))
    with caplog.at_level(logging.WARNING, logger="voltro_beat"):
        tick(new, sec(0.1))
    said = [r.getMessage() for r in caplog.records]
    assert any("daily-report (on new) and report (on old) have one definition" in m for m in said)


def test_disagreeing_settings_are_reported(replicas: Any, caplog: pytest.LogCaptureFixture) -> None:
    one = replicas("one")
    two = replicas("two", voltro_beat_publish_timeout=20)
    tick(one, sec(0))
    with caplog.at_level(logging.WARNING, logger="voltro_beat"):
        tick(two, sec(0.1))
    said = [r.getMessage() for r in caplog.records]
    assert any("publish_timeout is 20.0 here and 10.0 on replica one" in m for m in said)


def test_a_run_of_a_schedule_nobody_runs_is_recorded_missed_after_its_deadline(
    replicas: Any, store_url: str
) -> None:
    """Issue 9, hole 6: a claimed run of a removed schedule was re-leased forever."""
    gone = replicas(
        "gone", broker="redis://127.0.0.1:1/0", schedule={"old": every_second(max_lateness=5)}
    )
    tick(gone, sec(0))
    tick(gone, sec(1))  # claims old@1, cannot publish it (no broker), then is stopped
    gone.close()
    up = replicas("up", schedule={"new": every_second()})
    tick(up, sec(2))
    recover(up, sec(14))  # lease (1.25 x 10 s from the instant) over, deadline (6 s) passed
    run = rows(store_url)["old@2026-01-01T10:00:01"]
    assert (run.status, run.reason) == ("missed", "unknown_schedule")


def test_the_registry_lists_the_live_replicas(replicas: Any, store_url: str) -> None:
    one, two = replicas("one"), replicas("two")
    tick(one, sec(0))
    tick(two, sec(0.1))
    registry = Registry(Database.open(store_url))
    assert [r.name for r in registry.everyone()] == ["two", "one"]
    two.close()
    assert [r.name for r in registry.everyone()] == ["one"]


# -- on PostgreSQL: the database's clock --------------------------------------------------------


@pytest.fixture
def pg_replicas(pg_url: str, replicas: Any) -> Any:
    """Replicas on PostgreSQL; the tables go with the module's database (``pg_url``)."""
    made: list[Any] = []

    def make(name: str, **conf: Any) -> Any:
        made.append(replicas(name, voltro_beat_store_url=pg_url, **conf))
        return made[-1]

    yield make
    for scheduler in made:
        scheduler.close()


def fast_by(seconds: float) -> Any:
    return lambda: datetime.now(UTC) + timedelta(seconds=seconds)


def test_a_fast_replica_decides_on_the_database_clock(
    pg_replicas: Any, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 9, hole 4: a replica 30 s fast booted with history; its catch-up must not record
    occurrences that have not happened yet, and it must say that its clock is off."""
    first = pg_replicas("first", beat_schedule={"s": every_second()})
    first.tick()  # boots: s has history from now on
    first.close()
    fast = pg_replicas("fast", beat_schedule={"s": every_second()})
    fast._clock.local = fast_by(30)
    with caplog.at_level(logging.WARNING, logger="voltro_beat"):
        fast.tick()
    offsets = [
        float(found.group(1))
        for r in caplog.records
        if (found := re.search(r"clock is ([+-][0-9.]+) s from the database", r.getMessage()))
    ]
    assert len(offsets) == 1 and abs(offsets[0] - 30) < 1, offsets
    offset = fast._clock.offset
    assert offset is not None and abs(offset.total_seconds() - 30) < 1
    assert abs(fast._clock.now() - datetime.now(UTC)) < timedelta(seconds=1)
    later = datetime.now(UTC) + timedelta(seconds=2)
    premature = [k for k, r in rows(postgres_url).items() if r.scheduled_at > later]
    assert premature == []
    (me,) = [r for r in Registry(Database.open(postgres_url)).everyone() if r.name == "fast"]
    assert me.clock_offset is not None and abs(me.clock_offset - 30) < 1


def test_a_replica_adopts_the_clock_of_the_oldest_live_replica(
    pg_replicas: Any, caplog: pytest.LogCaptureFixture
) -> None:
    first = pg_replicas("first")
    first.tick()
    later = pg_replicas("later", voltro_beat_clock="local")
    with caplog.at_level(logging.WARNING, logger="voltro_beat"):
        later.tick()
    assert later._clock.mode == "database"
    assert any("adopting 'database'" in r.getMessage() for r in caplog.records)


def test_voltro_beat_replicas_lists_the_registry(replicas: Any, store_url: str) -> None:
    from click.testing import CliRunner

    from voltro_beat.cli import main

    one = replicas("one")
    one.tick()  # the real clock: "live" is judged against it
    result = CliRunner().invoke(main, ["replicas", "--store", store_url])
    assert result.exit_code == 0, result.output
    assert "one" in result.output and "yes" in result.output and "local" in result.output


def test_a_skewed_reading_never_publishes_before_the_instant_on_the_database_clock(
    pg_replicas: Any, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18, finding 7: a reading whose request was slow and whose answer was fast puts
    a replica's "now" ahead of the database by up to half the round trip. Before, the write
    waited for that "now" only, and went out up to that much before the instant on the
    database's own clock; now it waits for the earliest the database's clock can read by the
    fence's own reading of it. Here the replica's clock is 300 ms ahead (and stays so)."""
    s = pg_replicas("skewed", beat_schedule={"s": every_second()})
    s.tick()  # boots: reads the database's clock
    value, _, received = s._store.database.read_clock()
    s._clock._base = (value + timedelta(milliseconds=300), received)
    s._clock.error = timedelta(0)
    monkeypatch.setattr(s._clock, "observe", lambda *args: True)  # no reading corrects it
    database = Database.open(pg_url)
    early: list[tuple[str, float]] = []
    publish = s._engine.publisher.publish

    def spied(messages: Any) -> Any:
        clock = database.time()
        for _, key, _ in messages:
            instant = datetime.fromisoformat(key.partition("@")[2]).replace(tzinfo=UTC)
            if clock < instant:
                early.append((key, (instant - clock).total_seconds()))
        return publish(messages)

    monkeypatch.setattr(s._engine.publisher, "publish", spied)
    sent_before = len(drain(s.app))
    deadline = datetime.now(UTC) + timedelta(seconds=3.2)
    while datetime.now(UTC) < deadline:
        time.sleep(min(max(s.tick(), 0.0), 0.05))
    assert len(drain(s.app)) + sent_before >= 2  # the schedule did fire meanwhile
    assert early == []
    database.dispose()


def test_occurrences_yielded_to_a_newest_replica_that_died_are_never_left_without_a_row(
    replicas: Any, store_url: str
) -> None:
    """Issue 18, finding 6: the newest replica of a changed schedule is killed (no close:
    the registry counts it live until its entry expires). Before, the older replica dropped
    the occurrences it had yielded meanwhile, with no row at all; now each is recorded missed
    (reason yielded) through the gate, and once the registry lets the newest go the older
    replica fires the schedule again."""
    old = replicas("old", schedule={"s": every_second(args=[1])})
    new = replicas("new", schedule={"s": every_second(args=[2])})
    tick(old, sec(0))
    tick(new, sec(0.1))
    for n in range(1, 4):
        tick(old, sec(n + 0.2))
        tick(new, sec(n + 0.3))
    # new is killed here: it never ticks again, and never leaves the registry.
    for n in range(4, 60):
        tick(old, sec(n + 0.2))
    runs = rows(store_url)
    keys = [f"s@{sec(n):%Y-%m-%dT%H:%M:%S}" for n in range(1, 45)]
    assert [k for k in keys if k not in runs] == []
    outcomes = {(runs[k].replica, runs[k].status, runs[k].reason) for k in keys}
    assert ("old", "missed", "yielded") in outcomes
    assert runs[keys[-1]].replica == "old" and runs[keys[-1]].status == "published"


def test_a_heartbeat_judges_who_is_live_as_of_itself(
    replicas: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the simulation (cluster seed 1067): on SQLite the heartbeat's update and its
    read of the live replicas are two statements, and the read judged liveness at a clock
    reading taken after the first: a pause in between (here 30 s) left even the replica
    itself out, and in cluster coordination it then took every free shard and caught up on
    them as if nobody had run. Fails without the fix (an empty list)."""
    one, two = replicas("one"), replicas("two")
    tick(one, sec(0))
    tick(two, sec(0.1))
    registry = Registry(Database.open(store_url))
    registry.database.clock = lambda: sec(0.5)
    readings = iter([sec(0.5)])  # the heartbeat's; every later reading comes after the pause
    monkeypatch.setattr(SQLite, "now", lambda self: next(readings, sec(30.5)))
    answer = registry.heartbeat("one", None, timedelta(seconds=10))
    assert answer is not None
    assert [r.name for r in answer[1]] == ["one", "two"]


def test_the_map_of_a_replica_with_the_same_definitions_is_not_read(
    replicas: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a million schedules each replica's definition map is 48 MB of JSON, and reading and
    walking the others' at each change of the live replicas took seconds: a replica whose
    digest is this one's runs the same definitions, so its map is this one's. One that
    differs is read, once."""
    schedule = {"s": every_second(), "t": every_second()}
    a = replicas("a", schedule=schedule)
    b = replicas("b", schedule=schedule)
    c = replicas("c", schedule={"s": every_second(args=[2])})
    read: list[list[str]] = []
    registry = a._engine.membership.registry
    schedules = registry.schedules

    def reading(names: list[str]) -> Any:
        read.append(sorted(names))
        return schedules(names)

    monkeypatch.setattr(registry, "schedules", reading)
    for n, replica in enumerate([a, b, c, a, b, a]):
        tick(replica, sec(n / 10))
    tick(a, sec(1.5))
    assert read == [["c"]]
    runners = a._engine.membership.runners
    assert "t" in runners.known and "s" in runners.known and "u" not in runners.known
