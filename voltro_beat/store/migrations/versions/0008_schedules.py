"""Schedules kept in the database, and their changes.

``_voltro_beat_schedules``: one row per schedule defined in the database rather than in the
app's ``beat_schedule`` (its definition as JSON, whether it fires, the revision of its last
change). A run row's ``revision``: the revision that fired it. The registry's
``schedules_revision``: the newest revision each replica applied.
``_voltro_beat_schedule_changes``: one row per change, numbered by a revision that
grows with every change of any schedule, with the row before and after.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from voltro_beat.store.tables import UTCDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

SCHEDULES = "_voltro_beat_schedules"
SCHEDULE_CHANGES = "_voltro_beat_schedule_changes"
REPLICAS = "_voltro_beat_replicas"
RUNS = "_voltro_schedule_runs"


def upgrade() -> None:
    op.create_table(
        SCHEDULES,
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("schedule_group", sa.Text, nullable=False),
        sa.Column("definition", sa.Text, nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("changed_by", sa.Text, nullable=False),
        sa.Column("changed_at", UTCDateTime, nullable=False),
    )
    op.create_table(
        SCHEDULE_CHANGES,
        sa.Column("revision", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("before", sa.Text),
        sa.Column("after", sa.Text),
        sa.Column("changed_by", sa.Text, nullable=False),
        sa.Column("changed_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_voltro_schedule_changes_name", SCHEDULE_CHANGES, ["name", "revision"])
    # NULL for the app's own entries: their rows stay as small as before.
    op.add_column(RUNS, sa.Column("revision", sa.Integer))
    op.add_column(
        REPLICAS,
        sa.Column("schedules_revision", sa.Integer, nullable=False, server_default=sa.text("0")),
    )


def downgrade() -> None:
    with op.batch_alter_table(REPLICAS) as batch:
        batch.drop_column("schedules_revision")
    with op.batch_alter_table(RUNS) as batch:
        batch.drop_column("revision")
    op.drop_index("ix_voltro_schedule_changes_name", SCHEDULE_CHANGES)
    op.drop_table(SCHEDULE_CHANGES)
    op.drop_table(SCHEDULES)
