"""Read-only sqladmin views: runs, claims, replicas, and the schedules overview.

The same columns, filters and rules as the Django admin (:mod:`voltro_beat.contrib.django`):
newest first, filters by status, late or stuck, outcome, schedule and period, exact search by
key or task id, a row count capped at ``COUNT_CAP``, no create, edit, delete or export for
anyone, and lists without row checkboxes or an Actions menu. :class:`VoltroAdmin` opens on the
schedules overview instead of sqladmin's empty index page.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, ClassVar

import anyio
import sqlalchemy as sa
from jinja2 import ChoiceLoader, PackageLoader
from markupsafe import Markup
from sqladmin import Admin, BaseView, ModelView, expose
from sqladmin.authentication import login_required
from sqladmin.filters import AllUniqueStringValuesFilter, StaticValuesFilter
from sqladmin.formatters import BASE_FORMATTERS
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from voltro_beat import replicas as registry
from voltro_beat.contrib import overview, schedule_forms
from voltro_beat.contrib.display import (
    COUNT_CAP,
    LATE,
    LEGEND,
    MARKER_COLOUR,
    OUTCOMES,
    SINGLETON_COLOURS,
    STUCK,
    STUCK_AFTER,
    capped,
    colour,
    delay_of,
    instant_text,
    json_text,
    liveness,
    offset_text,
    ownership,
    revision_text,
    seconds_text,
)
from voltro_beat.contrib.sqladmin.models import Claim, Replica, Run, Shard, SingletonState
from voltro_beat.contrib.sqladmin.stored import StoredScheduleAdmin
from voltro_beat.status import ON_WORKER, Status
from voltro_beat.store.reads import SCHEDULE_NAMES_SQL
from voltro_beat.store.tables import UTCDateTime

#: sqladmin's "no filter" value.
ALL = "__all"


def _badge(text: str, background: str) -> Markup:
    return Markup('<span class="badge text-white" style="background:{}">{}</span>').format(
        background, text
    )


def _status(run: Any, _attribute: Any) -> Markup:
    """The status badge, and a late or stuck marker (:func:`~voltro_beat.contrib.display.delay`)."""
    badge = _badge(run.status, colour(run.status))
    marker = delay_of(run, RunAdmin.stuck_after)
    if marker is None:
        return badge
    tag = '<span class="vb-delay badge" style="border:1px solid {0};color:{0}">{1}</span>'
    return badge + Markup(" ") + Markup(tag).format(MARKER_COLOUR, marker)


def _seconds(run: Any, attribute: Any) -> str:
    return seconds_text(getattr(run, str(attribute)))


def _clipped(run: Any, attribute: Any) -> Markup | str:
    """A long text (a retry's reason, a worker's name) cut to the column, whole on hover."""
    text = getattr(run, str(attribute))
    if not text:
        return ""
    return Markup(
        '<span class="d-inline-block text-truncate align-bottom" style="max-width:6rem" '
        'title="{0}">{0}</span>'
    ).format(text)


def _error(run: Any, _attribute: Any) -> Markup | str:
    return Markup("<pre>{}</pre>").format(run.error) if run.error else "-"


class _ScheduleFilter(AllUniqueStringValuesFilter):
    """Lists the schedule names by a loose index scan, not a DISTINCT over every row."""

    def __init__(self) -> None:
        super().__init__("schedule", title="Schedule")

    async def lookups(
        self, request: Request, model: Any, run_query: Callable[[Any], Any]
    ) -> list[tuple[str, str]]:
        rows = await run_query(sa.text(SCHEDULE_NAMES_SQL))
        return [(ALL, "All"), *((name, name) for (name,) in rows)]


class _PeriodFilter(StaticValuesFilter):
    """Rows scheduled within the past hour, day or week (``ix_voltro_runs_newest``)."""

    periods = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(days=7)}

    def __init__(self) -> None:
        values = [(name, f"Past {name}") for name in self.periods]
        super().__init__("scheduled_at", values, title="Scheduled", parameter_name="scheduled")

    async def get_filtered_query(
        self, query: sa.Select[Any], value: Any, model: Any
    ) -> sa.Select[Any]:
        if value not in self.periods:
            return query
        return query.where(model.scheduled_at >= datetime.now(UTC) - self.periods[value])


class _DelayFilter(StaticValuesFilter):
    """Runs that should have moved on: claimed and unpublished past their lease (on the
    database's clock), or on a worker for over ``RunAdmin.stuck_after`` (since the admin's
    now: an hour-scale threshold)."""

    def __init__(self) -> None:
        values = [(LATE, "Late"), (STUCK, "Stuck")]
        super().__init__("status", values, title="Late or stuck", parameter_name="delay")

    async def get_filtered_query(
        self, query: sa.Select[Any], value: Any, model: Any
    ) -> sa.Select[Any]:
        if value == LATE:
            return query.where(
                model.status == Status.CLAIMED.value,
                model.published_at.is_(None),
                model.lease_until < sa.func.current_timestamp(type_=UTCDateTime()),
            )
        if value == STUCK:
            return query.where(
                model.status.in_([s.value for s in ON_WORKER]),
                model.started_at < datetime.now(UTC) - RunAdmin.stuck_after,
            )
        return query


class _ReadOnly(ModelView):
    """No create, edit, delete or export; newest first; exact search; counts capped; a list
    without row checkboxes or the Actions menu (``voltro_beat/list.html``)."""

    list_template = "voltro_beat/list.html"
    can_create = False
    can_edit = False
    can_delete = False
    can_export = False
    page_size = 50
    page_size_options = [50, 100]
    # Only the order an index serves.
    column_sortable_list = ["scheduled_at"]
    column_default_sort = [("scheduled_at", True), ("id", True)]
    column_type_formatters = {**BASE_FORMATTERS, datetime: instant_text}
    column_type_formatters_detail = column_type_formatters

    def search_query(self, stmt: sa.Select[Any], term: str) -> sa.Select[Any]:
        """Exact matches (the indexes serve them), not sqladmin's ILIKE '%term%' scan."""
        columns = [getattr(self.model, str(name)) for name in self.column_searchable_list]
        return stmt.where(sa.or_(*(column == term.strip() for column in columns)))

    async def count(self, request: Request, stmt: sa.Select[Any] | None = None) -> int:
        """sqladmin counts ``SELECT count(*) FROM (the page's query)``: count at most
        ``COUNT_CAP + 1`` rows of that query instead."""
        if stmt is None:
            return await super().count(request)
        (page_query,) = stmt.get_final_froms()
        inner = page_query.element.limit(COUNT_CAP + 1).subquery()  # type: ignore[attr-defined]
        counted = await super().count(request, sa.select(sa.func.count()).select_from(inner))
        return capped(counted)


