"""The ``voltro-beat`` command: a click group, one function per subcommand."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import click
from rich.console import Console
from rich.table import Table

from voltro_beat.exceptions import ConfigurationError
from voltro_beat.occurrences import next_after, occurrence_key
from voltro_beat.schedules import Spec, check_name, to_spec


@click.group()
def main() -> None:
    """voltro_beat: active-active Celery beat."""


@main.command()
@click.argument("schedule")
@click.option("--tz", "zone", default=None, help="Zone the schedule runs in (default UTC).")
@click.option(
    "-n", "count", default=10, show_default=True, type=click.IntRange(min=1), help="How many."
)
@click.option("--name", default="preview", show_default=True, help="Schedule name used in keys.")
@click.option(
    "--after",
    default=None,
    help="Start from this ISO instant instead of now (a naive value is read in --tz).",
)
def preview(schedule: str, zone: str | None, count: int, name: str, after: str | None) -> None:
    """Print the next occurrences of SCHEDULE (local and UTC) with their keys.

    SCHEDULE is a cron expression (5 fields, 6 with seconds first, or a macro such as
    @hourly) or a number of seconds for an interval anchored to the Unix epoch.
    """
    try:
        check_name(name)
        spec = _preview_spec(schedule, name, zone)
        instant: datetime | None = _start(after, zone)
        instants: list[tuple[datetime, str]] = []
        while len(instants) < count and instant is not None:
            instant = next_after(spec, instant)
            if instant is not None:
                instants.append((instant, occurrence_key(name, instant)))
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    local_zone = ZoneInfo(zone or "UTC")
    table = Table(title=f"{name}: {schedule}")
    table.add_column("#", justify="right")
    table.add_column(f"local ({local_zone.key})", no_wrap=True)
    table.add_column("UTC", no_wrap=True)
    table.add_column("key", no_wrap=True)
    for number, (instant, key) in enumerate(instants, start=1):
        table.add_row(
            str(number),
            f"{_clock(instant.astimezone(local_zone))} {instant.astimezone(local_zone):%Z}",
            _clock(instant),
            key,
        )
    # Wide enough for the key column even when stdout is not a terminal.
    Console(width=max(Console().width, 120)).print(table)


def _clock(instant: datetime) -> str:
    text = f"{instant:%Y-%m-%d %H:%M:%S}"
    return f"{text}.{instant.microsecond // 1000:03d}" if instant.microsecond else text


def _preview_spec(schedule: str, name: str, zone: str | None) -> Spec:
    try:
        seconds: str | float = float(schedule)
    except ValueError:
        seconds = schedule
    return to_spec(seconds, entry=name, tz=zone)


def _start(after: str | None, zone: str | None) -> datetime:
    if after is None:
        return datetime.now(UTC)
    try:
        start = datetime.fromisoformat(after)
    except ValueError:
        raise ConfigurationError(f"{after!r} is not an ISO 8601 datetime", field="after") from None
    return start if start.tzinfo else start.replace(tzinfo=ZoneInfo(zone or "UTC"))
