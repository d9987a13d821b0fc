"""Where the firing path's background work runs: the seam between it and threads.

The dispatcher marks a chunk while the next is being written, and renews the leases of a
chunk while its broker write is under way. In a beat process both run on threads
(:class:`Threads`); a deterministic simulation hands in a runner of its own, which runs them
when its seeded generator says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol


class Runner(Protocol):
    """Runs background work for one replica."""

    def submit(self, fn: Callable[[], None]) -> Future[None]:
        """Run ``fn`` once, after the calls submitted before it; raises ``RuntimeError``
        after :meth:`shutdown`."""

    def every(self, seconds: float, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn`` every ``seconds`` until the returned function is called (which waits
        for a call under way)."""

    def shutdown(self) -> None:
        """Wait for the submitted calls; refuse new ones."""


class Threads:
    """The runner of a beat process: one worker thread for submitted calls, a thread per
    repeated one."""

    def __init__(self, name: str = "voltro-beat") -> None:
        self._name = name
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-mark")

    def submit(self, fn: Callable[[], None]) -> Future[None]:
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
            thread.join()

        return stop

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