class RunAdmin(_ReadOnly, model=Run):
    name = "Run"
    name_plural = "Runs"
    icon = "fa-solid fa-list"
    # No key column: the schedule and the instant are the key, and the eye opens the run. The
    # eleven columns fit 1,400 px beside the menu and the filters.
    column_list = [
        "schedule",
        "scheduled_at",
        "status",
        "reason",
        "coordination_outcome",
        "replica",
        "worker",
        "publish_lag",
        "duration",
        "retries",
    ]
    column_details_list = [
        "id",
        "schedule",
        "task",
        "task_id",
        "status",
        "reason",
        "retries",
        "coordination_outcome",
        "replica",
        "revision",
        "scheduled_at",
        "claimed_at",
        "published_at",
        "publish_lag",
        "worker",
        "started_at",
        "finished_at",
        "duration",
        "error",
    ]
    column_labels = {
        "id": "key",
        "coordination_outcome": "outcome",
        "revision": "definition",
        "publish_lag": "lag",
        "task_id": "task id",
        **{
            f"{at}_at": f"{at} at"
            for at in ("scheduled", "claimed", "published", "started", "finished")
        },
    }
    column_formatters = {
        "status": _status,
        "reason": _clipped,
        "worker": _clipped,
        "publish_lag": _seconds,
        "duration": _seconds,
    }
    #: A run on a worker longer than this is marked stuck (set by :func:`add_views`).
    stuck_after: ClassVar[timedelta] = STUCK_AFTER
    column_formatters_detail = {
        **column_formatters,
        "reason": lambda r, _a: r.reason or "",
        "worker": lambda r, _a: r.worker or "",
        "revision": lambda r, _a: revision_text(r.revision),
        "error": _error,
    }
    column_searchable_list = ["id", "task_id"]
    column_filters = [
        StaticValuesFilter("status", [(s.value, s.value) for s in Status], title="Status"),
        _DelayFilter(),
        StaticValuesFilter("coordination_outcome", [(o, o) for o in OUTCOMES], title="Outcome"),
        _ScheduleFilter(),
        _PeriodFilter(),
    ]


