"""Retention policies: who registered decides (app > plugin > framework), in every order of
registration; disagreements and armed policies said in exact boot lines; the sweep's slots."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from voltro_beat import register_retention, retention
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.retention import Policy, Registration, announce, resolve, slot, slot_key, span
from voltro_beat.schedules import parse_entries

CLAIMS = "_voltro_schedule_claims"
RUNS = "_voltro_schedule_runs"
FRAMEWORK = Registration(CLAIMS, "claimed_at", timedelta(hours=24), "framework")
PLUGIN = Registration(CLAIMS, "claimed_at", timedelta(hours=6), "plugin")
APP = Registration(CLAIMS, "claimed_at", timedelta(hours=1), "app")
OPERATIONS = Path(__file__).parents[2] / "docs" / "operations.md"
PRECEDENCE = "An app registration wins over a plugin's, and a plugin's over a framework default."


@pytest.mark.parametrize("order", list(itertools.permutations([FRAMEWORK, PLUGIN, APP])))
def test_the_app_wins_in_every_order(order: tuple[Registration, ...]) -> None:
    [policy] = resolve(order)
    assert policy.kept == APP
    assert policy.conflict() == (
        f"! {CLAIMS}: three registrations — kept the app's 1h, dropped the plugin's 6h and "
        f"the framework's 24h. {PRECEDENCE}"
    )


@pytest.mark.parametrize("order", [(FRAMEWORK, PLUGIN), (PLUGIN, FRAMEWORK)])
def test_a_plugin_wins_over_the_framework(order: tuple[Registration, ...]) -> None:
    [policy] = resolve(order)
    assert policy.kept == PLUGIN
    assert policy.dropped == (FRAMEWORK,)


@pytest.mark.parametrize("order", [(FRAMEWORK, APP), (APP, FRAMEWORK)])
def test_app_after_or_before_the_framework(order: tuple[Registration, ...]) -> None:
    [policy] = resolve(order)
    assert policy.conflict() == (
        f"! {CLAIMS}: two registrations — kept the app's 1h, dropped the framework's 24h. "
        f"{PRECEDENCE}"
    )


def test_who_registered_wins_not_the_narrower_bound() -> None:
    wide = Registration(RUNS, "scheduled_at", timedelta(days=90), "app")
    narrow = Registration(RUNS, "scheduled_at", timedelta(days=30), "framework")
    assert [p.kept for p in resolve([narrow, wide])] == [wide]
    assert [p.kept for p in resolve([wide, narrow])] == [wide]


def test_agreeing_registrations_are_no_conflict() -> None:
    same = Registration(CLAIMS, "claimed_at", timedelta(hours=24), "app")
    [policy] = resolve([FRAMEWORK, same])
    assert policy.kept == same
    assert policy.conflict() is None


def test_another_column_is_a_disagreement_and_is_named() -> None:
    other = Registration(CLAIMS, "scheduled_at", timedelta(hours=24), "app")
    [policy] = resolve([FRAMEWORK, other])
    assert policy.conflict() == (
        f"! {CLAIMS}: two registrations — kept the app's 24h by scheduled_at, dropped the "
        f"framework's 24h by claimed_at. {PRECEDENCE}"
    )


def test_within_one_source_the_later_registration_wins() -> None:
    first = Registration(CLAIMS, "claimed_at", timedelta(hours=2), "app")
    [policy] = resolve([first, APP])
    assert policy.kept == APP
    assert policy.conflict() == (
        f"! {CLAIMS}: two registrations — kept the app's 1h, dropped the app's 2h. "
        "A later registration from one source replaces an earlier one."
    )


def test_the_boot_lines_docs_operations_shows_are_these() -> None:
    runs = Registration(RUNS, "scheduled_at", timedelta(days=30), "framework")
    shown = re.search(r"^```\n(retention: .*?)^```", OPERATIONS.read_text(), flags=re.S | re.M)
    assert shown, f"{OPERATIONS} shows no retention boot lines"
    assert shown[1].splitlines() == [line for _, line in announce(resolve([FRAMEWORK, runs, APP]))]


def test_boot_lines() -> None:
    runs = Registration(RUNS, "scheduled_at", timedelta(days=30), "framework")
    assert announce(resolve([FRAMEWORK, runs, APP])) == [
        (False, "retention: 2 policy(ies) armed"),
        (False, f"  {CLAIMS}: 1h by claimed_at (app)"),
        (
            True,
            f"! {CLAIMS}: two registrations — kept the app's 1h, dropped the framework's 24h. "
            f"{PRECEDENCE}",
        ),
        (False, f"  {RUNS}: 30d by scheduled_at (framework)"),
    ]


@pytest.mark.parametrize(
    ("ttl", "shown"),
    [
        (timedelta(days=30), "30d"),
        (timedelta(hours=24), "24h"),
        (timedelta(hours=1), "1h"),
        (timedelta(minutes=90), "90m"),
        (timedelta(seconds=45), "45s"),
        (timedelta(seconds=1.5), "1.5s"),
    ],
)
def test_spans(ttl: timedelta, shown: str) -> None:
    assert span(ttl) == shown


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"table": ""}, "table"),
        ({"time_column": None}, "time_column"),
        ({"ttl": timedelta(0)}, "ttl"),
        ({"ttl": "1h"}, "ttl"),
        ({"source": "framework-ish"}, "source"),
    ],
)
def test_bad_registrations_name_the_field(fields: dict[str, object], field: str) -> None:
    given = {"table": CLAIMS, "time_column": "claimed_at", "ttl": 1.0, **fields}
    with pytest.raises(ConfigurationError) as info:
        register_retention(**given)  # type: ignore[arg-type]
    assert info.value.field == field


def test_register_retention_takes_hours_and_defaults_to_the_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(retention, "_REGISTERED", [])
    register_retention(table=RUNS, time_column="scheduled_at", ttl=24 * 90)
    register_retention(table=RUNS, time_column="scheduled_at", ttl=timedelta(1), source="plugin")
    assert retention.registered() == (
        Registration(RUNS, "scheduled_at", timedelta(days=90), "app"),
        Registration(RUNS, "scheduled_at", timedelta(days=1), "plugin"),
    )


def test_sweep_slots_are_hours_on_the_epoch_grid() -> None:
    at = datetime(2026, 1, 1, 10, 59, 59, 900000, tzinfo=UTC)
    assert slot(at) == datetime(2026, 1, 1, 10, tzinfo=UTC)
    assert slot(datetime(2026, 1, 1, 11, tzinfo=UTC)) == datetime(2026, 1, 1, 11, tzinfo=UTC)
    assert slot_key(slot(at)) == "voltro-beat:retention@2026-01-01T10:00:00"


def test_no_schedule_can_take_the_sweeps_keys() -> None:
    with pytest.raises(ConfigurationError, match="reserved") as info:
        parse_entries(
            {"voltro-beat:retention": {"task": "t", "schedule": 60.0}},
            tz=None,
            max_lateness=timedelta(days=1),
        )
    assert (info.value.entry, info.value.field) == ("voltro-beat:retention", "name")


def test_a_policy_names_its_table() -> None:
    assert Policy(APP).line() == f"  {CLAIMS}: 1h by claimed_at (app)"
