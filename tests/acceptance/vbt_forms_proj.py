"""The app of test_celery_forms: :mod:`vbt_proj`'s app (config from ``VBT_CONFIG_FILE``)
plus a task that takes arguments and records what the worker saw of each message in
``vbt_form_calls`` (created by the test: ``CALLS_DDL``), beside its ``vbt_executions`` row."""

from __future__ import annotations

from typing import Any

from celery import Task
from vbt_proj import app, exec_connection, write_execution

CALLS_DDL = """
CREATE TABLE vbt_form_calls (
    task_id text PRIMARY KEY,
    args_type text NOT NULL,
    argsrepr text,
    kwargs text NOT NULL,
    beat_header boolean,
    mine text
)"""

__all__ = ["CALLS_DDL", "app", "record_call", "routed"]


def _record_call(self: Task, *args: Any, **kwargs: Any) -> None:
    request = self.request
    exec_connection().execute(
        "INSERT INTO vbt_form_calls (task_id, args_type, argsrepr, kwargs, beat_header, mine)"
        " VALUES (%s, %s, %s, %s, %s, %s)",
        (
            request.id,
            type(request.args).__name__,
            getattr(request, "argsrepr", None),
            repr(sorted(kwargs.items())),
            getattr(request, "celery_beat_task", None),
            getattr(request, "mine", None),
        ),
    )
    write_execution(request)


record_call = app.task(bind=True, name="vbt_forms.record")(_record_call)
#: The same body under the name the test's task_routes route.
routed = app.task(bind=True, name="vbt_forms.routed")(_record_call)