class ClaimAdmin(_ReadOnly, model=Claim):
    name = "Claim"
    name_plural = "Claims"
    icon = "fa-solid fa-flag"
    column_list = ["id", "schedule", "scheduled_at", "claimed_at", "replica"]
    column_labels = {"id": "key", "scheduled_at": "scheduled at", "claimed_at": "claimed at"}
    column_searchable_list = ["id"]
    column_filters = [_PeriodFilter()]


class ReplicaAdmin(_ReadOnly, model=Replica):
    """The replica registry: a replica is live while its last heartbeat is younger than its
    publish timeout, on the database's clock."""

    name = "Replica"
    name_plural = "Replicas"
    icon = "fa-solid fa-server"
    column_list = [
        "name",
        "live",
        "host",
        "pid",
        "version",
        "started_at",
        "last_seen",
        "clock_offset",
        "schedules_digest",
    ]
    column_details_list = [*column_list, "settings", "schedules"]
    column_labels = {
        "live": "state",
        "started_at": "started at",
        "last_seen": "last seen",
        "clock_offset": "clock offset",
        "schedules_digest": "schedules digest",
        "schedules": "schedules (name: definition hash)",
    }
    column_formatters = {
        "live": lambda r, _a: _badge(*liveness(r.live)),
        "clock_offset": lambda r, _a: offset_text(r.clock_offset),
    }
    column_formatters_detail = {
        **column_formatters,
        "settings": lambda r, _a: Markup("<pre>{}</pre>").format(json_text(r.settings)),
        "schedules": lambda r, _a: Markup("<pre>{}</pre>").format(json_text(r.schedules)),
    }
    column_sortable_list = ["last_seen"]
    column_default_sort = [("last_seen", True), ("name", False)]
    column_searchable_list = ["name", "host"]


class ShardAdmin(_ReadOnly, model=Shard):
    """Cluster coordination's shards: each one's owner while its lease runs, and its epoch
    (one more at every change of owner). A shard not owned is an alert: its schedules wait
    for a replica of the group to take it."""

    name = "Shard"
    name_plural = "Shards"
    icon = "fa-solid fa-chart-pie"
    column_list = ["shard_group", "shard", "held", "owner", "epoch", "lease_until", "changed_at"]
    column_details_list = column_list
    column_labels = {
        "shard_group": "group",
        "held": "state",
        "lease_until": "lease until",
        "changed_at": "owner since",
    }
    column_formatters = {
        "held": lambda r, _a: _badge(*ownership(r.owner, r.lease_until, r.database_now)),
    }
    column_formatters_detail = column_formatters
    column_sortable_list = ["shard"]
    column_default_sort = [("shard_group", False), ("shard", False)]
    column_searchable_list = ["owner"]


class SingletonAdmin(_ReadOnly, model=SingletonState):
    """Singletons: where each one last ran, with which fencing token, and how it ended."""

    name = "Singleton"
    name_plural = "Singletons"
    icon = "fa-solid fa-circle-dot"
    column_list = ["singleton_group", "name", "state", "replica", "token", "since", "error"]
    column_details_list = column_list
    column_labels = {"singleton_group": "group"}
    column_formatters = {
        "state": lambda r, _a: _badge(r.state, SINGLETON_COLOURS.get(r.state, colour(r.state))),
        "error": _clipped,
    }
    column_formatters_detail = {**column_formatters, "error": _error}
    column_sortable_list = ["name"]
    column_default_sort = [("singleton_group", False), ("name", False)]
    column_searchable_list = ["name", "replica"]


