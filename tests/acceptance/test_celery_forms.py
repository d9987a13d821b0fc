"""A ``beat_schedule`` written for Celery's own beat, every form of it, runs under
``celery beat -S voltro`` (issue 10): two replicas, PostgreSQL, Redis, a prefork worker,
pickle messages.

The schedule mixes every schedule form Celery accepts (intervals as a timedelta, a number and
``schedule(relative=True)``, ``relative=True`` on an entry, cron strings of 5 and 6 fields,
``crontab``, ``solar``, a one-off ``datetime``, and two schedule classes of the app's own) with
``args`` as a list and as a tuple, ``kwargs``, ``options`` (``queue``, ``priority``,
``expires``, ``headers``) and ``task_routes``. Every occurrence of the observed window runs
exactly once, and the worker sees Celery's beat message: the ``celery_beat_task`` header,
list arguments and their ``argsrepr``.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from vbt_forms_proj import CALLS_DDL
from vbt_harness import (
    Deployments,
    Sched,
    check,
    finish,
    now,
    problems_exactly_once,
    problems_no_duplicates,
    window_start,
)

TASK = "vbt_forms.record"
SOLAR = "__import__('celery.schedules').schedules.solar('sunrise', 48.85, 2.35)"
FORMS = "__import__('vbt_forms')"


def schedules(queue: str, once: str) -> list[Sched]:
    """Every form; ``once`` is the source of the one-off's aware datetime."""
    return [
        Sched("timedelta", "timedelta(seconds=2)", {"relative": "True"}, task=TASK),
        Sched("number", "3", {"args": "(1, 'two')"}, task=TASK),
        Sched("celery-interval", "schedule(timedelta(seconds=2), relative=True)", task=TASK),
        Sched("cron-seconds", '"*/2 * * * * *"', {"kwargs": "{'k': [1, None]}"}, task=TASK),
        Sched("cron-minutes", '"* * * * *"', task=TASK),
        Sched(
            "crontab",
            "crontab()",
            {"args": "[timedelta(hours=1)]", "relative": "True"},
            task=TASK,
        ),
        Sched("solar", SOLAR, task=TASK),
        Sched("once", once, task=TASK),
        Sched("own-hook", f"{FORMS}.EveryThreeSeconds()", task=TASK),
        Sched("own-estimate", f"{FORMS}.EveryTwoSeconds()", task=TASK),
        Sched(
            "options",
            "timedelta(seconds=2)",
            {
                "options": repr(
                    {"queue": queue, "priority": 3, "expires": 300, "headers": {"mine": "x"}}
                )
            },
            task=TASK,
        ),
        Sched("routed", "timedelta(seconds=3)", task="vbt_forms.routed"),
    ]


def test_every_celery_form_runs_under_voltro(
    deployment: Deployments, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Celery's worker refuses pickle as root (these machines run tests as root) unless told.
    monkeypatch.setenv("C_FORCE_ROOT", "1")
    dep = deployment(store="postgresql", broker="redis", app="vbt_forms_proj")
    with psycopg.connect(dep.exec_dsn, autocommit=True) as conn:
        conn.execute(CALLS_DDL)
    once = (now() + timedelta(seconds=25)).replace(microsecond=0)
    scheds = schedules(dep.queue, f"datetime.fromisoformat({once.isoformat()!r})")
    dep.configure(
        scheds,
        task_serializer="pickle",
        accept_content=["pickle", "json"],
        # Only the publishing side knows this route; the worker runs the task by its name.
        task_routes={"vbt_forms.routed": {"queue": dep.queue}},
    )
    dep.start_worker()
    dep.start_beats("r1", "r2")
    dep.wait_ready()
    start = window_start()
    # Just past the first whole minute after the one-off: the every-minute forms fire once.
    minute = (max(start + timedelta(seconds=5), once) + timedelta(minutes=1)).replace(
        second=0, microsecond=0
    )
    end = minute + timedelta(seconds=1)
    outcome = finish(dep, scheds, start, end)

    assert {k.rpartition("@")[0] for k in outcome.keys} >= {
        s.name for s in scheds if s.name != "solar"
    }
    check(problems_exactly_once(outcome.keys, outcome.runs, outcome.executions), "exactly once")
    check(problems_no_duplicates(outcome.executions), "duplicates")
    by_task = {e.task_id: e.occurrence for e in outcome.executions}
    with psycopg.connect(dep.exec_dsn) as conn:
        rows = conn.execute(
            "SELECT task_id, args_type, argsrepr, kwargs, beat_header, mine FROM vbt_form_calls"
        ).fetchall()
    calls = {by_task[row[0]].rpartition("@")[0]: row[1:] for row in rows if row[0] in by_task}
    assert all(row[4] is True for row in rows), "a message without celery_beat_task"
    # Celery's beat sends a list whether the entry gave a list or a tuple.
    assert calls["crontab"][:2] == ("list", "[datetime.timedelta(seconds=3600)]")
    assert calls["number"][:2] == ("list", "[1, 'two']")
    assert calls["cron-seconds"][2] == "[('k', [1, None])]"
    assert calls["options"][4] == "x"
    assert "routed" in calls
    for beat in dep.beats.values():
        assert "ERROR" not in beat.text(), beat.tail()
