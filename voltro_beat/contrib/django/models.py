"""Unmanaged models over voltro_beat's tables (:mod:`voltro_beat.store.tables`).

``managed = False``: Django never creates, alters or drops these tables; voltro_beat's Alembic
migrations do. Only the ``view`` permission exists for them.
"""

from __future__ import annotations

from datetime import datetime, timedelta, tzinfo
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from voltro_beat.contrib.display import OUTCOMES
from voltro_beat.status import Status
from voltro_beat.store.tables import CLAIMS, REPLICAS, RUNS, SCHEDULES, SHARDS, SINGLETONS

_PERIODS = ("year", "month", "day")


class RunQuerySet(models.QuerySet[Any]):
    def datetimes(
        self, field_name: str, kind: str, order: str = "ASC", tzinfo: tzinfo | None = None
    ) -> Any:
        """Django's ``datetimes``, for the date hierarchy, without reading every row.

        Django lists the years, months or days that hold rows with a DISTINCT over every row
        of the period shown: a whole million-row table on each load of the runs page. This
        jumps from period to period instead: the first instant at or after the start of the
        next period, one index probe per period that holds rows.
        """
        if kind not in _PERIODS:
            return super().datetimes(field_name, kind, order, tzinfo)
        zone = (tzinfo or timezone.get_current_timezone()) if settings.USE_TZ else None
        periods = []
        at = self.aggregate(at=models.Min(field_name))["at"]
        while at is not None:
            start = _truncate(_local(at, zone), kind)
            periods.append(start)
            after = {f"{field_name}__gte": _following(start, kind)}
            at = self.filter(**after).aggregate(at=models.Min(field_name))["at"]
        return periods[::-1] if order == "DESC" else periods


def _local(instant: datetime, zone: tzinfo | None) -> datetime:
    return instant if zone is None else instant.astimezone(zone)


def _truncate(instant: datetime, kind: str) -> datetime:
    return datetime(
        instant.year,
        instant.month if kind != "year" else 1,
        instant.day if kind == "day" else 1,
        tzinfo=instant.tzinfo,
    )


def _following(start: datetime, kind: str) -> datetime:
    if kind == "year":
        return start.replace(year=start.year + 1)
    if kind == "month":
        return start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
    # Aware arithmetic adds wall-clock time: midnight of the next day, across DST changes too.
    return start + timedelta(days=1)


class Run(models.Model):
    """A row of ``_voltro_schedule_runs``: one occurrence of a schedule and what became of it."""

    id = models.TextField("key", primary_key=True)
    schedule = models.TextField()
    task = models.TextField()
    task_id = models.TextField("task id")
    scheduled_at = models.DateTimeField("scheduled at")
    coordination_outcome = models.TextField("outcome", choices=[(o, o) for o in OUTCOMES])
    status = models.TextField(choices=[(s.value, s.value) for s in Status])
    reason = models.TextField(null=True)
    replica = models.TextField(null=True)
    worker = models.TextField(null=True)
    claimed_at = models.DateTimeField("claimed at", null=True)
    published_at = models.DateTimeField("published at", null=True)
    started_at = models.DateTimeField("started at", null=True)
    finished_at = models.DateTimeField("finished at", null=True)
    duration = models.FloatField(null=True)
    retries = models.IntegerField()
    error = models.TextField(null=True)
    lease_until = models.DateTimeField("lease until", null=True)
    #: The revision of the schedules table that fired it (None: the app's own entry).
    revision = models.IntegerField("schedules revision", null=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        managed = False
        db_table = RUNS
        # ix_voltro_runs_newest, read backwards; the key breaks ties between schedules.
        ordering = ("-scheduled_at", "-id")
        default_permissions = ("view",)

    def __str__(self) -> str:
        return str(self.id)


class Schedule(Run):
    """The schedules overview's entry in the admin (a proxy: no table, no permission of its
    own; it shows to whoever may view runs)."""

    class Meta:
        proxy = True
        verbose_name = "schedule"
        default_permissions = ()


class Claim(models.Model):
    """A row of ``_voltro_schedule_claims``: the replica that won an occurrence (short-lived)."""

    id = models.TextField("key", primary_key=True)
    schedule = models.TextField()
    scheduled_at = models.DateTimeField("scheduled at")
    claimed_at = models.DateTimeField("claimed at")
    replica = models.TextField()

    class Meta:
        managed = False
        db_table = CLAIMS
        ordering = ("-scheduled_at", "-id")
        default_permissions = ("view",)

    def __str__(self) -> str:
        return str(self.id)


class Replica(models.Model):
    """A row of ``_voltro_beat_replicas``: a beat replica that runs or ran recently (a replica
    that stops deletes its row)."""

    name = models.TextField(primary_key=True)
    host = models.TextField()
    pid = models.IntegerField()
    version = models.TextField()
    started_at = models.DateTimeField("started at")
    last_seen = models.DateTimeField("last seen")
    clock_offset = models.FloatField("clock offset", null=True)
    settings = models.TextField()
    schedules = models.TextField()
    schedules_digest = models.TextField("schedules digest")
    schedules_revision = models.IntegerField("schedules revision")

    class Meta:
        managed = False
        db_table = REPLICAS
        ordering = ("-last_seen", "name")
        default_permissions = ("view",)

    def __str__(self) -> str:
        return str(self.name)


# The two tables below are keyed by (group, name); Django's admin takes one column as the key,
# so their rows are listed without pages of their own (the list shows every column).


class Shard(models.Model):
    """A row of ``_voltro_beat_shards`` (cluster coordination): a shard's owner, epoch and
    lease."""

    shard_group = models.TextField("group", primary_key=True)
    shard = models.IntegerField()
    owner = models.TextField(null=True)
    epoch = models.IntegerField()
    lease_until = models.DateTimeField("lease until", null=True)
    changed_at = models.DateTimeField("owner since", null=True)

    class Meta:
        managed = False
        db_table = SHARDS
        ordering = ("shard_group", "shard")
        default_permissions = ("view",)

    def __str__(self) -> str:
        return f"{self.shard_group} {self.shard}"


class SingletonState(models.Model):
    """A row of ``_voltro_beat_singletons``: where a singleton last ran, with which token,
    and how it ended."""

    singleton_group = models.TextField("group", primary_key=True)
    name = models.TextField()
    replica = models.TextField()
    token = models.IntegerField()
    state = models.TextField()
    since = models.DateTimeField()
    error = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = SINGLETONS
        ordering = ("singleton_group", "name")
        default_permissions = ("view",)
        verbose_name = "singleton"

    def __str__(self) -> str:
        return f"{self.singleton_group} {self.name}"


class StoredSchedule(models.Model):
    """A row of ``_voltro_beat_schedules``: a schedule kept in the database, edited through
    :mod:`voltro_beat.contrib.schedule_forms` (never saved by Django itself)."""

    name = models.TextField(primary_key=True)
    schedule_group = models.TextField("group")
    definition = models.TextField()
    enabled = models.BooleanField(default=True)
    revision = models.IntegerField()
    changed_by = models.TextField("changed by")
    changed_at = models.DateTimeField("changed at")

    class Meta:
        managed = False
        db_table = SCHEDULES
        ordering = ("name",)
        verbose_name = "schedule in the database"
        verbose_name_plural = "schedules in the database"

    def __str__(self) -> str:
        return str(self.name)