class SchedulesView(BaseView):
    """One line per schedule: its newest runs as coloured squares, success rate, last run,
    median publish lag and, given the Celery app, its next occurrences."""

    name = "Schedules"
    identity = "schedules"
    icon = "fa-solid fa-calendar"
    # Set by add_views, as sqladmin sets a ModelView's.
    session_maker: ClassVar[Any] = None
    is_async: ClassVar[bool] = False
    celery_app: ClassVar[str | None] = None

    @expose("/schedules", methods=["GET"], identity="schedules")
    async def schedules(self, request: Request) -> Response:
        upcoming = overview.upcoming(self.celery_app, now=datetime.now(UTC))
        requested = request.query_params.get("page")
        page, lines, live = await self._run(lambda session: _lines(session, upcoming, requested))
        context = {
            "lines": lines,
            "page": page,
            "problem": upcoming.problem,
            "unserved": upcoming.unserved(live),
            "legend": LEGEND,
            "recent": overview.RECENT,
        }
        return await self.templates.TemplateResponse(request, "voltro_beat/overview.html", context)

    async def _run(self, work: Callable[[Any], Any]) -> Any:
        if self.is_async:
            async with self.session_maker() as session:
                return await session.run_sync(work)

        def run() -> Any:
            with self.session_maker() as session:
                return work(session)

        return await anyio.to_thread.run_sync(run)


def _lines(
    session: Any, upcoming: overview.Upcoming, requested: str | None
) -> tuple[overview.Page, list[overview.Line], list[registry.Replica]]:
    """The page, its lines, and the live replicas."""
    names = session.execute(sa.text(SCHEDULE_NAMES_SQL)).scalars().all()
    page = overview.page(sorted({*names, *upcoming.by_schedule}), requested)
    recent_of = partial(_recent, session)
    replicas = session.execute(sa.select(Replica)).scalars().all()
    live = [registry.Replica.of(r) for r in replicas if r.live]
    return page, overview.lines(page.names, recent_of, upcoming.by_schedule), live


def _recent(session: Any, schedule: str) -> list[overview.Recent]:
    table = Run.__table__
    rows = session.execute(
        sa.select(
            table.c.id, table.c.status, table.c.reason, table.c.scheduled_at, table.c.published_at
        )
        .where(table.c.schedule == schedule)
        .order_by(table.c.scheduled_at.desc(), table.c.id.desc())
        .limit(overview.RECENT)
    )
    return [overview.Recent(*row) for row in rows]


class VoltroAdmin(Admin):
    """sqladmin's :class:`~sqladmin.Admin` whose index (an empty page in sqladmin) sends to the
    schedules overview; give it the views with :func:`add_views`."""

    @login_required
    async def index(self, request: Request) -> Response:
        overview = request.url_for(f"admin:view-{SchedulesView.identity}")
        return RedirectResponse(overview, status_code=302)


def add_views(
    admin: Admin,
    *,
    celery_app: str | None = None,
    stuck_after: timedelta = STUCK_AFTER,
    store_url: str | None = None,
) -> None:
    """Add the runs, claims, replicas, shards, singletons, schedules and schedules-table views
    to ``admin``.

    ``celery_app`` (``"proj.celery:app"``) lets the schedules view show each entry's next
    occurrences from the app's ``beat_schedule``; a run started ``stuck_after`` ago and not
    finished is marked stuck. ``store_url`` (the store's, as beat's
    ``voltro_beat_store_url``) makes the schedules table editable
    (:mod:`voltro_beat.contrib.sqladmin.stored`).
    """
    loader = admin.templates.env.loader
    if not isinstance(loader, ChoiceLoader):
        raise TypeError(f"sqladmin's template loader changed: {loader!r}")
    loader.loaders = [*loader.loaders, PackageLoader("voltro_beat.contrib.sqladmin", "templates")]
    SchedulesView.session_maker = admin.session_maker
    SchedulesView.is_async = admin.is_async
    SchedulesView.celery_app = celery_app
    RunAdmin.stuck_after = stuck_after
    editable = store_url is not None
    StoredScheduleAdmin.table = (
        schedule_forms.open_table(store_url, celery_app) if store_url is not None else None
    )
    StoredScheduleAdmin.can_create = StoredScheduleAdmin.can_edit = editable
    StoredScheduleAdmin.can_delete = editable
    views = (RunAdmin, ClaimAdmin, ReplicaAdmin, ShardAdmin, SingletonAdmin, SchedulesView)
    for view in (*views, StoredScheduleAdmin):
        admin.add_view(view)
