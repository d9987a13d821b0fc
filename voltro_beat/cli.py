"""The ``voltro-beat`` command: a click group, one function per subcommand."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import click
from celery import Celery
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from voltro_beat.beat_schedule import load_schedule
from voltro_beat.cli_options import (
    APP_NAME,
    app_option,
    current_app,
    errors,
    existing,
    open_store,
    settings_of,
    settings_options,
    stamp,
)
from voltro_beat.config import Origin, Settings
from voltro_beat.contrib.display import STUCK_AFTER
from voltro_beat.cron import MICROSECOND, CronSpec
from voltro_beat.dispatch import CHUNK
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.occurrences import (
    latest_at_or_before,
    next_after,
    next_instants,
    occurrence_key,
    occurrences_between,
    task_id_for,
)
from voltro_beat.on_demand import OnDemand
from voltro_beat.replicas import lives
from voltro_beat.schedules import DEFAULT_GROUP, Entry, Spec, check_name, to_spec
from voltro_beat.schedules_cli import schedules
from voltro_beat.shards import shard_of
from voltro_beat.status import Reason, Status
from voltro_beat.store import reads
from voltro_beat.store.database import Database, hide_password
from voltro_beat.store.migrations import runner as migrations
from voltro_beat.store.registry import Registry


@click.group()
@click.version_option(package_name="voltro-beat", message="voltro-beat %(version)s")
def main() -> None:
    """voltro_beat: active-active Celery beat."""


@main.command()
@click.argument("schedule")
@app_option()
@click.option(
    "--tz", "zone", default=None, help="Zone the schedule runs in (default UTC, or the app's)."
)
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
    @hourly) or a number of seconds for an interval anchored to the Unix epoch. With -A proj
    it may also name an entry of the app's beat_schedule (its own schedule and zone), and an
    expression runs in the app's time zone unless --tz says otherwise.
    """
    app = current_app()
    try:
        spec: Spec | None = None
        if app is not None:
            settings = settings_of()
            entries = load_schedule(app, settings).entries
            if schedule in entries:
                name, spec = schedule, entries[schedule].spec
                zone = zone or (spec.tz if isinstance(spec, CronSpec) else None)
            zone = zone or settings.timezone
        check_name(name)
        if spec is None:
            spec = _preview_spec(schedule, name, zone)
        instants = [
            (at, occurrence_key(name, at)) for at in next_instants(spec, _start(after, zone), count)
        ]
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


@main.command("config")
@settings_options()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per setting and line.")
def show_config(settings: Settings, as_json: bool) -> None:
    """Print every setting, its value and where the value came from.

    Each setting is the first of: a flag (--store), its environment variable, the app's (-A)
    voltro_beat_* setting, its default. timezone is the app's own (Celery's) setting.
    """
    described = settings.described()
    if as_json:
        for key, value, source in described:
            name = _FLAGS.get(key) if source.origin is Origin.FLAG else source.name
            line = {"setting": key, "value": _plain(key, value), "source": source.origin}
            click.echo(json.dumps({**line, "name": name}))
        return
    table = Table(title="voltro_beat settings (flag > environment > app setting > default)")
    for column in ("setting", "value", "from"):
        table.add_column(column, no_wrap=True)
    for key, value, source in described:
        origin = f"flag {_FLAGS[key]}" if source.origin is Origin.FLAG else str(source)
        table.add_row(key, _setting_text(key, value), origin)
    Console(width=max(Console().width, 140)).print(table)


#: The flag that gives a setting explicitly.
_FLAGS = {"voltro_beat_store_url": "--store"}
#: What a setting whose value is None means.
_UNSET = {
    "voltro_beat_clock": "the store's (database on PostgreSQL, local on SQLite)",
    "voltro_beat_metrics_port": "off",
    "timezone": "UTC",
}


def _plain(key: str, value: object) -> str | float | bool | None:
    """A setting's value for JSON: durations in the unit their key says (hours for
    ``*_hours``, else seconds), the store URL without its password."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, timedelta):
        return value / timedelta(hours=1) if key.endswith("_hours") else value.total_seconds()
    return hide_password(str(value)) if key == "voltro_beat_store_url" else str(value)


def _setting_text(key: str, value: object) -> str:
    plain = _plain(key, value)
    if plain is None:
        return _UNSET.get(key, "none")
    if isinstance(plain, bool):
        return str(plain).lower()
    if isinstance(value, timedelta):
        return f"{plain:g} {'h' if key.endswith('_hours') else 's'}"
    return str(plain)


@main.group()
def db() -> None:
    """The schema of voltro_beat's tables (Alembic, version table _voltro_beat_alembic_version)."""


