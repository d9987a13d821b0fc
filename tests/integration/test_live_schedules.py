"""Schedules of the table, applied live by every replica: an edit takes effect from the first
occurrence of the new definition after its commit (on the database's clock); enabling fires
no catch-up for the time a schedule was disabled; each replica reports the revision applied."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from beat_kit import drain, rows, sec, tick

from voltro_beat.config import Settings
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.schedule_table import ScheduleTable
from voltro_beat.scheduler import VoltroScheduler
from voltro_beat.store.database import Database

EVERY_SECOND = {"task": "proj.work", "schedule": "* * * * * *"}
#: The app's own entry: fires every hour, out of the way of the table's.
HOURLY = {"hourly": {"task": "proj.hourly", "schedule": "0 * * * *"}}


@pytest.fixture
def edit(store_url: str) -> Iterator[Callable[[datetime], ScheduleTable]]:
    """``edit(at)``: the schedules table, its edits committed at ``at`` (SQLite's clock)."""
    now = [sec(0)]
    database = Database.open(store_url, clock=lambda: now[0])
    database.upgrade()
    table = ScheduleTable(database, Settings.resolve({}, environ={}), code=HOURLY)

    def at(when: datetime) -> ScheduleTable:
        now[0] = when
        return table

    yield at
    database.dispose()


def run(replicas: list[VoltroScheduler], start: float, end: float) -> None:
    """Tick every replica at each half second from ``start`` to ``end``."""
    n = start
    while n <= end:
        for r in replicas:
            tick(r, sec(n))
        n += 0.5


def fired(store_url: str, name: str = "live") -> list[str]:
    return sorted(k for k, r in rows(store_url).items() if r.schedule == name)


def seconds(keys: list[str]) -> list[int]:
    return [int(k[-2:]) for k in keys]


def test_edits_apply_from_their_commit_on_every_replica(
    replicas: Any, store_url: str, edit: Callable[[datetime], ScheduleTable]
) -> None:
    r1, r2 = replicas("r1", schedule=HOURLY), replicas("r2", schedule=HOURLY)
    run([r1, r2], 0, 1)
    added = edit(sec(1.2)).add("live", EVERY_SECOND, by="ana")
    run([r1, r2], 1.5, 4)
    assert seconds(fired(store_url)) == [2, 3, 4]  # from the first instant after the add
    every_3 = edit(sec(4.2)).set(
        "live", {**EVERY_SECOND, "schedule": "*/3 * * * * *"}, revision=added.revision
    )
    run([r1, r2], 4.5, 9)
    assert seconds(fired(store_url)) == [2, 3, 4, 6, 9]
    off = edit(sec(9.2)).disable("live", revision=every_3.revision)
    run([r1, r2], 9.5, 16)
    on = edit(sec(16.2)).enable("live", revision=off.revision)
    run([r1, r2], 16.5, 19)
    # No catch-up for 12 and 15, when it was disabled: the next instant after the enable.
    assert seconds(fired(store_url)) == [2, 3, 4, 6, 9, 18]
    edit(sec(19.2)).remove("live", revision=on.revision)
    run([r1, r2], 19.5, 25)
    assert seconds(fired(store_url)) == [2, 3, 4, 6, 9, 18]
    published = [h["voltro_occurrence"] for h in drain(r1.app)]
    assert sorted(k for k in published if k.startswith("live@")) == fired(store_url)
    engine = sa.create_engine(store_url)
    with engine.connect() as conn:
        found = conn.execute(sa.text("SELECT name, schedules_revision FROM _voltro_beat_replicas"))
        applied = {name: revision for name, revision in found}
    engine.dispose()
    assert applied == {"r1": 5, "r2": 5}


def test_a_replica_that_boots_after_an_enable_catches_up_nothing_of_the_disabled_time(
    replicas: Any, store_url: str, edit: Callable[[datetime], ScheduleTable]
) -> None:
    r1 = replicas("r1", schedule=HOURLY)
    run([r1], 0, 1)
    added = edit(sec(1.2)).add("live", {**EVERY_SECOND, "catch_up": "all"})
    run([r1], 1.5, 3)
    r1.close()
    off = edit(sec(3.2)).disable("live", revision=added.revision)
    edit(sec(8.2)).enable("live", revision=off.revision)
    r2 = replicas("r2", schedule=HOURLY)
    run([r2], 10, 11)
    # 4..8 fell while it was disabled (no rows); 9 and 10 are after the enable: caught up.
    assert seconds(fired(store_url)) == [2, 3, 9, 10, 11]


def test_a_schedule_both_the_app_and_the_table_define_stops_beat_at_boot(
    replicas: Any, store_url: str, edit: Callable[[datetime], ScheduleTable]
) -> None:
    table = edit(sec(0))
    table.code = frozenset()  # written around the API's check, as raw SQL would
    table.add("hourly", EVERY_SECOND)
    with pytest.raises(ConfigurationError, match="voltro_beat_schedule_conflicts") as raised:
        replicas("r1", schedule=HOURLY).setup_schedule()
    assert (raised.value.entry, raised.value.field) == ("hourly", "name")
    r2 = replicas("r2", schedule=HOURLY, voltro_beat_schedule_conflicts="table")
    r2.setup_schedule()
    run([r2], 0, 2)
    assert seconds(fired(store_url, "hourly")) == [1, 2]  # the table's every-second wins


def test_a_row_that_does_not_check_is_logged_and_does_not_fire(
    replicas: Any,
    store_url: str,
    edit: Callable[[datetime], ScheduleTable],
    caplog: pytest.LogCaptureFixture,
) -> None:
    r1 = replicas("r1", schedule=HOURLY)
    run([r1], 0, 1)
    table = edit(sec(1.2))
    table.rows.write(
        "broken",
        "add",
        expected=None,
        after={
            "group": "default",
            "definition": {"task": "t", "schedule": "61 * * * *"},
            "enabled": True,
        },
        by="raw sql",
    )
    run([r1], 1.5, 3)
    assert fired(store_url, "broken") == []
    assert "row broken (revision 1) does not check" in caplog.text


def test_a_replica_behind_on_the_table_cannot_fire_the_old_definition_after_the_change(
    replicas: Any,
    store_url: str,
    edit: Callable[[datetime], ScheduleTable],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r1, r2 = replicas("r1", schedule=HOURLY), replicas("r2", schedule=HOURLY)
    run([r1, r2], 0, 1)
    added = edit(sec(1.2)).add("live", EVERY_SECOND)
    run([r1, r2], 1.5, 4)
    # r2 stops reading the table (a slow poll, a pause): it still has every second.
    monkeypatch.setattr(r2._engine.live, "changes", lambda: (r2._engine.live.applied, []))
    edit(sec(4.2)).set(
        "live", {**EVERY_SECOND, "schedule": "*/3 * * * * *"}, revision=added.revision
    )
    run([r2], 4.5, 9)
    run([r1], 9.5, 10.5)
    # r2's claims of 5, 7 and 8 (and its 6 and 9) were refused: the change came before them.
    # r1 fired 6 and 9 of the new definition, late.
    assert seconds(fired(store_url)) == [2, 3, 4, 6, 9]
    revisions = {k: r.revision for k, r in rows(store_url).items() if r.schedule == "live"}
    assert sorted(revisions.values()) == [1, 1, 1, 2, 2]
    assert {r.replica for k, r in rows(store_url).items() if k.endswith((":06", ":09"))} == {"r1"}


def test_a_step_late_past_a_change_still_claims_the_old_definitions_instants_before_it(
    replicas: Any, store_url: str, edit: Callable[[datetime], ScheduleTable]
) -> None:
    r1 = replicas("r1", schedule=HOURLY)
    run([r1], 0, 1)
    added = edit(sec(1.2)).add("live", EVERY_SECOND)
    run([r1], 1.5, 3)
    # r1 misses its steps (a pause); meanwhile the schedule changes at 5.5.
    edit(sec(5.5)).set(
        "live", {**EVERY_SECOND, "schedule": "*/10 * * * * *"}, revision=added.revision
    )
    run([r1], 6, 11)
    # 4 and 5 fell before the change: claimed (late) by the step that also reads the change;
    # 6 to 9 are the old definition's after it (none); 10 the new one's.
    assert seconds(fired(store_url)) == [2, 3, 4, 5, 10]


def test_a_schedule_added_to_a_shard_held_fires_in_cluster_coordination(
    replicas: Any, store_url: str, edit: Callable[[datetime], ScheduleTable]
) -> None:
    # A schedule added to the table in cluster coordination is claimed with its shard's epoch
    # by the replica that holds the shard, from its first instant after the add; its claims
    # carried none until the shards held changed, and the store refused each one.
    cluster = {"voltro_beat_coordination": "cluster", "voltro_beat_shards": 1}
    r1 = replicas("r1", schedule=HOURLY, **cluster)
    run([r1], 0, 1)
    edit(sec(1.2)).add("live", EVERY_SECOND, by="ana")
    run([r1], 1.5, 4)
    assert seconds(fired(store_url)) == [2, 3, 4]


def test_an_edit_before_the_schedule_s_template_is_built_sends_the_new_definition(
    replicas: Any,
    store_url: str,
    edit: Callable[[datetime], ScheduleTable],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The templates are built after boot, soonest first, one a step here. 'live' changes
    # while its template waits: the one built must be its new definition's, not the
    # definition it booted with (kept under its name, that one sent the old arguments).
    from voltro_beat.engine import upkeep

    monkeypatch.setattr(upkeep, "PREPARE_SLICE", 0.0)
    table = edit(sec(0))
    table.add("ahead", EVERY_SECOND, by="ana")
    added = table.add("live", {**EVERY_SECOND, "schedule": "*/5 * * * * *", "args": [1]}, by="ana")
    r1 = replicas("r1", schedule=HOURLY)
    tick(r1, sec(0.5))  # boot: the template of 'ahead' (due first)
    assert sorted(r1._engine.publisher.templates.prepared) == ["ahead"]
    edit(sec(0.6)).set(
        "live", {**EVERY_SECOND, "schedule": "*/5 * * * * *", "args": [2]}, revision=added.revision
    )
    run([r1], 1, 5.5)
    sent = [h["argsrepr"] for h in drain(r1.app) if h["voltro_occurrence"].startswith("live@")]
    assert sent == ["[2]"]
