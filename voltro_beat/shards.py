"""Cluster coordination's arithmetic: which shard a schedule falls in, and which live replica
of a group owns each shard.

Pure, and the same on every replica: a schedule's shard is a stable hash of its group and
name, and the assignment is computed from the live members of the group (rendezvous hashing,
balanced so that no replica holds more than one shard over another's). There is no leader to
elect; replicas that momentarily disagree about who is live disagree about an assignment, and
the shard leases in the store (:mod:`voltro_beat.store.shard_leases`) keep two of them from
owning one shard at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


def shard_of(group: str, name: str, count: int) -> int:
    """The shard of schedule ``name`` of ``group``, among ``count``."""
    return _score(f"{group}\x00{name}") % count


def assign(count: int, members: Iterable[str]) -> dict[str, frozenset[int]]:
    """The shards ``0..count-1`` among ``members``, balanced: every member holds
    ``count // len(members)`` shards, and the remainder one more each. Pairs of a shard and a
    member are taken best score first (rendezvous hashing), each shard by the first member
    with room for it: a member joining or leaving moves its own shards and a few more. An
    empty membership owns nothing."""
    names = sorted(set(members))
    if not names:
        return {}
    floor, extra = divmod(count, len(names))
    ranked = sorted(
        ((_score(f"{shard}\x00{name}"), shard, name) for shard in range(count) for name in names),
        reverse=True,
    )
    owned: dict[str, set[int]] = {name: set() for name in names}
    taken: set[int] = set()
    for _, shard, name in ranked:
        held = len(owned[name])
        if shard in taken or held > floor or (held == floor and extra == 0):
            continue
        if held == floor:
            extra -= 1
        owned[name].add(shard)
        taken.add(shard)
    return {name: frozenset(shards) for name, shards in owned.items()}


@dataclass(frozen=True, slots=True)
class Tenure:
    """What a shard owner's claims carry: its ``group`` and, per schedule it may claim, the
    shard and the epoch it holds that shard at. The store refuses a claim whose shard this
    replica no longer holds at that epoch, or whose lease ran out (guarantee 14)."""

    group: str
    held: Mapping[str, tuple[int, int]]


def _score(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
