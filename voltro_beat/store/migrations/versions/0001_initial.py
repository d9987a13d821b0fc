"""Claims and runs tables.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from voltro_beat.store.tables import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

PENDING = "status IN ('claimed', 'queued')"
LIVE = "status IN ('claimed', 'published', 'started', 'retrying', 'queued')"


def upgrade() -> None:
    op.create_table(
        "_voltro_schedule_claims",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("schedule", sa.Text, nullable=False),
        sa.Column("scheduled_at", UTCDateTime, nullable=False),
        sa.Column("claimed_at", UTCDateTime, nullable=False),
        sa.Column("replica", sa.Text, nullable=False),
    )
    op.create_index(
        "ix_voltro_claims_schedule_at", "_voltro_schedule_claims", ["schedule", "scheduled_at"]
    )
    op.create_table(
        "_voltro_schedule_runs",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("schedule", sa.Text, nullable=False),
        sa.Column("task", sa.Text, nullable=False),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("scheduled_at", UTCDateTime, nullable=False),
        sa.Column("coordination_outcome", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("replica", sa.Text),
        sa.Column("worker", sa.Text),
        sa.Column("claimed_at", UTCDateTime),
        sa.Column("published_at", UTCDateTime),
        sa.Column("started_at", UTCDateTime),
        sa.Column("finished_at", UTCDateTime),
        sa.Column("duration", sa.Float),
        sa.Column("retries", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("error", sa.Text),
    )
    op.create_index(
        "ix_voltro_runs_schedule_at", "_voltro_schedule_runs", ["schedule", "scheduled_at"]
    )
    op.create_index("ix_voltro_runs_scheduled_at", "_voltro_schedule_runs", ["scheduled_at"])
    op.create_index("ix_voltro_runs_task_id", "_voltro_schedule_runs", ["task_id"])
    op.create_index(
        "ix_voltro_runs_live",
        "_voltro_schedule_runs",
        ["schedule", "scheduled_at"],
        postgresql_where=sa.text(LIVE),
        sqlite_where=sa.text(LIVE),
    )
    op.create_index(
        "ix_voltro_runs_pending",
        "_voltro_schedule_runs",
        ["status", "claimed_at"],
        postgresql_where=sa.text(PENDING),
        sqlite_where=sa.text(PENDING),
    )


def downgrade() -> None:
    op.drop_table("_voltro_schedule_runs")
    op.drop_table("_voltro_schedule_claims")
