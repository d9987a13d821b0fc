"""Cluster coordination's arithmetic: a schedule's shard, and the shards' owners."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from voltro_beat.shards import assign, shard_of

members = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=12, unique=True)
counts = st.integers(min_value=1, max_value=256)


def test_a_schedules_shard_is_a_stable_hash_of_its_group_and_name() -> None:
    # Fixed values: a change of hash would move every schedule on a rolling upgrade.
    assert shard_of("default", "report", 64) == 49
    assert shard_of("billing", "report", 64) == 42
    spread = {shard_of("default", f"s{i}", 64) for i in range(2000)}
    assert spread == set(range(64))


@given(counts, members)
def test_every_shard_has_one_owner_and_the_owners_are_balanced(
    count: int, names: list[str]
) -> None:
    owned = assign(count, names)
    assert set(owned) == set(names)
    every = [s for shards in owned.values() for s in shards]
    assert sorted(every) == list(range(count))
    sizes = [len(shards) for shards in owned.values()]
    assert max(sizes) - min(sizes) <= 1


@given(counts, members)
def test_the_assignment_depends_on_the_members_not_their_order(
    count: int, names: list[str]
) -> None:
    assert assign(count, names) == assign(count, list(reversed(names)))


def test_a_member_joining_moves_few_shards_but_its_own() -> None:
    # Rendezvous hashing moves what the newcomer takes; keeping the balance moves some more.
    # That is no bound for every membership (the greedy balancing can cascade: hypothesis
    # found 13 shards moved for a newcomer's 4, about one membership in fifty beyond 3 times),
    # so it is measured over 2,000 random memberships of 1 to 20 replicas, a fixed seed: the
    # shards the others lose average 1.7 times the newcomer's share, and at most 4.3 times.
    rng = random.Random(7)
    ratios = []
    for _ in range(2000):
        names = [f"r{rng.randrange(10**6)}" for _ in range(rng.randint(1, 20))]
        new = f"n{rng.randrange(10**6)}"
        before, after = assign(64, names), assign(64, [*names, new])
        moved = sum(len(before[n] - after[n]) for n in set(names))
        ratios.append(moved / len(after[new]))
    assert sum(ratios) / len(ratios) < 2
    assert max(ratios) < 5


def test_no_members_own_nothing() -> None:
    assert assign(8, []) == {}
