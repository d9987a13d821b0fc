"""voltro_beat: run many Celery beat replicas active-active, publish every occurrence once.

Start beat with ``celery -A proj beat -S voltro``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from voltro_beat.exceptions import ConfigurationError, StoreError, VoltroBeatError
from voltro_beat.retention import register_retention

if TYPE_CHECKING:
    from voltro_beat.signals import attach

__version__ = "0.2.0"

__all__ = [
    "ConfigurationError",
    "StoreError",
    "VoltroBeatError",
    "__version__",
    "attach",
    "register_retention",
]


def __getattr__(name: str) -> Any:
    # Lazy: ``import voltro_beat`` (the pure occurrence maths, the CLI) must not pull in
    # Celery's signals and SQLAlchemy; ``voltro_beat.attach`` imports them on first use.
    if name == "attach":
        from voltro_beat.signals import attach

        return attach
    raise AttributeError(f"module 'voltro_beat' has no attribute {name!r}")
