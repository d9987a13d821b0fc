"""What the replica registry tells a replica: who else runs, and where they disagree.

Pure: the scheduler reads the live replicas from the store (:mod:`voltro_beat.store.registry`)
and acts on what these functions decide.

* **Changed definitions** (a rolling deploy): a schedule whose definition differs between live
  replicas fires on the definition of the most recently started one; the others stand down
  for it (:func:`stand_down`). A schedule the newest replica does not have at all keeps firing
  on the older ones until they stop: a replica with an empty or partial ``beat_schedule`` must
  not silence the others.
* **Renames in flight**: one definition under two names on different replicas would run the
  task under both names (:func:`renames`).
* **Settings**: replicas compare the settings in :data:`SHARED_SETTINGS`
  (:func:`disagreements`). Leases and deadlines are written into each run row by the replica
  that holds it, so different ``publish_timeout`` or ``max_lateness`` values are safe and only
  reported; the clock is adopted from the oldest live replica (see the scheduler).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from voltro_beat.schedules import Entry

#: The settings replicas report to each other, in their registry rows.
SHARED_SETTINGS = ("clock", "coordination", "publish_timeout", "max_lateness")


@dataclass(frozen=True, slots=True)
class Replica:
    """One row of the registry (without its schedule map, which is read on demand)."""

    name: str
    host: str
    pid: int
    version: str
    started_at: datetime | None
    last_seen: datetime | None
    #: Its local wall clock minus the database's, in seconds.
    clock_offset: float | None
    settings: Mapping[str, Any] = field(default_factory=dict)
    schedules_digest: str = ""
    #: The newest revision of the schedules table it has applied.
    schedules_revision: int = 0

    @classmethod
    def of(cls, row: Any) -> Replica:
        """The replica of a registry row (anything with the table's columns as attributes:
        a SQLAlchemy row, a mapped or a Django model instance); ``settings`` is the JSON text."""
        return cls(
            name=row.name,
            host=row.host,
            pid=row.pid,
            version=row.version,
            started_at=row.started_at,
            last_seen=row.last_seen,
            clock_offset=row.clock_offset,
            settings=json.loads(row.settings),
            schedules_digest=row.schedules_digest,
            schedules_revision=row.schedules_revision,
        )


def lives(replica: Replica, now: datetime) -> bool:
    """Whether ``replica`` is live at ``now`` (the database's clock): its last heartbeat is
    younger than its own publish timeout, after which the others take its runs over."""
    if replica.last_seen is None:
        return False
    # Every row reports it: it is among SHARED_SETTINGS.
    return (now - replica.last_seen).total_seconds() <= float(replica.settings["publish_timeout"])


def definition_hash(entry: Entry) -> str:
    """A hash of everything that decides what and when ``entry`` fires.

    Arguments and options are rendered with ``repr``: an object whose ``repr`` differs from
    process to process makes two replicas look as if they disagreed, which only moves the
    firing to the newest of them.
    """
    parts = [
        entry.task,
        repr(entry.spec),
        repr(entry.args),
        repr(sorted(entry.kwargs.items())),
        repr(sorted(entry.options.items())),
        str(entry.max_lateness),
        entry.catch_up,
        entry.on_overlap,
        str(entry.overlap_timeout),
    ]
    if entry.trigger != "beat":
        # Appended only when set, so that the hashes of every other entry stay as they were.
        parts.append(entry.trigger)
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def digest(schedules: Mapping[str, str]) -> str:
    """A hash of a replica's whole schedule map (name -> definition hash)."""
    text = json.dumps(dict(schedules), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stand_down(
    me: str, mine: Mapping[str, str], newer: Sequence[tuple[str, Mapping[str, str]]]
) -> dict[str, str]:
    """The schedules replica ``me`` leaves to a more recently started replica, and to which.

    ``newer`` lists the live replicas started after ``me`` with their schedule maps, newest
    first. A schedule is left to the newest of them that has it, if its definition there
    differs from ``mine``.
    """
    yielded: dict[str, str] = {}
    for name, definition in mine.items():
        for other, theirs in newer:
            if other == me or name not in theirs:
                continue
            if theirs[name] != definition:
                yielded[name] = other
            break
    return yielded


#: At most this many renames are reported at once: a bulk of identically defined schedules
#: renamed in one deploy would otherwise make a line for every pair of them.
MAX_RENAMES = 20


def renames(maps: Mapping[str, Mapping[str, str]]) -> list[tuple[str, str, str, str]]:
    """``(name, replica, other name, other replica)`` for each definition that two live
    replicas run under different names, where neither replica has the other name; the first
    :data:`MAX_RENAMES` of them.

    Names of one definition found on the same set of replicas cannot be a rename of each
    other, so only names on different sets are paired: the cost is linear in the schedules
    however many share a definition (ten thousand generated ones often do).
    """
    found: list[tuple[str, str, str, str]] = []
    every = list(maps.values())
    if all(other is every[0] or other == every[0] for other in every[1:]):
        return found  # every replica runs the same schedules (and one replica renames nothing)
    # definition -> the set of replicas that run it under a name -> those names
    groups: dict[str, dict[frozenset[str], list[str]]] = {}
    holders: dict[tuple[str, str], set[str]] = {}
    for replica, schedules in maps.items():
        for name, definition in schedules.items():
            holders.setdefault((definition, name), set()).add(replica)
    for (definition, name), replicas_ in holders.items():
        groups.setdefault(definition, {}).setdefault(frozenset(replicas_), []).append(name)
    for _, sets in sorted(groups.items()):
        ordered = sorted(sets, key=sorted)
        for i, first in enumerate(ordered):
            for second in ordered[i + 1 :]:
                for pair in _pairs(maps, sets[first], first - second, sets[second], second - first):
                    found.append(pair)
                    if len(found) == MAX_RENAMES:
                        return found
    return found


def _pairs(
    maps: Mapping[str, Mapping[str, str]],
    names: list[str],
    on: frozenset[str],
    other_names: list[str],
    other_on: frozenset[str],
) -> Iterator[tuple[str, str, str, str]]:
    """The renames between ``names`` (on the replicas ``on``) and ``other_names`` (on
    ``other_on``), each with its replicas in name order."""
    for name in sorted(names):
        for other_name in sorted(other_names):
            if other_name == name:
                continue
            for replica in sorted(on):
                for other in sorted(other_on):
                    if other_name in maps[replica] or name in maps[other]:
                        continue
                    yield (
                        (name, replica, other_name, other)
                        if replica < other
                        else (other_name, other, name, replica)
                    )


def disagreements(
    mine: Mapping[str, Any], others: Iterable[Replica]
) -> list[tuple[str, Any, str, Any]]:
    """``(setting, my value, replica, its value)`` for each shared setting that differs."""
    return [
        (key, mine.get(key), other.name, other.settings.get(key))
        for other in others
        for key in SHARED_SETTINGS
        if key in other.settings and other.settings.get(key) != mine.get(key)
    ]
