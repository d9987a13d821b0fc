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

from celery import Task
from vbt_proj import app, exec_connection

import voltro_beat

voltro_beat.attach(app)


# The hard time limit is also the entries' default overlap timeout (beat reads it).
@app.task(bind=True, name="vbt_overlap.slow", time_limit=10)
def slow(self: Task, seconds: float = 3.0) -> None:
    """Sleep ``seconds``; then record the body's interval."""
    started = datetime.now(UTC)
    time.sleep(seconds)
    exec_connection().execute(
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
