"""A simulated process's runner (:class:`voltro_beat.runner.Runner`): its background work as
greenlets of the process, its sleeps on the virtual timeline, its signals held by the
process."""

from __future__ import annotations

import collections
from collections.abc import Callable
from contextlib import AbstractContextManager

from tests.sim.world import Condition, Process, SimFuture


class SimRunner:
    """One marker greenlet for submitted calls (in order), a greenlet per repeated call."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.world = process.world
        self._queue: collections.deque[tuple[Callable[[], None], SimFuture]] = collections.deque()
        self._idle = Condition(self.world)
        self._busy = False
        self._down = False

    def submit(self, fn: Callable[[], None]) -> SimFuture:
        if self._down:
            raise RuntimeError("the runner is shut down")
        future = SimFuture(self.world)
        self._queue.append((fn, future))
        if not self._busy:
            self._busy = True
            self.process.spawn(self._drain, "marker")
        return future

    def _drain(self) -> None:
        try:
            while self._queue:
                fn, future = self._queue.popleft()
                try:
                    fn()
                except Exception as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(None)
        finally:
            self._busy = False
            self._idle.notify_all()

    def every(self, seconds: float, fn: Callable[[], None]) -> Callable[[], None]:
        state = {"stopped": False, "running": False}
        done = Condition(self.world)

        def repeat() -> None:
            while True:
                self.world.sleep(seconds)
                if state["stopped"]:
                    return
                state["running"] = True
                try:
                    fn()
                finally:
                    state["running"] = False
                    done.notify_all()

        self.process.spawn(repeat, "renewer")

        def stop() -> None:
            state["stopped"] = True
            while state["running"]:
                done.wait()

        return stop

    def sleep(self, seconds: float) -> None:
        self.world.sleep(seconds)

    def hold_signals(self) -> AbstractContextManager[None]:
        return self.process.holding()

    def shutdown(self) -> None:
        self._down = True
        while self._busy:
            self._idle.wait()
