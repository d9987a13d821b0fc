"""Leases and deadlines on run rows; the replica registry.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from voltro_beat.store.tables import UTCDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

RUNS = "_voltro_schedule_runs"
LEASED = "status IN ('claimed')"
OLD_PENDING = "status IN ('claimed', 'queued')"


def upgrade() -> None:
    op.add_column(RUNS, sa.Column("lease_until", UTCDateTime))
    op.add_column(RUNS, sa.Column("deadline", UTCDateTime))
    # Rows written before leases existed: the lease a replica had (publish_timeout's default,
    # 10 s, after the instant or claim) and the default max_lateness (one day).
    if op.get_context().dialect.name == "postgresql":
        op.execute(
            f"UPDATE {RUNS} SET lease_until = GREATEST(claimed_at, scheduled_at)"
            " + interval '10 seconds', deadline = scheduled_at + interval '1 day'"
            f" WHERE {OLD_PENDING}"
        )
    else:
        fmt = "'%Y-%m-%d %H:%M:%f000'"
        op.execute(
            f"UPDATE {RUNS} SET"
            f" lease_until = strftime({fmt}, max(claimed_at, scheduled_at), '+10 seconds'),"
            f" deadline = strftime({fmt}, scheduled_at, '+1 day') WHERE {OLD_PENDING}"
        )
    op.drop_index("ix_voltro_runs_pending", table_name=RUNS)
    op.create_index(
        "ix_voltro_runs_lease",
        RUNS,
        ["lease_until"],
        postgresql_where=sa.text(LEASED),
        sqlite_where=sa.text(LEASED),
    )
    op.create_table(
        "_voltro_beat_replicas",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("version", sa.Text, nullable=False),
        sa.Column("started_at", UTCDateTime, nullable=False),
        sa.Column("last_seen", UTCDateTime, nullable=False),
        sa.Column("clock_offset", sa.Float),
        sa.Column("settings", sa.Text, nullable=False),
        sa.Column("schedules", sa.Text, nullable=False),
        sa.Column("schedules_digest", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("_voltro_beat_replicas")
    op.drop_index("ix_voltro_runs_lease", table_name=RUNS)
    op.create_index(
        "ix_voltro_runs_pending",
        RUNS,
        ["status", "claimed_at"],
        postgresql_where=sa.text(OLD_PENDING),
        sqlite_where=sa.text(OLD_PENDING),
    )
    op.drop_column(RUNS, "deadline")
    op.drop_column(RUNS, "lease_until")
