"""voltro_beat's tables (claims, runs, the replica registry, watermarks, shard leases,
schedules kept in the database and their changes): SQLAlchemy Core.

``_voltro_schedule_claims`` is the short fence (pruned fast); ``_voltro_schedule_runs`` is the
run ledger and the long fence: both are keyed by the occurrence key (guarantee 4). Status
sets in predicates and constraints come from :mod:`voltro_beat.status`. The schema itself is
created by the Alembic migrations in :mod:`voltro_beat.store.migrations`; this module describes it
for the queries and must match the latest migration (a test compares them).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    Float,
    Index,
    Integer,
    Interval,
    MetaData,
    Table,
    Text,
    text,
)
from sqlalchemy.types import TypeDecorator

from voltro_beat.exceptions import NaiveDatetimeError
from voltro_beat.status import UNFINISHED, Status, sql_in

CLAIMS = "_voltro_schedule_claims"
RUNS = "_voltro_schedule_runs"
REPLICAS = "_voltro_beat_replicas"
WATERMARKS = "_voltro_beat_watermarks"
SHARDS = "_voltro_beat_shards"
SINGLETONS = "_voltro_beat_singletons"
SCHEDULES = "_voltro_beat_schedules"
SCHEDULE_CHANGES = "_voltro_beat_schedule_changes"
VERSION_TABLE = "_voltro_beat_alembic_version"


class UTCDateTime(TypeDecorator[datetime]):
    """An aware UTC instant on every dialect.

    PostgreSQL stores ``timestamptz``; SQLite has no time zone type, so instants are stored as
    naive UTC text (which still sorts correctly) and made aware again on the way out.
    Naive datetimes are refused on the way in (guarantee 8).
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def coerce_compared_value(self, op: Any, value: Any) -> Any:
        # ``instant + timedelta`` in SQL: the timedelta is an interval, not an instant.
        return Interval() if isinstance(value, timedelta) else self

    def process_bind_param(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise NaiveDatetimeError(f"voltro_beat stores aware datetimes only, got {value!r}")
        utc = value.astimezone(UTC)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if not isinstance(value, datetime):
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def instant(value: Any) -> datetime:
    """A clock reading or stored instant as an aware UTC datetime (SQLite returns text where
    SQLAlchemy cannot see a column type, and naive datetimes where it can)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


#: Runs that are not finished: on their way, running, or waiting behind a predecessor.
LIVE = sql_in(UNFINISHED)
#: Runs a replica holds under a lease, to publish (the recovery sweep's partial index).
LEASED = sql_in({Status.CLAIMED})

metadata = MetaData()

claims = Table(
    CLAIMS,
    metadata,
    Column("id", Text, primary_key=True),
    Column("schedule", Text, nullable=False),
    Column("scheduled_at", UTCDateTime, nullable=False),
    Column("claimed_at", UTCDateTime, nullable=False),
    Column("replica", Text, nullable=False),
    Index("ix_voltro_claims_schedule_at", "schedule", "scheduled_at"),
)

runs = Table(
    RUNS,
    metadata,
    Column("id", Text, primary_key=True),
    Column("schedule", Text, nullable=False),
    Column("task", Text, nullable=False),
    Column("task_id", Text, nullable=False),
    Column("scheduled_at", UTCDateTime, nullable=False),
    Column("coordination_outcome", Text, nullable=False),
    Column("status", Text, nullable=False),
    # Why: a missed or skipped run (late, store_down, publish_failed, catch_up, overlap), a
    # live run that stopped blocking its schedule (overlap_timeout), a retry or a revoke.
    Column("reason", Text),
    Column("replica", Text),
    Column("worker", Text),
    Column("claimed_at", UTCDateTime),
    Column("published_at", UTCDateTime),
    Column("started_at", UTCDateTime),
    Column("finished_at", UTCDateTime),
    Column("duration", Float),
    Column("retries", Integer, nullable=False, server_default=text("0")),
    Column("error", Text),
    # A ``claimed`` row may be published by ``replica`` only until then, on the database's
    # clock; after it, any replica may take the row over (guarantee 10).
    Column("lease_until", UTCDateTime),
    # The instant plus the entry's max_lateness: never published after it (guarantee 6).
    Column("deadline", UTCDateTime),
    # A ``started`` row is the worker's that started it (``worker``) until then, on the
    # database's clock, renewed while the body runs: a second delivery of the occurrence runs
    # the body only once it lapsed (the earlier execution died; docs/ledger.md).
    Column("worker_lease_until", UTCDateTime),
    # Deliveries of this occurrence the worker did not run (another one was live or done).
    # NULL until the first one: a row pays no space for it on the firing path (migration 0005).
    Column("duplicates", Integer),
    # Cluster coordination: the shard of the schedule and the epoch its owner claimed the run
    # at (NULL otherwise; migration 0007).
    Column("shard", Integer),
    Column("epoch", Integer),
    # The revision of the schedules table that fired it (NULL: the app's own entry, or an
    # operator's command; migration 0008).
    Column("revision", Integer),
    Index("ix_voltro_runs_schedule_at", "schedule", "scheduled_at"),
    # Newest first (the retention sweep, `voltro-beat runs`, the admin's pages), also within
    # one status or coordination outcome (the admin's filters); the key breaks ties.
    Index("ix_voltro_runs_newest", "scheduled_at", "id"),
    Index("ix_voltro_runs_status_newest", "status", "scheduled_at", "id"),
    Index("ix_voltro_runs_outcome_newest", "coordination_outcome", "scheduled_at", "id"),
    Index("ix_voltro_runs_task_id", "task_id"),
    # Unfinished runs of a schedule, for the overlap policies: small once workers record
    # their outcomes (voltro_beat.attach), however long the runs retention.
    Index(
        "ix_voltro_runs_live",
        "schedule",
        "scheduled_at",
        postgresql_where=text(LIVE),
        sqlite_where=text(LIVE),
    ),
    # Small partial index: the recovery sweep looks among the claimed rows for the ones whose
    # lease ran out. Not on lease_until, so that renewing a lease is an update in place (see
    # migration 0003, which also leaves room on each page for it).
    Index(
        "ix_voltro_runs_claimed",
        "scheduled_at",
        postgresql_where=text(LEASED),
        sqlite_where=text(LEASED),
    ),
    CheckConstraint(sql_in(Status), name="ck_voltro_runs_status"),
)

#: The replica registry: one row per beat replica, refreshed by its heartbeat.
replicas = Table(
    REPLICAS,
    metadata,
    Column("name", Text, primary_key=True),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("version", Text, nullable=False),
    # Both on the database's clock.
    Column("started_at", UTCDateTime, nullable=False),
    Column("last_seen", UTCDateTime, nullable=False),
    # Its local wall clock minus the database's, in seconds, at its last heartbeat.
    Column("clock_offset", Float),
    # JSON: the settings replicas compare (voltro_beat.replicas.SHARED_SETTINGS).
    Column("settings", Text, nullable=False),
    # JSON {schedule name: hash of its definition}, and a hash of that map.
    Column("schedules", Text, nullable=False),
    Column("schedules_digest", Text, nullable=False),
    # The newest revision of the schedules table it has applied (migration 0008).
    Column("schedules_revision", Integer, nullable=False, server_default=text("0")),
)

#: Per swept table (``name``), the instant before which its rows may be gone: claims of older
#: occurrences are refused, since their run row (the long fence) may have been swept.
watermarks = Table(
    WATERMARKS,
    metadata,
    Column("name", Text, primary_key=True),
    Column("before", UTCDateTime, nullable=False),
)

#: Cluster coordination's shard leases: per group and shard, its owner (NULL: free), the epoch
#: (one more at every change of owner), the owner's lease and when the owner last changed, on
#: the database's clock.
shards = Table(
    SHARDS,
    metadata,
    Column("shard_group", Text, primary_key=True),
    Column("shard", Integer, primary_key=True),
    Column("owner", Text),
    Column("epoch", Integer, nullable=False, server_default=text("0")),
    Column("lease_until", UTCDateTime),
    Column("changed_at", UTCDateTime),
)

#: Singletons (cluster coordination): per group and name, the replica that last ran it, at which
#: token (its shard's epoch), its state (``running``, ``returned``, ``failed``, ``stopped``) and
#: since when on the database's clock, and a failure's traceback.
singletons = Table(
    SINGLETONS,
    metadata,
    Column("singleton_group", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    Column("replica", Text, nullable=False),
    Column("token", Integer, nullable=False),
    Column("state", Text, nullable=False),
    Column("since", UTCDateTime, nullable=False),
    Column("error", Text),
)

#: Schedules kept in the database (``voltro-beat schedules``, the admins): per name, its group,
#: its definition (a JSON document, :mod:`voltro_beat.definitions`), whether it fires, the
#: revision of its last change (the change's row in ``schedule_changes``), who made it and
#: when, on the database's clock.
schedules = Table(
    SCHEDULES,
    metadata,
    Column("name", Text, primary_key=True),
    Column("schedule_group", Text, nullable=False),
    Column("definition", Text, nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("revision", Integer, nullable=False),
    Column("changed_by", Text, nullable=False),
    Column("changed_at", UTCDateTime, nullable=False),
)

#: One row per change of the schedules table: its revision (one more than the last change of
#: any schedule: replicas read what changed since the revision they applied), the schedule,
#: the action (add, set, enable, disable, remove), the row before and after it (JSON, NULL
#: where there was none), who and when.
schedule_changes = Table(
    SCHEDULE_CHANGES,
    metadata,
    Column("revision", Integer, primary_key=True, autoincrement=False),
    Column("name", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("before", Text),
    Column("after", Text),
    Column("changed_by", Text, nullable=False),
    Column("changed_at", UTCDateTime, nullable=False),
    Index("ix_voltro_schedule_changes_name", "name", "revision"),
)
