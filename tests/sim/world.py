"""The simulated world: one virtual timeline, processes made of greenlets, their clocks.

Every piece of real code the simulation runs (the engine, the store, the worker's ledger)
runs in a greenlet of a simulated process. It gives the timeline back at each *yield point*
(a store statement's round trip, a broker write, a runner's sleep, a wait for a lock or a
future), and the world resumes whichever greenlet is due next, in virtual time, ties broken in
the order they were scheduled. One seeded generator decides every latency and fault, so a seed
replays the same run step for step.

A process can be paused (its greenlets resume only after the pause), killed (they never
resume; whatever they would have done next, they do not) or sent SIGTERM (delivered to its
main greenlet at its current yield point, as a signal handler runs between two bytecodes,
unless the process holds its signals, :meth:`Process.holding`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from random import Random
from typing import Any

import greenlet


class Killed(BaseException):
    """Raised in a killed process's code if it ever runs again (it must not act)."""


class Stop(Exception):
    """The world has ended: raised into parked greenlets at teardown."""


#: The value a parked main greenlet is resumed with when a signal arrives.
_SIGNAL = object()


@dataclass
class Event:
    """A line of the trace: what happened, when, to whom."""

    t: float
    process: str
    kind: str
    detail: str = ""
    keys: tuple[str, ...] = ()

    def __str__(self) -> str:
        keys = f" [{', '.join(self.keys[:4])}{', ...' if len(self.keys) > 4 else ''}]"
        return f"{self.t:10.4f}  {self.process:<8} {self.kind:<22} {self.detail}" + (
            keys if self.keys else ""
        )


@dataclass
class Pause:
    start: float
    end: float


class Process:
    """A simulated OS process: greenlets, a clock of its own, a fate."""

    def __init__(
        self,
        world: World,
        name: str,
        *,
        offset: float = 0.0,
        drift: float = 0.0,
    ) -> None:
        self.world = world
        self.name = name
        #: Local wall clock minus the true time at t=0, and its rate error (both clocks).
        self.offset = offset
        self.drift = drift
        self._mono0 = world.rng.uniform(1_000.0, 100_000.0)
        self.alive = True
        self.booted_at = world.t
        self.died_at: float | None = None
        #: Until when its greenlets wait, whatever they wait for.
        self.paused_until = 0.0
        self.pauses: list[Pause] = []
        self.main: greenlet.greenlet | None = None
        #: What runs when SIGTERM reaches the main greenlet (Celery's handler).
        self.on_sigterm: Callable[[], None] | None = None
        self._holding = 0
        self._pending_signal = False
        self.exited = False
        #: It was sent SIGTERM: it is on its way out, however long that takes.
        self.stopping = False

    # -- clocks ---------------------------------------------------------------------------

    def monotonic(self) -> float:
        return self._mono0 + self.world.t * (1.0 + self.drift)

    def wall(self) -> datetime:
        return self.world.start + timedelta(seconds=self.world.t * (1.0 + self.drift) + self.offset)

    # -- fate -----------------------------------------------------------------------------

    def spawn(self, fn: Callable[[], Any], name: str = "", *, main: bool = False) -> None:
        self.world.spawn(self, fn, name, main=main)

    def pause(self, seconds: float) -> None:
        start = max(self.world.t, self.paused_until)
        self.paused_until = start + seconds
        self.pauses.append(Pause(start, self.paused_until))
        self.world.log(self.name, "paused", f"{seconds:.3f} s")

    def kill(self) -> None:
        if not self.alive:
            return
        self.alive = False
        self.died_at = self.world.t
        self.world.log(self.name, "killed")
        self.world.on_death(self)

    def sigterm(self) -> None:
        """Deliver SIGTERM: at the main greenlet's yield point, or once it stops holding."""
        if not self.alive or self.main is None or self.main.dead:
            return
        self.world.log(self.name, "sigterm")
        self.stopping = True
        self.world.interrupt(self.main)

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Hold SIGTERM for the block (:meth:`voltro_beat.runner.Runner.hold_signals`)."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
            if not self._holding and self._pending_signal and self.alive:
                self._pending_signal = False
                self.handle_signal()

    def handle_signal(self) -> None:
        """Run the SIGTERM handler here (in the main greenlet), or once the signals it holds
        are let go."""
        if self._holding:
            self._pending_signal = True
            self.world.log(self.name, "sigterm held")
            return
        if self.on_sigterm is not None:
            self.on_sigterm()

    def exit(self) -> None:
        """The process ended on its own (after SIGTERM)."""
        if self.alive:
            self.alive = False
            self.exited = True
            self.died_at = self.world.t
            self.world.log(self.name, "exited")
            self.world.on_death(self)

    def paused_at(self, t: float) -> bool:
        return any(p.start <= t < p.end for p in self.pauses)


