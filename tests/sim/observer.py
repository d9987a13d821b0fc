"""What the simulation saw happen, and the invariants checked as it happens.

The broker tells the observer of every message it accepted and every publish call's fate, the
worker of every execution of a body, the store of every mark that committed. Checked at each
of those steps: no body executes twice (at once, or after one finished), no message is
accepted and no body starts before its instant on the database's clock. What needs the whole
run (every occurrence accounted for, the ledger's last word, excuses for second messages) is
:mod:`tests.sim.invariants`' at the end.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from tests.sim.world import Process, World

#: How early (seconds, on the database's clock) a message may be accepted: the replicas'
#: monotonic clocks drift (up to 200 ppm here) between a reading and the write it bounds.
EARLY_TOLERANCE = 0.001

_KEY = re.compile(r"^(?P<name>.+)@(?P<at>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{3})?)$")


def instant_of(key: str) -> datetime:
    match = _KEY.match(key)
    assert match is not None, key
    return datetime.fromisoformat(match["at"]).replace(tzinfo=UTC)


def schedule_of(key: str) -> str:
    match = _KEY.match(key)
    assert match is not None, key
    return match["name"]


@dataclass
class Accepted:
    """A message the broker took."""

    key: str
    t: float
    publisher: str
    call: int


@dataclass
class Call:
    """One broker write of a replica, and what it learned of it."""

    id: int
    process: str
    t: float
    keys: list[str]
    mode: str = "ok"
    accepted: set[str] = field(default_factory=set)
    #: The answer never reached the publisher for some accepted message (cut, lost confirms,
    #: a stall past the write timeout).
    answer_lost: bool = False


@dataclass
class Execution:
    key: str
    worker: str
    start: float
    end: float | None = None
    ok: bool | None = None


@dataclass
class Violation:
    kind: str
    key: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.key}: {self.detail}"


class Observer:
    """Every observation of one simulated run."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.accepted: dict[str, list[Accepted]] = defaultdict(list)
        self.calls: list[Call] = []
        self.executions: dict[str, list[Execution]] = defaultdict(list)
        self.marks: dict[str, tuple[float, str]] = {}
        self.violations: list[Violation] = []
        self.workers: dict[str, Process] = {}
        self.deliveries = 0
        #: Runs whose end a worker recorded in the ledger.
        self.recorded_ends: set[str] = set()
        self.skipped_deliveries = 0

    def violate(self, kind: str, key: str, detail: str) -> None:
        self.violations.append(Violation(kind, key, detail))
        self.world.log("check", "VIOLATION", f"{kind}: {detail}", (key,))

    # -- the broker -----------------------------------------------------------------------

    def call(self, process: Process, keys: list[str]) -> Call:
        call = Call(len(self.calls), process.name, self.world.t, keys)
        self.calls.append(call)
        self.world.log(
            process.name, "broker write", f"call {call.id}, {len(keys)} messages", tuple(keys)
        )
        return call

    def accept(self, call: Call, key: str) -> None:
        world = self.world
        call.accepted.add(key)
        self.accepted[key].append(Accepted(key, world.t, call.process, call.id))
        early = (instant_of(key) - world.now()).total_seconds()
        if early > EARLY_TOLERANCE:
            self.violate(
                "published early",
                key,
                f"accepted from {call.process} {early * 1000:.3f} ms before its instant "
                "on the database's clock",
            )

    # -- the store ------------------------------------------------------------------------

    def marked(self, process: Process, keys: list[str]) -> None:
        self.world.log(process.name, "marked", f"{len(keys)} runs", tuple(keys))
        for key in keys:
            self.marks.setdefault(key, (self.world.t, process.name))

    # -- the worker -----------------------------------------------------------------------

    def started(self, key: str, worker: Process) -> Execution:
        world = self.world
        self.workers[worker.name] = worker
        for other in self.executions[key]:
            if other.end is not None and (
                key in self.recorded_ends or self.workers[other.worker].alive
            ):
                # A worker killed after the body returned and before its outcome was
                # recorded is a death mid-execution to the ledger: the redelivery runs once
                # its lease lapsed (guarantee 11, docs/ledger.md).
                self.violate(
                    "executed twice",
                    key,
                    f"started on {worker.name} after its execution on {other.worker} "
                    f"ended ({'succeeded' if other.ok else 'failed'}) at {other.end:.4f}",
                )
            elif self.workers[other.worker].alive:
                self.violate(
                    "executed twice",
                    key,
                    f"started on {worker.name} while its execution on {other.worker} "
                    f"(started {other.start:.4f}) runs",
                )
        if instant_of(key) > world.now():
            self.violate("executed early", key, f"started on {worker.name} before its instant")
        execution = Execution(key, worker.name, world.t)
        self.executions[key].append(execution)
        world.log(worker.name, "body starts", "", (key,))
        return execution

    def ended(self, key: str) -> None:
        """The worker recorded the end of ``key``'s run (succeeded, failed, ...)."""
        self.recorded_ends.add(key)

    def finished(self, execution: Execution, ok: bool) -> None:
        execution.end = self.world.t
        execution.ok = ok
        self.world.log(execution.worker, "body ends", "ok" if ok else "raised", (execution.key,))
