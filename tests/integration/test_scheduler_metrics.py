"""A scheduler with ``voltro_beat_metrics_port`` serves its counters over HTTP; a port that is
taken leaves it publishing without them."""

from __future__ import annotations

import logging
import socket
import urllib.request
from typing import Any

import pytest
from beat_kit import drain, sec, tick


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_metrics_served_over_http(replicas: Any) -> None:
    port = free_port()
    r1 = replicas("r1", voltro_beat_metrics_port=port)
    for n in range(3):
        tick(r1, sec(n))
    assert len(drain(r1.app)) == 2
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    assert 'voltro_beat_occurrences_published_total{schedule="s"} 2.0' in text
    assert 'voltro_beat_occurrences_claimed_total{schedule="s"} 2.0' in text


def test_a_taken_port_leaves_beat_publishing(
    replicas: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.ERROR, logger="voltro_beat.scheduler"):
            r1 = replicas("r1", voltro_beat_metrics_port=port)
        assert f"cannot serve metrics on port {port}" in caplog.text
        for n in range(3):
            tick(r1, sec(n))
        assert len(drain(r1.app)) == 2
