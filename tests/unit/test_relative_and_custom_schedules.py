"""Forms Celery's beat accepts that voltro_beat reads its own way: ``relative=True`` and
schedule classes of the app's own (``celery.schedules.BaseSchedule`` subclasses)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import schedules as celery_schedules

from voltro_beat.exceptions import ConfigurationError
from voltro_beat.occurrences import next_after, occurrences_between
from voltro_beat.schedules import CustomSpec, Entry, IntervalSpec, cadence, parse_entries

T0 = datetime(2026, 3, 2, 9, 17, tzinfo=UTC)


def parse(schedule: object, **raw: Any) -> Entry:
    (entry,) = parse_entries(
        {"job": {"task": "t", "schedule": schedule, **raw}}, tz=None, max_lateness=timedelta(1)
    )
    return entry


# --- relative=True --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schedule",
    [timedelta(minutes=30), 1800, celery_schedules.schedule(timedelta(minutes=30), relative=True)],
)
def test_relative_interval_keeps_the_epoch_grid(schedule: object) -> None:
    entry = parse(schedule, relative=True)
    assert entry.spec == IntervalSpec(1_800_000_000)
    assert next_after(entry.spec, T0) == datetime(2026, 3, 2, 9, 30, tzinfo=UTC)


def test_relative_is_ignored_on_crontabs_as_under_celery() -> None:
    plain = parse(celery_schedules.crontab(minute=0, hour=21))
    assert parse(celery_schedules.crontab(minute=0, hour=21), relative=True).spec == plain.spec


# --- custom schedule classes ------------------------------------------------------------------


class Weekdays(celery_schedules.BaseSchedule):
    """08:00 UTC on weekdays, through the documented hook."""

    def next_after(self, after: datetime) -> datetime | None:
        day = after.astimezone(UTC).replace(hour=8, minute=0, second=0, microsecond=0)
        while day <= after or day.weekday() >= 5:
            day += timedelta(days=1)
        return day

    def __repr__(self) -> str:
        return "Weekdays()"


class QuarterHours(celery_schedules.BaseSchedule):
    """Celery's own contract only: the time to the next quarter hour, from ``self.now()``."""

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        now = self.now()
        minutes = 15 - now.minute % 15
        nxt = now.replace(second=0, microsecond=0) + timedelta(minutes=minutes)
        return nxt - now

    def is_due(self, last_run_at: datetime) -> Any:
        remaining = self.remaining_estimate(last_run_at).total_seconds()
        return celery_schedules.schedstate(remaining <= 0, remaining)


class WallClock(QuarterHours):
    """Reads the wall clock instead of its argument or ``self.now()``."""

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return last_run_at + timedelta(minutes=5) - datetime.now(UTC) + timedelta(days=3650)


class FromLastRun(QuarterHours):
    """``last_run_at`` + 10 minutes: instants move with where the walk starts."""

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return last_run_at + timedelta(minutes=10) - self.now()


class IsDueOnly(celery_schedules.BaseSchedule):
    def is_due(self, last_run_at: datetime) -> Any:
        return celery_schedules.schedstate(True, 60)


class Naive(celery_schedules.BaseSchedule):
    def next_after(self, after: datetime) -> datetime:
        return datetime(2030, 1, 1)


class Broken(celery_schedules.BaseSchedule):
    def next_after(self, after: datetime) -> datetime:
        raise LookupError("no flag table")


class EveryOtherMinute(celery_schedules.crontab):
    """A crontab subclass with timing of its own: read through its methods, not its fields."""

    def next_after(self, after: datetime) -> datetime:
        start = after.replace(second=0, microsecond=0)
        return start + timedelta(minutes=2 - start.minute % 2)


def test_next_after_hook_gives_the_instants() -> None:
    spec = parse(Weekdays()).spec
    assert isinstance(spec, CustomSpec)
    friday_noon = datetime(2026, 3, 6, 12, tzinfo=UTC)
    assert next_after(spec, friday_noon) == datetime(2026, 3, 9, 8, tzinfo=UTC)  # Monday
    assert repr(spec) == "CustomSpec(definition='Weekdays()')"  # what replicas compare


def test_remaining_estimate_is_walked_with_its_clock_at_each_instant() -> None:
    spec = parse(QuarterHours()).spec
    found = list(occurrences_between(spec, T0, T0 + timedelta(hours=1)))
    assert found == [T0.replace(minute=0) + timedelta(minutes=m) for m in (30, 45, 60, 75)]
    assert cadence(spec) == timedelta(minutes=15)


def test_crontab_subclass_with_its_own_timing_is_walked() -> None:
    spec = parse(EveryOtherMinute()).spec
    assert isinstance(spec, CustomSpec)
    assert next_after(spec, T0) == T0 + timedelta(minutes=1)


@pytest.mark.parametrize(
    ("schedule", "words"),
    [
        (WallClock(), "not deterministic"),
        (FromLastRun(), "depend on where the walk starts"),
        (IsDueOnly(), "neither next_after"),
        (Naive(), "not an aware datetime"),
        (Broken(), "LookupError: no flag table"),
    ],
)
def test_undeterministic_schedules_are_refused_naming_the_entry(
    schedule: object, words: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_entries(
            {"nightly sync": {"task": "t", "schedule": schedule}},
            tz=None,
            max_lateness=timedelta(1),
        )
    assert info.value.entry == "nightly sync"
    assert info.value.field == "schedule"
    assert words in str(info.value)
