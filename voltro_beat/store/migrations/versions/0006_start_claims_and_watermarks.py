"""The worker's start claim on run rows, and the retention watermark.

``worker_lease_until``: a worker that starts an occurrence holds its run row until then (on
the database's clock) and renews it while the body runs; a second delivery of the occurrence
runs the body only once that lease has lapsed (the earlier execution died).
``duplicates``: how many deliveries of the occurrence the worker did not run because another
one was live or had finished.

``_voltro_beat_watermarks``: per swept table, the instant before which its rows may be gone.
Claims of occurrences older than the runs table's watermark are refused: the run row, the long
fence, may have been swept (guarantee 4), so such an occurrence could otherwise be sent again.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from voltro_beat.store.tables import UTCDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

RUNS = "_voltro_schedule_runs"
WATERMARKS = "_voltro_beat_watermarks"


def upgrade() -> None:
    op.add_column(RUNS, sa.Column("worker_lease_until", UTCDateTime))
    # NULL for none: the firing path's rows stay as small as before (0005's room per page).
    op.add_column(RUNS, sa.Column("duplicates", sa.Integer))
    op.create_table(
        WATERMARKS,
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("before", UTCDateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table(WATERMARKS)
    with op.batch_alter_table(RUNS) as batch:
        batch.drop_column("duplicates")
        batch.drop_column("worker_lease_until")
