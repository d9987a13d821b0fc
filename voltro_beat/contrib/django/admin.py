"""Read-only admin pages: runs, claims, replicas, and the schedules overview; and the
schedules table, edited (:mod:`voltro_beat.contrib.django.stored`).

Nobody may add, change or delete a row, superusers included (the tables are beat's and the
workers'); staff users see the pages with the ``voltro_beat.view_run`` / ``view_claim`` /
``view_replica`` permission. Every list of runs or claims is served by an index on a table of
millions of rows: newest first, the status, outcome, schedule, late-or-stuck and date filters,
exact search by key or task id, a row count capped at ``COUNT_CAP`` and a date hierarchy that
probes instead of scanning.

A run on a worker is marked stuck after ``settings.VOLTRO_BEAT_ADMIN_STUCK_AFTER`` seconds
(default :data:`~voltro_beat.contrib.display.STUCK_AFTER`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connections, router
from django.db.models import DateTimeField, ExpressionWrapper
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.safestring import SafeString

from voltro_beat.contrib import overview
from voltro_beat.contrib.display import (
    COUNT_CAP,
    LATE,
    LEGEND,
    MARKER_COLOUR,
    SINGLETON_COLOURS,
    STUCK,
    STUCK_AFTER,
    capped,
    colour,
    delay_of,
    instant_text,
    json_text,
    lag,
    liveness,
    offset_text,
    ownership,
    revision_text,
    seconds_text,
)
from voltro_beat.contrib.django.models import (
    Claim,
    Replica,
    Run,
    Schedule,
    Shard,
    SingletonState,
    StoredSchedule,
)
from voltro_beat.contrib.django.stored import StoredScheduleAdmin
from voltro_beat.replicas import Replica as Summary
from voltro_beat.replicas import lives
from voltro_beat.status import ON_WORKER, Status
from voltro_beat.store.reads import SCHEDULE_NAMES_SQL


class CappedPaginator(Paginator):
    """Counts at most ``COUNT_CAP + 1`` rows (a LIMIT inside the COUNT), so a page of a
    million-row table reads a bounded range of an index instead of the whole table."""

    @cached_property
    def count(self) -> int:
        return capped(self.object_list[: COUNT_CAP + 1].count())


def _instant(field: str, label: str) -> Any:
    """A column showing ``field`` to the millisecond in the current time zone (Django's
    default format stops at the minute, and runs are often seconds apart)."""

    @admin.display(description=label, ordering=field)
    def show(_admin: Any, row: Any) -> str:
        at = getattr(row, field)
        return instant_text(timezone.localtime(at) if at and timezone.is_aware(at) else at)

    return show


class ReadOnlyAdmin(admin.ModelAdmin):
    """No add, change or delete for anyone; counts capped; no facet counts."""

    actions = None
    paginator = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    # Only the order an index serves; sorting a million rows by another column would not be.
    sortable_by: tuple[str, ...] = ("scheduled",)
    date_hierarchy: str | None = "scheduled_at"

    scheduled = _instant("scheduled_at", "scheduled at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _schedule_names() -> list[str]:
    """The schedules that have runs (a loose index scan, not a DISTINCT over every row)."""
    with connections[router.db_for_read(Run)].cursor() as cursor:
        cursor.execute(SCHEDULE_NAMES_SQL)
        return [name for (name,) in cursor.fetchall()]


class ScheduleFilter(admin.SimpleListFilter):
    title = "schedule"
    parameter_name = "schedule"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in _schedule_names()]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        return queryset if value is None else queryset.filter(schedule=value)


def stuck_after() -> timedelta:
    """``settings.VOLTRO_BEAT_ADMIN_STUCK_AFTER`` (seconds, or a timedelta), else the default."""
    value = getattr(settings, "VOLTRO_BEAT_ADMIN_STUCK_AFTER", None)
    if value is None:
        return STUCK_AFTER
    return value if isinstance(value, timedelta) else timedelta(seconds=float(value))


class DelayFilter(admin.SimpleListFilter):
    """Runs that should have moved on (:func:`voltro_beat.contrib.display.delay`), on the
    database's clock; both read the small set of live rows of a status."""

    title = "late or stuck"
    parameter_name = "delay"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (LATE, "late: claimed, unpublished past its lease"),
            (STUCK, f"stuck: running over {seconds_text(stuck_after().total_seconds())}"),
        ]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        if self.value() == LATE:
            return queryset.filter(
                status=Status.CLAIMED.value, published_at__isnull=True, lease_until__lt=Now()
            )
        if self.value() == STUCK:
            cutoff = ExpressionWrapper(Now() - stuck_after(), output_field=DateTimeField())
            return queryset.filter(status__in=[s.value for s in ON_WORKER], started_at__lt=cutoff)
        return queryset


def _badge(text: str, background: str) -> SafeString:
    return format_html(
        '<span style="background:{};color:#fff;border-radius:4px;padding:1px 7px;'
        'white-space:nowrap">{}</span>',
        background,
        text,
    )


