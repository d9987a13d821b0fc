"""The Celery app the ledger's integration tests run in real worker subprocesses.

Configured by environment variables set by the test: ``LEDGER_BROKER`` (Redis URL, also used
for the counters), ``VOLTRO_BEAT_STORE_URL``, ``VOLTRO_BEAT_DUPLICATE_GUARD`` and
``VOLTRO_BEAT_WORKER_LEASE`` (read by voltro_beat's settings), ``LEDGER_VISIBILITY_TIMEOUT``
(seconds, for the redelivery test).

Every task body counts its executions in Redis (``ledger:<token>:runs``) and the pool child's
pid (``ledger:<token>:pid``); a postrun receiver appends each delivery's final Celery state to
``ledger:<task id>:states``, which shows a delivery whose body the duplicate guard skipped.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery, Task
from celery.exceptions import Reject
from celery.signals import task_postrun

import voltro_beat

BROKER = os.environ.get("LEDGER_BROKER", "redis://127.0.0.1:6379/5")

app = Celery("ledger_app", broker=BROKER, set_as_current=True)
app.conf.update(
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=True,
    # One message at a time per child: what a test publishes is what a child runs next.
    worker_prefetch_multiplier=1,
)
if os.environ.get("LEDGER_VISIBILITY_TIMEOUT"):
    # A crashed worker's unacknowledged message comes back after this many seconds; sweep
    # for such messages every second instead of every 100.
    app.conf.broker_transport_options = {
        "visibility_timeout": float(os.environ["LEDGER_VISIBILITY_TIMEOUT"]),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }

voltro_beat.attach(app)

_redis = redis.Redis.from_url(BROKER)


def _count(token: str) -> int:
    # Counted before the pid is shown: a test that kills the child once it sees the pid
    # must find the execution counted.
    runs = int(_redis.incr(f"ledger:{token}:runs"))
    _redis.set(f"ledger:{token}:pid", os.getpid())
    return runs


@task_postrun.connect(weak=False, dispatch_uid="ledger_app.postrun")
def _trail(task_id: str | None = None, state: str | None = None, **_: Any) -> None:
    _redis.rpush(f"ledger:{task_id}:states", str(state))


@app.task(name="ledger.ok")
def ok(token: str) -> str:
    _count(token)
    return token


@app.task(name="ledger.boom")
def boom(token: str) -> None:
    _count(token)
    raise ValueError(f"boom {token}")


@app.task(name="ledger.flaky", bind=True, max_retries=5)
def flaky(self: Task, token: str, failures: int) -> int:
    _count(token)
    if self.request.retries < failures:
        raise self.retry(countdown=0, exc=ConnectionError(f"flaky {token}"))
    return int(self.request.retries)


@app.task(name="ledger.hang", time_limit=1)
def hang(token: str) -> None:
    _count(token)
    time.sleep(60)


def _hold_first(token: str) -> int:
    """The first execution waits (up to 60 s) to be killed; later ones return at once."""
    runs = _count(token)
    if runs == 1:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
    return runs


@app.task(name="ledger.hold", acks_late=True)
def hold(token: str) -> int:
    return _hold_first(token)


@app.task(name="ledger.hold_requeue", acks_late=True, reject_on_worker_lost=True)
def hold_requeue(token: str) -> int:
    return _hold_first(token)


@app.task(name="ledger.slow")
def slow(token: str, seconds: float) -> int:
    runs = _count(token)
    time.sleep(seconds)
    return runs


@app.task(name="ledger.reject")
def reject(token: str) -> None:
    _count(token)
    raise Reject(f"not for me {token}", requeue=False)


class _Noisy(Task):
    """A task class with its own before_start, which the duplicate guard must keep calling."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        _redis.incr(f"ledger:{args[0]}:before_start")


@app.task(name="ledger.noisy", base=_Noisy)
def noisy(token: str) -> str:
    _count(token)
    return token
