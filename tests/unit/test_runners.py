"""What a replica knows of who runs each schedule (voltro_beat.membership.Runners), from the
live replicas' definition maps, at fixed instants."""

from __future__ import annotations

from datetime import UTC, datetime

from voltro_beat.membership import Runners


def at(hour: int) -> datetime:
    return datetime(2026, 1, 1, hour, tzinfo=UTC)


OLD = {"a": "h1", "b": "h2"}
NEW = {"b": "h2", "c": "h3"}


def test_a_schedule_runs_since_the_longest_running_replica_that_has_it_started() -> None:
    runners = Runners([(at(5), NEW), (at(2), OLD)], [OLD, NEW], (), None)

    assert (runners.get("a"), runners.get("b"), runners.get("c")) == (at(2), at(2), at(5))
    assert runners.get("gone") is None


def test_the_table_s_schedules_run_since_the_group_s_longest_running_replica_started() -> None:
    runners = Runners([(at(5), NEW)], [NEW], frozenset({"t1"}), at(1))
    runners.follow(["t2"])

    assert (runners.get("t1"), runners.get("t2"), runners.get("c")) == (at(1), at(1), at(5))


def test_known_is_what_any_live_replica_runs_with_or_without_a_start() -> None:
    runners = Runners([(None, OLD)], [OLD, NEW], frozenset({"t1"}), None)
    runners.follow(["t2"])

    assert [name in runners.known for name in ["a", "c", "t1", "t2", "gone"]] == [
        True,
        True,
        True,
        True,
        False,
    ]
    # A start unknown says nothing of since when, and the table's without a group start.
    assert runners.get("a") is None and runners.get("t1") is None