class Condition:
    """Greenlets waiting for something another greenlet makes true."""

    def __init__(self, world: World) -> None:
        self.world = world
        self._waiters: list[tuple[greenlet.greenlet, object]] = []

    def wait(self, timeout: float | None = None) -> bool:
        """Park until :meth:`notify` (True) or ``timeout`` virtual seconds (False)."""
        world = self.world
        me = greenlet.getcurrent()
        token = world.park_token(me)
        self._waiters.append((me, token))
        if timeout is not None:
            world.schedule(world.t + timeout, me, token, False)
        return bool(world.yield_())

    def notify_all(self) -> None:
        waiters, self._waiters = self._waiters, []
        for g, token in waiters:
            self.world.schedule(self.world.t, g, token, True)


class SimFuture(Future[None]):
    """A future whose ``result()`` parks the calling greenlet instead of blocking the thread."""

    def __init__(self, world: World) -> None:
        super().__init__()
        self._done = Condition(world)

    def set_result(self, result: None) -> None:
        super().set_result(result)
        self._done.notify_all()

    def set_exception(self, exception: BaseException | None) -> None:
        super().set_exception(exception)
        self._done.notify_all()

    def result(self, timeout: float | None = None) -> None:
        while not self.done():
            self._done.wait()
        return super().result()


