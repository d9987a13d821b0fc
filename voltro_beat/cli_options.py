"""What every ``voltro-beat`` command shares: ``-A`` and ``--store`` resolved into settings, the
store opened for reading, store and configuration errors as one line, instants as printed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import click
from celery import Celery

from voltro_beat.config import DEFAULT_STORE_URL, Settings
from voltro_beat.exceptions import ConfigurationError, PublishError, StoreError
from voltro_beat.on_demand import load_app
from voltro_beat.store import reads
from voltro_beat.store.database import Database, hide_password


def app_option(*, required: bool = False) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``-A/--app`` as ``celery -A`` takes it (``proj``, ``proj.celery:app``; env
    VOLTRO_BEAT_CELERY_APP): loaded before the other options, left in ``click.Context.meta``.
    ``--celery-app`` is its older spelling."""
    return click.option(
        "-A",
        "--app",
        "--celery-app",
        "app_name",
        envvar="VOLTRO_BEAT_CELERY_APP",
        required=required,
        expose_value=False,
        is_eager=True,
        callback=_load_app,
        help="The Celery app (proj, proj.celery:app; env VOLTRO_BEAT_CELERY_APP): its "
        "voltro_beat_* settings and its beat_schedule.",
    )


def _load_app(ctx: click.Context, _param: click.Parameter, name: str | None) -> None:
    if name is None:
        return
    try:
        ctx.meta[APP] = load_app(name)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None
    ctx.meta[APP_NAME] = name


#: Where ``-A`` leaves the loaded app, and the name it was given, for the command
#: (``click.Context.meta``).
APP = "voltro_beat.app"
APP_NAME = "voltro_beat.app_name"


def current_app() -> Celery | None:
    app: Celery | None = click.get_current_context().meta.get(APP)
    return app


def settings_options(
    *, app_required: bool = False
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``-A proj`` and ``--store URL``: the command is given ``settings``, resolved as beat
    resolves them (:meth:`Settings.resolve`) with ``--store`` an explicit value above the
    environment and the app."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        command = click.option(
            "--store",
            "settings",
            default=None,
            metavar="URL",
            callback=lambda _ctx, _param, store: settings_of(store),
            help="Store URL; without it env VOLTRO_BEAT_STORE_URL, else the app's (-A) "
            f"voltro_beat_store_url, else {DEFAULT_STORE_URL}.",
        )(command)
        return app_option(required=app_required)(command)

    return decorate


def settings_of(store: str | None = None) -> Settings:
    """The settings of the app (-A; without it, the environment's and the defaults), with
    ``store`` (``--store``) as an explicit store URL."""
    app = current_app()
    with errors():
        return Settings.resolve(
            {} if app is None else app.conf,
            overrides={} if store is None else {"store_url": store},
        )


def stamp(at: datetime | None) -> str:
    return "" if at is None else f"{at:%Y-%m-%d %H:%M:%S.%f}"[:-3]


@contextmanager
def errors() -> Iterator[None]:
    try:
        yield
    except (ConfigurationError, PublishError) as exc:
        raise click.ClickException(str(exc)) from exc
    except StoreError as exc:
        # A store no retry cures says what to check, as beat does at boot.
        hint = "" if exc.check is None else f"; check {exc.check}"
        raise click.ClickException(f"{exc}{hint}") from exc


@contextmanager
def open_store(store_url: str) -> Iterator[Database]:
    """The store, with voltro_beat's tables in it (else one line suggesting the upgrade)."""
    database = existing(Database.open(store_url))
    try:
        missing = reads.missing_tables(database)
        if missing:
            raise click.ClickException(
                f"store {hide_password(store_url)} has no {', '.join(missing)}: "
                "run `voltro-beat db upgrade`"
            )
        yield database
    finally:
        database.dispose()


def existing(database: Database) -> Database:
    """``database``, unless it is a SQLite file that does not exist: connecting would create
    it, and a command that reads the store never creates one."""
    path = database.file
    if path is not None and not Path(path).exists():
        database.dispose()
        raise click.ClickException(
            f"store {database.display_url}: no such file (no beat has run with this store): "
            "start beat, run `voltro-beat db upgrade`, or name the store with --store or -A"
        )
    return database
