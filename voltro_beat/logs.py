"""JSON log lines (``voltro_beat_log_json``): one object per line, for a log pipeline.

Each object has the time, level, logger and message; a line about an occurrence also has its
``key`` and ``schedule`` fields, read from the key in the message (every such line names it),
and an exception its traceback as ``exc_info``.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime

#: An occurrence key in a message: ``name@YYYY-MM-DDTHH:MM:SS[.mmm]``.
_KEY = re.compile(r"([^\s@(),]+)@(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{3})?)")


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        found = _KEY.search(message)
        if found:
            line["schedule"], line["key"] = found[1], found[0]
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line)


def use_json() -> None:
    """Give every handler of the root logger the JSON formatter (Celery set them up)."""
    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter())
