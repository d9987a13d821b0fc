"""The admins' schedules overview: the pure parts (tests/contrib renders it in both admins)."""

from __future__ import annotations

from voltro_beat.contrib.overview import Upcoming
from voltro_beat.replicas import Replica


def _replica(name: str, **settings: object) -> Replica:
    return Replica(name, "host", 1, "0.2.0", None, None, 0.0, settings)


def test_a_group_no_live_replica_serves_is_named_with_its_schedule_count() -> None:
    upcoming = Upcoming({}, groups={"default": 4, "billing": 2, "reports": 1})
    live = [_replica("a"), _replica("b", group="reports")]
    assert upcoming.unserved(live) == [
        "group billing: 2 schedules and NO LIVE REPLICA: nothing fires them (while a replica "
        "of another group is live, it records their occurrences missed, reason no_replica, "
        "past their lateness)"
    ]
    assert len(upcoming.unserved([])) == 3
    assert Upcoming({}).unserved([]) == []  # no app given: no groups known
