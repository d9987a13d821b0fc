"""Schedule classes of an app's own (``celery.schedules.BaseSchedule`` subclasses), as
test_celery_forms' ``beat_schedule`` uses them. No app import: the config file loads this."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from celery.schedules import BaseSchedule, schedstate


class EveryThreeSeconds(BaseSchedule):  # type: ignore[misc]
    """voltro_beat's documented hook: the first instant strictly after ``after``."""

    def next_after(self, after: datetime) -> datetime:
        second = int(after.timestamp())
        return datetime.fromtimestamp(second - second % 3 + 3, UTC)

    def __repr__(self) -> str:
        return "EveryThreeSeconds()"


class EveryTwoSeconds(BaseSchedule):  # type: ignore[misc]
    """Celery's own contract only: what is left until the next even second, from ``now()``."""

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        now = self.now()
        second = now.replace(microsecond=0)
        return second + timedelta(seconds=2 - second.second % 2) - now

    def is_due(self, last_run_at: datetime) -> schedstate:
        remaining = self.remaining_estimate(last_run_at).total_seconds()
        return schedstate(remaining <= 0, max(remaining, 0.1))

    def __repr__(self) -> str:
        return "EveryTwoSeconds()"
