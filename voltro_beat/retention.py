"""Retention: how long each table keeps its rows, and whose registration decides it.

The framework registers a bound for the claims and the runs tables (from the settings); a
plugin or the app may register its own with :func:`register_retention`, from the Celery app
module, before beat boots. Per table the registration of the highest-ranking source survives:
the app's over a plugin's, a plugin's over the framework's, **whoever registered, not
whichever bound is narrower**. A real disagreement (another bound or another column) is said
at boot beside the surviving policy. Within one source a later registration replaces an
earlier one.

The sweep is a job like any occurrence: each slot (hourly, on the Unix epoch's grid) has a
deterministic key, claimed through the claims table, so one replica sweeps per slot. The key's
name part starts with :data:`~voltro_beat.schedules.RESERVED_PREFIX`, which no schedule name
may, so it never meets a user schedule's key.

Pure: :func:`resolve` takes registrations and returns policies; nothing here reads the clock
or the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from voltro_beat.exceptions import ConfigurationError
from voltro_beat.occurrences import occurrence_key
from voltro_beat.schedules import RESERVED_PREFIX

#: Who may register a bound, lowest rank first.
SOURCES: Final = ("framework", "plugin", "app")
#: The claims table's schedule column for the sweep's slot claims (its keys' name part).
SWEEP_JOB: Final = f"{RESERVED_PREFIX}retention"
#: One sweep per slot of this length, slots on the Unix epoch's grid.
SWEEP_EVERY: Final = timedelta(hours=1)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_COUNT = {2: "two", 3: "three"}


@dataclass(frozen=True, slots=True)
class Registration:
    """One bound: rows of ``table`` whose ``time_column`` is older than ``ttl`` go."""

    table: str
    time_column: str
    ttl: timedelta
    source: str = "app"

    def __post_init__(self) -> None:
        where = f"register_retention(table={self.table!r})"
        if not isinstance(self.table, str) or not self.table.strip():
            raise ConfigurationError(
                f"table must be a non-empty string, got {self.table!r}", field="table"
            )
        if not isinstance(self.time_column, str) or not self.time_column.strip():
            raise ConfigurationError(
                f"{where}: time_column must be a non-empty string, got {self.time_column!r}",
                field="time_column",
            )
        if not isinstance(self.ttl, timedelta) or self.ttl <= timedelta(0):
            raise ConfigurationError(
                f"{where}: ttl must be a positive timedelta or number of hours, got {self.ttl!r}",
                field="ttl",
            )
        if self.source not in SOURCES:
            raise ConfigurationError(
                f"{where}: source must be one of {', '.join(map(repr, SOURCES))}, "
                f"got {self.source!r}",
                field="source",
            )

    @property
    def rank(self) -> int:
        return SOURCES.index(self.source)

    def describe(self) -> str:
        return f"the {self.source}'s {span(self.ttl)}"


@dataclass(frozen=True, slots=True)
class Policy:
    """The surviving registration of a table, and those it overruled that said otherwise."""

    kept: Registration
    dropped: tuple[Registration, ...] = ()

    @property
    def table(self) -> str:
        return self.kept.table

    @property
    def ttl(self) -> timedelta:
        return self.kept.ttl

    @property
    def time_column(self) -> str:
        return self.kept.time_column

    def line(self) -> str:
        """The boot line naming this armed policy."""
        return f"  {self.table}: {span(self.ttl)} by {self.time_column} ({self.kept.source})"

    def conflict(self) -> str | None:
        """The boot line reporting a real disagreement over this table, if there was one."""
        if not self.dropped:
            return None
        every = (self.kept, *self.dropped)
        by_column = len({r.time_column for r in every}) > 1

        def said(r: Registration) -> str:
            return r.describe() + (f" by {r.time_column}" if by_column else "")

        count = _COUNT.get(len(every), str(len(every)))
        dropped = [said(r) for r in self.dropped]
        listed = dropped[0] if len(dropped) == 1 else f"{', '.join(dropped[:-1])} and {dropped[-1]}"
        if any(r.source == self.kept.source for r in self.dropped):
            why = "A later registration from one source replaces an earlier one."
        else:
            why = (
                "An app registration wins over a plugin's, and a plugin's over a framework default."
            )
        kept = said(self.kept)
        return f"! {self.table}: {count} registrations — kept {kept}, dropped {listed}. {why}"


def resolve(registrations: Iterable[Registration]) -> list[Policy]:
    """One policy per table (sorted by table): the highest-ranking source's registration, the
    latest of that source; the others listed as dropped where they disagree with it."""
    by_table: dict[str, list[Registration]] = {}
    for r in registrations:
        by_table.setdefault(r.table, []).append(r)
    policies = []
    for table in sorted(by_table):
        found = by_table[table]
        # The latest of each source, then the highest source: order counts only within one.
        latest = {r.source: r for r in found}
        kept = max(latest.values(), key=lambda r: r.rank)
        differ = [r for r in found if r is not kept and _says(r) != _says(kept)]
        unique = list(dict.fromkeys(differ))
        unique.sort(key=lambda r: -r.rank)
        policies.append(Policy(kept, tuple(unique)))
    return policies


def announce(policies: Sequence[Policy]) -> list[tuple[bool, str]]:
    """The boot lines, each with whether it is a warning: the count, then each policy with
    its disagreement (if any) on the line beside it."""
    lines = [(False, f"retention: {len(policies)} policy(ies) armed")]
    for p in policies:
        lines.append((False, p.line()))
        conflict = p.conflict()
        if conflict is not None:
            lines.append((True, conflict))
    return lines


def slot(now: datetime) -> datetime:
    """The start of the sweep slot ``now`` falls in."""
    return now - (now - _EPOCH) % SWEEP_EVERY


def slot_key(at: datetime) -> str:
    """The claim key of the sweep of the slot starting at ``at``."""
    return occurrence_key(SWEEP_JOB, at)


def span(ttl: timedelta) -> str:
    """A bound as people write it: ``30d``, ``24h``, ``90m``, ``45s``."""
    seconds = ttl.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0 and (unit != "d" or seconds >= 2 * 86400):
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _says(r: Registration) -> tuple[str, timedelta]:
    return (r.time_column, r.ttl)


_REGISTERED: list[Registration] = []


def register_retention(
    *, table: str, time_column: str, ttl: timedelta | float, source: str = "app"
) -> None:
    """Bound how long ``table`` keeps its rows: those whose ``time_column`` is older than
    ``ttl`` (a timedelta, or a number of hours) are deleted by the hourly sweep.

    Call it from the Celery app module (or a plugin's import), before beat boots. An app's
    registration outranks a plugin's, and a plugin's the framework's default, whichever bound
    is narrower. The runs table's ``queued`` rows are never deleted. Raises
    :class:`~voltro_beat.exceptions.ConfigurationError` for a bad argument.
    """
    if isinstance(ttl, int | float) and not isinstance(ttl, bool):
        ttl = timedelta(hours=ttl)
    _REGISTERED.append(Registration(table, time_column, ttl, source))  # type: ignore[arg-type]


def registered() -> tuple[Registration, ...]:
    """Every registration made in this process, oldest first."""
    return tuple(_REGISTERED)
