"""Cluster coordination: shard leases, singletons' states, and the shard and epoch a run row
was claimed under.

``_voltro_beat_shards``: one row per shard of a group, with its owner (NULL: free), an epoch
that grows with every change of owner, the owner's lease on the database's clock, and when
the owner last changed. A shard owner's claim checks its row in the same statement
(``voltro_beat.store.shard_leases``). ``_voltro_beat_singletons``: per group and singleton, the
replica that last ran it, at which token (its shard's epoch), its state and since when, and the
traceback of a failure.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from voltro_beat.store.tables import UTCDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

RUNS = "_voltro_schedule_runs"
SHARDS = "_voltro_beat_shards"
SINGLETONS = "_voltro_beat_singletons"


def upgrade() -> None:
    op.create_table(
        SHARDS,
        sa.Column("shard_group", sa.Text, primary_key=True),
        sa.Column("shard", sa.Integer, primary_key=True),
        sa.Column("owner", sa.Text),
        sa.Column("epoch", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("lease_until", UTCDateTime),
        sa.Column("changed_at", UTCDateTime),
    )
    op.create_table(
        SINGLETONS,
        sa.Column("singleton_group", sa.Text, primary_key=True),
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("replica", sa.Text, nullable=False),
        sa.Column("token", sa.Integer, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("since", UTCDateTime, nullable=False),
        sa.Column("error", sa.Text),
    )
    # NULL outside cluster coordination: the firing path's rows stay as small as before.
    op.add_column(RUNS, sa.Column("shard", sa.Integer))
    op.add_column(RUNS, sa.Column("epoch", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table(RUNS) as batch:
        batch.drop_column("epoch")
        batch.drop_column("shard")
    op.drop_table(SINGLETONS)
    op.drop_table(SHARDS)
