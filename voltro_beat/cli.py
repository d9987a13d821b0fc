"""The ``voltro-beat`` command: a click group, one function per subcommand."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import click
from rich.console import Console
from rich.table import Table

from voltro_beat.config import DEFAULT_STORE_URL
from voltro_beat.exceptions import ConfigurationError, StoreError
from voltro_beat.occurrences import next_after, occurrence_key
from voltro_beat.replicas import lives
from voltro_beat.schedules import Spec, check_name, to_spec
from voltro_beat.status import Status
from voltro_beat.store import reads
from voltro_beat.store.database import Database, hide_password
from voltro_beat.store.migrations import runner as migrations
from voltro_beat.store.registry import Registry


@click.group()
def main() -> None:
    """voltro_beat: active-active Celery beat."""


@main.command()
@click.argument("schedule")
@click.option("--tz", "zone", default=None, help="Zone the schedule runs in (default UTC).")
@click.option(
    "-n",
    "count",
    default=10,
    show_default=True,
    type=click.IntRange(min=1),
    help="How many instants.",
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


def _store_option(command: Callable[..., None]) -> Callable[..., None]:
    return click.option(
        "--store",
        "store_url",
        envvar="VOLTRO_BEAT_STORE_URL",
        default=DEFAULT_STORE_URL,
        show_default=True,
        help="Store URL (env VOLTRO_BEAT_STORE_URL).",
    )(command)


@main.group()
def db() -> None:
    """The schema of voltro_beat's tables (Alembic, version table _voltro_beat_alembic_version)."""


@db.command("upgrade")
@_store_option
def db_upgrade(store_url: str) -> None:
    """Create or upgrade the tables to the newest revision."""
    with _errors():
        database = Database.open(store_url)
        try:
            database.upgrade()
        finally:
            database.dispose()
    click.echo(f"{hide_password(store_url)}: schema is up to date")


@db.command("sql")
@_store_option
def db_sql(store_url: str) -> None:
    """Print the DDL of every migration for the store's dialect, for a DBA to run."""
    with _errors():
        Database.open(store_url)  # validates the URL
        click.echo(migrations.sql(store_url), nl=False)


@main.command()
@_store_option
@click.option("--schedule", default=None, help="Only this schedule.")
@click.option(
    "--status", default=None, type=click.Choice([s.value for s in Status]), help="Only this status."
)
@click.option("-n", "count", default=50, show_default=True, type=click.IntRange(min=1))
def runs(store_url: str, schedule: str | None, status: str | None, count: int) -> None:
    """Print the newest rows of the run table."""
    with _errors():
        database = Database.open(store_url)
        try:
            rows = reads.recent_runs(
                database,
                schedule=schedule,
                status=None if status is None else Status(status),
                limit=count,
            )
        finally:
            database.dispose()
    table = Table(title=f"_voltro_schedule_runs ({len(rows)} newest)")
    columns = ("id", "status", "reason", "replica", "coordination_outcome", "worker")
    for column in (*columns, "published", "finished"):
        table.add_column(column, no_wrap=column == "id")
    for row in rows:
        table.add_row(
            *(str(row[c] or "") for c in columns),
            _stamp(row["published_at"]),
            _stamp(row["finished_at"]),
        )
    Console(width=max(Console().width, 140)).print(table)


@main.command()
@_store_option
@click.option(
    "--max-offset",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Flag clocks further than this many seconds from the database's.",
)
def replicas(store_url: str, max_offset: float) -> None:
    """Print the replica registry: every beat replica that ran recently, and whether it lives.

    A replica is live while its last heartbeat is younger than its publish timeout; times are
    the database's clock. The clock offset is the replica's local clock minus the database's.
    """
    with _errors():
        database = Database.open(store_url)
        try:
            rows = Registry(database).everyone()
            now = database.time()
        finally:
            database.dispose()
    table = Table(title=f"_voltro_beat_replicas ({len(rows)})")
    columns = ("name", "host", "pid", "version", "started", "last seen", "live", "clock")
    for column in (*columns, "offset s", "schedules"):
        table.add_column(column, no_wrap=True)
    for r in rows:
        ago = None if r.last_seen is None else (now - r.last_seen).total_seconds()
        live = lives(r, now)
        offset = r.clock_offset
        table.add_row(
            r.name,
            r.host,
            str(r.pid),
            r.version,
            _stamp(r.started_at),
            "" if ago is None else f"{ago:.1f} s ago",
            "yes" if live else "no",
            str(r.settings.get("clock", "")),
            "" if offset is None else f"{offset:+.3f}" + (" !" if abs(offset) > max_offset else ""),
            r.schedules_digest,
        )
    Console(width=max(Console().width, 160)).print(table)


