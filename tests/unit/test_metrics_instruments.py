"""The metrics module: what each report counts, no-ops while off."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from voltro_beat.config import Settings
from voltro_beat.exceptions import ConfigurationError
from voltro_beat.metrics import Metrics
from voltro_beat.occurrences import Occurrence
from voltro_beat.runs import Run
from voltro_beat.status import Reason, Status

AT = datetime(2026, 1, 1, 12, tzinfo=UTC)


def occ(name: str, second: int) -> Occurrence:
    return Occurrence.of(name, AT + timedelta(seconds=second))


def run(name: str, second: int, status: Status = Status.CLAIMED, reason: str | None = None) -> Run:
    return Run(occ(name, second), "t", status, reason)


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    found: float | None = metrics.registry.get_sample_value(name, labels)
    return found


def test_off_by_default_every_report_is_a_no_op() -> None:
    metrics = Metrics()
    metrics.recorded([run("a", 0)], {"a@2026-01-01T12:00:00"})
    metrics.published([occ("a", 0)], AT)
    with metrics.claim_statement():
        pass
    metrics.store_error()
    assert not metrics.enabled and metrics.registry is None


def test_claims_won_lost_and_missed_per_schedule() -> None:
    metrics = Metrics()
    metrics.enable()
    batch = [run("a", 0), run("a", 1), run("b", 0), run("b", 1, Status.MISSED, Reason.LATE)]
    won = {r.occurrence.key for r in batch} - {batch[1].occurrence.key}
    metrics.recorded(batch, won)
    metrics.missed([run("a", 5, Status.MISSED, Reason.PUBLISH_FAILED)])
    assert value(metrics, "voltro_beat_occurrences_claimed_total", schedule="a") == 1
    assert value(metrics, "voltro_beat_occurrences_lost_total", schedule="a") == 1
    assert value(metrics, "voltro_beat_occurrences_claimed_total", schedule="b") == 1
    assert value(metrics, "voltro_beat_occurrences_missed_total", schedule="b", reason="late") == 1
    assert (
        value(
            metrics, "voltro_beat_occurrences_missed_total", schedule="a", reason="publish_failed"
        )
        == 1
    )


def test_published_counts_and_observes_the_lag() -> None:
    metrics = Metrics()
    metrics.enable()
    metrics.published([occ("a", 0), occ("a", 1)], AT + timedelta(seconds=1, milliseconds=20))
    metrics.republished([occ("a", 0)])
    assert value(metrics, "voltro_beat_occurrences_published_total", schedule="a") == 2
    assert value(metrics, "voltro_beat_occurrences_republished_total", schedule="a") == 1
    assert value(metrics, "voltro_beat_publish_lag_seconds_count") == 2
    assert value(metrics, "voltro_beat_publish_lag_seconds_sum") == pytest.approx(1.04)
    metrics.rows({"_voltro_schedule_runs": 12})
    metrics.clock_offset(-0.25)
    assert value(metrics, "voltro_beat_table_rows", table="_voltro_schedule_runs") == 12
    assert value(metrics, "voltro_beat_clock_offset_seconds") == -0.25


def test_settings_metrics_port_and_json_logs() -> None:
    settings = Settings.resolve({}, environ={"VOLTRO_BEAT_METRICS_PORT": "9108"})
    assert settings.metrics_port == 9108 and not settings.log_json
    assert Settings.resolve({"voltro_beat_log_json": True}, environ={}).log_json
    with pytest.raises(ConfigurationError, match="voltro_beat_metrics_port"):
        Settings.resolve({"voltro_beat_metrics_port": "http"}, environ={})
