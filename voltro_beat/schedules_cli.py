"""``voltro-beat schedules``: the schedules table from the command line (docs/schedule-table.md).

Every edit is checked as beat checks the app's ``beat_schedule`` and names the revision it is
based on (``--revision``, as ``ls`` or ``show`` printed it): an edit of a schedule that changed
since is refused. A group of the ``voltro-beat`` command (:mod:`voltro_beat.cli`).
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from voltro_beat import definitions, periodic_tasks
from voltro_beat.beat_schedule import load_schedule
from voltro_beat.cli_options import current_app, errors, open_store, settings_options, stamp
from voltro_beat.config import Settings
from voltro_beat.exceptions import EditRefused
from voltro_beat.occurrences import next_after
from voltro_beat.schedule_table import ScheduleTable, change_lines
from voltro_beat.store import reads
from voltro_beat.store.schedule_rows import ScheduleChange


@click.group()
def schedules() -> None:
    """Schedules kept in the database: add, change, enable, disable, remove, list, show.

    Every live beat replica applies a change within about a second, from the first
    occurrence of the new definition after the change."""


@contextmanager
def _table(settings: Settings, *, importing: bool = False) -> Iterator[ScheduleTable]:
    """The table, knowing the app's (-A) entries, which an add may not shadow (unless the
    entries are what is being imported)."""
    app = current_app()
    code = [] if app is None or importing else list(load_schedule(app, settings).entries)
    with errors(), open_store(settings.store_url) as database:
        try:
            yield ScheduleTable(database, settings, code=code)
        except EditRefused as exc:
            raise click.ClickException(str(exc)) from exc


def _definition_options(command: Any) -> Any:
    for option in reversed(
        [
            click.option("--task", default=None, help="The task's name."),
            click.option(
                "--schedule",
                "cron",
                default=None,
                help='A cron string ("*/5 * * * *", 6 fields with seconds first, @hourly).',
            ),
            click.option("--every", type=float, default=None, help="An interval in seconds."),
            click.option(
                "--field",
                "fields",
                multiple=True,
                metavar="KEY=JSON",
                help='Any other key of an entry, its value as JSON: kwargs={"team": "ops"}, '
                'catch_up="all", schedule={"crontab": {"minute": "0"}} (repeatable).',
            ),
            click.option(
                "--definition", default=None, metavar="JSON", help="The whole entry as JSON."
            ),
            click.option(
                "--by", default=None, help="Who makes the change (default: this OS user)."
            ),
        ]
    ):
        command = option(command)
    return command


def _document(
    definition: str | None,
    task: str | None,
    cron: str | None,
    every: float | None,
    fields: tuple[str, ...],
) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if definition is not None:
        doc = _json("--definition", definition)
        if not isinstance(doc, dict):
            raise click.BadParameter("a JSON object is required", param_hint="--definition")
    if task is not None:
        doc["task"] = task
    if cron is not None:
        doc["schedule"] = cron
    if every is not None:
        doc["schedule"] = {"every": every}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"KEY=JSON, not {field!r}", param_hint="--field")
        doc[key] = _json(f"--field {key}", value)
    return doc


def _json(option: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=option) from None


def _who(by: str | None) -> str:
    return by or getpass.getuser()


@schedules.command("add")
@click.argument("name")
@_definition_options
@click.option("--disabled", is_flag=True, help="Add it disabled.")
@settings_options()
def add(settings: Settings, name: str, by: str | None, disabled: bool, **given: Any) -> None:
    """Add schedule NAME (fires from its first instant after the add)."""
    with _table(settings) as table:
        row = table.add(name, _document(**given), by=_who(by), enabled=not disabled)
    click.echo(f"{name}: added at revision {row.revision}")


@schedules.command("set")
@click.argument("name")
@click.option("--revision", type=int, required=True, help="The revision the change is based on.")
@_definition_options
@settings_options()
def set_(settings: Settings, name: str, revision: int, by: str | None, **given: Any) -> None:
    """Replace the definition of NAME (the fields not given are dropped)."""
    with _table(settings) as table:
        row = table.set(name, _document(**given), revision=revision, by=_who(by))
    click.echo(f"{name}: changed, now at revision {row.revision}")


def _switch(action: str) -> Any:
    @click.argument("name")
    @click.option("--revision", type=int, required=True, help="The revision it is based on.")
    @click.option("--by", default=None, help="Who makes the change (default: this OS user).")
    @settings_options()
    def command(settings: Settings, name: str, revision: int, by: str | None) -> None:
        with _table(settings) as table:
            if action == "rm":
                table.remove(name, revision=revision, by=_who(by))
                click.echo(f"{name}: removed")
                return
            switch = table.enable if action == "enable" else table.disable
            row = switch(name, revision=revision, by=_who(by))
        click.echo(f"{name}: {action}d, now at revision {row.revision}")

    return command


schedules.command(
    "enable", help="Let NAME fire again (from its first instant after this; no catch-up)."
)(_switch("enable"))
schedules.command("disable", help="Stop NAME firing (its row and history stay).")(
    _switch("disable")
)
schedules.command("rm", help="Remove NAME (its history stays; claimed runs still run).")(
    _switch("rm")
)


@schedules.command("ls")
@settings_options()
def ls(settings: Settings) -> None:
    """Every schedule of the table: its revision, next instant and last outcome."""
    with _table(settings) as table:
        rows = table.rows.all()
        now = table.database.time()
        last = reads.summaries(table.database, [r.name for r in rows], now=now)
        view = Table(title=f"_voltro_beat_schedules ({len(rows)})")
        for column in ("name", "group", "enabled", "rev", "schedule", "next", "last"):
            view.add_column(column, no_wrap=True)
        for row in rows:
            entry = table.entry(row.name, row.definition)
            following = next_after(entry.spec, now) if row.enabled else None
            summary = last[row.name]
            last_run = f"{summary.last_status} {stamp(summary.last_at)}"
            view.add_row(
                row.name,
                row.group,
                "yes" if row.enabled else "no",
                str(row.revision),
                json.dumps(row.definition.get("schedule")),
                stamp(following),
                "" if summary.last_at is None else last_run,
            )
    Console(width=max(Console().width, 160)).print(view)


@schedules.command("show")
@click.argument("name")
@settings_options()
def show(settings: Settings, name: str) -> None:
    """NAME's definition, revision, the live replicas that applied it, and its changes."""
    with _table(settings) as table:
        row = table.rows.get([name]).get(name)
        if row is None:
            raise click.ClickException(f"no schedule {name!r} in the schedules table")
        applied = table.applied(row)
        history = table.history(name)
    click.echo(f"{name}  revision {row.revision}  {'enabled' if row.enabled else 'disabled'}")
    click.echo(f"changed by {row.changed_by} at {stamp(row.changed_at)}")
    click.echo(json.dumps(row.definition, indent=2))
    click.echo(applied)
    _print_history(history)