@db.command("upgrade")
@settings_options()
def db_upgrade(settings: Settings) -> None:
    """Create or upgrade the tables to the newest revision."""
    with errors():
        database = Database.open(settings.store_url)
        try:
            database.upgrade()
        finally:
            database.dispose()
    click.echo(f"{hide_password(settings.store_url)}: schema is up to date")


@db.command("sql")
@settings_options()
def db_sql(settings: Settings) -> None:
    """Print the DDL of every migration for the store's kind of database, for a DBA to run."""
    with errors():
        Database.open(settings.store_url)  # validates the URL
        click.echo(migrations.sql(settings.store_url), nl=False)


@main.command()
@settings_options()
@click.option("--schedule", default=None, help="Only this schedule.")
@click.option(
    "--status", default=None, type=click.Choice([s.value for s in Status]), help="Only this status."
)
@click.option("-n", "count", default=50, show_default=True, type=click.IntRange(min=1))
@click.option("--since", default=None, help="Scheduled at or after (ISO 8601, or 15m/2h/3d ago).")
@click.option("--until", default=None, help="Scheduled before (ISO 8601, or 15m/2h/3d ago).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row and line.")
def runs(
    settings: Settings,
    schedule: str | None,
    status: str | None,
    count: int,
    since: str | None,
    until: str | None,
    as_json: bool,
) -> None:
    """Print the newest rows of the run table, with each run's publish lag (published minus
    scheduled)."""
    with errors(), open_store(settings.store_url) as database:
        rows = reads.recent_runs(
            database,
            schedule=schedule,
            status=None if status is None else Status(status),
            limit=count,
            since=None if since is None else _instant(since, "--since", database),
            until=None if until is None else _instant(until, "--until", database),
        )
        if schedule is not None and not rows:
            _known_schedule(schedule, database, settings)
    for row in rows:
        row["lag"] = _lag(row)
    if as_json:
        for row in rows:
            click.echo(json.dumps(row, default=_json_value))
        return
    table = Table(title=f"_voltro_schedule_runs ({len(rows)} newest)")
    columns = ("id", "status", "reason", "replica", "coordination_outcome", "worker")
    for column in (*columns, "published", "lag s", "finished"):
        table.add_column(
            column, no_wrap=column == "id", justify="right" if column == "lag s" else "left"
        )
    for row in rows:
        table.add_row(
            *(str(row[c] or "") for c in columns),
            stamp(row["published_at"]),
            "" if row["lag"] is None else f"{row['lag']:.3f}",
            stamp(row["finished_at"]),
        )
    Console(width=max(Console().width, 160)).print(table)


@main.command()
@settings_options()
@click.option(
    "--max-offset",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Flag clocks further than this many seconds from the database's.",
)
def replicas(settings: Settings, max_offset: float) -> None:
    """Print the replica registry: every beat replica that ran recently, and whether it lives.

    A replica is live while its last heartbeat is younger than its publish timeout; times are
    the database's clock. The clock offset is the replica's local clock minus the database's;
    "table rev" the newest revision of the schedules table it applied.
    """
    with errors(), open_store(settings.store_url) as database:
        rows = Registry(database).everyone()
        now = database.time()
    table = Table(title=f"_voltro_beat_replicas ({len(rows)})")
    columns = ("name", "host", "pid", "version", "started", "last seen", "live", "clock")
    for column in (*columns, "offset s", "schedules", "table rev"):
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
            stamp(r.started_at),
            "" if ago is None else f"{ago:.1f} s ago",
            "yes" if live else "no",
            str(r.settings.get("clock", "")),
            "" if offset is None else f"{offset:+.3f}" + (" !" if abs(offset) > max_offset else ""),
            r.schedules_digest,
            str(r.schedules_revision),
        )
    Console(width=max(Console().width, 160)).print(table)


