"""Where the firing path meets its process: background work, waiting, and stop signals.

The dispatcher marks a chunk while the next is being written, renews the leases of a chunk
while its broker write is under way, and holds the process's stop signals while a chunk is
written; the worker's ledger renews its start claims and polls a run another execution holds.
In a beat or worker process all of it runs on threads and real time (:class:`Threads`); a
deterministic simulation hands in a runner of its own, which runs the work when its seeded
generator says so, on a virtual timeline.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from types import FrameType
from typing import Protocol

#: Signals held while a chunk is written (what Celery's beat stops on).
HELD_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Runner(Protocol):
    """Runs background work for one replica (or one worker process)."""

    def submit(self, fn: Callable[[], None]) -> Future[None]:
        """Run ``fn`` once, after the calls submitted before it; raises ``RuntimeError``
        after :meth:`shutdown`."""

    def every(self, seconds: float, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn`` every ``seconds`` until the returned function is called (which waits
        for a call under way)."""

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""

    def hold_signals(self) -> AbstractContextManager[None]:
        """A block during which the process's stop signals wait, to be handled at its end."""

    def shutdown(self) -> None:
        """Wait for the submitted calls; refuse new ones."""


class Threads:
    """The runner of a beat or worker process: one worker thread for submitted calls (made on
    first use), a thread per repeated one, real time and real signals."""

    def __init__(self, name: str = "voltro-beat") -> None:
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._down = False

    def submit(self, fn: Callable[[], None]) -> Future[None]:
        with self._lock:
            if self._down:
                raise RuntimeError("the runner is shut down")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=f"{self._name}-mark"
                )
            return self._pool.submit(fn)

    def every(self, seconds: float, fn: Callable[[], None]) -> Callable[[], None]:
        done = threading.Event()

        def repeat() -> None:
            while not done.wait(seconds):
                fn()

        thread = threading.Thread(target=repeat, name=f"{self._name}-renew", daemon=True)
        thread.start()

        def stop() -> None:
            done.set()
            if thread is not threading.current_thread():
                thread.join()

        return stop

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def hold_signals(self) -> AbstractContextManager[None]:
        return _signals_held()

    def shutdown(self) -> None:
        with self._lock:
            self._down = True
            pool = self._pool
        if pool is not None:
            pool.shutdown(wait=True)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold :data:`HELD_SIGNALS` until the block ends, then raise them again.

    Only the main thread may change signal handlers (and only it runs them); a handler not
    installed from Python is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if signum not in caught:
            caught.append(signum)

    previous = {
        held: signal.signal(held, hold)
        for held in HELD_SIGNALS
        if signal.getsignal(held) is not None
    }
    try:
        yield
    finally:
        for held, handler in previous.items():
            signal.signal(held, handler)
        for signum in caught:
            signal.raise_signal(signum)
