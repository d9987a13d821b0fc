"""The demo's Celery app: a few schedules and a task that notes each execution.

Configured from the environment by ``demo/run.py``: ``DEMO_BROKER_URL`` (a filesystem folder
by default, so no server is needed) and ``VOLTRO_BEAT_STORE_URL``.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from celery import Celery, Task
from celery.schedules import crontab

import voltro_beat

app = Celery("demo_app")
broker = os.environ.get("DEMO_BROKER_URL", "filesystem://")
app.conf.update(
    broker_url=broker,
    timezone="UTC",
    beat_enable_remote_control=False,
    worker_enable_remote_control=False,
    broker_connection_retry_on_startup=True,
    beat_schedule={
        "every-second": {"task": "demo_app.note", "schedule": "* * * * * *"},
        "every-2s": {"task": "demo_app.note", "schedule": timedelta(seconds=2)},
        "every-5s": {"task": "demo_app.note", "schedule": "*/5 * * * * *"},
        "every-minute": {"task": "demo_app.note", "schedule": crontab(minute="*")},
    },
)
if broker.startswith("filesystem"):
    folder = os.environ["DEMO_BROKER_FOLDER"]
    # kombu's filesystem transport, writing each message whole before a worker sees it.
    app.conf.broker_transport = "demo_broker:Transport"
    app.conf.broker_transport_options = {
        "data_folder_in": folder,
        "data_folder_out": folder,
        "control_folder": os.path.join(folder, "control"),
        "store_processed": False,
    }
voltro_beat.attach(app)

executions = sa.Table(
    "demo_executions",
    sa.MetaData(),
    sa.Column("task_id", sa.Text, nullable=False),
    sa.Column("occurrence", sa.Text),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("executed_at", sa.Text, nullable=False),
)
_engines: dict[int, sa.Engine] = {}


def _db() -> sa.Engine:
    # One engine per process: prefork children must not share their parent's connections.
    engine = _engines.get(os.getpid())
    if engine is None:
        engine = _engines[os.getpid()] = sa.create_engine(os.environ["VOLTRO_BEAT_STORE_URL"])
        executions.create(engine, checkfirst=True)
    return engine


@app.task(bind=True)
def note(self: Task) -> None:
    """Write one row per execution, so the demo can show each occurrence ran once."""
    with _db().begin() as conn:
        conn.execute(
            executions.insert().values(
                task_id=self.request.id,
                occurrence=getattr(self.request, "voltro_occurrence", None),
                pid=os.getpid(),
                executed_at=datetime.now(UTC).isoformat(),
            )
        )
