"""What a replica concludes from the registry: stand-downs, renames, disagreements."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from voltro_beat.replicas import (
    MAX_RENAMES,
    Replica,
    definition_hash,
    digest,
    disagreements,
    lives,
    renames,
    stand_down,
)
from voltro_beat.schedules import parse_entries


def entry(**raw: object):  # type: ignore[no-untyped-def]
    (parsed,) = parse_entries(
        {"e": {"task": "t", "schedule": 60.0, **raw}}, tz=None, max_lateness=timedelta(days=1)
    )
    return parsed


def test_a_definition_hash_is_stable_and_sees_every_field() -> None:
    assert definition_hash(entry()) == definition_hash(entry())
    base = definition_hash(entry())
    for change in (
        {"schedule": 30.0},
        {"args": [1]},
        {"kwargs": {"a": 1}},
        {"options": {"queue": "q"}},
        {"max_lateness": 5},
        {"catch_up": "skip"},
        {"on_overlap": "skip"},
        {"task": "other"},
    ):
        assert definition_hash(entry(**change)) != base, change


def test_the_newest_replica_with_a_changed_definition_fires_it() -> None:
    mine = {"a": "1", "b": "2", "c": "3"}
    newer = [("new", {"a": "1", "b": "9"}), ("mid", {"c": "8", "b": "2"})]
    # a: same definition on the newest; b: changed on the newest (which wins over mid);
    # c: the newest does not have it, the next newer one changed it.
    assert stand_down("me", mine, newer) == {"b": "new", "c": "mid"}


def test_a_schedule_no_newer_replica_has_keeps_firing() -> None:
    assert stand_down("me", {"a": "1"}, [("new", {})]) == {}


def test_a_rename_in_flight_is_found() -> None:
    maps = {"old": {"report": "h1", "x": "h2"}, "new": {"daily-report": "h1", "x": "h2"}}
    assert renames(maps) == [("daily-report", "new", "report", "old")]


def test_two_names_on_both_replicas_are_not_a_rename() -> None:
    maps = {"a": {"p": "h", "q": "h"}, "b": {"p": "h", "q": "h"}}
    assert renames(maps) == []


def test_disagreeing_settings_are_listed() -> None:
    other = Replica("r2", "h", 1, "0.2", None, None, None, {"publish_timeout": 20.0})
    mine = {"publish_timeout": 10.0, "clock": "database"}
    assert disagreements(mine, [other]) == [("publish_timeout", 10.0, "r2", 20.0)]


def test_the_digest_is_of_the_whole_map() -> None:
    assert digest({"a": "1", "b": "2"}) == digest({"b": "2", "a": "1"})
    assert digest({"a": "1"}) != digest({"a": "2"})


def test_a_replica_lives_while_its_heartbeat_is_younger_than_its_own_publish_timeout() -> None:
    seen = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)

    replica = Replica("r", "h", 1, "0.2.0", seen, seen, None, {"publish_timeout": 30.0})
    assert lives(replica, seen + timedelta(seconds=30))
    assert not lives(replica, seen + timedelta(seconds=30.001))
    assert not lives(replace(replica, last_seen=None), seen)


def test_names_of_one_definition_on_the_same_replicas_are_paired_in_linear_time() -> None:
    """Ten thousand generated schedules of one definition on three replicas: no rename, found
    without pairing them (before, 50 million pairs: four seconds a heartbeat at 10,000)."""
    same = {f"s{i}": "h" for i in range(10_000)}
    maps = {"a": same, "b": same, "c": dict(same)}
    assert renames(maps) == []


def test_a_bulk_rename_of_one_definition_reports_at_most_a_few() -> None:
    old = {f"customer-{i}": "h" for i in range(1_000)}
    new = {f"tenant-{i}": "h" for i in range(1_000)}
    found = renames({"old": old, "new": new})
    assert len(found) == MAX_RENAMES
    assert all(r[1] == "new" and r[3] == "old" for r in found)


def test_a_name_another_replica_runs_with_another_definition_is_no_rename() -> None:
    # "report" on new has the old definition of "x"; old has "x" (h1) and "report" (h2).
    maps = {"old": {"x": "h1", "report": "h2"}, "new": {"report": "h1"}}
    assert renames(maps) == []


def _every_pair(maps: dict[str, dict[str, str]]) -> set[tuple[str, str, str, str]]:
    """The definition of a rename, pair by pair (quadratic): the reference."""
    places = [(n, r, d) for r, s in maps.items() for n, d in s.items()]
    return {
        (n, r, m, q) if r < q else (m, q, n, r)
        for n, r, d in places
        for m, q, e in places
        if d == e and n != m and r != q and m not in maps[r] and n not in maps[q]
    }


@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "c", "d"]),
        st.dictionaries(st.sampled_from("pqrstu"), st.sampled_from(["h1", "h2"]), max_size=6),
        max_size=4,
    )
)
def test_renames_are_every_pair_the_definition_names(maps: dict[str, dict[str, str]]) -> None:
    found = renames(maps)
    assert len(found) == len(set(found))
    expected = _every_pair(maps)
    if len(expected) <= MAX_RENAMES:
        assert set(found) == expected
    else:
        assert len(found) == MAX_RENAMES and set(found) <= expected
