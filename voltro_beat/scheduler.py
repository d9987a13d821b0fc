"""The ``celery.beat.Scheduler`` subclass behind ``celery beat -S voltro``: Celery's glue.

It builds the firing engine (:mod:`voltro_beat.engine`) from the app's settings and
``beat_schedule`` (with the entries Celery's own beat adds), runs one engine step per tick and
turns the instant the engine wants to run again into the seconds beat sleeps, prints the boot
banner, and closes the engine when beat stops. Everything that decides what is due and
publishes it is the engine's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery import beat

from voltro_beat import logs, retention
from voltro_beat.beat_schedule import BeatSchedule, load_schedule
from voltro_beat.clock import Clock
from voltro_beat.config import Settings
from voltro_beat.engine import CLOSE_WAIT, Engine
from voltro_beat.engine.guard import DEFAULT_OVERLAP_TIMEOUT
from voltro_beat.engine.singletons import Singletons
from voltro_beat.exceptions import ConfigurationError, StoreError
from voltro_beat.metrics import Metrics
from voltro_beat.publisher import Publisher
from voltro_beat.schedules import Entry
from voltro_beat.singletons import load_singletons
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.database import Database

logger = logging.getLogger(__name__)

#: The exit status of a beat whose configuration is invalid or whose store can never work
#: (sysexits.h's EX_CONFIG).
EX_CONFIG = 78


class VoltroScheduler(beat.Scheduler):
    """Active-active beat scheduler: every occurrence claimed in the store, published once.

    ``overrides`` are explicit settings (:meth:`Settings.resolve`), above the environment and
    the app's: Celery's beat gives none; voltro_beat.testing gives its store.
    """

    _settings: Settings
    _schedule: BeatSchedule
    _store: BeatStore
    _clock: Clock
    _engine: Engine
    #: What writes won occurrences to the broker (voltro_beat.testing records them instead).
    publisher_class: type[Publisher] = Publisher
    #: How long :meth:`close` waits to publish, on time, what it claimed ahead.
    close_wait: timedelta = CLOSE_WAIT

    def __init__(
        self, app: Any, *args: Any, overrides: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        self._configured = False
        self._closed = False
        self._overrides = overrides
        self._metrics = Metrics()
        # Celery builds a lazy instance for the banner: it must do no I/O.
        super().__init__(app, *args, **kwargs)

    # -- set-up ---------------------------------------------------------------------------

    def setup_schedule(self) -> None:
        """Parse settings and entries (raising ConfigurationError at boot), open the store
        and try it once (exiting if no retry can help it).

        A store that is down (or restarting) is not waited for: the first tick upgrades the
        schema and catches up, and retries both while the store is unreachable.
        """
        self._configure()
        if self._settings.log_json:
            logs.use_json()
        if self._settings.metrics_port is not None:
            self._serve_metrics(self._settings.metrics_port)
        logger.info(
            "voltro_beat: replica %s, store %s, coordination %s, %s",
            self._settings.replica,
            self._store.display_url,
            self._settings.coordination,
            self._schedule.counted(),
            extra=logs.fields(replica=self._settings.replica),
        )
        for warning, line in retention.announce(self._engine.upkeep.sweeper.policies):
            (logger.warning if warning else logger.info)("%s", line)
        self._try_store()

    def _try_store(self) -> None:
        """Exit (EX_CONFIG) on a store error no retry cures: a wrong password, an unknown
        database, host or role, a missing grant (with migrate, the schema upgrade is tried
        too). Any other error is left to the first tick's fail-closed retry. Raise
        ConfigurationError for a schedule both the app and the schedules table define."""
        database = self._store.database
        try:
            if self._settings.migrate:
                database.upgrade()
            else:
                database.probe()
            self._engine.live.check()
        except StoreError as exc:
            if exc.check is None:
                return
            logger.error("voltro_beat: cannot use the store, exiting: %s; check %s", exc, exc.check)
            self.close()
            raise SystemExit(EX_CONFIG) from None

    def _configure(self) -> None:
        if self._configured:
            return
        settings = Settings.resolve(self.app.conf, overrides=self._overrides)
        schedule = load_schedule(self.app, settings)
        database = Database.open(settings.store_url)
        clock = Clock(database.clock_mode(settings.clock), local=lambda: database.clock())
        store = BeatStore(database, replica=settings.replica)
        self._settings = settings
        self._schedule = schedule
        self._store = store
        self._clock = clock
        self._engine = Engine(
            settings=settings,
            entries=schedule.entries,
            store=store,
            publisher=self.publisher_class(self.app, write_timeout=settings.publish_timeout * 3),
            clock=clock,
            overlap_timeout=self._overlap_timeout,
            metrics=self._metrics,
            singletons=Singletons(load_singletons(self.app, settings), store, settings),
        )
        self._configured = True

    def _overlap_timeout(self, entry: Entry) -> timedelta:
        """The entry's own, else the task's hard time limit, else one hour."""
        if entry.overlap_timeout is not None:
            return entry.overlap_timeout
        task = self.app.tasks.get(entry.task)
        limit = getattr(task, "time_limit", None) or self.app.conf.task_time_limit
        return timedelta(seconds=limit) if limit else DEFAULT_OVERLAP_TIMEOUT

    def _serve_metrics(self, port: int) -> None:
        try:
            self._metrics.serve(port)
        except OSError as exc:
            # Publishing matters more than its metrics: run without them, and say so.
            logger.error(
                "voltro_beat: cannot serve metrics on port %d, running without them: %s",
                port,
                exc,
            )

    @property
    def info(self) -> str:
        """The banner's scheduler line (built without I/O)."""
        self._configure()
        return (
            f"voltro_beat: store {self._store.display_url}, "
            f"coordination {self._settings.coordination}, clock {self._clock.mode}, "
            f"replica {self._settings.replica}, {self._schedule.counted()}"
        )

    # -- the loop -------------------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One engine step; return the seconds to sleep. Never raises."""
        if self._closed:
            return float(self.max_interval)
        wake = self._engine.step()
        delay = (wake - self._clock.now()).total_seconds()
        return max(0.0, min(delay, float(self.max_interval)))

    def close(self) -> None:
        """Publish what is claimed and due within :attr:`close_wait`, leave the registry,
        then release the broker connection and the store; safe to call more than once."""
        if self._closed or not self._configured:
            self._closed = True
            return
        if not self._engine.close(wait=self.close_wait):
            # Celery's SIGTERM handler, in the middle of a tick: beat's service closes again
            # once the tick unwound (Engine.close).
            return
        self._closed = True
        self._engine.publisher.reset()
        self._store.close()
        self._metrics.close()


class Scheduler(VoltroScheduler):
    """The scheduler a ``celery beat`` process builds: ``-S voltro`` (the entry point) or
    ``-S voltro_beat.scheduler:Scheduler``.

    A configuration error at boot ends the process with exit code 78 and one block on the log
    naming what to fix; its traceback is logged at DEBUG. :class:`VoltroScheduler` itself
    raises the :class:`~voltro_beat.exceptions.ConfigurationError`.
    """

    def setup_schedule(self) -> None:
        try:
            super().setup_schedule()
        except ConfigurationError as exc:
            logger.critical(
                "voltro_beat: beat did not start: the configuration is invalid.\n"
                "    ConfigurationError: %s\n"
                "    Fix the entry or setting it names; run beat with --loglevel debug for the "
                "traceback.",
                exc,
            )
            logger.debug("voltro_beat: the configuration error's traceback", exc_info=exc)
            raise SystemExit(EX_CONFIG) from None

    @property
    def info(self) -> str:
        """The banner's line: Celery prints it before logging is set up, so a configuration
        error waits for :meth:`setup_schedule`, which reports it."""
        try:
            return super().info
        except ConfigurationError:
            return "voltro_beat: invalid configuration (beat will not start, see below)"