@main.command()
@settings_options()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--no-auth",
    is_flag=True,
    help="Serve without a login (only with a loopback --host).",
)
@click.option(
    "--stuck-after",
    envvar="VOLTRO_BEAT_ADMIN_STUCK_AFTER",
    default=STUCK_AFTER.total_seconds(),
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Mark a run stuck when it is on a worker this many seconds and not finished.",
)
def admin(settings: Settings, host: str, port: int, no_auth: bool, stuck_after: float) -> None:
    """Serve read-only admin pages of the run and claims tables (sqladmin).

    With -A proj the schedules page shows each entry's next occurrences. The login is
    VOLTRO_BEAT_ADMIN_USER / VOLTRO_BEAT_ADMIN_PASSWORD from the environment; without them
    the command refuses to start, unless told --no-auth on a loopback address.
    """
    try:
        import uvicorn

        from voltro_beat.contrib.sqladmin import server
    except ImportError as exc:
        raise click.ClickException(
            f"the admin needs the sqladmin extra: pip install 'voltro-beat[sqladmin]' ({exc})"
        ) from None
    with errors():
        existing(
            Database.open(settings.store_url)
        ).dispose()  # it only reads: never creates a store
        app = server.create_app(
            settings.store_url,
            server.login_from_environment(host, no_auth=no_auth),
            celery_app=click.get_current_context().meta.get(APP_NAME),
            stuck_after=timedelta(seconds=stuck_after),
        )
    click.echo(
        f"voltro_beat admin of {hide_password(settings.store_url)} on http://{host}:{port}/admin/"
    )
    uvicorn.run(app, host=host, port=port, log_level="warning")


#: Exit codes of ``voltro-beat trigger`` besides 0 (published, or claimed before) and 1.
EXIT_TOO_FAR = 3
EXIT_NOT_PUBLISHED = 4


@main.command()
@click.argument("name")
@settings_options(app_required=True)
def trigger(settings: Settings, name: str) -> None:
    """Fire the external entry NAME now (for a platform's scheduler: a CronJob's command).

    The arrival snaps back to the newest occurrence at or before it on the database's clock
    (one at most voltro_beat_max_clock_offset ahead is waited for);
    that occurrence is claimed whatever the coordination and published once. A second trigger
    for it publishes nothing and exits 0. Exit 3: further than the entry's max_lateness from
    any occurrence; exit 4: claimed but not published (recovery republishes it).
    """
    from voltro_beat.exceptions import NotExternal, NotPublished, TooFar
    from voltro_beat.trigger import Trigger

    with errors():
        fire = Trigger(_required_app("trigger"), settings)
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
@settings_options(app_required=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8001, show_default=True, type=click.IntRange(1, 65535))
def serve_trigger(settings: Settings, host: str, port: int) -> None:
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

    with errors():
        token = trigger_endpoint.token_from_environment()
        app = trigger_endpoint.create_app(Trigger(_required_app("serve-trigger"), settings), token)
    click.echo(f"voltro_beat trigger endpoint on http://{host}:{port}/trigger/<name>")
    uvicorn.run(app, host=host, port=port, log_level="info")


# -- the operator's commands (docs/operations.md) -------------------------------------------

#: A backfill window holding more occurrences than this is refused: narrow it.
MAX_BACKFILL_WINDOW = 1_000_000
#: Relative instants: ``15m`` is fifteen minutes before now.
_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


@main.command()
@settings_options()
def status(settings: Settings) -> None:
    """One line per schedule: next occurrence, last run and its status, success rate over the
    retained runs that executed (succeeded or failed), median publish lag, and the runs by
    outcome (missed by reason, skipped by the overlap policy); then the replicas seen recently,
    the shards of cluster coordination, and (with -A) each group of schedules no live replica
    serves.

    With -A proj the schedules are the app's beat_schedule and the entries Celery's beat adds
    (celery.backend_cleanup), with their next occurrences;
    without it, every schedule that has a run row.
    """
    app = current_app()
    with errors(), open_store(settings.store_url) as database:
        entries = {} if app is None else load_schedule(app, settings).entries
        now = database.time()
        names = list(entries) or reads.schedule_names(database)
        summaries = reads.summaries(database, names, now=now)
        replicas = Registry(database).everyone()
        shard_rows = reads.shard_leases(database, now=now)
    table = Table(title=f"schedules ({len(names)}) at {stamp(now)} UTC")
    for column in ("schedule", "next", "last run", "status", "success", "runs", "median lag s"):
        table.add_column(column, no_wrap=True)
    table.add_column("outcomes")
    for name in names:
        entry, summary = entries.get(name), summaries[name]
        upcoming = None if entry is None else next_after(entry.spec, now)
        rate, lag = summary.tally.success_rate, summary.median_lag
        table.add_row(
            name,
            stamp(upcoming) if entry is not None else "",
            stamp(summary.last_at),
            summary.last_status or "",
            "" if rate is None else f"{rate:.1%}",
            str(summary.tally.total),
            "" if lag is None else f"{lag:.3f}",
            summary.tally.outcomes_text,
        )
    # Wide enough for the outcomes of a busy schedule on one line.
    console = Console(width=max(Console().width, 200))
    console.print(table)
    live = [r for r in replicas if lives(r, now)]
    console.print(f"replicas: {len(live)} live of {len(replicas)} registered")
    for r in replicas:
        seen = (
            "never" if r.last_seen is None else f"{(now - r.last_seen).total_seconds():.1f} s ago"
        )
        console.print(
            f"  {r.name} ({r.host}, pid {r.pid}): {'live' if r in live else 'gone'}, seen {seen}"
        )
    for line in _shard_summary(shard_rows):
        console.print(f"shards: {line}")
    served = {str(r.settings.get("group", DEFAULT_GROUP)) for r in live}
    groups = Counter(e.group for e in entries.values())
    for group, count in sorted(groups.items()):
        if group not in served:
            console.print(
                f"group {group}: {count} schedules and NO LIVE REPLICA: nothing fires them"
            )


