"""Overlap policies end to end (issue 4): three ``celery beat -S voltro`` replicas, one prefork
worker (4 processes, so runs can overlap), PostgreSQL + Redis, and a task that sleeps 3 s,
scheduled every second for a 12 s window.

The app (:mod:`vbt_overlap_proj`) calls ``voltro_beat.attach(app)``, so the worker records
``started`` / ``succeeded``; the task records its body's interval in ``vbt_intervals``. Each
policy is one beat session:

* ``skip``: most occurrences are ``skipped`` (reason ``overlap``) and no two bodies overlap;
* ``queue``: no two bodies overlap and every occurrence of the window succeeds, in scheduled
  order (the beats keep running, promoting queued runs, until the window's backlog drained);
* ``allow``: bodies overlap.

The task's hard time limit (10 s) is the entries' overlap timeout: shorter than the ``queue``
backlog grows here, which is what a queued run must survive.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg
import pytest
from vbt_harness import (
    REPLICAS,
    Deployment,
    Deployments,
    Run,
    Sched,
    check,
    scheduled_at,
    wait_until,
    window_start,
)

#: Written by :func:`vbt_overlap_proj.slow` (not imported here: it attaches the ledger).
INTERVALS_DDL = """
CREATE TABLE vbt_intervals (
    seq bigserial PRIMARY KEY,
    occurrence text,
    task_id text NOT NULL,
    worker_pid integer NOT NULL,
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL
)"""
WINDOW = timedelta(seconds=12)
#: How long the ``queue`` backlog of the window may take to drain after it (12 runs of 3 s
#: and up to a second of promotion each, with the pre-window runs ahead of them: about 50 s).
QUEUE_DRAIN = 120.0
#: Terminal statuses of a run row.
DONE = frozenset({"succeeded", "failed", "revoked", "rejected", "missed", "skipped"})


@dataclass(frozen=True)
class Interval:
    occurrence: str
    started_at: datetime
    finished_at: datetime


def read_intervals(dsn: str) -> list[Interval]:
    """Every finished execution, in the order the bodies started."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT occurrence, started_at, finished_at FROM vbt_intervals ORDER BY started_at"
        ).fetchall()
    return [Interval(*row) for row in rows]


def overlapping(intervals: Sequence[Interval]) -> list[tuple[Interval, Interval]]:
    """Each execution that started before the one before it (by start) had finished."""
    return [(a, b) for a, b in itertools.pairwise(intervals) if b.started_at < a.finished_at]


def show(pairs: Sequence[tuple[Interval, Interval]]) -> list[str]:
    return [
        f"{a.occurrence} [{a.started_at:%T.%f}, {a.finished_at:%T.%f}] overlaps "
        f"{b.occurrence} [{b.started_at:%T.%f}, {b.finished_at:%T.%f}]"
        for a, b in pairs
    ]


def problems_ran_once(keys: Sequence[str], runs: dict[str, Run], ran: Counter[str]) -> list[str]:
    """What breaks "each of ``keys`` succeeded, recorded by the worker, its body run once"."""
    problems = []
    for key in keys:
        run = runs.get(key)
        if run is None or run.status != "succeeded":
            problems.append(f"{key}: {run and (run.status, run.reason)}, not succeeded")
        if ran[key] != 1:
            problems.append(f"{key}: body ran {ran[key]} times")
    return problems


def start(deployment: Deployments, redis_url: str, policy: str) -> tuple[Deployment, Sched]:
    sched = Sched(
        f"slow-{policy}",
        "timedelta(seconds=1)",
        extra={"on_overlap": repr(policy)},
        task="vbt_overlap.slow",
    )
    dep = deployment(broker=f"{redis_url}/7", app="vbt_overlap_proj", concurrency=4)
    with psycopg.connect(dep.exec_dsn, autocommit=True) as conn:
        conn.execute(INTERVALS_DDL)
    dep.configure([sched], voltro_beat_coordination="advisory_lock")
    dep.start_worker()
    dep.start_beats(*REPLICAS)
    dep.wait_ready()
    return dep, sched


def settle(
    dep: Deployment, keys: Sequence[str], done: Callable[[Run], bool], timeout: float
) -> None:
    """Wait until every row of ``keys`` is ``done`` (or the deadline: the checks say what not)."""

    def settled() -> bool:
        runs = dep.runs()
        return all(k in runs and done(runs[k]) for k in keys)

    wait_until(settled, timeout=timeout, interval=0.5)


@pytest.mark.parametrize("policy", ["skip", "queue", "allow"])
def test_overlap_policy_with_three_replicas(
    deployment: Deployments, redis_url: str, policy: str
) -> None:
    dep, sched = start(deployment, redis_url, policy)
    begin = window_start()
    end = begin + WINDOW
    keys = sched.keys_between(begin, end)
    assert len(keys) == 12
    if policy == "queue":
        # The beats promote queued runs: they keep running until the window's backlog drained.
        settle(dep, keys, lambda r: r.status in DONE, timeout=WINDOW.total_seconds() + QUEUE_DRAIN)
    else:
        settle(dep, keys, lambda r: r.status in DONE, timeout=WINDOW.total_seconds() + 30)
    dep.stop_beats()
    runs = dep.runs()
    intervals = read_intervals(dep.exec_dsn)
    ran = Counter(i.occurrence for i in intervals)
    assert intervals, "no execution finished"
    check([f"{k} ran {n} times" for k, n in ran.items() if n > 1], "duplicates")
    assert {r.coordination_outcome for r in runs.values()} == {"won_lock"}
    # Who claimed (or promoted) each run: shown on failure, not asserted (a race by design).
    print("statuses:", Counter((runs[k].status, runs[k].reason) for k in keys if k in runs))
    print("replicas:", Counter(runs[k].replica for k in keys if k in runs))

    if policy == "skip":
        check(show(overlapping(intervals)), "overlapping executions under skip")
        skipped = [k for k in keys if runs.get(k) and runs[k].status == "skipped"]
        executed = [k for k in keys if k not in skipped]
        check(
            [f"{k}: reason {runs[k].reason!r}" for k in skipped if runs[k].reason != "overlap"]
            + [f"{k}: skipped, but its body ran" for k in skipped if ran[k]],
            "skipped occurrences",
        )
        check(problems_ran_once(executed, runs, ran), "executed occurrences")
        # A 3 s body every second: the next two or three occurrences find it still running.
        assert len(executed) >= 2 and len(skipped) >= len(keys) // 2, (executed, skipped)
    elif policy == "queue":
        check(show(overlapping(intervals)), "overlapping executions under queue")
        check(problems_ran_once(keys, runs, ran), "queued occurrences of the window")
        order = [i.occurrence or "" for i in intervals]
        assert order == sorted(order, key=scheduled_at), f"executed out of order: {order}"
    else:
        check(problems_ran_once(keys, runs, ran), "occurrences of the window")
        assert overlapping(intervals), "no two executions overlapped under allow"
