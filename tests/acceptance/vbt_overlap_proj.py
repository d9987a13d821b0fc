"""The app of ``test_overlap.py``: :mod:`vbt_proj`'s app, ledger attached, and a slow task.

Configured like :mod:`vbt_proj` (``VBT_CONFIG_FILE``, ``VBT_EXEC_DSN``), whose app this module
reuses. ``voltro_beat.attach(app)`` lets the worker record ``started`` / ``succeeded``, which is
what the ``skip`` and ``queue`` policies wait for.

:func:`slow` sleeps, then writes when its body started and ended to ``vbt_intervals`` in the
test's own database (``test_overlap.INTERVALS_DDL``): one row per execution that ran to its end.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
from celery import Task
from vbt_proj import app

import voltro_beat

voltro_beat.attach(app)

_conn: tuple[int, psycopg.Connection[Any]] | None = None


def _connection() -> psycopg.Connection[Any]:
    """One autocommit connection per (forked) pool process."""
    global _conn
    if _conn is None or _conn[0] != os.getpid() or _conn[1].closed:
        _conn = (os.getpid(), psycopg.connect(os.environ["VBT_EXEC_DSN"], autocommit=True))
    return _conn[1]


# The hard time limit is also the entries' default overlap timeout (beat reads it).
@app.task(bind=True, name="vbt_overlap.slow", time_limit=10)
def slow(self: Task, seconds: float = 3.0) -> None:
    """Sleep ``seconds``; then record the body's interval."""
    started = datetime.now(UTC)
    time.sleep(seconds)
    _connection().execute(
        "INSERT INTO vbt_intervals (occurrence, task_id, worker_pid, started_at, finished_at)"
        " VALUES (%s, %s, %s, %s, %s)",
        (
            getattr(self.request, "voltro_occurrence", None),
            self.request.id,
            os.getpid(),
            started,
            datetime.now(UTC),
        ),
    )
