"""The store fails for 10 s or more under three running replicas.

The outage stops a PostgreSQL cluster of the test's own (initdb in a temp dir), never the
machine's shared server.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import psycopg
from vbt_harness import (
    REPLICAS,
    Deployment,
    Deployments,
    PrivatePostgres,
    Sched,
    check,
    finish,
    keys_in,
    now,
    problems_exactly_once,
    problems_missed,
    problems_missed_or_once,
    problems_no_duplicates,
    problems_not_before,
    sleep_until,
    wait_until,
    window_start,
)

OUTAGE = timedelta(seconds=10)
#: Late enough for every occurrence of the outage: published late, each one once.
PATIENT = Sched("patient", '"* * * * * *"', {"max_lateness": "120"})
#: Too short for most of the outage: its older occurrences must be recorded missed.
SHORT = Sched("short", "timedelta(seconds=1)", {"max_lateness": "timedelta(seconds=4)"})
SHORT_LATENESS = SHORT.entry().max_lateness
HALF = timedelta(milliseconds=500)
STORE_DOWN = {"store_down", "late"}


def _start(dep: Deployment, *schedules: Sched) -> None:
    dep.configure(schedules, voltro_beat_publish_timeout=3, broker_connection_timeout=1)
    dep.start_worker()
    dep.start_beats(*REPLICAS)
    dep.wait_ready()


def _recovered(dep: Deployment, since: datetime) -> bool:
    return any(r.claimed_at and r.claimed_at > since for r in dep.runs().values())


def test_store_down_for_10s_publishes_nothing_then_late_or_missed_by_max_lateness(
    deployment: Deployments, private_postgres: PrivatePostgres
) -> None:
    dep = deployment(store=private_postgres.url)
    _start(dep, PATIENT, SHORT)

    # Half a second past an occurrence, when nothing is between its claim and its mark: a
    # stop inside that window is the next test's business.
    start = window_start()
    sleep_until(start + timedelta(seconds=6) + HALF)
    stopping = now()
    private_postgres.stop("fast")
    down = now()
    sleep_until(stopping + OUTAGE)
    starting = now()
    private_postgres.start()
    up = now()
    # The replicas retry every second; wait until one of them recorded something again.
    assert wait_until(lambda: _recovered(dep, up), timeout=20), "no replica came back"
    recovered = now()
    end = recovered + timedelta(seconds=5)
    outcome = finish(dep, [PATIENT, SHORT], start, end)

    patient, short = outcome.keys_of(PATIENT.name), outcome.keys_of(SHORT.name)
    # Still unrecorded when the store came back, and older than SHORT's bound by then.
    too_late = keys_in(short, down, starting - SHORT_LATENESS)
    assert len(too_late) >= 4, too_late
    problems = problems_no_duplicates(outcome.executions)
    problems += problems_exactly_once(patient, outcome.runs, outcome.executions)
    problems += problems_not_before(keys_in(patient + short, down, starting), outcome, starting)
    problems += problems_exactly_once(
        keys_in(short, start, stopping - HALF) + keys_in(short, recovered, end),
        outcome.runs,
        outcome.executions,
    )
    problems += problems_missed(too_late, outcome, STORE_DOWN)
    problems += problems_missed_or_once(
        keys_in(short, stopping - HALF, down)
        + keys_in(short, starting - SHORT_LATENESS, recovered),
        outcome,
        STORE_DOWN,
    )
    check(problems, f"store down {stopping:%T.%f}..{down:%T.%f}, up {starting:%T.%f}..{up:%T.%f}")


REFUSE_MARKS = """
CREATE FUNCTION vbt_refuse_marks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'vbt: the store refuses to mark runs published';
END $$;
CREATE TRIGGER vbt_refuse_marks BEFORE UPDATE ON _voltro_schedule_runs FOR EACH ROW
    WHEN (OLD.published_at IS NULL AND NEW.published_at IS NOT NULL)
    EXECUTE FUNCTION vbt_refuse_marks();
"""
ACCEPT_MARKS = "DROP TRIGGER vbt_refuse_marks ON _voltro_schedule_runs"


def test_store_failing_between_publish_and_mark_does_not_duplicate(
    deployment: Deployments,
) -> None:
    """The store fails after a replica published a run but before it marked it published.

    A trigger makes every "mark published" fail for 14 s while claims still work, so each
    replica publishes one batch, cannot mark it, and waits for the store (a deterministic
    stand-in for a store that dies between the two statements, as PostgreSQL stopped on an
    occurrence's instant does). Once marks work again, every run must still execute once.
    """
    dep = deployment()
    _start(dep, PATIENT)

    start = window_start()
    sleep_until(start + timedelta(seconds=3) + HALF)
    with psycopg.connect(dep.exec_dsn, autocommit=True) as conn:
        conn.execute(REFUSE_MARKS)
        failing = now()
        sleep_until(failing + timedelta(seconds=14))
        conn.execute(ACCEPT_MARKS)
    healed = now()
    assert wait_until(lambda: _recovered(dep, healed), timeout=20), "no replica came back"
    end = now() + timedelta(seconds=2)
    outcome = finish(dep, [PATIENT], start, end)

    problems = problems_no_duplicates(outcome.executions)
    problems += problems_exactly_once(outcome.keys, outcome.runs, outcome.executions)
    check(problems, f"marks refused {failing:%T.%f}..{healed:%T.%f}")
