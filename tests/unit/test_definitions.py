"""A schedule written down (voltro_beat.definitions): each form of a document gives the entry
the same ``beat_schedule`` entry gives; what cannot be written down is refused, naming the
field; a document checked twice under two zones gives each zone's instants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery.schedules import crontab, solar

from voltro_beat import definitions
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.occurrences import next_after
from voltro_beat.schedules import parse_entries

LATE = timedelta(seconds=30)
AT = datetime(2026, 3, 28, 22, 0, tzinfo=UTC)


def entry_of(raw: dict[str, Any], tz: str | None = None) -> Any:
    (entry,) = parse_entries({"s": raw}, tz=tz, max_lateness=LATE)
    return entry


@pytest.mark.parametrize(
    "raw",
    [
        {"task": "t", "schedule": "*/5 * * * *"},
        {"task": "t", "schedule": timedelta(seconds=90), "anchor": AT + timedelta(seconds=7)},
        {"task": "t", "schedule": crontab(minute="30", hour="2", day_of_week="sun")},
        {"task": "t", "schedule": solar("sunset", 52.37, 4.9)},
        {"task": "t", "schedule": AT + timedelta(days=3)},
        {
            "task": "t",
            "schedule": 45,
            "args": (1, 2),
            "kwargs": {"a": 1},
            "catch_up": "all",
            "max_lateness": timedelta(minutes=2),
            "on_overlap": "skip",
            "tz": "Europe/Berlin",
        },
    ],
    ids=["cron", "interval", "crontab", "solar", "one-off", "keys"],
)
def test_written_down_and_read_back_it_is_the_same_entry(raw: dict[str, Any]) -> None:
    doc = definitions.from_entry("s", raw)
    checked = definitions.check("s", doc, tz="Europe/Berlin", max_lateness=LATE)
    assert checked == entry_of(raw, "Europe/Berlin")
    assert next_after(checked.spec, AT) == next_after(entry_of(raw, "Europe/Berlin").spec, AT)


def test_one_document_under_two_zones_gives_each_zones_instants() -> None:
    doc = {"task": "t", "schedule": {"crontab": {"minute": "0", "hour": "9"}}}
    berlin = definitions.check("a", doc, tz="Europe/Berlin", max_lateness=LATE)
    york = definitions.check("b", doc, tz="America/New_York", max_lateness=LATE)
    assert next_after(berlin.spec, AT) != next_after(york.spec, AT)
    again = definitions.check("c", doc, tz="Europe/Berlin", max_lateness=LATE)
    assert again.spec == berlin.spec


@pytest.mark.parametrize(
    ("schedule", "field"),
    [
        ({"fortnightly": 1}, "schedule"),
        ({"every": "often"}, "schedule"),
        ({"every": True}, "schedule"),
        ({"crontab": {"minit": "1"}}, "schedule"),
        ({"solar": "sunset"}, "schedule"),
        ({"at": "tomorrow"}, "schedule"),
        ({"at": "2026-01-01T00:00:00"}, "schedule"),  # naive
    ],
)
def test_a_schedule_that_is_not_one_of_the_forms_names_the_field(schedule: Any, field: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        definitions.check("s", {"task": "t", "schedule": schedule}, tz=None, max_lateness=LATE)
    assert (raised.value.entry, raised.value.field) == ("s", field)


def test_arguments_that_are_not_json_and_classes_of_ones_own_are_refused() -> None:
    with pytest.raises(ConfigurationError) as raised:
        definitions.check(
            "s",
            {"task": "t", "schedule": "* * * * *", "kwargs": {"at": AT}},
            tz=None,
            max_lateness=LATE,
        )
    assert raised.value.field == "kwargs"

    class Mine(crontab):
        def is_due(self, last_run_at: datetime) -> Any:
            return super().is_due(last_run_at)

    with pytest.raises(ConfigurationError) as raised:
        definitions.from_entry("s", {"task": "t", "schedule": Mine(minute="1")})
    assert raised.value.field == "schedule"


def test_python_export_reads_back_as_the_same_entry() -> None:
    doc = {
        "task": "t",
        "schedule": {"every": 90},
        "max_lateness": 120,
        "anchor": "2026-01-01T00:00:30+00:00",
    }
    other = {"task": "t", "schedule": {"crontab": {"minute": "*/15", "hour": "9-17"}}}
    namespace: dict[str, Any] = {}
    exec(
        "from datetime import datetime, timedelta\nfrom celery.schedules import crontab, solar\n"
        f"entry = {definitions.python_entry(doc)}",
        namespace,
    )
    assert entry_of(namespace["entry"]) == definitions.check("s", doc, tz=None, max_lateness=LATE)
    exec(f"entry = {definitions.python_entry(other)}", namespace)
    assert entry_of(namespace["entry"]) == definitions.check("s", other, tz=None, max_lateness=LATE)