@main.command()
@settings_options()
@click.option("--all", "every", is_flag=True, help="One line per shard.")
def shards(settings: Settings, every: bool) -> None:
    """Print cluster coordination's shards: per group, each owner and how many shards it
    holds, and the shards nobody holds (their schedules fire only once a replica takes them);
    then each singleton's state, where it last ran, since when and with which token.

    With --all, one line per shard: its owner, epoch (one more at every change of owner),
    lease left and owner since; with -A proj also how many of the app's schedules it holds
    (by this command's voltro_beat_shards). Times are the database's clock.
    """
    app = current_app()
    with errors(), open_store(settings.store_url) as database:
        entries = {} if app is None else load_schedule(app, settings).entries
        now = database.time()
        rows = reads.shard_leases(database, now=now)
        states = reads.singleton_states(database)
    console = Console(width=max(Console().width, 120))
    if not rows:
        console.print("no shards: no replica ran in cluster coordination on this store")
        return
    for line in _shard_summary(rows):
        console.print(line)
    for st in states:
        first = (st.error or "").strip().splitlines()[-1:] or [""]
        console.print(
            f"singleton {st.name} (group {st.group}): {st.state} on {st.replica} since "
            f"{stamp(st.since)}, token {st.token}" + (f": {first[0]}" if first[0] else "")
        )
    if not every:
        return
    held = Counter((e.group, shard_of(e.group, e.name, settings.shards)) for e in entries.values())
    table = Table(title=f"_voltro_beat_shards ({len(rows)}) at {stamp(now)} UTC")
    for column in ("group", "shard", "owner", "epoch", "lease left s", "owner since"):
        table.add_column(column, no_wrap=True)
    if entries:
        table.add_column("schedules")
    for r in rows:
        cells = [
            r.group,
            str(r.shard),
            r.owner or "(nobody)",
            str(r.epoch),
            "" if r.lease_left is None else f"{r.lease_left:.1f}",
            stamp(r.since),
        ]
        table.add_row(*cells, *([str(held[r.group, r.shard])] if entries else []))
    console.print(table)


def _shard_summary(rows: Sequence[reads.Shard]) -> list[str]:
    """One line per group of shards: its owners and what nobody holds."""
    lines = []
    for group, grouped in itertools.groupby(rows, key=lambda r: r.group):
        shards = list(grouped)
        owners = Counter(r.owner for r in shards if r.owner is not None)
        free = [str(r.shard) for r in shards if r.owner is None]
        held = ", ".join(f"{name} {n}" for name, n in sorted(owners.items()))
        lines.append(
            f"group {group}: {len(shards)} shards, {len(owners)} owners ({held or 'none'}); "
            + (f"NOT OWNED: {len(free)} ({', '.join(free)})" if free else "every shard owned")
        )
    return lines


@main.command()
@settings_options()
@click.option("--since", default=None, help="Claimed at or after (ISO 8601, or 15m/2h/3d ago).")
@click.option("-n", "count", default=50, show_default=True, type=click.IntRange(min=1))
def claims(settings: Settings, since: str | None, count: int) -> None:
    """Print the newest claims, and how many each replica holds."""
    with errors(), open_store(settings.store_url) as database:
        rows, per_replica = reads.recent_claims(
            database,
            since=None if since is None else _instant(since, "--since", database),
            limit=count,
        )
    table = Table(title=f"_voltro_schedule_claims ({len(rows)} newest)")
    for column in ("id", "replica", "claimed"):
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(row["id"], row["replica"], stamp(row["claimed_at"]))
    console = Console(width=max(Console().width, 120))
    console.print(table)
    console.print(f"claims per replica: {sum(per_replica.values())} in all")
    for replica, number in sorted(per_replica.items(), key=lambda item: (-item[1], item[0])):
        console.print(f"  {replica}: {number}")


