"""The Celery app the acceptance tests run as real ``celery beat -S voltro`` and worker processes.

Configured entirely from the environment so that one module serves every scenario:

* ``VBT_CONFIG_FILE``: a Python file defining ``CONFIG``, a dict merged into ``app.conf``
  (broker, queue, ``beat_schedule``, ``voltro_beat_*`` settings); the tests write it.
* ``VBT_EXEC_DSN``: the libpq DSN of the test's own PostgreSQL database, where
  :func:`record` writes one row per execution (table ``vbt_executions``, created by the
  test: ``vbt_harness.EXECUTIONS_DDL``).

The store URL and the replica name come from ``VOLTRO_BEAT_STORE_URL`` and
``VOLTRO_BEAT_REPLICA``, the way an operator would set them. The app calls
``voltro_beat.attach(app)``, as the README asks: its workers keep the run ledger and the
duplicate guard, so an execution counted in ``vbt_executions`` is a body that ran.
"""

from __future__ import annotations

import os
import runpy
from datetime import UTC, datetime
from typing import Any

import psycopg
from celery import Celery, Task

import voltro_beat
import voltro_beat.singletons

app = Celery("vbt_proj")
app.conf.update(timezone="UTC", enable_utc=True, result_expires=None)
_config_file = os.environ.get("VBT_CONFIG_FILE")
if _config_file:
    app.conf.update(runpy.run_path(_config_file)["CONFIG"])
voltro_beat.attach(app)

_conn: tuple[int, psycopg.Connection[Any]] | None = None


def exec_connection() -> psycopg.Connection[Any]:
    """One autocommit connection per (forked) pool process."""
    global _conn
    if _conn is None or _conn[0] != os.getpid() or _conn[1].closed:
        _conn = (os.getpid(), psycopg.connect(os.environ["VBT_EXEC_DSN"], autocommit=True))
    return _conn[1]


@app.task(bind=True, name="vbt_proj.record")
def record(self: Task) -> None:
    """Write this execution to the table."""
    write_execution(self.request)


def write_execution(request: Any) -> None:
    """One row of ``vbt_executions``: the voltro headers as the worker sees them and whether
    the broker flagged the message as redelivered."""
    exec_connection().execute(
        "INSERT INTO vbt_executions"
        " (task_id, occurrence, periodic_task_name, worker_pid, executed_at, redelivered)"
        " VALUES (%s, %s, %s, %s, %s, %s)",
        (
            request.id,
            getattr(request, "voltro_occurrence", None),
            getattr(request, "periodic_task_name", None),
            os.getpid(),
            datetime.now(UTC),
            bool((request.delivery_info or {}).get("redelivered")),
        ),
    )


def write_token(context: voltro_beat.singletons.Context) -> None:
    """A singleton (``tests/acceptance/test_cluster.py``): every 100 ms, the replica's name and
    its fencing token into ``vbt_singleton_writes``, fenced as a user's write should be: the
    row of ``vbt_fence`` takes only a token at least its own, under its row lock, so an owner
    that lost the singleton and has not noticed yet writes nothing."""
    with psycopg.connect(os.environ["VBT_EXEC_DSN"]) as conn:
        while not context.stop.wait(0.1):
            with conn.transaction():
                fenced = conn.execute(
                    "UPDATE vbt_fence SET token = %s WHERE id = 1 AND token <= %s",
                    (context.token, context.token),
                ).rowcount
                if fenced:
                    conn.execute(
                        "INSERT INTO vbt_singleton_writes (token, replica, at)"
                        " VALUES (%s, %s, clock_timestamp())",
                        (context.token, context.replica),
                    )
