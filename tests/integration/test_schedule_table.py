"""The schedules table on both dialects: validated, revisioned edits, each with a change row;
a stale edit refused; revisions that a replica can follow ("changed since N")."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from voltro_beat.config import Settings
from voltro_beat.coordination import Coordination
from voltro_beat.exceptions import ConfigurationError, EditRefused
from voltro_beat.occurrences import Occurrence
from voltro_beat.runs import Run
from voltro_beat.schedule_table import ScheduleTable
from voltro_beat.store import schedule_rows, tables
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.database import Database

REPORT = {"task": "proj.report", "schedule": "*/5 * * * *", "kwargs": {"team": "ops"}}


@pytest.fixture
def table(url: str) -> Iterator[ScheduleTable]:
    database = Database.open(url)
    database.upgrade()
    settings = Settings.resolve({"voltro_beat_store_url": url}, environ={})
    yield ScheduleTable(database, settings, code={"from-code"})
    database.dispose()


def test_each_edit_is_a_revision_with_its_change_row(table: ScheduleTable) -> None:
    added = table.add("report", REPORT, by="ana")
    assert (added.revision, added.enabled, added.group) == (1, True, "default")
    changed = table.set("report", {**REPORT, "schedule": {"every": 60}}, revision=1, by="bo")
    disabled = table.disable("report", revision=changed.revision, by="ana")
    enabled = table.enable("report", revision=disabled.revision, by="ana")
    assert [changed.revision, disabled.revision, enabled.revision] == [2, 3, 4]
    table.remove("report", revision=4, by="cy")
    history = table.history("report")
    assert [(c.revision, c.action, c.changed_by) for c in history] == [
        (1, "add", "ana"),
        (2, "set", "bo"),
        (3, "disable", "ana"),
        (4, "enable", "ana"),
        (5, "remove", "cy"),
    ]
    assert history[0].before is None and history[-1].after is None
    assert history[1].before is not None and history[1].before["definition"] == REPORT
    assert history[1].after is not None
    assert history[1].after["definition"]["schedule"] == {"every": 60}
    assert history[2].after is not None and history[2].after["enabled"] is False
    times = [c.changed_at for c in history]
    assert times == sorted(times)
    assert table.rows.all() == []


def test_an_edit_based_on_a_stale_revision_is_refused(table: ScheduleTable) -> None:
    table.add("report", REPORT, by="ana")
    table.set("report", {**REPORT, "schedule": "0 * * * *"}, revision=1, by="bo")
    with pytest.raises(EditRefused, match=r"at revision 2, not 1.*by bo"):
        table.set("report", {**REPORT, "schedule": "30 * * * *"}, revision=1, by="ana")
    with pytest.raises(EditRefused, match="exists already"):
        table.add("report", REPORT, by="cy")
    with pytest.raises(EditRefused, match="no schedule 'gone'"):
        table.disable("gone", revision=1)
    (row,) = table.rows.all()
    assert (row.revision, row.definition["schedule"]) == (2, "0 * * * *")
    assert len(table.history("report")) == 2  # nothing written by the refused edits


@pytest.mark.parametrize(
    ("definition", "field"),
    [
        ({**REPORT, "schedule": "61 * * * *"}, "schedule"),
        ({**REPORT, "schedule": {"crontab": {"minute": "99"}}}, "schedule"),
        ({**REPORT, "schedule": {"every": -5}}, "schedule"),
        ({**REPORT, "schedule": {"fortnightly": 1}}, "schedule"),
        ({**REPORT, "catch_up": "sometimes"}, "catch_up"),
        ({**REPORT, "max_lateness": 0}, "max_lateness"),
        ({**REPORT, "tz": "Mars/Olympus"}, "tz"),
        ({**REPORT, "schedul": "* * * * *"}, "schedul"),
        ({"schedule": "* * * * *"}, "task"),
    ],
)
def test_a_bad_definition_is_refused_naming_the_field_and_nothing_is_stored(
    table: ScheduleTable, definition: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        table.add("report", definition)
    assert (raised.value.entry, raised.value.field) == ("report", field)
    assert table.rows.all() == [] and table.rows.revision() == 0


def test_a_name_the_app_defines_is_refused_unless_a_rule_says_who_wins(
    table: ScheduleTable,
) -> None:
    with pytest.raises(ConfigurationError, match="voltro_beat_schedule_conflicts") as raised:
        table.add("from-code", REPORT)
    assert raised.value.field == "name"


def test_changed_since_gives_each_schedule_as_it_stands(table: ScheduleTable) -> None:
    table.add("a", REPORT)
    table.add("b", {**REPORT, "group": "night"})
    assert table.rows.changed_since(0)[0] == 2
    table.set("a", {**REPORT, "schedule": "0 0 * * *"}, revision=1)
    table.remove("b", revision=2)
    newest, changed = table.rows.changed_since(2)
    assert newest == 4
    assert set(changed) == {"a", "b"} and changed["b"] is None
    assert changed["a"] is not None and changed["a"].definition["schedule"] == "0 0 * * *"
    assert table.rows.changed_since(4) == (4, {})


def test_concurrent_edits_get_distinct_revisions_in_commit_order(table: ScheduleTable) -> None:
    errors: list[BaseException] = []

    def add(worker: int) -> None:
        try:
            for i in range(10):
                table.add(f"s{worker}-{i}", REPORT, by=f"w{worker}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    rows = table.rows.all()
    assert sorted(r.revision for r in rows) == list(range(1, 41))
    # Revisions follow the database's clock: no change is numbered before one it followed.
    by_revision = sorted(rows, key=lambda r: r.revision)
    assert [r.changed_at for r in by_revision] == sorted(r.changed_at for r in rows)


def test_durations_and_anchor_are_written_as_json(table: ScheduleTable) -> None:
    definition = {
        **REPORT,
        "schedule": {"every": 90},
        "anchor": "2026-01-01T00:00:30+00:00",
        "max_lateness": 120,
        "on_overlap": "skip",
    }
    table.add("paced", definition)
    entry = table.entry("paced", table.rows.all()[0].definition)
    assert entry.max_lateness == timedelta(seconds=120)
    assert entry.on_overlap == "skip"


@pytest.mark.parametrize("coordination", [Coordination.ADVISORY_LOCK, Coordination.SINGLE])
def test_the_store_refuses_a_run_whose_schedule_changed_before_its_instant(
    table: ScheduleTable, url: str, coordination: Coordination
) -> None:
    store = BeatStore(Database.open(url), replica="r1")
    added = table.add("report", REPORT)
    changed = table.set("report", {**REPORT, "schedule": "0 * * * *"}, revision=added.revision)
    far = changed.changed_at + timedelta(days=1)
    before = changed.changed_at - timedelta(seconds=1)

    def run(name: str, at: datetime, revision: int | None) -> Run:
        at = at.replace(microsecond=0)
        return Run(Occurrence.of(name, at), "proj.report", revision=revision)

    runs = [
        run("report", far, added.revision),  # the old definition, after the change: refused
        run("report", before, added.revision),  # the old definition, before it: recorded
        run("report", far + timedelta(hours=1), changed.revision),  # the new one: recorded
        run("from-code", far, None),  # the app's own entry: no revision, no fence
    ]
    won = store.claim(runs, coordination=coordination, lease=timedelta(seconds=30))
    assert won == {r.occurrence.key for r in runs[1:]}
    with store.database.connect() as conn:
        recorded = dict(conn.execute(sa.select(tables.runs.c.id, tables.runs.c.revision)).all())
    assert recorded == {
        runs[1].occurrence.key: added.revision,
        runs[2].occurrence.key: changed.revision,
        runs[3].occurrence.key: None,
    }
    store.close()


def test_a_claim_waits_for_an_edit_under_way_and_then_sees_it(
    table: ScheduleTable, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An edit stamps its change (changed_at) before it commits; a claim running in between
    # could not see the change and let the old definition through (chaos row 11, once in
    # three CI runs: a run of revision 1 where revision 31 was live).
    store = BeatStore(Database.open(url), replica="r1")
    added = table.add("report", REPORT)
    stamped, release = threading.Event(), threading.Event()
    upsert = schedule_rows._upsert

    def held(*args: object) -> None:
        stamped.set()  # the change row is written, its transaction still open
        release.wait(5)
        upsert(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(schedule_rows, "_upsert", held)
    edit = {**REPORT, "schedule": "0 * * * *"}
    editor = threading.Thread(target=lambda: table.set("report", edit, revision=added.revision))
    editor.start()
    assert stamped.wait(5)
    far = (added.changed_at + timedelta(days=1)).replace(microsecond=0)
    old = Run(Occurrence.of("report", far), "proj.report", revision=added.revision)
    won: list[set[str]] = []
    claimer = threading.Thread(
        target=lambda: won.append(
            store.claim([old], coordination=Coordination.ADVISORY_LOCK, lease=timedelta(seconds=30))
        )
    )
    claimer.start()
    time.sleep(0.3)  # the claim runs now, unless it waits for the edit
    release.set()
    editor.join(5)
    claimer.join(5)
    assert won == [set()]
    store.close()