@main.command()
@settings_options()
@click.argument("name")
@click.option("--since", required=True, help="Window start (ISO 8601, or 15m/2h/3d ago).")
@click.option("--until", required=True, help="Window end, excluded (ISO 8601 or relative).")
@click.option("--dry-run", is_flag=True, help="Only say what would be published.")
@click.option("--yes", is_flag=True, help="Publish without asking.")
def backfill(
    settings: Settings, name: str, since: str, until: str, dry_run: bool, yes: bool
) -> None:
    """Publish the occurrences of schedule NAME in [--since, --until) that have no run row.

    Each goes through the coordination gate like any occurrence beat fires (run rows with
    reason ``backfill``): an occurrence already recorded, by beat or by an earlier backfill,
    is never published again. Needs -A proj (the schedule and the broker).
    """
    app = _required_app("backfill")
    with errors(), open_store(settings.store_url) as database:
        entries = load_schedule(app, settings).entries
        entry = _entry(entries, name)
        start, end = _instant(since, "--since", database), _instant(until, "--until", database)
        if end <= start:
            raise click.ClickException(f"--until ({end}) must be after --since ({start})")
        _not_ahead(end, "--until", database)
        _retained(start, "--since", database, settings)
        instants = list(
            itertools.islice(occurrences_between(entry.spec, start, end), MAX_BACKFILL_WINDOW + 1)
        )
        if len(instants) > MAX_BACKFILL_WINDOW:
            raise click.ClickException(
                f"the window holds more than {MAX_BACKFILL_WINDOW:,} occurrences of {name}: "
                "narrow it"
            )
        recorded = reads.recorded_keys(database, name, since=start, until=end)
        todo = [at for at in instants if occurrence_key(name, at) not in recorded]
        click.echo(
            f"{name}: {len(instants)} occurrences in [{start.isoformat()}, {end.isoformat()}), "
            f"{len(instants) - len(todo)} already recorded, {len(todo)} to publish"
        )
        if dry_run:
            for at in todo:
                click.echo(occurrence_key(name, at))
            return
        if not todo:
            return
        if not yes:
            click.confirm(f"Publish {len(todo)} occurrences of {name}?", abort=True)
        published = _publish(app, settings, database, entries, entry, todo, Reason.BACKFILL)
    click.echo(
        f"{name}: published {len(published)}"
        + (
            f"; {len(todo) - len(published)} were recorded meanwhile"
            if len(published) < len(todo)
            else ""
        )
    )


@main.command("run")
@settings_options()
@click.argument("name")
@click.option("--at", default=None, help="Instead of now (ISO 8601, or 15m/2h/3d ago).")
def run_now(settings: Settings, name: str, at: str | None) -> None:
    """Publish one occurrence of schedule NAME: the newest at or before now (or --at).

    Claimed through the coordination gate like any occurrence (run row with reason
    ``manual``): if it is recorded already, nothing is published and the exit code is 1.
    Needs -A proj.
    """
    app = _required_app("run")
    with errors(), open_store(settings.store_url) as database:
        entries = load_schedule(app, settings).entries
        entry = _entry(entries, name)
        when = (
            database.time()
            if at is None
            else _not_ahead(_instant(at, "--at", database), "--at", database)
        )
        instant = latest_at_or_before(entry.spec, when)
        if instant is None:
            raise click.ClickException(f"schedule {name!r} has no occurrence at or before {when}")
        _retained(instant, "--at" if at is not None else "the occurrence", database, settings)
        key = occurrence_key(name, instant)
        if not _publish(app, settings, database, entries, entry, [instant], Reason.MANUAL):
            (row,) = reads.recent_runs(
                database, schedule=name, since=instant, until=instant + MICROSECOND, limit=1
            )
            raise click.ClickException(
                f"{key}: already recorded ({row['status']}); not published again"
            )
    click.echo(f"{key}: published, task id {task_id_for(key)}")


