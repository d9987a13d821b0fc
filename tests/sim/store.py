"""The real SQLite store on the virtual timeline.

Every process opens the one database file through :class:`voltro_beat.store.database.Database`
with three seams: SQLite's clock (``voltro_now()``) is the world's true time, the monotonic
clock that times statements is the process's own, and its connections are of a class made for
it here. Each statement of such a connection takes a round trip of virtual time (an outbound
and a return latency drawn apart, so clock readings see asymmetric round trips), may fail
(before it ran: nothing happened; a COMMIT after it ran: committed, answer lost), and
``BEGIN`` takes the file's write lock as SQLite does: another process waits for it, up to
SQLite's busy timeout, then gets "database is locked". A killed process's open transaction is
rolled back and its lock released at once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import greenlet

from tests.sim.observer import Observer
from tests.sim.world import Condition, Killed, Process, World
from voltro_beat.store.beat import BeatStore
from voltro_beat.store.database import Database
from voltro_beat.store.sqlite import SQLITE_BUSY_MS


@dataclass
class StoreFaults:
    """The store as one process sees it: latencies, failures, outages."""

    #: Mean one-way latency (seconds) and the chance of a slow one (up to ``slow`` seconds).
    latency: float = 0.001
    slow_chance: float = 0.0
    slow: float = 0.2
    #: Chance that a statement fails before it runs, and that a COMMIT's answer is lost.
    fail_chance: float = 0.0
    lost_commit_chance: float = 0.0
    #: (start, end) virtual seconds during which every statement fails.
    outages: list[tuple[float, float]] = field(default_factory=list)
    #: Every statement that records an occurrence (an insert of a claim or a run row) fails,
    #: whatever the spell: a version whose claims are broken, that heartbeats all the same.
    claims_fail: bool = False

    def out(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.outages)


class SimStore:
    """The database file every simulated process shares."""

    def __init__(self, world: World, observer: Observer, path: str) -> None:
        self.world = world
        self.observer = observer
        self.url = f"sqlite:///{path}"
        self.holder: sqlite3.Connection | None = None
        #: Statements run at once, without faults: opening a connection outside the timeline.
        self._setup = False
        self._free = Condition(world)
        self.faults: dict[str, StoreFaults] = {}
        self._connections: dict[str, list[sqlite3.Connection]] = {}
        #: Per process: (virtual time, whether the statement went through), for the
        #: excuses of a second message (an outage of a whole lease).
        self.outcomes: dict[str, list[tuple[float, bool]]] = {}
        world.deaths.append(self._on_death)

    def database(self, process: Process, faults: StoreFaults | None = None) -> Database:
        """``process``'s own :class:`Database` on the shared file."""
        self.faults[process.name] = faults or StoreFaults()
        database = Database.open(
            self.url,
            clock=self.world.now,
            monotonic=process.monotonic,
            sqlite_connection=self._connection_class(process),
        )
        # SQLAlchemy runs a pool's first connect under a thread lock: done by two greenlets at
        # once it would deadlock the thread. Here, outside the timeline, it takes no time.
        self._setup = True
        try:
            database.engine.connect().close()
        finally:
            self._setup = False
        return database

    def store(self, process: Process, replica: str, faults: StoreFaults | None = None) -> BeatStore:
        return ObservedStore(self, process, self.database(process, faults), replica=replica)

    # -- the connection class ------------------------------------------------------------

    def _connection_class(self, process: Process) -> type[sqlite3.Connection]:
        sim = self

        class SimCursor(sqlite3.Cursor):
            def execute(self, sql: str, parameters: Any = ()) -> SimCursor:
                sim._before(process, self.connection, sql)
                super().execute(sql, parameters)
                sim._after(process)
                return self

            def executemany(self, sql: str, seq: Iterable[Any]) -> SimCursor:
                sim._before(process, self.connection, sql)
                super().executemany(sql, seq)
                sim._after(process)
                return self

        class SimConnection(sqlite3.Connection):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                sim._connections.setdefault(process.name, []).append(self)

            def cursor(self, factory: Any = None) -> SimCursor:  # type: ignore[override]
                return super().cursor(SimCursor)

            def commit(self) -> None:
                if not self.in_transaction:
                    super().commit()
                    return
                sim._before(process, self, "COMMIT")
                super().commit()
                sim._release(self)
                faults = sim.faults[process.name]
                sim._after(process)
                if sim.world.faulty and sim.world.rng.random() < faults.lost_commit_chance:
                    sim.world.log(process.name, "fault", "commit's answer lost")
                    raise sqlite3.OperationalError("simulated: connection lost after COMMIT")

            def rollback(self) -> None:
                super().rollback()
                sim._release(self)

            def close(self) -> None:
                super().close()
                sim._release(self)

        return SimConnection

    # -- one statement ---------------------------------------------------------------------

    def _before(self, process: Process, conn: sqlite3.Connection, sql: str) -> None:
        if self._setup:
            return
        if not process.alive:
            raise Killed()
        if greenlet.getcurrent().parent is None:
            raise RuntimeError("a store statement outside a simulated process")
        world = self.world
        faults = self.faults[process.name]
        world.sleep(self._latency(faults))
        verb = sql.lstrip()[:6].upper()
        if verb.startswith("BEGIN"):
            self._acquire(conn)
        if faults.claims_fail and verb == "INSERT" and "_voltro_schedule_" in sql:
            self._record(process, ok=False)
            world.log(process.name, "fault", "claim failed (its version's claims are broken)")
            raise sqlite3.OperationalError("simulated: the claim statement failed")
        if world.faulty and (faults.out(world.t) or world.rng.random() < faults.fail_chance):
            self._record(process, ok=False)
            world.log(process.name, "fault", f"statement failed: {sql.split()[0]}")
            raise sqlite3.OperationalError("simulated: server closed the connection")
        self._record(process, ok=True)

    def _after(self, process: Process) -> None:
        if self._setup:
            return
        self.world.sleep(self._latency(self.faults[process.name]))

    def _latency(self, faults: StoreFaults) -> float:
        rng = self.world.rng
        if self.world.faulty and faults.slow_chance and rng.random() < faults.slow_chance:
            return rng.uniform(0.0, faults.slow)
        return rng.expovariate(1.0 / faults.latency) if faults.latency else 0.0

    def _record(self, process: Process, *, ok: bool) -> None:
        self.outcomes.setdefault(process.name, []).append((self.world.t, ok))

    # -- the write lock ------------------------------------------------------------------

    def _acquire(self, conn: sqlite3.Connection) -> None:
        deadline = self.world.t + SQLITE_BUSY_MS / 1000
        while self.holder is not None and self.holder is not conn:
            left = deadline - self.world.t
            if left <= 0:
                raise sqlite3.OperationalError("database is locked")
            self._free.wait(timeout=left)
        self.holder = conn

    def _release(self, conn: sqlite3.Connection) -> None:
        if self.holder is conn:
            self.holder = None
            self._free.notify_all()

    def _on_death(self, process: Process) -> None:
        """A dead process's transactions roll back; its connections close."""
        for conn in self._connections.pop(process.name, []):
            try:
                sqlite3.Connection.rollback(conn)
                sqlite3.Connection.close(conn)
            except sqlite3.Error:
                pass
            self._release(conn)

    def longest_outage_after(self, process: str, start: float) -> float:
        """The longest run of failed statements of ``process`` after ``start`` (from its
        first failure to the next statement that went through, or to its last failure)."""
        longest = 0.0
        since: float | None = None
        for t, ok in self.outcomes.get(process, []):
            if t < start:
                continue
            if not ok and since is None:
                since = t
            elif ok and since is not None:
                longest = max(longest, t - since)
                since = None
        if since is not None:
            longest = max(longest, self.world.t - since)
        return longest


class ObservedStore(BeatStore):
    """Beat's store as it is, telling the world which marks committed."""

    def __init__(self, sim: SimStore, process: Process, database: Database, *, replica: str):
        super().__init__(database, replica=replica)
        self._sim = sim
        self._process = process

    def mark_published(self, keys: Iterable[str]) -> set[str]:
        keys = list(keys)
        lost = super().mark_published(keys)
        self._sim.observer.marked(self._process, keys)
        return lost
