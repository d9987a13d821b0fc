"""An in-memory broker with faults, the publisher beat writes to it with, and its queue.

A write (:meth:`SimPublisher.publish`, the :class:`voltro_beat.publisher.Publisher` contract)
takes a round trip of virtual time and then, as the seed decides: the broker takes every
message; refuses some (a RabbitMQ nack, a Redis command error); the connection is cut before
anything went in; it is cut after the broker took some of them, before its answer came back
(Redis's ``EXEC`` answered into a dead socket, RabbitMQ's confirms lost with it); or the write
stalls, past the publisher's write timeout if long enough (the broker takes the messages when
the stall ends, and the publisher has long given up). The worker's side takes messages with a
late acknowledgement: a message a dead worker held goes back to the queue after a visibility
timeout, and now and then the broker delivers one twice.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from tests.sim.observer import Call, Observer
from tests.sim.world import Condition, Process, World
from voltro_beat.exceptions import PublishError
from voltro_beat.schedules import Entry


@dataclass
class BrokerFaults:
    latency: float = 0.001
    #: Chances per write.
    refuse: float = 0.0
    cut_before: float = 0.0
    cut_after: float = 0.0
    stall: float = 0.0
    #: Longest stall, in write timeouts (above 1: the publisher gives up first).
    stall_max: float = 1.5
    #: Chance per delivery that the broker delivers the message a second time.
    redeliver: float = 0.0
    #: Seconds before a dead worker's unacknowledged message is delivered again.
    visibility: float = 3.0


@dataclass
class Message:
    key: str
    task_id: str
    name: str


class SimBroker:
    """The broker's queue, on the world's timeline."""

    def __init__(self, world: World, observer: Observer, faults: BrokerFaults) -> None:
        self.world = world
        self.observer = observer
        self.faults = faults
        self.queue: collections.deque[Message] = collections.deque()
        self._ready = Condition(world)
        #: Messages a worker took and has not acknowledged, by worker.
        self.unacked: dict[str, list[Message]] = collections.defaultdict(list)
        #: The broker's own timers (redeliveries, stalled writes landing).
        self.process = world.process("broker")
        world.deaths.append(self._on_death)

    def publisher(self, process: Process, write_timeout: timedelta) -> SimPublisher:
        return SimPublisher(self, process, write_timeout.total_seconds())

    def take(self, messages: Sequence[Message], call: Call) -> None:
        for message in messages:
            self.observer.accept(call, message.key)
            self.queue.append(message)
        if messages:
            self._ready.notify_all()

    # -- the worker's side -----------------------------------------------------------------

    def get(self, worker: Process) -> Message:
        while not self.queue:
            self._ready.wait()
        message = self.queue.popleft()
        self.unacked[worker.name].append(message)
        if self.world.faulty and self.world.rng.random() < self.faults.redeliver:
            self.world.log("broker", "redelivers", "", (message.key,))
            self.queue.append(message)
            self._ready.notify_all()
        return message

    def ack(self, worker: Process, message: Message) -> None:
        held = self.unacked[worker.name]
        if message in held:
            held.remove(message)

    def _on_death(self, process: Process) -> None:
        lost = self.unacked.pop(process.name, [])
        if not lost:
            return

        def requeue() -> None:
            self.world.sleep(self.faults.visibility)
            self.world.log("broker", "requeues", f"{len(lost)} of {process.name}")
            self.queue.extend(lost)
            self._ready.notify_all()

        self.process.spawn(requeue, "requeue")

    def pending(self) -> list[Message]:
        """The messages still here: queued, or taken by a worker and not acknowledged."""
        return [*self.queue, *(m for held in self.unacked.values() for m in held)]


class SimPublisher:
    """Beat's publisher on the simulated broker, for one replica process."""

    def __init__(self, broker: SimBroker, process: Process, write_timeout: float) -> None:
        self.broker = broker
        self.process = process
        self.world = broker.world
        self.write_timeout = write_timeout

    def forget(self, name: str) -> None:
        pass

    def prepare(self, entries: Sequence[Entry]) -> None:
        """Nothing to build."""

    def reset(self) -> None:
        """No connection to drop."""

    def publish(self, messages: Sequence[tuple[Entry, str, str]]) -> dict[int, str]:
        world, faults, rng = self.world, self.broker.faults, self.world.rng
        batch = [Message(key, task_id, entry.name) for entry, key, task_id in messages]
        call = self.broker.observer.call(self.process, [m.key for m in batch])
        world.sleep(rng.expovariate(1.0 / faults.latency))
        roll = rng.random() if world.faulty else 1.0
        if roll < faults.cut_before:
            call.mode = "cut before"
            raise PublishError("simulated: connection cut", confirmed=0)
        roll -= faults.cut_before
        if roll < faults.stall:
            stall = rng.uniform(0.0, faults.stall_max) * self.write_timeout
            if stall >= self.write_timeout:
                call.mode = f"stalled {stall:.2f} s, past the write timeout"
                call.answer_lost = True
                landing = stall - self.write_timeout

                def land() -> None:
                    world.sleep(landing)
                    self.broker.take(batch, call)

                world.sleep(self.write_timeout)
                self.broker.process.spawn(land, "stalled write")
                raise PublishError("simulated: write timed out", confirmed=0)
            call.mode = f"stalled {stall:.2f} s"
            world.sleep(stall)
        roll -= faults.stall
        if roll < faults.cut_after:
            taken = rng.randint(1, len(batch))
            confirmed = rng.randint(0, taken - 1)
            call.mode = f"cut after {taken} taken, {confirmed} confirmed"
            call.answer_lost = True
            self.broker.take(batch[:taken], call)
            world.sleep(rng.expovariate(1.0 / faults.latency))
            raise PublishError("simulated: connection cut", confirmed=confirmed)
        roll -= faults.cut_after
        refused: dict[int, str] = {}
        if roll < faults.refuse:
            refused = {
                i: "simulated: queue full (nack)" for i in range(len(batch)) if rng.random() < 0.5
            }
            call.mode = f"refused {len(refused)}"
        self.broker.take([m for i, m in enumerate(batch) if i not in refused], call)
        world.sleep(rng.expovariate(1.0 / faults.latency))
        return refused