@dataclass
class World:
    """The timeline: virtual seconds since :attr:`start`, and what is due when."""

    seed: int
    start: datetime
    rng: Random = field(init=False)
    t: float = 0.0
    trace: list[Event] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    #: Called with each process that dies (killed or exited).
    deaths: list[Callable[[Process], None]] = field(default_factory=list)
    steps: int = 0
    #: From this virtual second on, no fault is injected any more (the calm spell).
    calm_at: float = float("inf")
    #: Exceptions that escaped a greenlet (a bug of the code under test or of the harness).
    crashes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = Random(self.seed)
        self._heap: list[tuple[float, int, greenlet.greenlet, object, Any]] = []
        self._seq = itertools.count()
        self._tokens: dict[greenlet.greenlet, object] = {}
        self._loop: greenlet.greenlet | None = None

    # -- time -----------------------------------------------------------------------------

    @property
    def faulty(self) -> bool:
        """Whether faults may happen now."""
        return self.t < self.calm_at

    def now(self) -> datetime:
        """The true time: the database's clock."""
        return self.start + timedelta(seconds=self.t)

    def log(self, process: str, kind: str, detail: str = "", keys: tuple[str, ...] = ()) -> None:
        self.trace.append(Event(self.t, process, kind, detail, keys))

    # -- greenlets ------------------------------------------------------------------------

    def process(self, name: str, **clock: float) -> Process:
        p = Process(self, name, **clock)
        self.processes.append(p)
        return p

    def spawn(
        self, process: Process, fn: Callable[[], Any], name: str = "", *, main: bool = False
    ) -> None:
        def run() -> None:
            try:
                fn()
            except Killed:
                pass
            except SystemExit:
                process.exit()
            except Stop:
                pass
            except greenlet.GreenletExit:
                pass
            except BaseException as exc:  # escaped the code under test: a finding
                if not process.alive:
                    return  # a dead process's code unwinding at teardown
                import traceback

                self.crashes.append(
                    f"{process.name}/{name}: {type(exc).__name__}: {exc}\n"
                    + "".join(traceback.format_exception(exc)[-6:])
                )
                self.log(process.name, "crash", f"{name}: {type(exc).__name__}: {exc}")

        g = greenlet.greenlet(run, parent=self._loop or greenlet.getcurrent())
        g.process = process  # type: ignore[attr-defined]
        g.task_name = name  # type: ignore[attr-defined]
        if main:
            process.main = g
        self.schedule(self.t, g, self.park_token(g), None)

    def park_token(self, g: greenlet.greenlet) -> object:
        token = object()
        self._tokens[g] = token
        return token

    def schedule(self, at: float, g: greenlet.greenlet, token: object, value: Any) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), g, token, value))

    def yield_(self) -> Any:
        """Give the timeline back; return the value this greenlet is resumed with."""
        me = greenlet.getcurrent()
        assert self._loop is not None and me is not self._loop, "yield outside a process"
        process: Process = me.process  # type: ignore[attr-defined]
        if not process.alive:
            raise Killed()
        while True:
            value = self._loop.switch()
            if not process.alive:
                raise Killed()
            if value is _SIGNAL:
                # A signal handler runs on top of whatever the main greenlet was doing; then
                # the interrupted wait goes on (PEP 475), unless the handler raised.
                token = self._resume_token
                process.handle_signal()
                self._tokens[me] = token
                continue
            return value

    def sleep(self, seconds: float) -> None:
        """Park the current greenlet for ``seconds`` of virtual time."""
        me = greenlet.getcurrent()
        self.schedule(self.t + max(0.0, seconds), me, self.park_token(me), None)
        self.yield_()

    def interrupt(self, g: greenlet.greenlet) -> None:
        """Resume ``g`` with a signal as soon as its process runs, wherever it is parked then;
        its pending wake-up stays valid afterwards."""
        self.schedule(self.t, g, _INTERRUPT, None)

    def on_death(self, process: Process) -> None:
        for hook in self.deaths:
            hook(process)

    # -- the loop -------------------------------------------------------------------------

    def run(self, until: float, *, on_step: Callable[[], None] | None = None) -> None:
        """Run everything due up to virtual second ``until``."""
        self._loop = greenlet.getcurrent()
        while self._heap and self._heap[0][0] <= until:
            at, seq, g, token, value = heapq.heappop(self._heap)
            if g.dead:
                continue
            process: Process = g.process  # type: ignore[attr-defined]
            if not process.alive:
                continue
            if token is _INTERRUPT:
                if process.paused_until > at:
                    heapq.heappush(self._heap, (process.paused_until, seq, g, token, value))
                    continue
                if not g:  # not started yet: once it is parked somewhere
                    heapq.heappush(self._heap, (at, next(self._seq), g, token, value))
                    continue
                # Wherever it is parked now, it takes the signal there, then waits on.
                resume_token = self._tokens.get(g)
                value = _SIGNAL
            elif self._tokens.get(g) is not token:
                continue  # superseded: woken otherwise, or interrupted and re-parked
            else:
                resume_token = token
            if process.paused_until > at:
                heapq.heappush(self._heap, (process.paused_until, seq, g, token, value))
                continue
            self.t = max(self.t, at)
            self._resume_token = resume_token
            self.steps += 1
            if g:
                g.switch(value)
            else:
                g.switch()
            if on_step is not None:
                on_step()
        self.t = max(self.t, until)

    def teardown(self) -> None:
        """End every parked greenlet: its code sees :class:`Killed` at its yield point and
        cannot act any more (every yield point raises it again)."""
        for p in self.processes:
            p.alive = False
        parked = [g for g in self._tokens if g]
        self._heap.clear()
        self._tokens.clear()
        for g in parked:
            if g:
                g.throw(Killed())


_INTERRUPT = object()