def _clipped(text: str | None) -> SafeString | str:
    if not text:
        return "-"
    return format_html(
        '<span style="display:inline-block;max-width:6rem;overflow:hidden;'
        'text-overflow:ellipsis;white-space:nowrap;vertical-align:bottom" title="{0}">{0}</span>',
        text,
    )


def _marker(text: str) -> SafeString:
    return format_html(
        '<span class="vb-delay" style="border:1px solid {0};color:{0};border-radius:4px;'
        'padding:0 5px;white-space:nowrap">{1}</span>',
        MARKER_COLOUR,
        text,
    )


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    # Ten columns that fit 1,400 px: no schedule column (the key starts with it, the schedule
    # filter selects by it), no navigation sidebar (the template), a long reason or worker
    # name cut (whole on hover).
    list_display = (
        "id",
        "scheduled",
        "status_badge",
        "reason_text",
        "coordination_outcome",
        "replica",
        "worker_text",
        "publish_lag",
        "duration_text",
        "retries",
    )
    list_filter = (
        "status",
        DelayFilter,
        "coordination_outcome",
        ScheduleFilter,
        ("scheduled_at", admin.DateFieldListFilter),
    )
    # Exact matches: the primary key and ix_voltro_runs_task_id serve them.
    search_fields = ("id__exact", "task_id__exact")
    search_help_text = "A whole occurrence key (name@2026-12-03T09:00:00) or task id."
    readonly_fields = (
        "status_badge",
        "definition",
        "publish_lag",
        "duration_text",
        "task_result",
        "error_text",
        "scheduled",
        "claimed",
        "published",
        "started",
        "finished",
    )
    claimed = _instant("claimed_at", "claimed at")
    published = _instant("published_at", "published at")
    started = _instant("started_at", "started at")
    finished = _instant("finished_at", "finished at")

    def get_queryset(self, request: HttpRequest) -> Any:
        # The database's clock, read with the rows: the lease is on it.
        return super().get_queryset(request).annotate(database_now=Now())

    @admin.display(description="status", ordering="status")
    def status_badge(self, run: Run) -> SafeString:
        badge = _badge(run.status, colour(run.status))
        marker = delay_of(run, stuck_after())
        return badge if marker is None else format_html("{} {}", badge, _marker(marker))

    @admin.display(description="reason")
    def reason_text(self, run: Run) -> SafeString | str:
        return _clipped(run.reason)

    @admin.display(description="worker")
    def worker_text(self, run: Run) -> SafeString | str:
        return _clipped(run.worker)

    @admin.display(description="lag")
    def publish_lag(self, run: Run) -> str:
        return seconds_text(lag(run.scheduled_at, run.published_at))

    @admin.display(description="definition")
    def definition(self, run: Run) -> str:
        return revision_text(run.revision)

    @admin.display(description="duration")
    def duration_text(self, run: Run) -> str:
        return seconds_text(run.duration)

    @admin.display(description="error")
    def error_text(self, run: Run) -> SafeString | str:
        return format_html("<pre style='margin:0'>{}</pre>", run.error) if run.error else "-"

    @admin.display(description="task result")
    def task_result(self, run: Run) -> SafeString | str:
        """The django-celery-results row of the same task id, if the worker stored one."""
        from django_celery_results.models import TaskResult

        result = TaskResult.objects.filter(task_id=run.task_id).only("pk", "status").first()
        if result is None:
            return "none stored"
        url = reverse("admin:django_celery_results_taskresult_change", args=[quote(result.pk)])
        return format_html('<a href="{}">{}</a>', url, result.status)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        occurrence = ["id", "schedule", "task", "task_id", "status_badge", "reason", "retries"]
        if apps.is_installed("django_celery_results"):
            occurrence.insert(4, "task_result")
        return (
            (None, {"fields": occurrence}),
            (
                "Coordination",
                {
                    "fields": (
                        "coordination_outcome",
                        "replica",
                        "definition",
                        "scheduled",
                        "claimed",
                        "published",
                        "publish_lag",
                    )
                },
            ),
            ("Execution", {"fields": ("worker", "started", "finished", "duration_text")}),
            ("Error", {"fields": ("error_text",)}),
        )


@admin.register(Claim)
class ClaimAdmin(ReadOnlyAdmin):
    list_display = ("id", "schedule", "scheduled", "claimed", "replica")
    claimed = _instant("claimed_at", "claimed at")
    # The claims table is small (pruned within a day): plain DISTINCT filters are cheap there.
    list_filter = ("schedule", "replica", ("scheduled_at", admin.DateFieldListFilter))
    search_fields = ("id__exact",)
    search_help_text = "A whole occurrence key."


