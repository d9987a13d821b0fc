"""Publishers outside beat, racing it: a platform's external trigger and an operator's
backfill, each a short-lived process of its own (a CronJob's Job, a ``voltro-beat backfill``)
that can be killed like any other.

Both publish through :class:`voltro_beat.on_demand.OnDemand` on the simulated store and broker:
the trigger with :class:`voltro_beat.trigger.Trigger` (its arrival read on the platform's own
clock, sometimes twice for one instant, as a CronJob can start two Jobs), the backfill with the
same window ``voltro-beat backfill`` would compute (the occurrences of a recent window, on the
database's clock).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery import Celery

from tests.sim.broker import SimBroker
from tests.sim.runner import SimRunner
from tests.sim.store import SimStore, StoreFaults
from tests.sim.world import Process, World
from voltro_beat.beat_schedule import load_schedule
from voltro_beat.clock import Clock, ClockMode
from voltro_beat.config import Settings
from voltro_beat.exceptions import VoltroBeatError
from voltro_beat.occurrences import occurrences_between
from voltro_beat.on_demand import OnDemand
from voltro_beat.status import Reason
from voltro_beat.trigger import Trigger


def _on_demand(
    world: World, store: SimStore, broker: SimBroker, process: Process, conf: dict[str, Any]
) -> tuple[Celery, Settings, OnDemand]:
    app = Celery(process.name, set_as_current=False)
    app.conf.update(conf)
    # The replicas upgraded the schema at boot: a Job or a backfill need not, every time.
    settings = Settings.resolve(
        app.conf, overrides={"replica": process.name, "migrate": False}, environ={}
    )
    entries = load_schedule(app, settings).entries
    on_demand = OnDemand(
        settings,
        store.store(process, process.name, StoreFaults(latency=0.001)),
        broker.publisher(process, settings.publish_timeout * 3),
        entries,
        clock=Clock(ClockMode.DATABASE, local=process.wall, monotonic=process.monotonic),
        runner=SimRunner(process),
    )
    return app, settings, on_demand


def trigger_job(
    world: World, store: SimStore, broker: SimBroker, conf: dict[str, Any], name: str, n: int
) -> Process:
    """One Job of the platform: fires ``name`` once, at its own clock's now."""
    process = world.process(f"job{n}", offset=world.rng.uniform(-0.5, 0.5))

    def fire() -> None:
        app, settings, on_demand = _on_demand(world, store, broker, process, conf)
        trigger = Trigger(app, settings, on_demand=on_demand)
        try:
            fired = trigger.fire(name, arrival=process.wall())
            world.log(process.name, "triggered", "published" if fired.published else "had it")
        except VoltroBeatError as exc:
            world.log(process.name, "trigger failed", f"{type(exc).__name__}: {exc}")
        finally:
            trigger.close()
        process.exit()

    process.spawn(fire, "trigger", main=True)
    return process


def backfill(
    world: World,
    store: SimStore,
    broker: SimBroker,
    conf: dict[str, Any],
    name: str,
    window: float,
    n: int,
) -> Process:
    """``voltro-beat backfill NAME --since now-window --until now``."""
    process = world.process(f"backfill{n}")

    def run() -> None:
        _, _, on_demand = _on_demand(world, store, broker, process, conf)
        entry = on_demand.dispatch.entries[name]
        end = on_demand.store.database.time()
        instants = list(occurrences_between(entry.spec, end - timedelta(seconds=window), end))
        try:
            published = on_demand.publish(entry, instants, Reason.BACKFILL)
            world.log(process.name, "backfilled", f"{len(published)} of {len(instants)}")
        except VoltroBeatError as exc:
            world.log(process.name, "backfill failed", f"{type(exc).__name__}: {exc}")
        finally:
            on_demand.close()
            on_demand.store.close()
        process.exit()

    process.spawn(run, "backfill", main=True)
    return process
