"""The app whose runs the admin tests show (``tests/contrib``): :mod:`vbt_proj`'s app with the
ledger attached and a task for each outcome a run can have.

Configured like :mod:`vbt_proj` (``VBT_CONFIG_FILE``). ``voltro_beat.attach(app)`` lets the
worker record ``started`` / ``retrying`` / ``succeeded`` / ``failed``; the admin tests' Django
project and ``voltro-beat admin`` load this module too, for the schedules' next occurrences.
"""

from __future__ import annotations

from celery import Task
from vbt_proj import app

import voltro_beat

voltro_beat.attach(app)


@app.task(name="vbt_admin.ok")
def ok() -> str:
    return "ok"


@app.task(name="vbt_admin.boom")
def boom() -> None:
    raise ValueError("boom")


@app.task(bind=True, name="vbt_admin.flaky", max_retries=3)
def flaky(self: Task) -> int:
    """Fails its first attempt, succeeds on the retry: a run with ``retries = 1``."""
    if self.request.retries < 1:
        raise self.retry(countdown=0, exc=ConnectionError("flaky"))
    return int(self.request.retries)
