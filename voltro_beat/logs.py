"""Structured log fields, and JSON log lines (``voltro_beat_log_json``) for a log pipeline.

A log call that names an occurrence, a schedule, a replica, a group or a count passes them as
``extra=fields(...)``: attributes of the record named ``voltro_<field>`` (prefixed, so they
never collide with :class:`logging.LogRecord`'s own attributes or Celery's), which any
formatter can read. :class:`JsonFormatter` writes one object per line: the time, level,
logger and message, each of those fields the record carries under its bare name, and an
exception's traceback as ``exc_info``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime

#: The fields a record may carry, each as the attribute ``voltro_<field>``.
FIELDS = ("key", "keys", "schedule", "replica", "count", "status", "reason", "group")
PREFIX = "voltro_"


def fields(
    *,
    key: str | None = None,
    keys: Sequence[str] | None = None,
    schedule: str | None = None,
    replica: str | None = None,
    count: int | None = None,
    status: str | None = None,
    reason: str | None = None,
    group: str | None = None,
) -> dict[str, object]:
    """The ``extra=`` of a log call: the fields given (an occurrence's ``key``, the few
    ``keys`` a line lists, ``schedule``, ``replica``, ``count``, a run's ``status`` and
    ``reason``, a replica ``group``), each as ``voltro_<field>``; the ones left None are not set."""
    listed = None if keys is None else list(keys)
    values = (key, listed, schedule, replica, count, status, reason, group)
    return {PREFIX + name: v for name, v in zip(FIELDS, values, strict=True) if v is not None}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, PREFIX + name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def use_json() -> None:
    """Give every handler of the root logger the JSON formatter (Celery set them up)."""
    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter())
