"""Indexes for the admin views: newest first, and each list filter, without a sort.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

RUNS = "_voltro_schedule_runs"
#: The admin lists runs by ``scheduled_at DESC, id DESC`` (the key breaks ties between
#: schedules due at the same instant, so that pages do not overlap); each index below ends with
#: those two columns, so a filtered page is a range of one index read backwards.
NEWEST = ["scheduled_at", "id"]


def upgrade() -> None:
    # (scheduled_at, id) serves everything the plain scheduled_at index did (the retention
    # sweep, `voltro-beat runs`) and the admin's default page: one index instead of two.
    op.drop_index("ix_voltro_runs_scheduled_at", table_name=RUNS)
    op.create_index("ix_voltro_runs_newest", RUNS, NEWEST)
    op.create_index("ix_voltro_runs_status_newest", RUNS, ["status", *NEWEST])
    op.create_index("ix_voltro_runs_outcome_newest", RUNS, ["coordination_outcome", *NEWEST])


def downgrade() -> None:
    op.drop_index("ix_voltro_runs_outcome_newest", table_name=RUNS)
    op.drop_index("ix_voltro_runs_status_newest", table_name=RUNS)
    op.drop_index("ix_voltro_runs_newest", table_name=RUNS)
    op.create_index("ix_voltro_runs_scheduled_at", RUNS, ["scheduled_at"])