@admin.register(Replica)
class ReplicaAdmin(ReadOnlyAdmin):
    """The replica registry: who runs, since when, on which clock, with which schedules. A
    replica is live while its last heartbeat is younger than its publish timeout, on the
    database's clock."""

    list_display = (
        "name",
        "live",
        "host",
        "pid",
        "version",
        "started",
        "seen",
        "clock",
        "offset",
        "schedules_digest",
    )
    readonly_fields = ("live", "started", "seen", "clock", "offset", "settings_text", "map_text")
    fields = (*list_display, "settings_text", "map_text")
    sortable_by = ()
    date_hierarchy = None
    search_fields = ("name__exact", "host__exact")
    search_help_text = "A whole replica name or host."
    started = _instant("started_at", "started at")
    seen = _instant("last_seen", "last seen")

    def get_queryset(self, request: HttpRequest) -> Any:
        # The database's clock, read with the rows: a replica's liveness is judged on the
        # clock its heartbeats were written on, not on the admin host's.
        return super().get_queryset(request).annotate(database_now=Now())

    @admin.display(description="state")
    def live(self, replica: Replica) -> SafeString:
        alive = lives(Summary.of(replica), replica.database_now)
        return _badge(*liveness(alive))

    @admin.display(description="clock")
    def clock(self, replica: Replica) -> str:
        return str(Summary.of(replica).settings.get("clock", "-"))

    @admin.display(description="clock offset")
    def offset(self, replica: Replica) -> str:
        return offset_text(replica.clock_offset)

    @admin.display(description="settings")
    def settings_text(self, replica: Replica) -> SafeString:
        return format_html("<pre style='margin:0'>{}</pre>", json_text(replica.settings))

    @admin.display(description="schedules (name: definition hash)")
    def map_text(self, replica: Replica) -> SafeString:
        return format_html("<pre style='margin:0'>{}</pre>", json_text(replica.schedules))


@admin.register(Shard)
class ShardAdmin(ReadOnlyAdmin):
    """Cluster coordination's shards: each one's owner while its lease runs (on the database's
    clock), and its epoch (one more at every change of owner). A shard not owned is an alert:
    its schedules wait for a replica of the group to take it."""

    list_display = ("shard_group", "shard", "state", "owner", "epoch", "lease", "since")
    list_display_links = None
    list_filter = ("shard_group", "owner")
    sortable_by = ()
    date_hierarchy = None
    lease = _instant("lease_until", "lease until")
    since = _instant("changed_at", "owner since")

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).annotate(database_now=Now())

    @admin.display(description="state")
    def state(self, shard: Shard) -> SafeString:
        return _badge(*ownership(shard.owner, shard.lease_until, shard.database_now))


@admin.register(SingletonState)
class SingletonAdmin(ReadOnlyAdmin):
    """Singletons: where each one last ran, with which fencing token, and how it ended (a
    failure with its traceback)."""

    list_display = ("singleton_group", "name", "state_badge", "replica", "token", "at", "error")
    list_display_links = None
    sortable_by = ()
    date_hierarchy = None
    search_fields = ("name__exact", "replica__exact")
    search_help_text = "A whole singleton or replica name."
    at = _instant("since", "since")

    @admin.display(description="state")
    def state_badge(self, singleton: SingletonState) -> SafeString:
        return _badge(singleton.state, SINGLETON_COLOURS.get(singleton.state, colour("")))

    @admin.display(description="error")
    def error(self, singleton: SingletonState) -> SafeString | str:
        if not singleton.error:
            return "-"
        return format_html("<pre style='margin:0'>{}</pre>", singleton.error)


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyAdmin):
    """The overview: no list of rows, one line per schedule."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.has_perm("voltro_beat.view_run"))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        view = self.admin_site.admin_view(self.changelist_view)
        return [path("", view, name="{}_{}_changelist".format(*info))]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        now = datetime.now(UTC)
        upcoming = overview.upcoming(getattr(settings, "VOLTRO_BEAT_CELERY_APP", None), now=now)
        names = sorted(set(_schedule_names()) | set(upcoming.by_schedule))
        page = overview.page(names, request.GET.get("page"))
        context = {
            **self.admin_site.each_context(request),
            "title": "Schedules",
            "opts": self.opts,
            "lines": overview.lines(page.names, _recent, upcoming.by_schedule),
            "page": page,
            "problem": upcoming.problem,
            "unserved": upcoming.unserved(_live()),
            "legend": LEGEND,
            "recent": overview.RECENT,
            "runs_url": reverse("admin:voltro_beat_run_changelist"),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/voltro_beat/overview.html", context)


def _live() -> list[Summary]:
    """The live replicas, judged on the database's clock."""
    replicas = Replica.objects.annotate(database_now=Now())
    return [s for r in replicas if lives(s := Summary.of(r), r.database_now)]


def _recent(schedule: str) -> list[overview.Recent]:
    rows = Run.objects.filter(schedule=schedule).values_list(
        "id", "status", "reason", "scheduled_at", "published_at"
    )[: overview.RECENT]
    return [overview.Recent(*row) for row in rows]


admin.site.register(StoredSchedule, StoredScheduleAdmin)
