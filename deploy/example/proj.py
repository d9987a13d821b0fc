"""The Celery app the deploy/ recipes run: beat (``celery -A proj beat -S voltro``), the worker
(``celery -A proj worker``) and the platform-driven trigger (``voltro-beat trigger``).

Replace it with your own app: the recipes only need its module name. Every address comes from
the environment, so the same image serves every process:

* ``CELERY_BROKER_URL``: the broker;
* ``VOLTRO_BEAT_STORE_URL``: the store (read by voltro_beat itself);
* ``VOLTRO_BEAT_MIGRATE=false`` in the long-running processes: a migration job or a DBA
  upgrades the schema (``voltro-beat db upgrade``), under a role of its own.
"""

from __future__ import annotations

import os

from celery import Celery
from celery.schedules import crontab

import voltro_beat

app = Celery("proj", broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(timezone="UTC", enable_utc=True)
app.conf.beat_schedule = {
    "heartbeat": {"task": "proj.ping", "schedule": 10.0},
    "digest": {"task": "proj.ping", "schedule": crontab(minute="*/5")},
    # Fired by the platform's clock (deploy/kubernetes/cronjob.yaml), never by beat: the
    # CronJob's command claims the occurrence, so a second Job for one time publishes nothing.
    "nightly-report": {"task": "proj.ping", "schedule": "0 2 * * *", "trigger": "external"},
}
# The workers record started / succeeded / failed in the run ledger (docs/ledger.md).
voltro_beat.attach(app)


@app.task(name="proj.ping")
def ping() -> str:
    return "pong"
