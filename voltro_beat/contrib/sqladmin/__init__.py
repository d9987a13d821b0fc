"""voltro_beat's tables in sqladmin, for a Starlette or FastAPI app.

Add the views to your own :class:`sqladmin.Admin`::

    from sqladmin import Admin
    from voltro_beat.contrib.sqladmin import add_views

    admin = Admin(app, engine)   # an engine on the database of voltro_beat's tables
    add_views(admin)

or run ``voltro-beat admin --store URL`` (:mod:`voltro_beat.contrib.sqladmin.server`) for a
server of its own. Every view is read-only: creating, editing and deleting are refused (403).
"""

from voltro_beat.contrib.sqladmin.views import (
    ClaimAdmin,
    ReplicaAdmin,
    RunAdmin,
    SchedulesView,
    add_views,
)

__all__ = ["ClaimAdmin", "ReplicaAdmin", "RunAdmin", "SchedulesView", "add_views"]
