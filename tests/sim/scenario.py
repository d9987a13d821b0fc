"""One simulated run, all of it chosen by its seed: the schedules, the settings, the replicas
and workers, their clocks, and the faults; then the run, a calm spell, and the checks.

The faults come in the first :attr:`Plan.faulty` virtual seconds; then every replica and
worker left standing runs without faults long enough that whatever the faults left behind is
recovered, published or recorded, and the invariants are checked on every occurrence older
than a settling margin.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.sim import invariants, outside
from tests.sim.beat import SimReplica
from tests.sim.broker import BrokerFaults, SimBroker
from tests.sim.invariants import Expectations
from tests.sim.observer import Observer, Violation
from tests.sim.store import SimStore, StoreFaults
from tests.sim.worker import TASK, SimWorker
from tests.sim.world import Event, Process, World
from voltro_beat.occurrences import occurrences_between
from voltro_beat.schedules import parse_entries
from voltro_beat.store.database import Database

SECOND = timedelta(seconds=1)
#: Where the databases live: memory-backed when the machine has it (fsync costs nothing).
TMP = "/dev/shm" if os.path.isdir("/dev/shm") else None
_TEMPLATE: Path | None = None


def template() -> Path:
    """A database file with the schema, made once per process and copied for each run."""
    global _TEMPLATE
    if _TEMPLATE is None or not _TEMPLATE.exists():
        path = Path(tempfile.mkdtemp(prefix="voltro-sim-", dir=TMP)) / "template.sqlite3"
        database = Database.open(f"sqlite:///{path}")
        database.upgrade()
        database.dispose()
        _TEMPLATE = path
    return _TEMPLATE


@dataclass
class Result:
    seed: int
    violations: list[Violation]
    faults: Counter[str]
    steps: int
    trace: list[Event]
    crashes: list[str]
    occurrences: int = 0
    deliveries: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations and not self.crashes


def simulate(seed: int) -> Result:
    """Run seed ``seed``; return what it found."""
    world = World(seed, datetime(2031, 3, 4, 5, 6, 0, tzinfo=UTC))
    rng = world.rng
    if rng.random() < 0.3:
        # An hour's boundary during the faults: the retention sweep of the new slot runs then.
        world.start = datetime(2031, 3, 4, 5, 59, 20, tzinfo=UTC)
        world.start += timedelta(seconds=rng.randrange(30), microseconds=rng.randrange(10**6))
    else:
        world.start += timedelta(seconds=rng.randrange(60), microseconds=rng.randrange(10**6))
    observer = Observer(world)
    workdir = Path(tempfile.mkdtemp(prefix="voltro-sim-", dir=TMP))
    path = workdir / "store.sqlite3"
    shutil.copyfile(template(), path)
    try:
        return _run(world, observer, str(path))
    finally:
        world.teardown()
        shutil.rmtree(workdir, ignore_errors=True)


def _schedules(world: World, lateness: float) -> dict[str, dict[str, Any]]:
    rng = world.rng
    schedules: dict[str, dict[str, Any]] = {
        "every-second": {"task": TASK, "schedule": 1.0},
        "every-5s": {"task": TASK, "schedule": "*/5 * * * * *"},
    }
    if rng.random() < 0.4:
        schedules["external"] = {
            "task": TASK,
            "schedule": "*/5 * * * * *",
            "trigger": "external",
        }
    for i in range(rng.choice([0, 3, 12, 30])):
        schedules[f"burst-{i}"] = {"task": TASK, "schedule": "*/10 * * * * *"}
    if rng.random() < 0.5:
        schedules["skip"] = {
            "task": TASK,
            "schedule": 2.0,
            "on_overlap": "skip",
            "overlap_timeout": 20.0,
        }
    if rng.random() < 0.5:
        schedules["queue"] = {
            "task": TASK,
            "schedule": 3.0,
            "on_overlap": "queue",
            "overlap_timeout": 20.0,
        }
    if rng.random() < 0.5:
        schedules["short-lateness"] = {"task": TASK, "schedule": 2.0, "max_lateness": 4.0}
    for policy in ("all", "skip"):
        if rng.random() < 0.3:
            schedules[f"catch-up-{policy}"] = {
                "task": TASK,
                "schedule": 1.0,
                "catch_up": policy,
                "max_lateness": min(lateness, 15.0),
            }
    return schedules


def _run(world: World, observer: Observer, path: str) -> Result:
    rng = world.rng
    faults: Counter[str] = Counter()
    store = SimStore(world, observer, path)
    lease = rng.choice([2.5, 3.0, 4.0])
    lateness = rng.choice([6.0, 12.0, 20.0])
    schedules = _schedules(world, lateness)
    conf: dict[str, Any] = {
        "voltro_beat_store_url": store.url,
        "voltro_beat_publish_timeout": lease,
        "broker_connection_timeout": 1.0,
        "voltro_beat_max_lateness": lateness,
        "voltro_beat_worker_lease": 4.0,
        # 21.6 s (above the longest lateness): an hour's retention sweep (see simulate)
        # removes rows and raises the watermark while the replicas, the trigger and the
        # backfills (up to a minute back) run.
        "voltro_beat_runs_ttl_hours": 0.006,
        "voltro_beat_claims_ttl_hours": 0.006,
        "result_expires": None,
        "beat_schedule": schedules,
    }
    # Seeds ending in 1 or 7 run in cluster coordination, with 1, 4 or 16 shards (decided
    # apart from the world's generator, so that every other seed replays as before).
    cluster = world.seed % 10 in (1, 7)
    if cluster:
        conf["voltro_beat_coordination"] = "cluster"
        conf["voltro_beat_shards"] = random.Random(f"shards:{world.seed}").choice([1, 4, 16])
        faults["cluster coordination"] += 1
    chunk = rng.choice([2, 5, 1000])
    broker_faults = BrokerFaults(latency=rng.choice([0.0005, 0.002, 0.01]))
    if rng.random() < 0.5:
        broker_faults.refuse = rng.choice([0.02, 0.1])
        faults["broker refusals"] += 1
    if rng.random() < 0.4:
        broker_faults.cut_before = rng.choice([0.01, 0.05])
        faults["broker cut before"] += 1
    if rng.random() < 0.4:
        broker_faults.cut_after = rng.choice([0.01, 0.05])
        faults["broker cut after accepting"] += 1
    if rng.random() < 0.3:
        broker_faults.stall = rng.choice([0.01, 0.05])
        faults["broker stalls"] += 1
    if rng.random() < 0.3:
        broker_faults.redeliver = 0.05
        faults["broker redeliveries"] += 1
    broker = SimBroker(world, observer, broker_faults)

    faulty = 45.0
    calm = max(lateness, 15.0) + 4 * lease + 20.0
    replicas: list[SimReplica] = []
    slots = rng.randint(1, 4)
    incarnation = Counter[int]()
    changed: set[str] = set()

    def store_faults() -> StoreFaults:
        f = StoreFaults(latency=rng.choice([0.0002, 0.001, 0.005]))
        if rng.random() < 0.3:
            f.slow_chance, f.slow = 0.02, rng.choice([0.1, 0.5, 2.0])
            faults["slow statements"] += 1
        if rng.random() < 0.3:
            f.fail_chance = rng.choice([0.005, 0.02])
            faults["statement failures"] += 1
        if rng.random() < 0.2:
            f.lost_commit_chance = 0.01
            faults["commit answers lost"] += 1
        if rng.random() < 0.3:
            a = rng.uniform(2.0, faulty)
            f.outages.append((a, a + rng.choice([0.5, 2.0, lease * 1.5, 8.0])))
            faults["store outages"] += 1
        return f

    def boot(
        slot: int, definition: dict[str, dict[str, Any]] | None = None, *, hangs: bool = False
    ) -> SimReplica:
        incarnation[slot] += 1
        name = f"r{slot}.{incarnation[slot]}"
        offset = rng.choice([0.0, 0.0, rng.uniform(-5.0, 5.0)])
        drift = rng.choice([0.0, rng.uniform(-2e-4, 2e-4)])
        if offset or drift:
            faults["skewed clocks"] += 1
        f = store_faults()
        f.claims_fail = hangs
        replica = SimReplica(
            world,
            store,
            broker,
            name,
            conf={**conf, "beat_schedule": definition or schedules},
            chunk=chunk,
            faults=f,
            offset=offset,
            drift=drift,
        )
        replicas.append(replica)
        return replica

    for slot in range(slots):
        at = rng.uniform(0.0, 3.0)
        _at(world, at, lambda slot=slot: boot(slot))
    workers: list[SimWorker] = []
    worker_conf = {
        "voltro_beat_store_url": store.url,
        "voltro_beat_worker_lease": conf["voltro_beat_worker_lease"],
        "broker_connection_timeout": 1.0,
    }
    fail_chance = rng.choice([0.0, 0.05])
    max_duration = rng.choice([0.05, 0.5, 3.0])
    concurrency = rng.choice([1, 4])

    def start_worker() -> None:
        workers.append(
            SimWorker(
                world,
                observer,
                broker,
                store,
                f"w{len(workers) + 1}",
                conf=worker_conf,
                fail_chance=fail_chance,
                long_bodies=frozenset(n for n in schedules if n in ("skip", "queue")),
                max_duration=max_duration,
                concurrency=concurrency,
            )
        )

    for _ in range(rng.randint(1, 3)):
        start_worker()

    # The faults: each an action at a virtual instant of the faulty spell.
    def living() -> list[SimReplica]:
        return [r for r in replicas if r.process.alive]

    def kill(restart: float | None) -> None:
        alive = living()
        if not alive:
            return
        victim = rng.choice(alive)
        victim.process.kill()
        if restart is not None:
            slot = int(victim.name[1:].split(".")[0])
            _at(world, world.t + restart, lambda: boot(slot))

    def sigterm(restart: float | None) -> None:
        alive = living()
        if not alive:
            return
        victim = rng.choice(alive)
        victim.process.sigterm()
        if restart is not None:
            slot = int(victim.name[1:].split(".")[0])
            _at(world, world.t + restart, lambda: boot(slot))

    def pause() -> None:
        alive = living()
        if alive:
            rng.choice(alive).process.pause(rng.choice([0.05, 0.5, lease * 0.6, lease * 1.3, 7.0]))

    def deploy() -> None:
        """A rolling deploy that changes one schedule's definition: new replicas boot, the
        old ones stop (SIGTERM), one at a time. In some, the new version crashes: its first
        replica dies a moment after it booted, while the old ones yield the schedule to it;
        in half of those (decided apart from the world's generator, so that every other seed
        replays as before) it hangs first, for 2-8 s more: it heartbeats, and every claim of
        it fails."""
        name = rng.choice(sorted(schedules))
        changed.add(name)
        definition = {**schedules, name: {**schedules[name], "args": [len(changed)]}}
        old = living()
        if old and rng.random() < 0.3:
            faults["crashing deploy"] += 1
            slot = int(old[0].name[1:].split(".")[0])
            crash = rng.uniform(0.5, 3.0)
            apart = random.Random(f"hangs:{world.seed}:{len(changed)}")
            hangs = apart.random() < 0.5
            if hangs:
                faults["hanging deploy"] += 1
                crash += apart.uniform(2.0, 8.0)

            def doomed() -> None:
                replica = boot(slot + 10, definition, hangs=hangs)
                _at(world, world.t + crash, replica.process.kill)

            _at(world, world.t, doomed)
            return
        for i, replica in enumerate(old):
            slot = int(replica.name[1:].split(".")[0])
            _at(world, world.t + i * 2.0, lambda slot=slot: boot(slot + 10, definition))
            _at(world, world.t + i * 2.0 + 1.0, replica.process.sigterm)

    def kill_worker() -> None:
        alive = [w for w in workers if w.process.alive]
        if alive:
            rng.choice(alive).process.kill()
            _at(world, world.t + rng.uniform(0.5, 5.0), start_worker)

    outsiders: list[Process] = []

    def backfill_now() -> None:
        name = rng.choice([n for n, e in schedules.items() if e.get("trigger") != "external"])
        outsiders.append(
            outside.backfill(
                world,
                store,
                broker,
                conf,
                name,
                rng.choice([5.0, 15.0, 30.0, 60.0]),
                len(outsiders),
            )
        )

    def workers_down() -> None:
        """Every worker stopped for a while (a deploy of the workers): messages wait."""
        for w in workers:
            if w.process.alive:
                w.process.kill()
        _at(world, world.t + rng.uniform(3.0, 15.0), start_worker)

    def kill_outsider() -> None:
        alive = [p for p in outsiders if p.alive]
        if alive:
            rng.choice(alive).kill()

    actions = {
        "kill -9": lambda: kill(rng.choice([None, rng.uniform(0.5, 10.0)])),
        "SIGTERM": lambda: sigterm(rng.choice([None, rng.uniform(0.5, 10.0)])),
        "pause": pause,
        "rolling deploy": deploy,
        "worker killed": kill_worker,
        "workers down": workers_down,
        "backfill": backfill_now,
        "trigger or backfill killed": kill_outsider,
    }
    weights = {
        "kill -9": 3,
        "SIGTERM": 2,
        "pause": 4,
        "rolling deploy": 1,
        "worker killed": 2,
        "workers down": 1,
        "backfill": 2,
        "trigger or backfill killed": 2,
    }
    if "external" in schedules:
        faults["external trigger"] += 1
        spec = parse_entries({"x": schedules["external"]}, tz=None, max_lateness=SECOND)[0].spec
        for at in occurrences_between(spec, world.start, world.now() + timedelta(seconds=faulty)):
            for _ in range(2 if rng.random() < 0.2 else 1):  # a CronJob may start two Jobs
                t = (at - world.start).total_seconds() + rng.uniform(-0.8, 2.0)

                def job() -> None:
                    outsiders.append(
                        outside.trigger_job(world, store, broker, conf, "external", len(outsiders))
                    )

                _at(world, max(0.5, t), job)
    for _ in range(rng.choice([0, 1, 3, 6, 10])):
        kind = rng.choices(list(weights), weights=list(weights.values()))[0]
        at = rng.uniform(3.0, faulty)
        faults[kind] += 1
        _at(world, at, lambda kind=kind: actions[kind]())
    if rng.random() < 0.3:
        # Everything down for a while: catch-up after downtime.
        down = rng.uniform(5.0, faulty - 10.0)
        faults["downtime"] += 1

        def all_down() -> None:
            for r in living():
                r.process.kill()

        _at(world, down, all_down)
        for slot in range(slots):
            _at(world, down + rng.uniform(2.0, lateness * 1.5), lambda slot=slot: boot(slot))

    def ensure_alive() -> None:
        # One that was sent SIGTERM is on its way out (seeds 1378 and 1506 of the long run
        # ended with no replica to recover what the last one left claimed).
        if not [r for r in living() if not r.process.stopping]:
            boot(0)
        if not any(w.process.alive for w in workers):
            start_worker()

    world.calm_at = faulty
    # Again while the faults' own follow-ups end (a restart up to 10 s after its kill, a
    # rolling deploy's SIGTERMs 2 s apart, a crashing deploy's kill up to 11 s after its
    # boot): seed 9004 ended its deploys at +51 s with no replica left.
    for later in range(0, 14, 2):
        _at(world, faulty + later, ensure_alive)
    world.run(faulty + calm)
    settle = 3 * lease + max_duration + conf["voltro_beat_worker_lease"] + 6.0
    expect = Expectations(
        entries={name: e for r in replicas for name, e in r.entries.items()},
        lease=lease,
        judged_until=faulty + calm - settle,
        store=store,
        replicas=replicas,
        changed=frozenset(changed),
        cluster=cluster,
        in_broker=frozenset(m.key for m in broker.pending()),
    )
    if world.start.minute == 59:
        faults["retention sweep"] += 1
    invariants.check(world, observer, store.url, expect)
    if broker.pending():
        world.log("check", "note", f"{len(broker.pending())} messages still in the broker")
    return Result(
        seed=world.seed,
        violations=observer.violations,
        faults=faults,
        steps=world.steps,
        trace=world.trace,
        crashes=world.crashes,
        occurrences=len(observer.accepted),
        deliveries=observer.deliveries,
    )


def _at(world: World, t: float, action: Any) -> None:
    """Run ``action`` at virtual second ``t`` (from the world's own "god" process)."""
    god = _god(world)

    def later() -> None:
        world.sleep(max(0.0, t - world.t))
        action()

    god.spawn(later, "fault")


def _god(world: World) -> Any:
    for p in world.processes:
        if p.name == "god":
            return p
    return world.process("god")
