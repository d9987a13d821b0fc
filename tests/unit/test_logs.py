"""The log fields a call passes as ``extra=``, and the JSON lines that carry them."""

from __future__ import annotations

import json
import logging
import sys

from voltro_beat.logs import FIELDS, JsonFormatter, fields
from voltro_beat.status import Reason, Status


def _record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    """A record as ``logger.info(message, *args, extra=extra)`` makes it."""
    return logging.getLogger("voltro_beat.dispatch").makeRecord(
        "voltro_beat.dispatch", logging.INFO, __file__, 1, message, args, None, extra=extra
    )


def test_fields_prefix_the_names_given_and_leave_out_the_rest() -> None:
    assert fields() == {}
    assert fields(key="poll@2026-01-01T12:00:00", schedule="poll", count=0) == {
        "voltro_key": "poll@2026-01-01T12:00:00",
        "voltro_schedule": "poll",
        "voltro_count": 0,
    }
    given = fields(
        key="k",
        keys=("a", "b"),
        schedule="s",
        replica="r",
        count=2,
        status="missed",
        reason="x",
        group="g",
    )
    assert list(given) == [f"voltro_{name}" for name in FIELDS]
    assert given["voltro_keys"] == ["a", "b"]


def test_fields_do_not_collide_with_a_log_record_attribute() -> None:
    # makeRecord raises KeyError when an extra name is one of the record's own attributes.
    taken = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
    assert not {f"voltro_{name}" for name in FIELDS} & taken


def test_a_json_line_carries_the_fields_of_its_record() -> None:
    record = _record(
        "Scheduler: Sent due task %s (%s) as %s",
        "poll",
        "proj.poll",
        "poll@2026-01-01T12:00:00.500",
        **fields(key="poll@2026-01-01T12:00:00.500", schedule="poll"),
    )
    line = json.loads(JsonFormatter().format(record))
    assert line.pop("ts").endswith("+00:00")
    assert line == {
        "level": "INFO",
        "logger": "voltro_beat.dispatch",
        "message": "Scheduler: Sent due task poll (proj.poll) as poll@2026-01-01T12:00:00.500",
        "key": "poll@2026-01-01T12:00:00.500",
        "schedule": "poll",
    }


def test_a_json_line_writes_enums_counts_and_key_lists_as_json_values() -> None:
    record = _record(
        "voltro_beat: %s: %d messages not sent (%s)",
        "queue full",
        2,
        "a@1, b@2",
        **fields(keys=["a@1", "b@2"], count=2, status=Status.MISSED, reason=Reason.CATCH_UP),
    )
    line = json.loads(JsonFormatter().format(record))
    assert line["keys"] == ["a@1", "b@2"] and line["count"] == 2
    assert line["status"] == "missed" and line["reason"] == "catch_up"


def test_a_json_line_without_fields_has_none_even_if_its_message_names_a_key() -> None:
    record = _record("voltro_beat: %s published (external trigger)", "poll@2026-01-01T12:00:00")
    line = json.loads(JsonFormatter().format(record))
    assert set(line) == {"ts", "level", "logger", "message"}


def test_a_json_line_keeps_the_traceback() -> None:
    try:
        raise RuntimeError("the store went away")
    except RuntimeError:
        record = logging.getLogger("voltro_beat.scheduler").makeRecord(
            "voltro_beat.scheduler", logging.ERROR, __file__, 1, "tick failed", (), sys.exc_info(),
            extra=fields(replica="beat-1"),
        )  # fmt: skip
    line = json.loads(JsonFormatter().format(record))
    assert line["replica"] == "beat-1" and line["message"] == "tick failed"
    assert "RuntimeError: the store went away" in line["exc_info"]
    assert line["exc_info"].startswith("Traceback (most recent call last)")