@main.command()
@_store_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--no-auth",
    is_flag=True,
    help="Serve without a login (only with a loopback --host).",
)
@click.option(
    "--celery-app",
    default=None,
    help='The Celery app ("proj.celery:app") whose beat_schedule the schedules page reads.',
)
def admin(store_url: str, host: str, port: int, no_auth: bool, celery_app: str | None) -> None:
    """Serve read-only admin pages of the run and claims tables (sqladmin).

    The login is VOLTRO_BEAT_ADMIN_USER / VOLTRO_BEAT_ADMIN_PASSWORD from the environment;
    without them the command refuses to start, unless told --no-auth on a loopback address.
    """
    try:
        import uvicorn

        from voltro_beat.contrib.sqladmin import server
    except ImportError as exc:
        raise click.ClickException(
            f"the admin needs the sqladmin extra: pip install 'voltro-beat[sqladmin]' ({exc})"
        ) from None
    with _errors():
        app = server.create_app(
            store_url, server.login_from_environment(host, no_auth=no_auth), celery_app=celery_app
        )
    click.echo(f"voltro_beat admin of {hide_password(store_url)} on http://{host}:{port}/admin/")
    uvicorn.run(app, host=host, port=port, log_level="warning")


#: Exit codes of ``voltro-beat trigger`` besides 0 (published, or claimed before) and 1.
EXIT_TOO_FAR = 3
EXIT_NOT_PUBLISHED = 4


def _celery_app_option(command: Callable[..., None]) -> Callable[..., None]:
    return click.option(
        "-A",
        "--celery-app",
        "celery_app",
        envvar="VOLTRO_BEAT_CELERY_APP",
        required=True,
        help='The Celery app ("proj.celery:app") whose beat_schedule holds the entry '
        "(env VOLTRO_BEAT_CELERY_APP).",
    )(command)


@main.command()
@click.argument("name")
@_celery_app_option
def trigger(name: str, celery_app: str) -> None:
    """Fire the external entry NAME now (for a platform's scheduler: a CronJob's command).

    The arrival snaps back to the newest occurrence at or before it on the database's clock;
    that occurrence is claimed whatever the coordination and published once. A second trigger
    for it publishes nothing and exits 0. Exit 3: further than the entry's max_lateness from
    any occurrence; exit 4: claimed but not published (recovery republishes it).
    """
    from voltro_beat.trigger import NotExternal, NotPublished, TooFar, Trigger

    with _errors():
        fire = Trigger.for_app(celery_app)
        try:
            fired = fire.fire(name)
        except NotExternal as exc:
            raise click.ClickException(str(exc)) from None
        except TooFar as exc:
            click.echo(f"Error: {exc}", err=True)
            raise SystemExit(EXIT_TOO_FAR) from None
        except NotPublished as exc:
            click.echo(f"Error: {exc}", err=True)
            raise SystemExit(EXIT_NOT_PUBLISHED) from None
        finally:
            fire.close()
    o = fired.occurrence
    if fired.published:
        click.echo(f"{o.key}: published (task id {o.task_id})")
    else:
        click.echo(f"{o.key}: claimed already, nothing published")


@main.command("serve-trigger")
@_celery_app_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8001, show_default=True, type=click.IntRange(1, 65535))
def serve_trigger(celery_app: str, host: str, port: int) -> None:
    """Serve POST /trigger/<name>: the external trigger over HTTP, behind a bearer token.

    The token is VOLTRO_BEAT_TRIGGER_TOKEN, or the contents of the file
    VOLTRO_BEAT_TRIGGER_TOKEN_FILE names; without one the command refuses to start.
    """
    try:
        import uvicorn

        from voltro_beat.contrib import trigger_endpoint
    except ImportError as exc:
        raise click.ClickException(
            f"the endpoint needs the trigger extra: pip install 'voltro-beat[trigger]' ({exc})"
        ) from None
    from voltro_beat.trigger import Trigger

    with _errors():
        token = trigger_endpoint.token_from_environment()
        app = trigger_endpoint.create_app(Trigger.for_app(celery_app), token)
    click.echo(f"voltro_beat trigger endpoint on http://{host}:{port}/trigger/<name>")
    uvicorn.run(app, host=host, port=port, log_level="info")


def _stamp(at: datetime | None) -> str:
    return "" if at is None else f"{at:%Y-%m-%d %H:%M:%S.%f}"[:-3]


@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except (ConfigurationError, StoreError) as exc:
        raise click.ClickException(str(exc)) from exc
