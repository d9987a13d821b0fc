"""The demo's filesystem broker: a message is whole before a worker can take it.

kombu's filesystem transport opens a message's file under its final name before writing it; a
worker that lists the folder in between takes an empty file and exits on it (it ended a CI run's
demo with "a process exited early"). The demo's transport is checked here by letting a worker
poll in the middle of the write.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from queue import Empty
from typing import Any

import kombu
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "demo"))
import demo_broker


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[Any]:
    folder = str(tmp_path)
    options = {"data_folder_in": folder, "data_folder_out": folder, "store_processed": False}
    with kombu.Connection(transport=demo_broker.Transport, transport_options=options) as conn:
        yield conn.default_channel


def test_a_worker_polling_in_the_middle_of_a_write_sees_nothing_then_the_whole_message(
    channel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[object] = []

    def encode_after_a_poll(text: str) -> bytes:
        # The writer's encoding step: the worker polls the folder right now.
        try:
            seen.append(channel._get("celery"))
        except Empty:
            seen.append(Empty)
        return text.encode()

    monkeypatch.setattr(demo_broker, "str_to_bytes", encode_after_a_poll)
    channel._put("celery", {"body": "x" * 10_000})

    assert seen == [Empty]
    assert channel._get("celery") == {"body": "x" * 10_000}
    with pytest.raises(Empty):
        channel._get("celery")
