"""Run statuses checked by the database.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

#: The statuses of voltro_beat.status.Status at this revision (a migration is a snapshot: a
#: new status needs a new migration, and a unit test compares this text with the enum).
STATUSES = (
    "status IN ('claimed', 'published', 'started', 'retrying', 'succeeded', 'failed', "
    "'revoked', 'rejected', 'missed', 'skipped', 'queued')"
)
NAME = "ck_voltro_runs_status"
RUNS = "_voltro_schedule_runs"


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        # NOT VALID: enforced on every write from now on without scanning (and locking) a
        # runs table of millions of rows at boot; the rows already there were written by
        # voltro_beat itself.
        op.execute(f"ALTER TABLE {RUNS} ADD CONSTRAINT {NAME} CHECK ({STATUSES}) NOT VALID")
        return
    # SQLite cannot add a constraint to a table without rebuilding it: triggers enforce the
    # same rule.
    for when in ("INSERT", "UPDATE OF status"):
        op.execute(
            f"CREATE TRIGGER {NAME}_{when.split()[0].lower()} BEFORE {when} ON {RUNS} "
            f"WHEN NOT (NEW.{STATUSES}) "
            f"BEGIN SELECT RAISE(ABORT, 'CHECK constraint failed: {NAME}'); END"
        )


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE {RUNS} DROP CONSTRAINT {NAME}")
        return
    for event in ("insert", "update"):
        op.execute(f"DROP TRIGGER {NAME}_{event}")
