"""voltro_beat's tables in sqladmin, for a Starlette or FastAPI app.

Add the views to an admin of your own::

    from voltro_beat.contrib.sqladmin import VoltroAdmin, add_views

    admin = VoltroAdmin(app, engine)   # an engine on the database of voltro_beat's tables
    add_views(admin)

(:class:`VoltroAdmin` is sqladmin's ``Admin`` opening on the schedules overview; a plain
``sqladmin.Admin`` works too.)

or run ``voltro-beat admin --store URL`` (:mod:`voltro_beat.contrib.sqladmin.server`) for a
server of its own. Every view but one is read-only (creating, editing and deleting are refused,
403): the schedules table, editable given ``add_views(admin, store_url=...)``
(:mod:`voltro_beat.contrib.sqladmin.stored`).
"""

from voltro_beat.contrib.sqladmin.stored import StoredScheduleAdmin
from voltro_beat.contrib.sqladmin.views import (
    ClaimAdmin,
    ReplicaAdmin,
    RunAdmin,
    SchedulesView,
    ShardAdmin,
    SingletonAdmin,
    VoltroAdmin,
    add_views,
)

__all__ = [
    "ClaimAdmin",
    "ReplicaAdmin",
    "RunAdmin",
    "SchedulesView",
    "ShardAdmin",
    "SingletonAdmin",
    "StoredScheduleAdmin",
    "VoltroAdmin",
    "add_views",
]