@schedules.command("history")
@click.argument("name")
@settings_options()
def history(settings: Settings, name: str) -> None:
    """NAME's changes, oldest first: revision, action, who, when, and what changed."""
    with _table(settings) as table:
        changes = table.history(name)
    if not changes:
        raise click.ClickException(f"no change of {name!r} in the schedules table")
    _print_history(changes)


def _print_history(changes: list[ScheduleChange]) -> None:
    for line in change_lines(changes):
        click.echo(f"  {line}")


@schedules.command("export")
@click.option("--python", "as_python", is_flag=True, help="A beat_schedule dict in Python.")
@settings_options()
def export(settings: Settings, as_python: bool) -> None:
    """Print the table's enabled schedules as JSON (or as a Python beat_schedule)."""
    with _table(settings) as table:
        rows = [r for r in table.rows.all() if r.enabled]
    if not as_python:
        click.echo(json.dumps({r.name: r.definition for r in rows}, indent=2))
        return
    click.echo("from datetime import datetime, timedelta\n")
    click.echo("from celery.schedules import crontab, solar\n")
    click.echo("beat_schedule = {")
    for r in rows:
        click.echo(f"    {r.name!r}: {definitions.python_entry(r.definition)},")
    click.echo("}")


@schedules.command("import")
@click.option(
    "--django-celery-beat",
    "dcb_url",
    default=None,
    metavar="URL",
    help="Import django-celery-beat's periodic tasks from this database (a SQLAlchemy URL: "
    "postgresql://..., sqlite:///...) instead of the app's beat_schedule.",
)
@click.option("--by", default=None, help="Who makes the change (default: this OS user).")
@settings_options()
def import_(settings: Settings, dcb_url: str | None, by: str | None) -> None:
    """Add the app's (-A) beat_schedule entries, or django-celery-beat's periodic tasks, to
    the table; a name the table has already is left as it is. The app keeps defining its
    entries until they are removed from its code (set voltro_beat_schedule_conflicts
    meanwhile)."""
    with _table(settings, importing=True) as table:
        existing = {r.name for r in table.rows.all()}
        if dcb_url is None:
            app = current_app()
            if app is None:
                raise click.ClickException("import needs the app (-A) or --django-celery-beat")
            found = [
                periodic_tasks.Imported(name, definitions.from_entry(name, raw), True)
                for name, raw in (app.conf.beat_schedule or {}).items()
            ]
        else:
            found = list(periodic_tasks.read(dcb_url, now=table.database.time()))
        added = 0
        for task in found:
            if task.name in existing:
                click.echo(f"{task.name}: in the table already, left as it is")
            elif task.definition is None:
                click.echo(f"{task.name}: not imported: {task.skipped}")
            else:
                table.add(task.name, task.definition, by=_who(by), enabled=task.enabled)
                added += 1
    click.echo(f"{added} schedules added")
