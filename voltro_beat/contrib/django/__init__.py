"""voltro_beat's tables in the Django admin: add ``"voltro_beat.contrib.django"`` to
``INSTALLED_APPS``.

Read-only pages of the run table, the claims table, the replica registry and a schedules
overview. The models are unmanaged: voltro_beat's own migrations (Alembic) create and change
the tables, never Django.

Settings (both optional):

* ``VOLTRO_BEAT_DATABASE``: the alias in ``DATABASES`` that holds the tables when it is not
  ``"default"``; add ``"voltro_beat.contrib.django.routers.VoltroBeatRouter"`` to
  ``DATABASE_ROUTERS`` with it (a system check says so when it is missing);
* ``VOLTRO_BEAT_CELERY_APP``: the Celery app, as ``"proj.celery:app"``, whose
  ``beat_schedule`` the overview reads for each schedule's next occurrences.
"""