@db.command("check")
@settings_options()
def db_check(settings: Settings) -> None:
    """Is the schema current, and can this role read every table? Exit code 1 if not."""
    with errors():
        database = existing(Database.open(settings.store_url))
        try:
            report = reads.check_schema(database)
        finally:
            database.dispose()
    click.echo(f"store {hide_password(settings.store_url)}")
    if report.current == report.head:
        click.echo(f"schema: {report.current} (current)")
    else:
        click.echo(
            f"schema: {report.current or 'none'}, newest is {report.head}: "
            "run `voltro-beat db upgrade`"
        )
    for table, error in report.tables.items():
        click.echo(f"{table}: {'readable' if error is None else error}")
    if not report.ok:
        raise SystemExit(1)


def _required_app(command: str) -> Celery:
    app = current_app()
    if app is None:
        raise click.ClickException(
            f"{command} needs the Celery app (-A proj): its schedules and its broker"
        )
    return app


def _known_schedule(name: str, database: Database, settings: Settings) -> None:
    """Refuse ``name`` unless it is a schedule of the app (-A) or one with run rows."""
    app = current_app()
    recorded = reads.schedule_names(database)
    defined = [] if app is None else list(load_schedule(app, settings).entries)
    if name not in recorded and name not in defined:
        known = ", ".join(sorted({*recorded, *defined})) or "none"
        raise click.ClickException(
            f"no schedule named {name!r} in the run table"
            + ("" if app is None else " nor in the app's beat_schedule")
            + f" (schedules: {known})"
        )


def _entry(entries: Mapping[str, Entry], name: str) -> Entry:
    if name not in entries:
        known = ", ".join(sorted(entries)) or "none"
        raise click.ClickException(
            f"unknown schedule {name!r} (the app's beat_schedule has: {known})"
        )
    return entries[name]


def _publish(
    app: Celery,
    settings: Settings,
    database: Database,
    entries: Mapping[str, Entry],
    entry: Entry,
    instants: Sequence[datetime],
    reason: Reason,
) -> list[str]:
    on_demand = OnDemand.open(app, settings, database, entries)
    try:
        # A bar only where there is something to wait for (more than one broker chunk), on a
        # terminal.
        console = Console(stderr=True)
        quiet = len(instants) <= CHUNK or not console.is_terminal
        with Progress(console=console, disable=quiet) as bar:
            task = bar.add_task(f"{entry.name}", total=len(instants))
            return on_demand.publish(
                entry, instants, reason, progress=lambda done: bar.advance(task, done)
            )
    finally:
        on_demand.close()


def _instant(text: str, option: str, database: Database) -> datetime:
    """An ISO 8601 instant (naive means UTC), ``now``, or ``15m`` / ``2h`` / ``3d`` ago: now
    on the database's clock, as the replicas read it (guarantee 9), not this host's."""
    text = text.strip()
    ago = _AGO.match(text)
    if ago or text == "now":
        # Whole seconds: a window given as "2h" to "1h" starts and ends on a second.
        current = database.time().replace(microsecond=0)
        return current - timedelta(**{_UNITS[ago[2]]: float(ago[1])}) if ago else current
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise click.ClickException(
            f"{option}: {text!r} is not an ISO 8601 instant (2026-01-31T12:00:00Z), "
            "'now', or a time ago (90s, 15m, 2h, 3d)"
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _not_ahead(at: datetime, option: str, database: Database) -> datetime:
    """``at``, unless it is later than now on the database's clock: occurrences still to come
    are beat's to publish at their instant, not an operator's to publish early."""
    current = database.time()
    if at > current:
        raise click.ClickException(
            f"{option} {at.isoformat()} is ahead of the database's clock ({current.isoformat()}):"
            " only past occurrences can be published by hand"
        )
    return at


def _retained(at: datetime, option: str, database: Database, settings: Settings) -> datetime:
    """``at``, unless the runs retention removes (or removed) run rows that old: an occurrence
    whose row is gone could be published again after it ran, so it is refused (the store
    refuses its claim too)."""
    floors = [database.time() - settings.runs_ttl, reads.swept_before(database)]
    floor = max(f for f in floors if f is not None)
    if at < floor:
        hours = settings.runs_ttl.total_seconds() / 3600
        raise click.ClickException(
            f"{option} {at.isoformat()} is older than the run table keeps its rows "
            f"(voltro_beat_runs_ttl_hours = {hours:g}, swept up to {floor.isoformat()}): an "
            "occurrence there could be published again after it ran; "
            f"choose an instant at or after {floor.isoformat()}"
        )
    return at


def _lag(row: Mapping[str, Any]) -> float | None:
    published = row["published_at"]
    return None if published is None else (published - row["scheduled_at"]).total_seconds()


def _json_value(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot encode {type(value).__name__}")


main.add_command(schedules)
