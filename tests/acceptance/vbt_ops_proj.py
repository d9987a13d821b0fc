"""The app of ``test_cli.py`` and ``test_metrics.py``: :mod:`vbt_proj`'s app with the ledger
attached, so that the worker records ``started`` / ``succeeded`` and ``voltro-beat status``
has success rates to show. Configured like :mod:`vbt_proj` (``VBT_CONFIG_FILE``)."""

from __future__ import annotations

from vbt_proj import app

import voltro_beat

__all__ = ["app"]

voltro_beat.attach(app)
