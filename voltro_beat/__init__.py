"""voltro_beat: run many Celery beat replicas active-active, publish every occurrence once.

Start beat with ``celery -A proj beat -S voltro``.
"""

from __future__ import annotations

from voltro_beat.exceptions import ConfigurationError, StoreError, VoltroBeatError

__version__ = "0.1.0"

__all__ = ["ConfigurationError", "StoreError", "VoltroBeatError", "__version__"]
