"""Celery workers on the virtual timeline, recording through the real ledger.

Each worker process has a Celery app of its own with ``voltro_beat.attach(app)`` (its runner,
its clock and its run writer on the simulated store), and runs the broker's messages one at a
time with Celery's own tracer (``Task.apply``): the task signals, the start claim and the
duplicate guard are the real ones. The body tells the observer when it starts and ends, takes
some virtual time, and now and then raises.
"""

from __future__ import annotations

from typing import Any

import greenlet
from celery import Celery

from tests.sim.broker import SimBroker
from tests.sim.observer import Observer
from tests.sim.runner import SimRunner
from tests.sim.store import SimStore
from tests.sim.world import World
from voltro_beat import attach
from voltro_beat.ledger import Transition
from voltro_beat.signals import OCCURRENCE_HEADER
from voltro_beat.status import TERMINAL
from voltro_beat.store.run_writer import RunWriter

TASK = "sim.job"


class GreenletLocal:
    """``threading.local`` for greenlets: the run writer keeps a connection per "thread"."""

    def __init__(self) -> None:
        object.__setattr__(self, "_values", {})

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values").get(greenlet.getcurrent(), {})
        try:
            return values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        values = object.__getattribute__(self, "_values")
        values.setdefault(greenlet.getcurrent(), {})[name] = value


class ObservedWriter(RunWriter):
    """The worker's run writer as it is, telling the observer which runs' ends it recorded."""

    def __init__(self, observer: Observer, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._observer = observer

    def advance(self, move: Transition, **kwargs: Any) -> bool:
        moved = super().advance(move, **kwargs)
        key = kwargs.get("key")
        if moved and key is not None and move.status in TERMINAL:
            self._observer.ended(key)
        return moved


class SimWorker:
    """One worker process: ``concurrency`` messages at a time (a greenlet each, as a pool's
    children would be; killing the worker kills them all)."""

    def __init__(
        self,
        world: World,
        observer: Observer,
        broker: SimBroker,
        store: SimStore,
        name: str,
        *,
        conf: dict[str, Any],
        fail_chance: float,
        long_bodies: frozenset[str],
        max_duration: float,
        concurrency: int,
    ) -> None:
        self.world = world
        self.observer = observer
        self.broker = broker
        self.process = world.process(name, offset=world.rng.uniform(-2, 2))
        self.fail_chance = fail_chance
        self.max_duration = max_duration
        self.long_bodies = long_bodies
        app = Celery(name, set_as_current=False)
        app.conf.update(conf)
        process = self.process
        sim = self

        @app.task(name=TASK, bind=True, shared=False)
        def job(task: Any) -> None:
            key = task.request.headers[OCCURRENCE_HEADER]
            execution = observer.started(key, process)
            name = task.request.headers["periodic_task_name"]
            if name in sim.long_bodies:
                world.sleep(world.rng.uniform(0.0, sim.max_duration))
            else:
                world.sleep(world.rng.expovariate(50.0))
            if world.rng.random() < sim.fail_chance:
                observer.finished(execution, ok=False)
                raise RuntimeError("simulated failure of the body")
            observer.finished(execution, ok=True)

        app.finalize()
        writer = ObservedWriter(observer, store.database(process), local=GreenletLocal)
        attach(app, runner=SimRunner(process), now=process.wall, writer=writer)
        self.task = app.tasks[TASK]
        for i in range(concurrency):
            process.spawn(self._consume, f"consumer {i}", main=i == 0)

    def _consume(self) -> None:
        while True:
            message = self.broker.get(self.process)
            self.observer.deliveries += 1
            self.world.log(self.process.name, "delivery", "", (message.key,))
            self.task.apply(
                task_id=message.task_id,
                headers={OCCURRENCE_HEADER: message.key, "periodic_task_name": message.name},
            )
            self.broker.ack(self.process, message)
