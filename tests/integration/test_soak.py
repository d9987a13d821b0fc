"""The simulated soak (``python -m bench.soak``) on a few simulated minutes: it still drives
today's scheduler, and what it checks holds over that span."""

from __future__ import annotations

from pathlib import Path

from bench import soak


def test_a_few_simulated_minutes_publish_every_occurrence_once_with_the_claims_bounded(
    tmp_path: Path,
) -> None:
    args = soak.parse_args(["--hours", "0.03", "--schedules", "5", "--replicas", "3"])

    result = soak.soak(f"sqlite:///{tmp_path / 'soak.sqlite3'}", args)

    assert result["occurrences_expected"] == 5 * 108
    assert result["messages"] == result["occurrences_expected"]
    assert result["duplicates"] == 0
    assert result["unrecorded"] == 0
    # A minute of claims per schedule, plus the one claimed ahead (docs/operations.md).
    assert result["claims_max_per_schedule"] <= 62


def test_the_soak_counts_a_message_sent_twice() -> None:
    published = soak.Published(schedules=2, seconds=10)
    for key in ["s000@2026-01-01T00:00:01", "s001@2026-01-01T00:00:01", "s001@2026-01-01T00:00:01"]:
        published.add(key)
    assert (published.messages, published.duplicates) == (3, 1)
