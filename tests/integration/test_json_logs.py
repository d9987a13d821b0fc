"""JSON log lines (``voltro_beat_log_json``) of a scheduler in this process: the fields of a
line come from its log call's ``extra=``, on the same lines a pipeline would read."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from beat_kit import sec, tick

SCHEDULE = {"s": {"task": "proj.work", "schedule": 1.0, "catch_up": "skip"}}


@pytest.fixture
def json_lines() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """A handler on the root logger, as Celery sets one up (beat gives it the JSON
    formatter), and voltro_beat's lines down to DEBUG; its lines, parsed."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root, ours = logging.getLogger(), logging.getLogger("voltro_beat")
    level = ours.level
    root.addHandler(handler)
    ours.setLevel(logging.DEBUG)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    ours.setLevel(level)
    root.removeHandler(handler)


def test_lines_about_an_occurrence_carry_its_key_and_schedule(
    replicas: Any, json_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    first = replicas("r1", schedule=SCHEDULE, voltro_beat_log_json=True)
    tick(first, sec(0))
    tick(first, sec(1))
    first.close()
    tick(replicas("r2", schedule=SCHEDULE, voltro_beat_log_json=True), sec(161))
    lines = json_lines()

    assert [line["replica"] for line in lines if "replica" in line] == ["r1", "r2"]
    sent = [line for line in lines if line["message"].startswith("Scheduler: Sent due task")]
    # r1 sends 1 s; r2 the occurrences less than a lease (10 s) old at 161 s, 152 s to 161 s.
    keys = ["s@2026-01-01T10:00:01"] + [f"s@2026-01-01T10:02:{n}" for n in range(32, 42)]
    assert [(line["logger"], line["schedule"], line["key"]) for line in sent] == [
        ("voltro_beat.dispatch", "s", key) for key in keys
    ]
    assert all(line["message"].endswith(f" as {line['key']}") for line in sent)
    # The rest of the downtime: one summary line with the count, and a line per occurrence.
    summary = [line for line in lines if line.get("count") == 150]
    assert [(s["schedule"], s["status"], s["reason"]) for s in summary] == [
        ("s", "missed", "catch_up")
    ]
    missed = [line for line in lines if line["level"] == "DEBUG" and "key" in line]
    assert len(missed) == 150
    assert {(m["schedule"], m["status"], m["reason"]) for m in missed} == {
        ("s", "missed", "catch_up")
    }
    assert missed[0]["key"] == "s@2026-01-01T10:00:02"
    assert all(m["key"] in m["message"] for m in missed)
