"""Read-only views of voltro_beat's tables in the admins people already run, and the external
trigger over HTTP (which publishes).

* :mod:`voltro_beat.contrib.django`: a Django app (``pip install 'voltro-beat[django]'``);
* :mod:`voltro_beat.contrib.sqladmin`: sqladmin views for a Starlette or FastAPI app, and the
  server behind ``voltro-beat admin`` (``pip install 'voltro-beat[sqladmin]'``);
* :mod:`voltro_beat.contrib.display` and :mod:`voltro_beat.contrib.overview`: what both show
  the same way (status colours, lags, the capped row count, the schedules overview);
* :mod:`voltro_beat.contrib.trigger_endpoint`: the external trigger over HTTP
  (``voltro-beat serve-trigger``, ``pip install 'voltro-beat[trigger]'``).

See docs/admin.md.
"""
