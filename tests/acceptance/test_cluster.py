"""Cluster coordination with three real ``celery beat -S voltro`` replicas on PostgreSQL, Redis
and a real worker: the shard owner fires, with the epoch checked on every handoff.

Executions are counted on the worker's side by occurrence key. The shard lease is
``voltro_beat_publish_timeout``: a dead or paused owner's shards move once it ran out.
"""

from __future__ import annotations

import itertools
import signal
import time
from collections import Counter
from datetime import datetime, timedelta

import psycopg
import sqlalchemy as sa
from vbt_harness import (
    REPLICAS,
    Deployment,
    Deployments,
    Outcome,
    Sched,
    check,
    finish,
    now,
    problems_exactly_once,
    problems_no_duplicates,
    sleep_until,
    window_start,
)

from voltro_beat.shards import shard_of
from voltro_beat.store.tables import replicas
from voltro_beat.store.tables import shards as shards_table

#: Twelve one-second schedules: enough that every replica owns some.
SCHEDULES = [Sched(f"tick-{i:02}", '"* * * * * *"') for i in range(12)]
SHARDS = 16
CLUSTER = {"voltro_beat_coordination": "cluster", "voltro_beat_shards": SHARDS}


def owners(dep: Deployment) -> dict[int, str | None]:
    """Each shard's owner while its lease runs, as the shards table says now."""
    engine = sa.create_engine(dep.store_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            clock = conn.execute(sa.select(sa.func.clock_timestamp())).scalar_one()
            rows = conn.execute(sa.select(shards_table)).all()
    finally:
        engine.dispose()
    return {
        r.shard: r.owner if r.lease_until is not None and r.lease_until > clock else None
        for r in rows
    }


def warm_up(dep: Deployment) -> dict[str, float]:
    """Per replica, seconds from its registration to the first shard it owns now (the
    shards table's ``changed_at``, both on the database's clock)."""
    engine = sa.create_engine(dep.store_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            started = dict(conn.execute(sa.select(replicas.c.name, replicas.c.started_at)).all())
            first = conn.execute(
                sa.select(shards_table.c.owner, sa.func.min(shards_table.c.changed_at))
                .where(shards_table.c.owner.is_not(None))
                .group_by(shards_table.c.owner)
            ).all()
    finally:
        engine.dispose()
    return {o: round((at - started[o]).total_seconds(), 2) for o, at in first if o in started}


def owned_by(dep: Deployment) -> Counter[str | None]:
    return Counter(owners(dep).values())


def schedules_of(dep: Deployment, replica: str) -> list[str]:
    held = {s for s, owner in owners(dep).items() if owner == replica}
    return [s.name for s in SCHEDULES if shard_of("default", s.name, SHARDS) in held]


def start(dep: Deployment, **settings: object) -> None:
    dep.configure(SCHEDULES, **CLUSTER, **settings)
    dep.start_worker()
    dep.start_beats(*REPLICAS)
    dep.wait_ready()


def lateness(outcome: Outcome, keys: list[str]) -> float:
    """The latest publish after its instant among ``keys``, in seconds."""
    runs = [outcome.runs[k] for k in keys if k in outcome.runs]
    return max(((r.published_at or r.scheduled_at) - r.scheduled_at).total_seconds() for r in runs)


def check_once(outcome: Outcome, what: str) -> None:
    problems = problems_exactly_once(
        outcome.keys, outcome.runs, outcome.executions, outcome="cluster"
    )
    check(problems + problems_no_duplicates(outcome.executions), what)


def busiest(dep: Deployment) -> str:
    name, _ = next((n, c) for n, c in owned_by(dep).most_common() if n is not None)
    assert name in REPLICAS
    return name


def test_three_owners_share_the_shards_and_each_occurrence_runs_once(
    deployment: Deployments,
) -> None:
    dep = deployment()
    start(dep)
    window = window_start()
    end = window + timedelta(seconds=10)
    sleep_until(window + timedelta(seconds=5))
    shares = owned_by(dep)
    print(f"boot to first owned shard: {warm_up(dep)}")
    outcome = finish(dep, SCHEDULES, window, end)

    check_once(outcome, "three cluster replicas")
    # Balanced within one shard, no shard without an owner.
    assert sorted(shares.values()) == [5, 5, 6] and None not in shares, shares
    publishers = Counter(outcome.runs[k].replica for k in outcome.keys)
    assert set(publishers) == set(REPLICAS), publishers
    rows = sa.create_engine(dep.store_url, poolclass=sa.NullPool)
    with rows.connect() as conn:
        untagged = conn.execute(
            sa.text(
                "SELECT count(*) FROM _voltro_schedule_runs"
                " WHERE shard IS NULL OR epoch IS NULL OR epoch < 1"
            )
        ).scalar_one()
    rows.dispose()
    assert untagged == 0


def test_kill_minus_nine_of_an_owner_moves_its_shards_within_the_lease(
    deployment: Deployments,
) -> None:
    dep = deployment()
    start(dep, voltro_beat_publish_timeout=3, broker_connection_timeout=1)
    window = window_start()
    end = window + timedelta(seconds=22)
    sleep_until(window + timedelta(seconds=8, milliseconds=880))
    name = busiest(dep)
    orphaned = schedules_of(dep, name)
    dep.beats[name].kill9()
    killed = now()
    # Its lease (3 s) runs out, and the others take its shards at their next heartbeat.
    time.sleep(6)
    after = owners(dep)
    outcome = finish(dep, SCHEDULES, window, end)

    assert dep.beats[name].popen.returncode == -9
    check_once(outcome, f"{name} killed at {killed:%H:%M:%S.%f}")
    assert name not in after.values() and None not in after.values(), after
    moved = [k for k in outcome.keys if k.rpartition("@")[0] in orphaned]
    late = [
        k for k in moved if killed <= outcome.runs[k].scheduled_at < killed + timedelta(seconds=5)
    ]
    print(f"the victim's schedules, latest publish after the kill: {lateness(outcome, late):.2f} s")


def test_an_owner_paused_past_its_lease_cannot_fire_when_it_wakes(
    deployment: Deployments,
) -> None:
    dep = deployment()
    start(dep, voltro_beat_publish_timeout=3, broker_connection_timeout=1)
    window = window_start()
    end = window + timedelta(seconds=24)
    sleep_until(window + timedelta(seconds=6, milliseconds=880))
    name = busiest(dep)
    victim = dep.beats[name]
    victim.signal(signal.SIGSTOP)
    paused = now()
    time.sleep(7)  # more than twice its lease
    during = owners(dep)
    victim.signal(signal.SIGCONT)
    outcome = finish(dep, SCHEDULES, window, end)

    check_once(outcome, f"{name} paused at {paused:%H:%M:%S.%f} for 7 s")
    assert name not in during.values() and None not in during.values(), during
    # It woke up believing it owned its shards: its heartbeat found their leases gone.
    assert "lost shards" in victim.text(), victim.tail()


def test_a_graceful_stop_hands_its_shards_over_at_once(deployment: Deployments) -> None:
    dep = deployment()
    start(dep)  # publish_timeout 10 s: waiting for a lease to run out would show
    window = window_start()
    end = window + timedelta(seconds=16)
    sleep_until(window + timedelta(seconds=6, milliseconds=500))
    name = busiest(dep)
    orphaned = schedules_of(dep, name)
    dep.beats[name].stop()
    stopped = now()
    time.sleep(3)
    after = owners(dep)
    outcome = finish(dep, SCHEDULES, window, end)

    check_once(outcome, f"{name} stopped at {stopped:%H:%M:%S.%f}")
    assert name not in after.values() and None not in after.values(), after
    moved = [
        k
        for k in outcome.keys
        if k.rpartition("@")[0] in orphaned and outcome.runs[k].scheduled_at >= stopped
    ]
    late = lateness(outcome, moved)
    print(f"the stopped replica's schedules, latest publish after the stop: {late:.2f} s")
    # Its shards were released at once: nothing waited for their 10 s lease to run out.
    assert late < 5, late


def test_two_groups_each_fire_only_their_own_schedules(deployment: Deployments) -> None:
    schedules = [
        *(Sched(f"a-{i}", '"* * * * * *"', {"group": '"alpha"'}) for i in range(4)),
        *(Sched(f"b-{i}", '"* * * * * *"', {"group": '"beta"'}) for i in range(4)),
    ]
    dep = deployment()
    dep.configure(schedules, **CLUSTER)
    dep.start_worker()
    dep.start_beats("a1", "a2", VOLTRO_BEAT_GROUP="alpha")
    dep.start_beats("b1", VOLTRO_BEAT_GROUP="beta")
    dep.wait_ready()
    window = window_start()
    outcome = finish(dep, schedules, window, window + timedelta(seconds=8))

    check_once(outcome, "two groups")
    wrong = [
        (k, outcome.runs[k].replica)
        for k in outcome.keys
        if (outcome.runs[k].replica or "?")[0] != k[0]
    ]
    assert not wrong, wrong[:10]


SINGLETON_DDL = """
CREATE TABLE vbt_fence (id integer PRIMARY KEY, token integer NOT NULL);
INSERT INTO vbt_fence VALUES (1, 0);
CREATE TABLE vbt_singleton_writes (
    seq bigserial PRIMARY KEY, token integer NOT NULL, replica text NOT NULL,
    at timestamptz NOT NULL
)"""


def singleton_writes(dep: Deployment) -> list[tuple[int, str, datetime]]:
    with psycopg.connect(dep.exec_dsn) as conn:
        return conn.execute(
            "SELECT token, replica, at FROM vbt_singleton_writes ORDER BY at"
        ).fetchall()


def writer_now(dep: Deployment) -> str:
    """The replica whose writes are the newest."""
    time.sleep(0.5)
    return singleton_writes(dep)[-1][1]


def test_a_singleton_runs_on_one_replica_at_a_time_across_kills_pauses_and_restarts(
    deployment: Deployments,
) -> None:
    dep = deployment()
    with psycopg.connect(dep.exec_dsn, autocommit=True) as conn:
        conn.execute(SINGLETON_DDL)
    singletons = {"writer": {"run": "vbt_proj:write_token", "grace": 2}}
    dep.configure(
        SCHEDULES[:2],
        **CLUSTER,
        voltro_beat_singletons=singletons,
        voltro_beat_publish_timeout=3,
        broker_connection_timeout=1,
    )
    dep.start_beats(*REPLICAS)
    dep.wait_ready()
    time.sleep(2)
    events = []
    # kill -9 of the singleton's owner: another replica takes its shard once the lease ran out.
    victim = writer_now(dep)
    dep.beats[victim].kill9()
    events.append(f"killed {victim}")
    time.sleep(7)
    dep.start_beats(victim)
    # SIGSTOP of the new owner past its lease, then SIGCONT: its copy wakes up with an old token.
    paused = writer_now(dep)
    dep.beats[paused].signal(signal.SIGSTOP)
    events.append(f"paused {paused}")
    time.sleep(7)
    dep.beats[paused].signal(signal.SIGCONT)
    time.sleep(3)
    # A rolling restart: each replica stopped and started again in turn.
    for name in REPLICAS:
        dep.beats[name].stop()
        events.append(f"restarted {name}")
        dep.start_beats(name)
        time.sleep(3)
    time.sleep(2)
    dep.stop_beats()
    writes = singleton_writes(dep)

    tokens = [token for token, _, _ in writes]
    assert tokens == sorted(tokens), "a write with an older token came after a newer one"
    owners = {}
    for token, replica, _ in writes:
        assert owners.setdefault(token, replica) == replica, (token, replica, owners)
    gaps = [(b[2] - a[2]).total_seconds() for a, b in itertools.pairwise(writes) if b[0] != a[0]]
    print(f"{events}; tokens {sorted(owners)}; handoff gaps {[round(g, 2) for g in gaps]} s")
    assert len(owners) >= 4 and len(set(owners.values())) >= 2, owners
