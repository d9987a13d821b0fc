"""A beat replica on the virtual timeline: the real engine, run as Celery's beat runs it.

Its main greenlet is beat's service loop (one engine step, then sleep until the engine wants
to run again, at most ``beat_max_loop_interval``); SIGTERM runs Celery's handler there
(``scheduler.close()``, then ``SystemExit``, after which the loop's ``finally`` closes again).
The engine reads the replica's own clocks (its wall clock off by an offset, both clocks
drifting) and the database's through timed statements; its marks and lease renewals run on
the replica's runner.
"""

from __future__ import annotations

from typing import Any

from tests.sim.broker import SimBroker
from tests.sim.runner import SimRunner
from tests.sim.store import SimStore, StoreFaults
from tests.sim.world import World
from voltro_beat.clock import Clock, ClockMode
from voltro_beat.config import Settings
from voltro_beat.engine import CLOSE_WAIT, Engine
from voltro_beat.engine.guard import DEFAULT_OVERLAP_TIMEOUT
from voltro_beat.schedules import parse_entries

#: Celery beat's longest sleep between ticks (``beat_max_loop_interval``).
MAX_INTERVAL = 5.0


class SimReplica:
    """One incarnation of a beat replica."""

    def __init__(
        self,
        world: World,
        store: SimStore,
        broker: SimBroker,
        name: str,
        *,
        conf: dict[str, Any],
        chunk: int,
        faults: StoreFaults,
        offset: float,
        drift: float,
    ) -> None:
        self.world = world
        self.name = name
        self.process = process = world.process(name, offset=offset, drift=drift)
        settings = Settings.resolve(conf, overrides={"replica": name}, environ={})
        entries = {
            e.name: e
            for e in parse_entries(
                conf["beat_schedule"], tz=None, max_lateness=settings.max_lateness
            )
        }
        self.entries = entries
        #: When (virtual seconds) it booted (its first step that went through), and when each
        #: step that went through started and ended: what it had due when it started, it
        #: recorded; its heartbeat, due or not, was at most an interval older than its start.
        self.booted_at: float | None = None
        self.steps: list[tuple[float, float]] = []
        beat_store = store.store(process, name, faults)
        self.store = beat_store
        self.clock = Clock(ClockMode.DATABASE, local=process.wall, monotonic=process.monotonic)
        self.engine = Engine(
            settings=settings,
            entries=entries,
            store=beat_store,
            publisher=broker.publisher(process, settings.publish_timeout * 3),
            clock=self.clock,
            overlap_timeout=lambda e: e.overlap_timeout or DEFAULT_OVERLAP_TIMEOUT,
            runner=SimRunner(process),
        )
        self.engine.dispatch.chunk = chunk
        #: When it joined the registry (its catch-up follows, on what the registry said); a
        #: boot retried after a store error joins again, and its row's start moves with it.
        self.joined_at: float | None = None
        #: When it first joined: its boot's catch-up is owed on what the registry said then,
        #: and recorded as it stood then however often the boot is retried (seed 1984).
        self.first_joined_at: float | None = None
        join = self.engine.membership.join

        def joined() -> None:
            join()
            self.joined_at = world.t
            if self.first_joined_at is None:
                self.first_joined_at = world.t

        self.engine.membership.join = joined  # type: ignore[method-assign]
        #: When it began to leave the registry (a graceful stop deletes its row: another
        #: replica may find it gone from then on), and the schedules of the shards it owned as
        #: far as it knew and released just before, from when.
        self.left_at: float | None = None
        self.released: tuple[float, frozenset[str]] | None = None
        leave = self.engine.membership.leave

        def left() -> None:
            self.left_at = world.t
            leave()

        self.engine.membership.leave = left  # type: ignore[method-assign]
        ownership = self.engine.gate.ownership
        if ownership is not None:
            release = ownership.release

            def released() -> None:
                held = frozenset(n for n in entries if ownership.holds(n))
                self.released = (world.t, held)
                release()

            ownership.release = released  # type: ignore[method-assign]
        #: Each heartbeat that found its row, as (sent, answered): its ``last_seen`` lies
        #: between the two.
        self.heartbeats: list[tuple[float, float]] = []
        registry = self.engine.membership.registry
        heartbeat = registry.heartbeat

        def beat(*args: Any, **kwargs: Any) -> Any:
            sent = world.t
            answer = heartbeat(*args, **kwargs)
            if answer is not None:
                self.heartbeats.append((sent, world.t))
            return answer

        registry.heartbeat = beat  # type: ignore[method-assign]
        process.on_sigterm = self._on_sigterm
        process.spawn(self._serve, "beat", main=True)
        world.log(name, "boots", f"{len(entries)} schedules")

    def _serve(self) -> None:
        """Celery's ``beat.Service.start``."""
        try:
            while True:
                started = self.world.t
                wake = self.engine.step()
                if (
                    self.engine.booted
                    and self.engine.upkeep.health.down_since is None
                    # A step that recorded one statement's worth and left the rest of what
                    # is due (or of a catch-up owed) for the next steps is not past them yet.
                    and not self.engine.behind
                ):
                    self.steps.append((started, self.world.t))
                    if self.booted_at is None:
                        self.booted_at = self.world.t
                delay = (wake - self.clock.now()).total_seconds()
                self.world.sleep(max(0.0, min(delay, MAX_INTERVAL)))
        except SystemExit:
            pass
        finally:
            self._close()
        self.process.exit()

    def _on_sigterm(self) -> None:
        """Celery's beat handler: sync (close the scheduler), then ``SystemExit``."""
        self._close()
        raise SystemExit()

    def _close(self) -> None:
        """``VoltroScheduler.close``: the engine's close, deferred in the middle of a step."""
        if not self.engine.closed and self.engine.close(wait=CLOSE_WAIT):
            self.store.close()
